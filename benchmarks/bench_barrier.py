"""4. Fail-fast rendezvous: a worker dies before the init barrier; how long until the
parent's error?

Two spawn-started workers and the parent meet at a barrier (as in a GLT/GiGL sampling
producer). Each worker raises a "started" flag in shared memory; once both are up (so
interpreter start-up on a loaded machine does not eat into the bound) the parent raises a
"go" flag and starts waiting; worker 1 sees "go", sleeps 0.3 s, writes CLOCK_MONOTONIC into
shared memory and SIGKILLs itself; worker 0 arrives and waits.

- healthkit: ``BoundedBarrier(2, timeout=bound)``; the parent calls ``wait(workers)`` and
  catches ``BarrierBrokenError``; latency = CLOCK_MONOTONIC after the catch minus the
  worker's timestamp. It includes the diagnosis (exit status, stacks of live workers that
  did not arrive) and breaking the barrier for the survivor, since the error carries them.
- GiGL-style: ``multiprocessing.Barrier(3)``; the parent calls ``barrier.wait(timeout=bound)``
  once and catches ``BrokenBarrierError`` (what GiGL's producer does).

The GiGL-style trials wait the full bound, so they run in background threads alongside the
healthkit trials (side by side, same load); only a few of them are run. The healthkit
target is judged on every trial (``TARGETS``): a wait that ended without an error counts
against it.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from threading import BrokenBarrierError
from typing import Any

from _common import Page, fmt_s, list_s, now_ns, pct_cell, pyplot, save_figure, summarize
from _protocol import Target, Verdict, judge_every_run, shown, targets_from

import healthkit as hk

NAME = "barrier"
IMG = "bench-barrier.png"
HK_METHOD = "healthkit BoundedBarrier"
GIGL_METHOD = "GiGL-style barrier.wait(timeout)"
FULL_BOUNDS = [5.0, 30.0]
FULL_TRIALS = 150  # healthkit trials per bound
TARGETS = [
    Target(
        f"{b:g}",
        f"BoundedBarrier: death → error < 50 ms in every trial, bound {b:g} s",
        "every run",
        0.05,
        "s",
        FULL_TRIALS,
    )
    for b in FULL_BOUNDS
]
SPAWN = mp.get_context("spawn")
DELAY_S = 0.3
ORDERLY_EXIT = 7


# flags[rank] = 1 when worker ``rank`` runs; flags[-1] = 1 when the parent is about to wait
def _started(flags: Any, rank: int) -> None:
    flags[rank] = 1


def _wait_started(flags: Any, procs: list[Any], limit_s: float = 120.0) -> None:
    deadline = time.monotonic() + limit_s
    while not all(flags[i] for i in range(len(procs))):
        if time.monotonic() > deadline or not all(p.is_alive() for p in procs):
            raise RuntimeError("the workers did not start")
        time.sleep(0.005)
    flags[len(procs)] = 1  # go


def _die(death_ns: Any, flags: Any) -> None:
    while not flags[len(flags) - 1]:
        time.sleep(0.002)
    time.sleep(DELAY_S)
    death_ns.value = time.monotonic_ns()
    os.kill(os.getpid(), signal.SIGKILL)


def hk_worker(rank: int, bb: hk.BoundedBarrier, die_rank: int, death_ns: Any, flags: Any) -> None:
    bb.enable_stack_dumps()
    _started(flags, rank)
    try:
        if rank == die_rank:
            _die(death_ns, flags)
        bb.worker_wait(rank)
    except hk.BarrierBrokenError:
        sys.exit(ORDERLY_EXIT)


def gigl_worker(
    rank: int, barrier: Any, die_rank: int, death_ns: Any, bound: float, flags: Any
) -> None:
    _started(flags, rank)
    if rank == die_rank:
        _die(death_ns, flags)
    try:
        barrier.wait(timeout=bound + 30)
    except BrokenBarrierError:
        sys.exit(ORDERLY_EXIT)


def _teardown(procs: list[Any]) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(10)
        if p.is_alive():
            p.kill()
            p.join()
        p.close()


def trial_healthkit(bound: float, workers: int = 2) -> dict[str, Any]:
    death = SPAWN.RawValue("q", 0)
    flags = SPAWN.RawArray("b", workers + 1)
    bb = hk.BoundedBarrier(workers, timeout=bound, ctx=SPAWN, name="sampling init barrier")
    procs = [
        SPAWN.Process(target=hk_worker, args=(i, bb, workers - 1, death, flags), daemon=True)
        for i in range(workers)
    ]
    for p in procs:
        p.start()
    err: hk.BarrierBrokenError | None = None
    try:
        _wait_started(flags, procs)
        t_wait = now_ns()
        try:
            bb.wait(procs)
        except hk.BarrierBrokenError as e:
            err = e
        t_err = now_ns()
    finally:
        _teardown(procs)
        bb.close()
    died_before = bool(death.value) and death.value <= t_wait
    ok = err is not None and death.value > t_wait
    return {
        # no error at all although a worker died: healthkit failed, not the benchmark
        "status": "ok" if ok else "died before wait" if died_before else "no error",
        "latency_s": (t_err - death.value) / 1e9 if ok else None,
        # err.elapsed: from the start of wait() until the death was seen, before diagnosing
        "detect_s": (t_wait + err.elapsed * 1e9 - death.value) / 1e9 if ok and err else None,
        "since_wait_s": (t_err - t_wait) / 1e9,
        "error": type(err).__name__ if err else None,
        "first_line": str(err).splitlines()[0] if err else None,
    }


def trial_gigl(bound: float, workers: int = 2) -> dict[str, Any]:
    death = SPAWN.RawValue("q", 0)
    flags = SPAWN.RawArray("b", workers + 1)
    barrier = SPAWN.Barrier(workers + 1)
    procs = [
        SPAWN.Process(
            target=gigl_worker, args=(i, barrier, workers - 1, death, bound, flags), daemon=True
        )
        for i in range(workers)
    ]
    for p in procs:
        p.start()
    broken = False
    try:
        _wait_started(flags, procs)
        t_wait = now_ns()
        try:
            barrier.wait(timeout=bound)
        except BrokenBarrierError:
            broken = True
        t_err = now_ns()
    finally:
        _teardown(procs)
    died_before = bool(death.value) and death.value <= t_wait
    ok = broken and death.value > t_wait
    return {
        "status": "ok" if ok else "died before wait" if died_before else "no error",
        "latency_s": (t_err - death.value) / 1e9 if ok else None,
        "since_wait_s": (t_err - t_wait) / 1e9,
        "error": "BrokenBarrierError" if broken else None,
    }


def run(quick: bool) -> dict[str, Any]:
    bounds = [2.0] if quick else FULL_BOUNDS
    n_hk = 3 if quick else FULL_TRIALS
    n_gigl = {2.0: 1, 5.0: 5, 30.0: 3}  # each waits its whole bound, in the background
    gigl: dict[float, list[dict[str, Any]]] = {b: [] for b in bounds}

    failures: list[str] = []

    def guarded(fn: Any, bound: float) -> dict[str, Any]:
        try:
            r: dict[str, Any] = fn(bound)
            return r
        except Exception as e:  # recorded as an invalid trial, never hidden
            failures.append(f"{fn.__name__}({bound:g}): {e!r}")
            return {"status": "exception", "latency_s": None, "error": None}

    def background(bound: float) -> None:
        for _ in range(n_gigl[bound]):
            gigl[bound].append(guarded(trial_gigl, bound))

    threads = [threading.Thread(target=background, args=(b,), daemon=True) for b in bounds]
    for t in threads:
        t.start()
    hk_trials: dict[float, list[dict[str, Any]]] = {b: [] for b in bounds}
    for i in range(n_hk):
        for b in bounds if i % 2 == 0 else reversed(bounds):
            hk_trials[b].append(guarded(trial_healthkit, b))
    for t in threads:
        t.join(max(bounds) * 4 + 120)
    out: dict[str, Any] = {
        "bounds": bounds,
        "workers": 2,
        "delay_s": DELAY_S,
        "rows": [],
        "failures": failures,
    }
    for b in bounds:
        for name, trials in ((HK_METHOD, hk_trials[b]), (GIGL_METHOD, gigl[b])):
            lats = [t["latency_s"] for t in trials if t["status"] == "ok"]
            det = [t["detect_s"] for t in trials if t.get("detect_s") is not None]
            out["rows"].append(
                {
                    "method": name,
                    "bound_s": b,
                    **summarize(lats),
                    "samples": lats,
                    "detect_samples": det,
                    "no_error": sum(t["status"] == "no error" for t in trials),
                    "invalid": sum(
                        t["status"] in ("died before wait", "exception") for t in trials
                    ),
                    "errors": sorted({str(t["error"]) for t in trials if t.get("error")}),
                    "first_line": next(
                        (t.get("first_line") for t in trials if t.get("first_line")), None
                    ),
                }
            )
    return out


# ---------------------------------------------------------------------- verdicts
def verdicts(bar: dict[str, Any], entry: dict[str, Any], quick: bool) -> list[Verdict]:
    out = []
    for t in targets_from(entry, TARGETS):
        rows = [r for r in bar["rows"] if r["method"] == HK_METHOD]
        row = next((r for r in rows if f"{r['bound_s']:g}" == t.key), None)
        if row is None:
            if not quick:
                out.append(Verdict(t.what, t.statistic, "n/a", "", "0", "not measured"))
                continue
            row = rows[0]  # a quick run has one short bound
        v = judge_every_run(t, row["samples"], row["no_error"], quick, fmt_s)
        if f"{row['bound_s']:g}" != t.key:
            v = replace(v, what=f"{v.what} (measured at bound {row['bound_s']:g} s)")
        out.append(v)
    return out


# ---------------------------------------------------------------------- plot
def plot(bar: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    rows = bar["rows"]
    bounds = bar["bounds"]
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.38
    for i, m in enumerate([HK_METHOD, GIGL_METHOD]):
        for j, b in enumerate(bounds):
            r = next((r for r in rows if r["method"] == m and r["bound_s"] == b), None)
            if not r or not r["samples"]:
                continue
            x = j + (i - 0.5) * width
            ax.scatter(
                [x] * len(r["samples"]),
                r["samples"],
                s=8,
                alpha=0.5,
                color=f"C{i}",
                label=m if j == 0 else None,
            )
            ax.text(
                x,
                max(r["samples"]),
                f"max {fmt_s(max(r['samples']))}",
                ha="center",
                va="bottom",
                fontsize=8,
            )
    ax.set_xticks(range(len(bounds)), [f"bound {b:g} s" for b in bounds])
    ax.set_xlim(-0.6, len(bounds) - 0.4)
    ax.set_yscale("log")
    ax.set_ylabel("worker death → parent's error (s, log)")
    for t in TARGETS[:1]:
        ax.axhline(t.limit, color="red", ls=":", lw=1, label=f"target {fmt_s(t.limit)}")
    ax.set_title("4. Fail-fast rendezvous (every trial)")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3, which="both")
    save_figure(fig, path)


# ---------------------------------------------------------------------- markdown
def markdown(bar: dict[str, Any], page: Page) -> list[str]:
    L = ["## 4. Fail-fast rendezvous", ""]
    L.append(
        f"{bar['workers']} spawn-started workers and the parent meet at a barrier. The "
        "parent starts waiting once both workers have started (a flag in shared memory), "
        f"then worker 1 sleeps {bar['delay_s']:g} s, writes CLOCK_MONOTONIC to shared "
        "memory and SIGKILLs itself. Latency = the parent's error minus that timestamp. "
        "The GiGL-style trials (one `barrier.wait(timeout=bound)`) ran in background "
        "threads during the healthkit trials. *Death seen*: when `BoundedBarrier.wait` "
        "noticed the death (`BarrierBrokenError.elapsed` after it started). *No error*: "
        "the wait ended without an error although a worker had died (counted against "
        "the target). *Invalid*: the worker died before the parent started waiting, or "
        "the trial could not be set up (excluded, and counted here)."
    )
    L.append("")
    L.append(
        "| method | bound | trials | p50 | p90 | max | death seen: p50 / max | error "
        "raised | no error | invalid |"
    )
    L.append("|---|---:|---:|---:|---:|---:|---:|---|---:|---:|")
    for r in bar["rows"]:
        s = r["samples"]
        det = r.get("detect_samples", [])
        d = f"{pct_cell(det, 0.5)} / {fmt_s(max(det))}" if det else ""
        if s and shown(len(s), 0.5):
            p50, p90 = pct_cell(s, 0.5), pct_cell(s, 0.9)
        else:
            p50, p90 = (f"values: {list_s(s)}" if s else ""), ""
        L.append(
            f"| {r['method']} | {r['bound_s']:g} s | {len(s)} | {p50} | {p90} | "
            f"{fmt_s(max(s)) if s else 'n/a'} | {d} | {', '.join(r['errors'])} | "
            f"{r['no_error']} | {r['invalid']} |"
        )
    L.append("")
    if bar.get("failures"):
        L.append("Trials that could not be set up: " + "; ".join(bar["failures"]))
        L.append("")
    first = next((r["first_line"] for r in bar["rows"] if r.get("first_line")), None)
    if first:
        L.append(f"First line of healthkit's error: `{first}`")
    if page.img:
        L += ["", f"![barrier]({page.img})"]
    L.append("")
    return L
