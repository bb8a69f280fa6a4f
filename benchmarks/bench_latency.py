"""1. Death-to-action latency: SIGKILL of a watched helper until the reaction runs.

Methods, interleaved trial by trial (round robin in shuffled order) so machine load hits
all of them alike:

- ``healthkit thread``: ``DisarmableWatchdog(mode="thread")`` with ``actions=[call(record)]``;
  latency = CLOCK_MONOTONIC in the action minus CLOCK_MONOTONIC just before ``os.kill``.
  The main thread sleeps on an Event meanwhile (it does not hold the GIL).
- ``healthkit thread, main thread CPU-busy``: the same, while the main thread spins a
  pure-Python loop, so the watcher must win the GIL back (CPython's switch interval, 5 ms).
- ``healthkit sidecar`` and ``healthkit thread (default actions)``: end to end in a real owner
  process (``tests/scripts/owner.py``): the owner forks a helper and arms the watchdog; this
  process kills the helper and times until the *owner* is dead (its pidfd is readable). The
  sidecar's action is fixed (log, error file, SIGTERM the owner); the thread mode's default
  is log, error file, ``os._exit(1)``. Both include the owner's own death.
- ``pidfd poll (floor)``: the killing thread itself blocks in ``poll()`` on the helper's
  pidfd: what the kernel gives, with no thread hand-off.
- polling baselines: a loop that sleeps T and then calls ``Process.is_alive()``:
  T = 0.1 s (torchelastic's agent monitor interval), T = 10 s (tzrec's server watchdog),
  and GLT/DataLoader's ``queue.get(timeout=MP_STATUS_CHECK_INTERVAL=5 s)`` followed by
  ``is_alive()``. The kill falls at a uniformly random phase of the poll. The 10 s and 5 s
  ones run only a few trials (in background threads, alongside the others) and are also
  given analytically: latency is uniform on (0, T], mean T/2.

Helpers are ``multiprocessing`` fork-started Python processes, like real helper servers.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import queue
import random
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from _common import TESTS_SCRIPTS, now_ns, python, sleep_forever, summarize, uniform_poll_model

import healthkit as hk

FORK = mp.get_context("fork")
OWNER = str(TESTS_SCRIPTS / "owner.py")


def _start_helper() -> Any:
    p = FORK.Process(target=sleep_forever, name="helper", daemon=True)
    p.start()
    return p


def _finish_helper(p: Any) -> None:
    if p.is_alive():
        p.kill()
    p.join()
    p.close()


def trial_thread(busy: bool = False, kmsg: bool = True) -> tuple[float, float] | None:
    """(death-to-action, death-to-detection) seconds, or None if the action never ran."""
    helper = _start_helper()
    got: list[tuple[int, float]] = []
    done = threading.Event()

    def record(event: hk.actions.FailureEvent) -> None:
        got.append((now_ns(), event.diagnosis.observed_at))
        done.set()

    diagnoser = hk.ExitDiagnoser() if kmsg else hk.ExitDiagnoser(kmsg_path=None)
    wd = hk.DisarmableWatchdog(
        [helper], actions=[record], name="bench", diagnoser=diagnoser
    ).arm()
    time.sleep(random.uniform(0.002, 0.01))  # let the watcher block in epoll_wait
    t0 = now_ns()
    os.kill(helper.pid, signal.SIGKILL)
    if busy:
        x = 0
        give_up = time.monotonic() + 5
        while not got:
            for _ in range(1000):
                x += 1
            if time.monotonic() > give_up:
                break
    else:
        done.wait(5)
    wd.disarm()
    _finish_helper(helper)
    if not got:
        return None
    return (got[0][0] - t0) / 1e9, got[0][1] - t0 / 1e9


def trial_pidfd_floor() -> float | None:
    helper = _start_helper()
    watch = hk.ProcessWatch(helper)
    poller = select.poll()
    poller.register(watch.fileno(), select.POLLIN)
    time.sleep(0.002)
    t0 = now_ns()
    os.kill(helper.pid, signal.SIGKILL)
    ready = poller.poll(5000)
    t1 = now_ns()
    watch.wait(5)
    watch.close()
    _finish_helper(helper)
    return (t1 - t0) / 1e9 if ready else None


def trial_poll(interval: float, via_queue: bool = False) -> float | None:
    """A poll loop with period ``interval``; kill at a uniformly random phase."""
    helper = _start_helper()
    got: list[int] = []
    stop = threading.Event()
    q: Any = FORK.Queue() if via_queue else None  # an mp queue, as in GLT / DataLoader

    def loop() -> None:
        while not stop.is_set():
            if q is not None:
                # GLT / DataLoader: wait for data with a timeout, check liveness on timeout
                with contextlib.suppress(queue.Empty):
                    q.get(timeout=interval)
            else:
                time.sleep(interval)  # torchelastic: sleep(monitor_interval); tzrec: wait(10)
            if not helper.is_alive():
                got.append(now_ns())
                return

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    time.sleep(random.uniform(0.0, interval))
    t0 = now_ns()
    os.kill(helper.pid, signal.SIGKILL)
    t.join(interval * 3 + 5)
    stop.set()
    if q is not None:
        q.close()
    _finish_helper(helper)
    return (got[0] - t0) / 1e9 if got else None


def trial_owner(mode: str) -> tuple[float | None, dict[str, Any]]:
    """Kill the helper of a real owner process; time until the owner is dead."""
    with tempfile.TemporaryFile() as err:
        p = subprocess.Popen(
            [python(), OWNER, "idle", "--mode", mode, "--helpers", "1"],
            stdout=subprocess.PIPE,
            stderr=err,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        info: dict[str, Any] = {}
        try:
            assert p.stdout is not None
            if not select.select([p.stdout], [], [], 60)[0]:
                raise RuntimeError("owner did not start")
            line = p.stdout.readline().split()
            if not line or line[0] != "READY":
                raise RuntimeError(f"owner said {line!r}")
            helper = int(line[1])
            pidfd = os.pidfd_open(p.pid)
            time.sleep(random.uniform(0.005, 0.02))
            t0 = now_ns()
            os.kill(helper, signal.SIGKILL)
            ready = select.select([pidfd], [], [], 30)[0]
            t1 = now_ns()
            os.close(pidfd)
            p.wait(30)
            info["returncode"] = p.returncode
            err.seek(0)
            text = err.read().decode("utf-8", "replace")
            info["logged"] = "killed by SIGKILL" in text
            if info["logged"] and "sample_log" not in info:
                info["sample_log"] = next(
                    (ln for ln in text.splitlines() if "killed by SIGKILL" in ln), ""
                )
            return ((t1 - t0) / 1e9 if ready else None), info
        finally:
            if p.returncode is None:
                p.kill()
                p.wait()
            # the sidecar (or anything else the owner left) is in the session we created
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)


def run(quick: bool) -> dict[str, Any]:
    n_fast = 20 if quick else 200
    n_owner = 5 if quick else 200
    n_slow = 1 if quick else 5
    samples: dict[str, list[float]] = {}
    detect: dict[str, list[float]] = {}
    failures: dict[str, int] = {}
    extra: dict[str, Any] = {"owner_returncodes": {}, "owner_logged": {}, "sample_log": {}}

    def thread(busy: bool, kmsg: bool, key: str) -> Callable[[], float | None]:
        def f() -> float | None:
            r = trial_thread(busy, kmsg)
            if r is None:
                return None
            detect.setdefault(key, []).append(r[1])
            return r[0]

        return f

    def owner(mode: str, key: str) -> Callable[[], float | None]:
        def f() -> float | None:
            lat, info = trial_owner(mode)
            extra["owner_returncodes"].setdefault(key, []).append(info.get("returncode"))
            extra["owner_logged"].setdefault(key, []).append(bool(info.get("logged")))
            if info.get("sample_log"):
                extra["sample_log"].setdefault(key, info["sample_log"])
            return lat

        return f

    methods: dict[str, tuple[int, Callable[[], float | None]]] = {}
    for busy in (False, True):
        for kmsg in (True, False):
            key = THREAD_KEYS[(busy, kmsg)]
            methods[key] = (n_fast, thread(busy, kmsg, key))
    methods[SIDECAR_KEY] = (n_owner, owner("sidecar", SIDECAR_KEY))
    methods[THREAD_E2E_KEY] = (n_owner, owner("thread", THREAD_E2E_KEY))
    methods[FLOOR_KEY] = (n_fast, trial_pidfd_floor)
    methods[POLL01_KEY] = (n_fast, lambda: trial_poll(0.1))

    # Slow polls: a few trials, each in its own thread, running alongside the others.
    slow: dict[str, list[float | None]] = {}
    slow_specs = {POLL10_KEY: (10.0, False), POLL5_KEY: (5.0, True)}
    slow_threads = []
    for name, (interval, via_queue) in slow_specs.items():
        slow[name] = []
        for _ in range(n_slow):

            def go(n: str = name, i: float = interval, v: bool = via_queue) -> None:
                slow[n].append(trial_poll(i, v))

            t = threading.Thread(target=go, daemon=True)
            t.start()
            slow_threads.append(t)

    rounds = max(n for n, _ in methods.values())
    names = list(methods)
    for i in range(rounds):
        random.shuffle(names)
        for name in names:
            count, fn = methods[name]
            if i >= count:
                continue
            lat = fn()
            if lat is None:
                failures[name] = failures.get(name, 0) + 1
            else:
                samples.setdefault(name, []).append(lat)
    for t in slow_threads:
        t.join(60)
    for name, vals in slow.items():
        samples[name] = [v for v in vals if v is not None]
        failures[name] = sum(v is None for v in vals)

    rows: dict[str, Any] = {name: summarize(vals) for name, vals in samples.items()}
    for name, vals in detect.items():
        rows[name]["detect"] = summarize(vals)
    rows[ANALYTIC_KEYS[10.0]] = uniform_poll_model(10.0)
    rows[ANALYTIC_KEYS[5.0]] = uniform_poll_model(5.0)
    rows[ANALYTIC_KEYS[0.1]] = uniform_poll_model(0.1)
    return {
        "rows": rows,
        "samples": samples,
        "failures": failures,
        "extra": extra,
        "switch_interval_s": sys.getswitchinterval(),
        "kmsg_records": _kmsg_records(),
    }


def _kmsg_records() -> int | None:
    log = hk.ExitDiagnoser().kernel_log
    records = log.records() if log is not None else None
    return None if records is None else sum(1 for _ in records)


THREAD_KEYS = {
    (False, True): "healthkit thread",
    (True, True): "healthkit thread, main thread CPU-busy",
    (False, False): "healthkit thread, kernel-log scan off",
    (True, False): "healthkit thread, kernel-log scan off, main thread CPU-busy",
}
SIDECAR_KEY = "healthkit sidecar: kill to owner dead"
THREAD_E2E_KEY = "healthkit thread (default actions): kill to owner dead"
FLOOR_KEY = "pidfd poll in the killing thread (floor)"
POLL01_KEY = "poll is_alive() every 0.1 s (torchelastic agent)"
POLL10_KEY = "poll is_alive() every 10 s (tzrec watchdog)"
POLL5_KEY = "queue.get(timeout=5 s) + is_alive() (GLT / DataLoader)"
ANALYTIC_KEYS = {
    10.0: "poll every 10 s: analytical, uniform phase",
    5.0: "poll every 5 s: analytical, uniform phase",
    0.1: "poll every 0.1 s: analytical, uniform phase",
}
