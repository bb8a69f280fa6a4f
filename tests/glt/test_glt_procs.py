"""The GLT tests' own process helpers, against real processes: a worker's rank is read from
the order its pid was given out, which is not numeric order once the pid counter wraps."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
from pathlib import Path

import pytest
from glt_procs import in_start_order, spawned_worker_pids

NS_LAST_PID = "/proc/sys/kernel/ns_last_pid"


def _wait_for_stop(conn: object) -> None:
    conn.send("up")  # type: ignore[attr-defined]
    conn.recv()  # type: ignore[attr-defined]


@pytest.mark.timeout(60)
@pytest.mark.skipif(not os.access(NS_LAST_PID, os.W_OK), reason="needs CAP_SYS_ADMIN")
def test_spawned_workers_come_in_start_order_across_a_pid_wrap() -> None:
    """Two spawned workers started on either side of the wrap (the first gets the last pid
    the counter gives out, the second one of the lowest): listed first to second, which
    sorting the pids would turn round."""
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    ctx = mp.get_context("spawn")
    ours, workers = [], []
    try:
        for i in range(2):
            mine, theirs = ctx.Pipe()
            ours.append(mine)
            if i == 0:
                with open(NS_LAST_PID, "w") as f:  # the next pid is the counter's last one
                    f.write(str(pid_max - 2))
            p = ctx.Process(target=_wait_for_stop, args=(theirs,), daemon=True)
            p.start()
            theirs.close()
            workers.append(p)
        # Both running their target: a spawned child's command line is the parent's until
        # it has exec'd its interpreter, which under load comes after start() returns.
        for mine in ours:
            assert mine.poll(30) and mine.recv() == "up"
        first, second = (p.pid for p in workers)
        assert first is not None and second is not None
        if second > first:
            pytest.skip(f"another process took the wrap's pid first ({first}, {second})")
        assert spawned_worker_pids() == [first, second]
        assert sorted([first, second]) == [second, first]  # what numeric order would say
    finally:
        for mine in ours:
            with contextlib.suppress(OSError):
                mine.send(None)
            mine.close()
        for p in workers:
            p.join(30)
            p.close()


def test_without_a_wrap_start_order_is_numeric_order() -> None:
    parent = os.getpid()
    assert in_start_order([parent + 9, parent + 2, parent + 5], parent) == [
        parent + 2, parent + 5, parent + 9]  # fmt: skip
