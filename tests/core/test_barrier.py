"""BoundedBarrier: the rendezvous always ends, fails on the first death, names every party."""

from __future__ import annotations

import multiprocessing as mp
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import SemLock
from pathlib import Path

import pytest

import healthkit as hk

ORDERLY_EXIT = 7  # a worker released by a broken barrier exits through its finally
MARKERS_ENV = "HK_TEST_MARKERS"  # where a hanging worker says when it reached its hang


def stuck_in_rpc_init() -> None:
    markers = os.environ.get(MARKERS_ENV)
    if markers:  # when it got here: a bound that expired before then tested no stack
        Path(markers, f"reached-{os.getpid()}").write_text(repr(time.monotonic()))
    time.sleep(600)


def hold_every_lock_and_die(bb: hk.BoundedBarrier, rank: int) -> None:
    """Die by SIGKILL holding every lock and semaphore the barrier shares with its parties
    (an OOM kill can land inside the barrier's critical section), once the other workers
    are waiting at the barrier (and the parent, which waits from the start)."""
    deadline = time.monotonic() + 60
    others = [r for r in range(bb.parties) if r != rank]
    while not all(bb._arrived[r] for r in others) and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)  # from "arrived" to blocked inside the barrier's wait
    seen: set[int] = set()
    todo: list[object] = [bb]
    while todo:  # whatever the barrier is made of: take all that can be taken
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, SemLock):
            obj.acquire(False)
        elif obj is bb or type(obj).__module__.startswith("multiprocessing"):
            todo.extend(getattr(obj, "__dict__", {}).values())
    os.kill(os.getpid(), signal.SIGKILL)


def worker(rank: int, bb: hk.BoundedBarrier, behaviour: dict[int, str]) -> None:
    bb.enable_stack_dumps()
    what = behaviour.get(rank, "arrive")
    try:
        if what == "exit1":
            sys.exit(1)
        if what == "raise":
            raise RuntimeError("init_rpc gather lost")
        if what == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if what == "hang":
            stuck_in_rpc_init()
        if what == "die-holding-lock":
            hold_every_lock_and_die(bb, rank)
        if what == "late":
            time.sleep(0.5)
        bb.worker_wait(rank)
    except hk.BarrierBrokenError:
        sys.exit(ORDERLY_EXIT)


def start_workers(
    n: int, behaviour: dict[int, str], *, timeout: float = 60.0, method: str = "spawn", **kw: object
) -> tuple[hk.BoundedBarrier, list[BaseProcess]]:
    ctx = mp.get_context(method)
    bb = hk.BoundedBarrier(n, timeout=timeout, ctx=ctx, name="sampling init barrier", **kw)  # type: ignore[arg-type]
    procs: list[BaseProcess] = [
        ctx.Process(target=worker, args=(i, bb, behaviour), daemon=True)  # type: ignore[attr-defined]
        for i in range(n)
    ]
    for p in procs:
        p.start()
    return bb, procs


def teardown(procs: list[BaseProcess]) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(10)
        if p.is_alive():
            p.kill()
            p.join()


def finish(bb: hk.BoundedBarrier, procs: list[BaseProcess]) -> None:
    teardown(procs)
    for p in procs:
        p.close()
    bb.close()


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_all_parties_arrive_and_pass(method: str) -> None:
    bb, procs = start_workers(3, {1: "late"}, method=method)
    bb.wait(procs)
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    finish(bb, procs)


def test_a_barrier_of_the_parent_alone_is_refused_and_one_worker_is_the_least() -> None:
    with pytest.raises(hk.InvalidArgumentError, match="nothing to wait for") as info:
        hk.BoundedBarrier(0, timeout=5)
    assert info.value.argument == "parties"
    hk.BoundedBarrier(1, timeout=5).close()  # the twin: the smallest barrier there is


@pytest.mark.parametrize(
    ("behaviour", "code", "cause"),
    [
        ("exit1", 1, hk.Cause.ERROR_EXIT),
        ("raise", 1, hk.Cause.ERROR_EXIT),
        ("sigkill", -9, hk.Cause.SIGKILL_UNCONFIRMED),
    ],
)
def test_a_worker_dying_early_fails_fast_and_is_named(
    behaviour: str, code: int, cause: hk.Cause
) -> None:
    bound = 120.0
    bb, procs = start_workers(3, {1: behaviour}, timeout=bound)
    start = time.monotonic()
    with pytest.raises(hk.BarrierBrokenError) as info:
        bb.wait(procs, on_failure=lambda err: teardown(procs))
    elapsed = time.monotonic() - start
    err = info.value
    assert not isinstance(err, hk.BarrierTimeoutError)
    assert elapsed < bound / 4  # it did not wait for the bound
    assert err.exit_codes == {1: code}
    assert re.search(rf"rank -> exitcode.*\{{1: {code}\}}", str(err))
    (dead,) = err.dead
    assert dead.diagnosis is not None and dead.diagnosis.cause in (cause, hk.Cause.OOM_KILLED)
    assert dead.pid == procs[1].pid
    assert str(dead.diagnosis) in str(err)
    assert err.barrier_name == "sampling init barrier" and err.bound == bound
    finish(bb, procs)


def test_a_broken_barrier_is_freed_by_reference_counting_alone() -> None:
    """The barrier's wait thread kept the error it raised with its traceback, whose frames
    held the thread's own result list: a reference cycle that kept the barrier and its
    multiprocessing semaphores (named files in /dev/shm) until the cyclic GC ran. A long-lived
    process building a barrier per attempt (a sampling server whose producers fail) grew by
    its semaphores each time. With the cyclic GC off, dropping the barrier frees it."""
    import gc
    import threading
    import weakref

    before = set(threading.enumerate())
    bb, procs = start_workers(3, {1: "sigkill"})
    gc.collect()
    gc.disable()
    try:
        with pytest.raises(hk.BarrierBrokenError):
            bb.wait(procs)
        finish(bb, procs)
        deadline = time.monotonic() + 30
        while any(t.name.startswith(bb.name) for t in set(threading.enumerate()) - before):
            assert time.monotonic() < deadline, "the barrier's threads did not end"
            time.sleep(0.01)
        refs = [weakref.ref(bb), weakref.ref(bb._arrivals), weakref.ref(bb._release)]
        del bb, procs
        assert [r() is None for r in refs] == [True, True, True]
    finally:
        gc.enable()


def test_survivors_waiting_at_the_barrier_are_released_in_order() -> None:
    bb, procs = start_workers(3, {1: "sigkill"})
    time.sleep(3)  # let workers 0 and 2 reach the barrier first
    with pytest.raises(hk.BarrierBrokenError) as info:
        bb.wait(procs)
    for rank in (0, 2):
        procs[rank].join(30)
        assert procs[rank].exitcode == ORDERLY_EXIT
    assert {p.rank for p in info.value.parties if p.state == "arrived"} <= {0, 2}
    finish(bb, procs)


def test_gigl_single_worker_exit_code_format() -> None:
    bb, procs = start_workers(1, {0: "exit1"})
    with pytest.raises(hk.BarrierBrokenError, match=r"rank -> exitcode.*\{0: 1\}"):
        bb.wait(procs)
    finish(bb, procs)


def _reached_before(markers: Path, pid: int | None, moment: float) -> bool:
    """Whether worker ``pid`` wrote its "reached the hang" marker before ``moment``."""
    marker = markers / f"reached-{pid}"
    return marker.exists() and float(marker.read_text()) < moment


@pytest.mark.timeout(120)
def test_a_hanging_worker_fails_at_the_deadline_with_its_stack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stack must show where the worker hangs. A run whose bound expired before the
    spawned worker even reached its hang (a loaded machine: it was still starting) tests
    nothing about that, so it is repeated once with a larger bound (5x), rather than every
    run paying the larger one. The hang's marker tells the cases apart: the stacks are
    dumped after the bound's ``elapsed``, so a marker older than that must be in them."""
    monkeypatch.setenv(MARKERS_ENV, str(tmp_path))
    for bound in (4.0, 20.0):
        bb, procs = start_workers(2, {1: "hang"}, timeout=bound)
        start = time.monotonic()
        with pytest.raises(hk.BarrierTimeoutError) as info:
            bb.wait(procs, on_failure=lambda err, procs=procs: teardown(procs))
        assert time.monotonic() - start >= bound
        err = info.value
        assert err.dead == ()  # worker 0 arrived, or was still starting too
        (stuck,) = (p for p in err.not_arrived if p.rank == 1)
        reached = _reached_before(tmp_path, stuck.pid, start + err.elapsed)
        finish(bb, procs)
        if reached:
            break
    else:
        pytest.fail(f"worker 1 had not reached its hang when a {bound:g}s bound expired")
    assert isinstance(err, TimeoutError) and isinstance(err, RuntimeError)
    assert stuck.stack is not None
    assert "stuck_in_rpc_init" in stuck.stack
    assert "stuck_in_rpc_init" in str(err)
    assert "never arrived" in str(err)


def test_the_timeout_message_says_once_what_to_change() -> None:
    hint = "raise $GIGL_SAMPLING_RPC_INIT_TIMEOUT_SECONDS (this bound is 3 x it)"
    bb, procs = start_workers(2, {0: "hang"}, timeout=3.0, hint=hint)
    with pytest.raises(hk.BarrierTimeoutError) as info:
        bb.wait(procs, on_failure=lambda err: teardown(procs))
    text = str(info.value)
    assert text.count(hint) == 1
    assert text.count("3s") == 1  # the bound, once, in the headline
    assert info.value.bound == 3.0
    finish(bb, procs)


def _barrier_threads(bb: hk.BoundedBarrier, before: set[threading.Thread]) -> list[str]:
    """The names of this barrier's threads still alive after 10 s (a generous bound)."""
    deadline = time.monotonic() + 10
    while True:
        left = [t.name for t in set(threading.enumerate()) - before if t.name.startswith(bb.name)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.01)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("killed", [True, False], ids=["one-killed-holding-the-locks", "none"])
def test_a_worker_killed_holding_the_barriers_locks_leaves_no_parent_thread_blocked(
    killed: bool,
) -> None:
    """A worker SIGKILLed while it held the lock of the multiprocessing barrier this used to
    wrap wedged the parent's own barrier thread (woken, it waited for that lock again)
    forever: a thread leaked per failed barrier in a long-lived process. Now no parent
    thread waits on anything a worker can hold. No teardown hook here: the parent's threads
    must end by themselves, and the workers waiting at the barrier are released."""
    before = set(threading.enumerate())
    bb, procs = start_workers(3, {1: "die-holding-lock"} if killed else {}, timeout=60.0)
    start = time.monotonic()
    if killed:
        with pytest.raises(hk.BarrierBrokenError) as info:
            bb.wait(procs)
        assert time.monotonic() - start < 30  # the death, not the 60 s bound
        assert info.value.exit_codes == {1: -9}
        assert {p.rank for p in info.value.parties if p.state == "arrived"} == {0, 2}
    else:
        bb.wait(procs)  # the twin: everyone arrives and passes
    assert _barrier_threads(bb, before) == []
    with pytest.raises(hk.UsageError, match="one rendezvous"):
        bb.wait(procs)  # decided once, either way
    for rank in (0, 2):
        procs[rank].join(30)
        assert procs[rank].exitcode == (ORDERLY_EXIT if killed else 0)
    finish(bb, procs)


@pytest.mark.timeout(90)
def test_ctrl_c_in_the_parents_wait_ends_its_thread_and_frees_the_waiting_workers() -> None:
    before = set(threading.enumerate())
    bb, procs = start_workers(2, {1: "hang"}, timeout=60.0)
    interrupt = threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGINT))
    interrupt.start()
    with pytest.raises(KeyboardInterrupt):
        bb.wait(procs)
    interrupt.join()
    assert _barrier_threads(bb, before) == []
    procs[0].join(30)  # it arrived (or arrives) and is told the barrier is broken
    assert procs[0].exitcode == ORDERLY_EXIT
    finish(bb, procs)


def test_the_teardown_hook_runs_after_the_diagnosis() -> None:
    seen: list[tuple[str, ...]] = []
    bb, procs = start_workers(2, {0: "sigkill"})

    def hook(err: hk.BarrierBrokenError) -> None:
        # Diagnosed before teardown: the live worker is not reported dead.
        seen.append(tuple(p.state for p in err.parties))
        teardown(procs)

    with pytest.raises(hk.BarrierBrokenError):
        bb.wait(procs, on_failure=hook)
    assert seen and seen[0][0] == "dead" and seen[0][1] != "dead"
    finish(bb, procs)


def _wait_in_a_child(bb: hk.BoundedBarrier) -> None:
    try:
        bb.wait([])
    except hk.UsageError as e:
        os._exit(3 if "worker_wait(rank)" in str(e) else 4)
    os._exit(5)


@pytest.mark.timeout(60)
def test_wait_from_another_process_is_a_usage_error_that_says_what_to_call() -> None:
    bb = hk.BoundedBarrier(1, timeout=60)
    child = mp.get_context("fork").Process(target=_wait_in_a_child, args=(bb,))
    child.start()
    child.join(30)
    assert child.exitcode == 3
    bb.close()


def test_worker_wait_gives_up_after_its_own_bound() -> None:
    bb = hk.BoundedBarrier(1, timeout=60)
    start = time.monotonic()
    with pytest.raises(hk.BarrierBrokenError, match=r"waited 0\.3s"):
        bb.worker_wait(0, timeout=0.3)  # the parent never comes
    assert time.monotonic() - start < 10
    bb.close()  # and the leak check proves its waiting thread ended at the bound too


def test_a_worker_stops_waiting_when_its_parent_dies(tmp_path: Path) -> None:
    script = tmp_path / "parent.py"
    script.write_text(
        textwrap.dedent(
            """
            import multiprocessing as mp, os, sys, time
            import healthkit as hk

            def work(bb):
                try:
                    bb.worker_wait(0)
                except hk.BarrierBrokenError as e:
                    print("released:", e, flush=True)
                    sys.exit(7)

            if __name__ == "__main__":
                ctx = mp.get_context("spawn")
                bb = hk.BoundedBarrier(1, timeout=600, ctx=ctx)
                p = ctx.Process(target=work, args=(bb,))
                p.start()
                print(p.pid, flush=True)
                time.sleep(3)
                os._exit(3)  # the parent dies without ever waiting
            """
        )
    )
    owner = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None
    child = int(owner.stdout.readline())
    with hk.ProcessWatch(child) as w:
        status = w.wait(60)
        if status is None:
            w.kill()
            w.wait(10)
    out, _ = owner.communicate(timeout=30)
    assert status is not None
    assert "released:" in out and "its parent died" in out


def test_bad_arguments_are_rejected() -> None:
    with pytest.raises(ValueError, match="parties"):
        hk.BoundedBarrier(-1, timeout=1)
    with pytest.raises(hk.InvalidArgumentError):
        hk.BoundedBarrier(1, timeout=-5)
    with pytest.raises(hk.InvalidArgumentError):
        hk.BoundedBarrier(1, timeout=float("nan"))
    with pytest.raises(hk.InvalidArgumentTypeError, match="hint"):
        hk.BoundedBarrier(2, timeout=1, hint=3)  # type: ignore[arg-type]
    bb = hk.BoundedBarrier(2, timeout=1)
    with pytest.raises(ValueError, match="expected 2 workers"):
        bb.wait([])
    with pytest.raises(ValueError, match="rank"):
        bb.worker_wait(5)
    bb.close()


# --------------------------------------------------------------------------- env values
@pytest.mark.parametrize("raw", ["abc", "-1", "0", "nan", "inf", "1e999"])
def test_bad_env_values_warn_and_fall_back_to_the_default(
    raw: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HK_TEST_TIMEOUT", raw)
    with pytest.warns(hk.lowlevel.EnvValueWarning, match="HK_TEST_TIMEOUT"):
        value, from_env = hk.lowlevel.read_env_seconds("HK_TEST_TIMEOUT", 600, multiplier=3)
    assert (value, from_env) == (600, False)
    with pytest.raises(hk.InvalidArgumentError, match="HK_TEST_TIMEOUT"):
        hk.lowlevel.env_seconds("HK_TEST_TIMEOUT", 600, strict=True)


def test_good_and_missing_env_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HK_TEST_TIMEOUT", raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert hk.lowlevel.read_env_seconds("HK_TEST_TIMEOUT", 600) == (600, False)
        monkeypatch.setenv("HK_TEST_TIMEOUT", " 20 ")
        assert hk.lowlevel.read_env_seconds("HK_TEST_TIMEOUT", 600, multiplier=2.5) == (20, True)
    assert hk.lowlevel.env_seconds("HK_TEST_TIMEOUT", 1) == 20
