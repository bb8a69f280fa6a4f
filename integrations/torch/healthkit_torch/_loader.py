"""torch DataLoader workers watched by pidfd; a dead worker's cause raised at the next batch.

torch notices a dead worker two ways (``torch/utils/data/dataloader.py``,
``_utils/signal_handling.py``): a SIGCHLD handler that peeks at the registered workers with
``waitid(WNOWAIT)`` and raises "DataLoader worker (pid N) is killed by signal: Killed." from
wherever the main thread is, and, where that handler cannot help (a ``forkserver`` worker is
not a child, a loader iterated outside the main thread has no handler), a check every
``MP_STATUS_CHECK_INTERVAL`` (5 s) while waiting for a batch. Neither says why: an OOM kill,
a ``kill -9`` and a node-level cleanup all read "Killed".

Here each worker of a multi-process iterator is watched by a :class:`healthkit.
DisarmableWatchdog` (thread mode, one thread per iterator, pidfds: never reaps, so torch's
``waitid(WNOWAIT)``, ``w.is_alive()`` and ``w.exitcode`` read what they always read). Its one
action works out the full diagnosis (the kernel's OOM record and the cgroup counter, the
worker's memory at the kill, ``/dev/shm`` for SIGBUS), adds the DataLoader's knobs, publishes
it and wakes the main thread if it waits for a batch (a byte on a pipe it polls beside the
result queue; with ``pin_memory`` a marker in the thread queue it blocks on). The waiting or
next ``next(it)`` raises :class:`DataLoaderWorkerError`. torch's own errors about a dead
worker (its SIGCHLD handler's, its 5 s check's) are raised as that error too, with torch's
as the cause: inside ``next()`` by the iterator, elsewhere by a SIGCHLD handler chained after
torch's, which it runs first and unchanged.

Silent when torch ends its workers (end of epoch, ``del``, garbage collection, the timeout
error, interpreter exit): the watchdog is disarmed before torch's ``_shutdown_workers`` runs,
and at interpreter exit by the watchdog's own exit hook. A stop of the job (Ctrl-C, a
launcher's SIGTERM) is judged by the core's firing rule, as for any helper.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import select
import signal
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any, TypeVar

import attrs
import torch.utils.data
from torch.utils.data import _utils as _torch_utils
from torch.utils.data import dataloader as _dl

from healthkit import (
    Cause,
    Diagnosis,
    DisarmableWatchdog,
    ExitDiagnoser,
    ProcessDiedError,
    ProcessWatch,
)
from healthkit._shared import check_bool
from healthkit.actions import FailureEvent, write_torchelastic_error_file
from healthkit.lowlevel import flush_logging

__all__ = ["DataLoader", "DataLoaderWorkerError", "watch", "watching_all"]

logger = logging.getLogger("healthkit.torch")

_MP_ITER: type[Any] = _dl._MultiProcessingDataLoaderIter
#: How long torch's own error about a dead worker waits for the watcher's diagnosis of it.
_EXPLAIN_WAIT_S = 1.0
_TORCH_PIDS = re.compile(r"\(pid(?:\(s\))?\s+([0-9, ]+)\)")


class DataLoaderWorkerError(ProcessDiedError):
    """A DataLoader worker died while the loader still needed it (a ``RuntimeError``, as
    torch's own error about a dead worker is).

    ``diagnosis`` is healthkit's account of the death (``worker_id``, ``pid`` too); the
    message is its line followed by the loader's knobs. torch's own error, when it saw the
    death too, is the ``__cause__``.
    """

    def __init__(self, message: str, diagnosis: Diagnosis, worker_id: int) -> None:
        super().__init__(message, diagnosis)
        self.worker_id = worker_id
        self.pid = diagnosis.pid


class _Wake:
    """The marker put into a pin-memory loader's thread queue to wake a waiting ``next()``."""

    def __repr__(self) -> str:
        return "<healthkit_torch wake-up>"


_WAKE = _Wake()


def _knobs(loader: Any, it: Any) -> str:
    ctx = getattr(loader, "multiprocessing_context", None)
    if ctx is None:
        import multiprocessing

        start = multiprocessing.get_start_method(allow_none=True) or "default"
    else:
        start = ctx.get_start_method()
    pin = f"pin_memory={bool(getattr(loader, 'pin_memory', False))}"
    if getattr(loader, "pin_memory", False) and not it._pin_memory:
        pin += " (off: no accelerator)"
    return (
        f"DataLoader: num_workers={it._num_workers}, "
        f"prefetch_factor={it._prefetch_factor}, "
        f"persistent_workers={it._persistent_workers}, "
        f"batch_size={getattr(loader, 'batch_size', None)}, {pin}, "
        f"multiprocessing_context={start}"
    )


def _advice(d: Diagnosis) -> str:
    """What the loader's knobs have to do with it, by cause."""
    if d.cause in (Cause.OOM_KILLED, Cause.SIGKILL_UNCONFIRMED):
        return (
            "each worker holds its own copy of what the dataset touches plus up to "
            "prefetch_factor batches"
        )
    if d.cause is Cause.BUS_ERROR:
        return (
            "every batch crosses to the main process through /dev/shm, up to "
            "num_workers x prefetch_factor batches at once"
        )
    if d.cause is Cause.NATIVE_CRASH:
        return "the dataset's and collate_fn's native code runs in the worker"
    return ""


@attrs.define(eq=False)
class _Guard:
    """The watch over one iterator's workers, and its published failure."""

    knobs: str
    pids: dict[int, int]  # pid -> worker id
    iterator: weakref.ref[Any]
    data_queue: Any  # the pin-memory thread queue (torch's queue.Queue), else None
    wake_r: int
    wake_w: int
    watchdog: DisarmableWatchdog | None = None
    failure: DataLoaderWorkerError | None = None
    published: threading.Event = attrs.field(factory=threading.Event)
    closed: bool = False
    reported: bool = False
    lock: threading.Lock = attrs.field(factory=threading.Lock)
    #: torch's error about one of these workers, raised by its SIGCHLD handler while the
    #: watch was still being set up (see :func:`_attach`): the first ``next()`` raises it
    deferred: RuntimeError | None = None

    def error(self) -> DataLoaderWorkerError | None:
        """A fresh copy of the published failure (each raise gets its own traceback)."""
        f = self.failure
        if f is None:
            return None
        return DataLoaderWorkerError(str(f), f.diagnosis, f.worker_id)

    def on_failure(self, event: FailureEvent) -> None:
        """The watchdog's action, in its thread: diagnose, publish, wake the main thread."""
        if self.closed:
            return
        worker_id = self.pids.get(event.brief.pid or -1, -1)
        it = self.iterator()
        if it is None or getattr(it, "_shutdown", False):
            return
        status = getattr(it, "_workers_status", None)
        done_with_it = status is not None and 0 <= worker_id < len(status) and not status[
            worker_id
        ]
        del it  # never the last reference here: its __del__ would run in this thread
        if done_with_it and event.brief.signal is None:
            return  # torch had told it to stop (an exhausted IterableDataset replica)
        d = event.diagnosis
        advice = _advice(d)
        knobs = f"{self.knobs} ({advice})" if advice else self.knobs
        d = attrs.evolve(d, hint=". ".join(p for p in (d.hint, knobs) if p))
        self.failure = DataLoaderWorkerError(str(d), d, worker_id)
        self.published.set()
        logger.warning("%s; raised at the DataLoader's next batch", d)
        flush_logging(logger)
        self._wake()

    def _wake(self) -> None:
        with self.lock:
            if self.closed:
                return
            with contextlib.suppress(BlockingIOError):
                os.write(self.wake_w, b"\0")
            if self.data_queue is not None:
                self.data_queue.put(_WAKE)

    def raise_if_failed(self) -> None:
        err = self.error()
        if err is None and self.deferred is not None:
            torch_error, self.deferred = self.deferred, None
            err = self.explain(torch_error)  # waits a moment for the watcher's diagnosis
            if err is None:
                raise torch_error  # not one the watcher reports: torch's own, as torch raised it
            try:
                raise err from torch_error
            finally:
                del err, torch_error  # no reference cycle through this frame (see below)
        if err is not None:
            self._report(err)
            _raised(err)
            try:
                raise err
            finally:
                # No frame -> error -> traceback -> frame cycle: the iterator in that frame
                # must be freed by its reference count, not by the collector, which would
                # finalize torch's index queues (stopping their feeder threads) before the
                # iterator's __del__ tells the workers to stop: each would then wait out
                # torch's 5 s status check before it exits.
                del err

    def _report(self, err: DataLoaderWorkerError) -> None:
        """Under torchrun, the rank's error file carries the line (once per iterator)."""
        if self.reported or not os.environ.get("TORCHELASTIC_ERROR_FILE"):
            return
        self.reported = True
        with contextlib.suppress(Exception):
            write_torchelastic_error_file()(FailureEvent(err.diagnosis, "healthkit_torch"))

    def explain(
        self, torch_error: BaseException, *, any_death: bool = False
    ) -> DataLoaderWorkerError | None:
        """torch's own error about a dead worker, as healthkit's diagnosis (``None``: not
        about a worker this guard watches, or one the watchdog did not report).
        ``any_death``: the error names no pid (a connection reset by a dying worker)."""
        if self.closed:
            return None
        found = self.error()
        if found is None:
            pids = set() if any_death else _pids_in(str(torch_error))
            if not pids and not any_death:
                return None
            watches = self.watchdog.watches if self.watchdog is not None else []
            dead = [
                w for w in watches
                if (not pids or w.pid in pids) and not w.closed and w.poll() is not None
            ]
            if not dead and any_death:
                # A worker's connection resets while it exits, a moment before the kernel
                # makes it a zombie (what its pidfd tells): give the watcher that moment.
                self.published.wait(_EXPLAIN_WAIT_S)
                found = self.error()
            elif not dead:
                return None
            elif any(w.status is not None and w.status.returncode != 0 for w in dead):
                # The watcher saw the same exit; its diagnosis has the evidence.
                self.published.wait(_EXPLAIN_WAIT_S)
                found = self.error()
            else:
                found = self._clean_exit(dead[0])
        if found is not None:
            self._report(found)
            _raised(found)
        return found

    def _clean_exit(self, watch: ProcessWatch) -> DataLoaderWorkerError:
        """A worker that exited 0 while torch still counted on it (torch's 5 s check)."""
        d = _diagnoser().diagnose(watch)
        d = attrs.evolve(
            d,
            likely="it left while the DataLoader still expected batches from it (code in "
            "the dataset, collate_fn or worker_init_fn called sys.exit(0) or os._exit(0))",
            hint=self.knobs,
        )
        return DataLoaderWorkerError(str(d), d, self.pids.get(watch.pid, -1))

    def close(self) -> None:
        """Stop watching (torch is ending the workers) and release the pipe. Idempotent."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
        _GUARDS.discard(self)
        if self.watchdog is not None:
            self.watchdog.disarm()
        with self.lock:
            for fd in (self.wake_r, self.wake_w):
                with contextlib.suppress(OSError):
                    os.close(fd)


def _pids_in(message: str) -> set[int]:
    m = _TORCH_PIDS.search(message)
    if m is None:
        return set()
    return {int(p) for p in m.group(1).replace(" ", "").split(",") if p}


_GUARDS: weakref.WeakSet[_Guard] = weakref.WeakSet()
#: Workers whose death this process has raised as DataLoaderWorkerError (the newest few).
_RAISED: dict[int, None] = {}


def _raised(err: DataLoaderWorkerError) -> None:
    if err.pid is not None:
        _RAISED[err.pid] = None
        while len(_RAISED) > 1024:
            del _RAISED[next(iter(_RAISED))]
_diagnoser_lock = threading.Lock()
_shared: tuple[int, ExitDiagnoser] | None = None


def _diagnoser() -> ExitDiagnoser:
    """One diagnoser per process, built at the first watched iterator: the baseline of the
    cgroup's OOM counter is "this run", and each counted kill explains one death."""
    global _shared
    with _diagnoser_lock:
        if _shared is None or _shared[0] != os.getpid():
            _shared = (os.getpid(), ExitDiagnoser())
        return _shared[1]


# --------------------------------------------------------------------- the SIGCHLD chain
_chain_pid: int | None = None


def _install_sigchld_chain() -> None:
    """Run after torch's SIGCHLD handler: its error about a watched worker becomes ours.

    torch's handler raises from wherever the main thread is, also outside ``next()`` (while
    the training step computes), where the iterator cannot translate it. Ours calls torch's
    first, unchanged (its ``waitid(WNOWAIT)`` peek and its error), and only replaces the
    error it raised by healthkit's diagnosis of the same death, ``from`` it.
    """
    global _chain_pid
    if threading.current_thread() is not threading.main_thread():
        return
    if _chain_pid == os.getpid():
        return
    previous = signal.getsignal(signal.SIGCHLD)
    if not callable(previous):
        return  # torch's handler is not there (another thread set up the loader)
    owner = os.getpid()

    def chained(signum: int, frame: FrameType | None) -> None:
        try:
            previous(signum, frame)
        except RuntimeError as e:
            if isinstance(e, DataLoaderWorkerError) or os.getpid() != owner:
                raise
            pids = _pids_in(str(e))
            if pids and all(p in _RAISED for p in pids):
                # The same death, already raised by the iterator (its wake-up can come
                # before this signal is handled): torch's copy would surface a second time
                # wherever the main thread is next, e.g. inside the iterator's shutdown.
                return
            if pids and _defer_while_attaching(e, pids):
                return
            err = _explain_anywhere(e)
            if err is None:
                raise
            try:
                raise err from e
            finally:
                del err  # no reference cycle through this frame (see raise_if_failed)

    signal.signal(signal.SIGCHLD, chained)
    _chain_pid = owner


@attrs.define(eq=False)
class _Attaching:
    """The workers of an iterator whose watch is being set up, and torch's error about one
    of them that its SIGCHLD handler raised meanwhile."""

    pids: frozenset[int]
    deferred: RuntimeError | None = None


_ATTACHING: list[_Attaching] = []


def _defer_while_attaching(e: RuntimeError, pids: set[int]) -> bool:
    """Keep torch's error about a worker of an iterator being set up for its first
    ``next()``: raised here it would leave ``iter()``, from the middle of the watchdog's
    ``arm()``, as torch's bare error, with the watch half set up."""
    for pending in list(_ATTACHING):
        if pids <= pending.pids:
            pending.deferred = e
            return True
    return False


def _explain_anywhere(e: BaseException) -> DataLoaderWorkerError | None:
    for guard in list(_GUARDS):
        err = guard.explain(e)
        if err is not None:
            return err
    return None


# --------------------------------------------------------------------- the iterator
class _WatchedIterMixin:
    """Overrides of torch's multi-process iterator; mixed into its (sub)class at run time."""

    _hk_guard: _Guard
    _data_queue: Any
    _worker_result_queue: Any
    _pin_memory: bool

    def _next_data(self) -> Any:
        self._hk_guard.raise_if_failed()
        try:
            return super()._next_data()  # type: ignore[misc]
        except (RuntimeError, OSError, EOFError) as e:
            # RuntimeError: torch's own report of a dead worker (SIGCHLD handler, 5 s check).
            # OSError/EOFError: the main process was receiving a batch from the worker as it
            # died (its fd-passing connection reset), which torch lets through as is.
            if isinstance(e, DataLoaderWorkerError):
                raise
            err = self._hk_guard.explain(e, any_death=not isinstance(e, RuntimeError))
            if err is None:
                raise
            try:
                raise err from e
            finally:
                del err  # no reference cycle through this frame (see raise_if_failed)

    def _try_get_data(self, timeout: float = _torch_utils.MP_STATUS_CHECK_INTERVAL) -> Any:
        guard = self._hk_guard
        guard.raise_if_failed()
        if self._pin_memory:
            # The main thread blocks on a thread queue: the watcher puts a marker in it.
            got = super()._try_get_data(timeout)  # type: ignore[misc]
            if got[0] and got[1] is _WAKE:
                guard.raise_if_failed()
                return (False, None)
            return got
        # The main thread blocks on the result queue's pipe: wait on it and on ours.
        deadline = time.monotonic() + timeout
        try:
            fd = self._data_queue._reader.fileno()
        except (AttributeError, OSError, ValueError):
            return super()._try_get_data(timeout)  # type: ignore[misc]
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        with contextlib.suppress(OSError):
            poller.register(guard.wake_r, select.POLLIN)
        poller.poll(max(0, int(timeout * 1000) + 1))
        guard.raise_if_failed()
        return super()._try_get_data(  # type: ignore[misc]
            max(0.0, deadline - time.monotonic())
        )

    def _mark_worker_as_unavailable(self, worker_id: int, shutdown: bool = False) -> None:
        # torch's check of its workers after a failed or timed-out read (and an exhausted
        # replica) reads the workers' done event here: with its lock held by a dead worker
        # that read would wait forever, in the main thread, before any error is raised.
        _release_done_event(self)
        super()._mark_worker_as_unavailable(worker_id, shutdown)  # type: ignore[misc]

    def _shutdown_workers(self) -> None:
        guard = getattr(self, "_hk_guard", None)
        if guard is not None:
            guard.close()  # torch ends the workers now: nothing of that is a failure
        # Else torch's shutdown is a no-op: already done, or the interpreter is exiting.
        runs = not getattr(self, "_shutdown", True) and _torch_utils.python_exit_status is False
        if runs and _release_done_event(self):
            _end_stranded_workers(self)
        super()._shutdown_workers()  # type: ignore[misc]
        if runs:
            # torch ends a worker that outlived its 5 s join (a spawn worker exiting on a
            # loaded machine) by terminate(); torch 2.3 never joins it after that: reap it
            # (it stayed a zombie, with its pipes open), and SIGKILL one that outlives its
            # SIGTERM. A worker torch joined is done with at once here.
            for w in getattr(self, "_workers", []):
                if w.exitcode is None:
                    w.join(_DONE_LOCK_WAIT_S)
                if w.exitcode is None:
                    w.kill()
                    w.join(_KILLED_JOIN_S)


# How long a shutdown waits for the workers' done event's lock before it takes the event as
# held by a dead worker: a live worker holds it for microseconds (an is_set() between batches).
_DONE_LOCK_WAIT_S = 1.0
#: How long a shutdown waits for a SIGKILLed worker to be gone (it runs no code of its own).
_KILLED_JOIN_S = 30.0


def _end_stranded_workers(it: Any) -> None:
    """With the done event replaced, no live worker can ever see it set (one that reads the
    old event waits for the dead worker's lock), and torch would wait out its 5 s join for
    each of them, one after the other, before it terminates them: terminate them now. Their
    pids leave torch's SIGCHLD handler first, as torch's own shutdown does before its
    terminate, so that their SIGTERM is not reported as a worker's death."""
    if getattr(it, "_worker_pids_set", False):
        torch._C._remove_worker_pids(id(it))
        it._worker_pids_set = False
    for w in getattr(it, "_workers", []):
        if w.is_alive():
            w.terminate()


def _release_done_event(it: Any) -> bool:
    """A worker killed while it held the lock of torch's ``_workers_done_event`` (each worker
    checks the event between batches) leaves that lock held for good, and torch's shutdown,
    whose first step is ``done_event.set()``, then blocks forever: at the loader's ``__del__``,
    after the error was raised (pytorch#21554's kind of deadlock). With a worker dead by a
    signal, test the lock; if nobody gives it back, give torch a fresh event to set: the
    workers never see it, and torch's bounded join then terminates them. True if so (also
    when an earlier call did: torch's check of its workers reads the event too, see
    ``_mark_worker_as_unavailable``)."""
    if getattr(it, "_hk_done_event_replaced", False):
        return True
    workers = getattr(it, "_workers", None) or []
    if not any((w.exitcode or 0) < 0 for w in workers):
        return False
    event = getattr(it, "_workers_done_event", None)
    lock = getattr(getattr(event, "_cond", None), "_lock", None)
    if lock is None:
        return False
    if lock.acquire(timeout=_DONE_LOCK_WAIT_S):
        lock.release()
        return False
    logger.warning(
        "a dead DataLoader worker held the lock of the workers' done event: ending the "
        "other workers without it (torch's join, then terminate)"
    )
    it._workers_done_event = threading.Event()
    it._hk_done_event_replaced = True
    return True


_iter_classes: dict[type[Any], type[Any]] = {}


def _watched_iter_class(cls: type[Any]) -> type[Any]:
    watched = _iter_classes.get(cls)
    if watched is None:
        watched = type(cls.__name__, (_WatchedIterMixin, cls), {"__module__": cls.__module__})
        _iter_classes[cls] = watched
    return watched


def _attach(it: Any, loader: Any) -> Any:
    """Watch the workers of an iterator torch has just built (they are running)."""
    if not isinstance(it, _MP_ITER) or isinstance(it, _WatchedIterMixin):
        return it  # single-process, or watched already (a loader wrapped twice)
    # The workers run already, and the watch below takes a while to set up (arm() starts a
    # small process, slow to start on a loaded machine). A fork worker that dies meanwhile
    # (on its first item) makes torch's SIGCHLD handler raise wherever the main thread is:
    # here, out of iter(), as torch's bare error. The handler chained after torch's, in
    # place first, keeps that error for the first next() (see _defer_while_attaching).
    pending = _Attaching(frozenset(wk.pid for wk in it._workers))
    _ATTACHING.append(pending)
    guard: _Guard | None = None
    try:
        _install_sigchld_chain()
        r, w = os.pipe()
        os.set_blocking(r, False)
        os.set_blocking(w, False)
        guard = _Guard(
            knobs=_knobs(loader, it),
            pids={wk.pid: i for i, wk in enumerate(it._workers)},
            iterator=weakref.ref(it),
            data_queue=it._data_queue if it._pin_memory else None,
            wake_r=r,
            wake_w=w,
        )
        wd = DisarmableWatchdog(
            actions=[guard.on_failure],
            name="healthkit_torch",
            diagnoser=_diagnoser(),
            on_clean_exit="ignore",
        )
        for i, worker in enumerate(it._workers):
            wd.watch(worker, name=f"DataLoader worker {i}")
        guard.watchdog = wd
        it.__class__ = _watched_iter_class(type(it))
        it._hk_guard = guard
        _GUARDS.add(guard)
        wd.arm()
    except BaseException:
        if guard is not None:
            guard.close()
        raise
    finally:
        _ATTACHING.remove(pending)
    # From here on the watch runs: torch's error about a worker is explained where raised.
    guard.deferred = pending.deferred
    return it


# --------------------------------------------------------------------- the ways to adopt
def _get_iterator(self: Any) -> Any:
    return _attach(_ORIGINAL_GET_ITERATOR(self), self)


_ORIGINAL_GET_ITERATOR: Callable[[Any], Any] = torch.utils.data.DataLoader._get_iterator
_loader_classes: dict[type[Any], type[Any]] = {}

L = TypeVar("L", bound=torch.utils.data.DataLoader)  # type: ignore[type-arg]


def _watched_loader_class(cls: type[Any]) -> type[Any]:
    watched = _loader_classes.get(cls)
    if watched is None:

        def _get_iter(self: Any) -> Any:
            return _attach(super(watched, self)._get_iterator(), self)  # type: ignore[arg-type]

        watched = type(
            cls.__name__,
            (cls,),
            {"_get_iterator": _get_iter, "__module__": cls.__module__, "_healthkit_watched": True},
        )
        _loader_classes[cls] = watched
    return watched


def watch(loader: L) -> L:
    """Watch the workers of ``loader`` (a ``torch.utils.data.DataLoader``); returns it.

    ``loader = healthkit_torch.watch(DataLoader(...))``, or on a loader another library
    made. Every multi-process iterator it makes from now on (each epoch's, or the one
    persistent iterator) has its workers watched for their whole life; a worker that dies
    while the loader needs it makes the waiting or next ``next()`` raise
    :class:`DataLoaderWorkerError`. Idempotent: a loader watched twice reports once. An
    iterator already made keeps running unwatched (its workers started before).
    """
    if not isinstance(loader, torch.utils.data.DataLoader):
        from healthkit import InvalidArgumentTypeError

        raise InvalidArgumentTypeError(
            f"loader must be a torch.utils.data.DataLoader, got {loader!r} "
            f"({type(loader).__name__})",
            "loader",
        )
    if not getattr(type(loader), "_healthkit_watched", False):
        loader.__class__ = _watched_loader_class(type(loader))
    return loader


class DataLoader(torch.utils.data.DataLoader):  # type: ignore[type-arg]
    """``torch.utils.data.DataLoader`` with its workers watched: a drop-in replacement
    (same arguments). See :func:`watch`."""

    _healthkit_watched = True

    def _get_iterator(self) -> Any:
        return _attach(super()._get_iterator(), self)


_watch_all_lock = threading.Lock()
_watch_all_depth = 0


def watching_all(enabled: bool = True) -> contextlib.AbstractContextManager[None]:
    """Watch the workers of every DataLoader iterated inside the block, also those made
    inside other libraries (a trainer's own loaders), by patching
    ``torch.utils.data.DataLoader._get_iterator`` for the block's duration (nestable).
    ``enabled=False`` makes it a no-op, for code that decides by a flag."""
    check_bool(enabled, "enabled")
    return _watching_all(enabled)


@contextlib.contextmanager
def _watching_all(enabled: bool) -> Iterator[None]:
    global _watch_all_depth
    if not enabled:
        yield
        return
    base = torch.utils.data.DataLoader
    with _watch_all_lock:
        if _watch_all_depth == 0:
            base._get_iterator = _get_iterator  # type: ignore[method-assign]
        _watch_all_depth += 1
    try:
        yield
    finally:
        with _watch_all_lock:
            _watch_all_depth -= 1
            if _watch_all_depth == 0:
                base._get_iterator = _ORIGINAL_GET_ITERATOR  # type: ignore[method-assign, assignment]
