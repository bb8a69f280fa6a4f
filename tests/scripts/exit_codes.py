"""Watching never changes what multiprocessing or subprocess report: runs of a helper that
ends with a known code while the user joins it from another thread (the race that made a
forkserver Process read 255). Used by the suite (a sample) and scripts/soak (1,000 runs per
start method)."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import healthkit as hk

CODES = (0, 3, -9)


def _helper(code: int) -> None:
    time.sleep(0.01)
    if code >= 0:
        os._exit(code)
    time.sleep(30)  # killed by the test


class _Recorder:
    def __init__(self) -> None:
        self.codes: list[int | None] = []
        self.done = threading.Event()

    def __call__(self, event: hk.actions.FailureEvent) -> None:
        self.codes.append(event.diagnosis.exit_code)
        self.done.set()


def one_process_run(start_method: str, code: int) -> tuple[int | None, int | None]:
    """(exitcode the user saw, code the watchdog reported or None if it did not fire)."""
    ctx = mp.get_context(start_method)
    p = ctx.Process(target=_helper, args=(code,), daemon=True)
    p.start()
    rec = _Recorder()
    wd = hk.DisarmableWatchdog(actions=[rec])
    wd.watch(p, on_clean_exit="ignore")
    wd.arm()
    seen: list[int | None] = []
    joiner = threading.Thread(target=lambda: (p.join(30), seen.append(p.exitcode)))
    joiner.start()
    if code < 0:
        os.kill(p.pid, -code)
    joiner.join(30)  # one user thread joins while the watcher collects the same exit
    if code != 0:
        rec.done.wait(10)
    wd.disarm()
    user = p.exitcode
    assert seen == [user], (seen, user)
    p.close()
    return user, (rec.codes[0] if rec.codes else None)


def one_popen_run(code: int, by_pid: bool) -> tuple[int | None, int | None]:
    argv = [sys.executable, "-c", f"import os, time; time.sleep(0.01); os._exit({code})"]
    if code < 0:
        argv = ["sleep", "30"]
    proc = subprocess.Popen(argv)
    rec = _Recorder()
    wd = hk.DisarmableWatchdog(actions=[rec])
    wd.watch(proc.pid if by_pid else proc, on_clean_exit="ignore")
    wd.arm()
    seen: list[int] = []
    joiner = threading.Thread(target=lambda: seen.append(proc.wait(30)))
    joiner.start()
    if code < 0:
        os.kill(proc.pid, -code)
    joiner.join(30)
    rc = proc.wait(30)
    if code != 0:
        rec.done.wait(10)
    wd.disarm()
    assert seen == [rc], (seen, rc)
    return rc, (rec.codes[0] if rec.codes else None)


def check(kind: str, runs: int) -> dict[str, object]:
    """Run ``runs`` per exit code; count what the user saw and what the watchdog said."""
    wrong: Counter[str] = Counter()
    unknown: Counter[int] = Counter()
    for code in CODES:
        for _ in range(runs):
            if kind in ("fork", "spawn", "forkserver"):
                user, reported = one_process_run(kind, code)
            else:
                user, reported = one_popen_run(code, by_pid=kind == "popen-pid")
            expected_report = None if code == 0 else code
            if user != code:
                wrong[f"user saw {user} for {code}"] += 1
            if reported is None and expected_report is not None and kind == "popen-pid":
                # Watched by bare pid, there is no owner object to ask: if Popen.wait()
                # reaped first, the status is unknown to the watchdog (and it only warns).
                unknown[code] += 1
            elif reported != expected_report:
                wrong[f"watchdog reported {reported} for {code}"] += 1
    return {
        "kind": kind,
        "runs_per_code": runs,
        "codes": list(CODES),
        "wrong": dict(wrong),
        "unknown_to_watchdog": dict(unknown),
    }


if __name__ == "__main__":
    runs, out = int(sys.argv[1]), sys.argv[2]
    results = []
    for kind in ("fork", "spawn", "forkserver", "popen", "popen-pid"):
        t0 = time.monotonic()
        res = check(kind, runs)
        res["seconds"] = round(time.monotonic() - t0, 1)
        results.append(res)
        print(json.dumps(res), flush=True)
    Path(out).write_text(json.dumps(results, indent=1))
    sys.exit(0 if all(not r["wrong"] for r in results) else 1)
