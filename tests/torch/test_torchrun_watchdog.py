"""End to end under the real launcher: a helper dies, the whole torchrun job ends in seconds
and torchrun's summary names the helper; without healthkit the job hangs in a collective."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from linereader import LineReader
from testutil import free_port

pytest.importorskip("torch")

import healthkit as hk

JOB = str(Path(__file__).parent.parent / "scripts" / "torchrun_job.py")


class Launch:
    """torchrun in its own session, so everything it started can be stopped as a group."""

    def __init__(
        self,
        *args: str,
        nnodes: int = 1,
        nproc: int = 2,
        port: int | None = None,
        run_id: str = "hk",
        env: dict[str, str] | None = None,
    ) -> None:
        port = port or free_port()
        self.cmd = [
            sys.executable, "-m", "torch.distributed.run",
            f"--nnodes={nnodes}", f"--nproc_per_node={nproc}",
            "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}", f"--rdzv_id={run_id}",
            "--max_restarts=0", JOB, *args,
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            self.cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(env or {})},
        )
        self.out = LineReader(self.proc.stdout)

    def wait_for_helper(self, timeout: float = 120) -> int:
        m = self.out.until(r"HELPER (\d+)", timeout)
        if m is None:
            raise AssertionError("the job never started its helper:\n" + "\n".join(self.out.lines))
        return int(m.group(1))

    def finish(self, timeout: float) -> tuple[int, str, float]:
        start = time.monotonic()
        try:
            self.proc.wait(timeout=timeout)
        finally:
            self.reap_group()
            text = self.out.rest()
            if self.proc.stdout is not None:
                self.proc.stdout.close()
        return self.proc.returncode, text, time.monotonic() - start

    def reap_group(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def kill(pid: int) -> None:
    with hk.ProcessWatch(pid) as w:
        w.kill()
        w.wait(10)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", ["thread", "sidecar"])
def test_dead_helper_ends_the_job_in_seconds_with_the_root_cause(mode: str) -> None:
    job = Launch("--healthkit", "--mode", mode)
    helper = job.wait_for_helper()
    time.sleep(1)  # training is running
    kill(helper)
    rc, out, elapsed = job.finish(timeout=90)
    assert rc != 0
    assert elapsed < 60, out  # seconds, not the collective timeout (600 s here)
    root = out[out.index("Root Cause") :]
    assert re.search(r"rank\s*: 0", root)
    assert f"sampler-server (pid {helper}) was killed by SIGKILL" in root
    assert "traceback : healthkit watchdog" in root


#: how the helper ends -> what torchrun's root cause must say about it
FAULTS = {
    "segfault": "was killed by SIGSEGV",
    "abort": "was killed by SIGABRT",
    "exit3": "exited with code 3",
    "exit0": "exited with code 0 while it was expected to run until disarmed",
    "sigterm": "was killed by SIGTERM",
}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("fault", list(FAULTS))
def test_every_fault_of_a_helper_is_named_in_torchruns_root_cause(fault: str) -> None:
    """The fault matrix under torchrun (SIGKILL and an exception have their own tests above
    and below): each way a helper ends reaches the launcher's summary, as the helper's own
    cause, with rank 0 named, in seconds rather than the collective timeout."""
    dies = [] if fault == "sigterm" else ["--helper-dies", fault]
    job = Launch("--healthkit", *dies)
    helper = job.wait_for_helper()
    if fault == "sigterm":  # the helper alone, as an admin's kill or an OOM handler would
        time.sleep(1)
        os.kill(helper, signal.SIGTERM)
    rc, out, elapsed = job.finish(timeout=120)
    assert rc != 0
    assert elapsed < 90, out  # not the collective timeout (600 s here)
    root = out[out.index("Root Cause") :]
    assert re.search(r"rank\s*: 0", root), root
    assert f"sampler-server (pid {helper}) {FAULTS[fault]}" in root, root


@pytest.mark.timeout(240)
def test_without_healthkit_the_same_job_hangs_until_the_collective_timeout() -> None:
    timeout = 20
    job = Launch("--collective-timeout", str(timeout))
    helper = job.wait_for_helper()
    time.sleep(1)
    start = time.monotonic()
    kill(helper)
    time.sleep(8)
    assert job.proc.poll() is None  # still hung
    rc, out, _ = job.finish(timeout=120)
    elapsed = time.monotonic() - start
    assert rc != 0
    assert elapsed >= timeout - 2  # it waited for gloo's timeout
    assert "sampler-server" not in out[out.index("Root Cause") :]  # and never names the cause


@pytest.mark.timeout(240)
def test_the_healthy_job_finishes_with_exit_code_0() -> None:
    job = Launch("--healthkit", "--steps", "100")
    job.wait_for_helper()
    rc, out, _ = job.finish(timeout=120)
    assert rc == 0, out
    assert out.count("JOB DONE") == 2
    assert "healthkit" not in out.replace("--healthkit", "")


@pytest.mark.timeout(300)
def test_two_nodes_on_localhost_end_in_seconds_when_one_helper_dies() -> None:
    port = free_port()
    node_a = Launch("--healthkit", nnodes=2, nproc=1, port=port, run_id="hk2")
    node_b = Launch("--healthkit", nnodes=2, nproc=1, port=port, run_id="hk2")
    helper_a = node_a.wait_for_helper()
    node_b.wait_for_helper()
    time.sleep(1)
    kill(helper_a)
    rc_a, out_a, elapsed_a = node_a.finish(timeout=120)
    rc_b, _, elapsed_b = node_b.finish(timeout=120)
    assert rc_a != 0 and rc_b != 0
    assert max(elapsed_a, elapsed_b) < 90
    assert f"sampler-server (pid {helper_a}) was killed by SIGKILL" in out_a


@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", ["thread", "sidecar"])
def test_a_helpers_exception_is_torchruns_root_cause(mode: str, tmp_path: Path) -> None:
    """The helper raises ValueError("bad shard 7") out of its entry point (wrapped in
    healthkit.record_exception): torchrun's root cause names that exception, where it was
    raised and where its full traceback is, not "exited with code 1"."""
    records = tmp_path / "records"
    job = Launch("--healthkit", "--mode", mode, "--helper-raises", "25",
                 env={"HEALTHKIT_RECORD_DIR": str(records)})
    helper = job.wait_for_helper()
    rc, out, elapsed = job.finish(timeout=120)
    assert rc != 0
    assert elapsed < 90, out
    root = out[out.index("Root Cause") :]
    assert re.search(r"rank\s*: 0", root)
    assert (
        f"sampler-server (pid {helper}) exited with code 1: it raised ValueError: bad shard 7 "
        "at torchrun_job.py:"
    ) in root, root
    assert "ValueError: bad shard 7" in root
    assert f"exception record {records}/exception-{helper}-" in root
    assert re.search(r'File ".*torchrun_job\.py", line \d+, in load_shard', root), root
    record = next(records.glob(f"exception-{helper}-*.txt"))
    assert record.read_text().rstrip().endswith("ValueError: bad shard 7")
