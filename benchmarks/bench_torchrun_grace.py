"""torchrun's SIGTERM-to-SIGKILL grace, as its worker sees it: where the watchdog's default
``stop_grace`` comes from (docs/watchdog.md, "stop_grace").

Each run starts ``torchrun --nproc_per_node=1`` (in its own session, as a job launcher
starts it) on a worker that handles SIGTERM and keeps running, as a checkpoint that takes too
long would. Once the worker is up, torchrun gets SIGTERM; it passes SIGTERM to its worker and
SIGKILLs it when its grace (``PContext.close(timeout=30)``) is over. The figure is the
worker's death (seen through a pidfd) minus the moment its own handler took the SIGTERM
(``CLOCK_MONOTONIC``, one clock for every process of the machine). A watchdog grace equal to
this figure would race the launcher's SIGKILL; the default must exceed it.

``python benchmarks/bench_torchrun_grace.py [RUNS]`` (default 3, about 31 s each) prints one
line per run and the list; written by hand to ``benchmarks/results/torchrun-stop-grace.txt``.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time

WORKER = r"""
import os, signal, sys, time
out = sys.argv[1]
def on_term(signum, frame):
    with open(out, "a") as f:
        f.write(f"TERM {time.monotonic():.6f}\n")
signal.signal(signal.SIGTERM, on_term)  # handled: the worker keeps running
with open(out, "a") as f:
    f.write(f"PID {os.getpid()}\n")
while True:
    time.sleep(1)
"""


def one_run(workdir: str, port: int) -> float:
    worker = os.path.join(workdir, "worker.py")
    out = os.path.join(workdir, f"worker-{port}.txt")
    with open(worker, "w") as f:
        f.write(WORKER)
    agent = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=1",
         "--master_port", str(port), worker, out],
        start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not os.path.exists(out) and time.monotonic() < deadline:
            time.sleep(0.1)
        with open(out) as f:
            pid = int(f.read().split()[1])
        fd = os.pidfd_open(pid)
        try:
            time.sleep(0.5)
            agent.send_signal(signal.SIGTERM)
            if not select.select([fd], [], [], 120)[0]:
                raise RuntimeError("the worker outlived torchrun's grace by far")
            died = time.monotonic()
        finally:
            os.close(fd)
        with open(out) as f:
            termed = float(next(line for line in f if line.startswith("TERM")).split()[1])
        agent.wait(60)
        return died - termed
    finally:
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGKILL)
            agent.wait()


def main(argv: list[str]) -> int:
    runs = int(argv[0]) if argv else 3
    figures = []
    with tempfile.TemporaryDirectory(prefix="hk-grace-") as workdir:
        for k in range(runs):
            figures.append(round(one_run(workdir, 29650 + k), 3))
            print(f"run {k}: SIGKILL {figures[-1]:.3f} s after the worker took SIGTERM", flush=True)
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
