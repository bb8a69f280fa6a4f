"""One watcher, two hosts: what happens to a death once it is seen.

The owner's watcher thread and the sidecar process differ in how they learn that a process
ended (the sidecar may have to take the owner's word for the status) and in what firing does
(run the owner's actions; or log, write the error file and stop the owner). Everything in
between is here, once: the record of a watched process, the call to the firing rule
(:func:`healthkit._decide.decide`, the only thing that decides), the warning logged at once for
a death that a stop excuses for now, and the deferred deaths that are decided again when their
stop episode ends.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

import attrs

from healthkit._decide import Decision, OnCleanExit, Verdict, decide, stop_like
from healthkit._diagnose.diagnosis import (
    Diagnosis,
    ExitDiagnoser,
    returned_early,
    with_exception_record,
)
from healthkit._os.proc import read_proc_stat
from healthkit._watch.process import UNKNOWN_NOT_PERMITTED, ExitStatus, ProcessWatch
from healthkit._watch.stopsignals import HANDLER_CONFIRM_S, StopEpisode

__all__ = ["SECOND_LOOK_S", "Judge", "Watched"]

#: How long a stop-like death with no stop in sight is looked at again while a thread of the
#: owner may be taking a signal (see :meth:`Judge.judge`), and how often.
SECOND_LOOK_S = 0.05
_SECOND_LOOK_POLL_S = 0.005
# Added to a deferral's reason when the owner said it carries on (note_stop_survived).
_DECLARED = "; this process then said it survived the stop"
# Ends a deferral's reason when its stop signal was seen only as "being handled": looked at
# again once that is confirmed or taken for a mask (HANDLER_CONFIRM_S).
_ON_HANDLING = (
    f"; looked at again within {HANDLER_CONFIRM_S:g}s: so far the stop signal is only blocked "
    "in a thread, which a mask does too"
)


@attrs.define(eq=False)
class Watched:
    """One watched process: the same record in the owner's watcher thread and in the sidecar."""

    pid: int
    name: str
    on_clean_exit: OnCleanExit
    pgrp: int | None
    start_time: int | None
    watch: ProcessWatch | None = None  # None: the sidecar found it ended before it watched
    owned: bool = False  # the watchdog built the ProcessWatch, so it closes it
    #: How it ended as told by someone else, when its own watch cannot say: the owner's word
    #: in the sidecar (it reaped the helper first), or the status a judgement was made on.
    told: ExitStatus | None = None
    deferred: Decision | None = None  # excused by a stop for now: decided again at .until
    settled: bool = False  # decided for good: nothing more will happen about it

    @property
    def status(self) -> ExitStatus | None:
        """How it ended, once known. The one place a watchdog reads it: its watch's own
        status (the kernel's, read by :class:`ProcessWatch`) unless that is unknown and
        :attr:`told` says more (a code, or why it is unknown)."""
        own = self.watch.status if self.watch is not None else None
        told = self.told
        if own is not None and (own.returncode is not None or own.source == UNKNOWN_NOT_PERMITTED):
            return own
        if told is not None and (
            told.returncode is not None or own is None or told.source != "unknown"
        ):
            return told
        return own

    @classmethod
    def of(cls, watch: ProcessWatch, on_clean_exit: OnCleanExit, *, owned: bool) -> Watched:
        return cls(
            pid=watch.pid,
            name=watch.name,
            on_clean_exit=on_clean_exit,
            pgrp=watch.pgrp,
            start_time=watch.start_time,
            watch=watch,
            owned=owned,
        )


def early_exit_wording(
    diagnosis: Diagnosis, record: Watched, diagnoser: ExitDiagnoser | None = None
) -> Diagnosis:
    """An exit 0 of a process meant to run until disarmed is a failure of its own kind.
    With ``diagnoser`` (the full diagnosis), its exception record is carried too: an
    exception in another thread or an atexit callback leaves the exit code 0."""
    if diagnosis.exit_code == 0 and record.on_clean_exit != "ignore":
        early = returned_early(diagnosis)
        if diagnoser is not None:
            identity = record.watch._identity if record.watch is not None else None
            early = with_exception_record(early, diagnoser, record.start_time, identity)
        return early
    return diagnosis


def survived_stop_wording(diagnosis: Diagnosis, excused: Decision) -> Diagnosis:
    """A death first excused by a stop that this process then survived."""
    survived = (
        "this process then said it carries on (note_stop_survived)"
        if _DECLARED in excused.reason
        else "this process is still running after the stop's grace"
    )
    return attrs.evolve(
        diagnosis,
        likely=(diagnosis.likely + "; " if diagnosis.likely else "")
        + f"it ended while this process was being stopped, and {survived}: it now depends "
        "on a dead helper",
        evidence=(*diagnosis.evidence, f"first excused: {excused.reason.partition(';')[0]}"),
    )


def _refresh_group(record: Watched) -> None:
    """Its process group as it was at its death (a helper may leave the owner's group after
    it was watched: ``os.setpgrp()``/``setsid()`` in its target), read from the zombie."""
    stat = read_proc_stat(record.pid)
    if stat is not None and stat.start_time == record.start_time:
        record.pgrp = stat.pgrp


@attrs.define(eq=False)
class Judge:
    """Decides the deaths one host sees, and holds the deferred ones until their time.

    The host supplies what only it knows: the owner's stop episode at a given moment, whether
    healthkit itself is stopping a process, how to describe a death, and what firing does.
    """

    name: str
    log: logging.Logger
    stop_grace: float
    owner_pgrp: int
    episode: Callable[[float], StopEpisode | None]
    stopped_by_healthkit: Callable[[Watched], bool]
    describe: Callable[[Watched, ExitStatus], Diagnosis]  # brief: exit status only, no I/O
    fire: Callable[[Watched, ExitStatus, Decision | None], None]
    armed: Callable[[], bool] = lambda: True
    #: Could a thread of the owner be taking a signal right now (on a CPU, or waiting for
    #: one, or in an uninterruptible wait)? Then a stop may not show yet.
    may_be_taking_stop: Callable[[], bool] = lambda: False
    second_look: float | None = None  # None: :data:`SECOND_LOOK_S` as it is when used
    #: When the process ended, on a clock that never waits for the owner's GIL (the
    #: witness's), if known: a stop that the witness received after it cannot excuse it.
    died_at: Callable[[Watched], float | None] = lambda r: None
    #: The stop episode the last decision saw (None: none, or not read).
    _seen: StopEpisode | None = attrs.field(default=None, init=False)

    def judge(
        self,
        record: Watched,
        status: ExitStatus | None,
        *,
        now: float | None = None,
        owner_exiting: bool = False,
        owner_gone: bool = False,
    ) -> Decision:
        """Decide ``record``'s ending now, and act on the decision (fire, warn, defer)."""
        if record.settled:
            return Decision(Verdict.IGNORE, "already decided")
        now = time.monotonic() if now is None else now
        decision = self.verdict(
            record, status, now=now, owner_exiting=owner_exiting, owner_gone=owner_gone
        )
        if decision.verdict is Verdict.KEEP_WATCHING:
            return decision
        assert status is not None
        if record.status is None:
            record.told = status  # what this was decided on, for a later look (a peek)
        excused, record.deferred = record.deferred, None
        if (
            excused is not None
            and excused.until is not None
            and self._seen is None
            and (_ON_HANDLING in excused.reason)
        ):
            excused = None  # what looked like a handler was a mask: no stop ever was
        if decision.verdict is Verdict.DEFER and self._seen is not None:
            if self._seen.seen == "handling":
                # Only a stop signal blocked beyond a thread's usual mask: confirmed (it is
                # then delivered, witnessed or pending) or taken for a mask within a moment.
                decision = attrs.evolve(
                    decision,
                    reason=decision.reason.partition("; reported")[0] + _ON_HANDLING,
                    until=min(
                        decision.until if decision.until is not None else math.inf,
                        self._seen.began + HANDLER_CONFIRM_S + _SECOND_LOOK_POLL_S,
                    ),
                )
        if decision.verdict is Verdict.DEFER:
            if excused is None:  # said once, when first seen; the deadline may move later
                brief = self.describe(record, status)
                self.log.warning("%s: %s %s; %s", self.name, brief.who, brief.what, decision.reason)
            record.deferred = decision
            return decision
        record.settled = True
        if decision.verdict is Verdict.FIRE:
            self.fire(record, status, excused)
        elif decision.verdict is Verdict.WARN:
            self.log.warning(
                "%s: %s; %s", self.name, self.describe(record, status), decision.reason
            )
        elif excused is not None:
            self.log.info("%s: %s: %s", self.name, record.name, decision.reason)
        return decision

    def verdict(
        self,
        record: Watched,
        status: ExitStatus | None,
        *,
        now: float | None = None,
        owner_exiting: bool = False,
        owner_gone: bool = False,
    ) -> Decision:
        """What the rule says of ``record``'s ending now, from every input :meth:`judge`
        uses (its process group at death, the owner's stop episode, the second look), without
        acting on it: the owner of a sidecar asks this at its own exit, to know whether the
        sidecar is about to act."""
        now = time.monotonic() if now is None else now
        first_look = record.deferred is None
        if status is not None and first_look:
            _refresh_group(record)
        decision = self._decide(record, status, now, owner_exiting, owner_gone)
        if first_look and decision.verdict is Verdict.FIRE and status is not None and (
            stop_like(status)
        ):
            decision = self._second_look(record, status, owner_exiting, owner_gone)
        return decision

    def _decide(
        self,
        record: Watched,
        status: ExitStatus | None,
        now: float,
        owner_exiting: bool,
        owner_gone: bool,
    ) -> Decision:
        # Only a stop-like ending can be excused by a stop: a SIGKILL or a crash is decided
        # without reading the owner's signal state.
        stop = self.episode(now) if status is not None and stop_like(status) else None
        if stop is not None:
            # The death and the episode's stop signals on one clock, the witness's: a death it
            # saw before every one of them preceded the stop, however late this host looked
            # (a GIL held for seconds) and whichever look noticed the stop first.
            died = self.died_at(record)
            if died is not None and stop.preceded_by(died):
                stop = None
        self._seen = stop
        return decide(
            status,
            armed=self.armed(),
            on_clean_exit=record.on_clean_exit,
            stopped_by_healthkit=self.stopped_by_healthkit(record),
            stop=stop,
            stop_grace=self.stop_grace,
            now=now,
            same_group=record.pgrp is None or record.pgrp == self.owner_pgrp,
            owner_exiting=owner_exiting,
            owner_gone=owner_gone,
        )

    def _second_look(
        self,
        record: Watched,
        status: ExitStatus,
        owner_exiting: bool,
        owner_gone: bool,
    ) -> Decision:
        """A stop-like death that would fire while a thread of the owner may be taking a
        signal: look again for up to :data:`SECOND_LOOK_S`, as long as one may be.

        The kernel takes a signal off the pending set and only then blocks it for the
        handler, in the receiving thread's own context; a thread preempted in between (a
        loaded machine, a busy process) leaves no trace of the stop for milliseconds. The
        death is decided as of the last look: a stop seen by then excuses it, exactly as if
        it had been seen first. An owner whose threads all sleep pays one look more (no
        wait); a busy one pays at most this delay for a stop-like death, never for a SIGKILL
        or a crash.
        """
        look = SECOND_LOOK_S if self.second_look is None else self.second_look
        deadline = time.monotonic() + look
        while True:
            # The threads first, then every trace: a thread seen not running has finished
            # taking any signal it took before, so its trace is there for the decision
            # that follows (the other order misses one taken in between).
            taking = self.may_be_taking_stop()
            now = time.monotonic()
            decision = self._decide(record, status, now, owner_exiting, owner_gone)
            if decision.verdict is not Verdict.FIRE or not taking or now >= deadline:
                return decision
            # Each look lets the GIL go twice (this sleep, one read of a thread's state):
            # with a CPU-busy main thread each retake can wait a switch interval.
            time.sleep(min(_SECOND_LOOK_POLL_S, max(0.0, deadline - time.monotonic())))

    def expire(
        self, records: list[Watched], *, now: float | None = None, owner_gone: bool = False
    ) -> None:
        """Decide again every deferred death whose time has come."""
        now = time.monotonic() if now is None else now
        for record in records:
            d = record.deferred
            if d is not None and not record.settled and d.until is not None and d.until <= now:
                self.judge(record, record.status, now=now, owner_gone=owner_gone)

    @staticmethod
    def resume(records: list[Watched], at: float) -> None:
        """The owner said at ``at`` that it carries on after its stop: every death a stop
        deferred is decided again at once (by :meth:`expire`, which the host calls next)."""
        for record in records:
            d = record.deferred
            if d is not None and not record.settled and d.until is not None and d.until > at:
                record.deferred = attrs.evolve(d, until=at, reason=d.reason + _DECLARED)

    @staticmethod
    def next_due(records: list[Watched]) -> float | None:
        """When the earliest deferred death is to be decided again (monotonic), if any."""
        dues = [
            r.deferred.until
            for r in records
            if r.deferred is not None and not r.settled and r.deferred.until is not None
        ]
        return min(dues) if dues else None
