"""``mode="thread"``: the owner's watcher thread judges each death and runs the owner's
actions.

Beside the owner it keeps two small processes: the stop-signal witness
(:mod:`healthkit._watch.stopsignals`, a member of the owner's process group that records the group's
stop signals where no library can take them away, and stamps each helper's death on its own
clock), and, under a launcher's job, the *job witness* (the sidecar program with
``witness=True``, one per process, shared by its thread-mode watchdogs) that names the rank's
own death in its error file and tells the job.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, ClassVar

from healthkit import _jobnotice
from healthkit._decide import Verdict
from healthkit._judge import Judge, Watched
from healthkit._progress import ProgressWatch, Tracker
from healthkit._watch import stopsignals as _stopsignals
from healthkit._watch.process import ExitStatus, ProcessWatch, WatchSet
from healthkit._watchdog.host import Host
from healthkit._watchdog.sidecar_link import SidecarLink

if TYPE_CHECKING:
    from healthkit._watchdog.core import DisarmableWatchdog

__all__ = ["ThreadHost", "forget_shared_witness", "shared_witness_pids"]

logger = logging.getLogger("healthkit")


class _SharedWitness:
    """One job witness per process, shared by the thread-mode watchdogs armed in it: the
    rank dies once, and one process is enough to say so."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._link: SidecarLink | None = None
        self._users: set[int] = set()

    def acquire(self, wd: DisarmableWatchdog, job: _jobnotice.JobScope) -> SidecarLink:
        with self._lock:
            link = self._link
            if link is not None and link.process_watch_status() is not None:
                link.close()  # it died: a new one for the watchdogs armed from now on
                link = None
            if link is None:
                link = SidecarLink(
                    name=wd.name, kill_after=wd.kill_after, stop_grace=wd.stop_grace,
                    witness=True, job=job,
                )  # fmt: skip
                self._link = link
            self._users.add(id(wd))
            return link

    def release(
        self, wd: DisarmableWatchdog, timeout: float | None, *, at_exit: bool = False
    ) -> None:
        """``at_exit``: this process's interpreter is shutting down: the witness stays until
        the process is gone (an exit code no error file explains is still a failure)."""
        with self._lock:
            self._users.discard(id(wd))
            if self._users or self._link is None:
                return
            link, self._link = self._link, None
        if at_exit:
            link.leave()
        else:
            link.disarm(timeout)

    def forget(self) -> None:
        """In a forked child: the witness is the parent's; never touch it."""
        self._link = None
        self._users = set()


_WITNESS = _SharedWitness()


def shared_witness_pids() -> list[int]:
    """The job witness's pid, if one runs beside this process."""
    link = _WITNESS._link
    return [link.pid] if link is not None else []


def forget_shared_witness() -> None:
    """In a forked child (see :meth:`_SharedWitness.forget`)."""
    _WITNESS.forget()


class ThreadHost(Host):
    """Judges in the owner's watcher thread. ``witnesses``: start the witnesses beside the
    owner (not when taking over from a lost sidecar: it had none)."""

    mode: ClassVar[str] = "thread"

    def __init__(
        self, wd: DisarmableWatchdog, watch_set: WatchSet, *, witnesses: bool = True
    ) -> None:
        super().__init__(wd, watch_set)
        self.trackers: dict[int, Tracker] = {}  # id(progress watch) -> tracker
        self.witnessed = False  # holds a use of this process's stop-signal witness
        self.witness: SidecarLink | None = None
        self.witness_watch: ProcessWatch | None = None
        if not witnesses:
            return
        # The watcher thread judges: a witness in this process's group records the group's
        # stop signals where no library can take them away.
        self.witnessed = _stopsignals.acquire_witness()
        if self.witnessed:
            _stopsignals.witness_watch(
                (r.pid, r.start_time) for r in wd._records.values() if r.watch is not None
            )
        if wd._job is not None and not wd._interactive:
            # Beside the rank: names the rank's own death (an OOM kill of the trainer
            # itself) in its error file and tells the job. It imports nothing heavy unless
            # the rank dies.
            self.witness = _WITNESS.acquire(wd, wd._job)
            self.witness_watch = self.witness.process_watch()
            watch_set.add(self.witness_watch)

    # ---- deaths
    def watch(self, record: Watched) -> None:
        if self.witnessed:
            _stopsignals.witness_watch([(record.pid, record.start_time)])

    def on_death(self, record: Watched, status: ExitStatus | None) -> None:
        wd = self.wd
        with wd._judging:
            wd._judge.judge(record, status)

    def died_at(self, record: Watched) -> float | None:
        """When the stop-signal witness saw ``record``'s process end, on its own clock."""
        if not self.witnessed:
            return None
        return _stopsignals.died_at(record.pid, record.start_time)

    def own_ended(self, watch: ProcessWatch) -> bool:
        if watch is not self.witness_watch:
            return False
        self._witness_died(watch)
        return True

    def _witness_died(self, watch: ProcessWatch) -> None:
        """The job witness is gone while armed: helpers are still watched from here, but
        this rank's own death would no longer be named. Said once, at WARNING."""
        wd = self.wd
        with wd._lock:
            witness, self.witness = self.witness, None
            if not wd._armed or witness is None:
                return
        _WITNESS.release(wd, 0)
        logger.warning(
            "%s: the process beside this rank that names its own death is gone (%s); "
            "helpers are still watched",
            wd.name,
            watch.poll(),
        )

    def _pending(self) -> list[Watched]:
        return [r for r in list(self.wd._records.values()) if r.deferred is not None]

    def next_due(self) -> float | None:
        due = [t.due for t in list(self.trackers.values()) if t.due is not None]
        judged = Judge.next_due(self._pending())
        if judged is not None:
            due.append(judged)
        return min(due) if due else None

    def expire(self) -> None:
        wd = self.wd
        with wd._judging:
            wd._judge.expire(self._pending())
        self._look_progress()

    def stop_survived(self, at: float) -> None:
        for tracker in self.trackers.values():
            if tracker.due is not None:
                tracker.due = min(tracker.due, at)

    def before_shutdown(self, now: float) -> None:
        wd = self.wd
        for record in list(wd._records.values()):
            if record.settled or record.watch is None:
                continue
            status = record.status or record.watch.peek()
            if status is None:
                continue
            with wd._judging:
                wd._judge.judge(record, status, now=now, owner_exiting=True)

    def take_over(self) -> None:
        wd = self.wd
        with wd._lock:
            for progress in wd._progress:
                self.start_progress(progress)
        for r in list(wd._records.values()):
            if r.watch is not None and r.watch.status is not None and not r.watch.closed:
                self.on_death(r, r.watch.status)  # ended while the lost host decided

    # ---- progress
    def start_progress(self, progress: ProgressWatch) -> None:
        tracker = Tracker.of(progress)
        self.trackers[id(progress)] = tracker
        progress.add_poke(self._poke)
        watch_set = self.set
        if tracker.bell is not None:

            def rung() -> None:  # a call began while no timer was set: look
                tracker.drain()
                watch_set.wake()

            watch_set.add_fd(tracker.bell, rung)
        self._poke()

    def _poke(self) -> None:
        self.set.wake()

    def stop_progress(self) -> list[Tracker]:
        for progress in self.wd._progress:
            progress.remove_poke(self._poke)
        trackers = list(self.trackers.values())
        self.trackers.clear()
        for tracker in trackers:
            if tracker.bell is not None:
                self.set.remove_fd(tracker.bell)
        return trackers

    def _look_progress(self) -> None:
        """Look at each progress page that is due, or not timed yet (a wait may have begun:
        that is what woke us). A page looked at while idle sets no timer."""
        wd = self.wd
        now = time.monotonic()
        for tracker in list(self.trackers.values()):
            if tracker.due is not None and tracker.due > now:
                continue
            decision, quiet = tracker.look(
                now,
                armed=wd._armed,
                stop=wd._episode,
                stop_grace=wd.stop_grace,
            )
            if decision.verdict is Verdict.FIRE and quiet is not None:
                wd._fire_stall(tracker, quiet)
            elif decision.verdict is Verdict.DEFER:
                logger.warning("%s: %s stalled; %s", wd.name, tracker.name, decision.reason)

    # ---- the job, and the end
    def on_job_failure(self, failure: _jobnotice.JobFailure) -> None:
        self.wd._follow(failure)

    def close(self, timeout: float | None, *, at_exit: bool) -> None:
        wd = self.wd
        witness, self.witness = self.witness, None
        if witness is not None:
            _WITNESS.release(wd, timeout, at_exit=at_exit)
        witnessed, self.witnessed = self.witnessed, False
        if witnessed:
            _stopsignals.release_witness()
        if self.witness_watch is not None:
            self.witness_watch.close()
            self.witness_watch = None

    def become_inert(self) -> None:
        self.witness = None
        self.witness_watch = None
        self.witnessed = False
        self.trackers = {}
