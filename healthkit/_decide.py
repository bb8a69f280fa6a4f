"""The firing rule: one pure function, used by the watcher thread and the sidecar alike."""

from __future__ import annotations

import enum
from typing import Literal

from healthkit._stopsignals import STOP_SIGNALS
from healthkit._watch import ExitStatus

__all__ = ["CleanExitPolicy", "Verdict", "decide", "stop_like"]

CleanExitPolicy = Literal["fail", "warn"]


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
    run_until_disarmed: bool,
    clean_exit_policy: CleanExitPolicy = "fail",
    owner_stopping: bool = False,
) -> Verdict:
    """The whole firing decision (tested branch by branch, in both watcher modes).

    - alive: keep watching;
    - any exit after disarm: ignore (teardown SIGTERMs are not crashes);
    - a stop-like exit while this process is itself being stopped: ignore (a group stop);
    - an unknown exit status: a process declared to run until disarmed has ended, which is
      a failure whatever its code (fire, or warn under the "warn" policy); for a process
      allowed to finish, nothing is known to be wrong, so warn and do not act;
    - non-zero or signal exit while armed: fire;
    - exit 0 while armed: fine for a process allowed to finish; for one declared to run
      until disarmed, an early return leaves its clients waiting, so fire (or warn).
    """
    if status is None:
        return Verdict.KEEP_WATCHING
    if not armed:
        return Verdict.IGNORE
    if owner_stopping and stop_like(status):
        return Verdict.IGNORE
    if status.returncode is None:
        if run_until_disarmed and clean_exit_policy == "fail":
            return Verdict.FIRE
        return Verdict.WARN
    if status.returncode != 0:
        return Verdict.FIRE
    if not run_until_disarmed:
        return Verdict.IGNORE
    return Verdict.FIRE if clean_exit_policy == "fail" else Verdict.WARN
