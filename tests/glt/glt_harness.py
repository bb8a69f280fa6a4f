"""A small, real harness around stock graphlearn-torch (GLT) in multiprocessing sampling mode.

Importable by the glt tests (they put this directory on ``sys.path``) and runnable as a script
for measurements and for reproducing the two stock hangs in a disposable process group::

    H=".venv-glt/bin/python tests/glt/glt_harness.py"
    $H bench 5                               # start-up, epoch and shutdown times, checksums
    $H run hang-init 45 [KILL_AFTER] [RANK]  # SIGKILL a worker during init (default 0.5 s, 0)
    $H run hang-epoch 45 [TIMEOUT_MS] [SLOW] # SIGKILL worker 1 after batch 1 (0 = stock recv)
    $H run hold-batches 45                   # nothing dies; the consumer keeps CPU batches
    $H run shutdown-after-death 45           # what stock shutdown() does after a death
    $H recv-timeout                          # ShmChannel.recv(timeout_ms) on an empty channel

``run SCENARIO TIMEOUT`` runs the scenario in its own session; if it is still running at
TIMEOUT seconds every process of the group dumps its stacks (SIGUSR1, faulthandler via a
``sitecustomize``), then the group is SIGKILLed and its leaked SysV segment removed.

Set-up for one process (world size 1): the loader's process only needs a GLT *worker* context
(``init_worker_group(1, 0)``). DistLoader refuses mp mode unless ``get_context().is_worker()``,
and the producer derives the sampling workers' RPC world (``num_workers x world_size``) and
ranks from that context. The loader's own process does not need ``init_rpc``: only the spawned
sampling workers form an RPC group, among themselves, on ``master_port``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

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


def free_port(host: str = "127.0.0.1") -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


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
    edge_index = torch.randint(0, num_nodes, (2, num_edges), generator=gen)
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


# --- child processes of the loader -------------------------------------------------------


def child_pids(pid: int | None = None) -> list[int]:
    out: list[int] = []
    pid = os.getpid() if pid is None else pid
    for tid in os.listdir(f"/proc/{pid}/task"):
        with (
            contextlib.suppress(FileNotFoundError),
            open(f"/proc/{pid}/task/{tid}/children") as f,
        ):
            out.extend(int(x) for x in f.read().split())
    return out


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def spawned_worker_pids(pid: int | None = None) -> list[int]:
    """Children started by the spawn start method (not the resource tracker)."""
    return [
        p
        for p in child_pids(pid)
        if "multiprocessing.spawn" in cmdline(p) and "resource_tracker" not in cmdline(p)
    ]


# --- stock-hang scenarios (run in a throwaway process group) -----------------------------

_SITECUSTOMIZE = """\
import faulthandler, os, signal
_d = os.environ.get("HK_STACK_DIR")
if _d:
    _f = open(os.path.join(_d, "stack-%d.txt" % os.getpid()), "w")
    faulthandler.register(signal.SIGUSR1, file=_f, all_threads=True)
"""


@contextlib.contextmanager
def sigusr1_stack_dumps() -> Iterator[tuple[dict[str, str], str]]:
    """(env, stack dir) for a child tree in which every Python process writes all its stacks
    to ``<stack dir>/stack-<pid>.txt`` on SIGUSR1.

    A ``sitecustomize`` on PYTHONPATH is imported by every interpreter at start-up, including
    the sampling workers GLT spawns, so no GLT code is touched.
    """
    with tempfile.TemporaryDirectory(prefix="glt-site-") as d:
        with open(os.path.join(d, "sitecustomize.py"), "w") as f:
            f.write(_SITECUSTOMIZE)
        stacks = os.path.join(d, "stacks")
        os.mkdir(stacks)
        env = dict(os.environ)
        here = os.path.dirname(os.path.abspath(__file__))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (d, here, env.get("PYTHONPATH", "")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        env["HK_STACK_DIR"] = stacks
        yield env, stacks


def _read_stacks(stacks: str, cmdlines: dict[int, str]) -> str:
    parts = []
    for name in sorted(os.listdir(stacks)):
        pid = int(name[len("stack-") : -len(".txt")])
        with open(os.path.join(stacks, name)) as f:
            text = f.read()
        if text:
            parts.append(f"--- stacks of pid {pid}: {cmdlines.get(pid, '?')[:110]}\n{text}")
    return "\n".join(parts)


def _stat_fields(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rpartition(")")[2].split()  # [state, ppid, pgrp, ...]


def pids_in_group(pgid: int, include_zombies: bool = False) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fields = _stat_fields(int(name))
        except OSError:
            continue
        if int(fields[2]) == pgid and (include_zombies or fields[0] != "Z"):
            out.append(int(name))
    return out


def remove_orphan_sysv_shm(creator_pids: Sequence[int]) -> list[int]:
    """IPC_RMID the unattached SysV segments created by ``creator_pids``.

    GLT's ShmChannel is a SysV segment (shmget) that only its creator's destructor removes;
    a SIGKILLed loader process leaves it behind (``ipcs -m``) for the life of the machine.
    """
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    removed = []
    for row in sysv_shm_rows():
        if int(row["cpid"]) in creator_pids and int(row["nattch"]) == 0:
            if libc.shmctl(int(row["shmid"]), 0, None) == 0:  # 0 == IPC_RMID
                removed.append(int(row["shmid"]))
    return removed


def sysv_shm_rows() -> list[dict[str, str]]:
    """Every SysV shared-memory segment, as ``/proc/sysvipc/shm`` lists it (column: value)."""
    with open("/proc/sysvipc/shm") as f:
        header = f.readline().split()
        return [dict(zip(header, line.split(), strict=False)) for line in f]


def _sysv_shm_created_by(creator_pids: Sequence[int]) -> list[int]:
    return [int(r["shmid"]) for r in sysv_shm_rows() if int(r["cpid"]) in creator_pids]


@dataclass
class Run:
    returncode: int | None  # None: still running at the deadline (hung), then killed
    elapsed_s: float
    output: str
    results: list[dict[str, Any]]
    stacks: str  # SIGUSR1 dumps of every process of the group when it hung
    leaked_segments: list[int]  # SysV segments of the group still there once it was gone
    survivors: list[int]  # group members alive after the script ended on its own

    @property
    def result(self) -> dict[str, Any]:
        assert self.results, f"no RESULT line; output:\n{self.output[-4000:]}"
        return self.results[-1]


def run_script(
    script: str, args: Sequence[str], timeout: float, extra_env: dict[str, str] | None = None
) -> Run:
    """Run ``script args`` in a new session; at ``timeout`` dump every stack of the group
    (SIGUSR1), SIGKILL the group we created, wait for it, then remove (and report) the SysV
    segments its processes left behind."""
    with sigusr1_stack_dumps() as (env, stacks), tempfile.TemporaryFile(mode="w+") as out:
        env.update(extra_env or {})
        t0 = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, script, *args], stdout=out, stderr=subprocess.STDOUT, env=env,
            start_new_session=True,
        )  # fmt: skip
        pgid = proc.pid
        rc: int | None
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
        elapsed = time.monotonic() - t0
        members = pids_in_group(pgid)
        survivors: list[int] = []
        if rc is not None:  # ended on its own: does anything of it outlive it? (bounded)
            settle = time.monotonic() + 5
            while pids_in_group(pgid) and time.monotonic() < settle:
                time.sleep(0.02)
            survivors = pids_in_group(pgid)
        cmdlines = {p: cmdline(p) for p in members}
        if rc is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGUSR1)
            time.sleep(2.0)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 10
        while pids_in_group(pgid) and time.monotonic() < deadline:
            time.sleep(0.02)
        creators = [proc.pid, *members]
        leaked: list[int] = []
        shm_deadline = time.monotonic() + 5
        while True:
            left = _sysv_shm_created_by(creators)
            leaked = sorted(set(leaked) | set(left))
            remove_orphan_sysv_shm(creators)
            if not _sysv_shm_created_by(creators) or time.monotonic() > shm_deadline:
                break
            time.sleep(0.05)
        out.seek(0)
        text = out.read()
        results = [json.loads(line[7:]) for line in text.splitlines() if line.startswith("RESULT ")]
        return Run(rc, elapsed, text, results, _read_stacks(stacks, cmdlines), leaked,
                   survivors)  # fmt: skip


def _say(msg: str) -> None:
    print(f"[driver {time.monotonic():.3f}] {msg}", flush=True)


def _scenario_hang_init(kill_after: float = 0.5, victim: int = 0) -> None:
    """Stock GLT: SIGKILL sampling worker ``victim`` (spawn order) ``kill_after`` seconds after
    both workers exist, while the producer waits in its init barrier."""
    import threading

    set_spawn()
    init_single_process_context()
    dataset = build_dataset()

    def killer() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            pids = sorted(spawned_worker_pids())
            if len(pids) == 2:
                time.sleep(kill_after)  # let it get into interpreter / torch start-up
                os.kill(pids[victim], signal.SIGKILL)
                _say(f"SIGKILLed sampling worker {victim} (pid {pids[victim]}) during init")
                return
            time.sleep(0.005)

    threading.Thread(target=killer, name="harness-killer", daemon=True).start()
    _say("building DistNeighborLoader (stock); expected to hang in producer init")
    loader = build_loader(dataset)
    _say("UNEXPECTED: loader built")
    loader.shutdown()


def _scenario_hang_epoch(recv_timeout_ms: int = 0, pre_kill_sleep: float = 0.0) -> None:
    """Stock GLT: SIGKILL sampling worker 1 after the first batch of an epoch arrives.

    ``pre_kill_sleep``: a slow consumer (seconds) before the kill, so the workers are parked in
    ``ShmChannel.send`` with ring slots already claimed. ``recv_timeout_ms > 0``: keep reading
    with ``ShmChannel.recv(timeout_ms=...)`` instead of the loader's unbounded ``recv()``.
    """
    from graphlearn_torch.channel import QueueTimeoutError

    set_spawn()
    init_single_process_context()
    dataset = build_dataset()
    loader = build_loader(dataset)
    workers = loader._mp_producer._workers
    _say(f"loader ready; worker pids {[w.pid for w in workers]}")
    it = iter(loader)
    first = next(it)
    del first
    time.sleep(pre_kill_sleep)
    os.kill(workers[1].pid, signal.SIGKILL)
    _say(f"SIGKILLed sampling worker pid {workers[1].pid} after batch 1")
    n = 1
    if recv_timeout_ms <= 0:
        _say("continuing the epoch with the loader; expected to hang in ShmChannel.recv()")
        for _ in it:
            n += 1
    else:
        _say(f"continuing with channel.recv(timeout_ms={recv_timeout_ms})")
        while n < loader._num_expected:
            try:
                msg = loader._channel.recv(timeout_ms=recv_timeout_ms)
            except QueueTimeoutError as e:
                _say(f"recv timed out after {n} batches: {e!r} (the timeout worked)")
                loader.shutdown()
                sys.exit(3)
            loader._collate_fn(msg)
            del msg
            n += 1
    _say(f"UNEXPECTED: epoch finished with {n} batches")
    loader.shutdown()


def _scenario_hold_batches() -> None:
    """Stock GLT, nothing dies: keep every CPU batch alive (they view the shm ring)."""
    set_spawn()
    init_single_process_context()
    loader = build_loader(build_dataset())
    kept = []
    for batch in loader:
        kept.append(batch)
        _say(f"holding {len(kept)} batches")
    _say(f"UNEXPECTED: epoch finished holding {len(kept)} batches")
    loader.shutdown()


def _scenario_shutdown_after_death() -> None:
    """Stock GLT: a worker dies mid-epoch; what does ``loader.shutdown()`` do and cost?"""
    set_spawn()
    init_single_process_context()
    loader = build_loader(build_dataset())
    producer = loader._mp_producer
    workers = producer._workers
    it = iter(loader)
    del it
    batch = next(loader)
    del batch
    time.sleep(0.5)  # let the survivor park in send() with the ring full
    os.kill(workers[1].pid, signal.SIGKILL)
    workers[1].join(5)
    _say(f"worker 1 exitcode {workers[1].exitcode}; calling loader.shutdown()")
    t = time.monotonic()
    loader.shutdown()
    _say(
        f"shutdown took {time.monotonic() - t:.2f}s; exitcodes right after: "
        f"{[w.exitcode for w in workers]}; children (any state) {child_pids()}; "
        f"zombie children {[p for p in child_pids() if _stat_fields(p)[0] == 'Z']}"
    )
    time.sleep(0.5)
    _say(f"after 0.5s: zombie children {[p for p in child_pids() if _stat_fields(p)[0] == 'Z']}")


def _scenario_recv_timeout() -> None:
    """What ``ShmChannel.recv(timeout_ms=...)`` does on an empty channel."""
    from graphlearn_torch.channel import QueueTimeoutError, ShmChannel

    ch = ShmChannel(capacity=2, shm_size="1MB")
    for ms in (1, 100, 500):
        t = time.monotonic()
        try:
            ch.recv(timeout_ms=ms)
        except QueueTimeoutError as e:
            _say(
                f"recv(timeout_ms={ms}) raised {type(e).__module__}.{type(e).__qualname__} "
                f"after {1000 * (time.monotonic() - t):.1f} ms: {e!r}; mro="
                f"{[c.__name__ for c in type(e).__mro__]}"
            )


def _bench(epochs: int = 5) -> None:
    r = run_epochs(num_epochs=epochs)
    print(
        f"startup_s={r.startup_s:.3f} epoch_s={[round(x, 3) for x in r.epoch_s]} "
        f"shutdown_s={r.shutdown_s:.3f} batches={r.num_batches} "
        f"every_seed_once={r.every_seed_once}"
    )
    print("checksums", r.checksums)


SCENARIOS = {
    "hang-init": lambda a: _scenario_hang_init(
        *(f(x) for f, x in zip((float, int), a, strict=False))
    ),
    "hang-epoch": lambda a: _scenario_hang_epoch(
        *(f(x) for f, x in zip((int, float), a, strict=False))
    ),
    "hold-batches": lambda a: _scenario_hold_batches(),
    "shutdown-after-death": lambda a: _scenario_shutdown_after_death(),
    "recv-timeout": lambda a: _scenario_recv_timeout(),
}


def main(argv: Sequence[str]) -> int:
    cmd, args = (argv[0], list(argv[1:])) if argv else ("bench", [])
    if cmd == "bench":
        _bench(int(args[0]) if args else 5)
    elif cmd in SCENARIOS:
        SCENARIOS[cmd](args)
    elif cmd == "run" and args and args[0] in SCENARIOS:
        timeout = float(args[1]) if len(args) > 1 else 45.0
        r = run_script(os.path.abspath(__file__), [args[0], *args[2:]], timeout)
        print(f"== {args[0]}: rc={r.returncode} elapsed={r.elapsed_s:.1f}s")
        print(r.output)
        print(r.stacks)
    else:
        print(f"usage: bench [epochs] | run SCENARIO [timeout] [args] | {list(SCENARIOS)}")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
