"""DistNeighborLoader: GLT's loader, built on :class:`DistSamplingProducer`.

Why a subclass that repeats part of ``DistLoader.__init__``: GLT 0.2.4's ``DistLoader``
takes no producer class or factory; its multiprocessing branch constructs
``DistMpSamplingProducer`` by module-global name and calls ``init()`` inside ``__init__``.
The only ways to use another producer are monkeypatching that global (which changes every
loader in the process) or not calling ``DistLoader.__init__`` and doing its mp branch here,
which is what GiGL does too. Non-multiprocessing worker options (collocated, remote) go to
GLT's own ``__init__`` unchanged.
"""

from __future__ import annotations

from typing import Any

from graphlearn_torch.channel import ShmChannel
from graphlearn_torch.distributed import DistNeighborLoader as _GLTDistNeighborLoader
from graphlearn_torch.distributed import MpDistSamplingWorkerOptions
from graphlearn_torch.distributed.dist_context import get_context
from graphlearn_torch.sampler import NodeSamplerInput, SamplingConfig, SamplingType
from graphlearn_torch.utils import get_available_device

from healthkit_glt._producer import DistSamplingProducer

__all__ = ["DistNeighborLoader"]


class DistNeighborLoader(_GLTDistNeighborLoader):  # type: ignore[misc]
    """GLT's ``DistNeighborLoader`` (same arguments) with a :class:`DistSamplingProducer`.

    Extra keyword-only arguments: ``producer_cls`` (a :class:`DistSamplingProducer`
    subclass, or any class with its constructor shape, ``recv()`` and ``shutdown()``) and
    ``**producer_kwargs``, passed to it (``sampler_factory``, ``worker_loop``,
    ``rpc_init_timeout``, ``steady_state_rpc_timeout``, ``init_timeout_multiplier``, ...).

    Iterating raises :class:`SamplingWorkerDiedError` when a sampling worker dies; building
    raises :class:`healthkit.BarrierBrokenError` / :class:`healthkit.BarrierTimeoutError`
    when the workers cannot all start.
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
        self._healthkit = isinstance(worker_options, MpDistSamplingWorkerOptions)
        if not self._healthkit:
            if producer_kwargs:
                raise TypeError(
                    f"producer arguments {sorted(producer_kwargs)} need "
                    "MpDistSamplingWorkerOptions (multiprocessing sampling)"
                )
            super().__init__(
                data, num_neighbors, input_nodes, batch_size, shuffle, drop_last, with_edge,
                with_weight, edge_dir, collect_features, to_device, random_seed, worker_options,
            )  # fmt: skip
            return
        input_type, seeds = input_nodes if isinstance(input_nodes, tuple) else (None, input_nodes)
        input_data = NodeSamplerInput(node=seeds, input_type=input_type)
        config = SamplingConfig(
            SamplingType.NODE, num_neighbors, batch_size, shuffle, drop_last, with_edge,
            collect_features, with_neg=False, with_weight=with_weight, edge_dir=edge_dir,
            seed=random_seed,
        )  # fmt: skip
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
        self.data = data
        self.input_data = input_data
        self.sampling_type = config.sampling_type
        self.num_neighbors = config.num_neighbors
        self.batch_size = config.batch_size
        self.shuffle = config.shuffle
        self.drop_last = config.drop_last
        self.with_edge = config.with_edge
        self.with_weight = config.with_weight
        self.collect_features = config.collect_features
        self.edge_dir = config.edge_dir
        self.sampling_config = config
        self.to_device = get_available_device(to_device)
        self.worker_options = worker_options
        self._is_collocated_worker = False
        self._is_mp_worker = True
        self._is_remote_worker = False
        if data is None:
            raise ValueError(
                f"'{type(self).__name__}': missing input dataset when launching "
                "multiprocessing sampling workers."
            )
        self.num_data_partitions = data.num_partitions
        self.data_partition_idx = data.partition_idx
        self._set_ntypes_and_etypes(data.get_node_types(), data.get_edge_types())
        self._num_recv = 0
        self._epoch = 0
        ctx = get_context()
        if ctx is None:
            raise RuntimeError(
                f"'{type(self).__name__}': the distributed context has not been initialized "
                "(call graphlearn_torch.distributed.init_worker_group first)."
            )
        if not ctx.is_worker():
            raise RuntimeError(
                f"'{type(self).__name__}': multiprocessing sampling workers need a non-server "
                f"distribution mode; the current role is {ctx.role}."
            )
        self._input_len = len(input_data)
        self._input_type = input_data.input_type
        self._num_expected = self._input_len // self.batch_size
        if not self.drop_last and self._input_len % self.batch_size != 0:
            self._num_expected += 1
        self._with_channel = True
        worker_options._set_worker_ranks(ctx)
        self._channel = ShmChannel(worker_options.channel_capacity, worker_options.channel_size)
        if worker_options.pin_memory:
            self._channel.pin_memory()
        self._mp_producer = producer_cls(
            data, input_data, config, worker_options, self._channel, **producer_kwargs
        )
        self._mp_producer.init()  # on failure it has torn itself down already
        self._shutdowned = False

    @property
    def producer(self) -> DistSamplingProducer:
        """The sampling producer (its ``workers``, ``timeouts`` and ``failure``)."""
        producer: DistSamplingProducer = self._mp_producer
        return producer

    def __iter__(self) -> DistNeighborLoader:
        if self._healthkit:
            failure = self._mp_producer.failure
            if failure is not None:
                raise failure
            if self._shutdowned:
                raise RuntimeError(f"'{type(self).__name__}' was shut down")
        super().__iter__()
        return self

    def __next__(self) -> Any:
        if not self._healthkit:
            return super().__next__()
        if self._num_recv == self._num_expected:
            raise StopIteration
        result = self._collate_fn(self._mp_producer.recv())
        self._num_recv += 1
        return result

    def shutdown(self) -> None:
        """Stop the sampling workers (bounded, idempotent, safe after a failed build)."""
        if getattr(self, "_shutdowned", True):
            return
        self._shutdowned = True
        if getattr(self, "_healthkit", False):
            self._mp_producer.shutdown()
        else:
            self._shutdowned = False
            super().shutdown()
