"""Is a watched process's ending a failure? The watchdog's own answer, for code that waits on
its helpers itself.

An integration that waits for its helpers in its own loop (healthkit_glt's producer waits on
its sampling workers' pidfds while it receives a batch) sees a death first, before any
watchdog, and must say at once whether it fails the job. It must not answer with a rule of its
own: a sampling worker ended by the group stop of a launcher (torchrun's ``killpg(SIGTERM)``,
a terminal's Ctrl-C) is its share of a shutdown, not a failure to publish to the whole job,
while one SIGKILLed or crashed is a failure, stop or not. :class:`EndingClassifier` asks the
watchdog's :class:`~healthkit._judge.Judge` (and so :func:`~healthkit._decide.decide`, the one
rule), with this process's stop episode read the way the watchdog reads it.
"""

from __future__ import annotations

import logging
import os
import threading

import attrs

from healthkit._decide import DEFAULT_STOP_GRACE_S, Decision, OnCleanExit, Verdict
from healthkit._decide import check_on_clean_exit as _check_on_clean_exit
from healthkit._diagnose.diagnosis import Diagnosis, ExitDiagnoser
from healthkit._errors import InvalidArgumentTypeError, check_timeout
from healthkit._judge import Judge, Watched, early_exit_wording
from healthkit._watch import stopsignals as _stopsignals
from healthkit._watch.process import ExitStatus, ProcessWatch
from healthkit._watch.stop import stopped_by_healthkit

__all__ = ["EndingClassifier"]

logger = logging.getLogger("healthkit")

_SURVIVED = (
    "; it ended while this process was being stopped, and this process is still running "
    "after the stop (its grace passed, or it said it carries on): it depends on a dead helper"
)


class EndingClassifier:
    """Says whether a watched process's ending is a failure, by the watchdog's firing rule.

    Build it in the main thread before the helpers start: from then on this process's stop
    signals are noticed (as :class:`~healthkit.DisarmableWatchdog`'s ``arm()`` does), so a
    helper that dies of a stop sent to the whole process group is told apart from one that
    dies alone. :meth:`classify` returns the rule's :class:`~healthkit.lowlevel.Decision`:

    - ``FIRE``: a failure (``reason`` says why: an abnormal exit, an early return);
    - ``DEFER``: taken as this process's stop for now, and logged at WARNING once; not a
      failure unless this process is still running at ``until`` (then :meth:`classify` of
      the same watch says ``FIRE``): a death excused by a stop is deferred, never dropped;
    - ``IGNORE``: not a failure (ended by :func:`healthkit.stop`, or an exit 0 allowed by
      ``on_clean_exit="ignore"``); ``WARN``: an exit 0 under ``"warn"``, or an unknown status;
    - ``KEEP_WATCHING``: it is still running.

    ``name`` heads its log lines; ``stop_grace`` is the watchdog's (how long after a stop
    signal a death it excused is reported anyway if this process still runs).
    """

    def __init__(
        self,
        name: str = "healthkit",
        *,
        stop_grace: float = DEFAULT_STOP_GRACE_S,
        log: logging.Logger | None = None,
    ) -> None:
        if not isinstance(name, str):
            raise InvalidArgumentTypeError(f"name must be a str, got {name!r}", "name")
        grace = check_timeout(stop_grace, "stop_grace", allow_none=False)
        assert grace is not None
        if log is not None and not isinstance(log, logging.Logger):
            raise InvalidArgumentTypeError(
                f"log must be a logging.Logger or None, got {log!r}", "log"
            )
        self.name = name
        self.stop_grace: float = grace
        self.log = log or logger
        #: Whether delivered stop signals are seen (False: built outside the main thread
        #: before any watchdog was armed in it; only pending ones are).
        self.watching_stops = _stopsignals.install()
        if not self.watching_stops:
            self.log.warning(
                "%s: built outside the main thread before any watchdog was armed in it: a "
                "stop signal this process has already taken is not seen, so a helper dying "
                "of a stop sent to the whole process group may be classified as a failure",
                name,
            )
        self._lock = threading.Lock()
        # (pid, start time): the process, whichever watch of it is asked about (a watch's
        # id may be reused by a later one once it is collected; a process's never is).
        self._records: dict[tuple[int, int | None], Watched] = {}
        self._final: dict[tuple[int, int | None], Decision] = {}  # once settled
        self._excused: Decision | None = None
        self._diagnoser: ExitDiagnoser | None = None
        self._judge = Judge(
            name=name,
            log=self.log,
            stop_grace=self.stop_grace,
            owner_pgrp=os.getpgrp(),
            episode=lambda now: _stopsignals.episode(now, self.stop_grace),
            stopped_by_healthkit=lambda r: stopped_by_healthkit(r.pid, r.start_time),
            describe=self._brief,
            fire=self._fire,
            may_be_taking_stop=_stopsignals.may_be_taking_stop,
        )

    def classify(
        self, watch: ProcessWatch, *, on_clean_exit: OnCleanExit = "fail"
    ) -> Decision:
        """The rule's decision on ``watch``'s ending as of now (see the class).

        ``on_clean_exit``: what an exit 0 means for it, as for a watchdog (``"fail"``: it
        was meant to run until told to stop). Asked again about the same process, a settled
        decision is returned as it was, and a deferred one is decided again. Safe from any
        thread.
        """
        if not isinstance(watch, ProcessWatch):
            raise InvalidArgumentTypeError(
                f"watch must be a healthkit.ProcessWatch, got {watch!r}", "watch"
            )
        _check_on_clean_exit(on_clean_exit)
        status = watch.status if watch.closed else watch.poll()
        key = (watch.pid, watch.start_time)
        with self._lock:
            final = self._final.get(key)
            if final is not None:
                return final
            record = self._records.get(key)
            if record is None:
                record = Watched.of(watch, on_clean_exit, owned=False)
                self._records[key] = record
            self._excused = None
            decision = self._judge.judge(record, status)
            if decision.verdict is Verdict.FIRE and self._excused is not None:
                decision = attrs.evolve(decision, reason=decision.reason + _SURVIVED)
            if record.settled:
                self._final[key] = decision
                del self._records[key]  # nothing more will happen to it
            return decision

    def close(self) -> None:
        """Release the diagnoser used for log lines (idempotent)."""
        with self._lock:
            if self._diagnoser is not None:
                self._diagnoser.close()
                self._diagnoser = None

    def _brief(self, record: Watched, status: ExitStatus) -> Diagnosis:
        if self._diagnoser is None:
            self._diagnoser = ExitDiagnoser()
        assert record.watch is not None
        brief = self._diagnoser.diagnose(record.watch, evidence=False)
        return early_exit_wording(brief, record)

    def _fire(self, record: Watched, status: ExitStatus, excused: Decision | None) -> None:
        self._excused = excused  # the caller acts on the decision; only its wording is ours

    def __repr__(self) -> str:
        return f"<EndingClassifier {self.name!r} stop_grace={self.stop_grace:g}>"
