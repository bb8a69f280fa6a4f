"""DataLoader workers: death-to-error latency and iteration throughput, stock torch vs
``healthkit_torch.watch`` in the same run.

Latency: a real ``DataLoader(num_workers=2)``; once it yields, worker 1 is SIGKILLed (as the
OOM killer does) and the time from just before ``os.kill`` (CLOCK_MONOTONIC) to the moment
the ``RuntimeError`` is caught is recorded. Two situations:

- ``waits``: the main process is blocked in ``next()`` (a slow dataset: no batch is ready);
- ``computes``: a training loop of 20 ms steps (a pure-Python spin) between ``next()`` calls;
  the kill lands at a random point of a step.

each with ``fork`` workers (children: torch's SIGCHLD handler sees the death) and
``forkserver`` workers (not children: torch has only its 5 s status check). Trials alternate
stock and healthkit, so machine load hits both alike.

Throughput: batches per second over one epoch of a cheap dataset (``num_workers=2``,
``batch_size=32``), stock and watched, alternating, several rounds.

    PYTHONPATH=.:integrations/torch .venv/bin/python benchmarks/bench_dataloader.py \
        [--runs 30] [--rounds 7] [--json benchmarks/results/dataloader.json]

Prints a Markdown table (docs/benchmarks.md, "DataLoader workers").
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import random
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import healthkit_torch
import torch
from torch.utils.data import DataLoader, Dataset

STEP_S = 0.02


class Items(Dataset[torch.Tensor]):
    def __init__(self, n: int, delay: float) -> None:
        self.n, self.delay = n, delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.delay:
            time.sleep(self.delay)
        return torch.full((16,), float(i))


def spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def one_trial(ctx: str, situation: str, watched: bool) -> tuple[float, str]:
    delay = 0.2 if situation == "waits" else 0.001
    loader = DataLoader(Items(100_000, delay), batch_size=4, num_workers=2,
                        multiprocessing_context=ctx)
    if watched:
        loader = healthkit_torch.watch(loader)
    it = iter(loader)
    next(it)
    victim = it._workers[1].pid
    t0 = 0.0
    try:
        if situation == "waits":
            t0 = time.monotonic()
            os.kill(victim, signal.SIGKILL)
            while True:
                next(it)
        else:
            kill_after = random.uniform(0, STEP_S)
            spin(kill_after)
            t0 = time.monotonic()
            os.kill(victim, signal.SIGKILL)
            spin(STEP_S - kill_after)
            while True:
                next(it)
                spin(STEP_S)
    except Exception as e:  # stock torch also lets EOFError/ConnectionResetError through
        took = time.monotonic() - t0
        kind = type(e).__name__
    finally:
        try:
            it._shutdown_workers()
        except RuntimeError:
            pass  # stock torch's SIGCHLD handler, raising again during the shutdown
        del it
    return took, kind


def throughput(watched: bool, batches: int = 300) -> float:
    loader = DataLoader(Items(batches * 32, 0.0), batch_size=32, num_workers=2,
                        multiprocessing_context="fork")
    if watched:
        loader = healthkit_torch.watch(loader)
    t0 = time.monotonic()
    n = sum(1 for _ in loader)
    return n / (time.monotonic() - t0)


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    k = (len(s) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def ms(v: float) -> str:
    return f"{v * 1000:.1f} ms" if v < 1 else f"{v:.2f} s"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    logging.getLogger("healthkit").setLevel(logging.ERROR)  # the error says it; no log line
    results: dict[str, Any] = {
        "torch": torch.__version__, "python": platform.python_version(),
        "cpus": os.cpu_count(), "loadavg_start": os.getloadavg(), "latency": {},
    }
    cells = [(c, s) for c in ("fork", "forkserver") for s in ("waits", "computes")]
    for ctx, situation in cells:
        runs: dict[str, list[float]] = {"stock": [], "healthkit": []}
        kinds: dict[str, set[str]] = {"stock": set(), "healthkit": set()}
        for _ in range(args.runs):
            for name in random.sample(["stock", "healthkit"], 2):
                took, kind = one_trial(ctx, situation, name == "healthkit")
                runs[name].append(took)
                kinds[name].add(kind)
        results["latency"][f"{ctx}/{situation}"] = {
            k: {"values_s": v, "errors": sorted(kinds[k])} for k, v in runs.items()
        }
        print(f"{ctx}/{situation}: " + ", ".join(
            f"{k} p50 {ms(pct(v, 0.5))} p99 {ms(pct(v, 0.99))}" for k, v in runs.items()),
            file=sys.stderr, flush=True)
    tput: dict[str, list[float]] = {"stock": [], "healthkit": []}
    throughput(False)  # warm-up
    for _ in range(args.rounds):
        for name in random.sample(["stock", "healthkit"], 2):
            tput[name].append(throughput(name == "healthkit"))
    results["throughput_batches_per_s"] = tput
    results["loadavg_end"] = os.getloadavg()

    print(f"torch {torch.__version__}, Python {platform.python_version()}, "
          f"{os.cpu_count()} CPUs, load average {results['loadavg_start'][0]:.1f} at start, "
          f"{results['loadavg_end'][0]:.1f} at end; {args.runs} trials per cell\n")
    print("| workers | main process | stock p50 | stock p99 | healthkit p50 | healthkit p99 "
          "| error raised (stock / healthkit) |")
    print("|---|---|---|---|---|---|---|")
    for ctx, situation in cells:
        cell = results["latency"][f"{ctx}/{situation}"]
        st, hk = cell["stock"]["values_s"], cell["healthkit"]["values_s"]
        print(f"| {ctx} | {situation} | {ms(pct(st, .5))} | {ms(pct(st, .99))} | "
              f"{ms(pct(hk, .5))} | {ms(pct(hk, .99))} | "
              f"{'/'.join(cell['stock']['errors'])} / {'/'.join(cell['healthkit']['errors'])} |")
    st, hk = tput["stock"], tput["healthkit"]
    diff = (statistics.median(hk) - statistics.median(st)) / statistics.median(st)
    print(f"\nThroughput (fork, 2 workers, batch 32, {args.rounds} rounds): stock median "
          f"{statistics.median(st):.0f} batches/s (range {min(st):.0f}-{max(st):.0f}), "
          f"healthkit {statistics.median(hk):.0f} (range {min(hk):.0f}-{max(hk):.0f}): "
          f"{diff:+.1%}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
