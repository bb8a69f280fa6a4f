"""Server-client mode, the client's side: how a loader receives from its servers without
ever waiting on a server that died, a worker that died there, or a lost connection.

Stock GLT 0.2.4's ``RemoteReceivingChannel`` sends fetch RPCs and waits in
``queue.Queue.get()`` for their callbacks to deliver; a callback whose RPC failed (the server
died: ``ECONNRESET``; the fetch outlived the RPC timeout) only logs "broken future of
receiving remote messages" and delivers nothing, so the loader waits forever. Here:

- every fetch answer, error or not, is delivered (a deque plus a wake-up pipe), and the
  consumer waits in one :class:`healthkit.WatchSet` on that pipe and on the lease of every
  server (:class:`healthkit.lowlevel.Lease`, one TCP connection per loader and server): a
  server whose process ends, or whose machine or
  network stops answering, ends the wait at once with :class:`SamplingServerLostError`
  naming it;
- a server's failure record (a worker died or raised there) is raised as
  :class:`RemoteSamplingError`, with the server's and the worker's identity and diagnosis;
- the server answers a fetch that found nothing within ``fetch_wait`` with "not yet", and
  the fetch is sent again: a slow epoch never trips the RPC timeout;
- each request carries the epoch it belongs to, so an answer from an epoch the caller left
  early is dropped instead of being returned in the next one.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import select
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

from healthkit import InvalidArgumentError, WatchSet
from healthkit.lowlevel import Lease
from healthkit_glt._remote_errors import (
    RemoteSamplingError,
    SamplingServerLostError,
    ServerHello,
    describe_server,
)
from healthkit_glt._server import serve_fetch, serve_release

__all__ = ["RemoteFetcher", "ServerLink"]

logger = logging.getLogger("healthkit.glt")

_LEASE_SETTLE_S = 1.0  # after a failed RPC, how long to wait for the lease to tell why


def _rpc_name(server_rank: int) -> str:
    from graphlearn_torch.distributed.dist_context import DistRole
    from graphlearn_torch.distributed.rpc import get_rpc_worker_names

    names = get_rpc_worker_names()[DistRole.SERVER]
    if not 0 <= server_rank < len(names):
        raise InvalidArgumentError(
            f"server_rank {server_rank} is not a server of this job ({len(names)} servers): "
            f"pass worker_options.server_rank in 0..{len(names) - 1}",
            "server_rank",
        )
    return str(names[server_rank])


class ServerLink:
    """One server a loader uses: its RPC name, what it said about itself, and the lease."""

    def __init__(self, rank: int, rpc_name: str, hello: ServerHello, lease: Lease) -> None:
        self.rank = rank
        self.rpc_name = rpc_name
        self.hello = hello
        self.lease = lease

    @classmethod
    def connect(cls, rank: int, hello: ServerHello, *, connection_timeout: float) -> ServerLink:
        """Take a lease on the server that said ``hello``."""
        name = _rpc_name(rank)
        try:
            lease = Lease.open(hello.lease_addresses, hello.lease_server_id,
                               connection_timeout=connection_timeout)  # fmt: skip
        except ConnectionError as e:
            raise RemoteSamplingError(
                f"sampling server {describe_server(hello)}: cannot open a lease connection "
                f"to it ({e}). Pass init_server(lease_host=...) the address this client "
                "reaches the server at, and let TCP through to its lease port.",
                kind="lease", server_rank=rank, host=hello.host, server_pid=hello.pid,
            ) from None  # fmt: skip
        return cls(rank, name, hello, lease)

    def call(self, func: Any, *args: Any, timeout: float | None = None) -> Any:
        """``rpc_async`` to this server (a torch Future)."""
        from torch.distributed import rpc

        if timeout is None:
            return rpc.rpc_async(self.rpc_name, func, args=args)
        return rpc.rpc_async(self.rpc_name, func, args=args, timeout=timeout)

    def lost(self, why: str, rpc_error: str | None = None) -> SamplingServerLostError:
        hello = self.hello
        extra = f"; its RPCs failed with: {rpc_error}" if rpc_error else ""
        return SamplingServerLostError(
            f"sampling server {describe_server(hello)} is gone: {why}{extra}. Its batches "
            "will never come; this loader is unusable. What to do: find why the server "
            "ended (its log, the OOM killer on its machine), then build a new loader.",
            kind="server lost", server_rank=self.rank, host=hello.host, server_pid=hello.pid,
        )  # fmt: skip

    def release(self, producer_id: int, timeout: float) -> None:
        """Tell the server this loader is done with a producer (bounded, best effort: the
        lease's end, right after, releases it anyway)."""
        if self.lease.gone() is not None:
            return
        try:
            self.call(serve_release, producer_id, self.lease.token, timeout=timeout).wait()
        except Exception as e:
            logger.warning("releasing sampling producer %d on server %s: %s", producer_id,
                           describe_server(self.hello), e)  # fmt: skip

    def close(self) -> None:
        self.lease.close()


class RemoteFetcher:
    """GLT's ``RemoteReceivingChannel`` (same prefetch and end-of-epoch rules) that raises
    instead of waiting forever."""

    def __init__(
        self,
        links: Sequence[ServerLink],
        producer_ids: Sequence[int],
        prefetch_size: int,
        fetch_wait_s: float,
    ) -> None:
        self._links = list(links)
        self._producer_ids = list(producer_ids)
        self._prefetch = prefetch_size
        self._fetch_wait_s = fetch_wait_s
        n = len(self._links)
        self._requested = [0] * n
        self._received = [0] * n
        self._ended = [False] * n
        self._epoch = 0
        self._results: deque[tuple[int, int, bool, Any]] = deque()  # epoch, server, ok, value
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._wake_lock = threading.Lock()  # the pipe's fds against close()
        self._closed = False
        self._lost: list[int] = []
        self._set = WatchSet()
        self._set.add_fd(self._wake_r, self._drain_wake)
        for i, link in enumerate(self._links):
            self._set.add_fd(link.lease.fileno(), functools.partial(self._lease_readable, i))
        self.failure: RemoteSamplingError | None = None

    # ------------------------------------------------------------------ callbacks
    def _drain_wake(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self._wake_r, 4096):
                pass
        self._set.wake()  # the consumer's wait returns: an answer is in the deque

    def _lease_readable(self, i: int) -> None:
        if self._links[i].lease.gone() is not None:
            self._set.remove_fd(self._links[i].lease.fileno())
            self._lost.append(i)
            self._set.wake()

    def _done(self, epoch: int, i: int, fut: Any) -> None:
        """A fetch's answer (runs on an RPC thread): queue it and wake the consumer."""
        try:
            item = (epoch, i, True, fut.value())
        except Exception as e:
            item = (epoch, i, False, e)
        self._results.append(item)
        with self._wake_lock:
            if not self._closed:
                with contextlib.suppress(OSError):
                    os.write(self._wake_w, b"x")

    # ------------------------------------------------------------------ consumer
    def reset(self) -> None:
        """A new epoch: answers still in flight for the previous one are dropped."""
        self._epoch += 1
        n = len(self._links)
        self._requested, self._received, self._ended = [0] * n, [0] * n, [False] * n

    def _request_some(self) -> None:
        for i, link in enumerate(self._links):
            if self._ended[i]:
                continue
            for _ in range(self._received[i] + self._prefetch - self._requested[i]):
                fut = link.call(serve_fetch, self._producer_ids[i], self._fetch_wait_s)
                epoch = self._epoch
                fut.add_done_callback(lambda f, e=epoch, i=i: self._done(e, i, f))
                self._requested[i] += 1

    def recv(self) -> Any:
        """The next message, ``StopIteration`` at the end of the epoch, or raise."""
        if self.failure is not None:
            raise self.failure
        try:
            return self._recv()
        except RemoteSamplingError as e:
            self.failure = e
            raise

    def _recv(self) -> Any:
        while True:
            if self._lost:
                i = self._lost[0]
                why = self._links[i].lease.gone() or "its lease ended"
                raise self._links[i].lost(why)
            while self._results:
                # A failure already answered is raised before any batch queued ahead of
                # it (prefetched answers): once the loader knows, no batch is delivered.
                self._raise_queued_failure()
                epoch, i, ok, value = self._results.popleft()
                if epoch != self._epoch:
                    continue  # an answer to an epoch the caller left
                self._received[i] += 1
                if not ok:
                    raise self._rpc_failed(i, value)
                kind, payload = value
                if kind == "msg":
                    return payload
                if kind == "end":
                    self._ended[i] = True
                elif kind == "failed":
                    raise RemoteSamplingError.from_failure(payload)
            if all(self._ended) and self._received == self._requested:
                raise StopIteration
            self._request_some()
            self._set.wait()  # an answer, or a lease's end

    def _raise_queued_failure(self) -> None:
        """Raise the first failure among the answers queued for this epoch, if any."""
        for epoch, i, ok, value in tuple(self._results):  # RPC threads append meanwhile
            if epoch != self._epoch:
                continue
            if not ok:
                raise self._rpc_failed(i, value)
            if value[0] == "failed":
                raise RemoteSamplingError.from_failure(value[1])

    def _rpc_failed(self, i: int, error: BaseException) -> RemoteSamplingError:
        """A fetch RPC failed. When the server died, its lease says so within milliseconds
        of the RPC's own error; give it that long, to name the cause rather than the
        symptom."""
        link = self._links[i]
        text = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
        deadline = time.monotonic() + _LEASE_SETTLE_S
        while (why := link.lease.gone()) is None and time.monotonic() < deadline:
            select.select([link.lease.fileno()], [], [], max(0.0, deadline - time.monotonic()))
        if why is not None:
            return link.lost(why, rpc_error=text)
        hello = link.hello
        return RemoteSamplingError(
            f"sampling server {describe_server(hello)}: a fetch RPC failed ({text}) while "
            "its lease is still open. This loader is unusable; build a new one.",
            kind="rpc error", server_rank=link.rank, host=hello.host, server_pid=hello.pid,
        )  # fmt: skip

    def close(self) -> None:
        """Release the fds (answers still in flight are dropped). Idempotent."""
        with self._wake_lock:
            if self._closed:
                return
            self._closed = True
            self._set.close()
            os.close(self._wake_r)
            os.close(self._wake_w)
        self._results.clear()
