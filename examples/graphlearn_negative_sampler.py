"""A tzrec-style GL negative sampler on healthkit_graphlearn, and a toy torchrun job using it.

    cd /some/scratch/dir   # GL writes its glog files into the current directory
    torchrun --nproc_per_node=2 /path/to/examples/graphlearn_negative_sampler.py --steps 50

Each node's LOCAL_RANK 0 runs the GL server (forked, watched); every rank runs a loop of
``sampler.get()`` + a gloo ``all_reduce``. The GL client is in the rank's main process, or,
with ``--workers N``, in each of N DataLoader workers, as TorchEasyRec runs it (the server then
loads in the background, ``wait=False``, and each worker dies with its rank). Kill the server
(``kill -9 <pid>``, pid in ``--pid-file``) and the job ends in about a second with the
server's diagnosis as torchrun's root cause, instead of hanging for ~17 minutes, and no
worker stays behind.

The sampler class mirrors tzrec's ``BaseSampler``/``NegativeSampler``
(tzrec/datasets/sampler.py); the lines marked ``# healthkit`` are what adopting it changes.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import time
from typing import Any

from healthkit_graphlearn import (
    DistEnv,
    client_task_index,
    die_with_rank,
    get_cluster_spec,
    import_graphlearn,
    launch_sampler_server,
    shorten_client_retries,
)

gl = import_graphlearn()  # tzrec: `import graphlearn as gl`


class NegativeSampler:
    """Weighted random sampling of items, served by one GL server per node."""

    def __init__(self, node_file: str, num_sample: int, batch_size: int) -> None:
        self._num_sample = num_sample
        self._batch_size = batch_size
        self._g = gl.Graph().node(
            node_file,
            node_type="item",
            decoder=gl.Decoder(
                attr_types=["int", "int", "string"], weighted=True, attr_delimiter=":"
            ),
        )
        self._cluster: dict[str, Any] | None = None
        self._num_client_per_rank = 1
        self._client_id_bias = 0
        self._server: Any = None
        self._sampler: Any = None
        self._shorten_after_first_call = False

    def init_cluster(
        self, num_client_per_rank: int = 1, client_id_bias: int = 0, host: str | None = None
    ) -> None:
        self._num_client_per_rank = num_client_per_rank
        self._client_id_bias = client_id_bias
        self._cluster = get_cluster_spec(num_client_per_rank, host=host)  # healthkit

    def launch_server(self, **kwargs: Any) -> None:
        """``kwargs``: ``mode=``, ``wait=`` ... of :func:`launch_sampler_server`."""
        assert self._cluster, "should init cluster first."
        gl.set_tracker_mode(0)
        env = DistEnv.from_environ()  # healthkit
        self._server = launch_sampler_server(self._g, self._cluster, env.group_rank, **kwargs)

    def init(self, client_id: int = -1, shorten_retries: bool = False) -> None:
        assert self._cluster, "should init cluster first."
        gl.set_tracker_mode(0)
        die_with_rank()  # healthkit: in a DataLoader worker, die with the rank
        task_index = client_task_index(  # healthkit
            client_id,
            num_client_per_rank=self._num_client_per_rank,
            client_id_bias=self._client_id_bias,
        )
        self._g.init(task_index=task_index, job_name="client", cluster=self._cluster)
        expand_factor = math.ceil(self._num_sample / self._batch_size)
        self._sampler = self._g.negative_sampler("item", expand_factor, strategy="node_weight")
        self._shorten_after_first_call = shorten_retries

    def get(self, ids: list[int]) -> Any:
        nodes = self._sampler.get(ids)
        if self._shorten_after_first_call:  # healthkit (optional, see docs/graphlearn.md)
            shorten_client_retries()
            self._shorten_after_first_call = False
        return nodes.ids.reshape(-1)

    def close(self) -> None:
        """Stop this rank's GL client (tzrec does it in ``__del__``). GL's client threads still
        running at interpreter exit can corrupt the heap (SIGABRT, exit -6)."""
        if self._g is not None:
            self._g.close()
            self._g = None
            self._sampler = None

    def __del__(self) -> None:
        self.close()

    @property
    def server_pid(self) -> int | None:
        return None if self._server is None else int(self._server.pid)


def write_node_file(path: str, num_nodes: int = 100) -> None:
    """A tiny item table in tzrec's format: id, weight, attrs."""
    with open(path, "w", encoding="utf-8") as f:
        f.write("id:int64\tweight:float\tattrs:string\n")
        for i in range(num_nodes):
            f.write(f"{i}\t1\t{i}:{i + 1000}:s{i}\n")


def _worker_loader(sampler: NegativeSampler, workers: int, shorten: bool) -> Any:
    """A DataLoader whose workers each open their own GL client, as tzrec's dataset does."""
    import torch
    from torch.utils.data import DataLoader, IterableDataset

    class Samples(IterableDataset[Any]):
        def __iter__(self) -> Any:
            sampler.init(shorten_retries=shorten)  # in the worker: its own client
            i = 0
            while True:
                yield torch.as_tensor(sampler.get([i % 100, (i + 1) % 100]))
                i += 1

    return DataLoader(Samples(), batch_size=None, num_workers=workers, persistent_workers=True)


def main() -> int:
    import torch
    import torch.distributed as dist

    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=50, help="0: run until killed")
    ap.add_argument("--host", default=None, help="server host (default: this host's address)")
    ap.add_argument("--mode", default="sidecar", choices=["sidecar", "thread"])
    ap.add_argument("--shorten-retries", action="store_true")
    ap.add_argument("--workers", type=int, default=0, help="GL clients in N DataLoader workers")
    ap.add_argument("--pid-file", default=None, help="rank 0 writes the server's pid here")
    args = ap.parse_args()
    logging.basicConfig(
        stream=sys.stderr, level=logging.INFO, format="%(levelname)s %(name)s: %(message)s"
    )

    dist.init_process_group("gloo")
    env = DistEnv.from_environ()
    node_file = os.path.abspath("items.txt")
    if env.local_rank == 0:
        write_node_file(node_file)
    sampler = NegativeSampler(node_file, num_sample=4, batch_size=2)
    sampler.init_cluster(num_client_per_rank=max(args.workers, 1), host=args.host)
    # With workers, the server loads in the background while the DataLoader starts (tzrec).
    sampler.launch_server(mode=args.mode, wait=args.workers == 0)
    if args.pid_file and sampler.server_pid is not None:
        with open(args.pid_file + ".tmp", "w") as f:
            f.write(str(sampler.server_pid))
        os.replace(args.pid_file + ".tmp", args.pid_file)
    dist.barrier()  # every node's server is launched (with workers: maybe still loading)
    if args.workers:
        batches = iter(_worker_loader(sampler, args.workers, args.shorten_retries))
        get = lambda i: next(batches)  # noqa: E731
    else:
        sampler.init(shorten_retries=args.shorten_retries)
        get = lambda i: sampler.get([i % 100, (i + 1) % 100])  # noqa: E731

    step = 0
    while args.steps == 0 or step < args.steps:
        ids = get(step)
        total = torch.tensor([float(ids.sum())])
        dist.all_reduce(total)
        if step == 1:
            print(f"TRAINING rank={env.rank}", flush=True)
        step += 1
        time.sleep(0.01)
    if not args.workers:  # (workers' clients end with the workers)
        sampler.close()  # every client disconnects before any server goes away
    dist.barrier()
    print(f"JOB DONE rank={env.rank} steps={step}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
