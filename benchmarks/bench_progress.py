"""Progress watch: what a beat costs the helper, and what a watch costs the watcher.

1. **One beat** (``Heartbeat.beat()``), next to a bare counter increment (``obj.n += 1``)
   and a bare store into the same shared page (``view[0] += 1``), in the same process and
   the same rounds: each round times ``BATCH`` calls of each, in a shuffled order, and the
   per-call time of a round is its batch time divided by ``BATCH``; reported as p50/p99 over
   ``ROUNDS`` rounds. System calls per beat: ``strace -f -c`` over a child that beats
   ``SYSCALL_BEATS`` times, minus the same child beating zero times (when strace is
   installed).
2. **Wake-ups per watch**: N progress watches on one thread-mode watchdog, a helper beating
   every heartbeat every 10 ms; over ``WINDOW_S`` seconds, the watcher thread's voluntary
   context switches (``/proc/self/task/<tid>/status``) while nobody expects progress (idle)
   and while progress is expected for all N (``stall_timeout`` 1 s), side by side with a
   baseline in the same run: a thread that polls every watch's counter every 0.1 s (what a
   watcher without a timer per deadline does).
3. **Stall to action** (thread mode): a helper that never beats; from the start of a wait to
   the first action, minus ``stall_timeout`` (0.2 s), over ``LATENCY_TRIALS`` trials.
4. **One call** (``with watch.call():``, ``callers=True``), next to a bare
   ``with contextlib.nullcontext():`` and an empty loop body, by the rounds of 1. (the
   first call of a thread claims its slot: that one is made before the rounds).
5. **GLT sampling throughput** with and without the progress watch: measured by
   ``bench_progress_glt.py`` (it needs a GLT stack), kept in
   ``benchmarks/results/progress-glt-*.json`` and rendered here.

The load average (1 min) is recorded at the start and end of each part and printed beside
its figures: the machine is shared.

This benchmark owns its page: ``python benchmarks/bench_progress.py [--quick]`` writes
``benchmarks/results/progress.json`` and ``docs/benchmarks-progress.md`` (``--quick``: fewer
rounds, to a temporary directory, asserting nothing about times).
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import multiprocessing as mp
import os
import platform
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import thread_ctxt_switches

import healthkit as hk

ROOT = Path(__file__).resolve().parent.parent
COMMAND = "python benchmarks/bench_progress.py"
BATCH = 1000
SYSCALL_BEATS = 1_000_000


def _pct(values: list[float], p: float) -> float:
    s = sorted(values)
    k = (len(s) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


# ----------------------------------------------------------------------------- 1. one beat
class _Counter:
    n = 0


def beat_cost(rounds: int) -> dict[str, Any]:
    with hk.ProgressWatch(60) as watch:
        hb = watch.heartbeat
        view = hb._v
        counter = _Counter()

        def bare() -> None:
            counter.n += 1

        def store() -> None:
            view[0] += 1

        calls = {"bare counter increment": bare, "store into the page": store, "beat()": hb.beat}
        return _summary(_interleaved(calls, rounds))


def _interleaved(
    calls: dict[str, Callable[[], None]],
    rounds: int,
    after: Callable[[Callable[[], None]], None] = lambda fn: None,
) -> dict[str, list[float]]:
    """Nanoseconds per call of each of ``calls``: ``BATCH`` calls in a row, the calls in a
    new random order each round, so that load hits them alike; ``after(fn)`` after each."""
    per_call: dict[str, list[float]] = {k: [] for k in calls}
    for _ in range(rounds):
        order = list(calls.items())
        random.shuffle(order)
        for name, fn in order:
            t0 = time.perf_counter_ns()
            for _ in range(BATCH):
                fn()
            per_call[name].append((time.perf_counter_ns() - t0) / BATCH)
            after(fn)
    return per_call


def _summary(per_call: dict[str, list[float]]) -> dict[str, Any]:
    return {
        name: {"p50_ns": _pct(v, 50), "p99_ns": _pct(v, 99), "rounds": len(v)}
        for name, v in per_call.items()
    }


def call_cost(rounds: int) -> dict[str, Any]:
    """Per-call cost of ``with watch.call():`` next to a bare ``nullcontext()`` block: on a
    watch a watcher is timing (the steady state while calls keep coming: a call only
    stores), and on one nobody times (each call then rings the watcher's bell: a
    ``write()``; in use, the first call after the watcher found none in flight)."""
    nullcontext = contextlib.nullcontext
    timed_watch = hk.ProgressWatch(60, name="timed", callers=True)
    lone_watch = hk.ProgressWatch(60, name="untimed", callers=True)
    wd = hk.DisarmableWatchdog(actions=[lambda e: None], name="bench-calls")
    wd.watch_progress(timed_watch)
    timed_watch.heartbeat.ready()  # calls are timed once the helper serves (no helper here)
    release = threading.Event()

    def hold_a_call() -> None:  # a call in flight all along: the watcher keeps timing
        with timed_watch.call():
            release.wait()

    holder = threading.Thread(target=hold_a_call, daemon=True)
    try:
        with wd:
            holder.start()
            deadline = time.monotonic() + 10
            while not timed_watch._v[5] and time.monotonic() < deadline:  # slot 5: timing
                time.sleep(0.01)
            assert timed_watch._v[5], "the watcher never started timing"
            timed_call, lone_call = timed_watch.call, lone_watch.call
            with timed_call(), lone_call():  # claim this thread's slots, outside the rounds
                pass

            def empty() -> None:
                pass

            def bare() -> None:
                with nullcontext():
                    pass

            def timed() -> None:
                with timed_call():
                    pass

            def lone() -> None:
                with lone_call():
                    pass

            calls = {
                "empty function call": empty,
                "with contextlib.nullcontext(): pass": bare,
                "with watch.call(): pass (a watcher timing)": timed,
                "with watch.call(): pass (none timing: rings the bell)": lone,
            }
            bell = lone_watch.bell

            def drain_after_lone(fn: Callable[[], None]) -> None:
                if fn is lone and bell is not None:
                    _drain(bell)

            per_call = _interleaved(calls, rounds, drain_after_lone)
            still_timing = bool(timed_watch._v[5])
            release.set()
            holder.join()
            fired = wd.fired is not None
    finally:
        release.set()
        timed_watch.close()
        lone_watch.close()
    out = _summary(per_call)
    out["_checks"] = {"still_timing": still_timing, "fired": fired}
    return out


def _drain(fd: int) -> None:
    """Empty the untimed watch's bell (nobody reads it): a full pipe would make its calls
    skip the write, and time less than a real ring."""
    with contextlib.suppress(OSError):
        while os.read(fd, 65536):
            pass


def _with_load(fn: Any, *args: Any) -> Any:
    """``fn(*args)``, with the 1-minute load average before and after it."""
    before = os.getloadavg()[0]
    out = fn(*args)
    return {"result": out, "load": [before, os.getloadavg()[0]]}


_BEATER = """
import sys, healthkit
w = healthkit.ProgressWatch(60)
hb = w.heartbeat
for _ in range(int(sys.argv[1])):
    hb.beat()
"""


def syscalls_per_beat() -> dict[str, Any] | None:
    strace = shutil.which("strace")
    if strace is None:
        return None
    totals = []
    for n in (0, SYSCALL_BEATS):
        out = subprocess.run(
            [strace, "-f", "-c", "-o", "/dev/stdout", sys.executable, "-c", _BEATER, str(n)],
            capture_output=True, text=True, timeout=300, check=True,
        )  # fmt: skip
        match = re.search(r"^-+.*\n\s*100\.00\s+\S+\s+\S+\s+(\d+)", out.stdout, re.M)
        if match is None:
            m2 = re.search(r"total\s*$", out.stdout, re.M)
            line = out.stdout[: m2.start()].splitlines()[-1] if m2 else ""
            nums = [int(x) for x in line.split() if x.isdigit()]
            totals.append(nums[0] if nums else -1)
        else:
            totals.append(int(match.group(1)))
    return {"beats": SYSCALL_BEATS, "syscalls_without": totals[0], "syscalls_with": totals[1],
            "per_beat": (totals[1] - totals[0]) / SYSCALL_BEATS}


# ----------------------------------------------------------------------------- 2. wake-ups
def _beat_all(heartbeats: list[hk.Heartbeat], seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for hb in heartbeats:
            hb.beat()
        time.sleep(0.01)


def wakeups(n: int, window: float) -> dict[str, Any]:
    watches = [hk.ProgressWatch(1.0, name=f"w{i}") for i in range(n)]
    helper = mp.get_context("fork").Process(
        target=_beat_all, args=([w.heartbeat for w in watches], 4 * window + 10), daemon=True
    )
    helper.start()
    stop = threading.Event()
    polls = [0]

    def poller() -> None:  # baseline: look at every counter every 0.1 s
        last = [w.beats for w in watches]
        while not stop.wait(0.1):
            for i, w in enumerate(watches):
                last[i] = w.beats
            polls[0] += 1

    try:
        wd = hk.DisarmableWatchdog(actions=[lambda e: None], name=f"bench-{n}")
        for w in watches:
            wd.watch_progress(w)
        with wd:
            time.sleep(0.3)
            assert wd._thread is not None and wd._thread.native_id is not None
            tid = wd._thread.native_id
            base = threading.Thread(target=poller, daemon=True)
            base.start()
            assert base.native_id is not None
            out: dict[str, Any] = {"n": n, "window_s": window}
            for phase in ("idle", "expected"):
                w0 = thread_ctxt_switches(tid)[0]
                b0 = thread_ctxt_switches(base.native_id)[0]
                if phase == "expected":
                    for w in watches:
                        w.begin("a batch")
                time.sleep(window)
                if phase == "expected":
                    for w in watches:
                        w.end()
                out[f"{phase}_watcher"] = thread_ctxt_switches(tid)[0] - w0
                out[f"{phase}_poller"] = thread_ctxt_switches(base.native_id)[0] - b0
                time.sleep(1.2)  # the watcher's one look that finds the wait over
            out["fired"] = wd.fired is not None
    finally:
        stop.set()
        helper.kill()
        helper.join()
        for w in watches:
            w.close()
    return out


# ----------------------------------------------------------------------------- 3. latency
def _never_beats(hb: hk.Heartbeat) -> None:
    hb.attach(stacks=False)
    time.sleep(600)


def latency(trials: int, stall_timeout: float = 0.2) -> dict[str, Any]:
    lags: list[float] = []
    with hk.ProgressWatch(stall_timeout) as watch:
        helper = mp.get_context("fork").Process(
            target=_never_beats, args=(watch.heartbeat,), daemon=True
        )
        helper.start()
        try:
            while watch.helper_pid is None:
                time.sleep(0.01)
            for _ in range(trials):
                fired: list[float] = []
                wd = hk.DisarmableWatchdog(
                    actions=[lambda e, fired=fired: fired.append(time.monotonic())]  # type: ignore[misc]
                )
                wd.watch_progress(watch)
                with wd:
                    t0 = time.monotonic()
                    with watch.expecting("a batch"):
                        while not fired and time.monotonic() - t0 < stall_timeout + 5:
                            time.sleep(0.005)
                lags.append(fired[0] - t0 - stall_timeout)
        finally:
            helper.kill()
            helper.join()
    return {
        "stall_timeout_s": stall_timeout,
        "trials": trials,
        "p50_ms": _pct(lags, 50) * 1e3,
        "p99_ms": _pct(lags, 99) * 1e3,
        "max_ms": max(lags) * 1e3,
    }


# ----------------------------------------------------------------------------- report
def render(r: dict[str, Any]) -> str:
    L = [
        "# Benchmark: progress watch",
        "",
        f"Produced by `{r['command']}` on {r['date']} (Python {r['python']}, {r['cpus']} CPUs, "
        f"{r['machine']}); the method is in `benchmarks/bench_progress.py`. The machine was "
        "shared with other work while it ran: read the p99 columns as upper bounds.",
        "",
        "## One beat",
        "",
        f"Per call, from batches of {BATCH:,} calls; p50/p99 over the rounds. A p99 far above "
        "its p50 in every row, the bare increment's included, is most likely a batch during "
        "which this process was preempted (the machine was shared), not the call itself.",
        "",
        "| call | p50 | p99 | rounds |",
        "|---|---:|---:|---:|",
    ]
    for name, v in r["beat"].items():
        L.append(f"| `{name}` | {v['p50_ns']:.0f} ns | {v['p99_ns']:.0f} ns | {v['rounds']:,} |")
    if "beat" in r.get("load", {}):
        L += ["", _load_text(r["load"]["beat"])]
    sc = r.get("syscalls")
    L.append("")
    if r["command"].endswith("--quick"):
        L.append("System calls: not measured in a quick run.")
    elif sc:
        L.append(
            f"System calls (`strace -f -c`): a child beating {sc['beats']:,} times made "
            f"{sc['syscalls_with']:,}, the same child beating 0 times {sc['syscalls_without']:,}:"
            f" {sc['per_beat']:.6f} per beat ({sc['syscalls_with'] - sc['syscalls_without']} "
            "in total over all the beats)."
        )
    else:
        L.append("System calls: not measured (strace is not installed).")
    L += [
        "",
        "## Wake-ups per watch",
        "",
        "The watcher thread's voluntary context switches (each is one wake-up) over the window, "
        "while a helper beats every heartbeat every 10 ms; `stall_timeout` 1 s. Baseline, same "
        "run: a thread polling every counter every 0.1 s.",
        "",
        "| watches | window | idle: watcher | idle: 0.1 s poller | expected: watcher | "
        "expected: 0.1 s poller |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for w in r["wakeups"]:
        L.append(
            f"| {w['n']} | {w['window_s']:.0f} s | {w['idle_watcher']} | {w['idle_poller']} | "
            f"{w['expected_watcher']} | {w['expected_poller']} |"
        )
    if "wakeups" in r.get("load", {}):
        L += ["", _load_text(r["load"]["wakeups"])]
    lat = r["latency"]
    L += [
        "",
        "## Stall to action",
        "",
        f"Thread mode, `stall_timeout` {lat['stall_timeout_s']} s, a helper that never beats: "
        f"from the start of the wait to the first action, minus `stall_timeout`, over "
        f"{lat['trials']} trials: p50 {lat['p50_ms']:.1f} ms, p99 {lat['p99_ms']:.1f} ms, max "
        f"{lat['max_ms']:.1f} ms."
        + (" " + _load_text(r["load"]["latency"]) if "latency" in r.get("load", {}) else ""),
        "",
    ]
    if "call" in r:
        L += [
            "## One call (`callers=True`)",
            "",
            "`with watch.call(): pass` on a `ProgressWatch(60, callers=True)` whose slot this "
            "thread has claimed (its first call, made before the rounds), next to a bare "
            "`with contextlib.nullcontext(): pass` and an empty function call (the loop's own "
            f"cost, in every row), in the same rounds: per call, from batches of {BATCH:,} "
            "calls in a shuffled order; p50/p99 over the rounds. Two watches: one a "
            "thread-mode watchdog is timing (another thread holds a call open all along), "
            "the steady state while calls keep coming (a call is two stores and a memory "
            "barrier); one nobody times, where each call rings the watcher's bell (one "
            "`write()` to a pipe), as the first call does after the watcher found no call in "
            "flight (at most once per `stall_timeout` while calls keep coming).",
            "",
            "| call | p50 | p99 | rounds |",
            "|---|---:|---:|---:|",
        ]
        for name, v in r["call"].items():
            if name.startswith("_"):
                continue
            L.append(
                f"| `{name}` | {v['p50_ns']:.0f} ns | {v['p99_ns']:.0f} ns | {v['rounds']:,} |"
            )
        checks = r["call"].get("_checks")
        if checks:
            L += ["", f"Checked after the rounds: the watcher was still timing the first watch: "
                  f"{checks['still_timing']}; the watchdog fired: {checks['fired']}."]  # fmt: skip
        if "call" in r.get("load", {}):
            L += ["", _load_text(r["load"]["call"])]
        L.append("")
    L += _glt_sections()
    return "\n".join(L)


def _load_text(load: list[float]) -> str:
    return f"Load average (1 min) at the start and end of this part: {load[0]:.2f}, {load[1]:.2f}."


def _glt_sections() -> list[str]:
    """GLT sampling throughput with and without the progress watch, from the runs
    ``bench_progress_glt.py`` kept (one per GLT stack)."""
    from bench_progress_glt import section

    runs = sorted(glob.glob(str(ROOT / "benchmarks" / "results" / "progress-glt-*.json")))
    if not runs:
        return []
    L = [
        "## GLT sampling throughput with and without the progress watch",
        "",
        "Two `healthkit_glt.DistNeighborLoader`s alive in one process (two sampling workers "
        "each, a consumer that drops each batch), one without `stall_timeout` and one with "
        "it (each worker beats per batch sent; the loader's receive is bounded by the "
        "watch); each round runs the epochs without, with, with, without, so load from "
        "other processes hits both alike within seconds. Method: "
        "`benchmarks/bench_progress_glt.py`.",
        "",
    ]
    for path in runs:
        L += section(json.loads(Path(path).read_text()), Path(path).name)
    return L


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--report-only", action="store_true",
                    help="rewrite docs/benchmarks-progress.md from the saved results")
    args = ap.parse_args(argv)
    if args.report_only:
        saved = json.loads((ROOT / "benchmarks" / "results" / "progress.json").read_text())
        (ROOT / "docs" / "benchmarks-progress.md").write_text(render(saved))
        return 0
    window = 1.0 if args.quick else 5.0
    result: dict[str, Any] = {
        "command": COMMAND + (" --quick" if args.quick else ""),
        "date": time.strftime("%Y-%m-%d"),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
    }
    counts = [1, 10] if args.quick else [1, 10, 100]
    parts = {
        "beat": (beat_cost, 200 if args.quick else 5000),
        "call": (call_cost, 200 if args.quick else 5000),
        "wakeups": (lambda: [wakeups(n, window) for n in counts],),
        "latency": (latency, 5 if args.quick else 50),
    }
    result["load"] = {}
    for name, (fn, *fargs) in parts.items():
        done = _with_load(fn, *fargs)
        result[name], result["load"][name] = done["result"], done["load"]
    result["syscalls"] = None if args.quick else syscalls_per_beat()
    if args.quick:
        out_dir = Path(tempfile.mkdtemp(prefix="hk-bench-progress-"))
        (out_dir / "progress.json").write_text(json.dumps(result, indent=1))
        (out_dir / "benchmarks-progress.md").write_text(render(result))
        print(f"quick run written to {out_dir}")
    else:
        (ROOT / "benchmarks" / "results" / "progress.json").write_text(json.dumps(result, indent=1))
        (ROOT / "docs" / "benchmarks-progress.md").write_text(render(result))
    print(render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
