"""healthkit_glt in a training script: GLT's DistNeighborLoader, but a sampling worker that
dies, or whose sampler raises, fails the job in seconds with a diagnosis instead of hanging it.

    .venv-glt/bin/python examples/glt_loader.py                 # 2 epochs on a random graph
    .venv-glt/bin/python examples/glt_loader.py --kill          # SIGKILL a worker mid-epoch
    .venv-glt/bin/python examples/glt_loader.py --bad-features  # features for half the nodes

(``.venv-glt28/bin/python`` runs it on graphlearn-torch built from source with torch 2.8.)
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys

import healthkit_glt
import torch
from graphlearn_torch.distributed import (
    DistDataset,
    MpDistSamplingWorkerOptions,
    init_worker_group,
)

# At module level, not in main(): the spawned sampling workers import this module before they
# run, so this also makes their log lines (e.g. "RPC request timeout narrowed") visible.
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def random_dataset(
    num_nodes: int = 1000, num_edges: int = 10_000, featured: int = 1000
) -> DistDataset:
    gen = torch.Generator().manual_seed(0)
    dataset = DistDataset(
        num_partitions=1,
        partition_idx=0,
        node_pb=torch.zeros(num_nodes, dtype=torch.long),
        edge_pb=torch.zeros(num_edges, dtype=torch.long),
    )
    dataset.init_graph(edge_index=torch.randint(0, num_nodes, (2, num_edges), generator=gen),
                       graph_mode="CPU")  # fmt: skip
    dataset.init_node_features(torch.randn(featured, 16, generator=gen), with_gpu=False)
    dataset.init_node_labels(torch.randint(0, 4, (num_nodes,), generator=gen))
    return dataset


def main() -> int:
    init_worker_group(world_size=1, rank=0, group_name="example")
    dataset = random_dataset(featured=500 if "--bad-features" in sys.argv else 1000)
    options = MpDistSamplingWorkerOptions(
        num_workers=2, worker_devices=[torch.device("cpu")] * 2, worker_concurrency=1,
        master_addr="127.0.0.1", master_port=free_port(), num_rpc_threads=1,
        rpc_timeout=30,  # the steady-state RPC timeout (bring-up uses rpc_init_timeout)
        channel_size="16MB",
    )  # fmt: skip
    loader = healthkit_glt.DistNeighborLoader(
        dataset, [5, 5], torch.arange(1000), batch_size=64, shuffle=True,
        collect_features=True, to_device=torch.device("cpu"), random_seed=42,
        worker_options=options,
        rpc_init_timeout=120,  # bring-up; the init barrier's bound is 3 x this
    )  # fmt: skip
    print(loader.producer.timeouts.describe())
    try:
        for epoch in range(2):
            for i, batch in enumerate(loader):
                if "--kill" in sys.argv and i == 3:
                    os.kill(loader.producer.workers[1].pid, signal.SIGKILL)  # "OOM"
                del batch
            print(f"epoch {epoch}: {i + 1} batches")
    except (healthkit_glt.SamplingWorkerDiedError, healthkit_glt.SamplingError) as e:
        print(f"training stopped: {e}", file=sys.stderr)
        return 1
    finally:
        loader.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
