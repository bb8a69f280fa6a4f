"""DistNeighborLoader: GLT's loader, built on :class:`DistSamplingProducer`.

Why a subclass that repeats part of ``DistLoader.__init__``: GLT 0.2.4's ``DistLoader``
takes no producer class or factory; its multiprocessing branch constructs
``DistMpSamplingProducer`` by module-global name and calls ``init()`` inside ``__init__``.
The only ways to use another producer are monkeypatching that global (which changes every
loader in the process) or not calling ``DistLoader.__init__`` and doing its mp branch here,
which is what GiGL does too; the state GLT's ``__init__`` leaves on the loader (private
flags included) is set by one helper, :func:`healthkit_glt._compat.init_loader_state`, for
both branches. The remote (server-client) branch is repeated too, with
:mod:`healthkit_glt._remote` in place of GLT's receiving channel and the server-side
functions of :mod:`healthkit_glt._server`. Collocated worker options go to GLT's own
``__init__`` unchanged.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Sequence
from typing import Any

from graphlearn_torch.channel import ShmChannel
from graphlearn_torch.distributed import DistNeighborLoader as _GLTDistNeighborLoader
from graphlearn_torch.distributed import (
    MpDistSamplingWorkerOptions,
    RemoteDistSamplingWorkerOptions,
)
from graphlearn_torch.distributed.dist_context import get_context
from graphlearn_torch.sampler import (
    NodeSamplerInput,
    RemoteNodePathSamplerInput,
    RemoteNodeSplitSamplerInput,
    SamplingConfig,
    SamplingType,
)
from graphlearn_torch.typing import Split

from healthkit import InvalidArgumentError, InvalidArgumentTypeError, UsageError, WatchSet
from healthkit._shared import check_bound
from healthkit_glt._compat import (
    collate,
    init_loader_state,
    set_loader_partitions,
    set_worker_ranks,
)
from healthkit_glt._lease import connection_timeout as resolve_connection_timeout
from healthkit_glt._producer import DistSamplingProducer, check_producer_kwargs
from healthkit_glt._remote import RemoteFetcher, ServerLink, _rpc_name
from healthkit_glt._remote_errors import RemoteSamplingError, ServerFailure, ServerHello
from healthkit_glt._server import serve_create, serve_hello, serve_start_epoch

__all__ = ["DistNeighborLoader"]

#: The loader's own keyword arguments in server-client mode (not the producers').
_CLIENT_ARGUMENTS = ("connection_timeout", "fetch_wait")

logger = logging.getLogger("healthkit.glt")


class DistNeighborLoader(_GLTDistNeighborLoader):  # type: ignore[misc]
    """GLT's ``DistNeighborLoader`` (same arguments) with a :class:`DistSamplingProducer`.

    Extra keyword-only arguments: ``producer_cls`` (a :class:`DistSamplingProducer`
    subclass, or any class with its constructor shape, ``recv()`` and ``shutdown()``) and
    ``**producer_kwargs``, passed to it (``sampler_factory``, ``worker_loop``,
    ``rpc_init_timeout``, ``steady_state_rpc_timeout``, ``init_timeout_multiplier``, ...).

    Iterating raises :class:`SamplingWorkerDiedError` when a sampling worker dies; building
    raises :class:`healthkit.BarrierBrokenError` / :class:`healthkit.BarrierTimeoutError`
    when the workers cannot all start.

    With ``RemoteDistSamplingWorkerOptions`` (server-client mode; the servers started with
    :func:`healthkit_glt.init_server`), ``producer_kwargs`` go to the servers' producers
    (they must pickle), and two more keyword arguments are the client's own:
    ``connection_timeout`` (how long a server's machine may stay silent before the loader
    gives up on it; default ``$HEALTHKIT_GLT_CONNECTION_TIMEOUT_SECONDS`` or 10 s) and
    ``fetch_wait`` (how long a server holds one fetch before answering "not yet"; default
    a third of this process's RPC timeout, at most 10 s). Building and iterating raise
    :class:`RemoteSamplingError` (a worker died or raised on a server, its producer could not
    start) or :class:`SamplingServerLostError` (a server's process ended or its connection
    was lost), each naming the server.
    """

    def __init__(
        self,
        data: Any,
        num_neighbors: Any,
        input_nodes: Any,
        batch_size: int = 1,
        shuffle: bool = False,
        drop_last: bool = False,
        with_edge: bool = False,
        with_weight: bool = False,
        edge_dir: str = "out",
        collect_features: bool = False,
        to_device: Any = None,
        random_seed: int | None = None,
        worker_options: Any = None,
        *,
        producer_cls: type[DistSamplingProducer] = DistSamplingProducer,
        **producer_kwargs: Any,
    ) -> None:
        # First: GLT 0.2.4 sets this flag last, so a failing __init__ made __del__ raise.
        self._shutdowned = True
        self._remote = isinstance(worker_options, RemoteDistSamplingWorkerOptions)
        # Checked here, before any worker or server is asked: a bad producer argument in
        # server-client mode would otherwise fail on the server, a bad fetch_wait later.
        client_own = {k: v for k, v in producer_kwargs.items() if k in _CLIENT_ARGUMENTS}
        for name, value in client_own.items():
            if not self._remote:
                raise InvalidArgumentTypeError(
                    f"{name}= is for server-client mode (RemoteDistSamplingWorkerOptions) "
                    "only; drop it",
                    name,
                )
            if value is not None:
                check_bound(value, name)
        check_producer_kwargs(
            {k: v for k, v in producer_kwargs.items() if k not in client_own},
            DistSamplingProducer if self._remote else producer_cls,
        )
        self._healthkit = self._remote or isinstance(worker_options, MpDistSamplingWorkerOptions)
        config = SamplingConfig(
            SamplingType.NODE, num_neighbors, batch_size, shuffle, drop_last, with_edge,
            collect_features, with_neg=False, with_weight=with_weight, edge_dir=edge_dir,
            seed=random_seed,
        )  # fmt: skip
        if self._remote:
            hellos, stock = _probe_servers(worker_options)
            if not stock:
                self._init_remote(
                    input_nodes, config, to_device, worker_options, producer_kwargs, hellos
                )
                return
            # Servers started with GLT's own init_server: served as stock GLT serves them.
            producer_kwargs = {k: v for k, v in producer_kwargs.items()
                               if k not in _CLIENT_ARGUMENTS}  # fmt: skip
            if producer_kwargs:
                raise InvalidArgumentTypeError(
                    f"producer arguments {sorted(producer_kwargs)} need servers started with "
                    f"healthkit_glt.init_server; server rank(s) {stock} run GLT's own: start "
                    "them with healthkit_glt.init_server, or drop these arguments",
                    "producer_kwargs",
                )
            logger.warning(
                "sampling server rank(s) %s run GLT's own DistServer: this loader is served "
                "as stock GLT serves it (a worker or server that dies there leaves it "
                "waiting). Start the servers with healthkit_glt.init_server.", stock,
            )  # fmt: skip
            self._remote = self._healthkit = False
        if not self._healthkit:
            if producer_kwargs:
                raise InvalidArgumentTypeError(
                    f"producer arguments {sorted(producer_kwargs)} need worker_options="
                    "MpDistSamplingWorkerOptions (multiprocessing sampling) or "
                    "RemoteDistSamplingWorkerOptions; drop them, or change worker_options",
                    "producer_kwargs",
                )
            super().__init__(
                data, num_neighbors, input_nodes, batch_size, shuffle, drop_last, with_edge,
                with_weight, edge_dir, collect_features, to_device, random_seed, worker_options,
            )  # fmt: skip
            return
        input_type, seeds = input_nodes if isinstance(input_nodes, tuple) else (None, input_nodes)
        input_data = NodeSamplerInput(node=seeds, input_type=input_type)
        self._init_mp(data, input_data, config, to_device, worker_options, producer_cls,
                      producer_kwargs)  # fmt: skip

    def _init_mp(
        self,
        data: Any,
        input_data: Any,
        config: Any,
        to_device: Any,
        worker_options: Any,
        producer_cls: type[DistSamplingProducer],
        producer_kwargs: dict[str, Any],
    ) -> None:
        """GLT's ``DistLoader.__init__`` multiprocessing branch, with our producer."""
        init_loader_state(
            self, data=data, input_data=input_data, config=config, to_device=to_device,
            worker_options=worker_options, remote=False,
        )  # fmt: skip
        if data is None:
            raise InvalidArgumentError(
                f"'{type(self).__name__}': data is None; multiprocessing sampling workers "
                "need the dataset (pass data=)",
                "data",
            )
        set_loader_partitions(
            self, data.num_partitions, data.partition_idx, data.get_node_types(),
            data.get_edge_types(),
        )  # fmt: skip
        ctx = get_context()
        if ctx is None:
            raise UsageError(
                f"'{type(self).__name__}': the distributed context has not been initialized "
                "(call graphlearn_torch.distributed.init_worker_group first)."
            )
        if not ctx.is_worker():
            raise UsageError(
                f"'{type(self).__name__}': multiprocessing sampling workers need a non-server "
                f"distribution mode; the current role is {ctx.role}."
            )
        self._input_len = len(input_data)
        self._input_type = input_data.input_type
        self._num_expected = self._input_len // self.batch_size
        if not self.drop_last and self._input_len % self.batch_size != 0:
            self._num_expected += 1
        set_worker_ranks(worker_options, ctx)
        self._channel = ShmChannel(worker_options.channel_capacity, worker_options.channel_size)
        if worker_options.pin_memory:
            self._channel.pin_memory()
        self._mp_producer = producer_cls(
            data, input_data, config, worker_options, self._channel, **producer_kwargs
        )
        self._mp_producer.init()  # on failure it has torn itself down already
        self._shutdowned = False

    # ------------------------------------------------------------------ server-client
    def _init_remote(
        self,
        input_nodes: Any,
        config: Any,
        to_device: Any,
        worker_options: Any,
        producer_kwargs: dict[str, Any],
        hellos: dict[int, ServerHello],
    ) -> None:
        """GLT's ``DistLoader.__init__`` remote branch, with leases and our server calls."""
        from torch.distributed import rpc

        timeout = resolve_connection_timeout(producer_kwargs.pop("connection_timeout", None))
        fetch_wait = producer_kwargs.pop("fetch_wait", None)
        if fetch_wait is None:
            # Public, but not re-exported in torch's typing on every version.
            get_timeout = rpc.get_rpc_timeout  # type: ignore[attr-defined,unused-ignore]
            fetch_wait = min(10.0, float(get_timeout()) / 3)
        self._links: list[ServerLink] = []
        self._producer_id_list: list[int] = []
        self._remote_failure: RemoteSamplingError | None = None
        init_loader_state(
            self, data=None, input_data=None, config=config, to_device=to_device,
            worker_options=worker_options, remote=True,
        )  # fmt: skip
        ctx = get_context()
        if ctx is None or not ctx.is_client():
            raise UsageError(
                f"'{type(self).__name__}': RemoteDistSamplingWorkerOptions need a client "
                "process (call graphlearn_torch.distributed.init_client first)"
            )
        self._num_expected = float("inf")  # the servers say when an epoch ends
        servers = worker_options.server_rank
        self._server_rank_list = list(servers) if isinstance(servers, list) else [servers]
        inputs = _remote_inputs(input_nodes, len(self._server_rank_list))
        if len(inputs) != len(self._server_rank_list):
            raise InvalidArgumentError(
                f"input_nodes gives {len(inputs)} paths for {len(self._server_rank_list)} "
                "servers (worker_options.server_rank): give one path per server",
                "input_nodes",
            )
        self.input_data = inputs if len(inputs) > 1 else inputs[0]
        self._input_type = inputs[0].input_type
        try:
            for rank in self._server_rank_list:
                self._links.append(
                    ServerLink.connect(rank, hellos[rank], connection_timeout=timeout)
                )
            self._create_remote_producers(inputs, config, worker_options, producer_kwargs)
        except BaseException:
            self._close_links()
            raise
        self._channel = RemoteFetcher(
            self._links, self._producer_id_list, worker_options.prefetch_size, fetch_wait
        )
        self._shutdowned = False

    def _create_remote_producers(
        self,
        inputs: Sequence[Any],
        config: Any,
        worker_options: Any,
        producer_kwargs: dict[str, Any],
    ) -> None:
        from graphlearn_torch.distributed import DistServer as _GLTDistServer

        first = self._links[0]
        meta = _await_rpc(first, first.call(_call_server_method, _GLTDistServer.get_dataset_meta))
        set_loader_partitions(self, *meta)
        futures = [  # in parallel, as GLT: each server starts its workers at once
            link.call(
                serve_create, link.lease.token, inp, config, worker_options, producer_kwargs,
                timeout=0,
            )
            for link, inp in zip(self._links, inputs, strict=True)
        ]
        results = [_await_rpc(link, fut) for link, fut in zip(self._links, futures, strict=True)]
        failures = [r for r in results if isinstance(r, ServerFailure)]
        self._producer_id_list = [r for r in results if not isinstance(r, ServerFailure)]
        if failures:
            for link, r in zip(self._links, results, strict=True):
                if not isinstance(r, ServerFailure):
                    link.release(r, timeout=30.0)
            raise RemoteSamplingError.from_failure(failures[0])

    @property
    def servers(self) -> list[ServerHello]:
        """What each server of a server-client loader said about itself (rank, host, pid)."""
        return [link.hello for link in getattr(self, "_links", [])]

    def _close_links(self) -> None:
        for link in getattr(self, "_links", []):
            link.close()

    # ------------------------------------------------------------------ both modes
    @property
    def producer(self) -> DistSamplingProducer:
        """The sampling producer (its ``workers``, ``timeouts`` and ``failure``)."""
        producer: DistSamplingProducer = self._mp_producer
        return producer

    def __iter__(self) -> DistNeighborLoader:
        if self._healthkit:
            failure = self._channel.failure if self._remote else self._mp_producer.failure
            if failure is not None:
                raise failure
            if self._shutdowned:
                raise UsageError(f"'{type(self).__name__}' was shut down")
        if self._remote:
            self._start_remote_epoch()
            return self
        super().__iter__()
        return self

    def _start_remote_epoch(self) -> None:
        self._num_recv = 0
        futures = [
            link.call(serve_start_epoch, pid, self._epoch, timeout=0)
            for link, pid in zip(self._links, self._producer_id_list, strict=True)
        ]
        try:
            for link, fut in zip(self._links, futures, strict=True):
                if (failure := _await_rpc(link, fut)) is not None:
                    raise RemoteSamplingError.from_failure(failure)
        except RemoteSamplingError as e:
            self._channel.failure = e
            raise
        self._channel.reset()
        self._epoch += 1

    def __next__(self) -> Any:
        if not self._healthkit:
            return super().__next__()
        if self._num_recv == self._num_expected:
            raise StopIteration
        msg = self._channel.recv() if self._remote else self._mp_producer.recv()
        result = collate(self, msg)
        self._num_recv += 1
        return result

    def shutdown(self) -> None:
        """Stop the sampling workers (bounded, idempotent, safe after a failed build).

        Server-client mode: each server is told to release this loader's producer (it shuts
        it down when no other client uses it), then the leases are closed.
        """
        if getattr(self, "_shutdowned", True):
            return
        self._shutdowned = True
        if getattr(self, "_remote", False):
            from graphlearn_torch.distributed.rpc import rpc_is_initialized

            try:
                if rpc_is_initialized() is True:
                    for link, pid in zip(self._links, self._producer_id_list, strict=True):
                        link.release(pid, timeout=30.0)
            finally:
                self._channel.close()
                self._close_links()
        elif getattr(self, "_healthkit", False):
            self._mp_producer.shutdown()
        else:
            self._shutdowned = False
            super().shutdown()


def _probe_servers(worker_options: Any) -> tuple[dict[int, ServerHello], list[int]]:
    """Ask each server of ``worker_options`` who it is: the hellos of healthkit_glt servers,
    and the ranks of servers that run GLT's own ``DistServer`` (or lack healthkit_glt)."""
    from torch.distributed import rpc

    ranks = worker_options.server_rank
    hellos: dict[int, ServerHello] = {}
    stock: list[int] = []
    for rank in ranks if isinstance(ranks, list) else [ranks]:
        try:
            hello = rpc.rpc_sync(_rpc_name(rank), serve_hello)
        except Exception as e:  # the server cannot even unpickle our function
            if "healthkit_glt" not in str(e):
                raise
            hello = None
        if isinstance(hello, ServerHello):
            hellos[rank] = hello
        else:
            stock.append(rank)
    return hellos, stock


def _remote_inputs(input_nodes: Any, num_servers: int) -> list[Any]:
    """GLT's ``DistNeighborLoader`` conversion of ``input_nodes`` for remote workers."""
    input_type, seeds = input_nodes if isinstance(input_nodes, tuple) else (None, input_nodes)
    if isinstance(seeds, Split):
        return [RemoteNodeSplitSamplerInput(split=seeds, input_type=input_type)] * num_servers
    if isinstance(seeds, list):
        return [RemoteNodePathSamplerInput(node_path=p, input_type=input_type) for p in seeds]
    if isinstance(seeds, str):
        return [RemoteNodePathSamplerInput(node_path=seeds, input_type=input_type)]
    raise InvalidArgumentTypeError(
        "input_nodes: server-client mode takes the seeds as a graphlearn_torch.typing.Split "
        "or as the path (or a list of paths, one per server) of a saved tensor; got "
        f"{type(seeds).__name__}",
        "input_nodes",
    )


def _call_server_method(method: Any, *args: Any) -> Any:
    """Run one of GLT's ``DistServer`` methods on this process's server (the server side of
    an RPC; GLT's own ``_call_func_on_server`` does the same)."""
    from graphlearn_torch.distributed.dist_server import get_server

    return method(get_server(), *args)


def _await_rpc(link: ServerLink, fut: Any) -> Any:
    """The value of an RPC to ``link``'s server, waiting on its lease too: a server that is
    gone ends the wait with :class:`SamplingServerLostError`, not at the RPC timeout."""
    ready_r, ready_w = os.pipe()
    closed = False

    def done(_: Any) -> None:
        if not closed:
            with contextlib.suppress(OSError):
                os.write(ready_w, b"x")

    try:
        fut.add_done_callback(done)
        with WatchSet() as waits:
            waits.add_fd(ready_r, waits.wake)
            waits.add_fd(link.lease.fileno(), waits.wake)
            while not fut.done():
                if (why := link.lease.gone()) is not None:
                    raise link.lost(why)
                waits.wait()
    finally:
        closed = True
        os.close(ready_r)
        os.close(ready_w)
    try:
        return fut.value()
    except Exception as e:
        if (why := link.lease.gone()) is not None:
            raise link.lost(why, rpc_error=str(e).strip().splitlines()[0]) from None
        raise
