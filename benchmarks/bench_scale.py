"""3. Scale: detection latency and memory per watch at 1, 10, 100 and 1,000 watches.

For each N, N idle children (``sleep``) are watched by one thread-mode DisarmableWatchdog;
one random child is SIGKILLed and the latency until the action (``call(record)``) runs is
recorded, the watchdog disarmed and the dead child replaced. The watchdog is re-armed over
the same ``ProcessWatch`` objects each trial (arming N watches is part of the trial set-up,
outside the timed region). The action runs after the brief diagnosis (no file read; the
action reads ``event.brief``, so the evidence is read after it); the diagnoser here has the
kernel-log scan switched off (``ExitDiagnoser(kmsg_path=None)``, the situation of a non-root
user), so that the figure is about N, not about the size of the kernel log; section 1 shows
latency with and without it.

Where the time goes, per trial, all on CLOCK_MONOTONIC from just before ``os.kill``: kill →
the watcher thread's epoll ``select()`` returned (stamped by a subclass of the
``EpollSelector`` put in ``selectors.DefaultSelector`` while measuring, which the
``WatchSet`` builds), → exit status collected (``ExitStatus.observed_at``, stamped right
after its ``waitid``), → action called; and whether a Python garbage collection (of which
generation, for how long; ``gc.callbacks``) started between kill and action. The floor at the same
N, in the same run, interleaved trial by trial with healthkit's (each round runs one of
each, in random order, over the same children): a bare thread blocked in
``selectors.EpollSelector().select()`` over the N children's pidfds, which on wake-up stamps
the time, reads the exit status with ``os.waitid(P_PIDFD, fd, WEXITED | WNOWAIT)`` (the
call ``ProcessWatch`` makes) and stamps again: the kernel's exit and wake-up at that N.

Memory: RSS of this process and its open fds before and after creating N ``ProcessWatch``es
and arming a watchdog over them (children already running before the first reading); and
the Python heap per watch from ``tracemalloc`` in a separate pass (RSS moves in pages and
by allocator arenas, so at small N it is noise).
"""

from __future__ import annotations

import gc
import os
import random
import selectors
import signal
import threading
import time
import tracemalloc
from collections.abc import Callable
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
from _protocol import Target, Verdict, judge_percentile, judge_ratio, targets_from

import healthkit as hk

NAME = "scale"
IMG = "bench-scale.png"
FULL_COUNTS = [1, 10, 100, 1000]
FULL_TRIALS = 1000  # per N: enough for a p99
GIVE_UP_S = 5.0
FLOOR_KEY = "bare epoll thread at the same N, kill → waitid done (floor)"
TARGETS = [
    Target(
        "1000",
        "p99 < 10 ms at 1000 watches (thread mode, kernel-log scan off)",
        "p99",
        10e-3,
        "s",
        FULL_TRIALS,
    ),
    # What is ours: the tail judged against the kernel's own exit and wake-up at that N,
    # measured alongside (the 2x of section 1's act-first target).
    Target(
        "1000",
        "p99 at 1000 watches < 2x the same N's bare-epoll floor's p99 (same run)",
        "p99",
        2.0,
        "x",
        FULL_TRIALS,
        relative_to=FLOOR_KEY,
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


class _GcTally:
    """Python's garbage collections, counted by generation as they start (``gc.callbacks``),
    and the time spent in them. One process, one GIL: a collection in any thread counts."""

    def __init__(self) -> None:
        self.started = [0, 0, 0]
        self.busy_ns = 0
        self._t = 0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self.started[info["generation"]] += 1
            self._t = now_ns()
        else:
            self.busy_ns += now_ns() - self._t

    def snapshot(self) -> tuple[tuple[int, ...], int]:
        return tuple(self.started), self.busy_ns


def _gc_between(
    before: tuple[tuple[int, ...], int], after: tuple[tuple[int, ...], int]
) -> tuple[int, float]:
    """(highest generation collected in between, -1 for none; seconds spent collecting)."""
    gens = [g for g in range(3) if after[0][g] > before[0][g]]
    return (max(gens) if gens else -1), (after[1] - before[1]) / 1e9


class _StampingEpoll(selectors.EpollSelector):
    """The selector of healthkit's ``WatchSet`` (``selectors.DefaultSelector``: epoll on
    Linux) plus the time its ``select()`` last returned: the watcher thread's wake-up, the
    GIL taken back, before any of healthkit's code runs. Installed only while measuring."""

    woke_ns = 0

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(timeout)
        _StampingEpoll.woke_ns = now_ns()
        return ready


def _healthkit_trial(
    n: int,
    procs: list[Any],
    watches: list[hk.ProcessWatch],
    diagnoser: hk.ExitDiagnoser,
    tally: _GcTally,
) -> tuple[int, dict[str, float] | None, float]:
    """Arm over the N watches, kill one random child, time until the action runs.

    Returns (victim, the trial's phases in seconds (keys of ``latency()``'s lists) or None
    if given up, arm() seconds)."""
    got: list[tuple[int, int, float, tuple[tuple[int, ...], int]]] = []
    done = threading.Event()

    def record(event: hk.actions.FailureEvent) -> None:
        t = now_ns()  # first: the action's start is the measured end
        got.append((t, _StampingEpoll.woke_ns, event.brief.observed_at, tally.snapshot()))
        done.set()

    t_arm = time.monotonic()
    wd = hk.DisarmableWatchdog(
        watches, actions=[record], name=f"scale-{n}", diagnoser=diagnoser
    ).arm()
    arm_s = time.monotonic() - t_arm
    time.sleep(random.uniform(0.002, 0.01))
    i = random.randrange(n)
    gc0 = tally.snapshot()
    t0 = now_ns()
    os.kill(procs[i].pid, signal.SIGKILL)
    done.wait(GIVE_UP_S)
    wd.disarm()
    if not got:
        return i, None, arm_s
    t_act, woke, collected, gc1 = got[0]
    gen, gc_s = _gc_between(gc0, gc1)
    return (
        i,
        {
            "samples": (t_act - t0) / 1e9,
            "wake_samples": (woke - t0) / 1e9,
            "collect_samples": collected - woke / 1e9,
            "detect_samples": collected - t0 / 1e9,
            "dispatch_samples": t_act / 1e9 - collected,
            "gc_gen_samples": gen,
            "gc_s_samples": gc_s,
        },
        arm_s,
    )


def _floor_trial(
    n: int, procs: list[Any], pidfds: list[int]
) -> tuple[int, dict[str, float] | None]:
    """The kernel's floor at N: a bare thread blocked in an epoll selector over the same N
    children's pidfds (built per trial, as arm() builds its WatchSet), which on wake-up
    stamps the time, reads the exit status (``waitid``) and stamps again.

    Returns (victim, the trial's phases in seconds or None if given up)."""
    sel = selectors.EpollSelector()
    for fd in pidfds:
        sel.register(fd, selectors.EVENT_READ)
    got: list[tuple[int, int]] = []

    def waiter() -> None:
        events = sel.select(GIVE_UP_S)
        t_wake = now_ns()
        if not events:
            return
        for key, _ in events:
            # WNOWAIT, as healthkit's ProcessWatch: the zombie stays for its Popen.
            os.waitid(os.P_PIDFD, key.fd, os.WEXITED | os.WNOWAIT)
        got.append((t_wake, now_ns()))

    th = threading.Thread(target=waiter, name=f"scale-floor-{n}", daemon=True)
    th.start()
    time.sleep(random.uniform(0.002, 0.01))
    i = random.randrange(n)
    t0 = now_ns()
    os.kill(procs[i].pid, signal.SIGKILL)
    th.join(GIVE_UP_S + 1.0)
    sel.close()
    if not got:
        return i, None
    woke, done = got[0]
    return i, {"floor_wake_samples": (woke - t0) / 1e9, "floor_waitid_samples": (done - woke) / 1e9}


HK_KEYS = (
    "samples",  # kill → action
    "wake_samples",  # kill → the watcher thread's epoll select() returned
    "collect_samples",  # that wake-up → exit status collected (ExitStatus.observed_at)
    "detect_samples",  # kill → exit status collected
    "dispatch_samples",  # status collected → action called
    "gc_gen_samples",  # highest GC generation started between kill and action; -1: none
    "gc_s_samples",  # seconds spent collecting garbage between kill and action
)
FLOOR_KEYS = (
    "floor_wake_samples",  # kill → the bare thread's epoll select() returned
    "floor_waitid_samples",  # that wake-up → waitid done
)


def latency(n: int, trials: int) -> dict[str, Any]:
    """``trials`` healthkit trials and as many floor trials over the same N children,
    interleaved (each round runs one of each, in random order)."""
    procs = spawn_sleepers(n)
    watches = [hk.ProcessWatch(p) for p in procs]
    pidfds = [os.pidfd_open(p.pid) for p in procs]
    diagnoser = hk.ExitDiagnoser(kmsg_path=None)
    tally = _GcTally()
    out: dict[str, list[Any]] = {k: [] for k in (*HK_KEYS, *FLOOR_KEYS)}
    failures = floor_failures = 0
    arm_s: list[float] = []

    def replace_child(i: int) -> None:
        procs[i].wait()
        watches[i].close()
        os.close(pidfds[i])
        procs[i] = spawn_sleepers(1)[0]
        watches[i] = hk.ProcessWatch(procs[i])
        pidfds[i] = os.pidfd_open(procs[i].pid)

    default_selector = selectors.DefaultSelector
    assert default_selector is selectors.EpollSelector, "the wake-up stamp needs epoll"
    selectors.DefaultSelector = _StampingEpoll  # type: ignore[misc]
    gc.callbacks.append(tally)
    try:
        for _ in range(trials):
            for kind in random.sample(("floor", "healthkit"), 2):
                trial: dict[str, float] | None
                if kind == "floor":
                    i, trial = _floor_trial(n, procs, pidfds)
                    floor_failures += trial is None
                else:
                    i, trial, a = _healthkit_trial(n, procs, watches, diagnoser, tally)
                    arm_s.append(a)
                    failures += trial is None
                for k, v in (trial or {}).items():
                    out[k].append(v)
                replace_child(i)
    finally:
        gc.callbacks.remove(tally)
        selectors.DefaultSelector = default_selector  # type: ignore[misc]
        for w in watches:
            w.close()
        for fd in pidfds:
            os.close(fd)
        stop_children(procs)
    return {
        **summarize(out["samples"]),
        "watches": n,
        "failures": failures,
        "floor_failures": floor_failures,
        "arm": summarize(arm_s),
        "detect": summarize(out["detect_samples"]),
        **out,
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


def _floor_total(r: dict[str, Any]) -> list[float]:
    """The floor's kill → waitid done, per trial."""
    wake, waitid = r.get("floor_wake_samples", []), r.get("floor_waitid_samples", [])
    return [a + b for a, b in zip(wake, waitid, strict=True)]


# (label, samples of a latency row); a row without them (an older run) shows n/a
PHASES: list[tuple[str, Callable[[dict[str, Any]], list[float] | None]]] = [
    ("floor: kill → bare thread's epoll wake-up", lambda r: r.get("floor_wake_samples")),
    ("floor: wake-up → `waitid` done", lambda r: r.get("floor_waitid_samples")),
    (
        "floor: kill → `waitid` done",
        lambda r: _floor_total(r) if "floor_wake_samples" in r else None,
    ),
    ("healthkit: kill → watcher's epoll wake-up", lambda r: r.get("wake_samples")),
    ("healthkit: wake-up → exit status collected", lambda r: r.get("collect_samples")),
    ("healthkit: kill → exit status collected", lambda r: r.get("detect_samples")),
    ("healthkit: status collected → action", lambda r: r.get("dispatch_samples")),
    ("healthkit: kill → action", lambda r: r.get("samples")),
]


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
        give_up = scale.get("give_up_s", GIVE_UP_S)
        gave_up = [give_up] * row["failures"]
        if t.relative_to:
            # the floor's given-up trials count at the give-up time too, as healthkit's
            floor = _floor_total(row) + [give_up] * row.get("floor_failures", 0)
            v = judge_ratio(t, row["samples"], floor, quick, fmt_s, gave_up)
        else:
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
    fig, (a1, a3, a2) = plt.subplots(1, 3, figsize=(16, 4))
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
        if t.relative_to:
            continue  # a ratio, not a time
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
    # where the time goes: each phase's p50 (dashed) and p99 (solid), where printable; the
    # phases that add up to the totals only (floor: 2, healthkit: 3)
    parts = [PHASES[i] for i in (0, 1, 3, 4, 6)]
    for (label, get), color in zip(parts, (f"C{c}" for c in range(5)), strict=False):
        for q, ls in ((0.5, "--"), (0.99, "-")):
            pts = [
                (r["watches"], float(np.percentile(v, q * 100)) * 1e3)
                for r in lat
                if (v := get(r)) and shown(len(v), q)
            ]
            if pts:
                a3.plot(
                    *zip(*pts, strict=True),
                    color=color,
                    ls=ls,
                    marker="s" if label.startswith("floor") else "o",
                    markersize=3,
                    label=f"{label.replace('`', '')} p{q * 100:g}",
                )
    a3.set_xscale("log")
    a3.set_yscale("log")
    a3.set_xlabel("watched processes")
    a3.set_ylabel("ms")
    a3.set_title("3. Where the time goes (p50 dashed, p99 solid)")
    if a3.lines:
        a3.legend(fontsize=6)
    a3.grid(alpha=0.3, which="both")
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
def _slowest_line(r: dict[str, Any]) -> str:
    """Which phase took most of the slowest 1 % of healthkit trials (at least one), and
    whether a garbage collection started in them; every figure from the data."""
    n_w = r["watches"]
    at = f"{n_w} watch" if n_w == 1 else f"{n_w} watches"
    total, disp = r["samples"], r.get("dispatch_samples")
    if not total:
        return f"- {at}: no healthkit trial reached its action."
    if disp is None:
        return f"- {at}: n/a (this run recorded no per-phase samples)."
    # the trial's phases, end to end (the wake-up split is absent from earlier runs)
    phases = (
        [
            ("kill → epoll wake-up", r["wake_samples"]),
            ("wake-up → status collected", r["collect_samples"]),
            ("status collected → action", disp),
        ]
        if "wake_samples" in r
        else [("kill → status collected", r["detect_samples"]), ("status collected → action", disp)]
    )
    k = max(1, round(len(total) / 100))
    slow = sorted(range(len(total)), key=lambda j: total[j], reverse=True)[:k]
    most = [max(range(len(phases)), key=lambda p: phases[p][1][j]) for j in slow]
    first = phases[0][1]
    floor = r.get("floor_wake_samples") if "wake_samples" in r else _floor_total(r)
    vs_floor = (
        f"; the floor's longest {phases[0][0]} at this N: {fmt_s(max(floor))}" if floor else ""
    )
    if k == 1:
        j, p = slow[0], most[0]
        text = (
            f"- {at}: the slowest healthkit trial ({fmt_s(total[j])}) spent most of its "
            f"time in {phases[p][0]} ({fmt_s(phases[p][1][j])}"
            + (f"; its {phases[0][0]}: {fmt_s(first[j])}" if p else "")
            + f"{vs_floor})"
        )
    else:
        lo, hi = fmt_s(total[slow[-1]]), fmt_s(total[slow[0]])
        counts = [f"{name} in {most.count(p)}" for p, (name, _) in enumerate(phases)]
        text = (
            f"- {at}: of the {k} slowest healthkit trials (kill → action "
            f"{lo if lo == hi else f'{lo} to {hi}'}), the phase that took most of the "
            f"time was {', '.join(counts)} (their longest {phases[0][0]}: "
            f"{fmt_s(max(first[j] for j in slow))}{vs_floor})"
        )
    gens = r.get("gc_gen_samples")
    if gens is None:
        return text + "; garbage collections: n/a (not recorded in this run)."
    gc_s = r.get("gc_s_samples") or [0.0] * len(gens)
    slow_any = [j for j in slow if gens[j] >= 0]
    if k == 1:
        text += (
            f"; a generation-{gens[slow[0]]} garbage collection ({fmt_s(gc_s[slow[0]])}) "
            "started between its kill and action"
            if slow_any
            else "; no garbage collection started between its kill and action"
        )
    else:
        text += (
            f"; a garbage collection started between kill and action in {len(slow_any)} "
            f"of them ({sum(gens[j] == 2 for j in slow)} of generation 2)"
        )
    n_any = sum(g >= 0 for g in gens)
    text += (
        f". Over all {len(gens)} trials at this N, a garbage collection started between "
        f"kill and action in {n_any} ({sum(g == 2 for g in gens)} of generation 2"
        + (f"; longest time collecting in one trial: {fmt_s(max(gc_s))})." if n_any else ").")
    )
    return text


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
    L.append("### Where the time goes")
    L.append("")
    L.append(
        "Per trial, from just before `os.kill`, on CLOCK_MONOTONIC. *healthkit*: until the "
        "watcher thread's epoll `select()` returned (stamped by the benchmark's subclass "
        "of the `WatchSet`'s selector, the GIL taken back), then until it collected the "
        "exit status (`ExitStatus.observed_at`, right after its `waitid`), then until the "
        "action was called (the decision, the brief diagnosis and the dispatch). "
        "*floor*: at the same N, in the same run, interleaved with healthkit's trials, "
        "a bare Python thread blocked in `selectors.EpollSelector().select()` over "
        "the same N children's pidfds stamps its wake-up, calls `os.waitid(P_PIDFD, fd, "
        "WEXITED | WNOWAIT)` and stamps again: the kernel's exit and wake-up at that N."
    )
    L.append("")
    L.append("| watches | phase | trials | p50 | p90 | p99 | max |")
    L.append("|---:|---|---:|---:|---:|---:|---:|")
    for r in scale["latency"]:
        for label, get in PHASES:
            v = get(r)
            if v is None:
                L.append(f"| {r['watches']} | {label} | n/a | n/a | n/a | n/a | n/a |")
                continue
            L.append(
                f"| {r['watches']} | {label} | {len(v)} | {pct_cell(v, 0.5)} | "
                f"{pct_cell(v, 0.9)} | {pct_cell(v, 0.99)} | "
                f"{fmt_s(max(v)) if v else 'n/a'} |"
            )
    L.append("")
    L.append(
        "The slowest 1 % of healthkit trials (at least one) per N, and the phase that "
        "took most of each; garbage collections started between kill and action are "
        "counted with `gc.callbacks` (generation 2 is the oldest):"
    )
    L.append("")
    L += [_slowest_line(r) for r in scale["latency"]]
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
