"""Child-process targets and small process tools for the core tests.

Everything here is importable by name (``from helpers import ...``): the spawn and
forkserver start methods pickle a target by module and name, and ``python -c`` children
import this module from :data:`HERE`. The children end in real ways: exit codes, an
uncaught exception, and real SIGSEGV / SIGABRT / SIGBUS faults.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import mmap
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import attrs

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON = sys.executable

# ----------------------------------------------------------------------------- targets


def exit_0() -> None:
    sys.exit(0)


def exit_3() -> None:
    sys.exit(3)


def raise_error() -> None:
    raise RuntimeError("the helper failed on purpose")


def sleep_forever() -> None:
    """Sleep until killed by the test (bounded, so a broken test cannot leave it forever)."""
    time.sleep(600)


def segfault() -> None:
    """Dereference NULL: a real SIGSEGV."""
    import ctypes

    faulthandler.disable()  # pytest enables it in the parent; keep the output quiet
    ctypes.string_at(0)


def abort() -> None:
    faulthandler.disable()
    os.abort()


def bus_error() -> None:
    """Touch a mapped page whose file was truncated under it: a real SIGBUS, the same fault
    a process gets when /dev/shm is full and a shared-memory page cannot be backed."""
    faulthandler.disable()
    with tempfile.TemporaryFile() as f:
        f.truncate(mmap.PAGESIZE)
        m = mmap.mmap(f.fileno(), mmap.PAGESIZE)
        f.truncate(0)
        m[0]


BEHAVIOURS: dict[str, Callable[[], None]] = {
    "exit_0": exit_0,
    "exit_3": exit_3,
    "raise": raise_error,
    "sleep": sleep_forever,
    "segfault": segfault,
    "abort": abort,
    "bus_error": bus_error,
}


def gated(gate: Any, behaviour: str) -> None:
    """Wait for ``gate`` (a multiprocessing Event), then behave: lets a test build its
    watch while the child surely still runs."""
    gate.wait(60)
    BEHAVIOURS[behaviour]()


def python_argv(behaviour: str) -> list[str]:
    """argv of a fresh interpreter that runs one behaviour."""
    code = f"import sys; sys.path.insert(0, {HERE!r}); import helpers; helpers.{_fn(behaviour)}()"
    return [PYTHON, "-c", code]


def _fn(behaviour: str) -> str:
    return BEHAVIOURS[behaviour].__name__


def fork_behaviour(behaviour: str) -> int:
    """``os.fork()`` a child that runs one behaviour; return its pid (the caller reaps)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child, which never returns to pytest
        code = 1
        try:
            BEHAVIOURS[behaviour]()
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    return pid


# ----------------------------------------------------------------------------- non-children

_MIDDLE = r"""
import json, subprocess, sys
argv, mode, user = json.loads(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
child = subprocess.Popen(argv, user=user, group=user, extra_groups=[] if user else None)
print(child.pid, flush=True)
if mode == "delay":
    sys.stdin.readline()  # do not reap until the test says so: the child stays a zombie
child.wait()
print("reaped", child.returncode, flush=True)
sys.stdin.readline()  # stay until the test lets go
"""


@attrs.define
class Grandchild:
    """A process that is not ours: a child of our child ``middle``."""

    pid: int
    middle: subprocess.Popen[str]
    mode: str

    def let_parent_reap(self) -> str:
        """Tell a ``delay`` parent to reap now; return its ``reaped <code>`` line."""
        assert self.middle.stdin is not None and self.middle.stdout is not None
        if self.mode == "delay":
            self.middle.stdin.write("reap\n")
            self.middle.stdin.flush()
        return self.middle.stdout.readline().strip()


@contextlib.contextmanager
def grandchild(argv: list[str], mode: str, user: int | None = None) -> Iterator[Grandchild]:
    """Run ``argv`` as a grandchild. ``mode``: ``"delay"`` (its parent reaps only when told)
    or ``"immediate"`` (its parent blocks in waitpid and reaps at once). ``user``: run it
    as that uid (and gid of the same number); needs root.

    On exit the grandchild is killed through a pidfd (never a bare pid that may have been
    recycled), and its parent is released and reaped.
    """
    middle = subprocess.Popen(
        [PYTHON, "-c", _MIDDLE, json.dumps(argv), mode, json.dumps(user)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    pidfd: int | None = None
    try:
        assert middle.stdout is not None
        pid = int(middle.stdout.readline())
        pidfd = os.pidfd_open(pid)
        yield Grandchild(pid, middle, mode)
    finally:
        if pidfd is not None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            os.close(pidfd)
        with contextlib.suppress(BrokenPipeError):
            assert middle.stdin is not None
            middle.stdin.close()  # readline() returns '' in the middle: it reaps and exits
        try:
            middle.wait(timeout=30)
        except subprocess.TimeoutExpired:
            middle.kill()
            middle.wait()
        assert middle.stdout is not None
        middle.stdout.close()


def watch_as_user(uid: int, pid: int) -> tuple[int | None, str, bool]:
    """Watch ``pid`` from a forked copy of this process that dropped root for ``uid``
    (gid of the same number); return the (returncode, source, is_child) it saw."""
    from healthkit import ProcessWatch

    r, w = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child, which never returns to pytest
        code = 1
        try:
            os.close(r)
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            with ProcessWatch(pid) as watch:
                status = watch.wait(30)
                assert status is not None
                os.write(w, json.dumps([status.returncode, status.source, watch.is_child]).encode())
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    os.close(w)
    try:
        chunks = []
        while chunk := os.read(r, 65536):
            chunks.append(chunk)
    finally:
        os.close(r)
        _, wstatus = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(wstatus) == 0, "the unprivileged watcher failed"
    rc, source, is_child = json.loads(b"".join(chunks))
    return rc, source, is_child


# ----------------------------------------------------------------------------- misc


def blocked_in_epoll(thread_native_id: int | None, bound: float = 10.0) -> bool:
    """True once the thread sleeps in epoll_wait (read from /proc, bounded)."""
    assert thread_native_id is not None
    deadline = time.monotonic() + bound
    task = f"/proc/self/task/{thread_native_id}"
    while time.monotonic() < deadline:
        try:
            with open(f"{task}/wchan") as f:
                wchan = f.read().strip()
            with open(f"{task}/stat") as f:
                state = f.read().rpartition(")")[2].split()[0]
        except OSError:
            return False
        if state == "S" and "epoll" in wchan:
            return True
        if state == "S" and wchan == "0":  # a kernel that hides wchan: grace period
            time.sleep(0.2)
            return True
        time.sleep(0.002)
    return False


def reaped(pid: int) -> bool:
    """True when ``pid`` is no longer a child of ours waiting to be reaped."""
    try:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return False


# ----------------------------------------------------------------------------- kernel log
KMSG_FIXTURES = os.path.join(HERE, "fixtures", "kmsg")


def kmsg_report(fixture: str, pid: int, *, comm: str | None = None,
                usec: int | None = None) -> str:
    """A kernel-log fixture's records about ``pid`` (named ``comm``, when given), stamped at
    ``usec`` (default: now, on the kernel log's clock: microseconds since boot, which is
    CLOCK_MONOTONIC on a machine that never suspended). The fixtures name pid 4242 (or 7777)
    and the command python3."""
    with open(os.path.join(KMSG_FIXTURES, fixture)) as f:
        text = f.read()
    for old in ("4242", "7777"):
        text = text.replace(old, str(pid))
    if comm is not None:
        text = text.replace("(python3)", f"({comm})").replace("task=python3,", f"task={comm},")
    stamp = time.monotonic_ns() // 1000 if usec is None else usec
    out = []
    for i, line in enumerate(text.splitlines()):
        if line and not line.startswith(" "):
            pri, seq, _, rest = line.split(",", 3)
            line = f"{pri},{seq},{stamp + i},{rest}"
        out.append(line)
    return "\n".join(out) + "\n"


def comm_of(pid: int) -> str:
    """The command name (``comm``) of a live or zombie process."""
    with open(f"/proc/{pid}/comm") as f:
        return f.read().strip()
