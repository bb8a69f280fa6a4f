"""BoundedBarrier: a parent + N workers rendezvous that always ends, fails at the first death,
and says where every party is.

Why not ``Barrier.wait(timeout)``: a party SIGKILLed while holding the barrier's internal
lock (or while counted as a sleeper of its condition) wedges every later ``wait`` and
``abort`` *before* their timeout starts counting. So no barrier call here ever runs on the
caller's thread: the parent's own ``wait()`` runs in a daemon thread that reports through a
pipe, and the caller blocks on that pipe, the workers' pidfds and the deadline at once.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from typing import Any, Literal

import attrs

from healthkit import _jobnotice
from healthkit._diagnose.diagnosis import Diagnosis, ExitDiagnoser
from healthkit._diagnose.stacks import dump_stacks, enable_stack_dumps
from healthkit._errors import (
    HealthkitError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    NoSuchProcessError,
    UsageError,
    check_bound,
    check_callable,
    check_timeout,
)
from healthkit._os.proc import read_proc_stat
from healthkit._watch.process import ProcessWatch, WatchSet

__all__ = ["BarrierBrokenError", "BarrierTimeoutError", "BoundedBarrier", "PartyReport"]

PartyState = Literal["arrived", "dead", "not arrived"]
_ARRIVED, _PASSED = 1, 2  # per-worker flags in shared memory, written by the worker
_WORKER_MARGIN_S = 30.0  # a worker waits this much past the bound, so the parent reports first


@attrs.frozen
class PartyReport:
    """One worker's state when the barrier failed."""

    rank: int
    name: str
    pid: int | None
    state: PartyState
    arrived: bool
    diagnosis: Diagnosis | None = None
    stack: str | None = None


class BarrierBrokenError(HealthkitError, RuntimeError):
    """The rendezvous failed. Catch this for every failure of a :class:`BoundedBarrier`.

    Raised as is when a party died (or the barrier was broken by a party); raised as its
    subclass :class:`BarrierTimeoutError` when the bound expired with every party alive.
    """

    def __init__(
        self,
        message: str,
        *,
        barrier_name: str,
        elapsed: float,
        bound: float | None,
        parties: tuple[PartyReport, ...] = (),
    ) -> None:
        super().__init__(message)
        self.barrier_name = barrier_name
        self.elapsed = elapsed
        self.bound = bound
        self.parties = parties

    @property
    def dead(self) -> tuple[PartyReport, ...]:
        return tuple(p for p in self.parties if p.state == "dead")

    @property
    def not_arrived(self) -> tuple[PartyReport, ...]:
        return tuple(p for p in self.parties if p.state == "not arrived")

    @property
    def exit_codes(self) -> dict[int, int | None]:
        """``rank -> exitcode`` of the dead workers (GiGL's format)."""
        return {p.rank: p.diagnosis.exit_code if p.diagnosis else None for p in self.dead}


class BarrierTimeoutError(BarrierBrokenError, TimeoutError):
    """The bound expired and no party had died: at least one is stuck (see its stack)."""


@attrs.frozen
class _Outcome:
    kind: Literal["passed", "broken", "died", "deadline", "parent died"]
    error: BaseException | None = None


def _race(
    call: Callable[[], object],
    watches: Sequence[ProcessWatch],
    deadline: float | None,
    thread_name: str,
    settle: Callable[[ProcessWatch], float] | None = None,
) -> tuple[_Outcome, threading.Thread]:
    """Run ``call`` in a daemon thread; return when it ends, a watch ends, or the deadline.

    ``settle(watch)`` says how long a death may still be followed by ``call`` succeeding
    (a worker that passed the barrier may exit before our thread is scheduled): ``0`` fails
    at once, ``inf`` ignores that death. The thread may stay blocked (that is the point);
    the caller decides what to do with it.
    """
    result: list[BaseException | None] = []
    waits = WatchSet(watches)

    def run() -> None:
        try:
            call()
            result.append(None)
        except BaseException as e:
            # Kept without its traceback: its frames (this one among them) hold ``result``,
            # so it would keep itself, the barrier and its semaphores alive in a reference
            # cycle until the cyclic GC ran. The error's type and message are what is used.
            result.append(e.with_traceback(None))
        finally:
            waits.wake()  # safe after close(): the thread may outlive this race

    def finished() -> _Outcome:
        err = result[0]
        return _Outcome("passed") if err is None else _Outcome("broken", err)

    def left() -> float | None:
        return None if deadline is None else deadline - time.monotonic()

    thread = threading.Thread(target=run, name=thread_name, daemon=True)
    with waits:
        thread.start()
        while True:
            remaining = left()
            if result:
                return finished(), thread
            if remaining is not None and remaining <= 0:
                return _Outcome("deadline"), thread
            ended = waits.wait(remaining)
            if result:
                return finished(), thread
            grace, failing = 0.0, False
            for watch in ended:
                wait = settle(watch) if settle is not None else 0.0
                waits.remove(watch)  # seen: a later wait() must not return it again
                if wait != float("inf"):
                    grace, failing = max(grace, wait), True
            if failing:
                settled_by = time.monotonic() + grace
                while not result and (rest := settled_by - time.monotonic()) > 0:
                    waits.wait(rest)  # the call's end wakes it; another death changes nothing
                return (finished() if result else _Outcome("died")), thread


class BoundedBarrier:
    """A rendezvous of ``parties`` worker processes and their parent that ends in bounded
    time, always. Create it in the parent, pass it to the workers (it pickles), then:

    - each worker calls :meth:`enable_stack_dumps` early and :meth:`worker_wait` at the
      rendezvous, inside ``try``/``finally`` so a broken barrier is an orderly exit;
    - the parent calls :meth:`wait` with the worker processes.
    """

    def __init__(
        self,
        parties: int,
        *,
        timeout: float,
        hint: str | None = None,
        ctx: BaseContext | None = None,
        name: str = "init barrier",
        worker_label: str = "worker",
        abort_grace: float = 1.0,
    ) -> None:
        if isinstance(parties, bool) or not isinstance(parties, int):
            raise InvalidArgumentTypeError(
                f"parties must be the number of worker processes (an int), got {parties!r}",
                "parties",
            )
        if not 1 <= parties <= 65536:
            raise InvalidArgumentError(
                f"parties must be the number of worker processes (1..65536), got {parties}"
                + (": with no worker there is nothing to wait for; skip the barrier"
                   if parties == 0 else ""),
                "parties",
            )
        # > 0: a bound of 0 fails before anyone can arrive.
        self.timeout: float = check_bound(timeout, "timeout")
        # The worker side waits the bound plus a margin; that sum must fit the OS wait too.
        check_bound(self.timeout + _WORKER_MARGIN_S, f"timeout + {_WORKER_MARGIN_S:g}s margin")
        if hint is not None and not isinstance(hint, str):
            raise InvalidArgumentTypeError(f"hint must be a str or None, got {hint!r}", "hint")
        self.abort_grace: float = check_timeout(abort_grace, "abort_grace", allow_none=False)  # type: ignore[assignment]
        if ctx is not None and not isinstance(ctx, BaseContext):
            raise InvalidArgumentTypeError(
                f"ctx must be a multiprocessing context (multiprocessing.get_context({ctx!r})"
                f" if you meant that start method), or None for spawn; got {ctx!r}",
                "ctx",
            )
        for what, text in (("name", name), ("worker_label", worker_label)):
            if not isinstance(text, str):
                raise InvalidArgumentTypeError(f"{what} must be a str, got {text!r}", what)
        ctx = ctx or multiprocessing.get_context("spawn")
        self.parties = parties
        self.name = name
        self.worker_label = worker_label
        #: What to change when the bound is too short for a healthy start-up (e.g. "raise
        #: $MY_RPC_INIT_TIMEOUT_SECONDS: this bound is 3 x it"); said once, in the advice.
        self.hint = hint
        self._barrier: Any = ctx.Barrier(parties + 1)
        self._arrived = ctx.RawArray("b", max(parties, 1))
        self._stack_dir = tempfile.mkdtemp(prefix="healthkit-stacks-")
        self._parent_pid = os.getpid()
        stat = read_proc_stat(self._parent_pid)
        self._parent_start_time = stat.start_time if stat else None
        self._owner = True
        # Built now, in the parent, so its OOM baselines predate any worker's death.
        self._diagnoser: ExitDiagnoser | None = ExitDiagnoser()

    # ------------------------------------------------------------------ pickling
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_owner"] = False
        state["_diagnoser"] = None  # parent-only (holds the kernel-log fd)
        return state

    @property
    def barrier(self) -> Any:
        """The wrapped ``multiprocessing`` barrier (``parties + 1`` parties)."""
        return self._barrier

    # ------------------------------------------------------------------ worker side
    def enable_stack_dumps(self) -> None:
        """Let the parent read this worker's stacks if it never arrives. Call it early."""
        enable_stack_dumps(self._stack_dir)

    def dump_stacks(self, pids: list[int], timeout: float = 2.0) -> dict[int, str | None]:
        """The stacks of workers that called :meth:`enable_stack_dumps`, at any time (a
        worker stuck after the barrier too); ``None`` for one that did not answer."""
        return dump_stacks(self._stack_dir, pids, timeout=timeout)

    def worker_wait(self, rank: int, timeout: float | None = None) -> None:
        """Wait at the barrier from worker ``rank``.

        Raises :class:`BarrierBrokenError` when the parent broke the barrier (a party died
        or the bound passed), when the parent died, or after ``timeout`` (default: the
        barrier's bound plus a margin, so the parent normally reports first). Run the
        worker's teardown in ``finally``.
        """
        if isinstance(rank, bool) or not isinstance(rank, int):
            raise InvalidArgumentTypeError(f"rank must be an int, got {rank!r}", "rank")
        if not 0 <= rank < self.parties:
            raise InvalidArgumentError(f"rank must be in [0, {self.parties}), got {rank}", "rank")
        bound = check_timeout(timeout, "timeout")
        bound = self.timeout + _WORKER_MARGIN_S if bound is None else bound
        self._arrived[rank] = _ARRIVED
        start = time.monotonic()
        watches: list[ProcessWatch] = []
        if self._parent_pid != os.getpid():  # else the parent is this process: alive
            try:
                parent = ProcessWatch(self._parent_pid, name="parent")
            except NoSuchProcessError:
                raise self._worker_error(rank, "its parent is gone", start) from None
            stat = read_proc_stat(self._parent_pid)
            if stat is None or stat.start_time != self._parent_start_time:
                parent.close()  # the pid now names another process
                raise self._worker_error(rank, "its parent is gone", start)
            watches.append(parent)
        try:
            outcome, _ = _race(
                self._barrier.wait, watches, start + bound, f"{self.name} (worker {rank})"
            )
        finally:
            for watch in watches:
                watch.close()
        if outcome.kind == "passed":
            self._arrived[rank] = _PASSED
            return
        reason = {
            "broken": "the barrier was broken (the parent gave up: another party died or "
            "the bound passed)",
            "died": "its parent died",
            "deadline": f"it waited {bound:g}s without the others arriving",
        }[outcome.kind]
        raise self._worker_error(rank, reason, start)

    def _worker_error(self, rank: int, reason: str, start: float) -> BarrierBrokenError:
        return BarrierBrokenError(
            f"{self.name}: {self.worker_label} {rank} stops waiting: {reason}",
            barrier_name=self.name,
            elapsed=time.monotonic() - start,
            bound=self.timeout,
        )

    # ------------------------------------------------------------------ parent side
    def wait(
        self,
        workers: Sequence[BaseProcess | ProcessWatch],
        *,
        on_failure: Callable[[BarrierBrokenError], None] | None = None,
        diagnoser: ExitDiagnoser | None = None,
    ) -> None:
        """Wait as the parent party until every worker arrived; else raise, in bounded time.

        On failure: diagnose first (dead workers' exit status, stacks of live workers that
        never arrived), then break the barrier so surviving workers stop waiting, then run
        ``on_failure`` (your teardown), then raise :class:`BarrierBrokenError` (or
        :class:`BarrierTimeoutError` if the bound expired with everyone alive).
        """
        if on_failure is not None:
            # Checked now: found out only when the barrier fails, its TypeError would
            # replace the BarrierBrokenError the caller needs.
            check_callable(on_failure, "on_failure")
        if diagnoser is not None and not isinstance(diagnoser, ExitDiagnoser):
            raise InvalidArgumentTypeError(
                f"diagnoser must be a healthkit.ExitDiagnoser or None, got {diagnoser!r}",
                "diagnoser",
            )
        if not self._owner or os.getpid() != self._parent_pid:
            raise UsageError(
                "BoundedBarrier.wait() is for the process that created it; a worker calls "
                "worker_wait(rank)"
            )
        if len(workers) != self.parties:
            raise InvalidArgumentError(
                f"expected {self.parties} workers, got {len(workers)}", "workers"
            )
        start = time.monotonic()
        owned = [not isinstance(w, ProcessWatch) for w in workers]
        watches = [
            w if isinstance(w, ProcessWatch) else ProcessWatch(w, name=f"{self.worker_label} {i}")
            for i, w in enumerate(workers)
        ]
        self._ranks = {id(w): i for i, w in enumerate(watches)}
        try:
            outcome, party_thread = _race(
                self._barrier.wait,
                watches,
                start + self.timeout,
                f"{self.name} (parent)",
                settle=self._settle,
            )
            if outcome.kind == "passed":
                party_thread.join()
                return
            elapsed = time.monotonic() - start
            error = self._diagnose(
                outcome, watches, elapsed, diagnoser or self._diagnoser or ExitDiagnoser()
            )
            # Under a launcher, the rest of the job learns why this rank stops (a no-op
            # unless a watchdog armed here started the job's notice).
            _jobnotice.publish_error(self.name, error)
            abort_thread = self._break_for_survivors()
            if on_failure is not None:
                on_failure(error)
            self._unstick([party_thread, abort_thread], watches)
            try:
                raise error
            finally:
                del error  # its traceback holds this frame: no cycle through this local
        finally:
            for watch, own in zip(watches, owned, strict=True):
                if own:
                    watch.close()

    def _settle(self, watch: ProcessWatch) -> float:
        """How long a worker's death may still precede the barrier passing (see _race)."""
        flag = self._arrived[self._ranks[id(watch)]]
        if flag == _PASSED:
            return float("inf")  # it went through: the barrier completed
        if flag == _ARRIVED:
            return self.abort_grace  # it may have passed just before marking it
        return 0.0

    def close(self) -> None:
        """Remove the stack-dump directory (the parent calls this when done)."""
        if self._owner:
            shutil.rmtree(self._stack_dir, ignore_errors=True)
            if self._diagnoser is not None:
                self._diagnoser.close()
                self._diagnoser = None

    def _diagnose(
        self,
        outcome: _Outcome,
        watches: Sequence[ProcessWatch],
        elapsed: float,
        diagnoser: ExitDiagnoser,
    ) -> BarrierBrokenError:
        stuck = [
            w.pid for rank, w in enumerate(watches)
            if not self._arrived[rank] and w.poll() is None
        ]  # fmt: skip
        stacks = dump_stacks(self._stack_dir, stuck)  # all at once: one short wait
        reports = []
        for rank, watch in enumerate(watches):
            arrived = bool(self._arrived[rank])
            status = watch.poll()
            if status is not None:
                reports.append(
                    PartyReport(rank, watch.name, watch.pid, "dead", arrived,
                                diagnoser.diagnose(watch))
                )
            elif arrived:
                reports.append(PartyReport(rank, watch.name, watch.pid, "arrived", True))
            else:
                reports.append(
                    PartyReport(rank, watch.name, watch.pid, "not arrived", False,
                                stack=stacks.get(watch.pid))
                )
        parties = tuple(reports)
        message = self._message(outcome, parties, elapsed)
        cls = (
            BarrierTimeoutError
            if outcome.kind == "deadline" and not any(p.state == "dead" for p in parties)
            else BarrierBrokenError
        )
        return cls(
            message,
            barrier_name=self.name,
            elapsed=elapsed,
            bound=self.timeout,
            parties=parties,
        )

    def _message(
        self, outcome: _Outcome, parties: tuple[PartyReport, ...], elapsed: float
    ) -> str:
        label = self.worker_label
        dead = [p for p in parties if p.state == "dead"]
        stuck = [p for p in parties if p.state == "not arrived"]
        arrived = [p.rank for p in parties if p.state == "arrived"]
        bound = f"{self.timeout:g}s"
        if dead:
            first = min(dead, key=lambda p: p.diagnosis.observed_at if p.diagnosis else 0)
            head = (
                f"{self.name} failed after {elapsed:.2f}s (bound {bound}): "
                f"{label} {first.rank} died before all {label}s arrived"
            )
        elif outcome.kind == "deadline":
            head = (
                f"{self.name} timed out after {elapsed:.2f}s (bound {bound}): "
                f"{len(stuck)} {label}(s) still running never arrived"
            )
        else:
            head = f"{self.name} was broken after {elapsed:.2f}s (bound {bound}): {outcome.error!r}"
        lines = [head]
        if dead:
            codes = {p.rank: p.diagnosis.exit_code if p.diagnosis else None for p in dead}
            lines.append(f"  dead {label}s (rank -> exitcode): {codes}")
            for p in dead:
                lines.append(f"  - {p.diagnosis}" + (" (after arriving)" if p.arrived else ""))
        if stuck:
            ranks = ", ".join(f"{p.rank} (pid {p.pid})" for p in stuck)
            lines.append(f"  still running, never arrived: {label} {ranks}; stacks below")
        if arrived:
            lines.append(f"  arrived: {label}s {arrived}")
        if dead:
            lines.append(f"What to do: fix what ended the dead {label} (see its diagnosis).")
        else:
            knob = self.hint or "raise the barrier's timeout"
            lines.append(
                f"What to do: the stacks below show where each {label} is stuck; if its "
                f"start-up is legitimately slower than this, {knob}."
            )
        for p in stuck:
            lines.append(f"--- stack of {p.name} (pid {p.pid}) ---")
            no_stack = "(no stack: it had not called enable_stack_dumps() yet, or did not answer)"
            lines.append((p.stack or no_stack).rstrip())
        return "\n".join(lines)

    def _break_for_survivors(self) -> threading.Thread:
        """``abort()`` the barrier so workers still waiting get BrokenBarrierError.

        Runs in a daemon thread bounded by ``abort_grace``: a dead party can leave the
        barrier's lock or its condition's counters such that ``abort()`` blocks too.
        """
        t = threading.Thread(target=self._abort_quietly, name=f"{self.name} (abort)", daemon=True)
        t.start()
        t.join(self.abort_grace)
        return t

    def _abort_quietly(self) -> None:
        try:
            self._barrier.abort()
        except Exception:
            pass

    def _unstick(self, threads: list[threading.Thread], watches: Sequence[ProcessWatch]) -> None:
        """Free our own threads still blocked on a barrier that a dead party wedged.

        Only once every worker is gone (normally after the teardown hook): with nobody
        else using the barrier, posting its semaphores cannot hurt anyone, and it lets our
        blocked threads finish instead of leaking. The barrier is unusable afterwards.
        """
        threads = [t for t in threads if t.is_alive()]
        if not threads or any(w.poll() is None for w in watches):
            return
        cond = self._barrier._cond
        sems = [cond._lock, cond._woken_count, cond._wait_semaphore]
        libc = ctypes.CDLL(None, use_errno=True)
        deadline = time.monotonic() + 10.0
        while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
            for sem in sems:  # whatever each thread is blocked on, let it through
                libc.sem_post(ctypes.c_void_p(sem._semlock.handle))
            for t in threads:
                t.join(0.02)

