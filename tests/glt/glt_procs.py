"""What a GLT run leaves in the process table and in SysV shared memory, and stack dumps of
every process of it.

A stock GLT hang blocks inside C++, and a SIGKILLed loader leaves its ShmChannel segment behind
for the life of the machine, so the glt tests find sampling workers and process-group members
by pid, dump their stacks from outside, and remove the segments by creator pid. Children and
``stat`` come from ``healthkit.lowlevel``, the readers healthkit itself uses.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from healthkit._os.proc import sysv_shm_segments
from healthkit.lowlevel import children, read_proc_stat

HANG_LOGS = Path(__file__).resolve().parent.parent.parent / "build" / "test-logs"


@contextlib.contextmanager
def hang_guard(test: str, seconds: float, pids: Callable[[], list[int]]) -> Iterator[None]:
    """Last resort for an in-process hang inside C++ (pytest-timeout's thread method would
    leave the sampling workers running): after ``seconds``, write every thread's stack and the
    test's name to ``build/test-logs/hang-<pid>.txt`` (pytest's capture dies with the process;
    scripts/test prints these files at the end), SIGKILL the workers by pid, exit 70."""

    def fire() -> None:
        HANG_LOGS.mkdir(parents=True, exist_ok=True)
        with open(HANG_LOGS / f"hang-{os.getpid()}.txt", "w") as f:
            f.write(f"{test} hung for {seconds:g} s; its threads:\n")
            f.flush()
            faulthandler.dump_traceback(file=f, all_threads=True)
        faulthandler.dump_traceback(file=sys.__stderr__, all_threads=True)
        for pid in pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        os._exit(70)

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        timer.join()


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def spawned_worker_pids(pid: int | None = None) -> list[int]:
    """Children started by the spawn start method (not the resource tracker), in the order
    they were started: a producer starts its workers in rank order, so this is rank order."""
    parent = os.getpid() if pid is None else pid
    return in_start_order(
        [p for p in children(parent)
         if "multiprocessing.spawn" in cmdline(p) and "resource_tracker" not in cmdline(p)],
        parent,
    )  # fmt: skip


def in_start_order(pids: Sequence[int], parent: int) -> list[int]:
    """``parent``'s children in the order the kernel gave out their pids. Not numeric order:
    the pid counter wraps at ``pid_max`` (32,768 by default; a suite run spawns more than
    that), and a worker started just after the wrap has the lower pid. Each child's pid
    comes after its parent's, counted round the wrap."""
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    return sorted(pids, key=lambda p: (p - parent) % pid_max)


def alive(pid: int) -> bool:
    """Neither gone nor a zombie."""
    st = read_proc_stat(pid)
    return st is not None and st.state != "Z"


def pids_in_group(pgid: int, include_zombies: bool = False) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        st = read_proc_stat(int(name))
        if st is not None and st.pgrp == pgid and (include_zombies or st.state != "Z"):
            out.append(int(name))
    return out


# --- SysV shared memory (GLT's ShmChannel) ------------------------------------------------


def sysv_shm_rows() -> list[dict[str, str]]:
    """Every SysV shared-memory segment (column: value), by the core's one reader."""
    return sysv_shm_segments()


def sysv_shm_created_by(creator_pids: Sequence[int]) -> list[int]:
    return [int(r["shmid"]) for r in sysv_shm_rows() if int(r["cpid"]) in creator_pids]


def remove_orphan_sysv_shm(creator_pids: Sequence[int]) -> list[int]:
    """IPC_RMID the unattached SysV segments created by ``creator_pids``.

    GLT's ShmChannel is a SysV segment (shmget) that only its creator's destructor removes;
    a SIGKILLed loader process leaves it behind (``ipcs -m``) for the life of the machine.
    """
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    removed = []
    for row in sysv_shm_rows():
        if int(row["cpid"]) in creator_pids and int(row["nattch"]) == 0:
            if libc.shmctl(int(row["shmid"]), 0, None) == 0:  # 0 == IPC_RMID
                removed.append(int(row["shmid"]))
    return removed


# --- stacks of every Python process of a child tree ---------------------------------------

_SITECUSTOMIZE = """\
import faulthandler, os, signal
_d = os.environ.get("HK_STACK_DIR")
if _d:
    _f = open(os.path.join(_d, "stack-%d.txt" % os.getpid()), "w")
    faulthandler.register(signal.SIGUSR1, file=_f, all_threads=True)
"""


@contextlib.contextmanager
def sigusr1_stack_dumps() -> Iterator[tuple[dict[str, str], str]]:
    """(env, stack dir) for a child tree in which every Python process writes all its stacks
    to ``<stack dir>/stack-<pid>.txt`` on SIGUSR1.

    A ``sitecustomize`` on PYTHONPATH is imported by every interpreter at start-up, including
    the sampling workers GLT spawns, so no GLT code is touched.
    """
    with tempfile.TemporaryDirectory(prefix="glt-site-") as d:
        with open(os.path.join(d, "sitecustomize.py"), "w") as f:
            f.write(_SITECUSTOMIZE)
        stacks = os.path.join(d, "stacks")
        os.mkdir(stacks)
        env = dict(os.environ)
        here = os.path.dirname(os.path.abspath(__file__))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (d, here, env.get("PYTHONPATH", "")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        env["HK_STACK_DIR"] = stacks
        yield env, stacks


def read_stacks(stacks: str, cmdlines: dict[int, str]) -> str:
    """The dumps ``sigusr1_stack_dumps`` collected, each headed by its pid and command line."""
    parts = []
    for name in sorted(os.listdir(stacks)):
        pid = int(name[len("stack-") : -len(".txt")])
        with open(os.path.join(stacks, name)) as f:
            text = f.read()
        if text:
            parts.append(f"--- stacks of pid {pid}: {cmdlines.get(pid, '?')[:110]}\n{text}")
    return "\n".join(parts)
