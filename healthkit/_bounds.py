"""Timeouts read from environment variables, the way producers configure their bounds.

GiGL's init bound is "3 x the RPC init timeout from GIGL_SAMPLING_RPC_INIT_TIMEOUT_SECONDS".
A typo in such a variable must not silently become a hang or a zero timeout: a bad value is
either rejected (strict) or replaced by the default with a warning that names the variable.
"""

from __future__ import annotations

import math
import os
import warnings

import attrs

from healthkit._errors import (
    MAX_TIMEOUT_S,
    InvalidArgumentTypeError,
    InvalidEnvValueError,
    check_bound,
    check_positive_number,
)

__all__ = ["EnvBound", "EnvValueWarning", "env_seconds", "init_bound_from_env"]


class EnvValueWarning(UserWarning):
    """An environment variable held an unusable value; the default was used instead."""


def env_seconds(name: str, default: float, *, strict: bool = False) -> float:
    """A positive, finite number of seconds from ``$name``, else ``default``.

    ``default`` itself must be such a number (:class:`InvalidTimeoutError` otherwise); a
    value in the variable above :data:`~healthkit.MAX_TIMEOUT_S` counts as unusable.
    """
    return _env_seconds(name, default, strict)[0]


def _env_seconds(
    name: str, default: float, strict: bool, multiplier: float = 1.0
) -> tuple[float, bool]:
    if not isinstance(name, str) or not name:
        raise InvalidArgumentTypeError(
            f"the variable name must be a non-empty str, got {name!r}", "name"
        )
    check_bound(default, f"default of ${name}")
    check_bound(default * multiplier, f"default of ${name} x multiplier {multiplier:g}")
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return float(default), False
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if math.isfinite(value) and value > 0 and value * multiplier <= MAX_TIMEOUT_S:
        return value, True
    too_long = math.isfinite(value) and value > 0
    message = (
        f"{name}={raw!r} is "
        + (
            f"too long: {value * multiplier:g}s is more than the OS can wait "
            f"({MAX_TIMEOUT_S}s, about 24.8 days)"
            if too_long
            else "not a positive number of seconds"
        )
        + f"; set it to e.g. {name}={default:g} or unset it"
    )
    if strict:
        raise InvalidEnvValueError(message, name)
    warnings.warn(f"{message}. Using the default {default:g}s.", EnvValueWarning, stacklevel=3)
    return float(default), False


@attrs.frozen
class EnvBound:
    """A bound derived from an env var: ``seconds = multiplier x per_unit``."""

    seconds: float
    per_unit: float
    multiplier: float
    env_var: str
    from_env: bool

    def describe(self) -> str:
        src = f"${self.env_var}" if self.from_env else f"the default of ${self.env_var}"
        return f"{self.seconds:g}s = {self.multiplier:g} x {self.per_unit:g}s ({src})"


def init_bound_from_env(
    env_var: str, default: float, multiplier: float = 3.0, *, strict: bool = False
) -> EnvBound:
    """``multiplier x $env_var`` seconds (e.g. 3 x the RPC init timeout), validated.

    The product must fit what the OS can wait: a variable whose product is too long is
    treated like any other unusable value (the default with a warning, or
    :class:`InvalidEnvValueError` when strict).
    """
    multiplier = check_positive_number(multiplier, "multiplier")
    per_unit, from_env = _env_seconds(env_var, default, strict, multiplier)
    return EnvBound(per_unit * multiplier, per_unit, multiplier, env_var, from_env)
