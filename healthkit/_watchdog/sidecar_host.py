"""``mode="sidecar"``: a small separate process judges and acts, because the owner's main
thread may sit in native code holding the GIL (a graph-learn client call against a dead
server), and then no thread of the owner can run.

The owner's watcher thread still runs: it tells the sidecar every exit status it learns (the
owner may reap a helper before the sidecar reads its zombie), passes on another rank's notice,
hands the sidecar's relayed log lines to the owner's handlers, and notices if the sidecar
itself dies: that is said at ERROR and a :class:`~healthkit._watchdog.thread_host.ThreadHost`
takes over. The sidecar process is :mod:`healthkit._watchdog.sidecar_process`; the owner's
end of the link, :mod:`healthkit._watchdog.sidecar_link`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, ClassVar

from healthkit import _jobnotice
from healthkit._actions import flush_logging
from healthkit._decide import Verdict
from healthkit._diagnose.diagnosis import ExitDiagnoser
from healthkit._errors import InvalidArgumentError
from healthkit._judge import Watched
from healthkit._progress import ProgressWatch, Tracker
from healthkit._watch.process import ExitStatus, ProcessWatch, WatchSet
from healthkit._watchdog.host import Host
from healthkit._watchdog.sidecar_link import SidecarLink

if TYPE_CHECKING:
    from healthkit._watchdog.core import DisarmableWatchdog

__all__ = ["SidecarHost"]

logger = logging.getLogger("healthkit")


class SidecarHost(Host):
    """Hands the judgement to a sidecar process and keeps it informed."""

    mode: ClassVar[str] = "sidecar"
    runs_in_shell: ClassVar[bool] = False  # it would SIGTERM the kernel

    @classmethod
    def check(cls, *, custom_actions: bool, diagnoser: ExitDiagnoser | None) -> None:
        if custom_actions:
            raise InvalidArgumentError(
                "mode='sidecar' runs fixed actions in another process (log, error file, "
                "stop this process); use exit_code= to choose the code, or mode='thread' "
                "for custom actions",
                "actions",
            )
        if diagnoser is not None and type(diagnoser) is not ExitDiagnoser:
            raise InvalidArgumentError(
                "mode='sidecar' builds the diagnoser again in the sidecar process from its "
                f"settings, so the code of a subclass ({type(diagnoser).__name__}) cannot run "
                "there: pass a healthkit.ExitDiagnoser, or use mode='thread'",
                "diagnoser",
            )

    def __init__(self, wd: DisarmableWatchdog, watch_set: WatchSet) -> None:
        super().__init__(wd, watch_set)
        assert wd._diagnoser is not None
        link = SidecarLink(
            name=wd.name,
            kill_after=wd.kill_after,
            stop_grace=wd.stop_grace,
            job=wd._job,
            diagnoser=wd._diagnoser._settings(),
            rss_sample_interval=wd.rss_sample_interval,
        )
        self.link: SidecarLink | None = link
        for record in wd._records.values():
            link.watch(record)
        self.sidecar_watch: ProcessWatch | None = link.process_watch()
        watch_set.add(self.sidecar_watch)
        # What the sidecar asks of this process: its log lines for handlers it cannot
        # write through, and a failure to publish while its own link to the job's store is
        # still coming up.
        fd = link.fileno()

        def take_messages() -> None:
            if not link.take_messages():
                watch_set.remove_fd(fd)  # closed: its death is seen on its own

        watch_set.add_fd(fd, take_messages)

    @property
    def sidecar_pid(self) -> int | None:
        return self.link.pid if self.link is not None else None

    # ---- deaths: the sidecar decides
    def watch(self, record: Watched) -> None:
        if self.link is not None:
            self.link.watch(record)

    def on_death(self, record: Watched, status: ExitStatus | None) -> None:
        # The sidecar may not be able to read the status itself (this process may have
        # reaped the helper first), so tell it.
        if self.link is not None:
            self.link.status(record.pid, status)

    def own_ended(self, watch: ProcessWatch) -> bool:
        if watch is not self.sidecar_watch:
            return False
        self._sidecar_died(watch)
        return True

    def _sidecar_died(self, watch: ProcessWatch) -> None:
        """The sidecar is gone while armed: say so loudly; a thread host takes over."""
        wd = self.wd
        with wd._lock:
            link = self.link
            if not wd._armed or link is None or wd._host is not self:
                return
            self.link = None
            assert wd._diagnoser is not None
            diagnosis = wd._diagnoser.diagnose(watch, name="healthkit sidecar")
        logger.error(
            "%s: %s. Watching from a thread in this process from now on (it cannot act "
            "while this process's main thread holds the GIL)",
            wd.name,
            diagnosis,
        )
        flush_logging(logger)
        self.set.remove_fd(link.fileno())  # its log relay, if any: closed next
        link.close()
        with wd._lock:
            for progress in wd._progress:
                progress.remove_poke(link.expect)
        wd._host_lost(self)

    def next_due(self) -> float | None:
        return None  # deferred deaths and progress timers are the sidecar's

    def expire(self) -> None:
        pass

    def stop_survived(self, at: float) -> None:
        pass  # the sidecar is told by the stop-signal listener (note_stop_survived)

    def before_shutdown(self, now: float) -> None:
        """The sidecar decides: ask the same rule, with the same inputs, whether it is about
        to act, and if so give it the time it needs (it stops this process) instead of
        standing it down."""
        wd = self.wd
        link = self.link
        if link is None:
            return
        for record in list(wd._records.values()):
            if record.settled or record.watch is None:
                continue
            status = record.status or record.watch.peek()
            if status is None:
                continue
            with wd._judging:
                decision = wd._judge.verdict(record, status, now=now, owner_exiting=True)
            if decision.verdict is Verdict.FIRE:
                link.wait_for_action(wd.kill_after + 5.0)
                return

    def take_over(self) -> None:  # pragma: no cover - nothing hands over to a sidecar
        raise AssertionError("a sidecar host never takes over from another host")

    # ---- progress: the sidecar maps the pages through /proc
    def start_progress(self, progress: ProgressWatch) -> None:
        link = self.link
        if link is not None:
            link.progress(progress)
            progress.add_poke(link.expect)

    def stop_progress(self) -> list[Tracker]:
        link = self.link
        if link is not None:
            for progress in self.wd._progress:
                progress.remove_poke(link.expect)
        return []

    # ---- the job, and the end
    def on_job_failure(self, failure: _jobnotice.JobFailure) -> None:
        """This process's link (up as soon as torch is imported here) passes another rank's
        notice on to the sidecar, whose own link may still be coming up (it imports torch in
        the background after arm()). Whichever hears first, the sidecar acts once; if this
        process's GIL is held, the sidecar's own link still hears it."""
        link = self.link
        if link is not None and self.wd._armed:
            link.notice(failure)

    def close(self, timeout: float | None, *, at_exit: bool) -> None:
        link, self.link = self.link, None
        if link is not None:
            link.disarm(timeout)
        if self.sidecar_watch is not None:
            self.sidecar_watch.close()
            self.sidecar_watch = None

    def become_inert(self) -> None:
        self.link = None
        self.sidecar_watch = None
