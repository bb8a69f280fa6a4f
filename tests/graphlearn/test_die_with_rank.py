"""die_with_rank(): a DataLoader worker stuck in a call that never returns to torch's loop (as a
GL client retrying a dead server is) dies with its rank, whoever kills the rank; without it
the worker stays behind. Real torch DataLoader workers, a real SIGKILL; no GL needed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from gl_procs import descendants
from linereader import LineReader

import healthkit as hk

pytestmark = pytest.mark.graphlearn
pytest.importorskip("torch")


RANK = textwrap.dedent(
    """
    import os, sys, time
    import healthkit_graphlearn as hkgl
    from torch.utils.data import DataLoader, IterableDataset

    BIND = sys.argv[1] == "1"

    class Stuck(IterableDataset):
        def __iter__(self):
            if BIND:
                assert hkgl.die_with_rank() is True
                assert hkgl.die_with_rank() is True  # a second call is free
            yield os.getpid()
            time.sleep(600)  # like a GL call retrying a dead server: torch's loop never runs

    print("MAIN", hkgl.die_with_rank(), flush=True)  # not a worker: nothing to do
    pids = set()
    for pid in DataLoader(Stuck(), batch_size=None, num_workers=2):
        pids.add(int(pid))
        if len(pids) == 2:
            print("WORKERS", *sorted(pids), flush=True)
    """
)


def _run(tmp_path: Path, bind: bool) -> tuple[str, list[bool]]:
    """Start the rank, SIGKILL it once both workers are stuck; which workers died within
    10 s of it (their exit code may be unknown: init reaps them)."""
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    proc = subprocess.Popen(
        [sys.executable, str(script), "1" if bind else "0"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    out = LineReader(proc.stdout)
    watches: list[hk.ProcessWatch] = []
    try:
        m = out.until(r"WORKERS (\d+) (\d+)", 60)
        assert m, "\n".join(out.lines)
        watches = [hk.ProcessWatch(int(m.group(i))) for i in (1, 2)]
        proc.kill()  # the rank dies as hard as it can: no cleanup code runs
        proc.wait(30)
        deadline = time.monotonic() + 10  # one deadline for both: a survivor costs 10 s, not 20
        return "\n".join(out.lines), [
            w.wait(max(0.0, deadline - time.monotonic())) is not None for w in watches
        ]
    finally:
        for pid in descendants(proc.pid):
            os.kill(pid, signal.SIGKILL)
        for w in watches:
            w.kill()
            w.wait(10)
            w.close()
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)
        out.until(r"(?!x)x", 5)
        assert proc.stdout is not None
        proc.stdout.close()


@pytest.mark.timeout(120)
def test_a_stuck_worker_that_called_die_with_rank_dies_with_its_sigkilled_rank(
    tmp_path: Path,
) -> None:
    out, died = _run(tmp_path, bind=True)
    assert "MAIN False" in out
    assert died == [True, True], "a worker outlived its rank"


@pytest.mark.timeout(120)
def test_without_it_a_stuck_worker_outlives_its_rank(tmp_path: Path) -> None:
    _, died = _run(tmp_path, bind=False)
    assert died == [False, False]  # both still alive 10 s after the rank died


def test_bad_rank_pid_is_refused_with_the_argument_named() -> None:
    import healthkit_graphlearn as hkgl

    with pytest.raises(hk.InvalidArgumentTypeError, match="rank_pid"):
        hkgl.die_with_rank("123")  # type: ignore[arg-type]
    with pytest.raises(hk.NoSuchProcessError):
        hkgl.die_with_rank(0)
