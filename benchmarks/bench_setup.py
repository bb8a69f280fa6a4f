"""Set-up cost per watch: does building a watchdog stay O(1) per watch from 10 to 10,000?

For each N, N idle children (``sleep``) are started and a ``ProcessWatch`` built for each,
outside the timed region. Then, timed: ``DisarmableWatchdog.watch()`` for all N (each call
checks for a duplicate pid and files the entry), and ``arm()`` (one epoll registration per
watch and the watcher thread). Repeated ``ROUNDS`` times per N over the same watches, each with
a new watchdog; the figure is the median per-watch time over the rounds. The baseline, in the
same run, is the watchdog's previous bookkeeping (a list scanned for a duplicate pid on every
``watch()``), replayed over the same watches: the set-up cost the dict-based lookup replaced.

A second measure is what a user's set-up meets: ``watch(popen)`` (the watch built inside,
a pidfd opened per call), each call timed alone, and the median of the first 100 calls set
against that of the last 100: flat set-up means the 10,000th call costs what the 10th did.
Its baseline replays the previous ``watch()`` (every record scanned for a duplicate pid, then
the watch built) over the same children, in the same run.

This benchmark owns its page: ``python benchmarks/bench_setup.py [--quick]`` writes
``benchmarks/results/setup.json`` and ``docs/benchmarks-setup.md`` (``--quick``: small N, to a
temporary directory, asserting nothing about times).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import raise_nofile, spawn_sleepers

import healthkit as hk

ROOT = Path(__file__).resolve().parent.parent
ROUNDS = 5
CALL_ROUNDS = 3
COMMAND = "python benchmarks/bench_setup.py"


def _linear_scan_watch(entries: list[hk.ProcessWatch], watch: hk.ProcessWatch) -> None:
    """The previous bookkeeping: scan every entry for a duplicate pid, then append."""
    for e in entries:
        if e.pid == watch.pid and e.status is None:
            return
    entries.append(watch)


def _old_watch(records: list[hk.ProcessWatch], target: Any) -> None:
    """The previous ``watch()``: scan every record (and its status) for a duplicate pid,
    then build the watch and file it."""
    for known in records:
        if known.pid == target.pid and known.status is None:
            return
    records.append(hk.ProcessWatch(target))


def _ends(times: list[float]) -> tuple[float, float]:
    """Median of the first 100 and of the last 100 per-call times."""
    k = min(100, len(times) // 2)
    return statistics.median(times[:k]), statistics.median(times[-k:])


def measure_calls(procs: list[Any]) -> dict[str, Any]:
    """``watch(popen)`` per call, first 100 vs last 100, and the previous code's."""
    firsts, lasts, base_firsts, base_lasts = [], [], [], []
    for _ in range(CALL_ROUNDS):
        wd = hk.DisarmableWatchdog(actions=[lambda event: None], name="setup-calls")
        times = []
        for p in procs:
            t0 = time.perf_counter()
            wd.watch(p)
            times.append(time.perf_counter() - t0)
        wd.disarm()  # closes the watches it built
        first, last = _ends(times)
        firsts.append(first)
        lasts.append(last)
        records: list[hk.ProcessWatch] = []
        times = []
        for p in procs:
            t0 = time.perf_counter()
            _old_watch(records, p)
            times.append(time.perf_counter() - t0)
        for w in records:
            w.close()
        first, last = _ends(times)
        base_firsts.append(first)
        base_lasts.append(last)
    return {
        "call_rounds": CALL_ROUNDS,
        "watch_call_first100_s": statistics.median(firsts),
        "watch_call_last100_s": statistics.median(lasts),
        "baseline_call_first100_s": statistics.median(base_firsts),
        "baseline_call_last100_s": statistics.median(base_lasts),
    }


def measure(n: int) -> dict[str, Any]:
    procs = spawn_sleepers(n)
    watches = [hk.ProcessWatch(p) for p in procs]
    watch_s: list[float] = []
    arm_s: list[float] = []
    scan_s: list[float] = []
    try:
        for _ in range(ROUNDS):
            wd = hk.DisarmableWatchdog(actions=[lambda event: None], name=f"setup-{n}")
            t0 = time.perf_counter()
            for w in watches:
                wd.watch(w)
            t1 = time.perf_counter()
            wd.arm()
            t2 = time.perf_counter()
            wd.disarm()
            watch_s.append((t1 - t0) / n)
            arm_s.append((t2 - t1) / n)
            entries: list[hk.ProcessWatch] = []
            t3 = time.perf_counter()
            for w in watches:
                _linear_scan_watch(entries, w)
            scan_s.append((time.perf_counter() - t3) / n)
        for w in watches:
            w.close()
        watches = []
        calls = measure_calls(procs)
    finally:
        for w in watches:
            w.close()
        hk.stop(procs, kill_after=10)
    return {
        **calls,
        "n": n,
        "rounds": ROUNDS,
        "watch_per_watch_s": statistics.median(watch_s),
        "arm_per_watch_s": statistics.median(arm_s),
        "baseline_scan_per_watch_s": statistics.median(scan_s),
        "watch_rounds_s": watch_s,
        "arm_rounds_s": arm_s,
        "baseline_rounds_s": scan_s,
    }


def render(result: dict[str, Any]) -> str:
    rows = result["rows"]
    us = 1e6
    lines = [
        "# Benchmark: set-up cost per watch",
        "",
        f"Produced by `{result['command']}` on {result['date']} (Python {result['python']}, "
        f"{result['cpus']} CPUs, RLIMIT_NOFILE {result['nofile'][0]}/{result['nofile'][1]}). "
        f"Median over {ROUNDS} rounds per N of the per-watch time; the method is in "
        "`benchmarks/bench_setup.py`. Load average (1, 5, 15 min) before the run "
        f"{', '.join(f'{x:.1f}' for x in result.get('load_before', []))}, after it "
        f"{', '.join(f'{x:.1f}' for x in result.get('load_after', []))} (a shared machine; "
        "its own 10,000 children count in the second).",
        "",
        "| watches N | `watch()` per watch | `arm()` per watch | baseline: list scan per watch |",
        "|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['n']:,} | {r['watch_per_watch_s'] * us:.2f} µs | "
            f"{r['arm_per_watch_s'] * us:.2f} µs | {r['baseline_scan_per_watch_s'] * us:.2f} µs |"
        )
    first, last = rows[0], rows[-1]
    growth = last["watch_per_watch_s"] / first["watch_per_watch_s"]
    base_growth = last["baseline_scan_per_watch_s"] / first["baseline_scan_per_watch_s"]
    lines += [
        "",
        f"From N = {first['n']:,} to N = {last['n']:,}, the per-watch cost of `watch()` changed "
        f"by a factor of {growth:.2f}; the baseline's by a factor of {base_growth:.2f}.",
        "",
        "What a set-up meets, call by call: `watch(popen)` (the watch built inside), each call "
        f"timed alone; the median over {CALL_ROUNDS} rounds of the median of the first 100 "
        "calls and of the last 100 (for N = 10, the first 5 and the last 5). Baseline: the "
        "previous `watch()`, which scanned every record for a duplicate pid, replayed over "
        "the same children in the same run.",
        "",
        "| watches N | `watch(popen)`: first 100 | last 100 | last / first | "
        "baseline: first 100 | last 100 | last / first |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        f, la = r["watch_call_first100_s"], r["watch_call_last100_s"]
        bf, bl = r["baseline_call_first100_s"], r["baseline_call_last100_s"]
        lines.append(
            f"| {r['n']:,} | {f * us:.1f} µs | {la * us:.1f} µs | {la / f:.2f} | "
            f"{bf * us:.1f} µs | {bl * us:.1f} µs | {bl / bf:.2f} |"
        )
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    nofile = raise_nofile()
    counts = [10, 100, 300] if args.quick else [10, 100, 1000, 10000]
    import os

    result = {
        "command": COMMAND + (" --quick" if args.quick else ""),
        "date": time.strftime("%Y-%m-%d"),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "nofile": list(nofile),
        "load_before": list(os.getloadavg()),
        "rows": [measure(n) for n in counts],
        "load_after": list(os.getloadavg()),
    }
    if args.quick:
        out_dir = Path(tempfile.mkdtemp(prefix="hk-bench-setup-"))
        (out_dir / "setup.json").write_text(json.dumps(result, indent=1))
        (out_dir / "benchmarks-setup.md").write_text(render(result))
        print(f"quick run written to {out_dir}")
    else:
        (ROOT / "benchmarks" / "results" / "setup.json").write_text(json.dumps(result, indent=1))
        (ROOT / "docs" / "benchmarks-setup.md").write_text(render(result))
    print(render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
