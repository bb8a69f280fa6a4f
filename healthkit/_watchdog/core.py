"""DisarmableWatchdog: fail the job in milliseconds when a helper dies, never on a clean
teardown.

Shutdown ordering (the false-positive path): the watchdogs keep watching while the
interpreter joins non-daemon threads, and are disarmed by the first ``atexit`` hook, before
multiprocessing's teardown of daemon children; :mod:`healthkit._runtime` owns that sequence
(and the fork hook that leaves a forked child's inherited watchdogs inert). Installed lazily
on the first ``arm()``.

Where a death is judged is the host's (:mod:`healthkit._watchdog.host`): this module keeps
the records, ``arm()``/``disarm()``, the watcher thread's loop and the actions, and delegates
to a :class:`~healthkit._watchdog.thread_host.ThreadHost` or a
:class:`~healthkit._watchdog.sidecar_host.SidecarHost`, picked once by ``mode=``.

Stops are not failures: :mod:`healthkit._watch.stopsignals` records when this process is asked to
stop, and the firing rule (:func:`healthkit._decide.decide`, applied by
:class:`healthkit._judge.Judge`) judges each death against the stop episode under way.
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

from healthkit import _jobnotice, _runtime
from healthkit._actions import (
    Action,
    FailureEvent,
    default_actions,
    flush_logging,
    interactive_shell,
    log_diagnosis,
    raise_in_cell,
    write_torchelastic_error_file,
)
from healthkit._decide import (
    DEFAULT_STOP_GRACE_S,
    Decision,
    OnCleanExit,
    check_on_clean_exit,
)
from healthkit._diagnose.diagnosis import Diagnosis, ExitDiagnoser, interrupted_wording
from healthkit._errors import (
    InterpreterShutdownError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    WatchClosedError,
    check_exit_code,
    check_pid,
    check_timeout,
)
from healthkit._judge import Judge, Watched, early_exit_wording, survived_stop_wording
from healthkit._progress import ProgressWatch, Tracker, stall_diagnosis
from healthkit._watch import stopsignals as _stopsignals
from healthkit._watch.process import ExitStatus, ProcessWatch, WatchSet
from healthkit._watch.stop import stopped_by_healthkit
from healthkit._watchdog.host import Host
from healthkit._watchdog.sidecar_host import SidecarHost
from healthkit._watchdog.thread_host import (
    ThreadHost,
    forget_shared_witness,
    shared_witness_pids,
)

__all__ = ["DEFAULT_STOP_GRACE_S", "DisarmableWatchdog", "note_stop_survived"]

logger = logging.getLogger("healthkit")

Target = ProcessWatch | BaseProcess | subprocess.Popen[bytes] | subprocess.Popen[str] | int



_INTERRUPT = frozenset({signal.SIGINT})
#: A helper's death this soon after an interrupt of an interactive shell is named as its
#: likely share of it (a KeyboardInterrupt ends a helper within moments).
_INTERRUPT_NEAR_S = 5.0


# Strong references on purpose: an armed watchdog must outlive its last user reference
# (``DisarmableWatchdog([p]).arm()`` is a valid way to use it) until it is disarmed.
_ARMED: set[DisarmableWatchdog] = set()


_AT_SHUTDOWN = "interpreter shutdown"


def _disarm_all_at_shutdown() -> None:
    for wd in list(_ARMED):
        try:
            wd._report_death_before_shutdown()
            wd.disarm(reason=_AT_SHUTDOWN)
        except Exception:  # never turn a clean exit into a crash
            logger.debug("disarm at shutdown failed", exc_info=True)


def _after_fork_in_child() -> None:
    for wd in list(_ARMED):
        wd._become_inert()
    _ARMED.clear()
    forget_shared_witness()


#: The hosts, by ``mode=``.
HOSTS: dict[str, type[Host]] = {host.mode: host for host in (ThreadHost, SidecarHost)}


def _install_hooks() -> None:
    """Disarm every armed watchdog first at ``atexit`` (keep watching through the join of
    non-daemon threads, disarm before multiprocessing's teardown of daemon children), and
    leave the parent's watchdogs inert in a forked child (see :mod:`healthkit._runtime`)."""
    _runtime.at_exit("atexit", "disarm the armed watchdogs", _disarm_all_at_shutdown)
    _runtime.at_fork_in_child("the parent's armed watchdogs go inert", _after_fork_in_child)


def _check_target(target: object, what: str) -> None:
    if isinstance(target, int) and not isinstance(target, bool):
        check_pid(target, what)
    elif not isinstance(target, (ProcessWatch, BaseProcess, subprocess.Popen)):
        raise InvalidArgumentTypeError(
            f"{what} must be a multiprocessing.Process, a subprocess.Popen, a "
            f"ProcessWatch or a pid (int), got {target!r} ({type(target).__name__})",
            what,
        )


class DisarmableWatchdog:
    """Watch helper processes; on an abnormal exit run actions (default: log, error file,
    ``os._exit(1)``) unless disarmed first.

    ``mode="thread"`` watches from one daemon thread blocked on the processes' pidfds.
    ``mode="sidecar"`` watches from a small separate process, for owners whose main thread
    may sit in native code holding the GIL (a thread cannot run then; a process can). The
    sidecar logs, writes the torchelastic error file and then stops the stuck owner (SIGTERM,
    then SIGKILL after ``kill_after`` seconds) so the launcher tears the job down; it runs no
    Python callbacks of the owner, so ``exit_code`` applies to thread mode only. A thread in
    the owner still tells the sidecar the exit statuses it learns and, if the sidecar dies,
    logs it at ERROR and takes over the watching.

    Stops are not failures, and not a state either: a stop-like death (SIGTERM, SIGINT,
    SIGHUP, any exit code) while this process is being stopped (a stop signal pending or
    received less than ``stop_grace`` seconds ago) is logged at WARNING at once and reported
    as a failure only if this process is still running when that grace ends. Every other
    death is decided at once: SIGKILL and crash signals always, any death when no stop is
    under way.
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
        kill_after: float = 2.0,
        rss_sample_interval: float | None = None,
        stop_grace: float = DEFAULT_STOP_GRACE_S,
        job_notice: bool | None = None,
    ) -> None:
        host = HOSTS.get(mode) if isinstance(mode, str) else None
        if host is None:
            raise InvalidArgumentError(f"mode must be 'thread' or 'sidecar', got {mode!r}", "mode")
        if not isinstance(name, str):
            raise InvalidArgumentTypeError(f"name must be a str, got {name!r}", "name")
        if diagnoser is not None and not isinstance(diagnoser, ExitDiagnoser):
            raise InvalidArgumentTypeError(
                f"diagnoser must be a healthkit.ExitDiagnoser or None, got {diagnoser!r}",
                "diagnoser",
            )
        host.check(custom_actions=actions is not None, diagnoser=diagnoser)
        self.name = name
        self.mode = mode
        self._host_type = host
        self._job_notice = _jobnotice.notice_wanted(job_notice) if job_notice is not None else None
        self.on_clean_exit: OnCleanExit = check_on_clean_exit(on_clean_exit)
        self.exit_code = check_exit_code(exit_code, "exit_code")
        grace = check_timeout(kill_after, "kill_after", allow_none=False)
        assert grace is not None
        self.kill_after: float = grace
        # A floor, so that a tiny interval cannot turn the watcher into a busy loop.
        self.rss_sample_interval = check_timeout(
            rss_sample_interval, "rss_sample_interval", minimum=0.01
        )
        stop = check_timeout(stop_grace, "stop_grace", allow_none=False)
        assert stop is not None
        self.stop_grace: float = stop
        self.actions: list[Action] = (
            _check_actions(actions) if actions is not None else default_actions(exit_code)
        )
        self._default_actions = actions is None
        self._interactive = False  # armed in an interactive shell (see _for_interactive_shell)
        self._in_shell = False  # armed in a running IPython shell: SIGINT never stops it
        self._diagnoser = diagnoser
        self._owns_diagnoser = False
        self._lock = threading.RLock()
        self._judging = threading.RLock()  # one judgement at a time: watcher or exit hook
        self._records: dict[int, Watched] = {}  # id(watch) -> record, in insertion order
        # pid -> its latest record: watch() finds a duplicate in O(1), so setting up N
        # watches costs O(N), not O(N^2) (benchmarks/bench_setup.py).
        self._by_pid: dict[int, Watched] = {}
        self._armed = False
        self._inert = False
        self._fired: Diagnosis | None = None
        self._error: BaseException | None = None
        self._actions_done = threading.Event()
        self._owner_pid = os.getpid()
        self._thread: threading.Thread | None = None
        self._set: WatchSet | None = None
        self._host: Host | None = None  # while armed: where deaths are judged
        self._job: _jobnotice.JobScope | None = None
        self._progress: list[ProgressWatch] = []
        self._judge = Judge(
            name=self.name,
            log=logger,
            stop_grace=self.stop_grace,
            owner_pgrp=os.getpgrp(),
            episode=self._episode,
            stopped_by_healthkit=lambda r: stopped_by_healthkit(r.pid, r.start_time),
            describe=self._brief,
            fire=self._fire,
            armed=lambda: self._armed,
            may_be_taking_stop=_stopsignals.may_be_taking_stop,
            died_at=self._died_at,
        )
        if isinstance(watches, (str, bytes)) or not isinstance(watches, Iterable):
            raise InvalidArgumentTypeError(
                f"watches must be an iterable of processes, got {watches!r}", "watches"
            )
        watches = list(watches)
        for target in watches:
            _check_target(target, "watches")
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
    def error(self) -> BaseException | None:
        """Why the watcher stopped watching on its own, if it did (it is then disarmed, and
        said so at ERROR)."""
        return self._error

    @property
    def sidecar_pid(self) -> int | None:
        """The pid of the sidecar watcher while armed in ``mode="sidecar"``."""
        host = self._host
        return host.sidecar_pid if host is not None else None

    @property
    def watches(self) -> list[ProcessWatch]:
        return [r.watch for r in self._records.values() if r.watch is not None]

    @staticmethod
    def note_stop(signum: int = signal.SIGTERM) -> None:
        """Tell every watchdog of this process that it is being stopped.

        Needed only from a handler healthkit cannot observe: one written in C, or a route that
        bypasses the signal wakeup fd. Handlers installed with ``signal.signal`` or asyncio's
        ``loop.add_signal_handler`` need nothing.
        """
        _stopsignals.note_stop(signum)

    @staticmethod
    def note_stop_survived() -> None:
        """Tell every watchdog of this process that it handled the stop it got and carries on.

        For an application that catches a stop and keeps running (a training loop that
        saves on SIGTERM or Ctrl-C and continues, a SIGHUP log reopen): without it, a
        helper's stop-like death during that stop is reported only once ``stop_grace`` is
        over. After it, such a death is reported at once, and a later one is not deferred by
        that stop (a new stop signal opens a new stop). Sidecars are told too. Call it from
        the code that carries on (after the handler), not from a handler that goes on to
        exit. An interactive shell needs nothing: an interrupt never stops it.
        """
        note_stop_survived()

    def _stop_survived(self, at: float) -> None:
        """What this watchdog's own thread deferred is decided again now (a sidecar does so
        when it is told)."""
        with self._lock:
            if not self._armed or self._inert or os.getpid() != self._owner_pid:
                return
            Judge.resume(list(self._records.values()), at)
            if self._host is not None:
                self._host.stop_survived(at)
            watch_set = self._set
        if watch_set is not None:
            watch_set.wake()

    def _died_at(self, record: Watched) -> float | None:
        """When the stop-signal witness saw ``record``'s process end, on its own clock, if
        this watchdog's host keeps one (thread mode)."""
        host = self._host
        return host.died_at(record) if host is not None else None

    def _episode(self, now: float) -> _stopsignals.StopEpisode | None:
        """This process's stop episode at ``now``; in an interactive shell an interrupt
        (SIGINT: a notebook's "Interrupt kernel", Ctrl-C in IPython) ends a cell, never the
        process, so it opens none."""
        ignore = _INTERRUPT if self._in_shell else frozenset()
        return _stopsignals.episode(now, self.stop_grace, ignore=ignore)

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
        _check_target(target, "target")
        if name is not None and not isinstance(name, str):
            raise InvalidArgumentTypeError(f"name must be a str, got {name!r}", "name")
        with self._lock:
            pid = target.pid if not isinstance(target, int) else target
            known = self._by_pid.get(pid) if pid is not None else None
            if known is not None and known.watch is not None and known.watch.status is None:
                return known.watch
            owned = not isinstance(target, ProcessWatch)
            watch = target if isinstance(target, ProcessWatch) else ProcessWatch(target, name=name)
            record = Watched.of(watch, rule, owned=owned)
            self._records[id(watch)] = record
            self._by_pid[record.pid] = record
            if self._armed and not self._inert:
                if self._host is not None:
                    self._host.watch(record)
                if self._set is not None:
                    self._set.add(watch)
            return watch

    def watch_progress(self, progress: ProgressWatch) -> ProgressWatch:
        """Also fail when ``progress`` stalls: no beat of its helper for its
        ``stall_timeout`` while this process expects progress (see
        :class:`healthkit.ProgressWatch`). Same actions as a death; a stop of this process
        under way defers the verdict as it does a death's. Adding it twice is a no-op."""
        if not isinstance(progress, ProgressWatch):
            raise InvalidArgumentTypeError(
                f"progress must be a healthkit.ProgressWatch, got {progress!r}", "progress"
            )
        with self._lock:
            if any(p is progress for p in self._progress):
                return progress
            self._progress.append(progress)
            if self._armed and not self._inert and self._host is not None:
                self._host.start_progress(progress)
        return progress

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
            # Read (and refused if bad) before anything is set up.
            job_wanted = (
                self._job_notice if self._job_notice is not None
                else _jobnotice.notice_wanted(None)
            )
            if self._diagnoser is None:
                self._diagnoser = ExitDiagnoser()  # baselines now: "during this run"
                self._owns_diagnoser = True
            _install_hooks()
            if not _stopsignals.install():
                logger.warning(
                    "%s armed outside the main thread before any watchdog was armed in it: "
                    "a stop signal this process has already taken is not seen, so a helper "
                    "dying of a stop sent to the whole process group (torchrun, Ctrl-C) may be "
                    "reported as a failure. Arm one watchdog from the main thread first",
                    self.name,
                )
            self._for_interactive_shell()
            for action in self.actions:
                prepare = getattr(action, "prepare", None)
                if prepare is not None:
                    prepare()
            self._judge.owner_pgrp = os.getpgrp()
            self._error = None
            self._armed = True
            _ARMED.add(self)
            watch_set = WatchSet(r.watch for r in self._records.values() if r.watch is not None)
            self._job = self._join_job(job_wanted)
            host_type = self._host_type
            if self._interactive and not host_type.runs_in_shell:
                host_type = ThreadHost  # said at WARNING by _for_interactive_shell
            self._set = watch_set
            self._host = host_type(self, watch_set)
            for progress in self._progress:
                self._host.start_progress(progress)
            self._thread = threading.Thread(
                target=self._run, name=f"{self.name} (thread)", daemon=True
            )
            _stopsignals.start_without_signals(self._thread)
            return self

    def _join_job(self, wanted: bool) -> _jobnotice.JobScope | None:
        """Under a launcher that gives the job a store (torchrun): start this process's
        link to it and hear the other ranks' failures (the host acts on them). An interactive
        session never follows (its kernel is not a rank to end)."""
        if not wanted:
            return None
        link = _jobnotice.start()
        if link is None:
            return None
        if not self._interactive:
            _runtime.subscribe(_runtime.JOB_FAILURE, self._on_job_failure)
        return link.scope

    def _on_job_failure(self, failure: _jobnotice.JobFailure) -> None:
        with self._lock:  # arm() may be building the host right now
            host = self._host
        if host is not None:
            host.on_job_failure(failure)

    def _follow(self, failure: _jobnotice.JobFailure) -> None:
        """Another rank failed first: this rank stops too, naming that failure (the
        listener thread calls this). Process groups are aborted first, so a collective
        blocked on the dead peer returns and teardown cannot hang."""
        with self._lock:
            if self._fired is not None or not self._armed or self._inert:
                return
            diagnosis = failure.diagnosis()
            self._fired = diagnosis
        _jobnotice.abort_process_groups()
        self._run_actions(FailureEvent(diagnosis, self.name))

    def _for_interactive_shell(self) -> None:
        """In an IPython shell (a Jupyter kernel), ending the process would end the kernel
        and lose every variable: the default actions raise ProcessDiedError in the running
        cell instead, and a sidecar (which would SIGTERM the kernel) is not started: a
        thread watches. Said once, at WARNING. Explicit ``actions=`` are kept as given."""
        was_interactive, self._interactive = self._interactive, False
        shell = None
        if threading.current_thread() is threading.main_thread():
            shell = interactive_shell()
        self._in_shell = shell is not None
        if not self._default_actions:
            return
        if shell is None:
            if was_interactive:
                self.actions = default_actions(self.exit_code)
            return
        self._interactive = True
        self.actions = [
            log_diagnosis(),
            write_torchelastic_error_file(),
            raise_in_cell(shell),
        ]
        logger.warning(
            "%s: armed in an interactive session (%s): a helper's death raises "
            "ProcessDiedError in the running cell instead of ending the kernel%s. Pass "
            "actions= to choose otherwise",
            self.name,
            type(shell).__name__,
            f"; mode={self.mode!r} would stop the kernel, so a thread watches instead (it "
            "cannot act while a call holds the GIL)"
            if not self._host_type.runs_in_shell
            else "",
        )

    def disarm(self, timeout: float | None = 5.0, *, reason: str = "disarm()") -> None:
        """Stop watching; from now on no exit fires. Idempotent; safe from an action.

        Also closes the watches this watchdog built itself (from a Process, Popen or pid);
        arming again afterwards watches only what is added after.
        """
        timeout = check_timeout(timeout, "timeout")
        if not isinstance(reason, str):
            raise InvalidArgumentTypeError(
                f"reason must be a str (it is logged), got {reason!r}", "reason"
            )
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
            host, self._host = self._host, None
            trackers = host.stop_progress() if host is not None else []
        _runtime.unsubscribe(_runtime.JOB_FAILURE, self._on_job_failure)
        logger.debug("%s disarmed (%s)", self.name, reason)
        if watch_set is not None:
            watch_set.wake()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        if thread is None or thread is threading.current_thread() or not thread.is_alive():
            for tracker in trackers:
                tracker.close()
        if watch_set is not None:
            watch_set.close()
        if host is not None:
            host.close(timeout, at_exit=reason == _AT_SHUTDOWN)
        for action in self.actions:
            release = getattr(action, "release", None)
            if release is not None:
                release()
        with self._lock:
            self._release()

    def _release(self) -> None:
        """Close the watches and the diagnoser this watchdog built itself."""
        for r in self._records.values():
            if r.owned and r.watch is not None:
                r.watch.close()
        self._records = {k: r for k, r in self._records.items() if not r.owned}
        self._by_pid = {r.pid: r for r in self._records.values()}
        for r in self._records.values():  # a new arm() judges what it sees afresh
            r.settled, r.deferred = False, None
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

        An exit that *follows* a helper's death is usually its consequence (the client call
        raised and ended the main thread) while the watcher had not run yet; disarming first
        would lose the diagnosis. The same rule decides, knowing this process is exiting: a
        death a stop excuses is dropped (this process did end within the stop's grace);
        deaths that happen after this check (the SIGTERM of the teardown) never fire.
        """
        if not self._armed or self._inert or os.getpid() != self._owner_pid:
            return
        host = self._host
        if host is not None:
            host.before_shutdown(time.monotonic())
        if self._fired is not None:
            self._actions_done.wait(5.0)  # the watcher thread may be running them right now

    def _become_inert(self) -> None:
        # In a forked child: the watcher thread does not exist here and the processes are
        # not ours. Never act; never touch the parent's sidecar or fds.
        self._inert = True
        self._armed = False
        self._thread = None
        self._set = None
        host, self._host = self._host, None
        if host is not None:
            host.become_inert()

    def _run(self) -> None:
        try:
            self._watch_until_disarmed()
        except Exception as exc:
            if not self._armed:
                return  # closed under us by disarm()
            self._watcher_failed(exc)

    def _watch_until_disarmed(self) -> None:
        watch_set = self._set
        assert watch_set is not None
        next_sample = (
            time.monotonic() + self.rss_sample_interval
            if self.rss_sample_interval is not None
            else None
        )
        while True:
            host = self._host
            due = [t for t in (host.next_due() if host else None, next_sample) if t is not None]
            timeout = max(0.0, min(due) - time.monotonic()) if due else None
            try:
                ended = watch_set.wait(timeout)
            except WatchClosedError:
                if not self._armed:
                    return
                raise
            if not self._armed or os.getpid() != self._owner_pid:
                return
            if next_sample is not None and time.monotonic() >= next_sample:
                for r in list(self._records.values()):
                    if r.watch is not None and r.status is None:
                        r.watch.sample_rss()
                next_sample = time.monotonic() + (self.rss_sample_interval or 0.0)
            for watch in ended:
                watch_set.remove(watch)
                host = self._host
                if host is None or host.own_ended(watch):
                    continue  # disarmed meanwhile, or the host's own process (a sidecar)
                record = self._records.get(id(watch))
                if record is not None:
                    host.on_death(record, watch.poll())
            host = self._host
            if host is not None:
                host.expire()

    def _fire_stall(self, tracker: Tracker, quiet: float) -> None:
        with self._lock:
            if self._fired is not None or not self._armed:
                return  # only the first failure fires
            tracker.fired = True
            brief = stall_diagnosis(tracker, quiet, evidence=False)
            self._fired = brief

        def explain() -> Diagnosis:
            full = stall_diagnosis(tracker, quiet)
            self._fired = full
            return full

        if self._job is not None:
            _jobnotice.publish_diagnosis(brief)  # the stacks stay in this rank's own report
        self._run_actions(FailureEvent(explain, self.name, brief=brief))

    def _watcher_failed(self, exc: BaseException) -> None:
        """The watcher itself broke: never stay silently blind. Say so at ERROR and show it
        in ``armed`` (False) and ``error``."""
        self._error = exc
        logger.error(
            "%s: the watcher failed and stopped watching (%s: %s); this watchdog is disarmed "
            "and will not fire. Arm a new one to watch again",
            self.name,
            type(exc).__name__,
            exc,
            exc_info=exc,
        )
        flush_logging(logger)
        with self._lock:
            if self._thread is threading.current_thread():
                self._thread = None
        try:
            self.disarm(timeout=0, reason="watcher failed")
        except Exception:
            logger.debug("disarm after a watcher failure failed", exc_info=True)

    def _host_lost(self, lost: Host) -> None:
        """``lost`` (a sidecar) died while armed and said so: a thread host takes over."""
        with self._lock:
            if not self._armed or self._host is not lost or self._set is None:
                return
            replacement = ThreadHost(self, self._set, witnesses=False)
            self._host = replacement
        replacement.take_over()

    def _brief(self, record: Watched, status: ExitStatus) -> Diagnosis:
        diagnoser = self._diagnoser
        assert diagnoser is not None and record.watch is not None
        return early_exit_wording(diagnoser.diagnose(record.watch, evidence=False), record)

    def _fire(self, record: Watched, status: ExitStatus, excused: Decision | None) -> None:
        with self._lock:
            if self._fired is not None or not self._armed:
                return  # only the first failure fires
            diagnoser = self._diagnoser
            watch = record.watch
            assert diagnoser is not None and watch is not None

            interrupted = self._interrupt_before(status) if self._in_shell else None

            def wording(d: Diagnosis, full: bool = False) -> Diagnosis:
                d = early_exit_wording(d, record, diagnoser if full else None)
                if interrupted is not None:
                    d = interrupted_wording(d, interrupted)
                return survived_stop_wording(d, excused) if excused is not None else d

            # Act first, explain right after: the actions start on the brief diagnosis (no
            # file read); the evidence is read when an action first needs it.
            brief = wording(diagnoser.diagnose(watch, evidence=False))
            self._fired = brief

        def explain() -> Diagnosis:
            full = wording(diagnoser.diagnose(watch), full=True)
            self._fired = full
            return full

        event = FailureEvent(explain, self.name, brief=brief)
        if self._job is not None:
            # Tell the job before acting here (the actions may end this process), with the
            # evidence: the other nodes read it in their own summaries.
            _jobnotice.publish_diagnosis(event.diagnosis)
        self._run_actions(event)

    @staticmethod
    def _interrupt_before(status: ExitStatus) -> float | None:
        """How long before ``status`` was observed an interrupt (SIGINT) reached this
        process, if one did within :data:`_INTERRUPT_NEAR_S`."""
        at = status.observed_at
        near = [at - when for sig, when, _ in _stopsignals.history()
                if sig == signal.SIGINT and when <= at + 0.05]  # fmt: skip
        ago = min(near, default=None)
        return ago if ago is not None and ago <= _INTERRUPT_NEAR_S else None

    def _run_actions(self, event: FailureEvent) -> None:
        if threading.current_thread() is self._thread:
            _stopsignals.take_signals_again()  # what an action starts gets a normal mask
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


def note_stop_survived() -> None:
    """This process handled the stop it got and carries on: see
    :meth:`DisarmableWatchdog.note_stop_survived`."""
    sidecars = []
    for wd in list(_ARMED):
        pid = wd.sidecar_pid
        if pid is not None and wd._owner_pid == os.getpid():
            sidecars.append(pid)
    sidecars.extend(shared_witness_pids())
    at = _stopsignals.note_stop_survived(witnesses=sidecars)
    if at is None:
        return
    for wd in list(_ARMED):
        wd._stop_survived(at)


def _check_actions(actions: object) -> list[Action]:
    """Actions are callables taking one FailureEvent; refuse anything else now, not at the
    first death (a watcher that finds out then has nothing left to run)."""
    if isinstance(actions, (str, bytes)) or not isinstance(actions, Iterable):
        raise InvalidArgumentTypeError(
            f"actions must be a list of callables (see healthkit.actions), got {actions!r}",
            "actions",
        )
    checked = list(actions)
    for i, action in enumerate(checked):
        if not callable(action):
            raise InvalidArgumentTypeError(
                f"actions[{i}] must be callable with one FailureEvent (see healthkit.actions),"
                f" got {action!r} ({type(action).__name__})",
                "actions",
            )
    return checked
