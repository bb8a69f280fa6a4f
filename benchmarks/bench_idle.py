"""2. Idle cost while every helper is healthy, and the watcher's effect on a CPU-bound main
thread.

Idle cost: for N idle children (``sleep``), in one process and over the same window, side
by side:

- healthkit thread mode: the watcher thread's CPU time (``pthread_getcpuclockid``, ns
  resolution) and its wake-ups (``voluntary_ctxt_switches`` of its task in
  ``/proc/self/task/<tid>/status``);
- healthkit sidecar mode: the sidecar process's CPU (``/proc/<pid>/stat`` utime+stime, clock
  ticks) and ``voluntary_ctxt_switches``;
- polling baselines, each a thread of this process: every 0.1 s (torchelastic's agent) and
  every 10 s (tzrec's watchdog) call ``poll()`` (``waitpid(WNOHANG)``, what ``is_alive()``
  does) on each of the N children.

GIL contention: a fixed pure-Python loop timed on the main thread (wall clock) with nothing
else running, with a healthkit thread-mode watchdog armed over 100 children, and with a
0.1 s poll of the same 100 children; conditions run in a shuffled order in each round, and
a second "nothing" run per round gives the noise floor (A/A). Reported: the median over
rounds of the per-round ratio to the round's "nothing" run, with a bootstrap 95% interval,
and the ratio of the fastest runs (the least disturbed by other load on the machine).
"""

from __future__ import annotations

import os
import random
import threading
import time
from typing import Any

from _common import spawn_sleepers, stop_children, thread_cpu_s, thread_ctxt_switches

import healthkit as hk

TICK = os.sysconf("SC_CLK_TCK")


def _proc_cpu_and_wakeups(pid: int) -> tuple[float, int, int]:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    cpu = (int(fields[11]) + int(fields[12])) / TICK  # utime, stime (fields 14, 15)
    vol = nonvol = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches:"):
                vol = int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches:"):
                nonvol = int(line.split()[1])
    return cpu, vol, nonvol


class Poller:
    """A baseline watcher thread: every ``interval`` s, poll() each child."""

    def __init__(self, procs: list[Any], interval: float) -> None:
        self.procs = procs
        self.interval = interval
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name=f"poll {interval}")
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(self.interval):
            for p in self.procs:
                if p.poll() is not None:
                    pass  # a real watchdog would act here

    def close(self) -> None:
        self.stop.set()
        self.thread.join()


def _thread_of(name: str) -> threading.Thread:
    for t in threading.enumerate():
        if t.name == name:
            return t
    raise RuntimeError(f"no thread named {name!r}")


def _snapshot(threads: dict[str, threading.Thread], sidecar_pid: int | None) -> dict[str, Any]:
    snap: dict[str, Any] = {}
    for key, t in threads.items():
        assert t.ident is not None and t.native_id is not None
        vol, nonvol = thread_ctxt_switches(t.native_id)
        snap[key] = (thread_cpu_s(t.ident), vol, nonvol)
    if sidecar_pid is not None:
        snap["healthkit sidecar (process)"] = _proc_cpu_and_wakeups(sidecar_pid)
    return snap


def idle_cost(n: int, window: float) -> dict[str, Any]:
    procs = spawn_sleepers(n)
    ignore = [lambda event: None]
    wd = hk.DisarmableWatchdog(procs, actions=ignore, name=f"idle-{n}").arm()
    side = hk.DisarmableWatchdog(procs, mode="sidecar", name=f"idle-sidecar-{n}").arm()
    sidecar_pid = side._sidecar.pid if side._sidecar is not None else None
    pollers = {0.1: Poller(procs, 0.1), 10.0: Poller(procs, 10.0)}
    try:
        threads = {
            "healthkit thread": _thread_of(f"idle-{n} (thread)"),
            "poll every 0.1 s": pollers[0.1].thread,
            "poll every 10 s": pollers[10.0].thread,
        }
        time.sleep(1.0)  # settle after start-up
        before = _snapshot(threads, sidecar_pid)
        t0 = time.monotonic()
        time.sleep(window)
        after = _snapshot(threads, sidecar_pid)
        elapsed = time.monotonic() - t0
    finally:
        for p in pollers.values():
            p.close()
        wd.disarm()
        side.disarm()
        stop_children(procs)
    out: dict[str, Any] = {"n": n, "window_s": elapsed}
    for key in before:
        cpu = after[key][0] - before[key][0]
        vol = after[key][1] - before[key][1]
        nonvol = after[key][2] - before[key][2]
        out[key] = {
            "cpu_s": cpu,
            "cpu_percent": 100 * cpu / elapsed,
            "wakeups": vol,
            "wakeups_per_s": vol / elapsed,
            "involuntary": nonvol,
        }
    return out


# ---------------------------------------------------------------------- GIL contention
def _work(iterations: int) -> float:
    t0 = time.perf_counter()
    x = 0
    for i in range(iterations):
        x += i ^ (i >> 3)
    return time.perf_counter() - t0


def _bootstrap_median_ci(values: list[float], reps: int = 2000) -> tuple[float, float]:
    import numpy as np

    rng = np.random.default_rng(7)
    a = np.asarray(values)
    meds = np.median(rng.choice(a, size=(reps, a.size), replace=True), axis=1)
    return float(np.percentile(meds, 2.5)), float(np.percentile(meds, 97.5))


def gil_slowdown(rounds: int, n_children: int = 100) -> dict[str, Any]:
    import numpy as np

    procs = spawn_sleepers(n_children)
    # calibrate to about 0.1 s of work on this machine
    iterations = 100_000
    while _work(iterations) < 0.1:
        iterations *= 2
    conditions = ["nothing", "nothing (A/A)", "healthkit thread armed", "poll every 0.1 s"]
    times: dict[str, list[float]] = {c: [] for c in conditions}
    ignore = [lambda event: None]
    watcher_wakeups = 0
    watcher_cpu = 0.0
    try:
        for _ in range(rounds):
            order = conditions[:]
            random.shuffle(order)
            for c in order:
                wd = poller = None
                if c == "healthkit thread armed":
                    wd = hk.DisarmableWatchdog(procs, actions=ignore, name="gil").arm()
                elif c == "poll every 0.1 s":
                    poller = Poller(procs, 0.1)
                time.sleep(0.02)
                watcher = _thread_of("gil (thread)") if wd is not None else None
                if watcher is not None:
                    assert watcher.ident is not None and watcher.native_id is not None
                    cpu0, (vol0, _) = (thread_cpu_s(watcher.ident),
                                       thread_ctxt_switches(watcher.native_id))
                times[c].append(_work(iterations))
                if watcher is not None:
                    watcher_cpu += thread_cpu_s(watcher.ident) - cpu0
                    watcher_wakeups += thread_ctxt_switches(watcher.native_id)[0] - vol0
                if wd is not None:
                    wd.disarm()
                if poller is not None:
                    poller.close()
    finally:
        stop_children(procs)
    base = np.asarray(times["nothing"])
    out: dict[str, Any] = {
        "iterations": iterations,
        "rounds": rounds,
        "children": n_children,
        "watcher_wakeups_during_timed_runs": watcher_wakeups,
        "watcher_cpu_s_during_timed_runs": watcher_cpu,
    }
    for c in conditions[1:]:
        ratios = list(np.asarray(times[c]) / base - 1.0)
        lo, hi = _bootstrap_median_ci(ratios) if len(ratios) > 1 else (ratios[0], ratios[0])
        out[c] = {
            "median_s": float(np.median(times[c])),
            "min_s": float(np.min(times[c])),
            "slowdown_percent": 100 * float(np.median(ratios)),
            "ci95_percent": (100 * lo, 100 * hi),
            # the fastest run of each condition: the one least disturbed by other load
            "min_slowdown_percent": 100 * (float(np.min(times[c])) / float(base.min()) - 1),
        }
    out["nothing"] = {"median_s": float(np.median(base)), "min_s": float(base.min())}
    out["times"] = times
    return out


def run(quick: bool) -> dict[str, Any]:
    counts = [1, 10, 100] if quick else [1, 10, 100, 1000]
    window = 3.0 if quick else 60.0
    idle = [idle_cost(n, window) for n in counts]
    gil = gil_slowdown(3 if quick else 150)
    return {"idle": idle, "gil": gil, "window_s": window}
