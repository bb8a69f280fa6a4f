"""Stack dumps of stuck processes: only processes that opted in are ever signalled."""

from __future__ import annotations

import multiprocessing as mp
import tempfile
import time

import healthkit as hk


def wait_for_feature_store(directory: str, ready: object) -> None:
    hk.lowlevel.enable_stack_dumps(directory)
    ready.set()  # type: ignore[attr-defined]
    time.sleep(60)


def no_opt_in(ready: object) -> None:
    ready.set()  # type: ignore[attr-defined]
    time.sleep(60)


def test_a_registered_process_reports_where_it_is_stuck() -> None:
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as d:
        ready = ctx.Event()
        procs = [ctx.Process(target=wait_for_feature_store, args=(d, ready)) for _ in range(2)]
        for p in procs:
            p.start()
        assert ready.wait(60)
        time.sleep(0.5)  # both registered (the second may lag; it is then reported None)
        stacks = hk.lowlevel.dump_stacks(d, [p.pid for p in procs if p.pid is not None])
        for p in procs:
            p.kill()
            p.join()
            p.close()
    assert any(s and "wait_for_feature_store" in s for s in stacks.values())


def test_a_process_that_did_not_opt_in_is_not_signalled() -> None:
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    p = ctx.Process(target=no_opt_in, args=(ready,))
    p.start()
    assert ready.wait(60)
    with tempfile.TemporaryDirectory() as d:
        assert p.pid is not None
        assert hk.lowlevel.dump_stacks(d, [p.pid]) == {p.pid: None}
    time.sleep(0.2)
    assert p.is_alive()  # SIGUSR2 would have killed it
    p.kill()
    p.join()
    p.close()
