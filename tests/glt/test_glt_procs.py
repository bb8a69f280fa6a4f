"""The GLT tests' own process helpers, against real processes: a worker's rank is read from
the order its pid was given out, which is not numeric order once the pid counter wraps."""

from __future__ import annotations

import multiprocessing as mp
import os
from pathlib import Path

import pytest
from glt_procs import in_start_order, spawned_worker_pids

NS_LAST_PID = "/proc/sys/kernel/ns_last_pid"


def _wait_for_stop(conn: object) -> None:
    conn.recv()  # type: ignore[attr-defined]


@pytest.mark.timeout(60)
@pytest.mark.skipif(not os.access(NS_LAST_PID, os.W_OK), reason="needs CAP_SYS_ADMIN")
def test_spawned_workers_come_in_start_order_across_a_pid_wrap() -> None:
    """Two spawned workers started on either side of the wrap (the first gets the last pid
    the counter gives out, the second one of the lowest): listed first to second, which
    sorting the pids would turn round."""
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    ctx = mp.get_context("spawn")
    readers, workers = [], []
    try:
        for i in range(2):
            r, w = ctx.Pipe(duplex=False)
            readers.append(w)
            if i == 0:
                with open(NS_LAST_PID, "w") as f:  # the next pid is the counter's last one
                    f.write(str(pid_max - 2))
            p = ctx.Process(target=_wait_for_stop, args=(r,), daemon=True)
            p.start()
            r.close()
            workers.append(p)
        first, second = (p.pid for p in workers)
        assert first is not None and second is not None
        if second > first:
            pytest.skip(f"another process took the wrap's pid first ({first}, {second})")
        assert spawned_worker_pids() == [first, second]
        assert sorted([first, second]) == [second, first]  # what numeric order would say
    finally:
        for w in readers:
            w.send(None)
            w.close()
        for p in workers:
            p.join(30)


def test_without_a_wrap_start_order_is_numeric_order() -> None:
    parent = os.getpid()
    assert in_start_order([parent + 9, parent + 2, parent + 5], parent) == [
        parent + 2, parent + 5, parent + 9]  # fmt: skip
