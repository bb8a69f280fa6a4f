"""Stock graphlearn-torch (GLT) pieces the glt tests and benchmarks share: one small graph,
one loader configuration, and epoch digests, so every run samples the same batches and a
stock epoch can be compared with a healthkit_glt one by checksum.

Set-up for one process (world size 1): the loader's process only needs a GLT *worker* context
(``init_worker_group(1, 0)``). DistLoader refuses mp mode unless ``get_context().is_worker()``,
and the producer derives the sampling workers' RPC world (``num_workers x world_size``) and
ranks from that context. The loader's own process does not need ``init_rpc``: only the spawned
sampling workers form an RPC group, among themselves, on ``master_port``.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# tests/: the shared test helpers, also for the scripts and benchmarks that import this module.
_TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _TESTS not in sys.path:
    sys.path.append(_TESTS)
from testutil import free_port as free_port  # noqa: E402

NUM_NODES = 1000
NUM_EDGES = 10_000
FEATURE_DIM = 16
NUM_CLASSES = 4
BATCH_SIZE = 64
NUM_NEIGHBORS = (5, 5)
GRAPH_SEED = 0
LOADER_SEED = 42
GROUP_NAME = "healthkit-glt-test"


def one_epoch_capacity(num_seeds: int, batch_size: int = BATCH_SIZE) -> int:
    """A channel capacity of one epoch's batches (see ``STOCK_SAFE_CHANNEL_CAPACITY``)."""
    return -(-num_seeds // batch_size)


# Stock GLT's ShmChannel can stall for good with two concurrent writers: a writer one ring
# lap ahead takes the slot of a block not yet written (healthkit_glt serialises its
# workers' sends; see SerializedSendChannel). A lap needs ``channel_capacity`` blocks in
# flight, and a loader never has more than one epoch's batches in flight, so a capacity of
# at least the batches per epoch rules the race out for the stock reference runs.
STOCK_SAFE_CHANNEL_CAPACITY = one_epoch_capacity(NUM_NODES)


def set_spawn() -> None:
    """GLT's producer makes an ``mp.Value`` in the *default* context but spawns its workers;
    with the default ``fork`` context the two mix and the worker fails with a SemLock error."""
    import torch.multiprocessing as mp

    mp.set_start_method("spawn", force=True)


def build_dataset(
    num_nodes: int = NUM_NODES,
    num_edges: int = NUM_EDGES,
    feature_dim: int = FEATURE_DIM,
    num_classes: int = NUM_CLASSES,
    seed: int = GRAPH_SEED,
) -> Any:
    """A random homogeneous graph as a single-partition ``DistDataset`` (CPU only).

    Every node and edge belongs to partition 0, so the partition books are all zeros; the
    graph is CPU mode and the features are plain CPU tensors (``with_gpu=False``).
    """
    import torch
    from graphlearn_torch.distributed import DistDataset

    gen = torch.Generator().manual_seed(seed)
    edge_index = build_edge_index(num_nodes, num_edges, gen)
    features = torch.randn(num_nodes, feature_dim, generator=gen)
    labels = torch.randint(0, num_classes, (num_nodes,), generator=gen)
    dataset = DistDataset(
        num_partitions=1,
        partition_idx=0,
        node_pb=torch.zeros(num_nodes, dtype=torch.long),
        edge_pb=torch.zeros(num_edges, dtype=torch.long),
    )
    dataset.init_graph(edge_index=edge_index, graph_mode="CPU")
    dataset.init_node_features(features, with_gpu=False)
    dataset.init_node_labels(labels)
    return dataset


def build_edge_index(
    num_nodes: int = NUM_NODES, num_edges: int = NUM_EDGES, generator: Any = None
) -> Any:
    """The test graph's edges (``build_dataset``'s, for the same arguments): the seed edges
    of a link loader."""
    import torch

    gen = generator if generator is not None else torch.Generator().manual_seed(GRAPH_SEED)
    return torch.randint(0, num_nodes, (2, num_edges), generator=gen)


def init_single_process_context(group_name: str = GROUP_NAME) -> None:
    """The minimal GLT context for an mp-mode loader in a world of one process."""
    from graphlearn_torch.distributed import init_worker_group

    init_worker_group(world_size=1, rank=0, group_name=group_name)


def make_worker_options(
    num_workers: int = 2,
    master_port: int | None = None,
    rpc_timeout: float = 30.0,
    worker_concurrency: int = 1,
    channel_size: str = "16MB",
    channel_capacity: int | None = None,
) -> Any:
    """GLT's worker options for the test graph; ``channel_capacity`` overrides GLT's
    ``num_workers x worker_concurrency`` (see ``STOCK_SAFE_CHANNEL_CAPACITY``)."""
    import torch
    from graphlearn_torch.distributed import MpDistSamplingWorkerOptions

    opts = MpDistSamplingWorkerOptions(
        num_workers=num_workers,
        worker_devices=[torch.device("cpu")] * num_workers,
        worker_concurrency=worker_concurrency,
        master_addr="127.0.0.1",
        master_port=master_port if master_port is not None else free_port(),
        num_rpc_threads=1,
        rpc_timeout=rpc_timeout,
        channel_size=channel_size,
    )
    if channel_capacity is not None:
        opts.channel_capacity = channel_capacity
    return opts


def build_loader(
    dataset: Any,
    worker_options: Any | None = None,
    *,
    batch_size: int = BATCH_SIZE,
    seed: int = LOADER_SEED,
    loader_cls: Any = None,
    **loader_kwargs: Any,
) -> Any:
    """A ``DistNeighborLoader`` (or ``loader_cls``) over all nodes, shuffled with a fixed seed.

    Requires ``set_spawn()`` and ``init_single_process_context()`` first. Blocks until the
    producer's workers are past GLT's init barrier (that is the loader's start-up time).
    """
    import torch
    from graphlearn_torch.distributed import DistNeighborLoader

    cls = loader_cls if loader_cls is not None else DistNeighborLoader
    return cls(
        dataset,
        list(NUM_NEIGHBORS),
        torch.arange(dataset.node_labels.numel()),
        batch_size=batch_size,
        shuffle=True,
        collect_features=True,
        to_device=torch.device("cpu"),
        random_seed=seed,
        worker_options=worker_options if worker_options is not None else make_worker_options(),
        **loader_kwargs,
    )


def batch_digest(batch: Any) -> tuple[int, str]:
    """(first seed, sha256) of one sampled batch in global ids: seeds, nodes, edges, x, y."""
    import torch

    node = batch.node
    seeds = batch.batch if getattr(batch, "batch", None) is not None else node[: batch.batch_size]
    h = hashlib.sha256()
    for t in (seeds, node, node[batch.edge_index], batch.y, batch.x):
        h.update(t.contiguous().cpu().numpy().tobytes())
    h.update(torch.tensor([batch.batch_size]).numpy().tobytes())
    return int(seeds[0]), h.hexdigest()


def epoch_checksum(digests: Sequence[tuple[int, str]]) -> str:
    """Order-independent checksum of one epoch (from ``batch_digest`` values): the workers
    interleave their batches freely, so only the set of batches is reproducible."""
    h = hashlib.sha256()
    for _, d in sorted(digests):
        h.update(d.encode())
    return h.hexdigest()


def clone_batch(batch: Any) -> Any:
    """A copy of a batch that owns its memory.

    On CPU, ``DistLoader._collate_fn`` calls ``.to(cpu)``, a no-op, so every tensor of a batch
    is a zero-copy view into the loader's shared-memory ring buffer and the ring slot is
    released only when the last view dies. Keeping more than ``channel_capacity``
    (``num_workers * worker_concurrency``) batches alive therefore stalls the producers and the
    next ``recv()`` forever, with every process alive. Clone what you keep.
    """
    return batch.clone()


@dataclass
class Epoch:
    digests: list[tuple[int, str]]  # (first seed, sha256) per batch, in arrival order
    seeds: list[int]  # every seed of the epoch, sorted
    kept: list[Any]  # clones of the batches when asked for

    @property
    def checksum(self) -> str:
        return epoch_checksum(self.digests)


def consume_epoch(loader: Any, keep: bool = False) -> Epoch:
    """Iterate one epoch; digests and seeds of every batch, plus clones of them when ``keep``."""
    digests: list[tuple[int, str]] = []
    seeds: list[int] = []
    kept: list[Any] = []
    for batch in loader:
        digests.append(batch_digest(batch))
        seeds.extend(int(s) for s in batch.batch)
        if keep:
            kept.append(clone_batch(batch))
        del batch  # release the ring-buffer slot before the next recv()
    return Epoch(digests, sorted(seeds), kept)


@dataclass
class EpochResult:
    startup_s: float
    epoch_s: list[float]
    shutdown_s: float
    num_batches: list[int]
    checksums: list[str]
    every_seed_once: bool


def run_epochs(
    num_epochs: int = 1,
    num_workers: int = 2,
    batch_size: int = BATCH_SIZE,
    seed: int = LOADER_SEED,
    loader_cls: Any = None,
    dataset: Any = None,
) -> EpochResult:
    """Build a loader, run ``num_epochs`` epochs, shut it down; timings and checksums."""
    set_spawn()
    init_single_process_context()
    if dataset is None:
        dataset = build_dataset()
    t0 = time.monotonic()
    loader = build_loader(
        dataset,
        make_worker_options(
            num_workers=num_workers,
            channel_capacity=one_epoch_capacity(dataset.node_labels.numel(), batch_size),
        ),
        batch_size=batch_size,
        seed=seed,
        loader_cls=loader_cls,
    )
    startup = time.monotonic() - t0
    epochs, counts, sums = [], [], []
    covered = True
    try:
        for _ in range(num_epochs):
            t = time.monotonic()
            ep = consume_epoch(loader)
            epochs.append(time.monotonic() - t)
            counts.append(len(ep.digests))
            sums.append(ep.checksum)
            covered = covered and ep.seeds == list(range(dataset.node_labels.numel()))
    finally:
        t = time.monotonic()
        loader.shutdown()
        shutdown = time.monotonic() - t
    return EpochResult(startup, epochs, shutdown, counts, sums, covered)
