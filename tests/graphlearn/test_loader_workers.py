"""GL clients in DataLoader workers (TorchEasyRec's layout), with a real GL server killed by
SIGKILL: the rank fails fast and nothing of the job survives it, in a plain run and under a
1-rank torchrun. And the same job left alone finishes cleanly.

The rank runs tests/graphlearn/scripts/loader_rank.py with the tzrec "after" code of the
migration guide, extracted from docs/graphlearn.md, so the guide's code is what runs here.
Every process of the job (rank, server, sidecar, workers) is watched through a pidfd from the
moment the rank names it, so a survivor is seen even after it was reparented to init.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from gl_procs import SIDECAR_MARK, alarms, descendants, open_watch
from linereader import LineReader
from testutil import free_port

import healthkit as hk

pytestmark = pytest.mark.graphlearn
pytest.importorskip("torch")

HERE = Path(__file__).resolve().parent
RANK = HERE / "scripts" / "loader_rank.py"
GUIDE = HERE.parents[1] / "docs" / "graphlearn.md"
SKIP_RC = 77
NEVER = r"(?!x)x"
# "Did not hang" bounds for a loaded 2-core machine; measured figures are in the docs.
JOB_END_S = 60.0
GONE_S = 10.0  # after the job ended, how long a helper may take to be gone


def after_code(tmp_path: Path) -> Path:
    """The guide's "after" block of tzrec/datasets/sampler.py, verbatim, as a module."""
    text = GUIDE.read_text()
    m = re.search(
        r"<!-- tzrec-after:begin -->\s*```py\n(.*?)```\s*<!-- tzrec-after:end -->", text, re.S
    )
    assert m, "docs/graphlearn.md lost its tzrec-after block"
    path = tmp_path / "tzrec_sampler_after.py"
    path.write_text(m.group(1))
    return path


# "+" lines of the guide's diff that the runnable block does not hold: the module import
# (the block has it in its own import list) and the string-id switch (tzrec's __init__ is cut
# down there; test_gl_features.py covers hkgl.set_use_string_hash_id).
NOT_IN_BLOCK = {"import healthkit_graphlearn as hkgl", "hkgl.set_use_string_hash_id(gl)"}


def test_every_added_line_of_the_guides_diff_is_in_the_block_the_tests_run(
    tmp_path: Path,
) -> None:
    text = GUIDE.read_text()
    diff = re.search(r"```diff\n(.*?)```", text, re.S)
    assert diff, "docs/graphlearn.md lost its diff"
    block = after_code(tmp_path).read_text()
    added = [
        ln[1:].strip()
        for ln in diff.group(1).splitlines()
        if ln.startswith("+") and not ln.startswith("+++") and ln[1:].strip()
    ]
    removed = [
        ln[1:].strip()
        for ln in diff.group(1).splitlines()
        if ln.startswith("-") and not ln.startswith("---") and ln[1:].strip()
    ]
    assert added and removed
    missing = [ln for ln in added if ln not in block and ln not in NOT_IN_BLOCK]
    assert missing == [], missing
    block_lines = {ln.strip() for ln in block.splitlines()}
    # Short lines ("else:", ") -> None:") are syntax that many statements share.
    still_there = [ln for ln in removed if len(ln) > 12 and ln in block_lines and ln not in added]
    assert still_there == [], still_there


def _gl_available() -> None:
    code = "import healthkit_graphlearn as h; h.import_graphlearn()"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        pytest.skip(f"Alibaba graph-learn not available: {r.stderr[-500:]}")


class Job:
    """The rank (plain or under torchrun) in its own session, output on a pipe."""

    def __init__(self, workdir: Path, *args: str, torchrun: bool = False) -> None:
        cmd = [sys.executable, str(RANK), *args]
        if torchrun:
            cmd = [
                os.path.join(os.path.dirname(sys.executable), "torchrun"),
                "--nnodes=1", "--nproc_per_node=1", "--max_restarts=0",
                "--monitor-interval=0.5", "--rdzv_backend=c10d",
                f"--rdzv_endpoint=127.0.0.1:{free_port()}", *cmd[1:],
            ]  # fmt: skip
        self.err_path = workdir / "job.stderr"
        with open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(
                cmd,
                cwd=workdir,
                stdout=subprocess.PIPE,
                stderr=err,
                start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"},
            )
        self.out = LineReader(self.proc.stdout)
        self.watches: dict[str, hk.ProcessWatch] = {}

    def wait_ready(self, timeout: float = 120.0) -> dict[str, int]:
        m = self.out.until(r"READY rank=(\d+) server=(\d+) sidecar=(\d+) workers=([\d,]+)", timeout)
        if m is None:
            rc = self.end(0)[0]
            if rc == SKIP_RC:
                pytest.skip("Alibaba graph-learn not available")
            pytest.fail(f"the rank never got ready (rc={rc}):\n{self.stderr()[-4000:]}")
        pids = {"rank": int(m.group(1)), "server": int(m.group(2)), "sidecar": int(m.group(3))}
        for i, w in enumerate(m.group(4).split(",")):
            pids[f"worker{i}"] = int(w)
        marks = {"sidecar": SIDECAR_MARK}
        for role, pid in pids.items():
            if pid:
                w = open_watch(pid, marks.get(role, RANK.name))
                assert w is not None, f"{role} {pid} was gone before it could be watched"
                self.watches[role] = w
        return pids

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def end(self, timeout: float) -> tuple[int | None, float | None]:
        """Wait up to ``timeout`` s for the job's top process; returns (rc, seconds)."""
        started = time.monotonic()
        deadline = started + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            self.out.until(NEVER, min(0.2, max(0.0, deadline - time.monotonic())))
        rc = self.proc.poll()
        return rc, (time.monotonic() - started if rc is not None else None)

    def survivors(self, wait: float) -> list[str]:
        """Roles of the watched processes still alive ``wait`` s from now (then killed),
        plus anything left in the job's session. Closes the watches."""
        deadline = time.monotonic() + wait
        alive = []
        for role, w in self.watches.items():
            with w:
                if w.wait(max(0.0, deadline - time.monotonic())) is None:
                    alive.append(f"{role} {w.pid}")
                    w.kill()
                    w.wait(10)
        self.watches.clear()
        return alive

    def cleanup(self) -> None:
        """Whatever is left: our own session's processes and the top process."""
        for pid in [*descendants(self.proc.pid), self.proc.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(30)
        for w in self.watches.values():
            w.kill()
            w.wait(10)
            w.close()
        self.watches.clear()
        self.out.until(NEVER, 5)
        assert self.proc.stdout is not None
        self.proc.stdout.close()


def _run_kill(
    tmp_path: Path, torchrun: bool, *args: str
) -> tuple[int | None, float, list[str], str]:
    _gl_available()
    job = Job(tmp_path, *args, torchrun=torchrun)
    try:
        pids = job.wait_ready()
        killed_at = time.monotonic()
        os.kill(pids["server"], signal.SIGKILL)
        rc, _ = job.end(JOB_END_S)
        ended_after = time.monotonic() - killed_at
        survivors = job.survivors(GONE_S)
        return rc, ended_after, survivors, job.stderr()
    finally:
        job.cleanup()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("torchrun", [False, True], ids=["plain", "torchrun"])
def test_guide_code_server_sigkill_fails_the_rank_and_leaves_no_worker_behind(
    tmp_path: Path, torchrun: bool
) -> None:
    rc, ended_after, survivors, err = _run_kill(
        tmp_path, torchrun, "--sampler", "after", "--after-code", str(after_code(tmp_path))
    )
    assert rc is not None, "the job hung after its server died:\n" + err[-4000:]
    assert rc != 0
    assert ended_after < JOB_END_S
    assert survivors == [], f"outlived the job: {survivors}\n{err[-3000:]}"
    assert re.search(r"graphlearn sampler server 0 at \S+ \(pid \d+\) was killed by SIGKILL", err)


@pytest.mark.timeout(300)
def test_thread_mode_with_die_with_rank_leaves_no_worker_behind(tmp_path: Path) -> None:
    # Thread mode is enough when every client lives in a DataLoader worker: the rank's main
    # thread waits on the loader's queue without holding the GIL.
    rc, ended_after, survivors, err = _run_kill(
        tmp_path, False, "--sampler", "today", "--mode", "thread", "--die-with-rank"
    )
    assert rc == 1, err[-4000:]
    assert ended_after < JOB_END_S
    assert survivors == [], f"outlived the job: {survivors}\n{err[-3000:]}"
    assert "ERROR healthkit: healthkit_graphlearn: graphlearn sampler server 0" in err


@pytest.mark.timeout(300)
@pytest.mark.parametrize("torchrun", [False, True], ids=["plain", "torchrun"])
def test_guide_code_job_left_alone_finishes_cleanly(tmp_path: Path, torchrun: bool) -> None:
    _gl_available()
    code = after_code(tmp_path)
    job = Job(
        tmp_path,
        "--sampler",
        "after",
        "--after-code",
        str(code),
        "--steps",
        "30",
        torchrun=torchrun,
    )
    try:
        job.wait_ready()
        rc, _ = job.end(120)
        assert rc == 0, job.stderr()[-4000:]
        assert job.out.until(r"DONE rank=0 steps=30", 5) is not None
        assert job.survivors(GONE_S) == []
        assert alarms(job.stderr()) == [], job.stderr()[-3000:]
    finally:
        job.cleanup()
