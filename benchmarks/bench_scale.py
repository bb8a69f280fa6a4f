"""3. Scale: detection latency and memory per watch at 1, 10, 100 and 1,000 watches.

For each N, N idle children (``sleep``) are watched by one thread-mode DisarmableWatchdog;
one random child is SIGKILLed and the latency until the action (``call(record)``) runs is
recorded, the watchdog disarmed and the dead child replaced. The watchdog is re-armed over
the same ``ProcessWatch`` objects each trial (arming N watches is part of the trial set-up,
outside the timed region). The action runs after the diagnosis; the diagnoser here has the
kernel-log scan switched off (``ExitDiagnoser(kmsg_path=None)``, the situation of a non-root
user), so that the figure is about N, not about the size of the kernel log; section 1 shows
latency with and without it.

Memory: RSS of this process and its open fds before and after creating N ``ProcessWatch``es
and arming a watchdog over them (children already running before the first reading); and
the Python heap per watch from ``tracemalloc`` in a separate pass (RSS moves in pages and
by allocator arenas, so at small N it is noise).
"""

from __future__ import annotations

import gc
import os
import random
import signal
import threading
import time
import tracemalloc
from dataclasses import replace
from pathlib import Path
from typing import Any

from _common import (
    Page,
    fmt_s,
    now_ns,
    open_fds,
    pct_cell,
    pyplot,
    raise_nofile,
    rss_bytes,
    save_figure,
    spawn_sleepers,
    stop_children,
    summarize,
)
from _protocol import Target, Verdict, judge_percentile, targets_from

import healthkit as hk

NAME = "scale"
IMG = "bench-scale.png"
FULL_COUNTS = [1, 10, 100, 1000]
FULL_TRIALS = 1000  # per N: enough for a p99
GIVE_UP_S = 5.0
TARGETS = [
    Target(
        "1000",
        "p99 < 10 ms at 1000 watches (thread mode, kernel-log scan off)",
        "p99",
        10e-3,
        "s",
        FULL_TRIALS,
    ),
]


def memory(n: int) -> dict[str, Any]:
    procs = spawn_sleepers(n)
    try:
        gc.collect()
        rss0, fds0 = rss_bytes(), open_fds()
        watches = [hk.ProcessWatch(p) for p in procs]
        wd = hk.DisarmableWatchdog(watches, actions=[lambda e: None], name=f"mem-{n}").arm()
        time.sleep(0.2)
        gc.collect()
        rss1, fds1 = rss_bytes(), open_fds()
        wd.disarm()
        for w in watches:
            w.close()
        del watches, wd
        gc.collect()
        # Python heap per watch (tracemalloc), separately: it slows allocation down.
        tracemalloc.start()
        snap0 = tracemalloc.take_snapshot()
        watches = [hk.ProcessWatch(p) for p in procs]
        ws = hk.WatchSet(watches)
        snap1 = tracemalloc.take_snapshot()
        heap = sum(s.size_diff for s in snap1.compare_to(snap0, "filename"))
        tracemalloc.stop()
        ws.close()
        for w in watches:
            w.close()
    finally:
        stop_children(procs)
    return {
        "n": n,
        "rss_delta_bytes": rss1 - rss0,
        "rss_per_watch_bytes": (rss1 - rss0) / n,
        "fds_delta": fds1 - fds0,
        "fds_per_watch": (fds1 - fds0) / n,
        "heap_per_watch_bytes": heap / n,
    }


def latency(n: int, trials: int) -> dict[str, Any]:
    procs = spawn_sleepers(n)
    watches = [hk.ProcessWatch(p) for p in procs]
    diagnoser = hk.ExitDiagnoser(kmsg_path=None)
    samples: list[float] = []
    detect: list[float] = []
    failures = 0
    arm_s: list[float] = []
    try:
        for _ in range(trials):
            got: list[tuple[int, float]] = []
            done = threading.Event()

            def record(
                event: hk.actions.FailureEvent, got: list[Any] = got, done: Any = done
            ) -> None:
                got.append((now_ns(), event.diagnosis.observed_at))
                done.set()

            t_arm = time.monotonic()
            wd = hk.DisarmableWatchdog(
                watches, actions=[record], name=f"scale-{n}", diagnoser=diagnoser
            ).arm()
            arm_s.append(time.monotonic() - t_arm)
            time.sleep(random.uniform(0.002, 0.01))
            i = random.randrange(n)
            t0 = now_ns()
            os.kill(procs[i].pid, signal.SIGKILL)
            done.wait(GIVE_UP_S)
            wd.disarm()
            if got:
                samples.append((got[0][0] - t0) / 1e9)
                detect.append(got[0][1] - t0 / 1e9)
            else:
                failures += 1
            procs[i].wait()
            watches[i].close()
            procs[i] = spawn_sleepers(1)[0]
            watches[i] = hk.ProcessWatch(procs[i])
    finally:
        for w in watches:
            w.close()
        stop_children(procs)
    return {
        **summarize(samples),
        "watches": n,
        "failures": failures,
        "arm": summarize(arm_s),
        "detect": summarize(detect),
        "samples": samples,
        "detect_samples": detect,
    }


def run(quick: bool) -> dict[str, Any]:
    nofile = raise_nofile()
    counts = [1, 10, 100] if quick else FULL_COUNTS
    trials = 10 if quick else FULL_TRIALS
    return {
        "nofile": nofile,
        "trials": trials,
        "give_up_s": GIVE_UP_S,
        "latency": [latency(n, trials) for n in counts],
        "memory": [memory(n) for n in counts],
    }


# ---------------------------------------------------------------------- verdicts
def verdicts(scale: dict[str, Any], entry: dict[str, Any], quick: bool) -> list[Verdict]:
    out = []
    for t in targets_from(entry, TARGETS):
        row = next((r for r in scale["latency"] if str(r["watches"]) == t.key), None)
        if row is None:
            if not quick:
                out.append(Verdict(t.what, t.statistic, "n/a", "", "0", "not measured"))
                continue
            row = max(scale["latency"], key=lambda r: r["watches"])  # a quick run's largest
        gave_up = [scale.get("give_up_s", GIVE_UP_S)] * row["failures"]
        v = judge_percentile(t, row["samples"], quick, fmt_s, gave_up)
        if str(row["watches"]) != t.key:
            v = replace(v, what=f"{v.what} (measured at {row['watches']} watches)")
        out.append(v)
    return out


# ---------------------------------------------------------------------- plot
def plot(scale: dict[str, Any], path: Path) -> None:
    import numpy as np
    from _protocol import shown

    plt = pyplot()
    lat = scale["latency"]
    mem = scale["memory"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    ns = [r["watches"] for r in lat]
    for q, m in ((0.5, "o"), (0.9, "s"), (0.99, "^")):
        pts = [
            (r["watches"], float(np.percentile(r["samples"], q * 100)) * 1e3)
            for r in lat
            if r["samples"] and shown(len(r["samples"]), q)
        ]
        if pts:
            a1.plot(*zip(*pts, strict=True), marker=m, label=f"p{q * 100:g}")
    a1.plot(
        ns, [r["max"] * 1e3 if r.get("n") else float("nan") for r in lat], marker="x", label="max"
    )
    for t in TARGETS:
        a1.axhline(
            t.limit * 1e3,
            color="red",
            ls=":",
            lw=1,
            label=f"target: {t.statistic} < {fmt_s(t.limit)} at {t.key} watches",
        )
    a1.set_xscale("log")
    a1.set_yscale("log")
    a1.set_xlabel("watched processes")
    a1.set_ylabel("SIGKILL → action (ms)")
    a1.set_title("3. Detection latency vs number of watches")
    a1.legend(fontsize=7)
    a1.grid(alpha=0.3, which="both")
    mn = [r["n"] for r in mem]
    a2.plot(
        mn,
        [r["rss_per_watch_bytes"] / 1024 for r in mem],
        marker="o",
        label="RSS delta / watches (KiB)",
    )
    a2.plot(
        mn,
        [r["heap_per_watch_bytes"] / 1024 for r in mem],
        marker="s",
        label="Python heap / watch (KiB, tracemalloc)",
    )
    a2.set_xscale("log")
    a2.set_yscale("log")
    a2.set_xlabel("watched processes")
    a2.set_ylabel("KiB per watch")
    a2.set_title("3. Memory per watch")
    a2.legend(fontsize=8)
    a2.grid(alpha=0.3, which="both")
    save_figure(fig, path)


# ---------------------------------------------------------------------- markdown
def markdown(scale: dict[str, Any], page: Page) -> list[str]:
    L = ["## 3. Scale", ""]
    L.append(
        f"One thread-mode watchdog over N idle children; {scale['trials']} trials per N, "
        "each kills one random child. The diagnoser's kernel-log scan is off here "
        "(`ExitDiagnoser(kmsg_path=None)`). RLIMIT_NOFILE soft/hard: "
        f"{scale['nofile'][0]}/{scale['nofile'][1]}. A percentile is printed only with "
        "at least 10 trials beyond it."
    )
    L.append("")
    L.append(
        "| watches | trials | given up | p50 | p90 | p99 | max | detection p50 / p99 | arm() p50 |"
    )
    L.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in scale["latency"]:
        s = r["samples"]
        det = r.get("detect_samples", [])
        d = f"{pct_cell(det, 0.5)} / {pct_cell(det, 0.99)}" if det else "n/a"
        L.append(
            f"| {r['watches']} | {len(s) + r['failures']} | {r['failures']} | "
            f"{pct_cell(s, 0.5)} | {pct_cell(s, 0.9)} | {pct_cell(s, 0.99)} | "
            f"{fmt_s(max(s)) if s else 'n/a'} | {d} | "
            f"{fmt_s(r['arm'].get('p50'))} |"
        )
    L.append("")
    page_kib = os.sysconf("SC_PAGE_SIZE") / 1024
    L.append(
        f"Memory: RSS is counted in whole pages ({page_kib:g} KiB here), so its "
        "per-watch figure is coarse at small N; the Python heap per watch is "
        "`tracemalloc`'s."
    )
    L.append("")
    L.append(
        "| watches | RSS delta | RSS / watch | Python heap / watch (tracemalloc) | fds "
        "delta | fds beyond one per watch |"
    )
    L.append("|---:|---:|---:|---:|---:|---:|")
    for r in scale["memory"]:
        L.append(
            f"| {r['n']} | {r['rss_delta_bytes'] / 1024:.0f} KiB | "
            f"{r['rss_per_watch_bytes']:.0f} B | {r['heap_per_watch_bytes']:.0f} B | "
            f"{r['fds_delta']} | {r['fds_delta'] - r['n']} |"
        )
    if page.img:
        L += ["", f"![scale]({page.img})"]
    L.append("")
    return L
