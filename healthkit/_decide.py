"""The firing rule: one pure function, used by the watcher thread and the sidecar alike."""

from __future__ import annotations

import enum
from typing import Literal

from healthkit._errors import InvalidArgumentError
from healthkit._stopsignals import STOP_SIGNALS
from healthkit._watch import ExitStatus

__all__ = ["OnCleanExit", "Verdict", "check_on_clean_exit", "decide", "stop_like"]

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
    IGNORE = "ignore"  # disarmed, part of a stop, or an exit that is allowed
    WARN = "warn"  # log it, do not act (early clean exit under "warn", or an unknown status)
    FIRE = "fire"  # run the actions


def stop_like(status: ExitStatus) -> bool:
    """Could this ending be the helper's share of a stop signal sent to its whole group?

    Death by SIGTERM, SIGINT or SIGHUP, and any exit code: a forked helper inherits the
    owner's Python handlers and ends however they end (``sys.exit(0)``, a
    ``KeyboardInterrupt`` exiting 1, ...). Deaths by SIGKILL or a crash signal never are.
    """
    sig = status.signal
    if sig is not None:
        return sig in STOP_SIGNALS
    return True


def decide(
    status: ExitStatus | None,
    *,
    armed: bool,
    on_clean_exit: OnCleanExit = "fail",
    owner_stopping: bool = False,
) -> Verdict:
    """The whole firing decision (tested branch by branch, in both watcher modes).

    - alive: keep watching;
    - any exit after disarm: ignore (teardown SIGTERMs are not crashes);
    - a stop-like exit while this process is itself being stopped: ignore (a group stop);
    - an unknown exit status: a process meant to run until disarmed (``"fail"``) has ended,
      which is a failure whatever its code, so fire; otherwise nothing is known to be
      wrong, so warn and do not act;
    - non-zero or signal exit while armed: fire;
    - exit 0 while armed: ``on_clean_exit`` says (fire, warn or ignore).
    """
    if status is None:
        return Verdict.KEEP_WATCHING
    if not armed:
        return Verdict.IGNORE
    if owner_stopping and stop_like(status):
        return Verdict.IGNORE
    if status.returncode is None:
        return Verdict.FIRE if on_clean_exit == "fail" else Verdict.WARN
    if status.returncode != 0:
        return Verdict.FIRE
    return {"fail": Verdict.FIRE, "warn": Verdict.WARN, "ignore": Verdict.IGNORE}[on_clean_exit]
