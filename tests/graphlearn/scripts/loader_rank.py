"""A rank whose GL clients live in DataLoader workers, as TorchEasyRec's do.

Run as a plain process or under torchrun, with a scratch directory as the current directory
(GL writes glog files there). The sampler class is tzrec's ``BaseSampler`` as migrated in
docs/graphlearn.md (``--sampler after``: the "after" code block is extracted from the docs by
the test and given as ``--after-code``), or the adoption this integration documented before
``die_with_rank`` existed (``--sampler today``, optionally with ``--die-with-rank``).

Each of ``--workers`` DataLoader workers opens its GL client lazily in ``__iter__`` (tzrec's
``BaseDataset.__iter__`` calls ``sampler.init()``) and then samples in a loop. Once every
worker has delivered a batch the rank prints
``READY rank=<pid> server=<pid or 0> sidecar=<pid or 0> workers=<pid>,<pid>``; it then keeps
consuming batches, ``--steps`` in all (0: until killed), and prints ``DONE`` at the end.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import gl_harness
import healthkit_graphlearn as hkgl

SKIP_RC = 77


class _Config:
    """The bits of tzrec's sampler proto the migrated ``BaseSampler.__init__`` reads."""

    attr_fields: tuple[str, ...] = ()

    def HasField(self, name: str) -> bool:
        return False


def _after_base(path: str) -> Any:
    spec = importlib.util.spec_from_file_location("tzrec_sampler_after", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["tzrec_sampler_after"] = module
    spec.loader.exec_module(module)
    return module.BaseSampler


class TodaySampler:
    """tzrec's BaseSampler adopted as docs/graphlearn.md said before ``die_with_rank``."""

    def __init__(self, mode: str, die_with_rank: bool) -> None:
        self._g: Any = None
        self._die_with_rank = die_with_rank
        self._cluster: dict[str, Any] | None = None
        self._num_client_per_rank = 1
        self._client_id_bias = 0
        self._mode = mode
        self._server: Any = None

    def init_cluster(self, num_client_per_rank: int = 1, client_id_bias: int = 0) -> None:
        self._num_client_per_rank = num_client_per_rank
        self._client_id_bias = client_id_bias
        self._cluster = hkgl.get_cluster_spec(num_client_per_rank)

    def launch_server(self) -> None:
        gl = hkgl.import_graphlearn()
        gl.set_tracker_mode(0)
        self._server = hkgl.launch_sampler_server(
            self._g, self._cluster, hkgl.DistEnv.from_environ().group_rank, mode=self._mode
        )

    def init(self, client_id: int = -1) -> None:
        gl = hkgl.import_graphlearn()
        gl.set_tracker_mode(0)
        if self._die_with_rank:
            hkgl.die_with_rank()
        task_index = hkgl.client_task_index(
            client_id,
            num_client_per_rank=self._num_client_per_rank,
            client_id_bias=self._client_id_bias,
        )
        self._g.init(task_index=task_index, job_name="client", cluster=self._cluster)


def make_sampler(args: Any, node_file: str) -> Any:
    kind = args.sampler
    gl = hkgl.import_graphlearn()
    base = TodaySampler if kind == "today" else _after_base(str(args.after_code))

    class NegativeSampler(base):  # type: ignore[misc, valid-type]
        """tzrec's NegativeSampler, cut down to one weighted item table."""

        def __init__(self) -> None:
            if kind == "today":
                super().__init__(args.mode, args.die_with_rank)
            else:
                super().__init__(_Config(), [], 2)
            self._g = gl_harness.build_graph(gl, node_file)
            self._sampler: Any = None

        def get(self, ids: list[int]) -> list[int]:
            if self._sampler is None:
                self._sampler = self._g.negative_sampler(
                    gl_harness.NODE_TYPE, math.ceil(4 / 2), strategy="node_weight"
                )
            return [int(i) for i in self._sampler.get(ids).ids.reshape(-1)]

    return NegativeSampler()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sampler", choices=["today", "after"], default="after")
    ap.add_argument("--after-code", default=None)
    ap.add_argument("--mode", default="sidecar", choices=["sidecar", "thread"], help="today only")
    ap.add_argument("--die-with-rank", action="store_true", help="today only")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=0)
    args = ap.parse_args()
    logging.basicConfig(
        stream=sys.stderr, level=logging.INFO, format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        hkgl.import_graphlearn()
    except hkgl.GraphLearnImportError as e:
        print(e, file=sys.stderr)
        return SKIP_RC
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, IterableDataset

    if "TORCHELASTIC_RUN_ID" in os.environ:
        dist.init_process_group("gloo")
    env = hkgl.DistEnv.from_environ()
    node_file = gl_harness.write_node_file(Path.cwd() / "items.txt")
    sampler = make_sampler(args, node_file)
    sampler.init_cluster(num_client_per_rank=args.workers)
    sampler.launch_server()

    class Samples(IterableDataset[Any]):
        """tzrec's BaseDataset: the sampler's client is opened in the worker, once."""

        def __init__(self) -> None:
            self._sampler = sampler
            self._sampler_inited = False

        def __iter__(self) -> Any:
            if not self._sampler_inited:
                self._sampler.init()
                self._sampler_inited = True
            i = 0
            while True:
                ids = self._sampler.get([i % 100, (i + 1) % 100])
                yield torch.tensor(os.getpid()), torch.tensor(ids)
                i += 1

    loader = DataLoader(
        Samples(), batch_size=None, num_workers=args.workers, persistent_workers=True
    )
    workers: set[int] = set()
    step = 0
    for pid, ids in loader:
        assert all(0 <= i < 100 for i in ids.tolist())
        if len(workers) < args.workers:
            workers.add(int(pid))
            if len(workers) == args.workers:
                server = getattr(sampler, "_server", None)
                srv = server.pid if server is not None else 0
                side = (server.watchdog.sidecar_pid or 0) if server is not None else 0
                print(
                    f"READY rank={os.getpid()} server={srv} sidecar={side} "
                    f"workers={','.join(map(str, sorted(workers)))}",
                    flush=True,
                )
        step += 1
        if args.steps and step >= args.steps:
            break
        time.sleep(0.01)
    print(f"DONE rank={env.rank} steps={step}", flush=True)
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
