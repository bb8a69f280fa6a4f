"""Stack dumps of live processes that are stuck, via faulthandler.

Why faulthandler and not py-spy: it ships with CPython, needs no ptrace permission (often
denied in containers), and its signal handler is C code that writes every thread's Python
stack even while the process is inside a native call holding the GIL. The price: the
process must opt in early (:func:`enable_stack_dumps`), because sending the signal to a
process that did not register a handler would kill it. The registration leaves a file whose
existence is the proof that signalling is safe.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import time
from typing import IO

__all__ = ["dump_stack", "dump_stacks", "enable_stack_dumps", "stack_file"]

DEFAULT_SIGNAL = signal.SIGUSR2
_open_files: dict[str, IO[str]] = {}


def stack_file(directory: str, pid: int) -> str:
    return os.path.join(directory, f"stack-{pid}.txt")


def enable_stack_dumps(directory: str, signum: int = DEFAULT_SIGNAL) -> str:
    """Make this process dump all thread stacks to a file in ``directory`` on ``signum``.

    Call it at the start of a worker. Idempotent. Returns the file path.
    """
    path = stack_file(directory, os.getpid())
    if path in _open_files:
        return path
    f = open(path, "w")  # noqa: SIM115 - must stay open for the signal handler
    _open_files[path] = f
    faulthandler.register(signum, file=f, all_threads=True, chain=False)
    return path


def dump_stacks(
    directory: str, pids: list[int], *, signum: int = DEFAULT_SIGNAL, timeout: float = 2.0
) -> dict[int, str | None]:
    """Ask live processes that called :func:`enable_stack_dumps` for their stacks, all at once.

    Returns ``pid -> dump``; ``None`` for a process that never registered (it is not
    signalled at all: the signal would kill it) or did not answer within ``timeout``.
    """
    started: dict[int, int] = {}
    for pid in pids:
        path = stack_file(directory, pid)
        if not os.path.exists(path):
            continue
        before = os.path.getsize(path)
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            continue
        started[pid] = before
    # The handler is C code writing synchronously (microseconds); it needs no GIL. Poll
    # briefly until each file has grown and then held still once: this runs only on the
    # failure path.
    sizes = dict(started)
    done: set[int] = set()
    deadline = time.monotonic() + timeout
    while len(done) < len(started) and time.monotonic() < deadline:
        time.sleep(0.005)
        for pid, before in started.items():
            if pid in done:
                continue
            size = os.path.getsize(stack_file(directory, pid))
            if size > before and size == sizes[pid]:
                done.add(pid)
            sizes[pid] = size
    out: dict[int, str | None] = {pid: None for pid in pids}
    for pid, before in started.items():
        with open(stack_file(directory, pid)) as f:
            f.seek(before)
            out[pid] = f.read() or None
    return out


def dump_stack(
    directory: str, pid: int, *, signum: int = DEFAULT_SIGNAL, timeout: float = 2.0
) -> str | None:
    """:func:`dump_stacks` for one process."""
    return dump_stacks(directory, [pid], signum=signum, timeout=timeout)[pid]
