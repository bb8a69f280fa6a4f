"""Server-client fault scenarios: a GLT sampling server and its clients as separate
processes on this machine, with real GLT RPC (as GLT's own ``test_dist_neighbor_loader``
server-client cases run them), each scenario a script run in its own process group.

    H=".venv-glt/bin/python tests/glt/glt_server_scenarios.py"
    $H faults hk       # healthkit_glt server and clients: every fault below, one run
    $H faults stock    # the same with stock GLT (bounded: each hang watched for HANG_S)
    $H network-loss    # healthkit_glt; needs root (a private network namespace)
    $H network-loss stock
    $H sampler-error stock   # the server's features cover half the nodes
    HK_TEST_SEED_REPEATS=125 $H worker-kill hk 0 0.02  # a worker killed in a 2,000-batch epoch
    $H fail-rebuild 21 0 worker-death,sampler-error,init-failure   # a long-lived server
    $H stall 1         # stall_timeout=1 s: slow, idle, then every worker stuck
    $H healthy hk 3    # three epochs, nothing fails (the overhead benchmark's run)
    $H healthy hk 2 healthy,healthy-stock   # a stock GLT client of the same server too
    $H healthy stock 2 healthy,healthy-hk   # a healthkit_glt client of a stock server

``faults``: one server and three clients, each with its own worker key (so its own
producer on the server) and its own sampling RPC port:

- client ``a``: a full epoch, then mid-epoch the driver SIGKILLs sampling worker 1 of its
  producer on the server while its fetch waits there (its sampler is slowed so that one
  always does); it then shuts its loader down and, once client ``b`` is gone, builds a new
  one and runs a full epoch; mid-epoch again, the driver SIGKILLs the server;
- client ``b``: epochs with a slow consumer, until the driver SIGKILLs it (after ``a``'s
  failure: the server kept serving it); its producer's workers must then go;
- client ``c``: its producer's sampler raises in worker 1 (hk), or it is a healthy
  consumer that sees the server die (stock);
- client ``d``, before any fault: two epochs through the *other* kind of loader (a stock GLT
  loader of the healthkit_glt server; a healthkit_glt loader of the stock server, which
  falls back to GLT's behaviour), then its loader's shutdown.

Times are ``time.monotonic()`` values (CLOCK_MONOTONIC, one clock for every process here).
Every process prints ``RESULT {json}`` lines only through the driver.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import glt_fixtures as fx
import glt_procs as procs
import glt_stock_hangs as stock

HERE = os.path.dirname(os.path.abspath(__file__))
# How long a stock hang is watched before it is called one (the benchmark watches longer).
HANG_S = float(os.environ.get("HK_TEST_HANG_S", "5"))
# Start-up of a server and its clients, at most (about 14 s here when quiet).
READY_S = float(os.environ.get("HK_TEST_READY_S", "180"))
# A client still starting after this long writes its stacks to the run's output once: the
# rare start-up stall (see test_server_client._started) has no known cause yet.
STARTUP_STACKS_S = float(os.environ.get("HK_TEST_STARTUP_STACKS_S", "60"))
SLOW_SAMPLE_S = 0.15  # client a's sampler: per batch, so its fetches wait on the server
CONNECTION_TIMEOUT_S = 4.0  # the leases' keepalive bound in the network-loss scenario


def _not_ready(job: Job, role: str) -> str:
    """The one error of a client that never came up: test_server_client._started runs such a
    scenario once more (what each scenario tests starts after its clients are ready). What
    became of the client is the first evidence of why."""
    p = job.clients[role]
    if p.exitcode is not None:
        fate = f"pid {p.pid} exited with code {p.exitcode}"
    else:
        st = procs.read_proc_stat(p.pid)
        try:
            with open(f"/proc/{p.pid}/wchan") as f:
                wchan = f.read().strip() or "-"
        except OSError:
            wchan = "?"
        fate = f"pid {p.pid} still running, state {st.state if st else '?'}, in {wchan}"
    return f"client {role} not ready within {READY_S:g}s ({fate})"


def _log_setup() -> None:
    logging.basicConfig(level=logging.WARNING,
                        format="%(process)d %(levelname)s %(name)s: %(message)s")  # fmt: skip


# --- pieces that run in the server and its sampling workers --------------------------------


def seed_repeats() -> int:
    """How many times an epoch covers the graph's nodes (``$HK_TEST_SEED_REPEATS``, 1)."""
    return int(os.environ.get("HK_TEST_SEED_REPEATS", "1"))


def server_dataset(featured: int = fx.NUM_NODES) -> Any:
    """The test graph, every node a training seed (``Split.train``), ``seed_repeats()``
    times (the benchmark's longer epochs)."""
    import torch

    dataset = fx.build_dataset()
    if featured != fx.NUM_NODES:
        dataset.init_node_features(torch.randn(featured, fx.FEATURE_DIM), with_gpu=False)
    empty = torch.empty(0, dtype=torch.long)
    dataset.init_node_split((torch.arange(fx.NUM_NODES).repeat(seed_repeats()), empty, empty))
    return dataset


def job_cpu_s(server_pid: int) -> float:
    """User + system CPU seconds, every thread, of this client and of the server with every
    process below it (its sampling workers), from ``/proc/<pid>/stat``."""
    from healthkit.lowlevel import descendants

    total = 0
    for pid in (os.getpid(), server_pid, *descendants(server_pid)):
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rpartition(b")")[2].split()
        except OSError:
            continue  # ended between the listing and the read
        total += int(fields[11]) + int(fields[12])  # utime and stime
    return total / os.sysconf("SC_CLK_TCK")


def slow_sampler_factory(*, delay: float, **kwargs: Any) -> Any:
    """GLT's sampler, each batch issued ``delay`` s late (a fetch then waits on the server)."""
    import healthkit_glt as hg

    sampler = hg.create_dist_sampler(**kwargs)
    sample = sampler.sample_from_nodes

    def slow(*args: Any, **kw: Any) -> Any:
        time.sleep(delay)
        return sample(*args, **kw)

    sampler.sample_from_nodes = slow
    return sampler


def slow_then_stuck_sampler_factory(*, delay: float, slow_calls: int, **kwargs: Any) -> Any:
    """GLT's sampler, each of its first ``slow_calls`` batches issued ``delay`` s late (slow
    but progressing), then blocked for good, alive (a stall: the report must name this)."""
    import healthkit_glt as hg

    sampler = hg.create_dist_sampler(**kwargs)
    sample = sampler.sample_from_nodes
    calls = [0]

    def stuck_in_sampler_forever(*args: Any, **kw: Any) -> Any:
        calls[0] += 1
        while calls[0] > slow_calls:
            time.sleep(3600)
        time.sleep(delay)
        return sample(*args, **kw)

    sampler.sample_from_nodes = stuck_in_sampler_forever
    return sampler


def worker_pids_of(worker_key: str) -> list[int]:
    """Runs on the server (a client's RPC): the pids of the producer serving a key."""
    from graphlearn_torch.distributed.dist_server import get_server

    server = get_server()
    producer_id = server._worker_key2producer_id.get(worker_key)
    producer = server._producer_pool.get(producer_id)
    return [] if producer is None else [w.pid for w in producer._workers]


def producer_wait_state(worker_key: str) -> dict[str, Any]:
    """Runs on the server (a client's RPC): whether the producer serving a key has a wait
    for a batch open (``waiting``) and that wait paused (``paused``: its last fetch answered
    "not yet" and none came since)."""
    from graphlearn_torch.distributed.dist_server import get_server

    server = get_server()
    producer = server._producer_pool.get(server._worker_key2producer_id.get(worker_key))
    return {"waiting": getattr(producer, "_waiting_since", None) is not None,
            "paused": getattr(producer, "_paused_at", None) is not None}  # fmt: skip


def failed_producers() -> list[dict[str, Any]]:
    """Runs on the server (a client's RPC): for each failed producer still held, when it
    delivered its last batch and when its failure was observed (monotonic clock)."""
    from graphlearn_torch.distributed.dist_server import get_server

    server = get_server()
    out = []
    for producer_id in getattr(server, "_failures", {}):
        producer = server._producer_pool.get(producer_id)
        failure = getattr(producer, "failure", None)
        d = getattr(failure, "diagnosis", None)
        out.append({"producer_id": producer_id,
                    "last_batch_at": getattr(producer, "_last_batch_at", None),
                    "delivered": getattr(producer, "_batches_received", None),
                    "observed_at": d.observed_at if d is not None else None})  # fmt: skip
    return out


_TCP_STATES = {"01": "established", "06": "time-wait", "08": "close-wait", "0A": "listen"}


def _tcp_states() -> dict[str, str]:
    """Socket inode -> TCP state of this process's network namespace (``/proc/net/tcp*``)."""
    states: dict[str, str] = {}
    for name in ("tcp", "tcp6"):
        with contextlib.suppress(OSError), open(f"/proc/self/net/{name}") as f:
            for line in list(f)[1:]:
                cols = line.split()
                states[cols[9]] = _TCP_STATES.get(cols[3], cols[3])
    return states


def _fd_kinds() -> dict[str, int]:
    """This process's fds by kind: a path, ``pipe``, ``anon_inode:[pidfd]``..., and sockets
    by TCP state (``socket close-wait``: its peer has closed it, this process not yet)."""
    tcp = _tcp_states()
    kinds: dict[str, int] = {}
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("socket:["):
                kind = f"socket {tcp.get(target[8:-1], 'other')}"
            else:
                kind = "pipe" if target.startswith("pipe:[") else target
            kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


def server_footprint(settle_s: float = 10.0) -> dict[str, Any]:
    """Runs on the server (a client's RPC): what a failed producer could leave in it:
    open fds, and the named semaphores it has mapped (``/dev/shm/sem.*``: multiprocessing's
    locks, queues and values; a semaphore's name is unlinked only when its object is freed).

    The count waits, up to ``settle_s``, until no socket is half-closed: the client's loader
    has just closed its lease, and the server's lease thread closes its end when it reads
    the end-of-file, a moment later (under load, after this RPC: the likely cause of one
    socket more, once, in a CI run). A socket the server never closes stays half-closed and
    is counted."""
    start = time.monotonic()
    kinds = _fd_kinds()
    half_closed = kinds.get("socket close-wait", 0)
    while kinds.get("socket close-wait") and time.monotonic() < start + settle_s:
        time.sleep(0.05)
        kinds = _fd_kinds()
    with open("/proc/self/maps") as f:  # glibc maps each semaphore it opens
        inodes = {int(line.split()[4]) for line in f if "/dev/shm/sem." in line}
    named = 0  # those whose name is still in /dev/shm (a mapping's path is glibc's temporary)
    with contextlib.suppress(OSError), os.scandir("/dev/shm") as entries:
        for entry in entries:
            with contextlib.suppress(OSError):
                named += entry.name.startswith("sem.") and entry.inode() in inodes
    return {"fds": sum(kinds.values()), "fd_kinds": kinds, "semaphores": len(inodes),
            "semaphore_files": named, "half_closed_at_first": half_closed,
            "settled_s": round(time.monotonic() - start, 3)}  # fmt: skip


def server_main(mode: str, port: int, num_clients: int, out: Any, featured: int) -> None:
    """A server until SIGTERM: then its own bounded shutdown, a non-graceful RPC shutdown
    (its clients may be dead), exit 0. ``$HK_TEST_SERVER_GC=0``: the cyclic garbage
    collector disabled, so what a failure leaves is freed by reference counting or never."""
    _log_setup()
    if os.environ.get("HK_TEST_SERVER_GC") == "0":
        import gc

        gc.disable()
    import graphlearn_torch as glt

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    kwargs = dict(num_servers=1, server_rank=0, dataset=server_dataset(featured),
                  master_addr="127.0.0.1", master_port=port, num_clients=num_clients,
                  request_timeout=30, num_rpc_threads=8)  # fmt: skip
    if mode == "hk":
        import healthkit_glt as hg

        ct = float(os.environ.get("HK_TEST_CONNECTION_TIMEOUT", "0")) or None
        hg.init_server(**kwargs, connection_timeout=ct)
    else:
        glt.distributed.init_server(**kwargs)
    out.put(("server", os.getpid(), time.monotonic()))
    server = glt.distributed.get_server()
    while not stop.wait(0.2):
        if server._exit:  # client 0's shutdown_client(): GLT's own way out
            glt.distributed.wait_and_shutdown_server()
            out.put(("server-stopped", os.getpid(), 0.0))
            return
    t = time.monotonic()
    server.shutdown()
    glt.distributed.rpc.shutdown_rpc(graceful=False)
    out.put(("server-stopped", os.getpid(), time.monotonic() - t))


# --- clients -------------------------------------------------------------------------------


def _loader(mode: str, key: str, sampling_port: int, num_workers: int, **kwargs: Any) -> Any:
    import graphlearn_torch as glt
    import torch

    prefetch = int(os.environ.get("HK_TEST_PREFETCH", "0")) or min(2, num_workers)
    capacity = int(os.environ.get("HK_TEST_BUFFER_CAPACITY", "0"))
    options = glt.distributed.RemoteDistSamplingWorkerOptions(
        server_rank=0, num_workers=num_workers, worker_devices=[torch.device("cpu")] * num_workers,
        worker_concurrency=1, master_addr="127.0.0.1", master_port=sampling_port,
        rpc_timeout=30, num_rpc_threads=1, prefetch_size=min(prefetch, num_workers),
        worker_key=key,
    )  # fmt: skip
    if capacity:  # both loaders alike: one epoch's batches rule stock's writer stall out
        options.buffer_capacity = capacity
        options.prefetch_size = prefetch
    if mode == "hk":
        import healthkit_glt as hg

        cls: Any = hg.DistNeighborLoader
    else:
        cls = glt.distributed.DistNeighborLoader
        kwargs = {}
    return cls(None, list(fx.NUM_NEIGHBORS), glt.typing.Split.train, batch_size=fx.BATCH_SIZE,
               shuffle=True, collect_features=True, to_device=torch.device("cpu"),
               worker_options=options, **kwargs)  # fmt: skip


def _epoch(
    loader: Any, delay: float = 0.0, report: Any = None, server_pid: int | None = None
) -> dict[str, Any]:
    """One epoch; ``report(n)`` after each batch. With ``server_pid``, the CPU time of the
    whole job (this client, the server and its workers) over the epoch too."""
    import torch

    seeds: list[Any] = []
    n = 0
    cpu = job_cpu_s(server_pid) if server_pid else 0.0
    t = time.monotonic()
    for batch in loader:
        n += 1
        seeds.append(batch.batch.clone())
        del batch
        if report is not None:
            report(n)
        time.sleep(delay)
    wall = time.monotonic() - t
    got = torch.sort(torch.cat(seeds)).values if seeds else torch.empty(0, dtype=torch.long)
    every = torch.arange(fx.NUM_NODES)
    out = {"batches": n, "seconds": wall,
           "every_seed_seen": bool(torch.equal(torch.unique(got), every))}  # fmt: skip
    if seed_repeats() == 1:  # with repeats, GLT merges a seed that repeats within a batch
        out["every_seed_once"] = bool(torch.equal(got, every))
    if server_pid:
        out["cpu_s"] = job_cpu_s(server_pid) - cpu
    return out


def _error(e: BaseException) -> dict[str, Any]:
    d = getattr(e, "diagnosis", None)
    return {
        "at": time.monotonic(), "type": type(e).__name__,
        "mro": [c.__name__ for c in type(e).__mro__], "message": str(e),
        "kind": getattr(e, "kind", None), "server_rank": getattr(e, "server_rank", None),
        "host": getattr(e, "host", None), "server_pid": getattr(e, "server_pid", None),
        "worker_rank": getattr(e, "worker_rank", None), "pid": getattr(e, "pid", None),
        "cause": d.cause.name if d is not None else None,
        "signal": d.signal.name if d is not None and d.signal else None,
        "worker_traceback": getattr(e, "worker_traceback", None),
        "after_raise_s": time.time() - e.raised_at if getattr(e, "raised_at", None) else None,
        "observed_at": d.observed_at if d is not None else None,
    }  # fmt: skip


def _until_error(
    loader: Any, out: Any, name: str, tag: str, delay: float = 0.0
) -> dict[str, Any]:
    """Epochs until an error; ``(name, tag, t)`` reported after the second batch of each."""

    def report(n: int) -> None:
        if n == 2:
            out.put((name, tag, time.monotonic()))

    try:
        while True:
            out.put((name, "epoch", _epoch(loader, delay, report)))
    except Exception as e:
        return _error(e)


KILL_AFTER_BATCH = 50  # the long epoch's batch after which the driver kills a worker


def _long_epoch(
    loader: Any, out: Any, name: str, server: str, pause: float, delay: float
) -> dict[str, Any] | None:
    """One epoch, the consumer taking ``delay`` s per batch (a training step's pace; 0:
    dropping each batch at once), every batch's arrival time kept; ``(name, "mid-epoch",
    t)`` after batch ``KILL_AFTER_BATCH``, then a pause of ``pause`` seconds. The error's
    fields plus those times and the server's :func:`failed_producers`, or None if the
    epoch ended without an error."""
    from torch.distributed import rpc

    times: list[float] = []
    resumed = None
    it = iter(loader)
    try:
        while True:
            try:
                batch = next(it)
            except StopIteration:
                return None
            times.append(time.monotonic())
            del batch
            if len(times) == KILL_AFTER_BATCH:
                out.put((name, "mid-epoch", times[-1]))
                time.sleep(pause)  # the server's ring fills meanwhile
                resumed = time.monotonic()
            if delay:
                time.sleep(delay)
    except Exception as e:
        err = {**_error(e), "batch_times": times, "resumed_at": resumed}
        err["server_producers"] = rpc.rpc_sync(server, failed_producers)
        return err


STALL_EPOCHS = 3  # the slow epochs: 8 batches per worker each, stall_timeout / 2 apiece
STALL_WORKER_BATCHES = 8  # 1,000 seeds, 2 workers, batches of 64
IDLE_AFTER_BATCH = 4  # of its second epoch: then the client trains for IDLE_TIMEOUTS x it
IDLE_TIMEOUTS = 3


def _slow_and_idle(loader: Any, server: str, key: str) -> dict[str, Any]:
    """``STALL_EPOCHS`` epochs of a slow-but-progressing producer (``stall_timeout`` set,
    each worker's batch taking half of it, the server answering "not yet" after 10 ms); in
    the second, after a batch from ``IDLE_AFTER_BATCH`` on, the client trains
    ``IDLE_TIMEOUTS`` x ``stall_timeout`` without asking (the server's ring, 2 batches,
    fills, and the workers wait in send, beating nothing). Neither may fail the loader.
    ``paused_in_idle``: the server's producer, read during the idle time, had a wait open
    and paused (what a stall clock that kept running through the idle time would have
    fired on)."""
    from torch.distributed import rpc

    stall_s = float(os.environ["HK_TEST_STALL_S"])
    out: dict[str, Any] = {"epochs": [], "paused_in_idle": None}

    def report(n: int) -> None:
        # The idle time begins after the first batch (from IDLE_AFTER_BATCH on) whose
        # fetches in flight were all answered "not yet" (a batch that came with it, the
        # other worker's, leaves no wait open): the case a running stall clock would fail.
        if len(out["epochs"]) != 1 or n < IDLE_AFTER_BATCH or "idle_s" in out:
            return
        t = time.monotonic()
        time.sleep(0.2)  # the fetches in flight are answered by then (10 ms each)
        state = rpc.rpc_sync(server, producer_wait_state, args=(key,))
        if not state["paused"]:
            return
        out["paused_in_idle"], out["idle_at_batch"] = state, n
        time.sleep(max(0.0, IDLE_TIMEOUTS * stall_s - (time.monotonic() - t)))
        out["idle_s"] = time.monotonic() - t

    t0 = time.monotonic()
    try:
        for _ in range(STALL_EPOCHS):
            out["epochs"].append(_epoch(loader, report=report))
    except Exception as e:
        out["error"] = _error(e)
    out["seconds"] = time.monotonic() - t0
    return out


def _stuck(loader: Any, worker_pids: list[int]) -> dict[str, Any]:
    """The next epoch, in which every sampling worker on the server blocks in its sampler
    from its 3rd batch, alive: the client's error, how long after its last batch it came,
    and whether the stuck workers were ended."""
    last, batches = time.monotonic(), 0
    try:
        for batch in loader:
            batches += 1
            last = time.monotonic()
            del batch
    except Exception as e:
        err = _error(e)
        gone, survivors = _gone_within(worker_pids, 15.0)
        return {**err, "after_last_batch_s": err["at"] - last, "batches": batches,
                "worker_pids": worker_pids, "stalled_for": getattr(e, "stalled_for", None),
                "worker_ranks": list(getattr(e, "worker_ranks", ())),
                "diagnosis_pids": [d.pid for d in getattr(e, "diagnoses", ())],
                "diagnosis_causes": [d.cause.name for d in getattr(e, "diagnoses", ())],
                "workers_gone_after_s": gone, "survivors": survivors}  # fmt: skip
    return {"finished": True, "batches": batches}


def client_main(mode: str, role: str, rank: int, num_clients: int, port: int, sampling_port: int,
                out: Any, go: Any) -> None:  # fmt: skip
    """One client; ``role`` is ``a``, ``b``, ``c`` (module docstring), ``solo`` (epochs
    until an error) or ``healthy`` / ``healthy-stock`` / ``healthy-hk`` (``$HK_TEST_EPOCHS``
    epochs through a loader of the job's mode / stock GLT's / healthkit_glt's, then GLT's
    ``shutdown_client()``)."""
    _log_setup()
    import faulthandler

    faulthandler.dump_traceback_later(STARTUP_STACKS_S)
    if role == "healthy-stock":
        mode = "stock"
    elif role == "healthy-hk":
        mode = "hk"
    elif role == "d":  # the other kind of loader than the server's
        mode = "stock" if mode == "hk" else "hk"
    import graphlearn_torch as glt
    from torch.distributed import rpc

    glt.distributed.init_client(num_servers=1, num_clients=num_clients, client_rank=rank,
                                master_addr="127.0.0.1", master_port=port,
                                num_rpc_threads=4)  # fmt: skip
    if code := os.environ.get("HK_TEST_CLIENT_EXIT_AT_START"):  # the driver's give-up, tested
        os._exit(int(code))
    kwargs: dict[str, Any] = {}
    workers = 1 if role in ("b", "d") else 2
    if role == "a":
        kwargs["sampler_factory"] = functools.partial(slow_sampler_factory, delay=SLOW_SAMPLE_S)
        kwargs["fetch_wait"] = 0.1  # the server answers "not yet" often: that path too
    if role == "c" and mode == "hk":
        import glt_scenarios

        kwargs["sampler_factory"] = functools.partial(
            glt_scenarios._raising_sampler_factory, raise_in="_sample_from_nodes"
        )
    if role == "stall":  # slow but progressing (stall_timeout / 2 a batch), then stuck
        stall_s = float(os.environ["HK_TEST_STALL_S"])
        kwargs.update(stall_timeout=stall_s, fetch_wait=0.01, sampler_factory=functools.partial(
            slow_then_stuck_sampler_factory, delay=stall_s / 2,
            slow_calls=STALL_EPOCHS * STALL_WORKER_BATCHES + 2))  # fmt: skip
    ct = float(os.environ.get("HK_TEST_CONNECTION_TIMEOUT", "0")) or None
    if ct and mode == "hk":
        kwargs["connection_timeout"] = ct
    key = role
    loader = _loader(mode, key, sampling_port, workers, **kwargs)
    server = glt.distributed.rpc.get_rpc_worker_names()[glt.distributed.DistRole.SERVER][0]
    out.put((role, "ready", os.getpid(), rpc.rpc_sync(server, worker_pids_of, args=(key,))))
    faulthandler.cancel_dump_traceback_later()
    if role == "a":
        out.put((role, "epoch", _epoch(loader)))
        out.put((role, "error", _until_error(loader, out, role, "mid-epoch")))
        loader.shutdown()
        go.wait()  # the driver has killed client b
        loader = _loader(mode, key, sampling_port, workers, **kwargs)
        out.put((role, "rebuilt", rpc.rpc_sync(server, worker_pids_of, args=(key,))))
        out.put((role, "epoch", _epoch(loader)))
        out.put((role, "lost", _until_error(loader, out, role, "mid-epoch-2")))
    elif role == "b":
        while True:
            out.put((role, "epoch", _epoch(loader, delay=0.05)))
    elif role == "c":
        # a slow consumer: a server SIGKILLed 0.3 s after batch 2 lands mid-epoch (stock)
        out.put((role, "error", _until_error(loader, out, role, "mid-epoch", delay=0.3)))
    elif role == "solo":
        out.put((role, "lost", _until_error(loader, out, role, "mid-epoch", delay=0.1)))
    elif role == "stall":
        pids = rpc.rpc_sync(server, worker_pids_of, args=(key,))
        out.put((role, "slow", _slow_and_idle(loader, server, key)))
        out.put((role, "stuck", _stuck(loader, pids)))
    elif role == "rebuild":
        import glt_scenarios

        cycles = []
        kinds = os.environ.get("HK_TEST_KINDS", "worker-death").split(",")
        for cycle in range(int(os.environ.get("HK_TEST_CYCLES", "3"))):
            kind = kinds[cycle % len(kinds)]
            outcome = "finished"
            try:
                if cycle:  # the first loader was built before "ready"
                    kw = dict(kwargs)
                    if kind == "sampler-error":
                        kw["sampler_factory"] = functools.partial(
                            glt_scenarios._raising_sampler_factory, raise_in="_sample_from_nodes"
                        )
                    elif kind == "init-failure":
                        kw.update(worker_loop=glt_scenarios.rank1_raises_loop,
                                  rpc_init_timeout=60)  # fmt: skip
                    loader = _loader(mode, key, sampling_port, workers, **kw)
                pids = rpc.rpc_sync(server, worker_pids_of, args=(key,))
                for n, batch in enumerate(loader):
                    if n == 1 and kind == "worker-death":
                        os.kill(pids[1], signal.SIGKILL)
                    del batch
            except Exception as e:
                outcome = f"{type(e).__name__}: {getattr(e, 'kind', '')}"
            if kind != "init-failure":
                loader.shutdown()  # the server releases the failed producer now
            cycles.append({"kind": kind, "outcome": outcome,
                           **rpc.rpc_sync(server, server_footprint)})  # fmt: skip
            out.put((role, "cycle", cycles[-1]))  # as it goes: a slow run keeps its cycles
        out.put((role, "cycles", cycles))
    elif role == "long":
        pause = float(os.environ.get("HK_TEST_PAUSE_S", "0"))
        delay = float(os.environ.get("HK_TEST_DELAY_S", "0"))
        out.put((role, "lost", _long_epoch(loader, out, role, server, pause, delay)))
    elif role == "d":
        for _ in range(2):
            out.put((role, "epoch", _epoch(loader)))
        loader.shutdown()
        out.put((role, "done", os.getpid()))
        while True:  # idle until the driver ends it (shutdown_client() would meet the others)
            time.sleep(3600)
    elif role in ("healthy", "healthy-stock", "healthy-hk"):
        measure = os.environ.get("HK_TEST_CPU") == "1"
        server_pid = rpc.rpc_sync(server, os.getpid) if measure else None
        for _ in range(int(os.environ.get("HK_TEST_EPOCHS", "3"))):
            out.put((role, "epoch", _epoch(loader, server_pid=server_pid)))
        t = time.monotonic()
        loader.shutdown()
        out.put((role, "shutdown", time.monotonic() - t))
        glt.distributed.shutdown_client()  # GLT's own way out: the server exits too
        out.put((role, "exit", os.getpid()))
        return
    t = time.monotonic()
    loader.shutdown()
    out.put((role, "shutdown", time.monotonic() - t))
    glt.distributed.rpc.shutdown_rpc(graceful=False)
    out.put((role, "exit", os.getpid()))


# --- the driver ------------------------------------------------------------------------------


def _say(msg: str) -> None:
    print(f"[driver {time.monotonic():.3f}] {msg}", flush=True)


def _result(**fields: Any) -> None:
    print("RESULT " + json.dumps(fields, default=str), flush=True)


class Job:
    """A server and its clients, spawned from this driver; ``events`` collects their
    reports as ``(who, what, value...)`` tuples."""

    def __init__(self, mode: str, roles: Sequence[str], featured: int = fx.NUM_NODES) -> None:
        import multiprocessing as mp

        import glt_server_scenarios as roles_module  # picklable targets for spawn

        self.ctx = mp.get_context("spawn")
        self.out = self.ctx.Queue()
        self.go = self.ctx.Event()
        self.events: list[tuple[Any, ...]] = []
        port = fx.free_port()
        self.server = self.ctx.Process(
            target=roles_module.server_main, args=(mode, port, len(roles), self.out, featured),
            name="server",
        )  # fmt: skip
        self.server.start()
        self.clients = {}
        for rank, role in enumerate(roles):
            p = self.ctx.Process(
                target=roles_module.client_main,
                args=(mode, role, rank, len(roles), port, fx.free_port(), self.out, self.go),
                name=f"client {role}",
            )  # fmt: skip
            p.start()
            self.clients[role] = p
        self.server_pid = self.server.pid
        self.removed_segments: list[int] = []
        self.server_stop: dict[str, Any] = {}

    def wait_for(
        self, who: str, what: str, timeout: float, after: int = 0
    ) -> tuple[Any, ...] | None:
        """The ``after + 1``-th event ``(who, what, ...)``, seen before or arriving within
        ``timeout``; None if it did not come. Every event already queued is taken first, even
        with ``timeout=0`` (``all``): a driver that waited elsewhere must not take an old event
        for a fresh one (a "mid-epoch" queued seconds ago can put the server's kill anywhere in
        an epoch, at its end too, where stock GLT's next epoch request fails at once)."""
        deadline = time.monotonic() + timeout
        while True:
            seen = [e for e in self.events if e[0] == who and e[1] == what]
            if len(seen) > after:
                return seen[after]
            proc = self.clients.get(who) or (self.server if who == "server" else None)
            if proc is not None and not proc.is_alive() and self.out.empty():
                # it ended: take its last reports, then give up (the deadline, not one pass:
                # a client that died at start-up was waited for READY_S, taken for a stall)
                deadline = min(deadline, time.monotonic() + 0.5)
            left = deadline - time.monotonic()
            try:  # at the deadline, what has already arrived still counts
                e = self.out.get(timeout=min(left, 0.5)) if left > 0 else self.out.get_nowait()
            except queue.Empty:
                if left <= 0:
                    return None
                continue
            if e[0] == "server":
                e = ("server", "up", *e[1:])
            elif e[0] == "server-stopped":
                e = ("server", "stopped", *e[1:])
            self.events.append(e)
            _say(f"event {str(e)[:300]}")

    def all(self, who: str, what: str) -> list[tuple[Any, ...]]:
        self.wait_for("", "", 0)  # take what has arrived
        return [e for e in self.events if e[0] == who and e[1] == what]

    def stop_all(self, orphans: Sequence[int] = (), graceful: bool = True) -> None:
        """End every process of the job: clients at once, the server by its SIGTERM (its
        own bounded shutdown; with ``graceful=False``, SIGKILL: a stock server's shutdown
        joins each worker 5 s), then whatever of its workers is left, by pid."""
        from healthkit import stop

        workers = list(orphans) + procs.spawned_worker_pids(self.server_pid)
        term = 5.0 if graceful else 0.0
        stop(list(self.clients.values()), kill_after=term, kill_timeout=5.0, name="clients")

        def sigterm() -> None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.server_pid, signal.SIGTERM)

        t = time.monotonic()
        report = stop([self.server], request=sigterm if graceful else None, grace=30.0
                      if graceful else 0.0, kill_after=term, kill_timeout=5.0,
                      name="server")  # fmt: skip
        # how the server ended: a missing stop report says why (seen once under load)
        self.server_stop = {"seconds": round(time.monotonic() - t, 3),
                            "escalated": report.escalated,
                            "exitcode": self.server.exitcode}  # fmt: skip
        stop([p for p in workers if procs.alive(p)], kill_after=0, kill_timeout=5.0,
             name="server workers")  # fmt: skip
        # A stock server that was SIGKILLed leaves its rings in the kernel for good; the
        # runner cannot see them (the server is gone from the group by then): remove them.
        self.removed_segments = procs.remove_orphan_sysv_shm([self.server_pid, *workers])
        self.wait_for("", "", 0.5)  # the last reports
        self.out.cancel_join_thread()


def _gone_within(
    pids: Sequence[int], timeout: float, since: float | None = None
) -> tuple[float | None, list[int]]:
    """Seconds from ``since`` (default: now) until every pid was gone (None if some
    outlived ``timeout`` from now), and the survivors."""
    t = time.monotonic()
    since = t if since is None else since
    while time.monotonic() - t < timeout:
        if not any(procs.alive(p) for p in pids):
            return time.monotonic() - since, []
        time.sleep(0.005)
    return None, [p for p in pids if procs.alive(p)]


def _segments(pids: Sequence[int]) -> list[dict[str, str]]:
    return [r for r in procs.sysv_shm_rows() if int(r["cpid"]) in pids]


def _outcome(e: tuple[Any, ...] | None, since: float, key: str) -> dict[str, Any]:
    """A client's error report, with the time from the fault to it; ``hung`` without one."""
    if e is None or e[2] is None:
        return {"hung": True}
    return {"hung": False, key: e[2]["at"] - since, **e[2]}


def scenario_faults(mode: str) -> None:
    """Every fault of the module docstring: one server, four clients."""
    _log_setup()
    hk = mode == "hk"
    error_s = 30.0 if hk else HANG_S  # hk: a generous bound; stock: how long we watch
    job = Job(mode, ["a", "b", "c", "d"])
    res: dict[str, Any] = {"mode": mode, "server_pid": job.server_pid}
    orphans: list[int] = []
    try:
        pids: dict[str, list[int]] = {}
        for role in ("a", "b", "c", "d"):
            ready = job.wait_for(role, "ready", READY_S)
            if ready is None:
                res["error"] = _not_ready(job, role)
                return
            pids[role] = ready[3]
        res["worker_pids"] = pids
        # 0. the other kind of loader, served before anything fails
        done = job.wait_for("d", "done", READY_S)
        res["mixed"] = {"done": done is not None,
                        "epochs": [e[2] for e in job.all("d", "epoch")]}  # fmt: skip
        # 1. a sampling worker of a's producer dies while a's fetch waits on the server
        first = job.wait_for("a", "epoch", READY_S)
        res["a_first_epoch"] = first[2] if first else None
        if job.wait_for("a", "mid-epoch", 60) is None:
            res["error"] = "client a never got mid-epoch"
            return
        time.sleep(0.3)
        victim = pids["a"][1]
        b_epochs = len(job.all("b", "epoch"))
        os.kill(victim, signal.SIGKILL)
        killed_a = time.monotonic()
        _say(f"SIGKILLed sampling worker 1 (pid {victim}) of client a's producer")
        # stock: a's hang is watched while b's fault runs (both for HANG_S)
        error_a = job.wait_for("a", "error", error_s if hk else 0)
        # 2. the server still serves b (a new epoch of b after a's failure); then b dies
        after = job.wait_for("b", "epoch", 60, after=b_epochs)
        res["b_epoch_after_a_failed"] = after[2] if after else None
        time.sleep(0.5)  # b is mid-epoch (its consumer takes 0.05 s a batch)
        os.kill(job.clients["b"].pid, signal.SIGKILL)
        _say(f"SIGKILLed client b (pid {job.clients['b'].pid})")
        gone, survivors = _gone_within(pids["b"], error_s)
        res["client_kill"] = {"workers_gone_after_s": gone, "survivors": survivors}
        orphans += survivors
        if error_a is None:
            error_a = job.wait_for("a", "error", max(0.0, killed_a + error_s - time.monotonic()))
        res["worker_kill"] = {"victim": victim, **_outcome(error_a, killed_a, "after_kill_s")}
        if hk:
            # 3. c's sampler raised in worker 1 of its producer
            e = job.wait_for("c", "error", 60)
            res["sampler_error"] = e[2] if e else None
            # 4. a rebuilds once b is gone: the server still serves, with a new producer
            job.go.set()
            rebuilt = job.wait_for("a", "rebuilt", 120)
            res["a_rebuilt_workers"] = rebuilt[2] if rebuilt else None
            epoch = job.wait_for("a", "epoch", 120, after=1)
            res["a_rebuilt_epoch"] = epoch[2] if epoch else None
            observer, tag, what, seen = "a", "mid-epoch-2", "lost", 0
        else:  # c is a healthy consumer; the server dies in one of its epochs
            observer, tag, what = "c", "mid-epoch", "error"
            seen = len(job.all("c", "mid-epoch"))
        if job.wait_for(observer, tag, 120, after=seen) is None:
            res["error"] = f"client {observer} never got {tag}"
            return
        # 5. the server dies while the observer's fetch waits on it
        server_workers = procs.spawned_worker_pids(job.server_pid)
        res["server_segments_before_kill"] = len(_segments([job.server_pid]))
        time.sleep(0.3)
        os.kill(job.server_pid, signal.SIGKILL)
        killed = time.monotonic()
        _say(f"SIGKILLed the server (pid {job.server_pid}); its workers {server_workers}")
        outcome = _outcome(job.wait_for(observer, what, error_s), killed, "after_kill_s")
        gone, survivors = _gone_within(server_workers, 10.0 if hk else 1.0)
        orphans += survivors
        res["server_kill"] = {"observer": observer, "server_workers": server_workers,
                              "workers_gone_after_s": gone, "survivors": survivors,
                              **outcome}  # fmt: skip
        if hk:
            res["client_exits"] = {r: job.wait_for(r, "exit", 30) is not None for r in "ac"}
        settle = time.monotonic() + 5
        while _segments([job.server_pid, *server_workers]) and time.monotonic() < settle:
            time.sleep(0.05)
        res["segments_left"] = len(_segments([job.server_pid, *server_workers]))
    finally:
        job.stop_all(orphans, graceful=hk)
        res["orphan_segments_removed"] = len(job.removed_segments)
        res["events"] = [str(e)[:200] for e in job.events]
        _result(**res)


def scenario_network_loss(mode: str = "hk") -> None:
    """The network between a client and its server goes (this network namespace's loopback
    is taken down): healthkit_glt's sides must learn it from their leases; stock GLT's are
    watched for as long."""
    _log_setup()
    os.environ["HK_TEST_CONNECTION_TIMEOUT"] = str(CONNECTION_TIMEOUT_S)
    job = Job(mode, ["solo"])
    res: dict[str, Any] = {"mode": mode, "connection_timeout": CONNECTION_TIMEOUT_S}
    bound = 3 * CONNECTION_TIMEOUT_S + 10
    try:
        ready = job.wait_for("solo", "ready", READY_S)
        if ready is None:
            res["error"] = _not_ready(job, "solo")
            return
        if job.wait_for("solo", "mid-epoch", 60, after=1) is None:
            res["error"] = "the client never got to its second epoch"
            return
        res["first_epoch"] = (job.wait_for("solo", "epoch", 0) or (0, 0, None))[2]
        subprocess.run(["ip", "link", "set", "lo", "down"], check=True)
        lost = time.monotonic()
        _say("took this namespace's loopback down")
        outcome = _outcome(job.wait_for("solo", "lost", bound), lost, "after_loss_s")
        gone, survivors = _gone_within(ready[3], bound, since=lost)
        res["network_loss"] = {"workers": ready[3], "workers_gone_after_s": gone,
                               "survivors": survivors, **outcome}  # fmt: skip
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
        res["client_exit"] = job.wait_for("solo", "exit", 30) is not None
        res["server_segments"] = len(_segments([job.server_pid]))
    finally:
        job.stop_all(graceful=mode == "hk")
        res["server_stopped"] = bool(job.all("server", "stopped"))
        res["server_stop"] = job.server_stop
        res["orphan_segments_removed"] = len(job.removed_segments)
        res["events"] = [str(e)[:200] for e in job.events]
        _result(**res)


def scenario_sampler_error(mode: str) -> None:
    """The server's node features cover half the nodes: a real GLT feature lookup raises in
    a live sampling worker (healthkit_glt: the client's error; stock: watched ``HANG_S``).
    The epochs the client finished meanwhile are reported too: stock GLT does not hang
    here, it ends each epoch short, without an error (``epochs``: batches and whether every
    seed came, per epoch; ``hung`` only when no error and no epoch came)."""
    _log_setup()
    job = Job(mode, ["solo"], featured=fx.NUM_NODES // 2)
    res: dict[str, Any] = {"mode": mode, "full_epoch_batches": -(-fx.NUM_NODES // fx.BATCH_SIZE)}
    try:
        if job.wait_for("solo", "ready", READY_S) is None:
            res["error"] = _not_ready(job, "solo")
            return
        ready = time.monotonic()
        e = job.wait_for("solo", "lost", 60 if mode == "hk" else HANG_S)
        epochs = [
            {"batches": x[2]["batches"], "every_seed_seen": x[2]["every_seed_seen"]}
            for x in job.all("solo", "epoch")
        ]
        res["sampler_error"] = {**_outcome(e, ready, "after_ready_s"), "epochs": epochs}
        if e is None and epochs:
            res["sampler_error"]["hung"] = False  # it went on, epoch after epoch, short
    finally:
        job.stop_all(graceful=mode == "hk")
        res["orphan_segments_removed"] = len(job.removed_segments)
        _result(**res)


def scenario_worker_kill(mode: str = "hk", pause: str = "0", delay: str = "0") -> None:
    """A long epoch (``$HK_TEST_SEED_REPEATS`` times the graph's nodes), the consumer
    taking ``delay`` s per batch (a training step; slower than the sampling, so the server's
    ring stays full); after batch ``KILL_AFTER_BATCH`` it pauses ``pause`` s (the ring fills
    meanwhile), and 0.2 s after that batch the driver SIGKILLs
    sampling worker 1 on the server. Reports, on one clock (CLOCK_MONOTONIC): when the
    worker's exit became visible (its pidfd, watched by this driver), when the server's
    producer observed it (its diagnosis's ``observed_at``) and delivered its last batch,
    the client's error, and the batches the client got after the kill, the exit and the
    server's observation (a batch the server delivered just before either is still in
    flight then: at most the client's prefetch)."""
    _log_setup()
    os.environ["HK_TEST_PAUSE_S"] = pause
    os.environ["HK_TEST_DELAY_S"] = delay
    job = Job(mode, ["long"])
    res: dict[str, Any] = {"mode": mode, "seed_repeats": seed_repeats(), "pause": pause,
                           "delay": delay}  # fmt: skip
    try:
        ready = job.wait_for("long", "ready", READY_S)
        if ready is None:
            res["error"] = _not_ready(job, "long")
            return
        if job.wait_for("long", "mid-epoch", 120) is None:
            res["error"] = f"the client never got to batch {KILL_AFTER_BATCH}"
            return
        time.sleep(0.2)
        victim = ready[3][1]
        pidfd = os.pidfd_open(victim)
        try:
            os.kill(victim, signal.SIGKILL)
            killed = time.monotonic()
            readable, _, _ = select.select([pidfd], [], [], 10.0)
            exited = time.monotonic() if readable else None
        finally:
            os.close(pidfd)
        _say(f"SIGKILLed sampling worker 1 (pid {victim})")
        e = job.wait_for("long", "lost", 60 if mode == "hk" else HANG_S)
        out: dict[str, Any] = {"victim": victim, "hung": e is None}
        if e is not None and e[2] is None:
            out = {"victim": victim, "hung": False, "finished": True}
        elif e is not None:
            err = e[2]
            times = err.pop("batch_times")
            known = err.get("observed_at")
            # the client cannot hear of it before it asks again: timed from its resumption
            # after the pause, when that came after the kill
            asked = max(killed, err.get("resumed_at") or killed)
            # the server's side: when its producer delivered its last batch, against when
            # it observed the death (negative: every delivery came before)
            producers = err.get("server_producers") or [{}]
            last = producers[0].get("last_batch_at")
            out.update(
                server_delivered=producers[0].get("delivered"),
                server_last_delivery_after_known_s=(
                    None if last is None or known is None else last - known),
                exit_after_kill_s=None if exited is None else exited - killed,
                after_asked_s=err["at"] - asked,
                server_last_delivery_after_exit_s=(
                    None if last is None or exited is None else last - exited),
                batches_after_exit=(
                    None if exited is None else sum(t > exited for t in times)),
            )  # fmt: skip
            out.update(
                type=err["type"], kind=err["kind"], worker_rank=err["worker_rank"],
                pid=err["pid"], cause=err["cause"], after_kill_s=err["at"] - killed,
                batches=len(times), batches_after_kill=sum(t > killed for t in times),
                batches_after_known=None if known is None else sum(t > known for t in times),
                known_after_kill_s=None if known is None else known - killed,
                last_batch_after_kill_s=(times[-1] - killed) if times else None,
                message=err["message"][:2000],
            )  # fmt: skip
        res["worker_kill"] = out
    finally:
        job.stop_all(graceful=mode == "hk")
        res["orphan_segments_removed"] = len(job.removed_segments)
        _result(**res)


def scenario_fail_rebuild(
    cycles: str = "3", server_gc: str = "0", kinds: str = "worker-death,sampler-error"
) -> None:
    """A long-lived healthkit_glt server and one client that, ``cycles`` times, builds a
    loader whose producer fails (``kinds``, in turn: ``worker-death``, one of its sampling
    workers SIGKILLed after batch 2; ``sampler-error``, its sampler raising in worker 1;
    ``init-failure``, worker 1 raising during init), gets the error and shuts the loader
    down (the server then releases the failed producer); after each cycle, the server's
    fds and named semaphores. The first cycle is always a worker death. ``server_gc=0``:
    the server runs with the cyclic garbage collector disabled (no collection, forced or
    automatic), so only what reference counting frees is freed."""
    _log_setup()
    os.environ["HK_TEST_CYCLES"] = cycles
    os.environ["HK_TEST_SERVER_GC"] = server_gc
    os.environ["HK_TEST_KINDS"] = kinds
    job = Job("hk", ["rebuild"])
    res: dict[str, Any] = {"cycles": int(cycles), "server_gc": server_gc}
    try:
        if job.wait_for("rebuild", "ready", READY_S) is None:
            res["error"] = _not_ready(job, "rebuild")
            return
        got = job.wait_for("rebuild", "cycles", 120 + 60 * int(cycles))
        res["per_cycle"] = got[2] if got else [e[2] for e in job.all("rebuild", "cycle")]
        res["finished"] = got is not None
    finally:
        job.stop_all()
        res["orphan_segments_removed"] = len(job.removed_segments)
        _result(**res)


def scenario_healthy(mode: str, epochs: int = 3, clients: str = "healthy") -> None:
    """Nothing fails: each client (``healthy``: a loader of ``mode``; ``healthy-stock``: a
    stock GLT loader) runs ``epochs`` epochs, then GLT's own way out (the clients'
    ``shutdown_client()``, the server's ``wait_and_shutdown_server()``)."""
    _log_setup()
    os.environ["HK_TEST_EPOCHS"] = str(epochs)
    roles = clients.split(",")
    job = Job(mode, roles)
    res: dict[str, Any] = {"mode": mode, "server_pid": job.server_pid, "clients": {}}
    try:
        workers: list[int] = []
        for role in roles:
            ready = job.wait_for(role, "ready", READY_S)
            if ready is None:
                res["error"] = _not_ready(job, role)
                return
            workers += ready[3]
            exited = job.wait_for(role, "exit", READY_S)
            shut = job.wait_for(role, "shutdown", 0)
            job.clients[role].join(30)
            res["clients"][role] = {
                "ready": ready is not None, "exit": exited is not None,
                "epochs": [e[2] for e in job.all(role, "epoch")],
                "loader_shutdown_s": shut[2] if shut else None,
                "exitcode": job.clients[role].exitcode,
            }  # fmt: skip
        res["server_stopped"] = job.wait_for("server", "stopped", 60) is not None
        job.server.join(30)
        res["server_exitcode"] = job.server.exitcode
        res["segments_left"] = len(_segments([job.server_pid]))
        res["workers_left"] = [p for p in workers if procs.alive(p)]
    finally:
        job.stop_all()
        res["orphan_segments_removed"] = len(job.removed_segments)
        _result(**res)


def scenario_stall(stall: str = "1") -> None:
    """healthkit_glt, ``stall_timeout=stall`` on the server's producer; one client whose
    producer is slow but progressing, with an idle pause (:func:`_slow_and_idle`: must not
    fail), and then, in the next epoch, has every worker stuck, alive (:func:`_stuck`: must
    fail the client's loader with the workers' ranks, pids, states and stacks)."""
    _log_setup()
    os.environ["HK_TEST_STALL_S"] = stall
    os.environ["HK_TEST_BUFFER_CAPACITY"] = "2"
    job = Job("hk", ["stall"])
    res: dict[str, Any] = {"stall_timeout": float(stall), "server_pid": job.server_pid}
    try:
        if job.wait_for("stall", "ready", READY_S) is None:
            res["error"] = _not_ready(job, "stall")
            return
        slow = job.wait_for("stall", "slow", 120 + 30 * float(stall))
        res["slow"] = slow[2] if slow else None
        stuck = job.wait_for("stall", "stuck", 120)
        res["stuck"] = stuck[2] if stuck else None
        res["client_exit"] = job.wait_for("stall", "exit", 60) is not None
        res["segments_left"] = len(_segments([job.server_pid]))
    finally:
        job.stop_all()
        res["orphan_segments_removed"] = len(job.removed_segments)
        _result(**res)


SCENARIOS = {
    "faults": lambda a: scenario_faults(*a),
    "network-loss": lambda a: scenario_network_loss(*a),
    "sampler-error": lambda a: scenario_sampler_error(*a),
    "worker-kill": lambda a: scenario_worker_kill(*a),
    "fail-rebuild": lambda a: scenario_fail_rebuild(*a),
    "stall": lambda a: scenario_stall(*a),
    "healthy": lambda a: scenario_healthy(a[0], *(int(x) for x in a[1:2]), *a[2:]),
}


def run(name: str, args: Sequence[str] = (), timeout: float = 300.0, netns: bool = False,
        env: dict[str, str] | None = None) -> stock.Run:  # fmt: skip
    """Run a scenario in its own process group (and, with ``netns``, its own network
    namespace with only a loopback, up), killed as a group at ``timeout``."""
    prefix = None
    if netns:
        prefix = ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "netns"]
    return stock.run_script(os.path.abspath(__file__), [name, *args], timeout, extra_env=env,
                            prefix=prefix)  # fmt: skip


def main(argv: Sequence[str]) -> int:
    if not argv or argv[0] not in SCENARIOS:
        print(f"usage: glt_server_scenarios.py {{{','.join(SCENARIOS)}}} [args]")
        return 2
    SCENARIOS[argv[0]](list(argv[1:]))
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main(sys.argv[1:]))
