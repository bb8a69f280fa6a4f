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
import re
import warnings

from healthkit._errors import (
    MAX_TIMEOUT_S,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    check_bool,
    check_bound,
    check_positive_number,
)

__all__ = ["ENV_SECONDS_MIN", "EnvValueWarning", "env_seconds", "read_env_seconds"]

#: The shortest timeout an environment variable may set, in seconds. Below a millisecond a
#: bound is a typo, not a setting (``1e-320`` would fail every wait at once).
ENV_SECONDS_MIN = 0.001
#: What an environment value may look like: ASCII digits with an optional fraction (``30``,
#: ``2.5``, ``.5``). Not an exponent, ``_`` separators, ``inf``/``nan`` or digits of other
#: scripts, all of which ``float()`` would take.
_PLAIN_DECIMAL = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)", re.ASCII)


class EnvValueWarning(UserWarning):
    """An environment variable held an unusable value; the default was used instead."""


def env_seconds(
    name: str, default: float, *, strict: bool = False, multiplier: float = 1.0
) -> float:
    """A number of seconds from ``$name`` (a plain decimal such as ``30`` or ``2.5``, at least
    :data:`ENV_SECONDS_MIN`), else ``default``.

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
    check_bool(strict, "strict")
    if not isinstance(name, str) or not name:
        raise InvalidArgumentTypeError(
            f"the variable name must be a non-empty str, got {name!r}", "name"
        )
    check_bound(default, f"default of ${name}")
    check_bound(default * multiplier, f"default of ${name} x multiplier {multiplier:g}")
    raw = os.environ.get(name)
    if strict and raw is not None and (raw == "" or raw != raw.strip()):
        # Strict means the value is used exactly as written: an empty value is not "unset"
        # (a script that meant to set it lost its value) and spaces are not part of one.
        what = "empty" if raw == "" else "padded with spaces"
        raise InvalidArgumentError(
            f"{name}={raw!r} is {what}: set it to a plain decimal number of seconds (like "
            f"{name}={default:g}) or unset it",
            name,
        )
    if raw is None or raw.strip() == "":
        return float(default), False
    text = raw.strip()
    value = float(text) if _PLAIN_DECIMAL.fullmatch(text) else math.nan
    if value >= ENV_SECONDS_MIN and value * multiplier <= MAX_TIMEOUT_S:
        return value, True
    too_long = math.isfinite(value) and value >= ENV_SECONDS_MIN
    message = (
        f"{name}={raw!r} is "
        + (
            f"too long: {value * multiplier:g}s is more than the OS can wait "
            f"({MAX_TIMEOUT_S}s, about 24.8 days)"
            if too_long
            else f"not a plain decimal number of seconds >= {ENV_SECONDS_MIN:g} (like 30 or 2.5)"
        )
        + f"; set it to e.g. {name}={default:g} or unset it"
    )
    if strict:
        raise InvalidArgumentError(message, name)
    warnings.warn(f"{message}. Using the default {default:g}s.", EnvValueWarning, stacklevel=3)
    return float(default), False
