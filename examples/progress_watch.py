"""A helper that lives but stops producing: the progress watch fails the job and says where.

A feature fetcher produces batches for the training loop and beats once per batch. On its
third batch it deadlocks (two threads taking two locks in opposite orders): alive, silent,
holding everything up. The loop declares when it expects progress (while it waits for a
batch); after ``stall_timeout`` seconds with no beat the watchdog logs who stalled, what it
is blocked on and its Python stacks, and ends this process with exit code 1 (under torchrun:
the error file, and the job is torn down) instead of hanging until a collective times out.

    python examples/progress_watch.py
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import threading
import time

import healthkit


def fetch_features(heartbeat: healthkit.Heartbeat, batches: mp.Queue) -> None:  # type: ignore[type-arg]
    heartbeat.attach()  # who beats, and its stacks readable without interrupting it
    cache, index = threading.Lock(), threading.Lock()

    def refresh_index() -> None:
        with index:
            time.sleep(0.1)
            with cache:
                pass

    for n in range(100):
        if n == 2:  # the bug: two threads take the two locks in opposite orders
            threading.Thread(target=refresh_index, daemon=True).start()
            with cache:
                time.sleep(0.1)
                with index:
                    pass
        batches.put(n)
        heartbeat.beat()


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    ctx = mp.get_context("spawn")
    watch = healthkit.ProgressWatch(stall_timeout=2.0, name="feature fetcher")
    batches = ctx.Queue()
    fetcher = ctx.Process(target=fetch_features, args=(watch.heartbeat, batches), daemon=True)
    fetcher.start()
    watchdog = healthkit.DisarmableWatchdog([fetcher])  # a death fails the job too
    watchdog.watch_progress(watch)
    with watchdog:
        for step in range(10):
            with watch.expecting("a batch"):
                batch = batches.get()
            print(f"step {step}: batch {batch}", flush=True)
            time.sleep(0.05)  # training: nobody waits on the fetcher now
    print("done")


if __name__ == "__main__":
    main()
