"""3. Scale: detection latency and memory per watch at 1, 10, 100 and 1,000 watches.

For each N, N idle children (``sleep``) are watched by one thread-mode DisarmableWatchdog;
one random child is SIGKILLed and the latency until the action (``call(record)``) runs is
recorded, the watchdog disarmed and the dead child replaced. The watchdog is re-armed over
the same ``ProcessWatch`` objects each trial (arming N watches is part of the trial set-up,
outside the timed region). The action runs after the diagnosis; the diagnoser here has the
kernel-log scan switched off (``ExitDiagnoser(kmsg_path=None)``, the situation of a non-root
user), so that the figure is about N, not about the size of the kernel log; section 1 shows
the cost of that scan.

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
from typing import Any

from _common import (
    now_ns,
    open_fds,
    raise_nofile,
    rss_bytes,
    spawn_sleepers,
    stop_children,
    summarize,
)

import healthkit as hk


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
            done.wait(5)
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
    }


def run(quick: bool) -> dict[str, Any]:
    nofile = raise_nofile()
    counts = [1, 10, 100] if quick else [1, 10, 100, 1000]
    trials = 10 if quick else 200
    return {
        "nofile": nofile,
        "trials": trials,
        "latency": [latency(n, trials) for n in counts],
        "memory": [memory(n) for n in counts],
    }
