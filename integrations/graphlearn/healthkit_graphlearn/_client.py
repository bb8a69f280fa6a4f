"""Bound how long a GL client call can block against a dead server.

Why: GL's client retries a failed RPC ``RetryTimes`` times (default 10) with ``sleep(2^k)``
between attempts and a ``Timeout`` (default 60 s) per attempt, inside one native call that
holds the GIL. Against a dead server one ``sampler.get()`` (or ``graph.close()``) blocks
``2^R - 2`` s = 1022 s with the defaults; against a hung one ``R x Timeout`` more. Nothing
else in that process runs meanwhile: no watchdog thread, no signal handler.

Shortening the retries is safe only *after* the first successful call: before the server is
ready, the first calls are expected to fail and the retries are what waits for it (with 1
retry a client started before its server fails at once; GL's own start-up takes ~4 s).
"""

from __future__ import annotations

from types import ModuleType

import attrs

from healthkit import InvalidArgumentTypeError
from healthkit._shared import check_int
from healthkit.lowlevel import MAX_TIMEOUT_S
from healthkit_graphlearn._tzrec.gl_import import import_graphlearn

__all__ = ["ClientRetryBudget", "shorten_client_retries"]


@attrs.frozen
class ClientRetryBudget:
    """What :func:`shorten_client_retries` set, and the worst case it buys."""

    retry_times: int
    timeout: int | None  # per-attempt deadline in seconds; None: left at GL's (60 s default)

    @property
    def dead_server_block_s(self) -> float:
        """Longest a call blocks against a dead server (connection refused at once)."""
        return float(2**self.retry_times - 2)

    @property
    def hung_server_block_s(self) -> float:
        """Longest a call blocks against a live but unresponsive server."""
        per_attempt = 60 if self.timeout is None else self.timeout
        return self.dead_server_block_s + self.retry_times * per_attempt


def shorten_client_retries(
    retry_times: int = 2, timeout: int | None = None, *, gl: ModuleType | None = None
) -> ClientRetryBudget:
    """Set GL's process-wide client retries (and optionally the per-attempt timeout).

    Call it in every client process (each DataLoader worker, or the main process) right after
    its first successful call. ``retry_times=2`` (the default) bounds a call against a dead
    server to 2 s, after which it raises ``graphlearn.python.errors.UnavailableError`` and a
    ``mode="thread"`` watchdog gets the GIL back; 1 fails at the first refused connection.
    The setting also applies to clients that already exist, and is inherited by forked
    children. ``gl``: the graph-learn module in use (default: the imported ``graphlearn``).

    Raises:
        GraphLearnFeatureError: the build has no ``set_retry_times`` (or, with ``timeout``,
            no ``set_timeout``).
    """
    check_int(retry_times, "retry_times", minimum=1)
    if timeout is not None:
        check_int(timeout, "timeout", minimum=1, maximum=MAX_TIMEOUT_S)
    if gl is not None and not isinstance(gl, ModuleType):
        raise InvalidArgumentTypeError(
            f"gl must be the graphlearn module or None, got {gl!r}", "gl"
        )
    gl = import_graphlearn() if gl is None else gl
    needed = ["set_retry_times"] + (["set_timeout"] if timeout is not None else [])
    missing = [n for n in needed if not callable(getattr(gl, n, None))]
    if missing:
        from healthkit_graphlearn._tzrec.features import GraphLearnFeatureError, graphlearn_build

        raise GraphLearnFeatureError(
            f"{graphlearn_build(gl).describe()} has no {' / '.join(missing)}, so its client "
            "retries cannot be shortened: use mode='sidecar' (the default), which does not "
            "need it"
        )
    gl.set_retry_times(retry_times)
    if timeout is not None:
        gl.set_timeout(timeout)
    return ClientRetryBudget(retry_times, timeout)


import healthkit_graphlearn as _package  # noqa: E402

_package._publish(__name__)
