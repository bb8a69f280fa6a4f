"""1. Death-to-action latency: SIGKILL of a watched helper until the reaction runs.

Methods, interleaved trial by trial (each round runs every method due in it, in shuffled
order; a method with fewer trials is spread evenly over the rounds) so machine load hits
all of them alike:

- ``healthkit thread``: ``DisarmableWatchdog(mode="thread")`` with ``actions=[record]``;
  latency = CLOCK_MONOTONIC in the action minus CLOCK_MONOTONIC just before ``os.kill``.
  The main thread sleeps on an Event meanwhile. Variants: the main thread spins a
  pure-Python loop (CPU-busy), and the diagnoser's kernel-log scan is switched off
  (``ExitDiagnoser(kmsg_path=None)``).
- ``healthkit sidecar`` and ``healthkit thread (default actions)``: end to end in a real owner
  process (``tests/scripts/owner.py``): the owner forks a helper and arms the watchdog; this
  process kills the helper and times until the *owner* is dead (its pidfd is readable).
  After each sidecar trial, the evidence the sidecar reads before it stops the owner is
  timed here with the sidecar's code (a proxy, reported as one).
- ``healthkit thread, death by ...``: the same watchdog, a helper that dies every way a
  helper dies (SIGKILL, SIGSEGV, an uncaught exception, ``sys.exit(3)``, an early exit 0,
  SIGTERM sent to it alone), no stop under way; latency = CLOCK_MONOTONIC in the action minus
  the helper's last act before its death (a stamp in shared memory; see ``die_on_cue``).
- ``pidfd poll (floor)``: the killing thread itself blocks in ``poll()`` on the helper's
  pidfd, with no healthkit code between the kill and the wake-up.
- the anchors' own code, in a torch process of its own (``_torch_anchors.py``):
  torchelastic's ``start_processes`` context over one sleeping child, timed until
  ``PContext.wait(timeout, period=0.1)`` returns a failed result; and a
  ``torch.utils.data.DataLoader(num_workers=2)`` whose ``next()`` is timed until it raises
  after one of its workers is SIGKILLed.
- tzrec's server watchdog, transcribed (not tzrec's code): a thread that loops
  ``while not stop.wait(10): if proc.is_alive(): continue`` and records the death. A few
  real trials run in background threads alongside the others; it is also given
  analytically (latency uniform on (0, 10 s]).
- a generic poll loop (``time.sleep(0.1)``, then ``is_alive()``), with its analytical model.

Helpers are ``multiprocessing`` fork-started Python processes, like real helper servers.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import queue
import random
import re
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import (
    TESTS_SCRIPTS,
    Page,
    fmt_s,
    list_s,
    now_ns,
    pct_cell,
    portable_paths,
    pyplot,
    python,
    save_figure,
    sleep_forever,
    summarize,
    uniform_poll_model,
)
from _protocol import Target, Verdict, judge_percentile, judge_ratio, shown, targets_from
from _torch_anchors import GIVE_UP_S as ANCHOR_GIVE_UP_S
from _torch_anchors import ITEM_SLEEP_S

import healthkit as hk

NAME = "latency"
IMG = "bench-latency.png"
FORK = mp.get_context("fork")
OWNER = str(TESTS_SCRIPTS / "owner.py")
ANCHORS = str(Path(__file__).resolve().parent / "_torch_anchors.py")

THREAD_KEYS = {
    (False, True): "healthkit thread",
    (True, True): "healthkit thread, main thread CPU-busy",
    (False, False): "healthkit thread, kernel-log scan off",
    (True, False): "healthkit thread, kernel-log scan off, main thread CPU-busy",
}
# Every way a helper dies, no stop under way: the helper's last act before its death ->
# the action (thread mode).
DEATH_KINDS = ("sigkill", "sigsegv", "exception", "exit3", "exit0", "sigterm")
DEATH_KEYS = {
    "sigkill": "healthkit thread, death by SIGKILL",
    "sigsegv": "healthkit thread, death by SIGSEGV",
    "exception": "healthkit thread, death by an uncaught exception (exit 1)",
    "exit3": "healthkit thread, death by sys.exit(3)",
    "exit0": "healthkit thread, death by an early exit 0",
    "sigterm": "healthkit thread, death by SIGTERM to the helper alone",
}
SIDECAR_KEY = "healthkit sidecar: kill to owner dead"
THREAD_E2E_KEY = "healthkit thread (default actions): kill to owner dead"
FLOOR_KEY = "pidfd poll in the killing thread (floor)"
TORCHELASTIC_KEY = "torchelastic: PContext.wait(period=0.1) returns the failure"
DATALOADER_KEY = "torch DataLoader(num_workers=2): next() raises"
POLL01_KEY = "generic poll loop: sleep 0.1 s, then is_alive()"
TZREC_KEY = "tzrec server watchdog (transcribed): stop.wait(10), then is_alive()"
ANALYTIC_KEYS = {
    10.0: "poll every 10 s: analytical, uniform phase",
    0.1: "poll every 0.1 s: analytical, uniform phase",
}
GLT_KEY = "stock GLT (graphlearn-torch)"
GLT_DOC = "docs/benchmarks-glt.md"
GLT_ANCHOR = "#fault-matrix-per-supported-graphlearn-torch-build"

# Trials per method in a full run; every method that shows a p99 has at least 1,000.
FULL_N = {
    **{key: 1000 for key in THREAD_KEYS.values()},
    **{key: 1000 for key in DEATH_KEYS.values()},
    SIDECAR_KEY: 1000,
    THREAD_E2E_KEY: 1000,
    FLOOR_KEY: 1000,
    TORCHELASTIC_KEY: 1000,
    DATALOADER_KEY: 1000,
    POLL01_KEY: 200,
    TZREC_KEY: 5,
}
QUICK_N = {key: 20 for key in FULL_N} | {
    SIDECAR_KEY: 5,
    THREAD_E2E_KEY: 5,
    TORCHELASTIC_KEY: 5,
    DATALOADER_KEY: 5,
    POLL01_KEY: 5,
    TZREC_KEY: 1,
}

TARGETS = [
    Target(
        THREAD_KEYS[(False, True)],
        "healthkit thread: p50 < 2 ms",
        "p50",
        2e-3,
        "s",
        FULL_N[THREAD_KEYS[(False, True)]],
    ),
    Target(
        THREAD_KEYS[(False, True)],
        "healthkit thread: p99 < 10 ms",
        "p99",
        10e-3,
        "s",
        FULL_N[THREAD_KEYS[(False, True)]],
    ),
    Target(
        SIDECAR_KEY,
        "healthkit sidecar, kill to owner dead: p50 < 2 ms",
        "p50",
        2e-3,
        "s",
        FULL_N[SIDECAR_KEY],
    ),
    Target(
        SIDECAR_KEY,
        "healthkit sidecar, kill to owner dead: p99 < 10 ms",
        "p99",
        10e-3,
        "s",
        FULL_N[SIDECAR_KEY],
    ),
    # Act first, explain right after: the action does not wait for the evidence.
    Target(
        THREAD_KEYS[(False, True)],
        "healthkit thread, idle main thread: p99 < 2x the pidfd floor's p99 (same run)",
        "p99",
        2.0,
        "x",
        FULL_N[THREAD_KEYS[(False, True)]],
        relative_to=FLOOR_KEY,
    ),
    # Every kind of death is decided at once when no stop is under way: none waits more than
    # SIGKILL does (within 2x of the same run's SIGKILL p99).
    *(
        Target(
            DEATH_KEYS[kind],
            f"{DEATH_KEYS[kind]}: p99 < 2x the same run's death by SIGKILL p99",
            "p99",
            2.0,
            "x",
            1000,
            relative_to=DEATH_KEYS["sigkill"],
        )
        for kind in DEATH_KINDS
        if kind != "sigkill"
    ),
    Target(
        THREAD_KEYS[(True, True)],
        "healthkit thread, CPU-busy main thread: p99 < 30 ms",
        "p99",
        30e-3,
        "s",
        FULL_N[THREAD_KEYS[(True, True)]],
    ),
]

THREAD_GIVE_UP_S = 5.0
OWNER_GIVE_UP_S = 30.0


# ---------------------------------------------------------------------- trials
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
    wd = hk.DisarmableWatchdog([helper], actions=[record], name="bench", diagnoser=diagnoser).arm()
    time.sleep(random.uniform(0.002, 0.01))  # let the watcher block in epoll_wait
    t0 = now_ns()
    os.kill(helper.pid, signal.SIGKILL)
    if busy:
        x = 0
        give_up = time.monotonic() + THREAD_GIVE_UP_S
        while not got:
            for _ in range(1000):
                x += 1
            if time.monotonic() > give_up:
                break
    else:
        done.wait(THREAD_GIVE_UP_S)
    wd.disarm()
    _finish_helper(helper)
    if not got:
        return None
    return (got[0][0] - t0) / 1e9, got[0][1] - t0 / 1e9


class _StampOnFlush:
    """A helper's stderr whose every flush stamps the time: multiprocessing's bootstrap
    flushes the standard streams as its last act before the process exits, after the
    traceback of an uncaught exception was printed."""

    def __init__(self, stream: Any, stamp: Any) -> None:
        self._stream, self._stamp = stream, stamp

    def write(self, text: str) -> int:
        return int(self._stream.write(text))

    def flush(self) -> None:
        self._stream.flush()
        self._stamp.value = now_ns()


def die_on_cue(kind: str, stamp: Any) -> None:
    """A helper that, on SIGUSR1, dies ``kind``, stamping the time into shared memory as its
    last act: just before the crash for SIGSEGV; for a Python ending, at the last flush of
    its stderr, just before the process exits."""
    import ctypes
    import faulthandler

    def die(signum: int, frame: object) -> None:
        faulthandler.disable()  # a crash without a dump, as in production
        if kind == "sigsegv":
            stamp.value = now_ns()
            ctypes.string_at(0)
        sys.stderr = _StampOnFlush(sys.stderr, stamp)  # type: ignore[assignment]
        if kind == "exception":
            raise RuntimeError("the helper failed")
        sys.exit(3 if kind == "exit3" else 0)

    signal.signal(signal.SIGUSR1, die)
    stamp.value = -1  # ready for the cue
    time.sleep(3600)


def trial_death(kind: str) -> float | None:
    """The helper's last stamp before its death -> the watchdog's action, in seconds."""
    stamp = FORK.Value("q", 0, lock=False)
    helper = FORK.Process(target=die_on_cue, args=(kind, stamp), name="helper", daemon=True)
    helper.start()
    got: list[int] = []
    done = threading.Event()

    def record(event: hk.actions.FailureEvent) -> None:
        got.append(now_ns())
        done.set()

    wd = hk.DisarmableWatchdog([helper], actions=[record], name="bench").arm()
    ready_by = time.monotonic() + THREAD_GIVE_UP_S
    while stamp.value != -1 and time.monotonic() < ready_by:  # its handler is installed
        time.sleep(0.001)
    time.sleep(random.uniform(0.002, 0.01))  # the watcher blocked in epoll_wait
    if kind in ("sigkill", "sigterm"):
        stamp.value = now_ns()
        os.kill(helper.pid, signal.SIGKILL if kind == "sigkill" else signal.SIGTERM)
    else:
        os.kill(helper.pid, signal.SIGUSR1)
    done.wait(THREAD_GIVE_UP_S)
    wd.disarm()
    _finish_helper(helper)
    if not got or stamp.value <= 0:
        return None
    return (got[0] - stamp.value) / 1e9


def trial_pidfd_floor() -> float | None:
    helper = _start_helper()
    watch = hk.ProcessWatch(helper)
    poller = select.poll()
    poller.register(watch.fileno(), select.POLLIN)
    time.sleep(0.002)
    t0 = now_ns()
    os.kill(helper.pid, signal.SIGKILL)
    ready = poller.poll(int(THREAD_GIVE_UP_S * 1000))
    t1 = now_ns()
    watch.wait(5)
    watch.close()
    _finish_helper(helper)
    return (t1 - t0) / 1e9 if ready else None


def poll_give_up(interval: float) -> float:
    return interval * 3 + 5


def trial_poll(interval: float, tzrec: bool = False) -> float | None:
    """A poll loop with period ``interval``; the kill falls at a uniformly random phase.
    ``tzrec``: the loop of tzrec's server watchdog as written there (``stop.wait``)."""
    helper = _start_helper()
    got: list[int] = []
    stop = threading.Event()

    def generic() -> None:
        while not stop.is_set():
            time.sleep(interval)
            if not helper.is_alive():
                got.append(now_ns())
                return

    def tzrec_loop() -> None:
        while not stop.wait(interval):
            if helper.is_alive():
                continue
            got.append(now_ns())
            return

    t = threading.Thread(target=tzrec_loop if tzrec else generic, daemon=True)
    t.start()
    time.sleep(random.uniform(0.0, interval))
    t0 = now_ns()
    os.kill(helper.pid, signal.SIGKILL)
    t.join(poll_give_up(interval))
    stop.set()
    t.join(interval + 5)
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
            info["helper"] = helper
            pidfd = os.pidfd_open(p.pid)
            time.sleep(random.uniform(0.005, 0.02))
            t0 = now_ns()
            os.kill(helper, signal.SIGKILL)
            ready = select.select([pidfd], [], [], OWNER_GIVE_UP_S)[0]
            t1 = now_ns()
            os.close(pidfd)
            p.wait(30)
            info["returncode"] = p.returncode
            err.seek(0)
            text = err.read().decode("utf-8", "replace")
            info["logged"] = "killed by SIGKILL" in text
            if info["logged"]:
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


def evidence_cost(helper: int) -> tuple[float, float]:
    """(full, brief) seconds: what the sidecar's diagnosis of the helper it saw killed costs,
    timed here with the sidecar's code (a fresh ``ExitDiagnoser``, as each sidecar has) right
    after the trial. A proxy: the sidecar's own read runs in the sidecar."""
    diagnoser = hk.ExitDiagnoser()
    t0 = time.perf_counter()
    diagnoser.diagnose(-signal.SIGKILL, name="helper", pid=helper)
    t1 = time.perf_counter()
    diagnoser.diagnose(-signal.SIGKILL, name="helper", pid=helper, evidence=False)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1


class AnchorStuck(RuntimeError):
    """The anchors process did not report a trial in time (the anchor itself hung)."""


class TorchAnchors:
    """The client of ``_torch_anchors.py``: one trial of torchelastic or DataLoader at a time.

    The pids the server reports are followed by pidfds, so that whatever happens the
    children it started for the current trial can be SIGKILLed by pid without a reuse race.
    An anchor that never reports the death (the anchor hung) is a failed trial: its stacks
    are kept, the process and its children are killed, and a new one takes over.
    """

    def __init__(self) -> None:
        self._start()

    def _start(self) -> None:
        self._err = tempfile.TemporaryFile()  # noqa: SIM115 (closed in close())
        self.proc = subprocess.Popen(
            [python(), ANCHORS],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._err,
            text=True,
            bufsize=1,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        self._lines: queue.Queue[str] = queue.Queue()
        self._reader = threading.Thread(target=self._read_all, daemon=True)
        self._reader.start()
        self._pidfds: list[int] = []
        self._read(180)  # {"ready": true} once torch is imported

    def _read_all(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put("")

    def _read(self, timeout: float) -> dict[str, Any]:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise AnchorStuck(f"the torch anchors process said nothing in {timeout:g} s") from None
        if not line:
            self._err.seek(0)
            tail = self._err.read().decode("utf-8", "replace")[-2000:]
            raise RuntimeError(f"the torch anchors process ended:\n{tail}")
        msg: dict[str, Any] = json.loads(line)
        return msg

    def trial(self, kind: str) -> tuple[float | None, dict[str, Any]]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(kind + "\n")
        self.proc.stdin.flush()
        try:
            pids: list[int] = self._read(120)["pids"]
        except AnchorStuck:
            return None, {"stuck": self._restart()}
        self._pidfds = [os.pidfd_open(p) for p in pids]
        # torchelastic: the kill falls at a random phase of the 0.1 s poll
        time.sleep(
            random.uniform(0.05, 0.15) if kind == "torchelastic" else random.uniform(0.005, 0.02)
        )
        victim = random.choice(pids)
        t0 = now_ns()
        os.kill(victim, signal.SIGKILL)
        try:
            result = self._read(ANCHOR_GIVE_UP_S + 60)
            left: list[int] = self._read(60)["left"]
        except AnchorStuck:
            return None, {"stuck": self._restart()}
        self._release()
        t1 = result.pop("t1_ns")
        return ((t1 - t0) / 1e9 if t1 is not None else None), {**result, "left": len(left)}

    def _release(self, kill: bool = False) -> None:
        for fd in self._pidfds:
            if kill:
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
            os.close(fd)
        self._pidfds = []

    def _restart(self) -> str:
        """Kill a stuck anchors process (after asking it for its stacks) and start a new
        one; returns the end of its stderr, stacks included."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGUSR1)  # faulthandler: every thread's stack
        time.sleep(1.0)
        self._err.seek(0)
        tail = portable_paths(self._err.read().decode("utf-8", "replace")[-3000:])
        self.proc.kill()
        self.proc.wait()
        self._release(kill=True)
        self._reader.join(10)
        self._err.close()
        self._start()
        return tail

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            assert self.proc.stdin is not None
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._release(kill=True)  # children of an interrupted trial, if any
        self._reader.join(10)
        self._err.close()


# ---------------------------------------------------------------------- run
def _rounds(counts: dict[str, int]) -> list[list[str]]:
    """Each method's trials spread evenly over max(counts) rounds."""
    total = max(counts.values())
    rounds: list[list[str]] = [[] for _ in range(total)]
    for name, c in counts.items():
        for r in range(total):
            if (r + 1) * c // total > r * c // total:
                rounds[r].append(name)
    return rounds


def run(quick: bool) -> dict[str, Any]:
    counts = QUICK_N if quick else FULL_N
    samples: dict[str, list[float]] = {}
    detect: dict[str, list[float]] = {}
    failures: dict[str, int] = {}
    give_up: dict[str, float] = {}
    extra: dict[str, Any] = {
        "owner_returncodes": {},
        "owner_logged": {},
        "sample_log": {},
        "anchor_errors": {},
        "anchor_exitcodes": {},
        "anchor_left": {},
        "anchor_stuck": {},
        "sidecar_evidence_s": [],
    }

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
            if mode == "sidecar" and "helper" in info:
                extra["sidecar_evidence_s"].append(evidence_cost(info["helper"]))
            extra["owner_returncodes"].setdefault(key, []).append(info.get("returncode"))
            extra["owner_logged"].setdefault(key, []).append(bool(info.get("logged")))
            if info.get("sample_log"):
                extra["sample_log"].setdefault(key, info["sample_log"])
            return lat

        return f

    anchors = TorchAnchors()

    def anchor(kind: str, key: str) -> Callable[[], float | None]:
        def f() -> float | None:
            lat, info = anchors.trial(kind)
            if "stuck" in info:
                extra["anchor_stuck"].setdefault(key, []).append(info["stuck"])
                return None
            if info.get("error"):
                err = re.sub(r"\d+", "N", info["error"])
                extra["anchor_errors"].setdefault(key, []).append(err)
            if "exitcode" in info:
                extra["anchor_exitcodes"].setdefault(key, []).append(info["exitcode"])
            extra["anchor_left"][key] = extra["anchor_left"].get(key, 0) + info["left"]
            return lat

        return f

    methods: dict[str, Callable[[], float | None]] = {}
    for (busy, kmsg), key in THREAD_KEYS.items():
        methods[key] = thread(busy, kmsg, key)
        give_up[key] = THREAD_GIVE_UP_S
    for kind, key in DEATH_KEYS.items():
        methods[key] = lambda kind=kind: trial_death(kind)  # type: ignore[misc]
        give_up[key] = THREAD_GIVE_UP_S
    methods[SIDECAR_KEY] = owner("sidecar", SIDECAR_KEY)
    methods[THREAD_E2E_KEY] = owner("thread", THREAD_E2E_KEY)
    methods[FLOOR_KEY] = trial_pidfd_floor
    methods[TORCHELASTIC_KEY] = anchor("torchelastic", TORCHELASTIC_KEY)
    methods[DATALOADER_KEY] = anchor("dataloader", DATALOADER_KEY)
    methods[POLL01_KEY] = lambda: trial_poll(0.1)
    give_up |= {
        SIDECAR_KEY: OWNER_GIVE_UP_S,
        THREAD_E2E_KEY: OWNER_GIVE_UP_S,
        FLOOR_KEY: THREAD_GIVE_UP_S,
        TORCHELASTIC_KEY: ANCHOR_GIVE_UP_S,
        DATALOADER_KEY: ANCHOR_GIVE_UP_S,
        POLL01_KEY: poll_give_up(0.1),
        TZREC_KEY: poll_give_up(10.0),
    }

    # tzrec's 10 s loop: a few trials, each in its own thread, alongside the others
    slow: list[float | None] = []
    slow_threads = [
        threading.Thread(target=lambda: slow.append(trial_poll(10.0, tzrec=True)), daemon=True)
        for _ in range(counts[TZREC_KEY])
    ]
    for t in slow_threads:
        t.start()
    try:
        for due in _rounds({k: counts[k] for k in methods}):
            random.shuffle(due)
            for name in due:
                lat = methods[name]()
                if lat is None:
                    failures[name] = failures.get(name, 0) + 1
                else:
                    samples.setdefault(name, []).append(lat)
    finally:
        anchors.close()
        for t in slow_threads:
            t.join(poll_give_up(10.0) + 15)
    samples[TZREC_KEY] = [v for v in slow if v is not None]
    failures[TZREC_KEY] = sum(v is None for v in slow)

    rows: dict[str, Any] = {name: summarize(vals) for name, vals in samples.items()}
    for interval, key in ANALYTIC_KEYS.items():
        rows[key] = uniform_poll_model(interval)
    return {
        "counts": counts,
        "rows": rows,
        "samples": samples,
        "detect": detect,
        "failures": failures,
        "give_up_s": give_up,
        "extra": extra,
        "switch_interval_s": sys.getswitchinterval(),
        "item_sleep_s": ITEM_SLEEP_S,
    }


# ---------------------------------------------------------------------- verdicts
def _gave_up(lat: dict[str, Any], key: str) -> list[float]:
    return [lat["give_up_s"][key]] * lat["failures"].get(key, 0)


def verdicts(lat: dict[str, Any], entry: dict[str, Any], quick: bool) -> list[Verdict]:
    samples = lat["samples"]
    return [
        judge_ratio(
            t, samples.get(t.key, []), samples.get(t.relative_to, []), quick, fmt_s,
            _gave_up(lat, t.key),
        )
        if t.relative_to
        else judge_percentile(t, samples.get(t.key, []), quick, fmt_s, _gave_up(lat, t.key))
        for t in targets_from(entry, TARGETS)
    ]  # fmt: skip


# ---------------------------------------------------------------------- plot
def plot(lat: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    samples: dict[str, list[float]] = lat["samples"]
    names = [n for n in samples if samples[n]]
    names.sort(key=lambda n: sorted(samples[n])[len(samples[n]) // 2])
    fig, ax = plt.subplots(figsize=(10, 0.55 * len(names) + 1.8))
    data = [[v * 1e3 for v in samples[n]] for n in names]
    ax.boxplot(
        data, vert=False, whis=(10, 90), showfliers=True, widths=0.6, flierprops={"markersize": 2}
    )
    ax.set_yticks(
        range(1, len(names) + 1), [f"{n} (n={len(samples[n])})" for n in names], fontsize=8
    )
    ax.set_xscale("log")
    ax.set_xlabel(
        "SIGKILL of the helper → reaction (ms, log scale)\n"
        "box p25-p75, whiskers p10-p90, dots: every trial beyond the whiskers"
    )
    for i, t in enumerate(sorted({(t.limit, t.statistic) for t in TARGETS if t.unit == "s"})):
        ax.axvline(
            t[0] * 1e3, color=f"C{3 + i}", ls=":", lw=1, label=f"target: {t[1]} < {fmt_s(t[0])}"
        )
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title("1. Death-to-action latency")
    ax.grid(axis="x", which="both", alpha=0.3)
    save_figure(fig, path)


# ---------------------------------------------------------------------- markdown
def _table(lat: dict[str, Any], page: Page) -> list[str]:
    samples: dict[str, list[float]] = lat["samples"]
    detect: dict[str, list[float]] = lat.get("detect", {})
    out = [
        "| method | trials | given up | p50 | p90 | p99 | max | detection p50 | "
        "action - detection p50 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    measured = sorted(
        (k for k in samples if samples[k]), key=lambda k: sorted(samples[k])[len(samples[k]) // 2]
    )
    for name in measured:
        vals = samples[name]
        failed = lat["failures"].get(name, 0)
        det = detect.get(name, [])
        phase = [a - d for a, d in zip(vals, det, strict=False)] if det else []
        if shown(len(vals), 0.5):
            cells = [pct_cell(vals, q) for q in (0.5, 0.9, 0.99)]
        else:  # too few for percentiles: every value
            cells = [f"values: {list_s(vals)}", "", ""]
        out.append(
            f"| {name} | {len(vals) + failed} | {failed} | {' | '.join(cells)} | "
            f"{fmt_s(max(vals))} | {pct_cell(det, 0.5) if det else ''} | "
            f"{pct_cell(phase, 0.5) if phase else ''} |"
        )
    for name in samples:
        if not samples[name]:
            out.append(
                f"| {name} | {lat['failures'].get(name, 0)} | "
                f"{lat['failures'].get(name, 0)} | | | | | | |"
            )
    for key in ANALYTIC_KEYS.values():
        r = lat["rows"][key]
        out.append(
            f"| {key} | analytical | | {fmt_s(r['p50'])} | {fmt_s(r['p90'])} | "
            f"{fmt_s(r['p99'])} | {fmt_s(r['max'])} | | |"
        )
    glt = page.link(GLT_DOC) + GLT_ANCHOR
    out.append(
        f"| {GLT_KEY} | not measured here | | never (see the [GLT fault runs]({glt})) | | | | | |"
    )
    return out


def _summary(lat: dict[str, Any]) -> list[str]:
    """Sentences computed from this run's samples."""
    import numpy as np

    samples = {k: v for k, v in lat["samples"].items() if v}
    out: list[str] = []

    def p(k: str, q: float) -> float:
        return float(np.percentile(samples[k], q * 100))

    by50 = sorted((k for k in samples if shown(len(samples[k]), 0.5)), key=lambda k: p(k, 0.5))
    if len(by50) >= 2:
        out.append(
            f"Lowest p50 in this run: {by50[0]} ({fmt_s(p(by50[0], 0.5))}); highest: "
            f"{by50[-1]} ({fmt_s(p(by50[-1], 0.5))})."
        )
    by99 = sorted((k for k in samples if shown(len(samples[k]), 0.99)), key=lambda k: p(k, 0.99))
    if len(by99) >= 2:
        out.append(
            f"Of the {len(by99)} methods with enough trials for a p99, the slowest was "
            f"{by99[-1]} at p99 {fmt_s(p(by99[-1], 0.99))}, the fastest {by99[0]} at "
            f"{fmt_s(p(by99[0], 0.99))}."
        )
    given_up = {k: v for k, v in lat["failures"].items() if v}
    out.append(
        "Trials given up (no reaction within the method's limit): "
        + (", ".join(f"{k}: {v}" for k, v in given_up.items()) if given_up else "none")
        + "."
    )
    return out


def _sidecar_order(lat: dict[str, Any]) -> list[str]:
    """Why the sidecar reads the evidence before it stops the owner, with what that costs."""
    costs = lat["extra"].get("sidecar_evidence_s", [])
    sidecar = lat["samples"].get(SIDECAR_KEY, [])
    if not costs or not sidecar:
        return []
    import numpy as np

    full = [c[0] for c in costs]
    brief = [c[1] for c in costs]
    gain = float(np.median(full) - np.median(brief))
    p50 = float(np.median(sidecar))
    limit = next(t.limit for t in TARGETS if t.key == SIDECAR_KEY and t.statistic == "p50")
    verdict = "still over" if p50 - gain >= limit else "under"
    return [
        "- *the sidecar's order*: it reads the evidence (kernel log, cgroup files) and writes "
        "the log line and the error file before it stops the owner, because torchrun's agent "
        "reads the error file at its first check after the owner died (by default every 5 s "
        "in torch 2.3, every 0.1 s in torch 2.8: either way that can come at any moment); "
        "the thread's default actions keep the same order (`exit_process` runs after the "
        "error file). The sidecar is a process of its own, so a busy owner's GIL does not "
        "slow that read. What the read costs, timed in this process with a fresh "
        "`ExitDiagnoser` on the killed helper after each sidecar trial (a proxy for the "
        f"sidecar's own read), over {len(costs)} trials: full diagnosis p50 "
        f"{fmt_s(float(np.median(full)))}, p99 {pct_cell(full, 0.99)}; brief (exit status "
        f"only) p50 {fmt_s(float(np.median(brief)))}. Stopping the owner first would save "
        f"about {fmt_s(gain)} at p50: the sidecar's p50 of {fmt_s(p50)} would be about "
        f"{fmt_s(p50 - gain)}, {verdict} the {fmt_s(limit)} target, and the error file could "
        "then come after torchrun had read it, losing the root cause from its summary."
    ]


def markdown(lat: dict[str, Any], page: Page) -> list[str]:
    L = ["## 1. Death-to-action latency", ""]
    L.append(
        "A watched helper (a fork-started `multiprocessing.Process`, or the anchor's own "
        "child) is SIGKILLed; latency is CLOCK_MONOTONIC when the reaction ran minus "
        "CLOCK_MONOTONIC just before `os.kill`. Methods were interleaved trial by trial "
        "in shuffled order. *Detection* is when the watcher had collected the exit "
        "status (`Diagnosis.observed_at`), before the diagnosis and the action; "
        "*action - detection* is the same trial's difference of the two. *Given up*: "
        "trials with no reaction within the method's limit; they count in the verdicts "
        "at that limit. A percentile is printed only with at least 10 trials beyond it; "
        "rows with fewer than 20 trials list every value."
    )
    L.append("")
    L += _table(lat, page)
    L.append("")
    L += [*_summary(lat), ""]
    L.append("How each method is timed:")
    L.append("")
    L.append(
        '- *healthkit thread*: `DisarmableWatchdog(mode="thread", actions=[record])`, '
        "the main thread idle in `Event.wait`. *main thread CPU-busy*: the main thread "
        "spins a pure-Python loop meanwhile (switch interval "
        f"{lat['switch_interval_s'] * 1e3:g} ms). *kernel-log scan off*: the same with "
        "`ExitDiagnoser(kmsg_path=None)`."
    )
    L.append(
        "- *death by ...*: the same watchdog; the helper dies every way a helper dies, with no "
        "stop under way. The clock starts at the helper's last act before its death, a stamp "
        "in shared memory: for SIGKILL and SIGTERM, written by the killing thread just before "
        "`os.kill`; for SIGSEGV, by the helper just before it dereferences NULL; for an "
        "exception, `sys.exit(3)` and an early exit 0, at the last flush of the helper's "
        "stderr, which `multiprocessing`'s bootstrap makes after the target ended (the "
        "traceback already printed), just before the process exits."
    )
    rc = lat["extra"]["owner_returncodes"]
    logged = lat["extra"]["owner_logged"]
    for key, mode in ((SIDECAR_KEY, "sidecar"), (THREAD_E2E_KEY, "thread")):
        if key in rc:
            codes = ", ".join(sorted({str(c) for c in rc[key]}))
            L.append(
                f"- *{key}*: a real owner process (`tests/scripts/owner.py idle --mode "
                f"{mode} --helpers 1`) owns the helper; this process kills the helper "
                "and times until the owner is dead (its pidfd fires). Owner exit codes "
                f"seen: {codes}; the diagnosis was logged in {sum(logged[key])}/"
                f"{len(logged[key])} runs."
            )
    L += _sidecar_order(lat)
    if lat["extra"].get("sample_log"):
        sample = next(iter(lat["extra"]["sample_log"].values()))
        L.append(f"- a logged line: `{sample[:300]}`")
    L.append("- *floor*: the killing thread itself blocks in `poll()` on the helper's pidfd.")
    ex = lat["extra"]
    te_codes = ", ".join(sorted({str(c) for c in ex["anchor_exitcodes"].get(TORCHELASTIC_KEY, [])}))
    L.append(
        f"- *torchelastic*: `torch.distributed.elastic.multiprocessing.start_processes` "
        "(a binary entrypoint, as torchrun's agent starts its workers: "
        "`python -c 'time.sleep(3600)'`, logs into a temporary directory removed after "
        "each trial), then `PContext.wait(timeout=30, period=0.1)` (0.1 s: the agent's "
        "monitor interval) until it returns a failed `RunProcsResult`; the kill comes "
        "50-150 ms after the context reported its child's pid. Failure exit codes reported: "
        f"{te_codes or 'none'}."
    )
    errors = Counter(ex["anchor_errors"].get(DATALOADER_KEY, []))
    seen = "; ".join(f"`{e}` ({c})" for e, c in errors.most_common(3)) or "none"
    L.append(
        f"- *DataLoader*: `torch.utils.data.DataLoader(dataset, num_workers=2, "
        f"batch_size=1, collate_fn=plain)` over a dataset whose `__getitem__` sleeps "
        f"{lat.get('item_sleep_s', 0.01) * 1e3:g} ms (`plain` keeps each batch a Python "
        "list, so no worker opens the descriptor-passing listener whose directory a "
        "SIGKILL would leave in /tmp); the main thread calls `next(it)` in "
        "a loop, one worker (a pid from `it._workers`) is SIGKILLed, and the time runs "
        f"until `next(it)` raises. Exceptions seen (digits as N): {seen}."
    )
    left = sum(ex["anchor_left"].values())
    for key, stacks in ex.get("anchor_stuck", {}).items():
        L.append(
            f"- *{key}*: {len(stacks)} trial(s) in which the anchor itself never reported "
            f"the death within {ANCHOR_GIVE_UP_S + 60:g} s (counted as given up); the "
            "anchors process was killed and restarted. Its stacks, first case, end:\n\n"
            "  ```\n"
            + "\n".join("  " + ln for ln in stacks[0].strip().splitlines()[-25:])
            + "\n  ```"
        )
    L.append(
        f"- Both torch anchors run in a separate torch process (`_torch_anchors.py`) so "
        "that the helpers forked for the other methods do not carry torch; children "
        f"of theirs still alive after a trial's clean-up: {left}."
    )
    L.append(
        "- *tzrec server watchdog (transcribed)*: the loop of tzrec's sampler-server "
        "watchdog as quoted in [graphlearn.md]("
        f"{page.link('docs/graphlearn.md')}#migrating-torcheasyrec), re-typed here (a "
        "transcription, not tzrec's code): `while not stop.wait(10): if proc.is_alive(): "
        "continue`, then the death is recorded. Its real trials ran in background "
        "threads alongside the others. *Analytical* rows: a poll with period T and a "
        "death at a uniformly random phase has latency uniform on (0, T]."
    )
    L.append(
        "- *generic poll loop*: `time.sleep(0.1)`, then `Process.is_alive()`; not any "
        "particular project's code."
    )
    L.append(f"- *{GLT_KEY}*: a text row, not a measurement here; see the GLT fault runs.")
    if page.img:
        L += ["", f"![latency]({page.img})"]
    L.append("")
    return L
