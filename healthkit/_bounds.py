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

from healthkit._errors import InvalidEnvValueError

__all__ = ["EnvBound", "EnvValueWarning", "env_seconds", "init_bound_from_env"]


class EnvValueWarning(UserWarning):
    """An environment variable held an unusable value; the default was used instead."""


def env_seconds(name: str, default: float, *, strict: bool = False) -> float:
    """A positive, finite number of seconds from ``$name``, else ``default``."""
    return _env_seconds(name, default, strict)[0]


def _env_seconds(name: str, default: float, strict: bool) -> tuple[float, bool]:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default, False
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if math.isfinite(value) and value > 0:
        return value, True
    message = (
        f"{name}={raw!r} is not a positive number of seconds; "
        f"set it to e.g. {name}={default:g} or unset it"
    )
    if strict:
        raise InvalidEnvValueError(message)
    warnings.warn(f"{message}. Using the default {default:g}s.", EnvValueWarning, stacklevel=3)
    return default, False


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
    """``multiplier x $env_var`` seconds (e.g. 3 x the RPC init timeout), validated."""
    if not (math.isfinite(multiplier) and multiplier > 0):
        raise ValueError(f"multiplier must be a positive number, got {multiplier!r}")
    per_unit, from_env = _env_seconds(env_var, default, strict)
    return EnvBound(per_unit * multiplier, per_unit, multiplier, env_var, from_env)
