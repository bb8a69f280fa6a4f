"""DisarmableWatchdog: fail the job in milliseconds when a helper dies, never on a clean
teardown.

Shutdown ordering (the false-positive path). At normal interpreter exit CPython runs, in
order: (1) callbacks registered with ``threading._register_atexit`` (while joining
non-daemon threads), (2) ``atexit`` hooks, LIFO, among them ``multiprocessing.util``'s
``_exit_function`` which SIGTERMs daemon children. ``log_to_stderr()`` re-registers that
hook, so ordering by ``atexit`` registration alone breaks if a user calls it after arming.
Disarming from step (1) is before every ``atexit`` hook, whatever was registered when.
The hook is installed lazily on the first ``arm()``, not at import.
"""

from __future__ import annotations

import enum
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Iterable, Sequence
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Literal

import attrs

from healthkit._actions import Action, FailureEvent, default_actions, flush_logging
from healthkit._diagnosis import Diagnosis, ExitDiagnoser
from healthkit._errors import (
    InterpreterShutdownError,
    InvalidArgumentTypeError,
    check_exit_code,
    check_pid,
    check_timeout,
)
from healthkit._watch import ExitStatus, ProcessWatch, WatchSet

if TYPE_CHECKING:
    from healthkit._sidecar import SidecarLink

__all__ = ["DisarmableWatchdog", "Verdict", "decide"]

logger = logging.getLogger("healthkit")

Target = ProcessWatch | BaseProcess | subprocess.Popen[bytes] | subprocess.Popen[str] | int
CleanExitPolicy = Literal["fail", "warn"]


class Verdict(enum.Enum):
    """What the watchdog does about one observation."""

    KEEP_WATCHING = "keep watching"  # still running
    IGNORE = "ignore"  # disarmed, or an exit that is allowed
    WARN = "warn"  # early clean exit under the "warn" policy
    FIRE = "fire"  # run the actions


def decide(
    status: ExitStatus | None,
    *,
    armed: bool,
    run_until_disarmed: bool,
    clean_exit_policy: CleanExitPolicy = "fail",
) -> Verdict:
    """The whole firing decision, as a pure function (tested branch by branch).

    - alive: keep watching;
    - any exit after disarm: ignore (teardown SIGTERMs are not crashes);
    - non-zero or signal exit while armed: fire;
    - exit 0 while armed: fine for a process allowed to finish; for one declared to run
      until disarmed, an early return leaves its clients waiting, so fire (or warn).
    """
    if status is None:
        return Verdict.KEEP_WATCHING
    if not armed:
        return Verdict.IGNORE
    if status.returncode != 0:
        return Verdict.FIRE
    if not run_until_disarmed:
        return Verdict.IGNORE
    return Verdict.FIRE if clean_exit_policy == "fail" else Verdict.WARN


@attrs.define(eq=False)
class _Entry:
    watch: ProcessWatch
    run_until_disarmed: bool
    owned: bool  # we built the ProcessWatch, so we close it


# Strong references on purpose: an armed watchdog must outlive its last user reference
# (``DisarmableWatchdog([p]).arm()`` is a valid way to use it) until it is disarmed.
_ARMED: set[DisarmableWatchdog] = set()
_hooks_installed = False
_hooks_lock = threading.Lock()


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
            register(_disarm_all_at_shutdown)
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
    sidecar logs, writes the torchelastic error file and then kills the stuck owner so the
    launcher tears the job down; it runs no Python callbacks of the owner.
    """

    def __init__(
        self,
        watches: Iterable[Target] = (),
        *,
        actions: Sequence[Action] | None = None,
        mode: Literal["thread", "sidecar"] = "thread",
        name: str = "healthkit watchdog",
        diagnoser: ExitDiagnoser | None = None,
        clean_exit_policy: CleanExitPolicy = "fail",
        exit_code: int = 1,
        kill_grace: float = 2.0,
        rss_sample_interval: float | None = None,
    ) -> None:
        if mode not in ("thread", "sidecar"):
            raise ValueError(f"mode must be 'thread' or 'sidecar', got {mode!r}")
        if clean_exit_policy not in ("fail", "warn"):
            raise ValueError(
                f"clean_exit_policy must be 'fail' or 'warn', got {clean_exit_policy!r}"
            )
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
        self.clean_exit_policy: CleanExitPolicy = clean_exit_policy
        self.exit_code = check_exit_code(exit_code, "exit_code")
        grace = check_timeout(kill_grace, "kill_grace", allow_none=False)
        assert grace is not None
        self.kill_grace: float = grace
        # A floor, so that a tiny interval cannot turn the watcher into a busy loop.
        self.rss_sample_interval = check_timeout(
            rss_sample_interval, "rss_sample_interval", minimum=0.01
        )
        self.actions: list[Action] = list(actions) if actions is not None else default_actions(
            exit_code
        )
        self._diagnoser = diagnoser
        self._owns_diagnoser = False
        self._lock = threading.RLock()
        self._entries: list[_Entry] = []
        self._armed = False
        self._inert = False
        self._fired: Diagnosis | None = None
        self._actions_done = threading.Event()
        self._owner_pid = os.getpid()
        self._thread: threading.Thread | None = None
        self._set: WatchSet | None = None
        self._sidecar: SidecarLink | None = None
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
        return [e.watch for e in self._entries]

    def watch(
        self, target: Target, *, name: str | None = None, run_until_disarmed: bool = True
    ) -> ProcessWatch:
        """Add a process. ``run_until_disarmed`` means even an exit 0 before disarm is a
        failure (a server that returns early hangs its clients) under the default policy.
        Watching the same process twice returns the existing watch."""
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
            for e in self._entries:
                if e.watch.pid == pid and e.watch.status is None:
                    return e.watch
            owned = not isinstance(target, ProcessWatch)
            watch = target if isinstance(target, ProcessWatch) else ProcessWatch(target, name=name)
            entry = _Entry(watch, run_until_disarmed, owned)
            self._entries.append(entry)
            if self._armed and not self._inert:
                if self._set is not None:
                    self._set.add(watch)
                if self._sidecar is not None:
                    self._sidecar.watch(entry)
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
            for action in self.actions:
                prepare = getattr(action, "prepare", None)
                if prepare is not None:
                    prepare()
            self._armed = True
            _ARMED.add(self)
            if self.mode == "thread":
                self._set = WatchSet(e.watch for e in self._entries)
                self._thread = threading.Thread(
                    target=self._run, name=f"{self.name} (thread)", daemon=True
                )
                self._thread.start()
            else:
                from healthkit._sidecar import SidecarLink

                self._sidecar = SidecarLink(self)
                for e in self._entries:
                    self._sidecar.watch(e)
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
        for e in self._entries:
            if e.owned:
                e.watch.close()
        self._entries = [e for e in self._entries if not e.owned]
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
            e for e in list(self._entries)
            if decide(e.watch.peek(), armed=True, run_until_disarmed=e.run_until_disarmed,
                      clean_exit_policy=self.clean_exit_policy) is Verdict.FIRE
        ]  # fmt: skip
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
                for e in list(self._entries):
                    e.watch.sample_rss()
            for watch in ended:
                watch_set.remove(watch)
                self._observe(watch)

    def _entry_for(self, watch: ProcessWatch) -> _Entry | None:
        for e in self._entries:
            if e.watch is watch:
                return e
        return None

    def _observe(self, watch: ProcessWatch) -> None:
        entry = self._entry_for(watch)
        if entry is None:
            return
        with self._lock:
            verdict = decide(
                watch.poll(),
                armed=self._armed,
                run_until_disarmed=entry.run_until_disarmed,
                clean_exit_policy=self.clean_exit_policy,
            )
            if verdict in (Verdict.IGNORE, Verdict.KEEP_WATCHING):
                return
            assert self._diagnoser is not None
            diagnosis = self._diagnoser.diagnose(watch)
            if verdict is Verdict.WARN:
                logger.warning(
                    "%s: %s, although it was declared to run until disarmed",
                    self.name,
                    diagnosis,
                )
                return
            if self._fired is not None:
                return  # only the first failure fires
            diagnosis = _early_exit_wording(diagnosis, entry)
            self._fired = diagnosis
        self._run_actions(FailureEvent(diagnosis, self.name))

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
        finally:
            self._actions_done.set()


def _early_exit_wording(diagnosis: Diagnosis, entry: _Entry) -> Diagnosis:
    if diagnosis.exit_code == 0 and entry.run_until_disarmed:
        return attrs.evolve(
            diagnosis,
            what="exited with code 0 while it was expected to run until disarmed",
            likely="it returned early, so whoever depends on it will wait forever",
            hint="Check its log for why it stopped; if finishing is normal for it, watch it "
            "with run_until_disarmed=False",
        )
    return diagnosis

