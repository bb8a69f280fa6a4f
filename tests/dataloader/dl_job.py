"""A training loop over a watched DataLoader, run as its own process by the tests that need
a whole process: its exit, a stop of its process group, its torchrun error file.

    python dl_job.py MODE

``exit-persistent``: persistent workers still running when the script ends (interpreter
shutdown ends them). ``loop``: iterate until stopped; prints "READY <worker pids>" first.
``kill-worker``: SIGKILL worker 1 from inside and let the error escape (with
TORCHELASTIC_ERROR_FILE set, the error file carries the line).
"""

from __future__ import annotations

import os
import signal
import sys
import time

import healthkit_torch
from dl_helpers import Slow
from torch.utils.data import DataLoader


def main() -> None:
    mode = sys.argv[1]
    persistent = mode == "exit-persistent"
    loader = healthkit_torch.watch(
        DataLoader(Slow(n=100_000, delay=0.01), batch_size=4, num_workers=2,
                   multiprocessing_context="fork", persistent_workers=persistent)
    )
    it = iter(loader)
    next(it)
    print("READY", *(w.pid for w in it._workers), flush=True)
    if mode == "exit-persistent":
        for _ in range(3):
            next(it)
        return  # the persistent workers are still running: interpreter shutdown ends them
    if mode == "kill-worker":
        os.kill(it._workers[1].pid, signal.SIGKILL)
    while True:
        next(it)
        time.sleep(0.01)  # the training step


if __name__ == "__main__":
    main()
