"""A 2-rank torchrun job in which every rank owns a watched helper, to be stopped the way
torchrun stops a job (SIGTERM to each worker's process group, SIGKILL after the agent's
grace). Each rank checkpoints for ``--cleanup`` seconds in its SIGTERM handler, then exits 0.

With ``--asyncio`` each rank runs an asyncio loop that installs its SIGTERM handler with
``loop.add_signal_handler`` after arming (the loop then holds the signal wakeup fd).

Prints "HELPER <rank> <pid>" once its helper runs and is watched.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import multiprocessing as mp
import os
import signal
import sys
import time

import torch.distributed as dist
from torchrun_job import helper_server  # this script's directory is on sys.path

import healthkit as hk


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", default="thread")
    ap.add_argument("--start-method", default="fork")
    ap.add_argument("--cleanup", type=float, default=0.2)
    ap.add_argument("--asyncio", action="store_true")
    args = ap.parse_args()

    def on_term(signum: int, frame: object) -> None:
        time.sleep(args.cleanup)  # a checkpoint
        sys.exit(0)

    signal.signal(signal.SIGTERM, on_term)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    ctx = mp.get_context(args.start_method)
    queue = ctx.Queue()
    server = ctx.Process(target=helper_server, args=(queue,), name="sampler-server", daemon=True)
    server.start()
    hk.DisarmableWatchdog([server], mode=args.mode).arm()
    dist.barrier()
    # One write per line: the ranks share torchrun's stdout, and print() writes the text and its
    # newline separately, so two ranks' lines could interleave into one.
    sys.stdout.write(f"HELPER {dist.get_rank()} {server.pid}\n")
    sys.stdout.flush()
    if args.asyncio:
        asyncio.run(serve(queue, args.cleanup))
        return
    while True:
        queue.get()  # a training step that feeds on the helper


async def serve(queue: object, cleanup: float) -> None:
    loop = asyncio.get_running_loop()
    stopped = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stopped.set)  # takes the wakeup fd, after arm()
    await stopped.wait()
    await asyncio.sleep(cleanup)  # a checkpoint
    sys.exit(0)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
