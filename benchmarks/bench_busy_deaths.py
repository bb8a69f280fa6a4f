"""Death-to-action latency in an owner whose main thread is CPU-busy, by how the helper dies.

No stop under way. The clock starts at the helper's last act before its death (the stamps of
``bench_latency.py``'s "death by ..." rows: written by the killer just before ``os.kill`` for
SIGKILL and SIGTERM, at the helper's last stderr flush for an exception, ``sys.exit(3)`` and
an early exit 0) and the owner's main thread spins a pure-Python loop meanwhile, so each GIL
hand-over the watcher thread needs waits for the interpreter's switch interval (5 ms).

- *thread*: ``DisarmableWatchdog(mode="thread", actions=[record])``; the clock stops in
  ``record``. One owner process per healthkit tree runs the trials it is sent.
- *sidecar*: a fresh owner process per trial (``mode="sidecar"``, the default actions); the
  clock stops when the owner is dead (its pidfd fires): the sidecar has logged, written the
  error file and stopped it.
- *idle*: the same, the owner's main thread asleep.

Trials are interleaved (each round runs every kind of every row in shuffled order), so load
hits all rows alike. ``--baseline DIR`` adds the same rows for another healthkit tree (e.g.
``git archive <commit> healthkit | tar -x -C DIR``), measured in the same rounds.

``python benchmarks/bench_busy_deaths.py [--trials N] [--sidecar-trials M]
[--baseline DIR] [--out OUT.json]``: prints p50/p99 (ms) per row and kind, and each kind's
p99 over the same row's SIGKILL p99.

``python benchmarks/bench_busy_deaths.py --reads [N]``: one ``/proc/<pid>/stat`` read from a
second thread while the main thread spins, through Python's ``open()`` and through
``healthkit._os.proc.read_small`` (libc, the GIL kept), interleaved, N of each.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import random
import select
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_latency import FORK, THREAD_GIVE_UP_S, _finish_helper, die_on_cue, now_ns  # noqa: E402

import healthkit as hk  # noqa: E402

KINDS = ("sigkill", "exception", "exit3", "exit0", "sigterm")
OWNER_GIVE_UP_S = 30.0


def spin_until(done: Any, give_up: float) -> None:
    """The main thread CPU-busy in pure Python until ``done()`` or ``give_up``."""
    x = 0
    while not done() and time.monotonic() < give_up:
        for _ in range(1000):
            x += 1


def trial(kind: str, busy: bool = True) -> float | None:
    """Thread mode, in this process: the helper's last act -> the action, seconds."""
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
    while stamp.value != -1 and time.monotonic() < ready_by:
        time.sleep(0.001)
    time.sleep(random.uniform(0.002, 0.01))
    if kind in ("sigkill", "sigterm"):
        stamp.value = now_ns()
        os.kill(helper.pid, signal.SIGKILL if kind == "sigkill" else signal.SIGTERM)
    else:
        os.kill(helper.pid, signal.SIGUSR1)
    give_up = time.monotonic() + THREAD_GIVE_UP_S
    if busy:
        spin_until(lambda: bool(got), give_up)
    else:
        done.wait(THREAD_GIVE_UP_S)
    wd.disarm()
    _finish_helper(helper)
    if not got or stamp.value <= 0:
        return None
    return (got[0] - stamp.value) / 1e9


def worker() -> int:
    """Thread-mode trials on request: one line "KIND busy|idle" in, one latency (or -) out."""
    print("WORKER", hk.__file__, flush=True)
    for line in sys.stdin:
        kind, how = line.split()
        lat = trial(kind, busy=how == "busy")
        print("-" if lat is None else repr(lat), flush=True)
    return 0


class Stamp:
    """An int64 in a shared file: the stamp, seen by the helper, its owner and the bench."""

    def __init__(self, path: str) -> None:
        fd = os.open(path, os.O_RDWR)
        try:
            self._map = mmap.mmap(fd, 8)
        finally:
            os.close(fd)

    @property
    def value(self) -> int:
        return int(struct.unpack("q", self._map[:8])[0])

    @value.setter
    def value(self, v: int) -> None:
        self._map[:8] = struct.pack("q", v)


def sidecar_owner(kind: str, stamp_path: str, how: str) -> int:
    """A sidecar-mode owner: its helper dies ``kind`` on cue; the main thread spins (busy)
    or sleeps (idle) until the sidecar stops this process."""
    stamp = Stamp(stamp_path)
    helper = FORK.Process(target=die_on_cue, args=(kind, stamp), name="helper", daemon=True)
    helper.start()
    wd = hk.DisarmableWatchdog([helper], mode="sidecar", name="bench").arm()
    ready_by = time.monotonic() + OWNER_GIVE_UP_S
    while stamp.value != -1 and time.monotonic() < ready_by:
        time.sleep(0.001)
    print("READY", helper.pid, wd.sidecar_pid, flush=True)
    give_up = time.monotonic() + OWNER_GIVE_UP_S
    if how == "busy":
        spin_until(lambda: False, give_up)
    else:
        time.sleep(OWNER_GIVE_UP_S)
    return 3  # never stopped


def sidecar_trial(tree: str, kind: str, how: str, workdir: str) -> float | None:
    """Sidecar mode: the helper's last act -> its owner dead, seconds."""
    fd, stamp_path = tempfile.mkstemp(dir=workdir)
    os.write(fd, bytes(8))
    os.close(fd)
    stamp = Stamp(stamp_path)
    error_file = stamp_path + ".error.json"
    env = {**os.environ, "PYTHONPATH": tree, "TORCHELASTIC_ERROR_FILE": error_file}
    owner = subprocess.Popen(
        [sys.executable, __file__, "--sidecar-owner", kind, stamp_path, how],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
    )  # fmt: skip
    assert owner.stdout is not None
    try:
        line = owner.stdout.readline().split()
        if not line or line[0] != "READY":
            return None
        helper = int(line[1])
        pidfd = os.pidfd_open(owner.pid)
        try:
            time.sleep(random.uniform(0.05, 0.1))  # the sidecar waits, the owner spins
            if kind in ("sigkill", "sigterm"):
                stamp.value = now_ns()
                os.kill(helper, signal.SIGKILL if kind == "sigkill" else signal.SIGTERM)
            else:
                os.kill(helper, signal.SIGUSR1)
            if not select.select([pidfd], [], [], OWNER_GIVE_UP_S)[0]:
                return None
            dead = now_ns()
        finally:
            os.close(pidfd)
        if stamp.value <= 0 or not os.path.exists(error_file):
            return None
        return (dead - stamp.value) / 1e9
    finally:
        if owner.poll() is None:
            owner.kill()
        owner.wait()
        owner.stdout.close()
        for p in (stamp_path, error_file):
            if os.path.exists(p):
                os.unlink(p)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def reads(n: int) -> int:
    from healthkit._os.proc import read_small

    me = os.getpid()

    def with_open() -> bytes:
        with open(f"/proc/{me}/stat", "rb") as f:
            return f.read()

    ways = {"open()": with_open, "read_small": lambda: read_small(f"/proc/{me}/stat")}
    res: dict[str, list[float]] = {k: [] for k in ways}
    stop = threading.Event()

    def watcher() -> None:
        for _ in range(n):
            for name, fn in ways.items():
                t = time.perf_counter()
                fn()
                res[name].append(time.perf_counter() - t)
            time.sleep(0.001)
        stop.set()

    t = threading.Thread(target=watcher)
    t.start()
    x = 0
    while not stop.is_set():  # the main thread CPU-busy
        x += 1
    t.join()
    for name, xs in res.items():
        print(f"{name:12s} n={len(xs)} p50={pct(xs, 0.5) * 1e3:.3f} ms "
              f"p99={pct(xs, 0.99) * 1e3:.3f} ms", flush=True)  # fmt: skip
    return 0


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--reads":
        return reads(int(argv[1]) if len(argv) > 1 else 400)
    if argv and argv[0] == "--worker":
        return worker()
    if argv and argv[0] == "--sidecar-owner":
        return sidecar_owner(argv[1], argv[2], argv[3])
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--trials", type=int, default=100, help="thread-mode trials per kind and row")
    ap.add_argument("--sidecar-trials", type=int, default=0, help="the same, sidecar mode")
    ap.add_argument("--idle", action="store_true", help="also the idle-owner rows")
    ap.add_argument("--baseline", help="another healthkit tree, measured in the same rounds")
    ap.add_argument("--out", help="write the raw samples and the summary here (JSON)")
    args = ap.parse_args(argv)
    trees = {"this tree": str(HERE.parent)}
    if args.baseline:
        trees["baseline"] = str(Path(args.baseline).resolve())
    hows = ("busy", "idle") if args.idle else ("busy",)
    workers: dict[str, subprocess.Popen[str]] = {}
    for name, tree in trees.items():
        w = subprocess.Popen(
            [sys.executable, __file__, "--worker"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, env={**os.environ, "PYTHONPATH": tree},
        )  # fmt: skip
        assert w.stdout is not None
        print(f"{name}: {w.stdout.readline().split()[1]}", flush=True)
        workers[name] = w
    rows = [(tree, "thread", how) for tree in trees for how in hows]
    rows += [(tree, "sidecar", how) for tree in trees for how in hows]
    samples: dict[str, dict[str, list[float]]] = {
        f"{t}, {m}, {h}": {k: [] for k in KINDS} for t, m, h in rows
    }
    lost: dict[str, dict[str, int]] = {r: dict.fromkeys(KINDS, 0) for r in samples}
    load_before = os.getloadavg()
    t0 = time.monotonic()
    rounds = max(args.trials, args.sidecar_trials)
    with tempfile.TemporaryDirectory(prefix="hk-busy-") as workdir:
        for r in range(rounds):
            todo = [
                (t, m, h, k) for t, m, h in rows for k in KINDS
                if r < (args.trials if m == "thread" else args.sidecar_trials)
            ]  # fmt: skip
            random.shuffle(todo)
            for tree, mode, how, kind in todo:
                if mode == "thread":
                    w = workers[tree]
                    assert w.stdin is not None and w.stdout is not None
                    w.stdin.write(f"{kind} {how}\n")
                    w.stdin.flush()
                    out = w.stdout.readline().strip()
                    lat = None if out in ("-", "") else float(out)
                else:
                    lat = sidecar_trial(trees[tree], kind, how, workdir)
                key = f"{tree}, {mode}, {how}"
                if lat is None:
                    lost[key][kind] += 1
                else:
                    samples[key][kind].append(lat)
            if (r + 1) % 10 == 0:
                print(f"[round {r + 1}/{rounds}, {time.monotonic() - t0:.0f} s, load "
                      f"{os.getloadavg()[0]:.1f}]", flush=True)  # fmt: skip
    for w in workers.values():
        assert w.stdin is not None
        w.stdin.close()
        w.wait()
    summary: dict[str, dict[str, Any]] = {}
    for key, by_kind in samples.items():
        if not by_kind["sigkill"]:
            continue
        kill_p99 = pct(by_kind["sigkill"], 0.99)
        summary[key] = {}
        for kind in KINDS:
            xs = by_kind[kind]
            if not xs:
                continue
            row = {
                "trials": len(xs),
                "lost": lost[key][kind],
                "p50_ms": round(pct(xs, 0.5) * 1e3, 1),
                "p99_ms": round(pct(xs, 0.99) * 1e3, 1),
                "max_ms": round(max(xs) * 1e3, 1),
                "x_sigkill_p99": round(pct(xs, 0.99) / kill_p99, 2),
            }
            summary[key][kind] = row
            print(f"{key:28s} {kind:10s} n={row['trials']:4d} lost={row['lost']} "
                  f"p50={row['p50_ms']:7.1f} ms p99={row['p99_ms']:7.1f} ms "
                  f"x={row['x_sigkill_p99']:.2f}", flush=True)  # fmt: skip
    info = {
        "command": " ".join(["benchmarks/bench_busy_deaths.py", *argv]),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "wall_s": round(time.monotonic() - t0),
        "switch_interval_s": sys.getswitchinterval(),
    }
    print(json.dumps(info), flush=True)
    if args.out:
        raw = {k: {kind: [round(x, 6) for x in xs] for kind, xs in v.items()}
               for k, v in samples.items()}  # fmt: skip
        Path(args.out).write_text(json.dumps(
            {**info, "summary": summary, "lost": lost, "samples_s": raw}, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
