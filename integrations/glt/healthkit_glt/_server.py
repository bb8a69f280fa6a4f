"""Server-client mode, the server's side: GLT's ``DistServer`` whose sampling producers are
:class:`healthkit_glt.DistSamplingProducer` and whose clients hold leases.

Where stock GLT 0.2.4's server hangs or leaks, and what this one does instead:

- a sampling worker that dies (OOM, crash) never completes its epoch, so GLT's
  ``fetch_one_sampled_message`` loops ``recv(timeout_ms=500)`` until the client's RPC
  times out (180 s by default), and the client's ``RemoteReceivingChannel`` logs that and
  waits forever; a dead worker that had claimed a ring block leaves the server's RPC
  thread blocked in C++ for good. Here the fetch receives through the producer, which ends
  the wait within milliseconds of the death and diagnoses it; the fetch then returns a
  :class:`ServerFailure` (server rank, host, worker rank, pid, diagnosis) to every pending
  and later fetch of that producer, and the client raises it;
- a sampler that raises in a live worker: GLT drops the error and the epoch never ends.
  Here the producer's error report becomes the same kind of failure, with the traceback;
- a client that dies leaves its producer's workers running on the server for good. Here
  every client holds a lease (:class:`healthkit.lowlevel.LeaseServer`: one TCP connection
  per client that ends when the client's process does, or when its machine goes silent)
  and a producer is shut down when its last client's lease ends;
- a fetch for a producer that is merely slow waits up to the client's ``fetch_wait``, then
  answers "not yet" and the client asks again: a slow epoch never trips the RPC timeout.

The fetch, epoch and lease functions are called by :class:`healthkit_glt.DistNeighborLoader`
with :class:`RemoteDistSamplingWorkerOptions`. A stock GLT client calls GLT's own
``DistServer`` methods, which this class inherits: it is served as stock GLT serves it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from typing import Any

from graphlearn_torch.channel import QueueTimeoutError, ShmChannel
from graphlearn_torch.distributed import DistServer as _GLTDistServer
from graphlearn_torch.sampler import RemoteSamplerInput

from healthkit import BarrierBrokenError, InvalidArgumentTypeError
from healthkit._shared import check_bool, check_bound, check_int, check_seconds
from healthkit.lowlevel import EndingClassifier, LeaseServer
from healthkit_glt._adapter.server import ProducerPools, install_server, set_server_context
from healthkit_glt._config import connection_timeout as resolve_connection_timeout
from healthkit_glt._producer import (
    DistSamplingProducer,
    SamplingError,
    SamplingStalledError,
    SamplingStoppedError,
    SamplingWorkerDiedError,
    check_producer_kwargs,
    drop_frames,
)
from healthkit_glt._remote_errors import ServerFailure, ServerHello
from healthkit_glt._version import __version__

__all__ = ["DistServer", "init_server", "wait_and_shutdown_server"]

logger = logging.getLogger("healthkit.glt")

_MAX_FETCH_WAIT_S = 60.0
LEASE_END_GRACE_S = 0.0  # a client that is gone: SIGTERM its producers' workers at once


class DistServer(_GLTDistServer):  # type: ignore[misc]
    """GLT's ``DistServer`` with healthkit_glt producers and client leases.

    ``producer_kwargs`` are the defaults for every :class:`DistSamplingProducer` this
    server builds (``rpc_init_timeout``, ``steady_state_rpc_timeout``, ``sampler_factory``,
    ...); a client's own producer arguments override them. ``connection_timeout``: how long
    a client's machine may stay silent before its lease ends (see
    :class:`healthkit.lowlevel.LeaseServer`). ``lease_host``: the address clients reach this
    server at (default: this host's name and the address it resolves to, the way torch's
    TensorPipe agent picks its own); ``lease_bind``: the interface to listen on (default all).
    """

    def __init__(
        self,
        dataset: Any,
        *,
        producer_kwargs: dict[str, Any] | None = None,
        connection_timeout: float | None = None,
        lease_host: str | None = None,
        lease_bind: str = "",
    ) -> None:
        # Checked before GLT's server exists: a bad producer default would otherwise fail
        # on the first client's request, a bad connection_timeout at the first lease.
        timeout_s = _check_server_arguments(
            producer_kwargs or {}, connection_timeout, lease_host, lease_bind
        )
        super().__init__(dataset)
        self._pools = ProducerPools(self)  # GLT's, which its inherited methods read
        from graphlearn_torch.distributed.dist_context import get_context

        ctx = get_context()
        self.server_rank: int = ctx.rank if ctx is not None else 0
        self.host = socket.gethostname()
        self.producer_kwargs = dict(producer_kwargs or {})
        self._owners: dict[int, set[str]] = {}  # producer id -> lease tokens
        self._fetch_locks: dict[int, threading.Lock] = {}
        self._failures: dict[int, ServerFailure] = {}
        self._leases = LeaseServer(
            self._lease_ended,
            bind_host=lease_bind,
            connection_timeout=timeout_s,
        )
        self._lease_host = lease_host
        self._released: list[threading.Thread] = []
        # One judge of the sampling workers' deaths for every producer of this server: built
        # here, in the main thread init_server runs in, it notices this process's stop
        # signals (a launcher's group SIGTERM) from now on; the producers are built later,
        # in RPC threads, where that cannot start.
        self._endings = EndingClassifier("sampling workers", log=logger)

    # ------------------------------------------------------------------ identity
    def hello(self) -> ServerHello:
        addresses: list[tuple[str, int]] = []
        names = [self._lease_host] if self._lease_host else []
        names.append(self.host)
        with contextlib.suppress(OSError):
            names.append(socket.gethostbyname(self.host))
        names.append("127.0.0.1")  # one machine; the server id tells another server apart
        for name in names:
            if name and (name, self._leases.port) not in addresses:
                addresses.append((name, self._leases.port))
        return ServerHello(
            self.server_rank, self.host, os.getpid(), tuple(addresses), self._leases.server_id,
            __version__,
        )  # fmt: skip

    def _failure(self, kind: str, message: str, **fields: Any) -> ServerFailure:
        return ServerFailure(
            kind, message, server_rank=self.server_rank, host=self.host,
            server_pid=os.getpid(), at=time.time(), **fields,
        )  # fmt: skip

    # ------------------------------------------------------------------ producers
    def create_leased_producer(
        self,
        token: str,
        sampler_input: Any,
        sampling_config: Any,
        worker_options: Any,
        producer_kwargs: dict[str, Any],
    ) -> int | ServerFailure:
        """GLT's ``create_sampling_producer`` with our producer, owned by lease ``token``.

        Producers are shared by ``worker_options.worker_key``, as in GLT; a failed one is
        not shared any more (a new client of that key gets a new producer).
        """
        if isinstance(sampler_input, RemoteSamplerInput):
            sampler_input = sampler_input.to_local_sampler_input(dataset=self.dataset)
        with self._pools.lock:
            # Checked under the lock that the lease's end also takes: a lease that ends
            # from here on finds this producer among its own and shuts it down.
            if not self._leases.is_live(token):
                return self._failure(
                    "lease", "the loader's lease connection to this server is not open "
                    "(the loader is shutting down, or its connection failed)",
                )  # fmt: skip
            key = worker_options.worker_key
            producer_id = self._pools.shared_id(key)
            if producer_id is not None and producer_id not in self._failures:
                self._owners[producer_id].add(token)
                return producer_id
            producer_id = self._pools.new_id()
            buffer = ShmChannel(worker_options.buffer_capacity, worker_options.buffer_size)
            producer = DistSamplingProducer(
                self.dataset, sampler_input, sampling_config, worker_options, buffer,
                **{**self.producer_kwargs, **producer_kwargs},
            )  # fmt: skip
            producer._use_endings(self._endings)
            try:
                producer.init()  # torn down by itself when it raises
            except Exception as e:
                logger.error("sampling producer %d (worker key %r) failed to start: %s",
                             producer_id, key, e)  # fmt: skip
                dead = e.dead if isinstance(e, BarrierBrokenError) else ()
                return self._failure(
                    "init failed", f"its sampling workers failed to start:\n{e}",
                    producer_id=producer_id,
                    diagnoses=tuple(p.diagnosis for p in dead if p.diagnosis is not None),
                )  # fmt: skip
            self._pools.add(key, producer_id, producer, buffer)
            self._owners[producer_id] = {token}
            self._fetch_locks[producer_id] = threading.Lock()
        logger.info("sampling producer %d (worker key %r, workers %s) started for %s",
                    producer_id, key, [w.pid for w in producer.workers],
                    self._leases.peer(token))  # fmt: skip
        return producer_id

    def start_epoch(self, producer_id: int, epoch: int) -> ServerFailure | None:
        """GLT's ``start_new_epoch_sampling``, answering a failed producer with its failure."""
        with self._pools.lock:
            if (failure := self._failures.get(producer_id)) is not None:
                return failure
            producer = self._pools.get(producer_id)
            if producer is None:
                return self._unknown(producer_id)
            if self._pools.new_epoch(producer_id, epoch):
                try:
                    producer.produce_all()
                except (SamplingWorkerDiedError, SamplingError, SamplingStalledError) as e:
                    return self._record(producer_id, e)
                except SamplingStoppedError:  # this server is being stopped
                    return self._gone(producer_id)
        return None

    def fetch(self, producer_id: int, wait_s: float) -> tuple[str, Any]:
        """The next message of a producer, as ``("msg", message)``; ``("end", None)`` at the
        end of its epoch; ``("wait", None)`` when nothing came within ``wait_s`` (ask
        again); ``("failed", ServerFailure)`` once the producer failed, for every fetch.

        One fetch receives at a time per producer (the ring has one reader); the others
        wait for it, and see its failure at once if it failed.
        """
        lock = self._fetch_locks.get(producer_id)
        if lock is None:
            return "failed", self._failures.get(producer_id) or self._unknown(producer_id)
        wait_s = min(max(wait_s, 0.01), _MAX_FETCH_WAIT_S)
        deadline = time.monotonic() + wait_s
        if not lock.acquire(timeout=wait_s):
            return "wait", None
        try:
            if (failure := self._failures.get(producer_id)) is not None:
                return "failed", failure
            producer = self._pools.get(producer_id)
            if producer is None:
                return "failed", self._unknown(producer_id)
            try:
                while True:
                    # As GLT: the epoch is over once every worker finished and the ring
                    # is empty (a worker counts itself finished after its last send).
                    if producer.is_all_sampling_completed() and producer.output_channel.empty():
                        return "end", None
                    left_ms = int((deadline - time.monotonic()) * 1000)
                    if left_ms <= 0:
                        # The client may not ask again before its training step is done:
                        # that time is no wait for a batch (with stall_timeout).
                        producer.pause_waiting()
                        return "wait", None
                    with contextlib.suppress(QueueTimeoutError):
                        return "msg", producer.recv(timeout_ms=min(left_ms, 100))
            except (SamplingWorkerDiedError, SamplingError, SamplingStalledError) as e:
                return "failed", self._record(producer_id, e)
            except RuntimeError:  # shut down meanwhile (its last client's lease ended),
                # or its workers ended with this server's stop (SamplingStoppedError)
                return "failed", self._failures.get(producer_id) or self._gone(producer_id)
        finally:
            lock.release()

    def release_producer(
        self,
        producer_id: int,
        token: str,
        grace: float | None = None,
    ) -> None:
        """The client with lease ``token`` is done with the producer; the last one out
        shuts it down (``grace``: the wait after STOP, default the producer's)."""
        if grace is not None:
            grace = check_seconds(grace, "grace")
        with self._pools.lock:
            owners = self._owners.get(producer_id)
            if owners is None:
                return
            owners.discard(token)
            producer = self._pop_if_unowned(producer_id)
        if producer is not None:
            producer.shutdown(grace)

    def destroy_sampling_producer(self, producer_id: int) -> None:
        """GLT's: shut the producer down whoever uses it (server shutdown, stock clients)."""
        with self._pools.lock:
            self._owners[producer_id] = set()
            producer = self._pop_if_unowned(producer_id)
        if producer is not None:
            producer.shutdown()

    def _pop_if_unowned(self, producer_id: int) -> DistSamplingProducer | None:
        """Forget a producer that has no owner left (under ``self._pools.lock``)."""
        if self._owners.get(producer_id):
            return None
        self._owners.pop(producer_id, None)
        self._fetch_locks.pop(producer_id, None)
        self._failures.pop(producer_id, None)
        producer: DistSamplingProducer | None = self._pools.pop(producer_id)
        return producer

    def _record(
        self,
        producer_id: int,
        e: SamplingWorkerDiedError | SamplingError | SamplingStalledError,
    ) -> ServerFailure:
        """Turn a producer's failure into the record every fetch of it returns (once).

        The producer keeps ``e`` (it raises it again on every use), and ``e``'s traceback
        holds the frames it was raised through, the producer's own among them: a reference
        cycle that kept each failed producer, its semaphores and its fds alive until the
        cyclic GC ran, long after its release. The server never shows that traceback (the
        clients get the record), so it is dropped here, each time the producer raises."""
        drop_frames(e)
        with self._pools.lock:
            if (known := self._failures.get(producer_id)) is not None:
                return known
            if isinstance(e, SamplingWorkerDiedError):
                failure = self._failure(
                    "worker died", str(e), producer_id=producer_id, worker_rank=e.rank,
                    pid=e.diagnosis.pid, diagnosis=e.diagnosis, diagnoses=e.diagnoses,
                )  # fmt: skip
            elif isinstance(e, SamplingStalledError):
                # Every live worker's state and stacks are in the message and diagnoses;
                # worker_rank, pid and diagnosis are the first stalled worker's.
                first = e.diagnoses[0] if e.diagnoses else None
                failure = self._failure(
                    "stalled", str(e), producer_id=producer_id,
                    worker_rank=e.ranks[0] if e.ranks else None,
                    pid=first.pid if first is not None else None, diagnosis=first,
                    diagnoses=e.diagnoses, stalled_for=e.stalled_for, worker_ranks=e.ranks,
                )  # fmt: skip
            else:
                failure = self._failure(
                    "sampler raised", str(e), producer_id=producer_id, worker_rank=e.rank,
                    pid=e.pid, worker_traceback=e.worker_traceback, raised_at=e.raised_at,
                )  # fmt: skip
            self._failures[producer_id] = failure
            # Not shared any more: a new client of this worker key gets a new producer.
            self._pools.unshare(producer_id)
        logger.error("sampling producer %d failed; its clients get this error:\n%s",
                     producer_id, e)  # fmt: skip
        return failure

    def _unknown(self, producer_id: int) -> ServerFailure:
        return self._failure(
            "unknown producer", f"it has no sampling producer {producer_id} (it was shut down "
            "after its last client released it, or the server restarted)",
            producer_id=producer_id,
        )  # fmt: skip

    def _gone(self, producer_id: int) -> ServerFailure:
        return self._failure(
            "shut down", f"its sampling producer {producer_id} was shut down during the "
            "fetch (its last client's lease ended, or the server is shutting down)",
            producer_id=producer_id,
        )  # fmt: skip

    # ------------------------------------------------------------------ leases
    def _lease_ended(self, token: str, why: str) -> None:
        """A client is gone (runs on the lease thread): release its producers on a thread
        of its own, so other leases are not held up by a teardown."""
        with self._pools.lock:
            owned = [pid for pid, owners in self._owners.items() if token in owners]
        if not owned:
            return
        logger.warning("a client of sampling producers %s is gone: %s; releasing them",
                       owned, why)  # fmt: skip
        thread = threading.Thread(
            target=self._release_all, args=(token, owned), name="healthkit-glt release",
            daemon=True,
        )  # fmt: skip
        self._released = [t for t in self._released if t.is_alive()] + [thread]
        thread.start()

    def _release_all(self, token: str, owned: list[int]) -> None:
        for producer_id in owned:
            try:
                # Nobody reads the ring any more: workers parked in send() would never
                # see STOP; SIGTERM ends them at once (they exit 0 through torch's handler).
                self.release_producer(producer_id, token, grace=LEASE_END_GRACE_S)
            except Exception:
                logger.exception("releasing sampling producer %d", producer_id)

    # ------------------------------------------------------------------ shutdown
    def shutdown(self) -> None:
        """Stop taking leases, then shut every producer down (bounded; idempotent)."""
        self._leases.close()
        for thread in list(self._released):
            thread.join()
        for producer_id in self._pools.ids():
            self.destroy_sampling_producer(producer_id)


# ---------------------------------------------------------------------- what clients call
# Module-level functions, run on the server by the client's RPCs (torch RPC pickles a
# function by its qualified name). Each finds the process's server itself, and answers a
# stock GLT server with a failure that says what to change.


def _server() -> DistServer | ServerFailure:
    from graphlearn_torch.distributed.dist_server import get_server

    server = get_server()
    if isinstance(server, DistServer):
        return server
    return ServerFailure(
        "not a healthkit_glt server",
        "this server runs GLT's own DistServer: start it with healthkit_glt.init_server "
        "(same arguments as graphlearn_torch.distributed.init_server)",
        host=socket.gethostname(), server_pid=os.getpid(), at=time.time(),
    )  # fmt: skip


def serve_hello() -> ServerHello | ServerFailure:
    server = _server()
    return server if isinstance(server, ServerFailure) else server.hello()


def serve_create(
    token: str,
    sampler_input: Any,
    sampling_config: Any,
    worker_options: Any,
    producer_kwargs: dict[str, Any],
) -> int | ServerFailure:
    server = _server()
    if isinstance(server, ServerFailure):
        return server
    return server.create_leased_producer(
        token, sampler_input, sampling_config, worker_options, producer_kwargs
    )


def serve_start_epoch(producer_id: int, epoch: int) -> ServerFailure | None:
    server = _server()
    return server if isinstance(server, ServerFailure) else server.start_epoch(producer_id, epoch)


def serve_fetch(producer_id: int, wait_s: float) -> tuple[str, Any]:
    server = _server()
    if isinstance(server, ServerFailure):
        return "failed", server
    return server.fetch(producer_id, wait_s)


def serve_release(producer_id: int, token: str) -> None:
    server = _server()
    if not isinstance(server, ServerFailure):
        server.release_producer(producer_id, token)


# ---------------------------------------------------------------------- start and stop


def _check_server_arguments(
    producer_kwargs: object, connection_timeout: object, lease_host: object, lease_bind: object
) -> float:
    """:class:`DistServer`'s own arguments, checked; returns the connection timeout."""
    check_producer_kwargs(producer_kwargs)
    timeout_s = resolve_connection_timeout(connection_timeout)  # type: ignore[arg-type]
    if lease_host is not None and not isinstance(lease_host, str):
        raise InvalidArgumentTypeError(
            f"lease_host must be a host name or address (str) or None, got {lease_host!r}",
            "lease_host",
        )
    if not isinstance(lease_bind, str):
        raise InvalidArgumentTypeError(
            f"lease_bind must be an address to bind (str; '' for all), got {lease_bind!r}",
            "lease_bind",
        )
    return timeout_s


def init_server(
    num_servers: int,
    server_rank: int,
    dataset: Any,
    master_addr: str,
    master_port: int,
    num_clients: int = 0,
    num_rpc_threads: int = 16,
    request_timeout: int = 180,
    server_group_name: str | None = None,
    is_dynamic: bool = False,
    *,
    connection_timeout: float | None = None,
    lease_host: str | None = None,
    lease_bind: str = "",
    **producer_kwargs: Any,
) -> DistServer:
    """GLT's ``init_server`` (same arguments), with a healthkit_glt :class:`DistServer`.

    The keyword-only arguments are :class:`DistServer`'s; any other keyword argument is a
    default for the producers it builds (``rpc_init_timeout=``, ``sampler_factory=``, ...).
    GLT's ``get_server()`` and ``wait_and_shutdown_server()`` work with it.
    """
    check_int(num_servers, "num_servers", minimum=1)
    check_int(server_rank, "server_rank", minimum=0, maximum=num_servers - 1)
    if not isinstance(master_addr, str) or not master_addr:
        raise InvalidArgumentTypeError(
            f"master_addr must be a host name or address (str), got {master_addr!r}",
            "master_addr",
        )
    check_int(master_port, "master_port", minimum=1, maximum=65535)
    check_int(num_clients, "num_clients", minimum=0)
    check_int(num_rpc_threads, "num_rpc_threads", minimum=1)
    if isinstance(request_timeout, bool) or not isinstance(request_timeout, (int, float)):
        raise InvalidArgumentTypeError(
            f"request_timeout must be a number of seconds, got {request_timeout!r}",
            "request_timeout",
        )
    check_bound(request_timeout, "request_timeout")
    if server_group_name is not None and not isinstance(server_group_name, str):
        raise InvalidArgumentTypeError(
            f"server_group_name must be a str or None, got {server_group_name!r}",
            "server_group_name",
        )
    check_bool(is_dynamic, "is_dynamic")
    _check_server_arguments(producer_kwargs, connection_timeout, lease_host, lease_bind)
    from graphlearn_torch.distributed.rpc import init_rpc

    if server_group_name:
        server_group_name = server_group_name.replace("-", "_")
    set_server_context(num_servers, server_rank, server_group_name, num_clients)
    server = DistServer(
        dataset, producer_kwargs=producer_kwargs, connection_timeout=connection_timeout,
        lease_host=lease_host, lease_bind=lease_bind,
    )  # fmt: skip
    install_server(server)  # the slot GLT's get_server() reads
    try:
        init_rpc(master_addr, master_port, num_rpc_threads, request_timeout, is_dynamic=is_dynamic)
    except BaseException:
        server.shutdown()
        raise
    return server


def wait_and_shutdown_server() -> None:
    """GLT's ``wait_and_shutdown_server`` (it calls this server's bounded ``shutdown()``)."""
    from graphlearn_torch.distributed import wait_and_shutdown_server as glt_wait

    glt_wait()
