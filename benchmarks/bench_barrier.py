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
healthkit trials (side by side, same load); only a few of them are run.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from threading import BrokenBarrierError
from typing import Any

from _common import now_ns, summarize

import healthkit as hk

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


def hk_worker(
    rank: int, bb: hk.BoundedBarrier, die_rank: int, death_ns: Any, flags: Any
) -> None:
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
    ok = err is not None and death.value > t_wait
    return {
        "latency_s": (t_err - death.value) / 1e9 if ok else None,
        # err.elapsed: from the start of wait() until the death was seen, before diagnosing
        "detect_s": (t_wait + err.elapsed * 1e9 - death.value) / 1e9 if ok and err else None,
        "since_wait_s": (t_err - t_wait) / 1e9,
        "error": type(err).__name__ if err else None,
        "first_line": str(err).splitlines()[0] if err else None,
        "died_before_wait": death.value and death.value <= t_wait,
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
    ok = broken and death.value > t_wait
    return {
        "latency_s": (t_err - death.value) / 1e9 if ok else None,
        "since_wait_s": (t_err - t_wait) / 1e9,
        "error": "BrokenBarrierError" if broken else None,
    }


def run(quick: bool) -> dict[str, Any]:
    bounds = [2.0] if quick else [5.0, 30.0]
    n_hk = 3 if quick else 20
    n_gigl = {2.0: 1, 5.0: 3, 30.0: 2}
    gigl: dict[float, list[dict[str, Any]]] = {b: [] for b in bounds}

    failures: list[str] = []

    def guarded(fn: Any, bound: float) -> dict[str, Any]:
        try:
            r: dict[str, Any] = fn(bound)
            return r
        except Exception as e:  # recorded as an invalid trial, never hidden
            failures.append(f"{fn.__name__}({bound:g}): {e!r}")
            return {"latency_s": None, "error": None}

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
        for name, trials in (("healthkit BoundedBarrier", hk_trials[b]),
                             ("GiGL-style barrier.wait(timeout)", gigl[b])):
            lats = [t["latency_s"] for t in trials if t["latency_s"] is not None]
            det = [t["detect_s"] for t in trials if t.get("detect_s") is not None]
            out["rows"].append({
                "detect": summarize(det) if det else None,
                "method": name,
                "bound_s": b,
                **summarize(lats),
                "invalid": sum(t["latency_s"] is None for t in trials),
                "errors": sorted({str(t["error"]) for t in trials if t.get("error")}),
                "first_line": next((t.get("first_line") for t in trials if t.get("first_line")),
                                   None),
            })
    return out
