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

__all__ = ["dump_stack", "enable_stack_dumps", "stack_file"]

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


def dump_stack(
    directory: str, pid: int, *, signum: int = DEFAULT_SIGNAL, timeout: float = 2.0
) -> str | None:
    """Ask a live process that called :func:`enable_stack_dumps` for its stacks.

    Returns the dump, or ``None`` when the process never registered (then it is not
    signalled at all) or did not answer within ``timeout``.
    """
    path = stack_file(directory, pid)
    if not os.path.exists(path):
        return None
    before = os.path.getsize(path)
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        return None
    deadline = time.monotonic() + timeout
    size = before
    # The dump is written by the target asynchronously; wait until it stops growing. This
    # runs once per stuck worker on the failure path only, so a short poll is fine here.
    while time.monotonic() < deadline:
        time.sleep(0.02)
        new = os.path.getsize(path)
        if new > before and new == size:
            break
        size = new
    with open(path) as f:
        f.seek(before)
        text = f.read()
    return text or None
