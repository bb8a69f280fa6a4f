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
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from _common import (
    TESTS_SCRIPTS,
    Page,
    fmt_s,
    free_port,
    kill_session,
    list_s,
    now_ns,
    pyplot,
    python,
    save_figure,
    session_pids,
    summarize,
)
from _protocol import Target, Verdict, judge_every_run, targets_from

NAME = "teardown"
IMG = "bench-teardown.png"
JOB = str(TESTS_SCRIPTS / "torchrun_job.py")
HARD_LIMIT_S = 180.0  # a trial that is not over by then is recorded as such and killed
FULL_SHAPES = ["2 ranks", "4 ranks", "2 nodes x 1 rank"]
FULL_VARIANTS = ["thread", "sidecar"]
FULL_REPS = 3  # runs per shape and healthkit variant (each is a whole torchrun job)
TARGETS = [
    Target(
        f"{shape}/{variant}",
        f"torchrun teardown < 3 s in every run: {shape}, healthkit {variant}",
        "every run",
        3.0,
        "s",
        FULL_REPS,
    )
    for shape in FULL_SHAPES
    for variant in FULL_VARIANTS
]


class Agent:
    """One torchrun agent in its own session, its output collected by a thread. Its log
    directory is a temporary one of ours (torchrun's default, a new /tmp/torchelastic_*
    per agent, is never removed)."""

    def __init__(self, args: list[str], nnodes: int, nproc: int, port: int, run_id: str):
        self.log_dir = tempfile.mkdtemp(prefix="healthkit-bench-torchrun-")
        self.cmd = [
            python(),
            "-m",
            "torch.distributed.run",
            f"--nnodes={nnodes}",
            f"--nproc_per_node={nproc}",
            "--rdzv_backend=c10d",
            f"--rdzv_endpoint=127.0.0.1:{port}",
            f"--rdzv_id={run_id}",
            "--max_restarts=0",
            f"--log-dir={self.log_dir}",
            JOB,
            *args,
        ]
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
        shutil.rmtree(self.log_dir, ignore_errors=True)


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
        root = out[out.find("Root Cause") :] if "Root Cause" in out else ""
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
    shapes = ["2 ranks"] if quick else FULL_SHAPES
    variants = ["thread"] if quick else FULL_VARIANTS
    reps = 1 if quick else FULL_REPS
    timeout = 10.0 if quick else 30.0
    results: list[dict[str, Any]] = []
    errors: list[str] = []
    for shape in shapes:
        # the stock job: started first, it hangs in the background while healthkit runs
        box: list[dict[str, Any]] = []
        killed = threading.Event()

        def stock(
            shape: str = shape, box: list[dict[str, Any]] = box, killed: threading.Event = killed
        ) -> None:
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
            rows.append(
                {
                    "shape": shape,
                    "variant": variant,
                    **summarize(secs),
                    "samples": secs,
                    "not_over": sum(r["seconds"] is None for r in rs),
                    "root_cause_names_helper": [r["root_cause_names_helper"] for r in rs],
                    "processes": sorted({r["processes"] for r in rs}),
                }
            )
    return {
        "hard_limit_s": HARD_LIMIT_S,
        "collective_timeout_s": timeout,
        "reps": reps,
        "rows": rows,
        "trials": results,
        "errors": errors,
    }


# ---------------------------------------------------------------------- verdicts
def _row(td: dict[str, Any], key: str) -> dict[str, Any] | None:
    shape, variant = key.split("/")
    return next((r for r in td["rows"] if r["shape"] == shape and r["variant"] == variant), None)


def verdicts(td: dict[str, Any], entry: dict[str, Any], quick: bool) -> list[Verdict]:
    out = []
    for t in targets_from(entry, TARGETS):
        r = _row(td, t.key)
        if r is None:
            if not quick:
                out.append(Verdict(t.what, t.statistic, "n/a", "", "0", "not measured"))
            continue  # a quick run measures one shape and variant
        out.append(judge_every_run(t, r["samples"], r["not_over"], quick, fmt_s))
    return out


# ---------------------------------------------------------------------- plot
def plot(td: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    rows = td["rows"]
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    limit = td.get("hard_limit_s", HARD_LIMIT_S)
    labels = {
        "thread": "healthkit thread",
        "sidecar": "healthkit sidecar",
        "without": f"without (gloo timeout {td['collective_timeout_s']:g} s)",
    }
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.8 / len(variants)
    for i, v in enumerate(variants):
        for j, s in enumerate(shapes):
            r = next(r for r in rows if r["shape"] == s and r["variant"] == v)
            x = j + (i - (len(variants) - 1) / 2) * width
            ys = list(r["samples"]) + [limit] * r["not_over"]
            if not ys:
                continue
            ax.scatter(
                [x] * len(ys), ys, s=14, color=f"C{i}", label=labels.get(v, v) if j == 0 else None
            )
            if r["not_over"]:
                ax.text(
                    x, limit, f"{r['not_over']} never ended", ha="center", va="bottom", fontsize=7
                )
    for t in TARGETS[:1]:
        ax.axhline(t.limit, color="red", ls=":", lw=1, label=f"target {t.limit:g} s")
    ax.set_xticks(range(len(shapes)), shapes)
    ax.set_xlim(-0.6, len(shapes) - 0.4)
    ax.set_yscale("log")
    ax.set_ylabel("helper SIGKILL → every job process gone (s, log)")
    ax.set_ylim(0.1, 1000)
    ax.set_title(f"5. torchrun job teardown (every run; never ended: drawn at {limit:g} s)")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3, which="both")
    save_figure(fig, path)


# ---------------------------------------------------------------------- markdown
def markdown(td: dict[str, Any], page: Page) -> list[str]:
    L = ["## 5. Job teardown end to end (torchrun, gloo)", ""]
    L.append(
        "`tests/scripts/torchrun_job.py` under `python -m torch.distributed.run` "
        "(c10d rendezvous on 127.0.0.1, `--max_restarts=0`): local rank 0 owns a "
        "fork-started helper feeding it through a queue, every rank runs `all_reduce` in "
        "a loop. 1 s into training the helper is SIGKILLed; the time runs until every "
        "process of the job (agents, ranks, helper, sidecar; snapshotted before the "
        "kill, each followed by a pidfd) is gone and the job's sessions are empty. "
        "healthkit runs keep the script's 600 s collective timeout; the runs without "
        f"healthkit use `--collective-timeout {td['collective_timeout_s']:g}` and ran in "
        "the background alongside the healthkit runs. A job not over after "
        f"{td.get('hard_limit_s', HARD_LIMIT_S):g} s is recorded as never ended and "
        "killed."
    )
    L.append("")
    limit = td.get("hard_limit_s", HARD_LIMIT_S)
    L.append(
        f"| job | variant | runs | every run | never ended (> {limit:g} s) | root cause "
        "names the helper |"
    )
    L.append("|---|---|---:|---|---:|---|")
    for r in td["rows"]:
        v = r["variant"]
        label = (
            f"without healthkit (gloo timeout {td['collective_timeout_s']:g} s)"
            if v == "without"
            else f"healthkit {v}"
        )
        names = r["root_cause_names_helper"]
        L.append(
            f"| {r['shape']} | {label} | {len(r['samples']) + r['not_over']} | "
            f"{list_s(r['samples'])} | {r['not_over']} | "
            f"{sum(names)}/{len(names)} |"
        )
    L.append("")
    ex = next((t for t in td["trials"] if t["variant"] == "thread" and t.get("exits_s")), None)
    if ex:
        parts = ", ".join(f"{k} at {fmt_s(v)}" for k, v in ex["exits_s"].items())
        L.append(
            f"When each process was seen to exit, after the kill (one {ex['shape']} run, "
            f"healthkit thread): {parts}."
        )
        L.append("")
    for t in td["trials"]:
        if t["variant"] == "without" and t["seconds"] is None:
            ended = max(t["exits_s"].values()) if t.get("exits_s") else None
            L.append(
                f"Without healthkit, the {t['shape']} job was not over after {limit:g} s "
                "and was killed; "
                + (
                    f"the last of its processes seen to exit before that went at {fmt_s(ended)}."
                    if ended
                    else "none of its processes had exited."
                )
            )
            L.append("")
    if td["errors"]:
        L.append("Runs that failed to start or finish: " + "; ".join(td["errors"]))
        L.append("")
    if page.img:
        L += [f"![teardown]({page.img})", ""]
    return L
