"""GLT's link and subgraph loaders, stock and healthkit_glt's, run as scripts in their own
process group (as ``glt_scenarios``: a stock hang blocks inside C++, which only a group
SIGKILL ends).

Run one by hand::

    .venv-glt/bin/python tests/glt/glt_loader_kinds.py sigkill link hk

Each scenario prints ``RESULT {json}`` lines that tests/glt/test_loader_kinds.py parses.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import glt_fixtures as fx
import glt_procs as procs
import glt_stock_hangs as stock

KINDS = ("link", "subgraph")
CLASSES = {"link": "DistLinkNeighborLoader", "subgraph": "DistSubGraphLoader"}
#: Seeds per epoch (edges for the link loader, nodes for the subgraph loader): 5 batches.
NUM_SEEDS = 5 * fx.BATCH_SIZE
#: One sampling worker per loader: what these tests prove does not depend on how many
#: there are (test_healthkit_glt.py runs the neighbor loader's, the same machinery, with
#: two), and each worker costs seconds of start-up.
NUM_WORKERS = 1
VICTIM = NUM_WORKERS - 1


def _say(msg: str) -> None:
    print(f"[loader-kinds {time.monotonic():.3f}] {msg}", flush=True)


def _result(**fields: Any) -> None:
    print("RESULT " + json.dumps(fields, default=str), flush=True)


def build(
    kind: str, dataset: Any, mode: str, num_seeds: int = NUM_SEEDS, **kwargs: Any
) -> Any:
    """A ``kind`` loader (``mode``: ``stock`` GLT's class, ``hk`` healthkit_glt's) over
    ``num_seeds`` seeds of the test graph, shuffled with the fixed seed. ``stock`` runs with a
    channel capacity that rules out its concurrent-writer stall (see glt_fixtures);
    ``stock-small`` with GLT's default capacity (2 here), where a worker can be parked in
    ``send()`` with batches still to come."""
    import graphlearn_torch as glt
    import healthkit_glt as hg
    import torch

    cls = getattr(hg if mode == "hk" else glt.distributed, CLASSES[kind])
    options = fx.make_worker_options(
        num_workers=NUM_WORKERS,
        channel_capacity=fx.one_epoch_capacity(num_seeds) if mode == "stock" else None,
    )
    common: dict[str, Any] = {
        "batch_size": fx.BATCH_SIZE, "shuffle": True, "collect_features": True,
        "to_device": torch.device("cpu"), "random_seed": fx.LOADER_SEED,
        "worker_options": options, **kwargs,
    }  # fmt: skip
    if kind == "link":
        # With negative sampling, as GLT's own tests: without it and without edge labels,
        # GLT's link sampler puts a None label into the message, which its channel refuses.
        seeds = fx.build_edge_index()[:, :num_seeds]
        return cls(dataset, list(fx.NUM_NEIGHBORS), edge_label_index=seeds,
                   neg_sampling=glt.sampler.NegativeSampling("binary"), **common)  # fmt: skip
    return cls(dataset, torch.arange(num_seeds), num_neighbors=list(fx.NUM_NEIGHBORS), **common)


def batch_digest(batch: Any) -> str:
    """sha256 of every tensor of a batch (link and subgraph batches have no ``batch``
    field, so ``glt_fixtures.batch_digest`` does not apply), keys in order."""
    import torch

    h = hashlib.sha256()
    for key, value in sorted(batch.to_dict().items()):
        h.update(key.encode())
        if isinstance(value, torch.Tensor):
            h.update(value.contiguous().cpu().numpy().tobytes())
        else:
            h.update(repr(value).encode())
    return h.hexdigest()


def epoch(loader: Any) -> list[str]:
    """One epoch's batch digests, sorted (the workers interleave their batches freely)."""
    digests = []
    for batch in loader:
        digests.append(batch_digest(batch))
        del batch  # release the ring-buffer slot before the next recv()
    return sorted(digests)


# --- scenarios ----------------------------------------------------------------------------


def scenario_clean() -> None:
    """Nothing fails. For each kind: stock GLT's epoch, then healthkit_glt's over the same
    seed; the link loader is shut down explicitly, the subgraph loader is left to the
    interpreter's exit (the script just ends)."""
    fx.set_spawn()  # stock GLT needs it (its mp.Value); healthkit_glt does not mind
    fx.init_single_process_context()
    dataset = fx.build_dataset()
    kept = []
    for kind in KINDS:
        _say(f"{kind}: stock GLT's loader")
        loader = build(kind, dataset, "stock")
        stock_run = epoch(loader)
        loader.shutdown()
        del loader
        gc.collect()  # stock's ring segment goes with its loader
        before = procs.sysv_shm_created_by([os.getpid()])
        _say(f"{kind}: healthkit_glt's loader")
        loader = build(kind, dataset, "hk", stall_timeout=60.0)  # a producer argument
        _say(f"{kind}: built")
        runs = [epoch(loader), epoch(loader)]
        _say(f"{kind}: two epochs")
        fields: dict[str, Any] = {
            "kind": kind, "batches": len(runs[0]), "same_as_stock": runs[0] == stock_run,
            "second_epoch_same_batches": runs[1] == runs[0],
            "stall_timeout": loader.producer.stall_timeout,
        }  # fmt: skip
        if kind == "link":
            producer = loader.producer
            t = time.monotonic()
            loader.shutdown()
            fields["shutdown_s"] = time.monotonic() - t
            t = time.monotonic()
            loader.shutdown()
            fields["again_s"] = time.monotonic() - t
            fields["bound_s"] = producer.grace + 2 * producer.kill_after
            fields["worker_exit_codes"] = [w.exitcode for w in producer.workers]
            fields["failure"] = repr(producer.failure)
            fields["segments_left"] = sorted(
                set(procs.sysv_shm_created_by([os.getpid()])) - set(before)
            )
            try:
                iter(loader)
            except Exception as e:
                fields["iter_after_shutdown"] = type(e).__name__
            del producer
        else:
            fields["worker_pids"] = [w.pid for w in loader.producer.workers]
            kept.append(loader)  # ended by the interpreter's exit
        _result(**fields)
        del loader
    _say("ending without shutdown() of the subgraph loader")


def scenario_sigkill(kind: str, mode: str, pre_kill_sleep: float = 0.5) -> None:
    """SIGKILL sampling worker :data:`VICTIM` after the first batch of an epoch (the consumer
    slow for ``pre_kill_sleep``, so the workers are parked in ``send()``). healthkit_glt's
    loader must raise within seconds naming the worker; stock GLT's waits in
    ``ShmChannel.recv()``. An epoch of every node's worth of seeds (16 batches) through GLT's
    default channel capacity (one per worker): the dead worker's batches are still to come
    when it dies."""
    fx.set_spawn()
    fx.init_single_process_context()
    mode = "stock-small" if mode == "stock" else mode
    loader = build(kind, fx.build_dataset(), mode, num_seeds=fx.NUM_NODES)
    workers = loader.producer.workers if mode == "hk" else loader._mp_producer._workers
    it = iter(loader)
    batch = next(it)
    del batch
    time.sleep(pre_kill_sleep)
    os.kill(workers[VICTIM].pid, signal.SIGKILL)
    killed = time.monotonic()
    _say(f"{stock.KILL_MARK} {VICTIM} (pid {workers[VICTIM].pid}) after batch 1")
    n = 1
    try:
        while True:  # next(), not a for loop: iter() again would start another epoch
            try:
                batch = next(it)
            except StopIteration:
                break
            n += 1
            del batch
    except Exception as e:
        now = time.monotonic()
        d = getattr(e, "diagnosis", None)
        again = None
        try:
            iter(loader)
        except Exception as e2:
            again = e2 is e
        _result(outcome="raised", type=type(e).__name__, message=str(e), batches=n,
                after_kill_s=now - killed, rank=getattr(e, "rank", None),
                signal=d.signal.name if d is not None and d.signal else None,
                same_error_on_reuse=again, worker_exit_codes=[w.exitcode for w in workers],
                children_left=procs.spawned_worker_pids())  # fmt: skip
        loader.shutdown()  # idempotent: already torn down
        return
    _say(f"UNEXPECTED: epoch finished with {n} batches")
    _result(outcome="finished", batches=n)


SCENARIOS = {
    "clean": lambda a: scenario_clean(),
    "sigkill": lambda a: scenario_sigkill(a[0], a[1], *(float(x) for x in a[2:])),
}


def run(name: str, args: Sequence[str] = (), timeout: float = 90.0, **kwargs: Any) -> stock.Run:
    """Run a scenario in its own process group (``glt_stock_hangs.run_script``)."""
    return stock.run_script(os.path.abspath(__file__), [name, *args], timeout, **kwargs)


def main(argv: Sequence[str]) -> int:
    if not argv or argv[0] not in SCENARIOS:
        print(f"usage: glt_loader_kinds.py {{{','.join(SCENARIOS)}}} [args]")
        return 2
    SCENARIOS[argv[0]](list(argv[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
