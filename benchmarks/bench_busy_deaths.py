"""Death-to-action latency in an owner whose main thread is CPU-busy, by how the helper dies.

Thread mode (``DisarmableWatchdog(mode="thread")``, ``actions=[record]``), no stop under way:
the same helpers and stamps as ``bench_latency.py``'s "death by ..." rows (the helper's last act
before its death -> the action), but the main thread spins a pure-Python loop meanwhile, so
every GIL hand-over the watcher needs waits for the interpreter's switch interval. Kinds are
interleaved trial by trial (shuffled each round) so machine load hits all of them alike.

``python benchmarks/bench_busy_deaths.py [TRIALS_PER_KIND] [OUT.json]``: prints p50/p99 (ms) per
kind and each kind's p99 over the same run's SIGKILL p99.

``python benchmarks/bench_busy_deaths.py --reads [N]``: one ``/proc/<pid>/stat`` read from a
second thread while the main thread spins, through Python's ``open()`` and through
``healthkit._proc.read_small`` (libc, the GIL kept), interleaved, N of each.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_latency import FORK, THREAD_GIVE_UP_S, _finish_helper, die_on_cue, now_ns

import healthkit as hk

KINDS = ("sigkill", "exception", "exit3", "exit0", "sigterm")


def trial(kind: str) -> float | None:
    stamp = FORK.Value("q", 0, lock=False)
    helper = FORK.Process(target=die_on_cue, args=(kind, stamp), name="helper", daemon=True)
    helper.start()
    got: list[int] = []

    def record(event: hk.actions.FailureEvent) -> None:
        got.append(now_ns())

    wd = hk.DisarmableWatchdog([helper], actions=[record], name="bench").arm()
    ready_by = time.monotonic() + THREAD_GIVE_UP_S
    while stamp.value != -1 and time.monotonic() < ready_by:
        time.sleep(0.001)
    time.sleep(random.uniform(0.002, 0.01))
    if kind in ("sigkill", "sigterm"):
        stamp.value = now_ns()
        os.kill(helper.pid, signal.SIGKILL if kind == "sigkill" else signal.SIGTERM)
    else:
        os.kill(helper.pid, signal.SIGUSR1)
    x = 0
    give_up = time.monotonic() + THREAD_GIVE_UP_S
    while not got and time.monotonic() < give_up:  # the main thread CPU-busy
        for _ in range(1000):
            x += 1
    wd.disarm()
    _finish_helper(helper)
    if not got or stamp.value <= 0:
        return None
    return (got[0] - stamp.value) / 1e9


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def reads(n: int) -> int:
    from healthkit._proc import read_small

    me = os.getpid()

    def with_open() -> bytes:
        with open(f"/proc/{me}/stat", "rb") as f:
            return f.read()

    ways = {"open()": with_open, "read_small": lambda: read_small(f"/proc/{me}/stat")}
    res: dict[str, list[float]] = {k: [] for k in ways}
    stop = threading.Event()

    def watcher() -> None:
        for _ in range(n):
            for name, fn in ways.items():
                t = time.perf_counter()
                fn()
                res[name].append(time.perf_counter() - t)
            time.sleep(0.001)
        stop.set()

    t = threading.Thread(target=watcher)
    t.start()
    x = 0
    while not stop.is_set():  # the main thread CPU-busy
        x += 1
    t.join()
    for name, xs in res.items():
        print(f"{name:12s} n={len(xs)} p50={pct(xs, 0.5) * 1e3:.3f} ms "
              f"p99={pct(xs, 0.99) * 1e3:.3f} ms", flush=True)  # fmt: skip
    return 0


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--reads":
        return reads(int(argv[1]) if len(argv) > 1 else 400)
    n = int(argv[0]) if argv else 100
    out = argv[1] if len(argv) > 1 else None
    samples: dict[str, list[float]] = {k: [] for k in KINDS}
    lost: dict[str, int] = dict.fromkeys(KINDS, 0)
    assert threading.current_thread() is threading.main_thread()
    for _ in range(n):
        order = list(KINDS)
        random.shuffle(order)
        for kind in order:
            lat = trial(kind)
            if lat is None:
                lost[kind] += 1
            else:
                samples[kind].append(lat)
    kill_p99 = pct(samples["sigkill"], 0.99)
    result = {}
    for kind in KINDS:
        xs = samples[kind]
        row = {
            "trials": len(xs),
            "lost": lost[kind],
            "p50_ms": round(pct(xs, 0.5) * 1e3, 1),
            "p99_ms": round(pct(xs, 0.99) * 1e3, 1),
            "x_sigkill_p99": round(pct(xs, 0.99) / kill_p99, 2),
        }
        result[kind] = row
        print(f"{kind:10s} n={row['trials']:4d} lost={row['lost']} p50={row['p50_ms']:7.1f} ms "
              f"p99={row['p99_ms']:7.1f} ms x={row['x_sigkill_p99']:.2f}", flush=True)  # fmt: skip
    if out:
        Path(out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
