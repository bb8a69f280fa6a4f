"""Error types, and the one place where every number healthkit accepts is validated.

Each error means one thing and subclasses the builtin it refines, so callers that already
catch ``ValueError``, ``TypeError`` or ``ProcessLookupError`` keep working. Every check here
names the argument (or environment variable) it was given and says what to change, because
a value accepted and then crashed on (an overflow deep in a watcher thread, an exit code the
OS truncates to 0) is worse than a refusal at the call.
"""

from __future__ import annotations

import math
import os
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from healthkit._diagnose.diagnosis import Diagnosis

#: The longest timeout or interval healthkit accepts, in seconds (about 24.8 days).
#: ``poll()``/``epoll_wait()`` take a signed 32-bit count of milliseconds; a longer wait
#: overflows there. Longer values are rejected, not clamped: pass ``None`` to wait without a
#: bound.
MAX_TIMEOUT_S: Final = (2**31 - 1) // 1000
#: The largest pid Linux can ever hand out (``PID_MAX_LIMIT``, 2**22 on 64-bit kernels).
PID_MAX_LIMIT: Final = 1 << 22


def _rebuild(
    cls: type[BaseException], args: tuple[object, ...], state: dict[str, object]
) -> BaseException:
    """Unpickle an error without calling its ``__init__`` (whose signature may differ from
    ``args``): errors cross process boundaries (a sampling worker's, a server's)."""
    # The C base that allocates it (OSError's for a TimeoutError subclass) must do it; the
    # first __new__ in the MRO that accepts the class is that one.
    error: BaseException | None = None
    for base in cls.__mro__:
        if "__new__" in vars(base):
            try:
                new: Callable[..., BaseException] = base.__new__
                error = new(cls, *args)
                break
            except TypeError:
                continue
    assert error is not None
    error.args = args
    error.__dict__.update(state)
    return error


class HealthkitError(Exception):
    """Base class of every error healthkit raises on purpose."""

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild, (type(self), self.args, dict(self.__dict__)))


class NoSuchProcessError(HealthkitError, ProcessLookupError):
    """The pid names no process (it never existed, or it has already been reaped)."""


class ProcessNotStartedError(HealthkitError, ValueError):
    """A ``multiprocessing.Process`` was given before ``start()`` was called on it."""


class WatchClosedError(HealthkitError, ValueError):
    """The watch (or watch set) was closed; its file descriptor is gone."""


class InvalidArgumentError(HealthkitError, ValueError):
    """A value given to healthkit cannot be used: a bad argument, an out-of-range timeout or
    exit code, an unusable environment value (strict mode). ``argument`` names the parameter
    (or the environment variable) it was given as; the message says what to change."""

    def __init__(self, message: str, argument: str | None = None) -> None:
        super().__init__(message)
        self.argument = argument


class InvalidArgumentTypeError(InvalidArgumentError, TypeError):
    """A value of the wrong type (also a ``TypeError``)."""


class InterpreterShutdownError(HealthkitError, RuntimeError):
    """Called while the interpreter is shutting down, when it can no longer work (no new
    threads start, and the hooks that would disarm it have already run)."""


class UsageError(HealthkitError, RuntimeError):
    """Called where or when it cannot work: from another process or thread than the one it
    needs, on an object already shut down, before the context it needs exists. The message
    says what to do instead."""


class UnsupportedError(HealthkitError, NotImplementedError):
    """This machine (its kernel) or a library build lacks what the call needs; the message
    says what to use instead."""


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
        raise InvalidArgumentError(f"{what} must be a number of seconds, not None", what)
    if not _is_number(value):
        raise InvalidArgumentTypeError(
            f"{what} must be a number of seconds, got {value!r} ({type(value).__name__})", what
        )
    try:
        v = float(value)
    except OverflowError:  # an int too large for a float
        v = math.inf
    if not math.isfinite(v):
        raise InvalidArgumentError(
            f"{what} must be a finite number of seconds, got {value!r}{none_hint}", what
        )
    low = "> 0" if positive and minimum <= 0 else f">= {minimum:g}"
    if v < minimum or (positive and v <= 0):
        raise InvalidArgumentError(f"{what} must be {low} seconds, got {value!r}", what)
    if v > MAX_TIMEOUT_S:
        raise InvalidArgumentError(
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
        raise InvalidArgumentTypeError(
            f"{what} must be an int in 1..255, got {value!r} ({type(value).__name__})", what
        )
    if not 1 <= value <= 255:
        raise InvalidArgumentError(
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


def check_int(
    value: object, what: str, *, minimum: int | None = None, maximum: int | None = None
) -> int:
    """An int (not a bool) within ``minimum..maximum`` (either end optional)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentTypeError(
            f"{what} must be an int, got {value!r} ({type(value).__name__})", what
        )
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        if maximum is None:
            wanted = f">= {minimum}"
        elif minimum is None:
            wanted = f"<= {maximum}"
        else:
            wanted = f"in {minimum}..{maximum}"
        raise InvalidArgumentError(f"{what} must be an int {wanted}, got {value}", what)
    return value


def check_bool(value: object, what: str) -> bool:
    """``True`` or ``False``: a truthy string such as ``"false"`` is a mistake, not a yes."""
    if not isinstance(value, bool):
        raise InvalidArgumentTypeError(f"{what} must be True or False, got {value!r}", what)
    return value


def check_choice(value: object, choices: tuple[str, ...], what: str) -> str:
    """One of ``choices`` (strings)."""
    if not isinstance(value, str) or value not in choices:
        names = ", ".join(repr(c) for c in choices)
        error = InvalidArgumentError if isinstance(value, str) else InvalidArgumentTypeError
        raise error(f"{what} must be one of {names}, got {value!r}", what)
    return value


def check_callable(value: object, what: str) -> None:
    """Something to call (a function, a class, an object with ``__call__``)."""
    if not callable(value):
        raise InvalidArgumentTypeError(
            f"{what} must be callable, got {value!r} ({type(value).__name__})", what
        )


def check_seconds(value: object, what: str) -> float:
    """A number of seconds >= 0 (``0``: that step is skipped); ``None`` is refused."""
    v = check_timeout(value, what, allow_none=False)  # type: ignore[arg-type]
    assert v is not None
    return v


def check_str(value: object, what: str, *, allow_none: bool = False) -> str | None:
    """A str (or ``None`` when allowed)."""
    if value is None and allow_none:
        return None
    if not isinstance(value, str):
        none = " or None" if allow_none else ""
        raise InvalidArgumentTypeError(f"{what} must be a str{none}, got {value!r}", what)
    return value


def check_path(value: object, what: str, *, allow_none: bool = False) -> str | None:
    """A filesystem path: a str or ``os.PathLike`` (returned as a str), or ``None`` when
    allowed."""
    if value is None and allow_none:
        return None
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value or "\0" in value:
        none = " or None" if allow_none else ""
        raise InvalidArgumentTypeError(
            f"{what} must be a path (a non-empty str or os.PathLike){none}, got {value!r}", what
        )
    return value


def path_arg(value: object, what: str) -> str:
    """:func:`check_path` for a path that cannot be ``None``."""
    path = check_path(value, what)
    assert path is not None
    return path
