"""What a server-client loader raises, and the record a server sends instead of a batch.

Why a record and not an exception across the RPC: torch RPC re-creates a remote exception
from its message string alone (``type(e)(message)``), so every field (server rank, worker
rank, pid, the :class:`healthkit.Diagnosis`) would be lost, and an exception type whose
constructor takes more than a message would not even be re-created. The server returns a
:class:`ServerFailure` as an ordinary value; the client raises from it.
"""

from __future__ import annotations

from typing import Any

import attrs

from healthkit import Diagnosis, HealthkitError

__all__ = ["RemoteSamplingError", "SamplingServerLostError", "ServerFailure", "ServerHello"]


@attrs.frozen
class ServerHello:
    """What a healthkit_glt server says about itself when a loader connects to it."""

    server_rank: int
    host: str
    pid: int
    lease_addresses: tuple[tuple[str, int], ...]
    lease_server_id: str
    version: str


@attrs.frozen
class ServerFailure:
    """Why a server cannot serve a producer (sent to the client as a value).

    ``kind``: ``"worker died"``, ``"sampler raised"``, ``"stalled"`` (every worker alive,
    none sent a batch for the producer's ``stall_timeout`` while a fetch waited),
    ``"init failed"``, ``"shut down"`` (its client's lease ended, or the server is shutting
    down), ``"unknown producer"``, ``"lease"`` (the client's lease was not open),
    ``"not a healthkit_glt server"``.
    """

    kind: str
    message: str
    server_rank: int | None = None
    host: str | None = None
    server_pid: int | None = None
    producer_id: int | None = None
    worker_rank: int | None = None
    pid: int | None = None
    diagnosis: Diagnosis | None = None
    diagnoses: tuple[Diagnosis, ...] = ()
    worker_traceback: str | None = None
    raised_at: float | None = None  # a raising worker's time.time() at its report
    at: float = 0.0  # the server's time.time() when the failure was seen
    stalled_for: float | None = None  # a stall: how long the fetch waited with no batch
    worker_ranks: tuple[int, ...] = ()  # a stall: every live (stalled) worker's rank


class RemoteSamplingError(HealthkitError, RuntimeError):
    """Sampling for this loader failed on a server (server-client mode).

    ``kind`` says how (see :class:`ServerFailure`; ``"server lost"`` for
    :class:`SamplingServerLostError`); ``server_rank``, ``host`` and ``server_pid`` name the
    server; for a worker that died or raised, ``worker_rank``, ``pid`` and (for a death)
    ``diagnosis`` / ``diagnoses`` are the worker's, ``worker_traceback`` its traceback and
    ``raised_at`` its ``time.time()`` when it reported. For a stall (``kind == "stalled"``,
    the producer's ``stall_timeout``), ``worker_ranks`` and ``diagnoses`` are every stalled
    worker's (state, what it is blocked on, stacks), ``worker_rank``, ``pid`` and
    ``diagnosis`` the first one's, and ``stalled_for`` how long the server's fetch waited.
    The loader is unusable afterwards: shut it down and build a new one.
    """

    def __init__(
        self,
        message: str,
        *,
        kind: str,
        server_rank: int | None = None,
        host: str | None = None,
        server_pid: int | None = None,
        worker_rank: int | None = None,
        pid: int | None = None,
        diagnosis: Diagnosis | None = None,
        diagnoses: tuple[Diagnosis, ...] = (),
        worker_traceback: str | None = None,
        raised_at: float | None = None,
        stalled_for: float | None = None,
        worker_ranks: tuple[int, ...] = (),
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.server_rank = server_rank
        self.host = host
        self.server_pid = server_pid
        self.worker_rank = worker_rank
        self.pid = pid
        self.diagnosis = diagnosis
        self.diagnoses = diagnoses
        self.worker_traceback = worker_traceback
        self.raised_at = raised_at
        self.stalled_for = stalled_for
        self.worker_ranks = worker_ranks

    @classmethod
    def from_failure(cls, failure: ServerFailure) -> RemoteSamplingError:
        where = _server(failure.server_rank, failure.host, failure.server_pid)
        return cls(
            f"sampling server {where}: {failure.message}",
            kind=failure.kind,
            server_rank=failure.server_rank,
            host=failure.host,
            server_pid=failure.server_pid,
            worker_rank=failure.worker_rank,
            pid=failure.pid,
            diagnosis=failure.diagnosis,
            diagnoses=failure.diagnoses,
            worker_traceback=failure.worker_traceback,
            raised_at=failure.raised_at,
            stalled_for=failure.stalled_for,
            worker_ranks=failure.worker_ranks,
        )


class SamplingServerLostError(RemoteSamplingError, ConnectionError):
    """A sampling server this loader uses is gone: its process ended (closed connection) or
    its machine or the network stopped answering (keepalive timeout)."""


def _server(rank: int | None, host: str | None, pid: int | None) -> str:
    parts = [f"rank {rank}" if rank is not None else "rank ?"]
    if host or pid:
        parts.append(f"({host or '?'}, pid {pid if pid is not None else '?'})")
    return " ".join(parts)


def describe_server(hello: ServerHello | Any) -> str:
    return _server(hello.server_rank, hello.host, hello.pid)
