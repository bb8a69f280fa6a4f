"""End to end under torchrun: 2 ranks (gloo), the GL server on local rank 0, both ranks in a
loop of sampling + all_reduce (examples/graphlearn_negative_sampler.py). Killing the server
ends the job in seconds with the server named as torchrun's root cause; the same job left
alone finishes with exit code 0; a scheduler's SIGTERM or a Ctrl-C ends it without naming
the server, which dies of the same stop."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from gl_procs import EXAMPLE, alarms, pid_gone
from linereader import LineReader
from testutil import free_port

pytestmark = pytest.mark.graphlearn
pytest.importorskip("torch")

NEVER = r"(?!x)x"


def _gl_available() -> None:
    code = "import healthkit_graphlearn as h; h.import_graphlearn()"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        pytest.skip(f"Alibaba graph-learn not available: {r.stderr[-500:]}")


def _session_members(sid: int) -> list[int]:
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] not in ("Z", "X"):  # field 6: session id
            members.append(int(entry))
    return members


class Job:
    """torchrun in its own session: on the way out, whatever is left of the session (ours
    alone) is reported and SIGKILLed by process group."""

    def __init__(self, workdir: Path, *args: str) -> None:
        self.pid_file = workdir / "server.pid"
        cmd = [
            os.path.join(os.path.dirname(sys.executable), "torchrun"),
            "--nnodes=1", "--nproc_per_node=2", "--max_restarts=0",
            "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{free_port()}",
            str(EXAMPLE), "--host", "127.0.0.1", "--pid-file", str(self.pid_file), *args,
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            cmd,
            cwd=workdir,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"},
        )
        self.out = LineReader(self.proc.stdout)

    def wait_training(self, timeout: float = 120.0) -> int:
        deadline = time.monotonic() + timeout
        for rank in (0, 1):
            if self.out.until(rf"TRAINING rank={rank}", deadline - time.monotonic()) is None:
                self.finish(0)
                pytest.fail("the job never started training:\n" + "\n".join(self.out.lines))
        return int(self.pid_file.read_text())

    def finish(self, timeout: float) -> tuple[int | None, str, list[int]]:
        """Drain the output until torchrun exits (at most ``timeout`` s), then clean up."""
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            self.out.until(NEVER, min(0.2, max(0.0, deadline - time.monotonic())))
        rc = self.proc.poll()
        strays = _session_members(self.proc.pid)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # our own session: torchrun and its ranks
        except ProcessLookupError:
            pass
        self.proc.wait(30)
        self.out.until(NEVER, 10)  # drain to EOF
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        return rc, "\n".join(self.out.lines), strays


@pytest.mark.timeout(300)
def test_killing_the_server_ends_the_job_in_seconds_with_it_as_the_root_cause(
    tmp_path: Path,
) -> None:
    _gl_available()
    job = Job(tmp_path, "--steps", "0")  # train until killed
    server = job.wait_training()
    killed_at = time.monotonic()
    os.kill(server, signal.SIGKILL)
    rc, out, strays = job.finish(timeout=90)
    elapsed = time.monotonic() - killed_at
    assert rc is not None, "the job hung after its server died:\n" + out[-5000:]
    assert rc != 0
    assert elapsed < 60, out[-5000:]  # seconds, not GL's ~17 min of retries
    assert strays == []
    root = out[out.index("Root Cause") :]
    assert re.search(r"rank\s*: 0", root), root
    pattern = r"traceback : healthkit_graphlearn \(sidecar\): graphlearn sampler server 0 at "
    pattern += rf"127\.0\.0\.1:\d+ \(pid {server}\) was killed by SIGKILL"
    assert re.search(pattern, root), root


@pytest.mark.timeout(300)
@pytest.mark.parametrize("workers", ["0", "2"])  # 2: clients in DataLoader workers (tzrec)
def test_the_same_job_left_alone_finishes_with_exit_code_0(tmp_path: Path, workers: str) -> None:
    _gl_available()
    job = Job(tmp_path, "--steps", "40", "--workers", workers)
    job.wait_training()
    rc, out, strays = job.finish(timeout=120)
    assert rc == 0, out[-5000:]
    assert "JOB DONE rank=0" in out and "JOB DONE rank=1" in out
    assert "Root Cause" not in out
    assert alarms(out) == [], out[-5000:]
    assert strays == []


_DEFERRED = "taken as its share of this process's stop"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["sigterm", "ctrl-c"])
def test_a_launchers_stop_or_a_ctrl_c_ends_the_job_without_naming_the_server(
    tmp_path: Path, how: str
) -> None:
    """The twins of the server kill, where nothing failed. A scheduler stops the job: SIGTERM
    to torchrun, which SIGTERMs each rank's process group (rank 0's holds the server). A
    Ctrl-C in its terminal: SIGINT to torchrun's group, which passes SIGINT on to the ranks'
    groups. The server dies of the same stop as its rank: no rank reports it as a failure,
    torchrun's summary names no healthkit cause (a rank that outlives its server by a moment
    says once, at WARNING, that it takes the server's end as its share of the stop, as
    documented), and nothing of the job is left. (A Ctrl-C
    that lands while a Python process starts prints that process's KeyboardInterrupt
    traceback, as for any program: not an alarm unless it ran through healthkit code.)"""
    _gl_available()
    job = Job(tmp_path, "--steps", "0")  # train until stopped
    server = job.wait_training()
    if how == "sigterm":
        job.proc.send_signal(signal.SIGTERM)
    else:
        os.killpg(job.proc.pid, signal.SIGINT)  # torchrun's session: its own group
    rc, out, strays = job.finish(timeout=90)
    assert rc is not None, "the job hung after its stop:\n" + out[-5000:]
    left = not pid_gone(server)
    if left:
        os.kill(server, signal.SIGKILL)  # ours: started by this test's job
    assert not left, "the server outlived the stop:\n" + out[-5000:]
    assert strays == []
    # A rank that outlives its server by a moment says once, at WARNING, that the server's
    # end is taken as its share of the stop (docs/watchdog.md, "deferred"); nothing else.
    deferred = [line for line in out.splitlines() if _DEFERRED in line]
    assert all(line.startswith("WARNING healthkit: ") for line in deferred), deferred
    rest = "\n".join(line for line in out.splitlines() if _DEFERRED not in line)
    assert "healthkit_graphlearn (" not in rest and "healthkit watchdog" not in rest, out[-5000:]
    assert "stopped because" not in rest and "was killed by" not in rest, out[-5000:]
    assert alarms(rest) == [], out[-5000:]
