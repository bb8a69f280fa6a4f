"""Error types, and the one place where every number healthkit accepts is validated.

Each error means one thing and subclasses the builtin it refines, so callers that already
catch ``ValueError``, ``TypeError`` or ``ProcessLookupError`` keep working. Every check here
names the argument (or environment variable) it was given and says what to change, because
a value accepted and then crashed on (an overflow deep in a watcher thread, an exit code the
OS truncates to 0) is worse than a refusal at the call.
"""

from __future__ import annotations

import math
import signal
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from healthkit._diagnosis import Diagnosis

#: The longest timeout or interval healthkit accepts, in seconds (about 24.8 days).
#: ``poll()``/``epoll_wait()`` take a signed 32-bit count of milliseconds; a longer wait
#: overflows there. Longer values are rejected, not clamped: pass ``None`` to wait without a
#: bound.
MAX_TIMEOUT_S: Final = (2**31 - 1) // 1000
#: The largest pid Linux can ever hand out (``PID_MAX_LIMIT``, 2**22 on 64-bit kernels).
PID_MAX_LIMIT: Final = 1 << 22


class HealthkitError(Exception):
    """Base class of every error healthkit raises on purpose."""


class NoSuchProcessError(HealthkitError, ProcessLookupError):
    """The pid names no process (it never existed, or it has already been reaped)."""


class ProcessNotStartedError(HealthkitError, ValueError):
    """A ``multiprocessing.Process`` was given before ``start()`` was called on it."""


class WatchClosedError(HealthkitError, ValueError):
    """The watch (or watch set) was closed; its file descriptor is gone."""


class InvalidArgumentError(HealthkitError, ValueError):
    """A value given to healthkit cannot be used. ``argument`` names the parameter (or the
    environment variable) it was given as."""

    def __init__(self, message: str, argument: str | None = None) -> None:
        super().__init__(message)
        self.argument = argument


class InvalidArgumentTypeError(InvalidArgumentError, TypeError):
    """A value of the wrong type (also a ``TypeError``)."""


class InvalidTimeoutError(InvalidArgumentError):
    """A timeout or interval is not a number, negative, NaN, infinite, or longer than the OS
    can wait (:data:`MAX_TIMEOUT_S`)."""


class InvalidExitCodeError(InvalidArgumentError):
    """An exit code outside 1..255 (the OS keeps only the low 8 bits: 256 would read as a
    success)."""


class InvalidEnvValueError(InvalidArgumentError):
    """An environment variable holds a value that cannot be used (strict mode only)."""


class InterpreterShutdownError(HealthkitError, RuntimeError):
    """Called while the interpreter is shutting down, when it can no longer work (no new
    threads start, and the hooks that would disarm it have already run)."""


class ProcessDiedError(HealthkitError, RuntimeError):
    """A watched process died; ``diagnosis`` says which one and most likely why."""

    def __init__(self, message: str, diagnosis: Diagnosis) -> None:
        super().__init__(message)
        self.diagnosis = diagnosis


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_timeout(
    value: float | None,
    what: str,
    *,
    allow_none: bool = True,
    positive: bool = False,
    minimum: float = 0.0,
) -> float | None:
    """Validate a timeout or interval in seconds.

    ``None`` (when allowed) means no bound. Otherwise a finite number >= ``minimum`` (> 0
    with ``positive``) and <= :data:`MAX_TIMEOUT_S`. ``what`` names the argument or env var.
    """
    none_hint = "; pass None to wait without a bound" if allow_none else ""
    if value is None:
        if allow_none:
            return None
        raise InvalidTimeoutError(f"{what} must be a number of seconds, not None", what)
    if not _is_number(value):
        raise InvalidTimeoutError(
            f"{what} must be a number of seconds, got {value!r} ({type(value).__name__})", what
        )
    try:
        v = float(value)
    except OverflowError:  # an int too large for a float
        v = math.inf
    if not math.isfinite(v):
        raise InvalidTimeoutError(
            f"{what} must be a finite number of seconds, got {value!r}{none_hint}", what
        )
    low = "> 0" if positive and minimum <= 0 else f">= {minimum:g}"
    if v < minimum or (positive and v <= 0):
        raise InvalidTimeoutError(f"{what} must be {low} seconds, got {value!r}", what)
    if v > MAX_TIMEOUT_S:
        raise InvalidTimeoutError(
            f"{what}={value!r} seconds is longer than the OS can wait "
            f"({MAX_TIMEOUT_S} s, about 24.8 days){none_hint}",
            what,
        )
    return v


def check_bound(value: float, what: str) -> float:
    """A bound that must be a positive number of seconds (a deadline of 0 fails at once)."""
    v = check_timeout(value, what, allow_none=False, positive=True)
    assert v is not None
    return v


def check_exit_code(value: object, what: str = "exit_code") -> int:
    """An exit code a launcher reads as a failure: an int in 1..255."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidExitCodeError(
            f"{what} must be an int in 1..255, got {value!r} ({type(value).__name__})", what
        )
    if not 1 <= value <= 255:
        raise InvalidExitCodeError(
            f"{what} must be in 1..255 (the OS keeps only 8 bits, and 0 means success), "
            f"got {value}",
            what,
        )
    return value


def check_pid(value: object, what: str = "pid") -> int:
    """A pid: an int in 1..PID_MAX_LIMIT. Out of range raises :class:`NoSuchProcessError`
    (no process can have it); a non-int raises :class:`InvalidArgumentTypeError`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentTypeError(
            f"{what} must be an int (a process id), got {value!r} ({type(value).__name__})",
            what,
        )
    if not 1 <= value <= PID_MAX_LIMIT:
        raise NoSuchProcessError(
            f"{what} must be a positive integer of at most {PID_MAX_LIMIT} "
            f"(the largest pid Linux hands out), got {value}"
        )
    return value


def check_signal(value: object, what: str = "signum") -> signal.Signals:
    """A signal number this platform knows (``signal.SIGUSR2`` or its int)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentTypeError(
            f"{what} must be a signal (e.g. signal.SIGUSR2), got {value!r}", what
        )
    try:
        return signal.Signals(value)
    except ValueError:
        raise InvalidArgumentError(f"{what}={value} is not a signal on this system", what) from None


def check_positive_number(value: object, what: str) -> float:
    """A finite number > 0 (a multiplier, a scale)."""
    if not _is_number(value):
        raise InvalidArgumentTypeError(f"{what} must be a number, got {value!r}", what)
    try:
        v = float(value)  # type: ignore[arg-type]
    except OverflowError:
        v = math.inf
    if not (math.isfinite(v) and v > 0):
        raise InvalidArgumentError(f"{what} must be a finite number > 0, got {value!r}", what)
    return v
