"""Where a watchdog's judgement runs: the interface its two hosts implement.

:class:`healthkit._watchdog.core.DisarmableWatchdog` keeps the records, ``arm()``/``disarm()``
and one watcher thread in the owner (in both modes: it is what sees the watched pidfds end
first). What happens to a death it sees, and what else runs beside the owner, is the host's:

* :class:`healthkit._watchdog.thread_host.ThreadHost` judges in that thread and runs the
  owner's actions; beside the rank, a stop-signal witness and (under a launcher's job) a job
  witness that names the rank's own death;
* :class:`healthkit._watchdog.sidecar_host.SidecarHost` hands the judgement to a sidecar
  process (the owner's GIL may be held) and tells it what the owner learns; if the sidecar
  dies, the watchdog says so at ERROR and a thread host takes over (:meth:`Host.take_over`).

``mode=`` picks the host once, at construction (:data:`HOSTS`).
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, ClassVar

from healthkit._diagnose.diagnosis import ExitDiagnoser
from healthkit._judge import Watched
from healthkit._progress import ProgressWatch, Tracker
from healthkit._watch.process import ExitStatus, ProcessWatch, WatchSet

if TYPE_CHECKING:
    from healthkit import _jobnotice
    from healthkit._watchdog.core import DisarmableWatchdog

__all__ = ["Host"]


class Host(abc.ABC):
    """One armed period of one watchdog, hosted somewhere. Built by ``arm()`` (which then
    owns the watcher thread's :class:`~healthkit.WatchSet`), closed by ``disarm()``."""

    #: The ``mode=`` that picks this host.
    mode: ClassVar[str]
    #: Whether it may run in an interactive shell (a sidecar would stop the kernel).
    runs_in_shell: ClassVar[bool] = True

    def __init__(self, wd: DisarmableWatchdog, watch_set: WatchSet) -> None:
        self.wd = wd
        self.set = watch_set  # the watcher thread's

    @classmethod
    def check(cls, *, custom_actions: bool, diagnoser: ExitDiagnoser | None) -> None:
        """Refuse, at construction, settings this host cannot honour."""
        return None

    @property
    def sidecar_pid(self) -> int | None:
        """The pid of the process that judges for the owner, if not the owner itself."""
        return None

    @abc.abstractmethod
    def watch(self, record: Watched) -> None:
        """A record added while armed (the watcher thread's set already has its watch)."""

    @abc.abstractmethod
    def on_death(self, record: Watched, status: ExitStatus | None) -> None:
        """The watcher thread saw ``record``'s process end."""

    def died_at(self, record: Watched) -> float | None:
        """When ``record``'s process ended on a clock that never waits for the owner's GIL
        (a witness's), if this host keeps one."""
        return None

    @abc.abstractmethod
    def own_ended(self, watch: ProcessWatch) -> bool:
        """Whether ``watch`` (ended) is one of the host's own processes (a sidecar, a
        witness); it is then handled here."""

    @abc.abstractmethod
    def next_due(self) -> float | None:
        """When the watcher thread must look again without a wakeup (monotonic), if ever."""

    @abc.abstractmethod
    def expire(self) -> None:
        """After each wakeup: decide the deferred deaths and the progress looks now due."""

    @abc.abstractmethod
    def stop_survived(self, at: float) -> None:
        """The owner said at ``at`` that it carries on after its stop."""

    @abc.abstractmethod
    def start_progress(self, progress: ProgressWatch) -> None:
        """Watch ``progress`` too."""

    @abc.abstractmethod
    def stop_progress(self) -> list[Tracker]:
        """Stop watching progress; the trackers, for the caller to close once the watcher
        thread no longer reads them."""

    @abc.abstractmethod
    def on_job_failure(self, failure: _jobnotice.JobFailure) -> None:
        """Another rank of the job failed first."""

    @abc.abstractmethod
    def before_shutdown(self, now: float) -> None:
        """The interpreter is exiting, before disarming: a helper that already died is
        judged as if the watcher had seen it (``owner_exiting``), by the same rule."""

    @abc.abstractmethod
    def close(self, timeout: float | None, *, at_exit: bool) -> None:
        """Disarmed (``at_exit``: by interpreter shutdown); the watcher thread is stopped."""

    @abc.abstractmethod
    def become_inert(self) -> None:
        """In a forked child: forget the parent's processes and fds; never touch them."""

    @abc.abstractmethod
    def take_over(self) -> None:
        """This host replaces one that was lost while armed (a sidecar that died): start
        the progress watches and judge what ended while the lost host was deciding."""
