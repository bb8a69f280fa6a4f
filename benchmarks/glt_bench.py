"""Benchmark: stock graphlearn-torch vs healthkit_glt, same graph, same seeds, same run.

1. End to end: wall time per epoch and CPU time of the whole process tree (the loader's
   process and its sampling workers, from ``/proc``) per batch, for GLT's
   ``DistNeighborLoader`` and ``healthkit_glt.DistNeighborLoader`` with the same options and
   seeds. The loaders alternate in blocks (one build, a warm-up epoch, then timed epochs) in
   the order stock, ours, ours, stock, ..., so drifting load from other processes hits both
   alike. The overhead targets are judged on the blocks by the protocol of
   ``_protocol.py`` (relative difference of the means, bootstrap CI); when this machine's
   noise makes the CI wider than the target, the page says "not resolved here" with the
   CI's half-width. Start-up (construction to the first batch) is its own row. Two
   consumers: a small training step per batch, and one that drops each batch.
2. A proxy, reported as one: the consumer's CPU per message through stock ``recv()`` and
   through healthkit_glt's two receivers, one writer process sending at the loader's pace.
3. Time from a worker's death to the error, during init and mid-epoch, next to stock GLT,
   which hangs (reported as "still hung after N s", then killed).
4. GLT's concurrent-writer stall: two processes sending into one ShmChannel of capacity 2,
   plain (stock) vs through healthkit_glt's send lock.
5. The fault matrix of each supported build, rendered from the raw runs that
   ``tests/glt/fault_matrix.py --save`` kept in ``benchmarks/results/glt-faults-*.json``.
6. Server-client mode, per build (``--server-client``, kept in
   ``benchmarks/results/glt-server-client-*.json``): steady-state throughput of a server
   and one client against stock GLT's, by the protocol of 1., and the time from each fault
   (a worker SIGKILLed on the server, a sampler raising there, a client or the server
   SIGKILLed, the network lost) to the error, next to stock GLT, which hangs.
7. Server-client mode, a worker killed in a 2,000-batch epoch (``--worker-kill RUNS``, kept
   in ``benchmarks/results/glt-worker-kill-*.json``): the time to the client's error and the
   batches delivered after the death, optionally next to an earlier tree's code.

Usage (``scripts/bench`` runs it after the core benchmarks, with the fault matrices)::

    .venv-glt/bin/python benchmarks/glt_bench.py            # full (about 20 minutes)
    .venv-glt/bin/python benchmarks/glt_bench.py --quick    # smoke run, temporary directory
    .venv-glt/bin/python benchmarks/glt_bench.py --report-only benchmarks/results/glt.json
    .venv-glt/bin/python benchmarks/glt_bench.py --server-client     # 6. only (about 12 min)
    .venv-glt28/bin/python benchmarks/glt_bench.py --server-client   # the same, torch 2.8
    .venv-glt/bin/python benchmarks/glt_bench.py --worker-kill 9 [--baseline TREE]   # 7.

A full run writes docs/benchmarks-glt.md and its raw data, every epoch of every block, to
benchmarks/results/glt.json; ``--report-only`` re-renders the page from such a file.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import faulthandler
import glob
import json
import os
import platform
import selectors
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "glt"))
sys.path.insert(0, os.path.join(ROOT, "tests"))

import fault_matrix  # noqa: E402
import glt_fixtures as fx  # noqa: E402
import glt_scenarios as sc  # noqa: E402
import glt_server_scenarios as ssc  # noqa: E402
from _common import tree_cpu_s  # noqa: E402
from _protocol import RULES, Target, Verdict, judge_difference, mean_difference_ci  # noqa: E402
from testutil import portable_paths  # noqa: E402

from healthkit.lowlevel import descendants  # noqa: E402

OUT = os.path.join(ROOT, "docs", "benchmarks-glt.md")
RESULTS = os.path.join(ROOT, "benchmarks", "results", "glt.json")
FAULT_RESULTS = os.path.join(ROOT, "benchmarks", "results", "glt-faults-*.json")
SC_RESULTS = os.path.join(ROOT, "benchmarks", "results", "glt-server-client-{}.json")
WK_RESULTS = os.path.join(ROOT, "benchmarks", "results", "glt-worker-kill-{}.json")
WK_SEED_REPEATS = 125  # the worker-kill runs' epoch: 2,000 batches
WK_RUN_S = 300.0  # one worker-kill run (a server and a client, start to exit), at most
WK_BUFFER_CAPACITY = 100  # the server's ring: room for 100 batches (GLT's default: 2 x 1)
WK_DELAY_S = 0.02  # the client's step per batch: slower than the two workers' sampling
WK_PAUSE_S = 2.0  # the client's pause after batch KILL_AFTER_BATCH: the ring fills
FORMAT = 2

# Blocks per loader and timed epochs per block, for each consumer, in a full run.
PLAN = {"drop": (8, 6), "train": (6, 4)}
QUICK_PLAN = {"drop": (1, 2), "train": (1, 1)}  # one block of each loader: a smoke run
BLOCK_START_S = 120.0  # construction to the first batch, at most
BLOCK_STALL_S = {"drop": 30.0, "train": 90.0}  # between two figures of a block, at most
SEED_REPEATS = 25  # an epoch covers the graph's seeds this many times (391 batches)
TARGETS = [
    Target(
        f"{consumer}.{metric}",
        f"healthkit_glt vs stock GLT, {what} ({who}): < +1 %",
        "mean difference",
        0.01,
        "%",
        PLAN[consumer][0],
    )
    for consumer, who in (("drop", "consumer drops each batch"), ("train", "training step"))
    for metric, what in (("wall", "wall time per epoch"), ("cpu", "process-tree CPU per batch"))
]
# Server-client mode: one server, one client that drops each batch, 25,000 seeds an epoch.
SC_PLAN = (6, 4)  # blocks per loader, timed epochs per block (after one warm-up epoch)
SC_QUICK_PLAN = (1, 1)
SC_FAULT_RUNS = 3  # healthkit_glt fault runs per build; stock GLT: one (it hangs each time)
SC_BLOCK_S = 600.0  # one block (a server and a client, start to exit), at most
SC_HANG_S = 30.0  # how long each stock GLT hang is watched (the suite watches 5 s)
SC_TARGETS = [
    Target(
        f"sc.{metric}",
        f"healthkit_glt vs stock GLT, server-client, {what}: < +1 %",
        "mean difference",
        0.01,
        "%",
        SC_PLAN[0],
    )
    for metric, what in (("wall", "wall time per epoch"),
                         ("cpu", "CPU of the whole job (client, server, workers) per batch"))
]  # fmt: skip


def training_step() -> Any:
    """A small GraphSAGE-style training step (2 mean-aggregation layers, hidden 256, Adam)
    on each batch: what a real consumer does between two ``next()`` calls."""
    import torch

    torch.manual_seed(0)
    hidden = 256
    layers = torch.nn.ModuleList(
        [
            torch.nn.Linear(2 * fx.FEATURE_DIM, hidden),
            torch.nn.Linear(2 * hidden, fx.NUM_CLASSES),
        ]
    )
    opt = torch.optim.Adam(layers.parameters(), lr=0.01)

    def sage(x: Any, edge_index: Any, lin: Any) -> Any:
        src, dst = edge_index
        agg = torch.zeros_like(x).index_add_(0, dst, x[src])
        deg = torch.zeros(x.size(0)).index_add_(0, dst, torch.ones(dst.numel())).clamp_(min=1)
        return lin(torch.cat([x, agg / deg.unsqueeze(1)], dim=1))

    def step(batch: Any) -> None:
        x = batch.x.float()
        x = torch.relu(sage(x, batch.edge_index, layers[0]))
        out = sage(x, batch.edge_index, layers[1])[: batch.batch_size]
        loss = torch.nn.functional.cross_entropy(out, batch.y[: batch.batch_size].long())
        opt.zero_grad()
        loss.backward()
        opt.step()

    return step


def block_order(blocks: int) -> list[str]:
    """stock, ours, ours, stock, ... : ``blocks`` of each, every pair adjacent."""
    pattern = ["stock", "healthkit_glt", "healthkit_glt", "stock"]
    return [pattern[i % 4] for i in range(2 * blocks)]


def run_block(loader_name: str, consumer: str, epochs: int, repeats: int = SEED_REPEATS) -> None:
    """One block, in this process (a fresh one, started by :func:`end_to_end`): build the
    loader, time its start-up and a warm-up epoch, then ``epochs`` timed epochs, and shut it
    down; each figure is printed as one JSON line as soon as it is known."""
    import healthkit_glt as hg
    import torch
    from graphlearn_torch.distributed import DistNeighborLoader

    def emit(**fields: Any) -> None:
        print(json.dumps(fields), flush=True)

    fx.set_spawn()  # stock GLT needs it (its mp.Value); healthkit_glt does not
    fx.init_single_process_context()
    dataset = fx.build_dataset()
    seeds = torch.arange(fx.NUM_NODES).repeat(repeats)
    # One epoch's batches fit in the channel: stock GLT's concurrent-writer stall cannot
    # happen then (see STOCK_SAFE_CHANNEL_CAPACITY); both loaders get the same options.
    options = fx.make_worker_options(channel_capacity=fx.one_epoch_capacity(len(seeds)))
    step = training_step() if consumer == "train" else None
    cls = DistNeighborLoader if loader_name == "stock" else hg.DistNeighborLoader
    t0 = time.perf_counter()
    loader = cls(
        dataset, list(fx.NUM_NEIGHBORS), seeds, batch_size=fx.BATCH_SIZE, shuffle=True,
        collect_features=True, to_device=torch.device("cpu"), random_seed=fx.LOADER_SEED,
        worker_options=options,
    )  # fmt: skip
    try:
        # The first epoch, not timed; by next() on one iterator (a second iter() would
        # start another epoch), dropping each batch before the next is asked for: a
        # batch still referenced keeps its slot of the channel, and the writers wait.
        epoch = iter(loader)
        batch: Any = next(epoch)
        emit(kind="startup", seconds=time.perf_counter() - t0, seeds=len(seeds))
        while batch is not None:
            if step is not None:
                step(batch)
            batch = next(epoch, None)
        for epoch in range(epochs):
            t, c, n = time.perf_counter(), tree_cpu_s(), 0
            for batch in loader:
                n += 1
                if step is not None:
                    step(batch)
                del batch  # release the ring slot, as a training step would
            wall, cpu = time.perf_counter() - t, tree_cpu_s() - c
            emit(kind="epoch", epoch=epoch, batches=n, wall_s=wall, cpu_s=cpu)
    finally:
        t = time.perf_counter()
        loader.shutdown()
        emit(kind="shutdown", seconds=time.perf_counter() - t)


def _lines(proc: subprocess.Popen[bytes], first_s: float, next_s: float) -> Iterator[bytes]:
    """``proc``'s stdout lines; TimeoutError when the first takes over ``first_s`` or any
    later one over ``next_s``."""
    assert proc.stdout is not None
    fd, buf, limit = proc.stdout.fileno(), b"", first_s
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while True:
            if not sel.select(limit):
                raise TimeoutError
            chunk = os.read(fd, 65536)
            if not chunk:
                return
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                limit = next_s
                yield line


def end_to_end(
    blocks: int, epochs: int, consumer: str, repeats: int = SEED_REPEATS
) -> dict[str, Any]:
    """``blocks`` blocks of each loader, alternating (:func:`block_order`), each in its own
    process group: every epoch raw (loader, block, wall s, tree CPU s, batches), and per
    block its start-up (construction to first batch), ``shutdown()`` time and whether it
    hung. A block whose next figure does not come within ``BLOCK_STALL_S`` is a hung block:
    its group is SIGKILLed and the run goes on; its finished epochs are kept."""
    epochs_out: list[dict[str, Any]] = []
    blocks_out: list[dict[str, Any]] = []
    seeds = 0
    for index, name in enumerate(block_order(blocks)):
        cmd = [sys.executable, os.path.abspath(__file__), "--block", name, consumer, str(epochs),
               str(repeats)]  # fmt: skip
        with tempfile.TemporaryFile() as err:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, start_new_session=True)
            row: dict[str, Any] = {"loader": name, "block": index, "hung": False}
            try:
                for line in _lines(proc, BLOCK_START_S, BLOCK_STALL_S[consumer]):
                    msg = json.loads(line)
                    kind = msg.pop("kind")
                    if kind == "epoch":
                        epochs_out.append({"loader": name, "block": index, **msg})
                    elif kind == "startup":
                        seeds = msg["seeds"]
                        row["startup_s"] = msg["seconds"]
                    else:
                        row["shutdown_s"] = msg["seconds"]
            except TimeoutError:
                row["hung"] = True
            # The block's group: its workers too (stock GLT's outlive their parent).
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            row["returncode"] = proc.wait()
            if not row["hung"] and row["returncode"] != 0:
                err.seek(0)
                row["error"] = err.read().decode(errors="replace")[-3000:]
        blocks_out.append(row)
        print(f"[glt-bench] {consumer} block {index} ({name}): {row}", flush=True)
    return {"seeds": seeds, "blocks": blocks, "epochs": epochs, "consumer": consumer,
            "per_epoch": epochs_out, "per_block": blocks_out}  # fmt: skip


def death_to_error(hang_s: float, repeats: int, hk_timeout: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, hk_args, stock_args in (
        ("init", ("hk-init-sigkill", ["0.5"]), ("hang-init", [])),
        ("mid-epoch", ("hk-epoch-sigkill", ["0.5", "1"]), ("hang-epoch", ["0", "0.5"])),
    ):
        lat = []
        for _ in range(repeats):
            r = sc.run_scenario(*hk_args, timeout=hk_timeout)
            res = r.result
            assert res["outcome"] == "raised", r.output[-3000:]
            lat.append(res["after_kill_s"])
            msg_head = res["message"].splitlines()[0]
        # stock GLT's hang, watched for hang_s after the kill (its start-up not counted)
        s = sc.run_stock(*stock_args, timeout=hang_s + BLOCK_START_S, hang_after_kill=hang_s)
        out[key] = {
            "healthkit_glt": lat,
            "error": res["type"],
            "head": msg_head,
            "stock_hung": s.returncode is None,
            "stock_rc": s.returncode,
            "stock_elapsed": s.elapsed_s,
        }
    return out


def writer_race(runs: int, messages: int, stall_s: float) -> dict[str, Any]:
    """Both modes alternately, ``runs`` each; a run still going at ``stall_s`` is stalled
    (every process alive, blocked in the C++ queue) and is killed."""
    out: dict[str, Any] = {m: {"stalled": 0, "seconds": []} for m in ("stock", "serialized")}
    for _ in range(runs):
        for mode in ("stock", "serialized"):
            r = sc.run_scenario("channel-writers", [mode, "2", str(messages)], timeout=stall_s)
            if r.returncode is None:
                out[mode]["stalled"] += 1
            else:
                res = r.result
                assert res["received"] == 2 * messages and res["out_of_order"] == 0, r.output
                out[mode]["seconds"].append(res["seconds"])
    out["runs"], out["messages"], out["stall_s"] = runs, messages, stall_s
    return out


def _burst_writer(channel: Any, commands: Any, rows: int) -> None:
    """A sampling worker's sends without the sampling: on each ``(messages, period_s)``
    command, ``messages`` batch-sized messages, one every ``period_s``; ``None`` ends it."""
    import torch

    msg = {"ids": torch.arange(rows), "x": torch.randn(rows, fx.FEATURE_DIM)}
    while (command := commands.get()) is not None:
        messages, period_s = command
        due = time.perf_counter()
        for _ in range(messages):
            due += period_s
            if (wait := due - time.perf_counter()) > 0:
                time.sleep(wait)
            channel.send(msg)


def receive_path(rounds: int, messages: int, period_s: float, rows: int = 1000) -> dict[str, Any]:
    """CPU per message of the consumer's process: stock ``recv()`` vs our two receivers, on
    one ShmChannel fed by one writer process at a fixed pace, modes in rotating order."""
    import multiprocessing as mp

    from graphlearn_torch.channel import ShmChannel
    from healthkit_glt._receive import open_receiver

    ctx = mp.get_context("spawn")
    message_bytes = rows * (fx.FEATURE_DIM + 2) * 4
    channel = ShmChannel(messages + 1, f"{(messages + 1) * (message_bytes + 4096) // 2**20 + 1}MB")
    commands = ctx.SimpleQueue()
    writer = ctx.Process(target=_burst_writer, args=(channel, commands, rows), daemon=True)
    writer.start()
    receivers = {m: open_receiver(channel, [writer], mode=m) for m in ("ring", "thread")}
    ring, thread = receivers["ring"].receive, receivers["thread"].receive
    gets = {"stock": channel.recv, "ring": lambda: ring()[0], "thread": lambda: thread()[0]}
    modes = list(gets)
    cpu: dict[str, list[float]] = {m: [] for m in modes}
    wall: dict[str, list[float]] = {m: [] for m in modes}
    try:
        commands.put((1, 0.0))
        msg = gets["stock"]()  # the writer is up (torch imported)
        del msg
        for r in range(rounds):
            for mode in modes[r % 3 :] + modes[: r % 3]:
                get = gets[mode]
                t, c = time.perf_counter(), time.process_time()
                commands.put((messages, period_s))
                for _ in range(messages):
                    msg = get()
                    del msg  # dropped at once, as by the dropping consumer
                wall[mode].append((time.perf_counter() - t) / messages)
                cpu[mode].append((time.process_time() - c) / messages)
    finally:
        commands.put(None)
        writer.join(30)
        for receiver in receivers.values():
            receiver.stop()
            receiver.close()
        if writer.is_alive():
            writer.kill()
            writer.join()
    return {"cpu": cpu, "wall": wall, "rounds": rounds, "messages": messages,
            "period_s": period_s, "message_kb": message_bytes / 1024}  # fmt: skip


def sc_block(mode: str, epochs: int, repeats: int = SEED_REPEATS) -> dict[str, Any]:
    """One server-client block (``glt_server_scenarios.py healthy``): a server and one
    client in a fresh process group, a warm-up epoch, then ``epochs`` timed epochs."""
    seeds = fx.NUM_NODES * repeats
    env = {
        "HK_TEST_SEED_REPEATS": str(repeats),
        # One epoch's batches fit in the server's buffer: stock GLT's concurrent-writer
        # stall cannot happen then; both get the same options (GLT's default prefetch).
        "HK_TEST_BUFFER_CAPACITY": str(fx.one_epoch_capacity(seeds)),
        "HK_TEST_PREFETCH": "4",
        "HK_TEST_CPU": "1",
    }
    run = ssc.run("healthy", [mode, str(epochs + 1)], timeout=SC_BLOCK_S, env=env)
    r = run.results[-1] if run.results else {}
    client = r.get("clients", {}).get("healthy", {})
    return {"seeds": seeds, "returncode": run.returncode, "epochs": client.get("epochs", []),
            "loader_shutdown_s": client.get("loader_shutdown_s"),
            "left": len(run.survivors) + len(run.leaked_segments),
            "error": None if client.get("exit") else run.output[-3000:]}  # fmt: skip


def server_client_throughput(
    blocks: int, epochs: int, repeats: int = SEED_REPEATS
) -> dict[str, Any]:
    """``blocks`` blocks of each mode, alternating as in :func:`block_order`."""
    per_epoch: list[dict[str, Any]] = []
    per_block: list[dict[str, Any]] = []
    seeds = 0
    for index, name in enumerate(block_order(blocks)):
        b = sc_block("stock" if name == "stock" else "hk", epochs, repeats)
        seeds = b["seeds"]
        timed = b["epochs"][1:]  # the first is the warm-up
        for i, e in enumerate(timed):
            per_epoch.append({"loader": name, "block": index, "epoch": i, "batches": e["batches"],
                              "wall_s": e["seconds"], "cpu_s": e["cpu_s"],
                              "every_seed_seen": e["every_seed_seen"]})  # fmt: skip
        row = {"loader": name, "block": index, "hung": b["returncode"] is None,
               "returncode": b["returncode"], "left": b["left"],
               "shutdown_s": b["loader_shutdown_s"]}  # fmt: skip
        if b["error"] and len(timed) < epochs:
            row["error"] = b["error"]
        per_block.append(row)
        print(f"[glt-bench] server-client block {index} ({name}): {len(timed)} epochs, "
              f"{row}", flush=True)  # fmt: skip
    return {"seeds": seeds, "blocks": blocks, "epochs": epochs, "per_epoch": per_epoch,
            "per_block": per_block}  # fmt: skip


def _trim(r: dict[str, Any]) -> dict[str, Any]:
    """A fault run's result without what the page does not need (event log, tracebacks)."""
    out = {k: v for k, v in r.items() if k != "events"}
    for v in out.values():
        if isinstance(v, dict):
            v.pop("mro", None)
            v.pop("worker_traceback", None)
    return out


def server_client_faults(runs: int) -> dict[str, Any]:
    """``runs`` healthkit_glt fault runs, one stock GLT run (each of its faults watched for
    ``SC_HANG_S``), and ``runs`` network-loss runs when this machine can
    make a private network namespace."""
    hang_env = {"HK_TEST_HANG_S": str(SC_HANG_S)}
    out: dict[str, Any] = {"hang_s": SC_HANG_S, "hk": [], "stock": [], "network": [],
                           "stock_network": [],
                           "connection_timeout": ssc.CONNECTION_TIMEOUT_S}  # fmt: skip
    for mode, n in (("hk", runs), ("stock", 1)):
        for _ in range(n):
            run = ssc.run("faults", [mode], timeout=SC_BLOCK_S, env=hang_env)
            r = _trim(run.results[-1]) if run.results else {"error": "no result"}
            r.update(rc=run.returncode, left_processes=len(run.survivors),
                     left_segments=len(run.leaked_segments))  # fmt: skip
            out[mode].append(r)
            print(f"[glt-bench] server-client faults ({mode}): "
                  f"{str({k: v for k, v in r.items() if k != 'worker_pids'})[:400]}",
                  flush=True)  # fmt: skip
    # A raising sampler in stock GLT: its producers take no sampler factory, so the server's
    # data makes the real feature lookup raise.
    run = ssc.run("sampler-error", ["stock"], timeout=SC_BLOCK_S, env=hang_env)
    out["stock_sampler_error"] = _trim(run.results[-1]) if run.results else {"error": "no result"}
    out["netns"] = ssc.netns_available()
    if out["netns"] is None:
        for mode, n in (("hk", runs), ("stock", 1)):
            for _ in range(n):
                run = ssc.run("network-loss", [mode], timeout=SC_BLOCK_S, netns=True)
                r = _trim(run.results[-1]) if run.results else {"error": "no result"}
                r.update(rc=run.returncode, left_processes=len(run.survivors),
                         left_segments=len(run.leaked_segments))  # fmt: skip
                out["network" if mode == "hk" else "stock_network"].append(r)
    return out


def server_client(quick: bool) -> dict[str, Any]:
    import healthkit_glt as hg
    import torch

    blocks, epochs = SC_QUICK_PLAN if quick else SC_PLAN
    t0 = time.monotonic()
    res: dict[str, Any] = {
        "command": " ".join(
            [os.path.relpath(sys.executable, ROOT), "benchmarks/glt_bench.py", "--server-client"]
        ),
        "date": f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M}",
        "glt": hg.glt_version(),
        "software": f"torch {torch.__version__}, graphlearn-torch {hg.glt_version()}, CPU only",
        "quick": quick,
        "targets": [t.as_dict() for t in SC_TARGETS],
        # the quick smoke run: one pass over the seeds an epoch, to keep it short
        "throughput": server_client_throughput(blocks, epochs, 1 if quick else SEED_REPEATS),
    }
    if not quick:
        res["faults"] = server_client_faults(SC_FAULT_RUNS)
    res["total_s"] = time.monotonic() - t0
    res["machine"] = machine()
    return res


def _tree_env(tree: str) -> dict[str, str]:
    """The environment that runs ``tree``'s healthkit and healthkit_glt."""
    return {"PYTHONPATH": os.pathsep.join(
        [tree, os.path.join(tree, "integrations", "glt"),
         os.path.join(tree, "integrations", "graphlearn")])}  # fmt: skip


def worker_kill(runs: int, baseline: str | None) -> dict[str, Any]:
    """Server-client mode, a sampling worker SIGKILLed on the server in a 2,000-batch epoch
    (``glt_server_scenarios.py worker-kill``): the time to the client's error and the
    batches the client got after the kill and after the server observed the death. With
    ``baseline`` (a tree of an earlier healthkit), its runs alternate with this tree's."""
    import healthkit_glt as hg
    import torch

    trees = [("this tree", ROOT)] + ([("baseline", os.path.abspath(baseline))] if baseline else [])
    t0 = time.monotonic()
    res: dict[str, Any] = {
        "command": " ".join(
            [
                os.path.relpath(sys.executable, ROOT),
                "benchmarks/glt_bench.py",
                "--worker-kill",
                str(runs),
                *(["--baseline", baseline] if baseline else []),
            ]
        ),
        "date": f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M}",
        "glt": hg.glt_version(),
        "software": f"torch {torch.__version__}, graphlearn-torch {hg.glt_version()}, CPU only",
        "seed_repeats": WK_SEED_REPEATS,
        "kill_after_batch": ssc.KILL_AFTER_BATCH,
        "runs": {name: [] for name, _ in trees},
    }
    for i in range(runs):
        for name, tree in trees if i % 2 == 0 else trees[::-1]:
            env = {**_tree_env(tree), "HK_TEST_SEED_REPEATS": str(WK_SEED_REPEATS),
                   "HK_TEST_BUFFER_CAPACITY": str(WK_BUFFER_CAPACITY)}  # fmt: skip
            run = ssc.run("worker-kill", ["hk", str(WK_PAUSE_S), str(WK_DELAY_S)],
                          timeout=WK_RUN_S, env=env)  # fmt: skip
            r = run.results[-1] if run.results else {"error": "no result"}
            wk = {k: v for k, v in r.get("worker_kill", {}).items() if k != "message"}
            wk.update(rc=run.returncode, error=r.get("error"),
                      left_processes=len(run.survivors),
                      left_segments=len(run.leaked_segments))  # fmt: skip
            res["runs"][name].append(wk)
            print(f"[glt-bench] worker-kill ({name}) run {i + 1}: {wk}", flush=True)
    res["total_s"] = time.monotonic() - t0
    res["machine"] = machine()
    return res


def _worker_kill_section() -> list[str]:
    lines = [
        "## Server-client mode: a worker killed in a long epoch",
        "",
        "One server, one client, an epoch of 2,000 batches "
        f"(`HK_TEST_SEED_REPEATS={WK_SEED_REPEATS}`), 2 sampling workers on the server, "
        f"its ring {WK_BUFFER_CAPACITY} batches (`HK_TEST_BUFFER_CAPACITY`), a prefetch of "
        f"2. The client takes {WK_DELAY_S * 1000:.0f} ms per batch (a training step: slower "
        "than the sampling, so the ring stays full) and, after batch "
        f"{ssc.KILL_AFTER_BATCH}, pauses {WK_PAUSE_S:g} s (an evaluation, a checkpoint: the "
        "ring fills); 0.2 s into the pause the driver SIGKILLs sampling worker 1 "
        f"(`HK_TEST_SEED_REPEATS={WK_SEED_REPEATS} "
        f"HK_TEST_BUFFER_CAPACITY={WK_BUFFER_CAPACITY} tests/glt/glt_server_scenarios.py "
        f"worker-kill hk {WK_PAUSE_S:g} {WK_DELAY_S:g}`). All times on one clock "
        "(CLOCK_MONOTONIC). *Error after*: from the client's next request after the death "
        "(the end of its pause) to the `RemoteSamplingError` in its loop; a client that does "
        "not ask cannot be told sooner. *Exit*: when the worker's exit became visible (its "
        "pidfd, watched by the driver). *Server delivered after the exit*: the runs in which "
        "the server's producer handed out a batch after that (its last delivery, from the "
        "server), and by how long at most. *Client batches after the exit*: batches the "
        "client got after it (those the server delivered just before are still in flight "
        "then: up to the prefetch).",
        "",
    ]
    files = sorted(glob.glob(WK_RESULTS.format("*")))
    if not files:
        return [*lines, "No saved runs (`benchmarks/glt_bench.py --worker-kill 9`).", ""]

    def spread(xs: list[float], unit: str, fmt: str) -> str:
        if not xs:
            return "n/a"
        xs = sorted(xs)
        return (f"{format(statistics.median(xs), fmt)}{unit} median, "
                f"{format(xs[-1], fmt)}{unit} max")  # fmt: skip

    for path in files:
        with open(path) as f:
            res = json.load(f)
        lines += [
            f"### graphlearn-torch {res['glt']}",
            "",
            f"- Command: `{res['command']}`",
            f"- Date: {res['date']} UTC; {res['total_s']:.0f} s",
            f"- Machine: {res['machine']}",
            f"- Software: {res['software']}",
            *([f"- Baseline: {res['baseline_label']}"] if res.get("baseline_label") else []),
            "",
            "| code | runs | error after | under 1 s | server delivered after the exit "
            "| client batches after the exit | hung / other |",
            "|---|---:|---|---:|---|---|---:|",
        ]
        for name, runs in res["runs"].items():
            ok = [r for r in runs if not r.get("hung", True) and "after_asked_s" in r]
            after = [r["after_asked_s"] for r in ok]
            late = [x for r in ok
                    if (x := r.get("server_last_delivery_after_exit_s") or 0.0) > 0]  # fmt: skip
            late_s = f", by up to {max(late):.3f} s" if late else ""
            lines.append(
                f"| {name} | {len(runs)} | {spread(after, ' s', '.2f')} "
                f"| {sum(a < 1.0 for a in after)} of {len(runs)} "
                f"| {len(late)} of {len(ok)} runs{late_s} "
                f"| {spread([r['batches_after_exit'] for r in ok], '', '.0f')} "
                f"| {len(runs) - len(ok)} |"
            )
        lines.append("")
    return lines


def machine() -> str:
    model = "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"{os.cpu_count()} cores ({model}), Linux {platform.release()}, Python "
        f"{platform.python_version()}; load average at the end {load} (shared machine)"
    )


# ---------------------------------------------------------------------- statistics
LOADERS = (("stock", "stock GLT"), ("healthkit_glt", "healthkit_glt"))


def block_values(e2e: dict[str, Any], metric: str) -> dict[str, list[float]]:
    """Per loader, one value per block: its mean wall seconds per epoch (``wall``), its
    tree CPU seconds per batch (``cpu``), or its start-up seconds (``startup``)."""
    out: dict[str, list[float]] = {key: [] for key, _ in LOADERS}
    for b in e2e["per_block"]:
        if metric == "startup":
            if "startup_s" in b:
                out[b["loader"]].append(b["startup_s"])
            continue
        rows = [r for r in e2e["per_epoch"] if r["block"] == b["block"]]
        if not rows:
            continue
        if metric == "wall":
            out[b["loader"]].append(statistics.mean(r["wall_s"] for r in rows))
        else:
            out[b["loader"]].append(sum(r["cpu_s"] for r in rows) / sum(r["batches"] for r in rows))
    return out


def verdicts(results: dict[str, Any]) -> list[Verdict]:
    quick = bool(results.get("quick"))
    saved = results.get("targets")
    targets = [Target(**d) for d in saved] if saved else TARGETS
    out = []
    for t in targets:
        consumer, metric = t.key.split(".")
        e2e = results.get("e2e", {}).get(consumer)
        if e2e is None:
            out.append(Verdict(t.what, t.statistic, "n/a", "", "0", "not measured"))
            continue
        v = block_values(e2e, metric)
        out.append(judge_difference(t, v["healthkit_glt"], v["stock"], quick))
    return out


def guard_cpu_per_message(rp: dict[str, Any], mode: str = "ring") -> float:
    """Extra CPU seconds per message of ``mode``'s receive over stock ``recv()``: the median
    of the per-rotation differences (each rotation runs every mode back to back)."""
    pairs = zip(rp["cpu"][mode], rp["cpu"]["stock"], strict=True)
    return statistics.median(m - s for m, s in pairs)


def sc_verdicts(sc_res: dict[str, Any]) -> list[Verdict]:
    targets = [Target(**d) for d in sc_res.get("targets", [])] or SC_TARGETS
    out = []
    for t in targets:
        metric = t.key.split(".")[1]
        v = block_values({"per_block": sc_res["throughput"]["per_block"],
                          "per_epoch": sc_res["throughput"]["per_epoch"]}, metric)  # fmt: skip
        out.append(judge_difference(t, v["healthkit_glt"], v["stock"], bool(sc_res["quick"])))
    return out


def _pct(x: float) -> str:
    return f"{100 * x:+.2f} %"


# ---------------------------------------------------------------------- page
def _verdict_section(results: dict[str, Any]) -> list[str]:
    lines = [
        "## Verdicts",
        "",
        "Protocol, declared in `benchmarks/glt_bench.py` before the run: "
        f"{RULES['mean difference']}. "
        "A block is one loader build: its warm-up epoch (not timed), then its timed epochs; "
        "the blocks of the two loaders alternate in the order stock, healthkit_glt, "
        "healthkit_glt, stock, ... in one run.",
        "",
        "| target | statistic | estimate | 95 % CI | n | verdict |",
        "|---|---|---:|---:|---:|---|",
    ]
    for v in verdicts(results):
        lines.append(f"| {v.what} | {v.statistic} | {v.estimate} | {v.ci} | {v.n} | {v.verdict} |")
    if results.get("quick"):
        lines += ["", "A quick run: too few blocks for any verdict; it proves the code runs."]
    lines.append("")
    return lines


def _e2e_section(title: str, consumer: str, e2e: dict[str, Any]) -> list[str]:
    batches = sorted({r["batches"] for r in e2e["per_epoch"]})
    lines = [
        f"## {title}",
        "",
        f"Consumer: {consumer}. {e2e['seeds']} seeds per epoch "
        f"({'/'.join(map(str, batches))} batches); {e2e['blocks']} blocks per loader, "
        f"{e2e['epochs']} timed epochs per block, each block in a fresh process (its own "
        "process group, killed if a block's next epoch does not come within "
        f"{BLOCK_STALL_S[e2e.get('consumer', 'drop')]:.0f} s: a hung block; its finished "
        "epochs are kept). Wall time: each epoch, by the consumer's "
        "clock. CPU: user + system time of the loader's process and every process below it "
        "(the sampling workers), every thread, read from `/proc` around each epoch. "
        "Start-up: from the loader's construction to its first batch. Raw data, every epoch "
        "of every block: `benchmarks/results/glt.json`.",
        "",
        "| loader | wall per epoch (mean of blocks) | block means, range | tree CPU per batch "
        "(mean of blocks) | block means, range | start-up (median) | shutdown (median) "
        "| blocks hung / failed |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    wall, cpu, start = (block_values(e2e, m) for m in ("wall", "cpu", "startup"))
    for key, name in LOADERS:
        mine = [b for b in e2e["per_block"] if b["loader"] == key]
        shut = [b["shutdown_s"] for b in mine if "shutdown_s" in b]
        hung = sum(b["hung"] for b in mine)
        failed = sum(not b["hung"] and b.get("returncode") != 0 for b in mine)
        if not wall[key] or not start[key]:
            lines.append(f"| {name} | no finished epoch |||||| {hung} / {failed} of {len(mine)} |")
            continue
        lines.append(
            f"| {name} | {statistics.mean(wall[key]):.3f} s | {min(wall[key]):.3f} to "
            f"{max(wall[key]):.3f} s | {1e6 * statistics.mean(cpu[key]):.0f} us | "
            f"{1e6 * min(cpu[key]):.0f} to {1e6 * max(cpu[key]):.0f} us | "
            f"{statistics.median(start[key]):.2f} s | "
            f"{f'{statistics.median(shut):.2f} s' if shut else 'n/a'} | "
            f"{hung} / {failed} of {len(mine)} |"
        )
    if len(wall["stock"]) >= 2 and len(wall["healthkit_glt"]) >= 2:
        cells = []
        for m in (wall, cpu, start):
            est, lo, hi = mean_difference_ci(m["healthkit_glt"], m["stock"])
            cells.append(f"{_pct(est)} (CI {_pct(lo)} to {_pct(hi)})")
        lines += [
            "",
            f"healthkit_glt against stock, difference of the means with its 95 % CI: wall "
            f"per epoch {cells[0]}; tree CPU per batch {cells[1]}; start-up {cells[2]} "
            "(start-up has no declared target).",
        ]
    lines.append("")
    return lines


def _receive_path_section(rp: dict[str, Any]) -> list[str]:
    period = rp["period_s"]
    lines = [
        "## A proxy: the receive path alone",
        "",
        "This is a proxy, not the end-to-end figure above: it isolates the consumer's CPU on "
        "the receive path, the only place healthkit_glt adds work per batch, and leaves out "
        "everything else an epoch does (a variant can be cheaper here and slower end to end).",
        "",
        f"One writer process sends a {rp['message_kb']:.0f} KB message (about a batch of "
        f"this workload) every {1e3 * period:.2f} ms (stock's mean batch time in the "
        "dropping run above) into one `ShmChannel`; the consumer receives "
        f"{rp['messages']} of them per run and drops each at once, through stock GLT's "
        "`recv()`, healthkit_glt's ring reader (the default) and its helper-thread fallback "
        f'(`receiver="thread"`), in rotating order, {rp["rounds"]} runs each.',
        "",
        "| receive through | consumer CPU per message (median) | extra over stock (median "
        "of the per-rotation differences) | extra, of the time between messages (proxy) "
        "| runs (CPU per message) |",
        "|---|---|---|---|---|",
    ]
    for mode, what in (
        ("stock", "stock `ShmChannel.recv()`"),
        ("ring", "healthkit_glt, ring reader (default)"),
        ("thread", "healthkit_glt, helper thread (fallback)"),
    ):
        cpus = rp["cpu"][mode]
        runs = ", ".join(f"{1e6 * c:.0f}" for c in cpus)
        guard = 0.0 if mode == "stock" else guard_cpu_per_message(rp, mode)
        extra = "" if mode == "stock" else f"{1e6 * guard:+.1f} us"
        share = "" if mode == "stock" else f"{100 * guard / period:+.2f} %"
        lines.append(
            f"| {what} | {1e6 * statistics.median(cpus):.1f} us | {extra} | {share} | {runs} us |"
        )
    lines.append("")
    return lines


def _death_section(dt: dict[str, Any]) -> list[str]:
    lines = [
        "## Time from a worker's SIGKILL to the error",
        "",
        "| when the worker dies | healthkit_glt: error after | error raised | stock GLT |",
        "|---|---|---|---|",
    ]
    for key, what in (
        ("init", "during init (0.5 s after spawn)"),
        ("mid-epoch", "mid-epoch (after batch 1, consumer paused 0.5 s)"),
    ):
        d = dt[key]
        lat = d["healthkit_glt"]
        lat_s = ", ".join(f"{x:.2f}" for x in lat)
        stock = (
            f"still hung after {d['stock_elapsed']:.0f} s (then killed)"
            if d["stock_hung"]
            else f"ended by itself with rc {d['stock_rc']} after {d['stock_elapsed']:.1f} s"
        )
        lines.append(
            f"| {what} | {statistics.median(lat):.2f} s (runs: {lat_s}) | `{d['error']}` "
            f"| {stock} |"
        )
    lines += [
        "",
        "The healthkit_glt figure runs from the SIGKILL to the exception reaching the "
        "caller, and includes the teardown of the surviving worker (SIGTERM and join), "
        "which happens before the raise. First line of each error:",
        "",
    ]
    lines += [f"- {key}: `{dt[key]['head']}`" for key in ("init", "mid-epoch")]
    lines.append("")
    return lines


def _writers_section(wr: dict[str, Any]) -> list[str]:
    lines = [
        "## Two writers, one channel: GLT's concurrent-writer stall",
        "",
        f"Two spawned processes each send {wr['messages']} small messages into one "
        "`ShmChannel(capacity=2)`; the consumer receives them all and checks each writer's "
        f"order. A run still going after {wr['stall_s']:.0f} s counts as stalled and is "
        f"killed. The two modes alternate, {wr['runs']} runs each.",
        "",
        "| writers send | runs | stalled for good | completed runs: time to receive all |",
        "|---|---|---|---|",
    ]
    for mode, what in (
        ("stock", "concurrently (stock GLT)"),
        ("serialized", "through healthkit_glt's send lock"),
    ):
        d = wr[mode]
        done = ", ".join(f"{x:.1f} s" for x in d["seconds"]) or "none completed"
        lines.append(f"| {what} | {wr['runs']} | {d['stalled']} | {done} |")
    lines.append("")
    return lines


def _fault_section() -> list[str]:
    lines = [
        "## Fault matrix, per supported graphlearn-torch build",
        "",
        "Each fault runs in a throwaway process group (`tests/glt/glt_scenarios.py`) on the "
        'test graph (1,000 nodes, 2 sampling workers). "Time to it" runs from the fault '
        "(the SIGKILL, the worker's raise or its report, the `shutdown()` call) to the error "
        "reaching the caller, with the teardown of the other workers included (it happens "
        "before the raise); for a killed trainer, to both workers being gone; for "
        '`shutdown()`, to its return. "Processes left" and "segments left" add up, over '
        "the runs, the processes of the run still alive after it ended and the SysV "
        "segments its processes created that were still there (the runner then removes "
        "them). What some rows include:",
        "",
        "- *at the init barrier*: the barrier first dumps the stack of the peer that never "
        "arrived (it is part of the error) and the teardown SIGTERMs that peer;",
        "- *sampler factory raises*: timed from the raise (the worker puts the time in its "
        "message); the raiser exits at once, without shutting its RPC agent down first;",
        "- *`shutdown()` during an epoch*: the workers are parked in `send()` and cannot read "
        "the stop request; they are SIGTERMed after `grace` and exit 0 through "
        "torch's handler, so nothing is raised (the error column says `none`).",
        "",
    ]
    files = sorted(glob.glob(FAULT_RESULTS))
    if not files:
        return [*lines, "No saved fault-matrix runs (`benchmarks/results/glt-faults-*.json`).", ""]
    for path in files:
        with open(path) as f:
            saved = json.load(f)
        lines += [f"### graphlearn-torch {saved['glt']}", ""]
        lines += fault_matrix.markdown(saved)
        lines.append("")
    return lines


def _median_s(values: list[float | None]) -> str:
    xs = [x for x in values if x is not None]
    if not xs:
        return "n/a"
    return f"{statistics.median(xs):.2f} s (runs: {', '.join(f'{x:.2f}' for x in xs)})"


def _sc_fault_rows(f: dict[str, Any]) -> list[str]:
    hk, stock, net = f["hk"], (f["stock"] or [{}])[0], f["network"]
    hang = f"{f['hang_s']:.0f} s"

    def col(rows: list[dict[str, Any]], key: str, field: str) -> list[float | None]:
        return [(r.get(key) or {}).get(field) for r in rows]

    def types(rows: list[dict[str, Any]], key: str) -> str:
        found = sorted({(r.get(key) or {}).get("type") or "none" for r in rows})
        return ", ".join(f"`{t}`" for t in found)

    def stock_sampler(r: dict[str, Any] | None, hang: str) -> str:
        e = (r or {}).get("sampler_error") or {}
        if not e:
            return "not measured"
        if e.get("hung") and "epochs" not in e:  # saved before the epochs were recorded
            return (f"(the server's features cover half the nodes: the real lookup raises) "
                    f"no error within {hang} (this run recorded only that; the client does "
                    "not wait, it ends each epoch short: docs/glt.md)")  # fmt: skip
        if e.get("hung"):
            return (f"(the server's features cover half the nodes: the real lookup raises) "
                    f"client still waiting after {hang}")  # fmt: skip
        epochs = e.get("epochs") or []
        if not e.get("type") and epochs:
            full = (r or {}).get("full_epoch_batches", "?")
            sizes = sorted({x["batches"] for x in epochs})
            short = ", ".join(str(n) for n in sizes)
            return (f"(the server's features cover half the nodes: the real lookup raises) "
                    f"no error: {len(epochs)} epochs in {hang}, each ended short ({short} of "
                    f"{full} batches, seeds missing): silent data loss")  # fmt: skip
        return f"ended: `{e.get('type')}`"

    def stock_cell(key: str, hung_text: str) -> str:
        r = stock.get(key) or {}
        if not r:
            return "not measured"
        if r.get("hung", r.get("workers_gone_after_s") is None):
            return hung_text
        return f"ended: `{r.get('type')}`"

    def stock_net(side: str) -> str:
        nl = (f.get("stock_network") or [{}])[0].get("network_loss") or {}
        if not nl:
            return "not measured"
        watched = f"{3 * f['connection_timeout'] + 10:g} s"
        if side == "client":
            return (f"client still waiting after {watched}" if nl.get("hung")
                    else f"ended: `{nl.get('type')}`")  # fmt: skip
        return (f"workers still running after {watched}" if nl.get("survivors")
                else "workers gone")  # fmt: skip

    rows = [
        ("a sampling worker SIGKILLed on the server while the client's fetch waits there",
         "worker_kill", "after_kill_s", types(hk, "worker_kill"),
         stock_cell("worker_kill", f"client still waiting after {hang} (then killed)")),
        ("a sampler raising on the server (worker 1 of the producer), from its report",
         "sampler_error", "after_raise_s", types(hk, "sampler_error"),
         stock_sampler(f.get("stock_sampler_error"), hang)),
        ("the client SIGKILLed mid-epoch: until its producer's workers on the server are gone",
         "client_kill", "workers_gone_after_s", "(producer released)",
         f"workers still running after {hang}" if (stock.get("client_kill") or {}).get(
             "survivors") else "not measured"),
        ("the server SIGKILLed while the client's fetch waits on it",
         "server_kill", "after_kill_s", types(hk, "server_kill"),
         stock_cell("server_kill", f"client still waiting after {hang}; the server's "
                    "workers live on as orphans")),
    ]  # fmt: skip
    out = []
    for what, key, field, err, stock_text in rows:
        out.append(f"| {what} | {err} | {_median_s(col(hk, key, field))} | {stock_text} |")
    if net:
        t = f["connection_timeout"]
        out.append(
            f"| the network lost (loopback of a private namespace taken down; connection "
            f"timeout {t:g} s): client's error | {types(net, 'network_loss')} | "
            f"{_median_s(col(net, 'network_loss', 'after_loss_s'))} | {stock_net('client')} |"
        )
        out.append(
            "| the network lost: until the server shut the client's producer down | "
            f"(producer released) | {_median_s(col(net, 'network_loss', 'workers_gone_after_s'))}"
            f" | {stock_net('server')} |"
        )
    elif f.get("netns"):
        out.append(f"| the network lost | not run here: {f['netns']} | | |")
    left_p = sum(r.get("left_processes", 0) for r in hk + net)
    left_s = sum(r.get("left_segments", 0) + r.get("segments_left", 0)
                 + r.get("orphan_segments_removed", 0) for r in hk + net)  # fmt: skip
    out += ["", f"healthkit_glt runs: {len(hk)} fault runs and {len(net)} network-loss "
            f"runs; processes left after them: {left_p}; SysV segments left: {left_s}. "
            f"Stock GLT's run left {stock.get('segments_left', 'n/a')} SysV segments of its "
            "killed server in the kernel (the scenario's driver removed them)."]  # fmt: skip
    return out


def _server_client_section(saved: list[dict[str, Any]]) -> list[str]:
    lines = [
        "## Server-client mode",
        "",
        "GLT's server-client mode (`init_server` and `RemoteDistSamplingWorkerOptions`), one "
        "server and its clients as separate processes on this machine with real GLT RPC, "
        "run by `tests/glt/glt_server_scenarios.py`. Stock: GLT's `init_server` and "
        "`DistNeighborLoader`; healthkit_glt: `healthkit_glt.init_server` and "
        "`healthkit_glt.DistNeighborLoader`, the same arguments.",
        "",
    ]
    if not saved:
        return [
            *lines,
            "No saved server-client runs (`benchmarks/results/glt-server-client-*.json`; "
            "`benchmarks/glt_bench.py --server-client`).",
            "",
        ]
    for res in saved:
        tp = res["throughput"]
        lines += [
            f"### graphlearn-torch {res['glt']}",
            "",
            f"- Command: `{res['command']}`",
            f"- Date: {res['date']} UTC; {res['total_s']:.0f} s",
            f"- Machine: {res['machine']}",
            f"- Software: {res['software']}",
            "",
            f"Steady state: one client that drops each batch, {tp['seeds']} seeds per epoch, "
            "2 sampling workers on the server, the server's buffer one epoch's batches "
            "(stock's concurrent-writer stall cannot happen then), GLT's default prefetch "
            f"(4). {tp['blocks']} blocks per loader, alternating stock, healthkit_glt, "
            f"healthkit_glt, stock, ...; a block is a fresh server and client, a warm-up "
            f"epoch, then {tp['epochs']} timed epochs. Wall: each epoch by the client's "
            "clock. CPU: user + system time of the client, the server and its workers, every "
            "thread, from `/proc` around each epoch. Protocol as in \"Verdicts\" above.",
            "",
            "| target | statistic | estimate | 95 % CI | n | verdict |",
            "|---|---|---:|---:|---:|---|",
        ]
        for v in sc_verdicts(res):
            lines.append(
                f"| {v.what} | {v.statistic} | {v.estimate} | {v.ci} | {v.n} | {v.verdict} |"
            )
        lines += ["", "| loader | wall per epoch (mean of blocks) | CPU per batch (mean of "
                  "blocks) | every seed seen, every epoch | blocks hung / failed |",
                  "|---|---:|---:|---|---:|"]  # fmt: skip
        walls = block_values({"per_block": tp["per_block"], "per_epoch": tp["per_epoch"]}, "wall")
        cpus = block_values({"per_block": tp["per_block"], "per_epoch": tp["per_epoch"]}, "cpu")
        for key, name in LOADERS:
            ok = all(e["every_seed_seen"] for e in tp["per_epoch"] if e["loader"] == key)
            mine = [b for b in tp["per_block"] if b["loader"] == key]
            bad = sum(b["hung"] for b in mine), sum(bool(b.get("error")) for b in mine)
            wall = f"{statistics.mean(walls[key]):.3f} s" if walls[key] else "n/a"
            cpu = f"{1e6 * statistics.mean(cpus[key]):.0f} us" if cpus[key] else "n/a"
            lines.append(f"| {name} | {wall} | {cpu} | {'yes' if ok else 'NO'} "
                         f"| {bad[0]} / {bad[1]} of {len(mine)} |")  # fmt: skip
        lines.append("")
        if "faults" in res:
            lines += [
                "Faults: one server and three clients per run (the sequence is in "
                "`scenario_faults`); times run from the fault (the SIGKILL, the worker's "
                "report of its error, the loopback going down) to the error reaching the "
                "client's caller, or to the workers being gone.",
                "",
                "| fault | healthkit_glt: error | healthkit_glt: time to it (median) "
                "| stock GLT |",
                "|---|---|---|---|",
            ]
            lines += _sc_fault_rows(res["faults"])
            lines.append("")
    return lines


def _saved_server_client(results: dict[str, Any]) -> list[dict[str, Any]]:
    if results.get("quick"):
        return [results["server_client"]] if "server_client" in results else []
    saved = []
    for path in sorted(glob.glob(SC_RESULTS.format("*"))):
        with open(path) as f:
            saved.append(json.load(f))
    return saved


def render(results: dict[str, Any]) -> str:
    lines = [
        "# Benchmark: stock graphlearn-torch vs healthkit_glt",
        "",
        f"- Command: `{results['command']}`",
        f"- Date: {results['date']} UTC; {results['total_s']:.0f} s",
        f"- Machine: {results['machine']}",
        f"- Software: {results['software']}",
        f"- Workload: {fx.NUM_NODES}-node random graph ({fx.NUM_EDGES} edges), 2 sampling "
        f"workers, fan-out {list(fx.NUM_NEIGHBORS)}, batch {fx.BATCH_SIZE}, features "
        "collected, the same seeds and loader seed for both loaders. Both get the same "
        "worker options, with a channel capacity of one epoch's batches (stock GLT cannot "
        'hit its concurrent-writer stall then; see "Two writers, one channel").',
        "",
    ]
    lines += _verdict_section(results)
    e2e = results["e2e"]
    lines += _e2e_section(
        "End to end, consumer drops each batch", "drops each batch at once (any per-batch "
        "cost of ours as visible as it can be)", e2e["drop"])  # fmt: skip
    lines += _e2e_section(
        "End to end, consumer trains a model on each batch", "a GraphSAGE-style training "
        "step per batch (2 layers, hidden 256, Adam)", e2e["train"])  # fmt: skip
    lines += _receive_path_section(results["receive_path"])
    lines += _death_section(results["death_to_error"])
    lines += _writers_section(results["writers"])
    lines += _fault_section()
    lines += _server_client_section(_saved_server_client(results))
    lines += _worker_kill_section()
    return "\n".join(lines).rstrip() + "\n"


# ---------------------------------------------------------------------- run
def give_up_after(seconds: float) -> None:
    """After ``seconds``, dump every thread's stack, SIGKILL every process below this one
    (stock GLT's workers outlive their parent) and exit with status 1."""

    def give_up() -> None:
        print(f"[glt-bench] still running after {seconds:.0f} s: giving up", file=sys.stderr)
        faulthandler.dump_traceback(all_threads=True)
        for pid in reversed(descendants(os.getpid())):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        os._exit(1)

    timer = threading.Timer(seconds, give_up)
    timer.daemon = True
    timer.start()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run, temporary directory")
    p.add_argument("--out", help="markdown page (default docs/benchmarks-glt.md)")
    p.add_argument("--results", help="raw results JSON (default benchmarks/results/glt.json)")
    p.add_argument("--report-only", metavar="JSON", help="re-render the page from raw results")
    p.add_argument("--budget", type=float, default=None, help="abort after this many s")
    p.add_argument("--server-client", action="store_true",
                   help="measure server-client mode on this environment's GLT build only, "
                   "save it, and re-render the page from the saved results")  # fmt: skip
    p.add_argument(
        "--worker-kill",
        type=int,
        metavar="RUNS",
        help="server-client mode: RUNS runs of a worker killed in a long epoch, "
        "saved, then the page re-rendered from the saved results",
    )
    p.add_argument(
        "--baseline",
        metavar="TREE",
        help="with --worker-kill: also run an earlier healthkit tree's code, "
        "alternating with this one's (e.g. `git archive` of the commit before)",
    )
    p.add_argument(
        "--baseline-label",
        metavar="TEXT",
        help="with --baseline: what that tree is, for the page (e.g. the commit it holds)",
    )
    p.add_argument("--block", nargs=4, help=argparse.SUPPRESS)  # LOADER CONSUMER EPOCHS REPEATS
    args = p.parse_args(argv)
    if args.block:  # one block of the end-to-end runs, in its own process
        run_block(args.block[0], args.block[1], int(args.block[2]), int(args.block[3]))
        return 0
    tmp = tempfile.mkdtemp(prefix="healthkit-glt-bench-") if args.quick else None
    out = args.out or (os.path.join(tmp, "benchmarks-glt.md") if tmp else OUT)
    raw = args.results or (os.path.join(tmp, "glt.json") if tmp else RESULTS)

    if args.server_client and not args.quick:
        give_up_after(args.budget or 3600)
        sc_res = server_client(quick=False)
        path = SC_RESULTS.format(sc_res["glt"])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(portable_paths(json.dumps(sc_res, indent=1)))
        print(f"[glt-bench] server-client: {sc_res['total_s']:.0f} s; raw results: {path}")
        args.report_only = RESULTS  # the page, re-rendered with every saved section

    if args.worker_kill:
        give_up_after(args.budget or 3600)
        wk_res = worker_kill(args.worker_kill, args.baseline)
        wk_res["baseline_label"] = args.baseline_label
        path = WK_RESULTS.format(wk_res["glt"])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(portable_paths(json.dumps(wk_res, indent=1)))
        print(f"[glt-bench] worker-kill: {wk_res['total_s']:.0f} s; raw results: {path}")
        args.report_only = RESULTS

    if args.report_only:
        with open(args.report_only) as f:
            saved = json.load(f)
        if saved.get("format") != FORMAT:
            p.error(f"{args.report_only} has no raw per-epoch data (an older format); re-run")
        if saved.get("quick") and not args.out:  # never over the committed page
            out = os.path.join(tempfile.mkdtemp(prefix="healthkit-glt-bench-"), "page.md")
        with open(out, "w") as f:
            f.write(render(saved))
        print(f"[glt-bench] page rewritten: {out}")
        return 0

    import graphlearn_torch  # noqa: F401
    import healthkit_glt as hg
    import torch

    plan = QUICK_PLAN if args.quick else PLAN
    # A hang anywhere (stock GLT can hang) must not hang the benchmark: dump and exit.
    give_up_after(args.budget or (600 if args.quick else 3000))
    command = os.environ.get("HEALTHKIT_BENCH_GLT_COMMAND") or " ".join(
        [os.path.relpath(sys.executable, ROOT), "benchmarks/glt_bench.py", *(argv or sys.argv[1:])]
    )
    results: dict[str, Any] = {
        "format": FORMAT,
        "command": command,
        "quick": args.quick,
        "date": f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M}",
        "software": f"torch {torch.__version__}, graphlearn-torch {hg.glt_version()}, CPU only",
        "targets": [t.as_dict() for t in TARGETS],
        "e2e": {},
    }
    os.makedirs(os.path.dirname(raw), exist_ok=True)
    t0 = time.monotonic()

    def save() -> None:  # as we go: a late failure keeps the earlier measurements
        results["total_s"] = time.monotonic() - t0
        results["machine"] = machine()
        with open(raw, "w") as f:
            f.write(portable_paths(json.dumps(results, indent=1)))

    # The quick smoke run covers the seeds once an epoch (16 batches, not 391): it proves the
    # code runs, it measures nothing.
    repeats = 1 if args.quick else SEED_REPEATS
    for consumer in ("drop", "train"):
        blocks, epochs = plan[consumer]
        results["e2e"][consumer] = end_to_end(blocks, epochs, consumer, repeats)
        save()
        print(f"[glt-bench] end to end ({consumer}) done at {time.monotonic() - t0:.0f} s")
    stock_wall = block_values(results["e2e"]["drop"], "wall")["stock"]
    period = statistics.mean(stock_wall) / results["e2e"]["drop"]["per_epoch"][0]["batches"]
    results["receive_path"] = receive_path(
        1 if args.quick else 10, 100 if args.quick else 1000, round(period, 4)
    )
    save()
    results["death_to_error"] = death_to_error(
        5.0 if args.quick else 30.0, 1 if args.quick else 3, 60.0 if args.quick else 180.0
    )
    save()
    results["writers"] = writer_race(
        1 if args.quick else 5, 300 if args.quick else 3000, 5.0 if args.quick else 30.0
    )
    save()
    if args.quick:  # a full run's server-client section is measured by --server-client
        results["server_client"] = server_client(quick=True)
        save()
    with open(out, "w") as f:
        f.write(render(results))
    print(f"[glt-bench] {time.monotonic() - t0:.0f} s; page: {out}; raw results: {raw}")
    broken = [
        f"{consumer} block {b['block']} ({b['loader']})"
        for consumer, res in results["e2e"].items()
        for b in res["per_block"]
        if b["hung"] or "shutdown_s" not in b  # it never got through its epochs
    ]
    if broken:  # a smoke run that cannot run a block has proved nothing
        print(f"[glt-bench] FAILED: blocks hung or failed: {', '.join(broken)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
