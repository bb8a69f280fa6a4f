"""The state GLT's ``DistLoader`` keeps on a loader, written and read here only.

Why: GLT's ``DistLoader`` takes no producer class, so healthkit_glt's loaders do the
producer-starting part of ``DistLoader.__init__`` themselves (:mod:`healthkit_glt._loader`)
and then rely on GLT's own ``__iter__``, ``__next__``, ``_collate_fn`` and ``__del__``, which
read the private attributes that ``__init__`` would have set. Every one of those attributes is
touched through the functions below, and nowhere else in the loader: a GLT that renames one
breaks this module only, and :data:`REQUIRED` lists them for the adapter's import-time
check (``tests/glt`` asserts that check covers every private the adapter touches).

Known builds (both tested by tests/glt): graphlearn-torch 0.2.4 (PyPI, torch 2.3), which sets
``_shutdowned`` last in ``__init__``, and upstream 26fe3d4 built from source (torch 2.8),
which sets it first (upstream #154). :func:`begin` sets it first on both, so a loader whose
build fails is never shut down twice or by ``__del__`` half-built.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from healthkit_glt._adapter.build import Required

__all__ = [
    "REQUIRED",
    "begin",
    "build",
    "channel",
    "collate",
    "is_running",
    "mark_shut_down",
    "next_batch",
    "producer",
    "set_partitions",
    "set_worker_ranks",
    "start_epoch",
    "start_mp",
    "start_remote",
]

_DIST = "graphlearn_torch.distributed"

#: The ``SamplingConfig`` fields ``DistLoader.__init__`` copies onto the loader.
_CONFIG_FIELDS = (
    "sampling_type", "num_neighbors", "batch_size", "shuffle", "drop_last", "with_edge",
    "with_weight", "collect_features", "edge_dir",
)  # fmt: skip

#: Every GLT private of ``DistLoader`` this module reads or writes, and the flags GLT's own
#: ``__iter__``, ``__next__`` and ``__del__`` read from what ``__init__`` set (the server-client
#: lists among them), in the format of :data:`healthkit_glt._adapter.REQUIRED`.
REQUIRED: tuple[Required, ...] = (
    *(
        (_DIST, "DistLoader", name)
        for name in (
            "_is_collocated_worker", "_is_mp_worker", "_is_remote_worker", "_num_recv",
            "_epoch", "_with_channel", "_shutdowned", "_channel", "_mp_producer",
            "_input_len", "_input_type", "_num_expected", "_server_rank_list",
            "_producer_id_list", "_collate_fn", "_set_ntypes_and_etypes",
        )
    ),
    (_DIST, "MpDistSamplingWorkerOptions", "_set_worker_ranks"),
)  # fmt: skip


def begin(loader: Any) -> None:
    """Mark ``loader`` not running before anything can fail (GLT 0.2.4 sets the flag last,
    so a failing ``__init__`` made its ``__del__`` raise)."""
    loader._shutdowned = True


def build(
    loader: Any,
    *,
    data: Any,
    input_data: Any,
    config: Any,
    to_device: Any,
    worker_options: Any,
    remote: bool,
) -> None:
    """What ``DistLoader.__init__`` sets before it starts a producer, for a multiprocessing
    (``remote=False``) or server-client loader: what its ``__iter__``, ``__next__``,
    ``_collate_fn`` and ``__del__`` read; for a multiprocessing loader also the dataset's
    partitions and how many batches an epoch has (``data`` and ``input_data`` checked by the
    caller). :data:`REQUIRED` checks at import that GLT's ``__init__`` still sets them.
    """
    from graphlearn_torch.utils import get_available_device

    loader.data = data
    loader.input_data = input_data
    for name in _CONFIG_FIELDS:
        setattr(loader, name, getattr(config, name))
    loader.sampling_config = config
    loader.to_device = get_available_device(to_device)
    loader.worker_options = worker_options
    loader._is_collocated_worker = False
    loader._is_mp_worker = not remote
    loader._is_remote_worker = remote
    loader._num_recv = 0
    loader._epoch = 0
    loader._with_channel = True
    if remote:
        loader._num_expected = float("inf")  # the servers say when an epoch ends
        return
    set_partitions(
        loader, data.num_partitions, data.partition_idx, data.get_node_types(),
        data.get_edge_types(),
    )  # fmt: skip
    loader._input_len = len(input_data)
    loader._input_type = input_data.input_type
    loader._num_expected = loader._input_len // loader.batch_size
    if not loader.drop_last and loader._input_len % loader.batch_size != 0:
        loader._num_expected += 1


def start_mp(
    loader: Any,
    worker_options: Any,
    ctx: Any,
    channel: Any,
    producer_factory: Callable[[Any], Any],
) -> None:
    """Start a multiprocessing loader: the workers' ranks from ``ctx``, then the producer
    ``producer_factory(channel)`` over ``channel``, initialised (on failure it has torn
    itself down already, and the loader stays not running)."""
    set_worker_ranks(worker_options, ctx)
    loader._channel = channel
    loader._mp_producer = producer_factory(channel)
    loader._mp_producer.init()
    loader._shutdowned = False


def start_remote(loader: Any, input_type: Any, channel: Any) -> None:
    """A server-client loader is running: the seeds' type (for collating) and the channel
    it fetches from (its servers and their producers are the loader's own)."""
    loader._input_type = input_type
    loader._channel = channel
    loader._shutdowned = False


def producer(loader: Any) -> Any:
    """The multiprocessing loader's producer."""
    return loader._mp_producer


def is_running(loader: Any) -> bool:
    """Built and not shut down (False also for a loader whose build failed)."""
    return not getattr(loader, "_shutdowned", True)


def mark_shut_down(loader: Any) -> bool:
    """Mark ``loader`` shut down; True if it was running (the caller then tears it down)."""
    was_running = is_running(loader)
    loader._shutdowned = True
    return was_running


def channel(loader: Any) -> Any:
    """The channel the loader receives from (a ``ShmChannel``, or the server-client fetcher)."""
    return loader._channel


def start_epoch(loader: Any, start: Callable[[int], None]) -> None:
    """A server-client epoch: ``start(epoch number)`` asks the servers, then the count moves
    on (as ``DistLoader.__iter__``; a multiprocessing loader uses GLT's own)."""
    loader._num_recv = 0
    start(loader._epoch)
    loader._epoch += 1


def next_batch(loader: Any, receive: Callable[[], Any]) -> Any:
    """The next batch, ``receive()``'s message collated by GLT (as ``DistLoader.__next__``);
    StopIteration once the epoch's batches are all in."""
    if loader._num_recv == loader._num_expected:
        raise StopIteration
    result = collate(loader, receive())
    loader._num_recv += 1
    return result


def set_partitions(
    loader: Any, num_partitions: int, partition_idx: int, ntypes: Any, etypes: Any
) -> None:
    """The dataset's partitioning and types on the loader, as ``DistLoader.__init__`` sets them."""
    loader.num_data_partitions = num_partitions
    loader.data_partition_idx = partition_idx
    loader._set_ntypes_and_etypes(ntypes, etypes)


def set_worker_ranks(worker_options: Any, ctx: Any) -> None:
    """``MpDistSamplingWorkerOptions._set_worker_ranks``: the workers' RPC ranks from the
    current distributed context (GLT's loader calls it before building the producer)."""
    worker_options._set_worker_ranks(ctx)


def collate(loader: Any, msg: Any) -> Any:
    """GLT's ``DistLoader._collate_fn``: a sampled message as the batch the loader yields."""
    return loader._collate_fn(msg)
