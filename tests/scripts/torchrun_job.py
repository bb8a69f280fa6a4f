"""A small distributed job for torchrun: local rank 0 owns a helper server that feeds it
batches; every rank sits in gloo collectives. Used to show what happens when the helper dies.

Prints "HELPER <pid>" once the helper runs. Options: --healthkit to guard the helper (its
entry point is then wrapped in healthkit.record_exception), --helper-raises N to make the
helper raise ValueError("bad shard 7") after N batches, --helper-dies KIND to make it end
another way after 25 batches (segfault, abort, exit3, exit0).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import faulthandler
import multiprocessing as mp
import os
import sys
import time

import torch
import torch.distributed as dist

import healthkit as hk


def helper_server(
    queue: mp.Queue,  # type: ignore[type-arg]
    raise_after: int = -1,
    dies: str = "",
) -> None:
    i = 0
    while True:
        if i == raise_after:
            load_shard(7)
        if dies and i == 25:
            die(dies)
        queue.put(i)
        i += 1
        time.sleep(0.02)


def load_shard(n: int) -> None:
    raise ValueError(f"bad shard {n}")


def die(kind: str) -> None:
    """End the helper as a real helper ends: a native crash, an abort, an exit code."""
    faulthandler.disable()
    if kind == "segfault":
        ctypes.string_at(0)
    elif kind == "abort":
        os.abort()
    sys.exit(3 if kind == "exit3" else 0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--healthkit", action="store_true")
    ap.add_argument("--mode", default="thread")
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--collective-timeout", type=float, default=600)
    ap.add_argument("--helper-raises", type=int, default=-1)
    ap.add_argument(
        "--helper-dies", default="", choices=["", "segfault", "abort", "exit3", "exit0"]
    )
    args = ap.parse_args()

    dist.init_process_group(
        "gloo", timeout=datetime.timedelta(seconds=args.collective_timeout)
    )
    local_rank = int(os.environ["LOCAL_RANK"])
    queue = None
    watchdog = None
    if local_rank == 0:
        ctx = mp.get_context("fork")
        queue = ctx.Queue()
        target = hk.record_exception(helper_server) if args.healthkit else helper_server
        server = ctx.Process(
            target=target,
            args=(queue, args.helper_raises, args.helper_dies),
            name="sampler-server",
            daemon=True,
        )
        server.start()
        if args.healthkit:
            watchdog = hk.DisarmableWatchdog([server], mode=args.mode).arm()
        print(f"HELPER {server.pid}", flush=True)
    t = torch.zeros(1)
    for _ in range(args.steps):
        if queue is not None:
            t[0] = float(queue.get())  # blocks forever once the helper is dead
        dist.all_reduce(t)
    if watchdog is not None:
        watchdog.disarm()
    dist.destroy_process_group()
    print("JOB DONE", flush=True)


if __name__ == "__main__":
    main()
