"""GLT's neighbor, link and subgraph loaders, each on a :class:`DistSamplingProducer`.

Why a base class between GLT's loaders and ``DistLoader``: GLT 0.2.4's ``DistLoader`` takes
no producer class or factory; its multiprocessing branch constructs
``DistMpSamplingProducer`` by module-global name and calls ``init()`` inside ``__init__``.
The only ways to use another producer are monkeypatching that global (which changes every
loader in the process) or not calling ``DistLoader.__init__`` and doing its producer part
here, which is what GiGL does too. Each public loader subclasses GLT's own loader *and*
:class:`HealthkitLoader`, so its method order is ``ours -> GLT's loader -> HealthkitLoader
-> DistLoader``: GLT's own ``__init__`` turns the user's arguments into its sampler input
and ``SamplingConfig`` (nothing of that is repeated here), and its ``super().__init__``
lands in :meth:`HealthkitLoader.__init__` instead of ``DistLoader``'s. That one method is
all three loaders' machinery: the bounded init barrier, the worker deaths named fast,
``stall_timeout`` and the bounded shutdown come from the producer (multiprocessing mode) or
from :mod:`healthkit_glt._remote` and the server-side functions of :mod:`healthkit_glt._server`
(server-client mode). The state GLT's ``DistLoader`` keeps on the loader is written and
read through the adapter's :mod:`healthkit_glt._adapter.loader_state` only. Collocated worker
options, and servers that run GLT's own ``DistServer``, go to ``DistLoader.__init__``
unchanged.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from graphlearn_torch.channel import ShmChannel
from graphlearn_torch.distributed import DistLinkNeighborLoader as _GLTDistLinkNeighborLoader
from graphlearn_torch.distributed import DistLoader as _GLTDistLoader
from graphlearn_torch.distributed import DistNeighborLoader as _GLTDistNeighborLoader
from graphlearn_torch.distributed import DistSubGraphLoader as _GLTDistSubGraphLoader
from graphlearn_torch.distributed import (
    MpDistSamplingWorkerOptions,
    RemoteDistSamplingWorkerOptions,
)
from graphlearn_torch.distributed.dist_context import get_context
from graphlearn_torch.typing import Split

from healthkit import InvalidArgumentError, InvalidArgumentTypeError, UsageError, WatchSet
from healthkit._shared import check_bound
from healthkit_glt._adapter import loader_state as state
from healthkit_glt._config import connection_timeout as resolve_connection_timeout
from healthkit_glt._producer import DistSamplingProducer, check_producer_kwargs
from healthkit_glt._remote import RemoteFetcher, ServerLink, _rpc_name
from healthkit_glt._remote_errors import RemoteSamplingError, ServerFailure, ServerHello
from healthkit_glt._server import serve_create, serve_hello, serve_start_epoch

__all__ = [
    "DistLinkNeighborLoader",
    "DistNeighborLoader",
    "DistSubGraphLoader",
    "HealthkitLoader",
]

#: The loader's own keyword arguments in server-client mode (not the producers').
_CLIENT_ARGUMENTS = ("connection_timeout", "fetch_wait")

logger = logging.getLogger("healthkit.glt")

_GUARANTEES = """
    Extra keyword-only arguments: ``producer_cls`` (a :class:`DistSamplingProducer`
    subclass, or any class with its constructor shape, ``recv()`` and ``shutdown()``) and
    ``**producer_kwargs``, passed to it (``sampler_factory``, ``worker_loop``,
    ``rpc_init_timeout``, ``steady_state_rpc_timeout``, ``init_timeout_multiplier``,
    ``stall_timeout``, ...).

    Iterating raises :class:`SamplingWorkerDiedError` when a sampling worker dies,
    :class:`SamplingError` when one raises, :class:`SamplingStalledError` after
    ``stall_timeout``; building raises :class:`healthkit.BarrierBrokenError` /
    :class:`healthkit.BarrierTimeoutError` when the workers cannot all start.
    ``shutdown()`` is bounded and idempotent.

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

    Other worker options (collocated sampling) get GLT's loader unchanged.
"""


class HealthkitLoader(_GLTDistLoader):  # type: ignore[misc]
    """The machinery of healthkit_glt's loaders, in place of ``DistLoader.__init__``.

    To cover another GLT loader (a ``DistLoader`` subclass whose ``__init__`` builds a
    sampler input and a ``SamplingConfig`` and passes them to ``super().__init__``):
    subclass it and this class, in that order, and call :meth:`_prepare` with the worker
    options and the producer arguments before GLT's ``__init__``, as
    :class:`DistSubGraphLoader` does.
    """

    #: The argument that gives the seeds (named in errors about them).
    _input_argument = "input_nodes"

    def _prepare(
        self,
        worker_options: Any,
        producer_cls: type[DistSamplingProducer],
        producer_kwargs: dict[str, Any],
    ) -> None:
        """Check healthkit_glt's own arguments, before GLT's ``__init__`` sees its own: a
        bad producer argument in server-client mode would otherwise fail on the server, a
        bad fetch_wait later."""
        state.begin(self)
        self._remote = isinstance(worker_options, RemoteDistSamplingWorkerOptions)
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
        if not self._healthkit and producer_kwargs:
            raise InvalidArgumentTypeError(
                f"producer arguments {sorted(producer_kwargs)} need worker_options="
                "MpDistSamplingWorkerOptions (multiprocessing sampling) or "
                "RemoteDistSamplingWorkerOptions; drop them, or change worker_options",
                "producer_kwargs",
            )
        self._pending = (producer_cls, producer_kwargs)

    def __init__(
        self,
        data: Any,
        input_data: Any,
        sampling_config: Any,
        to_device: Any = None,
        worker_options: Any = None,
    ) -> None:
        """``DistLoader.__init__``'s place: called by GLT's own loader ``__init__`` with the
        sampler input and config it built from the user's arguments."""
        if "_pending" not in self.__dict__:
            self._prepare(worker_options, DistSamplingProducer, {})
        producer_cls, producer_kwargs = self.__dict__.pop("_pending")
        if self._remote:
            hellos, stock = _probe_servers(worker_options)
            if not stock:
                self._init_remote(
                    input_data, sampling_config, to_device, worker_options, producer_kwargs,
                    hellos,
                )  # fmt: skip
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
            super().__init__(data, input_data, sampling_config, to_device, worker_options)
            return
        self._init_mp(data, input_data, sampling_config, to_device, worker_options,
                      producer_cls, producer_kwargs)  # fmt: skip

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
        if data is None:
            raise InvalidArgumentError(
                f"'{type(self).__name__}': data is None; multiprocessing sampling workers "
                "need the dataset (pass data=)",
                "data",
            )
        state.build(
            self, data=data, input_data=input_data, config=config, to_device=to_device,
            worker_options=worker_options, remote=False,
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
        channel = ShmChannel(worker_options.channel_capacity, worker_options.channel_size)
        if worker_options.pin_memory:
            channel.pin_memory()
        state.start_mp(
            self, worker_options, ctx, channel,
            lambda ch: producer_cls(data, input_data, config, worker_options, ch,
                                    **producer_kwargs),
        )  # fmt: skip

    # ------------------------------------------------------------------ server-client
    def _init_remote(
        self,
        input_data: Any,
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
        self._producer_ids: list[int] = []
        state.build(
            self, data=None, input_data=input_data, config=config, to_device=to_device,
            worker_options=worker_options, remote=True,
        )  # fmt: skip
        ctx = get_context()
        if ctx is None or not ctx.is_client():
            raise UsageError(
                f"'{type(self).__name__}': RemoteDistSamplingWorkerOptions need a client "
                "process (call graphlearn_torch.distributed.init_client first)"
            )
        servers = worker_options.server_rank
        ranks = list(servers) if isinstance(servers, list) else [servers]
        inputs = list(input_data) if isinstance(input_data, list) else [input_data]
        if len(inputs) != len(ranks):
            raise InvalidArgumentError(
                f"{self._input_argument} gives {len(inputs)} sampler inputs for {len(ranks)} "
                f"servers (worker_options.server_rank): give one per server",
                self._input_argument,
            )
        try:
            for rank in ranks:
                self._links.append(
                    ServerLink.connect(rank, hellos[rank], connection_timeout=timeout)
                )
            self._create_remote_producers(inputs, config, worker_options, producer_kwargs)
        except BaseException:
            self._close_links()
            raise
        fetcher = RemoteFetcher(
            self._links, self._producer_ids, worker_options.prefetch_size, fetch_wait
        )
        state.start_remote(self, inputs[0].input_type, fetcher)

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
        state.set_partitions(self, *meta)
        futures = [  # in parallel, as GLT: each server starts its workers at once
            link.call(
                serve_create, link.lease.token, inp, config, worker_options, producer_kwargs,
                timeout=0,
            )
            for link, inp in zip(self._links, inputs, strict=True)
        ]
        results = [_await_rpc(link, fut) for link, fut in zip(self._links, futures, strict=True)]
        failures = [r for r in results if isinstance(r, ServerFailure)]
        self._producer_ids = [r for r in results if not isinstance(r, ServerFailure)]
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
        producer: DistSamplingProducer = state.producer(self)
        return producer

    def __iter__(self) -> Any:
        if self._healthkit:
            source = state.channel(self) if self._remote else state.producer(self)
            if source.failure is not None:
                raise source.failure
            if not state.is_running(self):
                raise UsageError(f"'{type(self).__name__}' was shut down")
        if self._remote:
            state.start_epoch(self, self._start_remote_epoch)
            return self
        super().__iter__()
        return self

    def _start_remote_epoch(self, epoch: int) -> None:
        futures = [
            link.call(serve_start_epoch, pid, epoch, timeout=0)
            for link, pid in zip(self._links, self._producer_ids, strict=True)
        ]
        fetcher = state.channel(self)
        try:
            for link, fut in zip(self._links, futures, strict=True):
                if (failure := _await_rpc(link, fut)) is not None:
                    raise RemoteSamplingError.from_failure(failure)
        except RemoteSamplingError as e:
            fetcher.failure = e
            raise
        fetcher.reset()

    def __next__(self) -> Any:
        if not self._healthkit:
            return super().__next__()
        source = state.channel(self) if self._remote else state.producer(self)
        return state.next_batch(self, source.recv)

    def __del__(self, _finalizing: Any = sys.is_finalizing) -> None:
        """GLT's ``__del__`` tests a copy of its exit flag taken when it was imported, so it
        also shuts the loader down while the interpreter clears its modules, where this
        package's module globals are already None. At that point the producer's exit hook
        has stopped the workers already: nothing is left to do (``_finalizing`` is bound
        here so that it outlives the module's globals)."""
        if not _finalizing():
            self.shutdown()

    def shutdown(self) -> None:
        """Stop the sampling workers (bounded, idempotent, safe after a failed build).

        Server-client mode: each server is told to release this loader's producer (it shuts
        it down when no other client uses it), then the leases are closed.
        """
        if not getattr(self, "_healthkit", False):
            if state.is_running(self):
                super().shutdown()  # GLT's own loader (collocated sampling, stock servers)
            return
        if not state.mark_shut_down(self):
            return
        if self._remote:
            from graphlearn_torch.distributed.rpc import rpc_is_initialized

            try:
                if rpc_is_initialized() is True:
                    for link, pid in zip(self._links, self._producer_ids, strict=True):
                        link.release(pid, timeout=30.0)
            finally:
                state.channel(self).close()
                self._close_links()
        else:
            state.producer(self).shutdown()


class DistNeighborLoader(_GLTDistNeighborLoader, HealthkitLoader):  # type: ignore[misc]
    __doc__ = (
        """GLT's ``DistNeighborLoader`` (same arguments) with a :class:`DistSamplingProducer`.

    In server-client mode ``input_nodes`` is a ``graphlearn_torch.typing.Split`` or the path
    (or a list of paths, one per server) of a saved tensor, as in GLT.
    """
        + _GUARANTEES
    )

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
        self._prepare(worker_options, producer_cls, producer_kwargs)
        if self._remote:
            _check_remote_seeds(input_nodes)
        # GLT's own __init__; its super().__init__ is HealthkitLoader.__init__ (class docs).
        _GLTDistNeighborLoader.__init__(
            self, data=data, num_neighbors=num_neighbors, input_nodes=input_nodes,
            batch_size=batch_size, shuffle=shuffle, drop_last=drop_last, with_edge=with_edge,
            with_weight=with_weight, edge_dir=edge_dir, collect_features=collect_features,
            to_device=to_device, random_seed=random_seed, worker_options=worker_options,
        )  # fmt: skip


class DistLinkNeighborLoader(_GLTDistLinkNeighborLoader, HealthkitLoader):  # type: ignore[misc]
    __doc__ = (
        """GLT's ``DistLinkNeighborLoader`` (same arguments: seed edges, labels, negative
    sampling) with a :class:`DistSamplingProducer`.
    """
        + _GUARANTEES
    )

    _input_argument = "edge_label_index"

    def __init__(
        self,
        data: Any,
        num_neighbors: Any,
        batch_size: int = 1,
        edge_label_index: Any = None,
        edge_label: Any = None,
        neg_sampling: Any = None,
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
        self._prepare(worker_options, producer_cls, producer_kwargs)
        _GLTDistLinkNeighborLoader.__init__(
            self, data=data, num_neighbors=num_neighbors, batch_size=batch_size,
            edge_label_index=edge_label_index, edge_label=edge_label,
            neg_sampling=neg_sampling, shuffle=shuffle, drop_last=drop_last,
            with_edge=with_edge, with_weight=with_weight, edge_dir=edge_dir,
            collect_features=collect_features, to_device=to_device, random_seed=random_seed,
            worker_options=worker_options,
        )  # fmt: skip


class DistSubGraphLoader(_GLTDistSubGraphLoader, HealthkitLoader):  # type: ignore[misc]
    __doc__ = (
        """GLT's ``DistSubGraphLoader`` (same arguments) with a :class:`DistSamplingProducer`.
    """
        + _GUARANTEES
    )

    def __init__(
        self,
        data: Any,
        input_nodes: Any,
        num_neighbors: Any = None,
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
        self._prepare(worker_options, producer_cls, producer_kwargs)
        _GLTDistSubGraphLoader.__init__(
            self, data=data, input_nodes=input_nodes, num_neighbors=num_neighbors,
            batch_size=batch_size, shuffle=shuffle, drop_last=drop_last, with_edge=with_edge,
            with_weight=with_weight, edge_dir=edge_dir, collect_features=collect_features,
            to_device=to_device, random_seed=random_seed, worker_options=worker_options,
        )  # fmt: skip


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


def _check_remote_seeds(input_nodes: Any) -> None:
    """The seed types GLT's ``DistNeighborLoader`` converts for remote workers (it raises a
    bare ValueError for any other)."""
    seeds = input_nodes[1] if isinstance(input_nodes, tuple) else input_nodes
    if isinstance(seeds, Split | list | str):
        return
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
