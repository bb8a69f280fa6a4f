"""5. Job teardown end to end: a real torchrun gloo job whose helper is SIGKILLed.

The job is ``tests/scripts/torchrun_job.py``: local rank 0 of each node owns a helper process
that feeds it through a queue, every rank runs ``all_reduce`` in a loop. Each torchrun
agent starts in its own session (``start_new_session=True``). Once the helper runs and
training has gone on for 1 s, this process snapshots every live process of the job's
session(s), opens a pidfd on each, SIGKILLs one helper and times until every one of those
pidfds has fired and no live process is left in the session(s) (a final ``/proc`` scan).

- with healthkit: ``--healthkit --mode thread`` and ``--mode sidecar``; the gloo collective
  timeout is left at the script's 600 s, so only healthkit can end the job fast;
- without: ``--collective-timeout T``; the job hangs until gloo's timeout fires on the other
  ranks. Those runs go in the background, alongside the healthkit runs (which start once
  the stock job's helper has been killed, so the two start-ups do not overlap). A job not
  over after HARD_LIMIT_S is recorded as such, then killed.

Shapes: 2 ranks and 4 ranks on one node, and 2 torchrun agents as 2 "nodes" on localhost
(1 rank each). Every session we started is SIGKILLed at the end of its trial, whatever
happened.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import socket
import subprocess
import threading
import time
from typing import Any

from _common import TESTS_SCRIPTS, kill_session, now_ns, python, session_pids, summarize

JOB = str(TESTS_SCRIPTS / "torchrun_job.py")
HARD_LIMIT_S = 180.0  # a trial that is not over by then is recorded as such and killed


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Agent:
    """One torchrun agent in its own session, its output collected by a thread."""

    def __init__(self, args: list[str], nnodes: int, nproc: int, port: int, run_id: str):
        self.cmd = [
            python(), "-m", "torch.distributed.run",
            f"--nnodes={nnodes}", f"--nproc_per_node={nproc}",
            "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}", f"--rdzv_id={run_id}",
            "--max_restarts=0", JOB, *args,
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            self.cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"},
        )
        self.lines: list[str] = []
        self.sessions: set[int] = set()
        self.helper: int | None = None
        self._helper_seen = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", "replace")
            self.lines.append(line)
            m = re.search(r"HELPER (\d+)", line)
            if m and self.helper is None:
                self.helper = int(m.group(1))
                self._helper_seen.set()
        self._helper_seen.set()

    def wait_helper(self, timeout: float) -> int:
        self._helper_seen.wait(timeout)
        if self.helper is None:
            raise RuntimeError("the job never started its helper:\n" + "".join(self.lines))
        return self.helper

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def close(self) -> None:
        # torchrun starts each rank in a session of its own: stop those too (they are the
        # sessions of processes we started), then torchrun's own session.
        for sid in self.sessions | sessions_of(descendants(self.proc.pid)):
            if sid != self.proc.pid and sid != os.getsid(0):
                kill_session(sid)
        kill_session(self.proc.pid)
        with contextlib.suppress(Exception):
            self.proc.wait(30)
        self._reader.join(10)


def _proc_table() -> dict[int, tuple[int, int, str]]:
    """pid -> (ppid, session id, state) of every process."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().decode("utf-8", "replace").rpartition(")")[2].split()
        except OSError:
            continue
        table[int(name)] = (int(fields[1]), int(fields[3]), fields[0])
    return table


def descendants(root: int) -> list[int]:
    """``root`` and every live process below it."""
    table = _proc_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, state) in table.items():
        if state not in ("Z", "X"):
            children.setdefault(ppid, []).append(pid)
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        if pid in table and table[pid][2] not in ("Z", "X"):
            out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def sessions_of(pids: list[int]) -> set[int]:
    table = _proc_table()
    return {table[p][1] for p in pids if p in table}


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().split(b"\0")
    except OSError:
        return "?"
    text = " ".join(a.decode("utf-8", "replace") for a in args if a)
    if "torch.distributed.run" in text:
        return "torchrun agent"
    if "_sidecar" in text:
        return "healthkit sidecar"
    if "torchrun_job.py" in text:
        return "rank"
    return text[:40]


def _wait_gone(
    sids: set[int], pids: list[int], limit_s: float, helper: int
) -> tuple[int | None, dict[str, float]]:
    """Block until every pid has exited and the sessions hold no live process. Returns the
    CLOCK_MONOTONIC ns when that was first seen (None at the limit), and when each pid was
    seen to exit."""
    fds: dict[int, int] = {}
    names = {pid: _comm(pid) for pid in pids}
    names[helper] = "killed helper"
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            fds[os.pidfd_open(pid)] = pid
    deadline = time.monotonic() + limit_s
    exits: dict[str, float] = {}
    try:
        pending = list(fds)
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None, exits
            ready, _, _ = select.select(pending, [], [], remaining)
            t = now_ns()
            for fd in ready:
                exits[f"{names[fds[fd]]} {fds[fd]}"] = t / 1e9
            pending = [fd for fd in pending if fd not in ready]
        t_end = now_ns()
        # anything started after the snapshot (it should not happen: max_restarts=0)
        while any(session_pids(s) for s in sids):
            if time.monotonic() > deadline:
                return None, exits
            time.sleep(0.01)
            t_end = now_ns()
        return t_end, exits
    finally:
        for fd in fds:
            os.close(fd)


def trial(
    shape: str, variant: str, collective_timeout: float, killed: threading.Event | None = None
) -> dict[str, Any]:
    nnodes, nproc = {"2 ranks": (1, 2), "4 ranks": (1, 4), "2 nodes x 1 rank": (2, 1)}[shape]
    args = ["--healthkit", "--mode", variant] if variant != "without" else []
    if variant == "without":
        args += ["--collective-timeout", str(collective_timeout)]
    port = free_port()
    run_id = f"bench{port}"
    agents = [Agent(args, nnodes, nproc, port, run_id) for _ in range(nnodes)]
    try:
        helper = agents[0].wait_helper(HARD_LIMIT_S)
        for a in agents[1:]:
            a.wait_helper(HARD_LIMIT_S)
        time.sleep(1.0)  # training is running
        pids = [p for a in agents for p in descendants(a.proc.pid)]
        if helper not in pids:
            pids.append(helper)
        sids = sessions_of(pids)
        for a in agents:
            a.sessions = sids
        t0 = now_ns()
        os.kill(helper, signal.SIGKILL)
        if killed is not None:
            killed.set()
        t_end, exits = _wait_gone(sids, pids, HARD_LIMIT_S, helper)
        for a in agents:
            with contextlib.suppress(subprocess.TimeoutExpired):
                a.proc.wait(10)
        out = agents[0].output
        root = out[out.find("Root Cause"):] if "Root Cause" in out else ""
        return {
            "shape": shape,
            "variant": variant,
            "seconds": (t_end - t0) / 1e9 if t_end else None,
            "processes": len(pids),
            "snapshot": {str(p): _comm(p) if p != helper else "killed helper" for p in pids},
            "exits_s": {
                k: round(v - t0 / 1e9, 3) for k, v in sorted(exits.items(), key=lambda kv: kv[1])
            },
            "returncodes": [a.proc.returncode for a in agents],
            "root_cause_names_helper": f"sampler-server (pid {helper})" in root,
        }
    finally:
        for a in agents:
            a.close()


def run(quick: bool) -> dict[str, Any]:
    shapes = ["2 ranks"] if quick else ["2 ranks", "4 ranks", "2 nodes x 1 rank"]
    variants = ["thread"] if quick else ["thread", "sidecar"]
    reps = 1 if quick else 3
    timeout = 10.0 if quick else 30.0
    results: list[dict[str, Any]] = []
    errors: list[str] = []
    for shape in shapes:
        # the stock job: started first, it hangs in the background while healthkit runs
        box: list[dict[str, Any]] = []
        killed = threading.Event()

        def stock(shape: str = shape, box: list[dict[str, Any]] = box,
                  killed: threading.Event = killed) -> None:
            try:
                box.append(trial(shape, "without", timeout, killed))
            except Exception as e:  # recorded, reported
                errors.append(f"{shape} without: {e!r}")
            finally:
                killed.set()

        bg = threading.Thread(target=stock, daemon=True)
        bg.start()
        # the stock job hangs idle once its helper is dead; wait until then so that its
        # start-up (torch imports on every rank) does not overlap the healthkit runs
        killed.wait(HARD_LIMIT_S)
        for _ in range(reps):
            for variant in variants:
                try:
                    results.append(trial(shape, variant, timeout))
                except Exception as e:
                    errors.append(f"{shape} {variant}: {e!r}")
        bg.join(HARD_LIMIT_S * 2)
        results.extend(box)
    rows = []
    for shape in shapes:
        for variant in [*variants, "without"]:
            rs = [r for r in results if r["shape"] == shape and r["variant"] == variant]
            secs = [r["seconds"] for r in rs if r["seconds"] is not None]
            rows.append({
                "shape": shape,
                "variant": variant,
                **summarize(secs),
                "not_over": sum(r["seconds"] is None for r in rs),
                "root_cause_names_helper": [r["root_cause_names_helper"] for r in rs],
                "processes": sorted({r["processes"] for r in rs}),
            })
    return {
        "hard_limit_s": HARD_LIMIT_S,
        "collective_timeout_s": timeout,
        "reps": reps,
        "rows": rows,
        "trials": results,
        "errors": errors,
    }
