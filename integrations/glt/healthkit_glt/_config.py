"""The producer's time bounds: arguments first, then environment variables, then defaults.

Why two RPC timeouts: a sampling worker's bring-up (spawn, torch import, ``init_rpc`` gather
across every worker of every rank) can legitimately take minutes on a cold, loaded cluster,
so it gets a generous request timeout. Once every worker is past the init barrier, the same
generous value would let a stuck steady-state sampling RPC hide for minutes, so the worker
narrows it (GiGL's design). The init barrier's bound is ``k x`` the bring-up timeout, because
the barrier covers the whole bring-up (several RPC round trips plus process start-up), not
one request.

A bad environment value (``abc``, ``-1``, ``nan``, ``0``) never becomes a hang or a zero
timeout: it is replaced by the default with an :class:`healthkit.lowlevel.EnvValueWarning`
that names the variable (or rejected with :class:`healthkit.InvalidArgumentError` in strict
mode).
"""

from __future__ import annotations

import attrs

from healthkit._shared import check_bool, check_bound
from healthkit.lowlevel import env_seconds, read_env_seconds

__all__ = [
    "CONNECTION_TIMEOUT_ENV",
    "DEFAULT_INIT_TIMEOUT_MULTIPLIER",
    "DEFAULT_RPC_INIT_TIMEOUT_S",
    "RPC_INIT_TIMEOUT_ENV",
    "STEADY_STATE_RPC_TIMEOUT_ENV",
    "TimeoutPlan",
    "resolve_timeouts",
]

RPC_INIT_TIMEOUT_ENV = "HEALTHKIT_GLT_RPC_INIT_TIMEOUT_SECONDS"
"""Bring-up RPC request timeout of the sampling workers, in seconds (default 600, as GiGL)."""

STEADY_STATE_RPC_TIMEOUT_ENV = "HEALTHKIT_GLT_STEADY_STATE_RPC_TIMEOUT_SECONDS"
"""Steady-state RPC request timeout, set right after the init barrier (default: the
``rpc_timeout`` of the worker options, i.e. what GLT itself would use)."""

CONNECTION_TIMEOUT_ENV = "HEALTHKIT_GLT_CONNECTION_TIMEOUT_SECONDS"
"""How long a peer's machine or network may stay silent before its lease ends (default 10)."""

DEFAULT_CONNECTION_TIMEOUT_S = 10.0
DEFAULT_RPC_INIT_TIMEOUT_S = 600.0
DEFAULT_INIT_TIMEOUT_MULTIPLIER = 3.0  # k: init barrier bound = k x bring-up RPC timeout


def connection_timeout(value: float | None, *, strict: bool = False) -> float:
    """The leases' bound (:class:`healthkit.lowlevel.LeaseServer`): the argument, else
    ``$HEALTHKIT_GLT_CONNECTION_TIMEOUT_SECONDS``, else 10 s; at least 2 s (the keepalive
    counts in whole seconds), raised to it rather than refused."""
    if value is not None:
        seconds = check_bound(value, "connection_timeout")
    else:
        seconds = env_seconds(CONNECTION_TIMEOUT_ENV, DEFAULT_CONNECTION_TIMEOUT_S, strict=strict)
    return max(2.0, float(seconds))


def _positive(value: float, what: str) -> float:
    return check_bound(value, what)


@attrs.frozen
class TimeoutPlan:
    """The resolved bounds of one producer (what the workers and the barrier use)."""

    rpc_init_timeout: float
    steady_state_rpc_timeout: float
    init_timeout_multiplier: float
    init_bound: float  # seconds: k x the bring-up RPC timeout
    rpc_init_source: str
    steady_state_source: str

    @property
    def init_bound_seconds(self) -> float:
        return self.init_bound

    @property
    def init_hint(self) -> str:
        """What to change when the init bound is too short for a healthy bring-up (the
        barrier's timeout message says it once)."""
        knob = (
            "pass a larger rpc_init_timeout="
            if self.rpc_init_source.startswith("argument")
            else f"raise ${RPC_INIT_TIMEOUT_ENV} (or pass rpc_init_timeout=)"
        )
        return f"{knob}: the bound is {self.init_timeout_multiplier:g} x the bring-up RPC timeout"

    def describe(self) -> str:
        return (
            f"init barrier bound {self.init_bound_seconds:g}s = "
            f"{self.init_timeout_multiplier:g} x bring-up RPC timeout "
            f"{self.rpc_init_timeout:g}s ({self.rpc_init_source}); steady-state RPC timeout "
            f"{self.steady_state_rpc_timeout:g}s ({self.steady_state_source})"
        )


def resolve_timeouts(
    *,
    rpc_init_timeout: float | None,
    steady_state_rpc_timeout: float | None,
    init_timeout_multiplier: float,
    options_rpc_timeout: float,
    strict_env: bool = False,
) -> TimeoutPlan:
    """Resolve the bring-up timeout, the steady-state timeout and the barrier bound.

    Precedence, each: explicit argument > environment variable > default. The default
    steady-state timeout is ``options_rpc_timeout`` (``worker_options.rpc_timeout``), so a
    GLT user's existing request timeout keeps its meaning in steady state.
    """
    check_bool(strict_env, "strict_env")
    k = _positive(init_timeout_multiplier, "init_timeout_multiplier")
    if rpc_init_timeout is not None:
        init_s = _positive(rpc_init_timeout, "rpc_init_timeout")
        init_src = "argument rpc_init_timeout"
    else:
        # The rule "k x $HEALTHKIT_GLT_RPC_INIT_TIMEOUT_SECONDS" is this integration's own; the
        # core only checks that the product still fits what the OS can wait.
        init_s, from_env = read_env_seconds(
            RPC_INIT_TIMEOUT_ENV, DEFAULT_RPC_INIT_TIMEOUT_S, strict=strict_env, multiplier=k
        )
        init_src = f"${RPC_INIT_TIMEOUT_ENV}" if from_env else "default"
    bound = check_bound(init_s * k, "init barrier bound (rpc init timeout x multiplier)")
    if steady_state_rpc_timeout is not None:
        steady_s = _positive(steady_state_rpc_timeout, "steady_state_rpc_timeout")
        steady_src = "argument steady_state_rpc_timeout"
    else:
        fallback = _positive(options_rpc_timeout, "worker_options.rpc_timeout")
        steady_s = env_seconds(STEADY_STATE_RPC_TIMEOUT_ENV, fallback, strict=strict_env)
        steady_src = (
            f"${STEADY_STATE_RPC_TIMEOUT_ENV}"
            if steady_s != fallback
            else "worker_options.rpc_timeout"
        )
    return TimeoutPlan(init_s, steady_s, k, bound, init_src, steady_src)
