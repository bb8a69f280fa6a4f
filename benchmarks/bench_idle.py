"""2. Idle cost while every helper is healthy, and the watcher's effect on a CPU-bound main
thread.

Idle cost: for N idle children (``sleep``), in one process and over the same window, side
by side:

- healthkit thread mode: the watcher thread's CPU time (``pthread_getcpuclockid``, ns
  resolution) and its wake-ups (``voluntary_ctxt_switches`` of its task in
  ``/proc/self/task/<tid>/status``);
- healthkit sidecar mode: the sidecar process's CPU (``/proc/<pid>/stat`` utime+stime, clock
  ticks) and ``voluntary_ctxt_switches``;
- polling baselines, each a thread of this process: every 0.1 s and every 10 s (the periods
  of torchelastic's agent and of tzrec's server watchdog) call ``poll()``
  (``waitpid(WNOHANG)``, what ``is_alive()`` does) on each of the N children.

GIL contention: a fixed pure-Python loop timed on the main thread (wall clock) with nothing
else running, with a healthkit thread-mode watchdog armed over 100 children, and with a
0.1 s poll of the same 100 children; conditions run in a shuffled order in each round, and
a second "nothing" run per round gives the noise floor (A/A). Reported: the median over
rounds of the per-round ratio to the round's "nothing" run, with the protocol's bootstrap
CI (``_protocol``), and the ratio of the fastest runs.
"""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path
from typing import Any

from _common import (
    Page,
    pyplot,
    save_figure,
    spawn_sleepers,
    stop_children,
    thread_cpu_s,
    thread_ctxt_switches,
)
from _protocol import (
    CONFIDENCE,
    Target,
    Verdict,
    bootstrap_ci,
    judge_interval,
    judge_zero,
    targets_from,
)

import healthkit as hk

NAME = "idle"
IMG = "bench-idle.png"
TICK = os.sysconf("SC_CLK_TCK")
FULL_COUNTS = [1, 10, 100, 1000]
WINDOW_S = 60.0
GIL_ROUNDS = 150
CONDITIONS = ["nothing", "nothing (A/A)", "healthkit thread armed", "poll every 0.1 s"]
KEYS = ["healthkit thread", "healthkit sidecar (process)", "poll every 0.1 s", "poll every 10 s"]
_POINTS = f"{WINDOW_S:g} s at N = {', '.join(map(str, FULL_COUNTS))}"
TARGETS = [
    Target(
        "healthkit thread",
        f"healthkit thread: no wake-ups while healthy ({_POINTS})",
        "zero",
        0,
        "count",
        len(FULL_COUNTS),
    ),
    Target(
        "healthkit sidecar (process)",
        f"healthkit sidecar: no wake-ups while healthy ({_POINTS})",
        "zero",
        0,
        "count",
        len(FULL_COUNTS),
    ),
    Target(
        "healthkit thread armed",
        "CPU-bound main thread slowdown < 0.5 % (thread mode, 100 watches)",
        "median",
        0.5,
        "%",
        GIL_ROUNDS,
    ),
]


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
    sidecar_pid = side.sidecar_pid
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


def gil_slowdown(rounds: int, n_children: int = 100) -> dict[str, Any]:
    procs = spawn_sleepers(n_children)
    # calibrate to about 0.1 s of work on this machine
    iterations = 100_000
    while _work(iterations) < 0.1:
        iterations *= 2
    times: dict[str, list[float]] = {c: [] for c in CONDITIONS}
    ignore = [lambda event: None]
    watcher_wakeups = 0
    watcher_cpu = 0.0
    try:
        for _ in range(rounds):
            order = CONDITIONS[:]
            random.shuffle(order)
            for c in order:
                wd = poller = None
                if c == "healthkit thread armed":
                    wd = hk.DisarmableWatchdog(procs, actions=ignore, name="gil").arm()
                elif c == "poll every 0.1 s":
                    poller = Poller(procs, 0.1)
                time.sleep(0.02)
                watcher = _thread_of("gil (thread)") if wd is not None else None
                ident = watcher.ident if watcher is not None else None
                native = watcher.native_id if watcher is not None else None
                if ident is not None and native is not None:
                    cpu0, (vol0, _) = thread_cpu_s(ident), thread_ctxt_switches(native)
                times[c].append(_work(iterations))
                if ident is not None and native is not None:
                    watcher_cpu += thread_cpu_s(ident) - cpu0
                    watcher_wakeups += thread_ctxt_switches(native)[0] - vol0
                if wd is not None:
                    wd.disarm()
                if poller is not None:
                    poller.close()
    finally:
        stop_children(procs)
    return {
        "iterations": iterations,
        "rounds": rounds,
        "children": n_children,
        "watcher_wakeups_during_timed_runs": watcher_wakeups,
        "watcher_cpu_s_during_timed_runs": watcher_cpu,
        "times": times,
    }


def gil_stats(gil: dict[str, Any]) -> dict[str, Any]:
    """Per condition, from the raw loop times: the median over rounds of (time / the same
    round's "nothing" time - 1) with its bootstrap CI, and the fastest runs' ratio."""
    import numpy as np

    times = gil["times"]
    base = np.asarray(times["nothing"])
    out: dict[str, Any] = {
        "nothing": {"median_s": float(np.median(base)), "min_s": float(base.min())}
    }
    for c in CONDITIONS[1:]:
        ratios = np.asarray(times[c]) / base - 1.0
        lo, hi = bootstrap_ci(list(ratios), lambda m: np.median(m, axis=1))
        out[c] = {
            "median_s": float(np.median(times[c])),
            "min_s": float(np.min(times[c])),
            "slowdown_percent": 100 * float(np.median(ratios)),
            "ci_percent": (100 * lo, 100 * hi),
            # the fastest run of each condition: the one least disturbed by other load
            "min_slowdown_percent": 100 * (float(np.min(times[c])) / float(base.min()) - 1),
        }
    return out


def run(quick: bool) -> dict[str, Any]:
    counts = [1, 10, 100] if quick else FULL_COUNTS
    window = 3.0 if quick else WINDOW_S
    idle = [idle_cost(n, window) for n in counts]
    gil = gil_slowdown(3 if quick else GIL_ROUNDS)
    return {"idle": idle, "gil": gil, "window_s": window}


# ---------------------------------------------------------------------- verdicts
def _pct(v: float) -> str:
    return f"{v:+.2f} %"


def verdicts(idle: dict[str, Any], entry: dict[str, Any], quick: bool) -> list[Verdict]:
    out = []
    ns = ", ".join(str(r["n"]) for r in idle["idle"])
    for t in targets_from(entry, TARGETS):
        if t.statistic == "zero":
            counts = [r[t.key]["wakeups"] for r in idle["idle"]]
            out.append(judge_zero(t, counts, f"{len(counts)} windows (N = {ns})", quick))
        else:
            g = gil_stats(idle["gil"])[t.key]
            lo, hi = g["ci_percent"]
            out.append(
                judge_interval(t, g["slowdown_percent"], lo, hi, idle["gil"]["rounds"], quick, _pct)
            )
    return out


# ---------------------------------------------------------------------- plot
def plot(idle: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    runs = idle["idle"]
    ns = [r["n"] for r in runs]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    for k, m in zip(KEYS, ["o", "s", "^", "v"], strict=True):
        a1.plot(ns, [r[k]["cpu_s"] for r in runs], marker=m, label=k)
        a2.plot(ns, [r[k]["wakeups"] for r in runs], marker=m, label=k)
    w = idle["window_s"]
    for ax, what in ((a1, f"CPU seconds in {w:g} s"), (a2, f"wake-ups in {w:g} s")):
        ax.set_xscale("log")
        ax.set_yscale("symlog", linthresh=1e-3 if ax is a1 else 1)
        ax.set_ylim(bottom=0)
        zero = [k for k in KEYS if all(r[k]["wakeups"] == 0 for r in runs)]
        if zero:
            ax.text(
                0.02,
                0.04,
                " and ".join(zero) + ": 0 wake-ups at every N",
                transform=ax.transAxes,
                fontsize=8,
                color="tab:blue",
            )
        ax.set_xlabel("watched processes")
        ax.set_ylabel(what)
        ax.grid(alpha=0.3, which="both")
    a1.set_title("2. Idle cost: CPU of the watcher")
    a2.set_title("2. Idle cost: wake-ups (voluntary context switches)")
    a2.legend(fontsize=8)
    save_figure(fig, path)


# ---------------------------------------------------------------------- markdown
def markdown(idle: dict[str, Any], page: Page) -> list[str]:
    w = idle["window_s"]
    L = ["## 2. Idle cost while healthy", ""]
    L.append(
        f"N idle children (`sleep`), watched for {w:g} s by all of these at once, in one "
        "process: the healthkit thread-mode watcher, a healthkit sidecar, and two "
        "polling threads that call `poll()` (`waitpid(WNOHANG)`, what `is_alive()` "
        "does) on every child every 0.1 s and every 10 s. CPU: per thread "
        "(`pthread_getcpuclockid`; the sidecar: `/proc/<pid>/stat`, in clock ticks). "
        "Wake-ups: `voluntary_ctxt_switches` of the thread (sidecar: of the "
        "process)."
    )
    L.append("")
    L.append("| N | " + " | ".join(f"{k}: CPU s / wake-ups" for k in KEYS) + " |")
    L.append("|---:|" + "---:|" * len(KEYS))
    for r in idle["idle"]:
        cells = [f"{r[k]['cpu_s']:.4f} / {r[k]['wakeups']}" for k in KEYS]
        L.append(f"| {r['n']} | " + " | ".join(cells) + " |")
    L.append("")
    g = idle["gil"]
    st = gil_stats(g)
    L.append(
        f"**GIL contention.** A fixed pure-Python loop ({g['iterations']:,} iterations, "
        f"median {st['nothing']['median_s']:.3f} s) on the main thread, {g['rounds']} "
        "rounds; in each round every condition runs once, in shuffled order, with "
        f"{g['children']} idle children. Slowdown = median over rounds of (time / the "
        "round's 'nothing' time - 1), with its bootstrap CI (the protocol's). The A/A "
        "row (nothing vs nothing) measures what the same statistic gives when nothing "
        "differs."
    )
    L.append("")
    L.append(
        f"| condition | median loop time | slowdown (median) | {CONFIDENCE:.0%} CI | "
        "fastest run | "
        "slowdown (fastest runs) |"
    )
    L.append("|---|---:|---:|---:|---:|---:|")
    L.append(
        f"| nothing | {st['nothing']['median_s']:.4f} s | | | {st['nothing']['min_s']:.4f} s | |"
    )
    for c in CONDITIONS[1:]:
        lo, hi = st[c]["ci_percent"]
        L.append(
            f"| {c} | {st[c]['median_s']:.4f} s | {_pct(st[c]['slowdown_percent'])} | "
            f"{_pct(lo)} to {_pct(hi)} | {st[c]['min_s']:.4f} s | "
            f"{_pct(st[c]['min_slowdown_percent'])} |"
        )
    L.append("")
    aa_lo, aa_hi = st["nothing (A/A)"]["ci_percent"]
    L.append(
        f"The A/A interval in this run spans {aa_hi - aa_lo:.2f} percentage points. "
        "During the timed runs with the watchdog armed, its watcher thread made "
        f"{g.get('watcher_wakeups_during_timed_runs')} voluntary context switches and "
        f"used {g.get('watcher_cpu_s_during_timed_runs', 0) * 1e6:.0f} µs of CPU in "
        "total."
    )
    if page.img:
        L += ["", f"![idle cost]({page.img})"]
    L.append("")
    return L
