"""healthkit_torch on real DataLoaders: each way a worker dies is named at once, in the
RuntimeError torch users catch, and each way torch itself ends its workers stays silent.

Real workers (2 to 4, fork / spawn / forkserver), real signals: a SIGKILL by hand, a null
read in native code, a SIGBUS from a truncated file mapping (the stand-in for a full
/dev/shm: same fault, same signal), an exit code, a real OOM kill under a 256 MiB memory
cgroup. Timings are "does not hang" bounds; the figures are in benchmarks/bench_dataloader.py.
"""

from __future__ import annotations

import gc
import logging
import os
import re
import select
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

import healthkit_torch
import pytest
import torch.utils.data
from dl_helpers import DiesAt, Slow
from healthkit_torch import DataLoaderWorkerError
from testutil import kernel_log_unusable, memory_cgroup_or_skip, remove_cgroup
from torch.utils.data import DataLoader

from healthkit import Cause, HealthkitError

pytestmark = pytest.mark.timeout(150)

CONTEXTS = ("fork", "spawn", "forkserver")
# "Does not hang": the latency figures are the benchmark's. Which path raised is asserted
# instead (healthkit's wake-up, or torch's SIGCHLD handler), not how fast on a loaded machine.
HANG_S = 90.0


def loader(dataset: Any = None, *, ctx: str = "fork", workers: int = 2, **kw: Any) -> Any:
    return DataLoader(
        dataset if dataset is not None else Slow(),
        batch_size=kw.pop("batch_size", 4),
        num_workers=workers,
        multiprocessing_context=ctx,
        **kw,
    )


def drain(it: Iterator[Any], limit: float = 90.0) -> int:
    n, deadline = 0, time.monotonic() + limit
    for _ in it:
        n += 1
        assert time.monotonic() < deadline, "the loader did not end"
    return n


def raised_by(it: Iterator[Any], limit: float = 90.0) -> tuple[BaseException, float]:
    """Iterate until an error; return it and how long after the call began it came."""
    t0 = time.monotonic()
    try:
        with pytest.raises(RuntimeError) as info:
            drain(it, limit)
        return info.value, time.monotonic() - t0
    finally:
        end(it)  # a failed assertion must not leave workers to the next test


def end(it: Any) -> None:
    """End an iterator's workers now, as its ``__del__`` does. A caught error's traceback
    holds the iterator in a reference cycle with the test's frame; freed by the collector,
    torch's index queues are finalized before the iterator's ``__del__`` and each worker then
    waits out torch's 5 s status check (stock torch does the same)."""
    it._shutdown_workers()


def healthkit_records(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name.startswith("healthkit") and r.levelno >= logging.INFO]


@pytest.fixture(autouse=True)
def _log_and_collect(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Capture healthkit's log; at the end free what a caught error's traceback kept alive
    (its frames hold the iterator: torch ends the workers when that is collected), before
    the leak check looks."""
    caplog.set_level(logging.DEBUG, logger="healthkit")
    yield
    gc.collect()


# --------------------------------------------------------------------- fires


@pytest.mark.parametrize("ctx", CONTEXTS)
def test_a_worker_killed_by_hand_while_main_waits_is_named_at_once_unconfirmed(ctx: str) -> None:
    """SIGKILL by hand while the main process waits for a batch: DataLoaderWorkerError, a
    RuntimeError, within a fraction of torch's 5 s check (a forkserver worker is no child:
    torch has only that check), naming the worker, its pid and "unconfirmed". torch's own
    exit status of the worker stays what it is (w.exitcode is -9)."""
    it = iter(watched := healthkit_torch.watch(loader(Slow(delay=0.05), ctx=ctx)))
    next(it)
    victim = it._workers[1]
    os.kill(victim.pid, signal.SIGKILL)
    err, took = raised_by(it)
    assert isinstance(err, DataLoaderWorkerError) and isinstance(err, RuntimeError)
    assert isinstance(err, HealthkitError)
    msg = str(err)
    assert msg.startswith(f"DataLoader worker 1 (pid {victim.pid}) was killed by SIGKILL: "
                          "possibly the OOM killer, unconfirmed"), msg
    assert "num_workers=2, prefetch_factor=2, persistent_workers=False, batch_size=4, " \
        f"pin_memory=False, multiprocessing_context={ctx}" in msg, msg
    assert (err.worker_id, err.pid, err.diagnosis.cause) == (1, victim.pid,
                                                             Cause.SIGKILL_UNCONFIRMED)
    assert took < HANG_S, took
    if ctx == "forkserver":  # no SIGCHLD: torch has only its 5 s check, healthkit woke it
        assert err.__cause__ is None, repr(err.__cause__)
    else:  # a child: torch may see it first (its error is the cause): its SIGCHLD handler,
        # or, when that handler's error lands in its receive, its check of the workers
        assert err.__cause__ is None or re.search(
            rf"is killed by signal: Killed|pid\(s\) {victim.pid}\) exited unexpectedly",
            str(err.__cause__)), repr(err.__cause__)  # fmt: skip
    victim.join(5)
    assert victim.exitcode == -signal.SIGKILL
    end(it)
    del it, watched


@pytest.mark.parametrize("ctx", ["fork", "forkserver"])
def test_a_worker_killed_while_main_computes_raises_by_the_next_batch(ctx: str) -> None:
    """The worker dies while the main process computes. With fork, torch's SIGCHLD handler
    raises in the middle of the computation; the handler chained after it makes that error
    healthkit's, with torch's as its cause. A forkserver worker sends no SIGCHLD: the next
    next() raises at once (torch's own check would take 5 s)."""
    it = iter(healthkit_torch.watch(loader(ctx=ctx)))
    next(it)
    pid = it._workers[0].pid
    t0 = time.monotonic()
    err: BaseException | None = None
    try:
        os.kill(pid, signal.SIGKILL)
        while time.monotonic() - t0 < 0.5:
            sum(range(1000))  # the training step
        t1 = time.monotonic()
        next(it)
        next(it)
    except RuntimeError as e:
        err = e
    assert isinstance(err, DataLoaderWorkerError), repr(err)
    assert f"DataLoader worker 0 (pid {pid}) was killed by SIGKILL" in str(err)
    if ctx == "fork":
        assert isinstance(err.__cause__, RuntimeError)
        assert "is killed by signal: Killed" in str(err.__cause__)  # torch's, intact
    else:
        assert err.__cause__ is None  # raised by the first next(), not torch's 5 s check
        assert time.monotonic() - t1 < HANG_S
    end(it)
    del it


def test_torchs_sigchld_handler_still_runs_first_and_its_error_becomes_the_cause() -> None:
    """The SIGCHLD handler in place after watching is torch's, chained: called once a fork
    worker is dead, torch's own check (waitid WNOWAIT on the registered workers) raises its
    error, which comes out as healthkit's diagnosis of the same death, ``from`` torch's. The
    worker stays a zombie for torch: its exitcode reads -9 afterwards."""
    it = iter(healthkit_torch.watch(loader()))
    next(it)
    victim = it._workers[0]
    handler = signal.getsignal(signal.SIGCHLD)
    assert callable(handler)
    old = signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # this test calls it, not the kernel
    try:
        os.kill(victim.pid, signal.SIGKILL)
        # Wait until the whole worker is a zombie (its pidfd readable; its main thread
        # shows "Z" in /proc earlier, while its other threads still exit).
        fd = os.pidfd_open(victim.pid)
        try:
            assert select.select([fd], [], [], HANG_S)[0]
        finally:
            os.close(fd)
        with pytest.raises(DataLoaderWorkerError) as info:
            handler(signal.SIGCHLD, None)
    finally:
        signal.signal(signal.SIGCHLD, old)
    assert f"DataLoader worker (pid {victim.pid}) is killed by signal: Killed" in str(
        info.value.__cause__)
    assert str(info.value).startswith(f"DataLoader worker 0 (pid {victim.pid}) was killed")
    del info
    end(it)
    assert victim.exitcode == -signal.SIGKILL
    del it


@pytest.mark.parametrize(("how", "cause", "what"), [
    ("segv", Cause.NATIVE_CRASH, "was killed by SIGSEGV"),
    ("bus", Cause.BUS_ERROR, "was killed by SIGBUS"),
    ("exit3", Cause.ERROR_EXIT, "exited with code 3"),
])
def test_a_worker_crash_or_exit_code_is_named_with_its_cause(
    how: str, cause: Cause, what: str
) -> None:
    """SIGSEGV in native code, SIGBUS, an exit code: each named with the worker and its
    cause; a SIGBUS also with /dev/shm's measured free space and the knobs that fill it."""
    dataset = DiesAt(at=20, how=how)
    it = iter(healthkit_torch.watch(loader(dataset, ctx="fork", workers=3, batch_size=2)))
    err, took = raised_by(it)
    assert isinstance(err, DataLoaderWorkerError), repr(err)
    assert err.diagnosis.cause is cause, err
    assert str(err).startswith(f"DataLoader worker {err.worker_id} (pid {err.pid}) {what}"), err
    assert "num_workers=3" in str(err)
    if how == "bus":
        assert any(e.startswith("/dev/shm: ") and " free of " in e
                   for e in err.diagnosis.evidence), err.diagnosis.evidence
        assert "num_workers x prefetch_factor" in str(err)
    assert took < HANG_S, took
    end(it)
    del it


def test_a_workers_python_exception_keeps_torchs_own_reraise() -> None:
    """A Python exception in the dataset is torch's to re-raise (its type, its worker
    traceback): healthkit does not touch it, and logs nothing."""
    it = iter(healthkit_torch.watch(loader(DiesAt(at=9, how="raise"))))
    with pytest.raises(ValueError, match="bad item 9") as info:
        drain(it)
    assert not isinstance(info.value, DataLoaderWorkerError)
    assert "Caught ValueError in DataLoader worker process" in str(info.value)
    end(it)
    del it


def test_a_killed_worker_of_a_later_epoch_is_watched_too() -> None:
    """Without persistent workers every epoch starts new workers; they are watched as
    well: a clean first epoch stays silent, a worker killed in the second one is named."""
    watched = healthkit_torch.watch(loader(Slow(n=40)))
    assert drain(iter(watched)) == 10
    it = iter(watched)
    next(it)
    os.kill(it._workers[1].pid, signal.SIGKILL)
    err, _ = raised_by(it)
    assert isinstance(err, DataLoaderWorkerError) and err.worker_id == 1
    end(it)
    del it


def test_persistent_workers_are_watched_across_epochs_and_silent_at_their_end(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Persistent workers: two clean epochs, then a kill between epochs is raised by the
    next epoch's iter() (torch resumes the workers there)."""
    watched = healthkit_torch.watch(loader(Slow(n=40), persistent_workers=True))
    assert drain(iter(watched)) == 10
    assert drain(iter(watched)) == 10
    assert healthkit_records(caplog) == []
    os.kill(watched._iterator._workers[0].pid, signal.SIGKILL)
    with pytest.raises(DataLoaderWorkerError, match=r"^DataLoader worker 0 \(pid \d+\) was "
                       r"killed by SIGKILL"):
        drain(iter(watched))
    del watched
    gc.collect()


@pytest.mark.parametrize("ctx", ["fork", "forkserver"])
def test_a_worker_killed_holding_the_done_events_lock_does_not_hang_the_loader(
    ctx: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Worker 1 is SIGKILLed while it holds the lock of torch's workers' done event (each
    worker takes it between batches). torch reads that event in the main thread in two
    places, each of which would wait for the lock forever: its check of the workers after a
    failed or timed-out read (a dead worker is marked unavailable; reached when its SIGCHLD
    handler raises inside the read), called here as torch calls it, and its shutdown, whose
    first step sets the event (at the iterator's __del__, after the error). Both return, the
    error is raised, and the shutdown ends the other worker by torch's bounded join and
    terminate. Its twin: a shutdown with every worker alive still sets the real event
    (workers exit 0)."""
    it = iter(healthkit_torch.watch(loader(DiesAt(at=5, how="kill-holding-done-lock"), ctx=ctx)))
    lock = it._workers_done_event._cond._lock
    try:
        with pytest.raises(RuntimeError) as info:
            drain(it)
        err = info.value
        del info
        assert isinstance(err, DataLoaderWorkerError) and "killed by SIGKILL" in str(err), err
        it._workers[err.worker_id].join(HANG_S)
        if it._workers_status[err.worker_id]:  # else torch's own check ran already
            check = threading.Thread(target=it._mark_worker_as_unavailable,
                                     args=(err.worker_id,))
            check.start()
            check.join(HANG_S)
            if check.is_alive():
                lock.release()  # the dead worker's hold on it, to end the stuck thread
                check.join()
                it._workers_done_event = threading.Event()  # that lock's count is off now
                pytest.fail("torch's check of its workers waited for the dead worker's lock")
    finally:
        end(it)  # a shutdown that blocked would time out here
    assert all(w.exitcode is not None for w in it._workers)
    assert "held the lock of the workers' done event" in "\n".join(healthkit_records(caplog))
    del it

    twin = iter(healthkit_torch.watch(loader(ctx=ctx)))
    next(twin)
    end(twin)
    assert [w.exitcode for w in twin._workers] == [0, 0]
    del twin


def test_a_worker_dead_before_its_watch_is_set_up_is_named_by_the_loader() -> None:
    """A fork worker dies on its first item while the main process still sets up the watch
    of the new iterator (the watchdog starts a small process then: slow on a loaded
    machine). torch's SIGCHLD handler raises wherever the main thread is; it used to leave
    iter() as torch's bare error, from the middle of that set-up, with the workers and that
    process left running. Now the diagnosis is raised (by the first next(), or by the
    chained handler once the watch runs), from torch's error."""
    watched = healthkit_torch.watch(loader(DiesAt(at=0, how="kill-while-watched-starts")))
    it: Any = None
    try:
        it = iter(watched)
        drain(it)
    except RuntimeError as e:
        err: BaseException | None = e
    else:
        err = None
    finally:
        if it is not None:
            end(it)
    assert isinstance(err, DataLoaderWorkerError), repr(err)
    assert err.worker_id == 0 and "was killed by SIGKILL" in str(err), err
    del err, it


@pytest.mark.skipif(os.geteuid() != 0, reason="a real OOM kill needs root to make a cgroup")
def test_a_worker_oom_killed_under_a_memory_limit_is_confirmed_with_its_memory_and_limit(
    tmp_path: Any,
) -> None:
    """Worker 1 joins a 256 MiB memory cgroup (v1) and allocates until the kernel's OOM
    killer ends it: confirmed, from the kernel's own record of that worker, with its memory
    at the kill and the limit it hit (whose cgroup). The opposite hole, a SIGKILL by hand
    called an OOM kill, is the "unconfirmed" test above."""
    if (why := kernel_log_unusable()) is not None:
        pytest.skip(why)
    cgroup = memory_cgroup_or_skip(256 << 20, "dl-oom")
    try:
        it = iter(healthkit_torch.watch(loader(DiesAt(at=5, how=f"oom:{cgroup}"), workers=2)))
        err, _ = raised_by(it, limit=45)
        end(it)
        del it
    finally:
        remove_cgroup(cgroup)
    assert isinstance(err, DataLoaderWorkerError), repr(err)
    d = err.diagnosis
    assert d.cause is Cause.OOM_KILLED, str(err)
    assert str(err).startswith(f"DataLoader worker {err.worker_id} (pid {err.pid}) was killed "
                               "by SIGKILL: the kernel's OOM killer (confirmed)"), str(err)
    assert any(e.startswith("kernel log: ") and f"Killed process {err.pid} " in e
               for e in d.evidence), d.evidence
    assert any(e.startswith("its memory at the kill ") for e in d.evidence), d.evidence
    name = os.path.basename(cgroup)
    assert any(e.startswith("the limit hit: memory cgroup ") and name in e and
               "256.0 MiB limit" in e for e in d.evidence), d.evidence


# --------------------------------------------------------------------- silent


@pytest.mark.parametrize("ctx", CONTEXTS)
def test_a_clean_epoch_and_its_end_report_nothing(
    ctx: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The twin of the kill tests: the same loader, nobody killed, every batch arrives and
    the end of the epoch (torch joins its workers, exit 0) is silent."""
    workers = {"fork": 4, "spawn": 2, "forkserver": 3}[ctx]  # spawn: each imports torch anew
    assert drain(iter(healthkit_torch.watch(loader(Slow(n=40), ctx=ctx, workers=workers)))) == 10
    assert healthkit_records(caplog) == []


def test_an_iterator_dropped_mid_epoch_or_a_loader_collected_is_silent(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``del it`` mid-epoch, and a loader with persistent workers freed by the garbage
    collector mid-epoch (held in a reference cycle): torch ends the workers it still has
    (told to stop, joined, terminated if they linger); none of that is reported. A
    collected iterator is torch's slow path (its queues may be finalized first: the workers
    miss the stop message and wait out torch's 5 s check, or are left to exit), so the
    test ends what is left itself, after checking that nothing was reported."""
    it = iter(healthkit_torch.watch(loader()))
    next(it)
    pids = [w.pid for w in it._workers]
    del it  # by its reference count: torch's __del__ runs now
    deadline = time.monotonic() + HANG_S
    while any(os.path.exists(f"/proc/{pid}") for pid in pids):  # ended and reaped by torch
        assert time.monotonic() < deadline, [p for p in pids if os.path.exists(f"/proc/{p}")]
        time.sleep(0.05)
    monkeypatch.setattr(torch.utils.data._utils, "MP_STATUS_CHECK_INTERVAL", 0.5)
    watched = healthkit_torch.watch(loader(persistent_workers=True))
    watched.me = watched  # a cycle: only the collector frees the loader and its iterator
    next(iter(watched))
    workers = list(watched._iterator._workers)
    del watched
    gc.collect()
    time.sleep(0.5)
    assert healthkit_records(caplog) == []
    for w in workers:
        w.join(2)
        if w.exitcode is None:
            w.terminate()
            w.join(HANG_S)
    time.sleep(0.2)
    assert healthkit_records(caplog) == []


def test_torchs_own_timeout_stays_torchs_and_its_end_is_silent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """DataLoader(timeout=...): torch raises its own "timed out" error (not healthkit's: no
    worker died), then ends its workers itself; nothing is reported. Its twin, a worker dead
    while torch waits, is the first test."""
    it = iter(healthkit_torch.watch(loader(Slow(n=40, delay=1.0), timeout=0.3)))
    with pytest.raises(RuntimeError, match=r"DataLoader timed out after 0\.3 seconds") as info:
        next(it)
    assert not isinstance(info.value, DataLoaderWorkerError)
    end(it)
    del it
    gc.collect()
    time.sleep(0.2)
    assert healthkit_records(caplog) == []


def test_an_exhausted_iterable_replica_ending_is_silent(caplog: pytest.LogCaptureFixture) -> None:
    """An IterableDataset replica that runs out: torch tells that worker to stop (exit 0)
    and goes on with the others; that is no failure."""

    it = iter(healthkit_torch.watch(DataLoader(dl_iterable(), batch_size=2, num_workers=2,
                                               multiprocessing_context="fork")))
    assert drain(it) > 0
    assert healthkit_records(caplog) == []


def dl_iterable() -> Any:
    from dl_helpers import Uneven

    return Uneven()


def test_a_loader_watched_twice_reports_once(caplog: pytest.LogCaptureFixture) -> None:
    """watch(watch(loader)), healthkit_torch.DataLoader watched again, inside
    watching_all(): one watch per worker, one report."""
    twice = healthkit_torch.watch(healthkit_torch.watch(loader()))
    assert type(twice) is type(healthkit_torch.watch(loader()))
    sub = healthkit_torch.watch(healthkit_torch.DataLoader(Slow(), batch_size=4, num_workers=2,
                                                           multiprocessing_context="fork"))
    assert type(sub) is healthkit_torch.DataLoader
    with healthkit_torch.watching_all():
        it = iter(twice)
        next(it)
        assert len(it._hk_guard.watchdog.watches) == 2
        os.kill(it._workers[0].pid, signal.SIGKILL)
        err, _ = raised_by(it)
    assert isinstance(err, DataLoaderWorkerError)
    reports = [m for m in healthkit_records(caplog) if "was killed by SIGKILL" in m]
    assert len(reports) == 1, reports
    end(it)
    del it


def test_watching_all_watches_loaders_made_elsewhere_and_only_inside() -> None:
    """A loader made by other code (no healthkit call on it) is watched inside
    ``watching_all()``, and is torch's own again after the block."""
    plain = loader()
    with healthkit_torch.watching_all():
        it = iter(plain)
        assert hasattr(it, "_hk_guard")
        os.kill(it._workers[1].pid, signal.SIGKILL)
        err, _ = raised_by(it)
        assert isinstance(err, DataLoaderWorkerError)
        end(it)
        del it
    it = iter(plain)
    assert not hasattr(it, "_hk_guard")
    assert drain(it) == 100
    end(it)
    del it


def test_bad_input_is_a_typed_error() -> None:
    with pytest.raises(TypeError, match=r"loader must be a torch\.utils\.data\.DataLoader"):
        healthkit_torch.watch([1, 2, 3])  # type: ignore[type-var]
    with pytest.raises(TypeError, match="enabled"):
        healthkit_torch.watching_all("yes")  # type: ignore[arg-type]


def test_a_single_process_loader_is_left_alone() -> None:
    assert drain(iter(healthkit_torch.watch(DataLoader(Slow(n=8), batch_size=4)))) == 2



def test_the_leak_check_forgives_only_an_unowned_empty_tempfile_probe() -> None:
    """The leak check closes an fd torch's interrupted probe leaves (an empty ``tmpXXXXXXXX``
    in the temp dir, which healthkit never names so); an fd to anything else, to a file of
    that name with data in it, or to a ``tmp`` name of another shape still counts."""
    from testutil import close_interrupted_torch_probes

    tmp = tempfile.gettempdir()
    probe = os.open(os.path.join(tmp, f"tmp{os.urandom(4).hex()}"), os.O_CREAT | os.O_RDWR)
    written = os.open(os.path.join(tmp, f"tmp{os.urandom(4).hex()}"), os.O_CREAT | os.O_RDWR)
    os.write(written, b"x")
    named = os.open(os.path.join(tmp, f"hk-{os.urandom(4).hex()}"), os.O_CREAT | os.O_RDWR)
    short = os.open(os.path.join(tmp, f"tmp{os.urandom(3).hex()}"), os.O_CREAT | os.O_RDWR)
    path = os.readlink(f"/proc/self/fd/{probe}")
    kept = [written, named, short]
    try:
        assert close_interrupted_torch_probes({probe, *kept}) == {probe}
        assert not os.path.exists(path)
        for fd in kept:
            os.fstat(fd)  # still open
    finally:
        for fd in kept:
            os.unlink(os.readlink(f"/proc/self/fd/{fd}"))
            os.close(fd)
