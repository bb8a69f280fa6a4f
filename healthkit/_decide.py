"""The firing rule: one pure function, the only thing that decides, in the watcher thread and
in the sidecar alike.

Its inputs are everything the verdict depends on, so the whole rule is one table
(``tests/core/test_decision_table.py`` plays every combination):

* how the process ended (``status``), whether the watchdog is ``armed``, what an exit 0 means
  for it (``on_clean_exit``);
* whether healthkit itself ended it (:func:`healthkit.stop`);
* the stop episode of the owner under way at ``now``, if any (``stop``: which signal, when it
  began), ``stop_grace`` (how long an owner may take to end after a stop before a death it
  excused is reported after all), and whether the helper is in the owner's process group;
* whether the owner is exiting (interpreter shutdown) or already gone.
"""

from __future__ import annotations

import enum
import math
from typing import Literal

import attrs

from healthkit._errors import (
    InvalidArgumentError,
    InvalidArgumentTypeError,
    check_bool,
    check_seconds,
)
from healthkit._watch.process import ExitStatus
from healthkit._watch.stopsignals import STOP_SIGNALS, StopEpisode

__all__ = [
    "DEFAULT_STOP_GRACE_S",
    "Decision",
    "OnCleanExit",
    "Verdict",
    "check_on_clean_exit",
    "decide",
    "decide_stall",
    "stop_like",
]

#: How long after a stop signal a death it excused waits before it is reported anyway, if
#: this process is still running and has not said it carries on (``note_stop_survived``).
#: torchrun (``PContext.close(timeout=30)``), Kubernetes (``terminationGracePeriodSeconds``)
#: and SLURM (``KillWait``) give a stopped process 30 s before SIGKILL; torchrun's SIGKILL
#: was measured 30.003-30.020 s after its worker took the SIGTERM (docs/watchdog.md), so a
#: grace of exactly 30 s would race it. 5 s more lets the launcher's SIGKILL come first on a
#: loaded machine: a shutdown of up to 30 s never fires; an owner still running at 35 s was
#: not being stopped by any of them.
DEFAULT_STOP_GRACE_S = 35.0

#: What an exit 0 while armed means for one watched process: "fail" (it was meant to run
#: until disarmed: returning early leaves its clients waiting), "warn" (log it, do not act)
#: or "ignore" (finishing is normal for it).
OnCleanExit = Literal["fail", "warn", "ignore"]


def check_on_clean_exit(value: object) -> OnCleanExit:
    if value not in ("fail", "warn", "ignore"):
        raise InvalidArgumentError(
            f"on_clean_exit must be 'fail', 'warn' or 'ignore', got {value!r}", "on_clean_exit"
        )
    return value


class Verdict(enum.Enum):
    """What the watchdog does about one observation."""

    KEEP_WATCHING = "keep watching"  # still running
    IGNORE = "ignore"  # disarmed, ended by healthkit, part of a stop, or allowed to end
    WARN = "warn"  # log it, do not act (early clean exit under "warn", or an unknown status)
    DEFER = "defer"  # log it now; decide again at ``Decision.until`` (a stop is under way)
    FIRE = "fire"  # run the actions


@attrs.frozen
class Decision:
    """A verdict, why, and for :attr:`Verdict.DEFER` when to decide again."""

    verdict: Verdict
    reason: str
    until: float | None = None


def stop_like(status: ExitStatus) -> bool:
    """Could this ending be the helper's share of a stop?

    Death by SIGTERM, SIGINT or SIGHUP, any exit code (a forked helper inherits the owner's
    Python handlers and ends however they end: ``sys.exit(0)``, a ``KeyboardInterrupt``
    exiting 1, ...), and an unknown status. Deaths by SIGKILL or a crash signal never are.
    """
    if not isinstance(status, ExitStatus):
        raise InvalidArgumentTypeError(
            f"status must be a healthkit.ExitStatus, got {status!r}", "status"
        )
    sig = status.signal
    if sig is not None:
        return sig in STOP_SIGNALS
    return True


def _base(status: ExitStatus, on_clean_exit: OnCleanExit) -> Decision:
    """The verdict when no stop is under way."""
    if status.returncode is None:
        if on_clean_exit == "fail":
            return Decision(Verdict.FIRE, "it ended, with an unknown status")
        return Decision(Verdict.WARN, "its exit status is unknown, so this is not acted on")
    if status.returncode != 0:
        return Decision(Verdict.FIRE, "abnormal exit")
    if on_clean_exit == "fail":
        return Decision(Verdict.FIRE, "it returned early")
    if on_clean_exit == "warn":
        return Decision(Verdict.WARN, "although it was declared to run until disarmed")
    return Decision(Verdict.IGNORE, "finishing is normal for it")


def decide(
    status: ExitStatus | None,
    *,
    armed: bool,
    on_clean_exit: OnCleanExit = "fail",
    stopped_by_healthkit: bool = False,
    stop: StopEpisode | None = None,
    stop_grace: float = DEFAULT_STOP_GRACE_S,
    now: float = 0.0,
    same_group: bool = True,
    owner_exiting: bool = False,
    owner_gone: bool = False,
) -> Decision:
    """The whole firing decision for one observation of one watched process.

    - alive: keep watching;
    - disarmed, ended by :func:`healthkit.stop`, or its owner already gone (nothing left to
      protect; the owner's own end is what the launcher reports): ignore;
    - an exit that is allowed (exit 0 under ``on_clean_exit="ignore"``): ignore;
    - SIGKILL or a crash signal: fire at once, stop or not;
    - a stop-like ending while a stop episode of the owner is under way (``stop`` began less
      than ``stop_grace`` before ``now``): ignore if the owner is exiting; otherwise defer
      until the episode ends (``stop.began + stop_grace``), when it is decided again without
      the stop, so a death excused by a stop the owner survived is reported, not dropped. A
      helper in another process group did not get the group's signal: it is excused only as
      a possible casualty of the owner's own stop (its cleanup, or a launcher signalling each
      process), on the same terms;
    - otherwise: a non-zero or signal exit fires; an exit 0 follows ``on_clean_exit``; an
      unknown status fires under ``"fail"`` (it ended, whatever its code) and warns otherwise.
    """
    if status is not None and not isinstance(status, ExitStatus):
        raise InvalidArgumentTypeError(
            f"status must be a healthkit.ExitStatus or None, got {status!r}", "status"
        )
    for what, flag in (
        ("armed", armed),
        ("stopped_by_healthkit", stopped_by_healthkit),
        ("same_group", same_group),
        ("owner_exiting", owner_exiting),
        ("owner_gone", owner_gone),
    ):
        check_bool(flag, what)
    check_on_clean_exit(on_clean_exit)
    if stop is not None and not isinstance(stop, StopEpisode):
        raise InvalidArgumentTypeError(
            f"stop must be a StopEpisode (healthkit.lowlevel.current_episode) or None, got "
            f"{stop!r}",
            "stop",
        )
    check_seconds(stop_grace, "stop_grace")
    if isinstance(now, bool) or not isinstance(now, (int, float)) or not math.isfinite(now):
        raise InvalidArgumentTypeError(f"now must be a finite number, got {now!r}", "now")
    if status is None:
        return Decision(Verdict.KEEP_WATCHING, "still running")
    if not armed:
        return Decision(Verdict.IGNORE, "the watchdog is disarmed")
    if stopped_by_healthkit:
        return Decision(Verdict.IGNORE, "healthkit.stop() ended it")
    if owner_gone:
        return Decision(Verdict.IGNORE, "its owner is gone")
    base = _base(status, on_clean_exit)
    if base.verdict is Verdict.IGNORE or not stop_like(status):
        return base
    if stop is None or not (stop.began <= now < stop.began + stop_grace):
        return base
    what = (
        "its share of this process's stop"
        if same_group
        else "a possible casualty of this process's stop (it is in another process group, "
        "so the group's signal did not reach it)"
    )
    if owner_exiting:
        return Decision(
            Verdict.IGNORE, f"{what} ({stop.describe(now)}), and this process is exiting"
        )
    return Decision(
        Verdict.DEFER,
        f"taken as {what} ({stop.describe(now)}); reported if this process is still running "
        f"{stop.began + stop_grace - now:.1f}s from now",
        until=stop.began + stop_grace,
    )


def decide_stall(
    quiet_for: float | None,
    *,
    stall_timeout: float,
    armed: bool,
    stop: StopEpisode | None = None,
    stop_grace: float = DEFAULT_STOP_GRACE_S,
    now: float = 0.0,
    owner_exiting: bool = False,
) -> Decision:
    """The firing decision for one look at a progress watch (the twin of :func:`decide` for a
    helper that lives but does not progress).

    - ``quiet_for`` ``None`` (nobody expects progress: idle between epochs, a checkpoint):
      keep watching, with no deadline;
    - disarmed, or this process exiting: ignore;
    - no progress for less than ``stall_timeout``: keep watching until it would be;
    - a stop of this process under way (``stop`` began less than ``stop_grace`` before
      ``now``): a helper that stopped working because it is being stopped is not stalled;
      decided again when the episode ends (``until``), and reported then if still stalled;
    - otherwise: fire.
    """
    for what, flag in (("armed", armed), ("owner_exiting", owner_exiting)):
        check_bool(flag, what)
    check_seconds(stall_timeout, "stall_timeout")
    check_seconds(stop_grace, "stop_grace")
    if quiet_for is not None and (
        isinstance(quiet_for, bool)
        or not isinstance(quiet_for, (int, float))
        or not math.isfinite(quiet_for)
        or quiet_for < 0
    ):
        # Not check_seconds: a wait may honestly last longer than any timeout the OS takes.
        raise InvalidArgumentTypeError(
            f"quiet_for must be a finite number of seconds >= 0 or None, got {quiet_for!r}",
            "quiet_for",
        )
    if stop is not None and not isinstance(stop, StopEpisode):
        raise InvalidArgumentTypeError(
            f"stop must be a StopEpisode or None, got {stop!r}", "stop"
        )
    if isinstance(now, bool) or not isinstance(now, (int, float)) or not math.isfinite(now):
        raise InvalidArgumentTypeError(f"now must be a finite number, got {now!r}", "now")
    if not armed:
        return Decision(Verdict.IGNORE, "the watchdog is disarmed")
    if quiet_for is None:
        return Decision(Verdict.KEEP_WATCHING, "no progress is expected (idle)")
    if owner_exiting:
        return Decision(Verdict.IGNORE, "this process is exiting")
    if quiet_for < stall_timeout:
        return Decision(
            Verdict.KEEP_WATCHING,
            "progressing",
            until=now + (stall_timeout - quiet_for),
        )
    if stop is not None and stop.began <= now < stop.began + stop_grace:
        return Decision(
            Verdict.DEFER,
            f"no progress while this process is being stopped ({stop.describe(now)}); "
            f"reported if it is still stalled {stop.began + stop_grace - now:.1f}s from now",
            until=stop.began + stop_grace,
        )
    return Decision(Verdict.FIRE, f"no progress for {quiet_for:.1f} s while expected")
