"""Error types. Each one means one thing and subclasses the builtin it refines, so callers
that already catch ``ValueError`` or ``ProcessLookupError`` keep working."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from healthkit._diagnosis import Diagnosis


class HealthkitError(Exception):
    """Base class of every error healthkit raises on purpose."""


class NoSuchProcessError(HealthkitError, ProcessLookupError):
    """The pid names no process (it never existed, or it has already been reaped)."""


class ProcessNotStartedError(HealthkitError, ValueError):
    """A ``multiprocessing.Process`` was given before ``start()`` was called on it."""


class WatchClosedError(HealthkitError, ValueError):
    """The watch (or watch set) was closed; its file descriptor is gone."""


class InvalidTimeoutError(HealthkitError, ValueError):
    """A timeout or interval is negative, NaN or infinite where a finite bound is required."""


class InvalidEnvValueError(HealthkitError, ValueError):
    """An environment variable holds a value that cannot be used (strict mode only)."""


class ProcessDiedError(HealthkitError, RuntimeError):
    """A watched process died; ``diagnosis`` says which one and most likely why."""

    def __init__(self, message: str, diagnosis: Diagnosis) -> None:
        super().__init__(message)
        self.diagnosis = diagnosis


def check_timeout(value: float | None, what: str, *, allow_none: bool = True) -> float | None:
    """Validate a user-supplied timeout: ``None`` (when allowed) or a finite number >= 0."""
    if value is None:
        if allow_none:
            return None
        raise InvalidTimeoutError(f"{what} must be a number of seconds, not None")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidTimeoutError(f"{what} must be a number of seconds, got {value!r}")
    v = float(value)
    if v != v or v in (float("inf"), float("-inf")) or v < 0:
        raise InvalidTimeoutError(
            f"{what} must be a finite number of seconds >= 0, got {value!r}"
            + ("; pass None to wait without a bound" if allow_none else "")
        )
    return v
