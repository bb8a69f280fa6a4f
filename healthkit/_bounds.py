"""Timeouts read from environment variables, the way producers configure their bounds.

A typo in such a variable must not silently become a hang or a zero timeout: a bad value is
either rejected (strict) or replaced by the default with a warning that names the variable.
Rules built on top (GiGL's init bound is "3 x $GIGL_SAMPLING_RPC_INIT_TIMEOUT_SECONDS") live
with the integration that owns the variable; ``multiplier`` only checks that such a product
still fits what the OS can wait.
"""

from __future__ import annotations

import math
import os
import warnings

from healthkit._errors import (
    MAX_TIMEOUT_S,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    check_bound,
    check_positive_number,
)

__all__ = ["EnvValueWarning", "env_seconds", "read_env_seconds"]


class EnvValueWarning(UserWarning):
    """An environment variable held an unusable value; the default was used instead."""


def env_seconds(
    name: str, default: float, *, strict: bool = False, multiplier: float = 1.0
) -> float:
    """A positive, finite number of seconds from ``$name``, else ``default``.

    ``default`` itself must be such a number (:class:`InvalidArgumentError` otherwise); a
    value whose product with ``multiplier`` is above :data:`MAX_TIMEOUT_S` counts as
    unusable.
    """
    return read_env_seconds(name, default, strict=strict, multiplier=multiplier)[0]


def read_env_seconds(
    name: str, default: float, *, strict: bool = False, multiplier: float = 1.0
) -> tuple[float, bool]:
    """:func:`env_seconds`, and whether the value came from the variable (``True``) or is
    the default (``False``)."""
    multiplier = check_positive_number(multiplier, "multiplier")
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
        raise InvalidArgumentError(message, name)
    warnings.warn(f"{message}. Using the default {default:g}s.", EnvValueWarning, stacklevel=3)
    return float(default), False
