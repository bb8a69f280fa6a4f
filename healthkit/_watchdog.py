"""DisarmableWatchdog: fail the job in milliseconds when a helper dies, never on a clean
teardown.

Shutdown ordering (the false-positive path). At normal interpreter exit CPython runs, in
order: (1) callbacks registered with ``threading._register_atexit``, (2) the join of every
non-daemon thread, (3) ``atexit`` hooks, LIFO, among them ``multiprocessing.util``'s
``_exit_function`` which SIGTERMs daemon children. ``log_to_stderr()`` re-registers that
hook, so ordering by ``atexit`` registration made at arm time breaks if a user calls it
after arming. So step (1) only registers the disarm as an ``atexit`` hook: registered then,
it is the newest hook and runs first in step (3), before any teardown of daemon children,
and the watchdog still watches while non-daemon threads finish in step (2) (a helper death
then would otherwise hang that join). The hook is installed lazily on the first ``arm()``.

Stops are not failures: see :mod:`healthkit._stopsignals` for how a signal sent to the
whole process group (torchrun, Ctrl-C) is told apart from a helper failure.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from multiprocessing.process import BaseProcess
from typing import Literal

import attrs

from healthkit import _stopsignals
from healthkit._actions import Action, FailureEvent, default_actions, flush_logging
from healthkit._decide import OnCleanExit, Verdict, check_on_clean_exit, decide, stop_like
from healthkit._diagnosis import Diagnosis, ExitDiagnoser, returned_early
from healthkit._errors import (
    InterpreterShutdownError,
    InvalidArgumentTypeError,
    check_exit_code,
    check_pid,
    check_timeout,
)
from healthkit._sidecar import SidecarLink
from healthkit._watch import ExitStatus, ProcessWatch, WatchSet

__all__ = ["DisarmableWatchdog", "Verdict", "decide"]

logger = logging.getLogger("healthkit")

Target = ProcessWatch | BaseProcess | subprocess.Popen[bytes] | subprocess.Popen[str] | int


@attrs.define(eq=False)
class _Entry:
    watch: ProcessWatch
    on_clean_exit: OnCleanExit
    owned: bool  # we built the ProcessWatch, so we close it


# Strong references on purpose: an armed watchdog must outlive its last user reference
# (``DisarmableWatchdog([p]).arm()`` is a valid way to use it) until it is disarmed.
_ARMED: set[DisarmableWatchdog] = set()
_hooks_installed = False
_hooks_lock = threading.Lock()


def _at_threading_shutdown() -> None:
    """Step (1) of interpreter exit: keep watching through the join of non-daemon threads,
    and disarm from the newest ``atexit`` hook, before multiprocessing's own."""
    import atexit

    try:
        atexit.register(_disarm_all_at_shutdown)
    except Exception:  # atexit already running: disarm now rather than never
        _disarm_all_at_shutdown()


def _disarm_all_at_shutdown() -> None:
    for wd in list(_ARMED):
        try:
            wd._report_death_before_shutdown()
            wd.disarm(reason="interpreter shutdown")
        except Exception:  # never turn a clean exit into a crash
            logger.debug("disarm at shutdown failed", exc_info=True)


def _after_fork_in_child() -> None:
    for wd in list(_ARMED):
        wd._become_inert()
    _ARMED.clear()


def _install_hooks() -> None:
    global _hooks_installed
    with _hooks_lock:
        if _hooks_installed:
            return
        register = getattr(threading, "_register_atexit", None)
        if register is not None:
            register(_at_threading_shutdown)
        else:  # pragma: no cover - CPython < 3.9
            import atexit

            atexit.register(_disarm_all_at_shutdown)
        os.register_at_fork(after_in_child=_after_fork_in_child)
        _hooks_installed = True


class DisarmableWatchdog:
    """Watch helper processes; on an abnormal exit run actions (default: log, error file,
    ``os._exit(1)``) unless disarmed first.

    ``mode="thread"`` watches from one daemon thread blocked on the processes' pidfds.
    ``mode="sidecar"`` watches from a small separate process, for owners whose main thread
    may sit in native code holding the GIL (a thread cannot run then; a process can). The
    sidecar logs, writes the torchelastic error file and then stops the stuck owner (SIGTERM,
    then SIGKILL after ``kill_grace``) so the launcher tears the job down; it runs no Python
    callbacks of the owner, so ``exit_code`` applies to thread mode only. A thread in the
    owner still tells the sidecar the exit statuses it learns and, if the sidecar dies,
    logs it at ERROR and takes over the watching.

    A helper that dies of a stop signal (SIGTERM, SIGINT, SIGHUP), or exits with any code,
    while in this process's group may be part of a stop sent to the whole group (torchrun,
    Ctrl-C): such a death fires only if this process has not been asked to stop within
    ``stop_grace`` seconds. SIGKILL and crash signals fire at once.
    """

    def __init__(
        self,
        watches: Iterable[Target] = (),
        *,
        actions: Sequence[Action] | None = None,
        mode: Literal["thread", "sidecar"] = "thread",
        name: str = "healthkit watchdog",
        diagnoser: ExitDiagnoser | None = None,
        on_clean_exit: OnCleanExit = "fail",
        exit_code: int = 1,
        kill_grace: float = 2.0,
        rss_sample_interval: float | None = None,
        stop_grace: float = 1.0,
    ) -> None:
        if mode not in ("thread", "sidecar"):
            raise ValueError(f"mode must be 'thread' or 'sidecar', got {mode!r}")
        if mode == "sidecar" and actions is not None:
            raise ValueError(
                "mode='sidecar' runs fixed actions in another process (log, error file, "
                "kill this process); use exit_code= to choose the code, or mode='thread' "
                "for custom actions"
            )
        if not isinstance(name, str):
            raise InvalidArgumentTypeError(f"name must be a str, got {name!r}", "name")
        self.name = name
        self.mode = mode
        self.on_clean_exit: OnCleanExit = check_on_clean_exit(on_clean_exit)
        self.exit_code = check_exit_code(exit_code, "exit_code")
        grace = check_timeout(kill_grace, "kill_grace", allow_none=False)
        assert grace is not None
        self.kill_grace: float = grace
        # A floor, so that a tiny interval cannot turn the watcher into a busy loop.
        self.rss_sample_interval = check_timeout(
            rss_sample_interval, "rss_sample_interval", minimum=0.01
        )
        stop = check_timeout(stop_grace, "stop_grace", allow_none=False)
        assert stop is not None
        self.stop_grace: float = stop
        self.actions: list[Action] = list(actions) if actions is not None else default_actions(
            exit_code
        )
        self._diagnoser = diagnoser
        self._owns_diagnoser = False
        self._lock = threading.RLock()
        self._entries: dict[int, _Entry] = {}  # id(watch) -> entry, in insertion order
        self._by_pid: dict[int, _Entry] = {}  # pid -> the entry of a still-running watch
        self._armed = False
        self._inert = False
        self._fired: Diagnosis | None = None
        self._actions_done = threading.Event()
        self._owner_pid = os.getpid()
        self._thread: threading.Thread | None = None
        self._set: WatchSet | None = None
        self._sidecar: SidecarLink | None = None
        self._sidecar_watch: ProcessWatch | None = None
        for target in watches:
            self.watch(target)

    # ------------------------------------------------------------------ public API
    @property
    def armed(self) -> bool:
        return self._armed

    @property
    def fired(self) -> Diagnosis | None:
        """The diagnosis that made the watchdog fire, if it did (only the first failure)."""
        return self._fired

    @property
    def sidecar_pid(self) -> int | None:
        """The pid of the sidecar watcher while armed in ``mode="sidecar"``."""
        return self._sidecar.pid if self._sidecar is not None else None

    @property
    def watches(self) -> list[ProcessWatch]:
        return [e.watch for e in self._entries.values()]

    @staticmethod
    def note_stop(signum: int = signal.SIGTERM) -> None:
        """Tell every watchdog of this process that it is being stopped.

        Needed only from a signal handler healthkit cannot observe: one installed in C, or
        an asyncio ``loop.add_signal_handler`` set up after ``arm()`` (it takes over the
        signal wakeup fd). Handlers installed with ``signal.signal`` need nothing.
        """
        _stopsignals.note_stop(signum)

    def watch(
        self,
        target: Target,
        *,
        name: str | None = None,
        on_clean_exit: OnCleanExit | None = None,
    ) -> ProcessWatch:
        """Add a process. ``on_clean_exit`` (default: the watchdog's) says what its exit 0
        while armed means: ``"fail"`` (it was meant to run until disarmed: a server that
        returns early hangs its clients), ``"warn"`` or ``"ignore"`` (finishing is normal).
        Watching the same process twice returns the existing watch."""
        rule = self.on_clean_exit if on_clean_exit is None else check_on_clean_exit(on_clean_exit)
        if isinstance(target, int):
            check_pid(target, "target")
        elif not isinstance(target, (ProcessWatch, BaseProcess, subprocess.Popen)):
            raise InvalidArgumentTypeError(
                "target must be a multiprocessing.Process, a subprocess.Popen, a "
                f"ProcessWatch or a pid (int), got {target!r} ({type(target).__name__})",
                "target",
            )
        with self._lock:
            pid = target.pid if not isinstance(target, int) else target
            known = self._by_pid.get(pid) if pid is not None else None
            if known is not None and known.watch.status is None:
                return known.watch
            owned = not isinstance(target, ProcessWatch)
            watch = target if isinstance(target, ProcessWatch) else ProcessWatch(target, name=name)
            entry = _Entry(watch, rule, owned)
            self._entries[id(watch)] = entry
            self._by_pid[watch.pid] = entry
            if self._armed and not self._inert:
                if self._sidecar is not None:
                    self._tell_sidecar(self._sidecar, entry)
                if self._set is not None:
                    self._set.add(watch)
            return watch

    def arm(self) -> DisarmableWatchdog:
        """Start watching. Idempotent: a second call starts nothing. Inert in a forked child.

        Raises :class:`InterpreterShutdownError` during interpreter shutdown (e.g. from an
        ``atexit`` hook): the hook that disarms it at exit has run by then.
        """
        if sys.is_finalizing() or getattr(threading, "_SHUTTING_DOWN", False):
            raise InterpreterShutdownError(
                f"{self.name}: arm() was called during interpreter shutdown; arm the "
                "watchdog before the program starts exiting (not from an atexit hook)"
            )
        with self._lock:
            if self._inert or os.getpid() != self._owner_pid:
                self._inert = True
                return self
            if self._armed:
                return self
            if self._diagnoser is None:
                self._diagnoser = ExitDiagnoser()  # baselines now: "during this run"
                self._owns_diagnoser = True
            _install_hooks()
            if not _stopsignals.install():
                logger.warning(
                    "%s armed outside the main thread before any watchdog was armed in it: "
                    "a stop signal sent to the whole process group (torchrun, Ctrl-C) cannot "
                    "be told apart from a helper failure. Arm one watchdog from the main "
                    "thread first",
                    self.name,
                )
            for action in self.actions:
                prepare = getattr(action, "prepare", None)
                if prepare is not None:
                    prepare()
            self._armed = True
            _ARMED.add(self)
            watch_set = WatchSet(e.watch for e in self._entries.values())
            stop_fd = _stopsignals.read_fd()
            if self.mode == "sidecar":
                link = SidecarLink(
                    name=self.name,
                    kill_grace=self.kill_grace,
                    stop_grace=self.stop_grace,
                    stop_fd=stop_fd,
                )
                self._sidecar = link
                for e in self._entries.values():
                    self._tell_sidecar(link, e)
                self._sidecar_watch = link.process_watch()
                watch_set.add(self._sidecar_watch)
            elif stop_fd is not None:
                # Keeps the stop pipe drained (and the stop recorded) as signals arrive.
                watch_set.add_fd(stop_fd, _stopsignals.drain)
            self._set = watch_set
            self._thread = threading.Thread(
                target=self._run, name=f"{self.name} (thread)", daemon=True
            )
            self._thread.start()
            return self

    def disarm(self, timeout: float | None = 5.0, *, reason: str = "disarm()") -> None:
        """Stop watching; from now on no exit fires. Idempotent; safe from an action.

        Also closes the watches this watchdog built itself (from a Process, Popen or pid);
        arming again afterwards watches only what is added after.
        """
        timeout = check_timeout(timeout, "timeout")
        with self._lock:
            if self._inert:
                return
            if not self._armed:
                self._release()
                return
            self._armed = False
            _ARMED.discard(self)
            thread, self._thread = self._thread, None
            watch_set, self._set = self._set, None
            sidecar, self._sidecar = self._sidecar, None
        logger.debug("%s disarmed (%s)", self.name, reason)
        if watch_set is not None:
            watch_set.wake()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        if watch_set is not None:
            watch_set.close()
        if sidecar is not None:
            sidecar.disarm(timeout)
        for action in self.actions:
            release = getattr(action, "release", None)
            if release is not None:
                release()
        with self._lock:
            self._release()

    def _release(self) -> None:
        """Close the watches and the diagnoser this watchdog built itself."""
        for e in self._entries.values():
            if e.owned:
                e.watch.close()
        self._entries = {k: e for k, e in self._entries.items() if not e.owned}
        self._by_pid = {e.watch.pid: e for e in self._entries.values()}
        if self._sidecar_watch is not None:
            self._sidecar_watch.close()
            self._sidecar_watch = None
        if self._owns_diagnoser and self._diagnoser is not None:
            self._diagnoser.close()
            self._diagnoser, self._owns_diagnoser = None, False

    def __enter__(self) -> DisarmableWatchdog:
        return self.arm()

    def __exit__(self, *exc: object) -> None:
        self.disarm(reason="context exit")

    def __repr__(self) -> str:
        state = "fired" if self._fired else "armed" if self._armed else "disarmed"
        return f"<DisarmableWatchdog {self.name!r} {self.mode} {state} watches={self.watches}>"

    # ------------------------------------------------------------------ internals
    def _report_death_before_shutdown(self) -> None:
        """At interpreter exit, before disarming: fire for a helper that already died.

        An exit that *follows* a helper's death is usually its consequence (the client
        call raised and ended the main thread) while the watcher had not run yet; disarming
        first would lose the diagnosis. Deaths that happen after this check (the SIGTERM of
        the teardown) still never fire.
        """
        if not self._armed or self._inert or os.getpid() != self._owner_pid:
            return
        pending = [
            e for e in list(self._entries.values())
            if self._verdict(e, e.watch.peek(), armed=True) is Verdict.FIRE
        ]  # fmt: skip
        if pending and all(_may_be_group_stop(e.watch) for e in pending):
            # This exit may itself be the stop that ended them (a handler that exits at
            # once): give the stop the same grace as the watcher would.
            _wait_for_stop(self.stop_grace)
            pending = [
                e for e in pending if self._verdict(e, e.watch.peek(), armed=True) is Verdict.FIRE
            ]
        if not pending:
            return
        if self._sidecar is not None:
            # The sidecar reads the zombie (peek() did not reap it) and stops this process;
            # give it the time it needs instead of telling it to stand down.
            self._sidecar.wait_for_action(self.kill_grace + 5.0)
            return
        self._observe(pending[0].watch)  # runs the actions here unless already fired
        self._actions_done.wait(5.0)  # the watcher thread may be running them right now

    def _become_inert(self) -> None:
        # In a forked child: the watcher thread does not exist here and the processes are
        # not ours. Never act; never touch the parent's sidecar or fds.
        self._inert = True
        self._armed = False
        self._thread = None
        self._set = None
        self._sidecar = None
        self._sidecar_watch = None

    def _tell_sidecar(self, link: SidecarLink, entry: _Entry) -> None:
        w = entry.watch
        ended = w.status if w.closed else w.peek()
        link.watch(
            pid=w.pid,
            name=w.name,
            on_clean_exit=entry.on_clean_exit,
            pgrp=w.pgrp,
            ended=ended is not None,
            returncode=ended.returncode if ended is not None else None,
        )

    def _run(self) -> None:
        watch_set = self._set
        assert watch_set is not None
        while True:
            try:
                ended = watch_set.wait(self.rss_sample_interval)
            except Exception:  # closed under us by disarm()
                return
            if not self._armed or os.getpid() != self._owner_pid:
                return
            if not ended and self.rss_sample_interval is not None:
                for e in list(self._entries.values()):
                    e.watch.sample_rss()
            for watch in ended:
                watch_set.remove(watch)
                if watch is self._sidecar_watch:
                    self._sidecar_died(watch, watch_set)
                    continue
                link = self._sidecar
                if link is not None:
                    # The sidecar decides; it may not be able to read the status itself
                    # (this process may have reaped the helper first), so tell it.
                    link.status(watch.pid, watch.poll())
                else:
                    self._observe(watch)

    def _sidecar_died(self, watch: ProcessWatch, watch_set: WatchSet) -> None:
        """The sidecar is gone while armed: say so loudly and watch from this thread."""
        with self._lock:
            link = self._sidecar
            if not self._armed or link is None:
                return
            self._sidecar = None
            if stop_fd := _stopsignals.read_fd():
                watch_set.add_fd(stop_fd, _stopsignals.drain)
            assert self._diagnoser is not None
            diagnosis = self._diagnoser.diagnose(watch, name="healthkit sidecar")
        logger.error(
            "%s: %s. Watching from a thread in this process from now on (it cannot act "
            "while this process's main thread holds the GIL)",
            self.name,
            diagnosis,
        )
        flush_logging(logger)
        link.close()
        for e in list(self._entries.values()):
            if e.watch.status is not None and not e.watch.closed:
                self._observe(e.watch)  # ended while the sidecar was deciding

    def _verdict(self, entry: _Entry, status: ExitStatus | None, *, armed: bool) -> Verdict:
        return decide(
            status,
            armed=armed,
            on_clean_exit=entry.on_clean_exit,
            owner_stopping=_stopsignals.stop_seen() is not None,
        )

    def _observe(self, watch: ProcessWatch) -> None:
        entry = self._entries.get(id(watch))
        if entry is None:
            return
        status = watch.poll()
        verdict = self._verdict(entry, status, armed=self._armed)
        if (
            verdict in (Verdict.FIRE, Verdict.WARN)
            and status is not None
            and _in_our_group(watch)
            and stop_like(status)
            and _wait_for_stop(self.stop_grace)
        ):
            verdict = self._verdict(entry, status, armed=self._armed)
        with self._lock:
            if verdict in (Verdict.IGNORE, Verdict.KEEP_WATCHING) or not self._armed:
                return
            diagnoser = self._diagnoser
            assert diagnoser is not None
            if verdict is Verdict.WARN:
                diagnosis = diagnoser.diagnose(watch)
                reason = (
                    "its exit status is unknown, so this is not acted on"
                    if diagnosis.exit_code is None
                    else "although it was declared to run until disarmed"
                )
                logger.warning("%s: %s; %s", self.name, diagnosis, reason)
                return
            if self._fired is not None:
                return  # only the first failure fires
            # Act first, explain right after: the actions start on the brief diagnosis (no
            # file read); the evidence is read when an action first needs it.
            brief = _early_exit_wording(diagnoser.diagnose(watch, evidence=False), entry)
            self._fired = brief

        def explain() -> Diagnosis:
            full = _early_exit_wording(diagnoser.diagnose(watch), entry)
            self._fired = full
            return full

        self._run_actions(FailureEvent(explain, self.name, brief=brief))

    def _run_actions(self, event: FailureEvent) -> None:
        try:
            for action in self.actions:
                try:
                    action(event)
                except Exception:
                    logger.exception(
                        "%s: action %r failed; running the next one", self.name, action
                    )
                    flush_logging()
            event.diagnosis  # noqa: B018 - the evidence, for `fired`, if no action read it
        finally:
            self._actions_done.set()


def _may_be_group_stop(watch: ProcessWatch) -> bool:
    status = watch.status or watch.peek()
    return status is not None and _in_our_group(watch) and stop_like(status)


def _in_our_group(watch: ProcessWatch) -> bool:
    """Whether ``watch``'s process receives this process's group signals (unknown: yes)."""
    return watch.pgrp is None or watch.pgrp == os.getpgrp()


def _wait_for_stop(grace: float) -> bool:
    """Wait up to ``grace`` seconds for this process to be asked to stop; True if it was.

    The stop pipe is written by the kernel-driven C signal handler the moment the signal is
    delivered, normally before the helper's death is even seen; the grace covers a loaded
    machine. Runs only for stop-like deaths of helpers in our own process group.
    """
    deadline = time.monotonic() + grace
    fd = _stopsignals.read_fd()
    with WatchSet() as waits:
        if fd is not None:
            waits.add_fd(fd, waits.wake)  # stop_seen() drains the pipe
        while _stopsignals.stop_seen() is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            # Capped: a stop learned from a sidecar's message (a stop source) wakes nothing.
            waits.wait(min(remaining, 0.05 if fd is not None else 0.01))
    return True


def _early_exit_wording(diagnosis: Diagnosis, entry: _Entry) -> Diagnosis:
    if diagnosis.exit_code == 0 and entry.on_clean_exit != "ignore":
        return returned_early(diagnosis)
    return diagnosis
