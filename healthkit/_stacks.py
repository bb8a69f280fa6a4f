"""Stack dumps of live processes that are stuck, via faulthandler.

Why faulthandler and not py-spy: it ships with CPython, needs no ptrace permission (often
denied in containers), and its signal handler is C code that writes every thread's Python
stack even while the process is inside a native call holding the GIL. The price: the
process must opt in early (:func:`enable_stack_dumps`), because sending the signal to a
process that does not handle it would kill it (SIGUSR2's default action).

So a dump request signals a pid only when all of these hold:

- its stack file exists and its header names that pid *and its start time* (a recycled
  pid is another process, which never opted in);
- the kernel says the process catches the signal right now (``SigCgt`` in
  ``/proc/<pid>/status``): the opt-in is withdrawn at interpreter exit (an ``atexit``
  hook unregisters the handler and ignores the signal), because past that point
  faulthandler's handler is gone while the process still runs.

Every signal sent is remembered, so that if one ever ends a process anyway the diagnosis
says it was ours.
"""

from __future__ import annotations

import atexit
import faulthandler
import logging
import os
import signal
import time
from typing import IO

from healthkit._errors import InvalidArgumentTypeError, check_pid, check_signal, check_timeout
from healthkit._proc import catches_signal, read_proc_stat

__all__ = ["dump_stacks", "enable_stack_dumps", "stack_file"]

logger = logging.getLogger("healthkit")

DEFAULT_SIGNAL = signal.SIGUSR2
_HEADER = "healthkit-stack-dump pid={pid} start_time={start} signal={signum}\n"
_open_files: dict[str, tuple[IO[str], int]] = {}
_atexit_registered = False
# (pid, start time) -> (signal, monotonic time) of every dump request this process sent.
_signalled: dict[tuple[int, int | None], tuple[int, float]] = {}


def stack_file(directory: str, pid: int) -> str:
    return os.path.join(directory, f"stack-{pid}.txt")


def enable_stack_dumps(directory: str, signum: int = DEFAULT_SIGNAL) -> str | None:
    """Make this process dump all thread stacks to a file in ``directory`` on ``signum``.

    Call it at the start of a worker. Idempotent. Returns the file path, or ``None`` (with
    a warning) when the file cannot be created, e.g. the directory is gone: stacks are a
    diagnostic, never a reason for a worker's start-up to fail.
    """
    if not isinstance(directory, (str, os.PathLike)):
        raise InvalidArgumentTypeError(
            f"directory must be a path, got {directory!r}", "directory"
        )
    sig = check_signal(signum, "signum")
    path = stack_file(os.fspath(directory), os.getpid())
    if path in _open_files:
        return path
    stat = read_proc_stat(os.getpid())
    try:
        fd = os.open(
            path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
    except OSError as e:
        logger.warning("stack dumps not enabled: cannot create %s (%s)", path, e.strerror)
        return None
    f = open(fd, "w")  # noqa: SIM115 - must stay open for the signal handler
    f.write(_HEADER.format(pid=os.getpid(), start=stat.start_time if stat else "?",
                           signum=int(sig)))
    f.flush()
    faulthandler.register(sig, file=f, all_threads=True, chain=False)
    _open_files[path] = (f, int(sig))
    global _atexit_registered
    if not _atexit_registered:
        # atexit, not threading's earlier hook: stacks stay available while the interpreter
        # joins non-daemon threads, the most common place to hang at exit.
        atexit.register(_withdraw_all)
        os.register_at_fork(after_in_child=_forget_after_fork)
        _atexit_registered = True
    return path


def _withdraw_all() -> None:
    """At interpreter exit: stop handling the dump signal, ignore it from now on, and
    delete the opt-in files, so that a late request neither kills nor finds us."""
    for path, (f, signum) in list(_open_files.items()):
        try:
            faulthandler.unregister(signum)
            signal.signal(signum, signal.SIG_IGN)
        except Exception:
            pass
        try:
            os.unlink(path)
        except OSError:
            pass
        try:
            f.close()
        except Exception:
            pass
    _open_files.clear()


def _forget_after_fork() -> None:
    # A forked child inherits the handler but not the identity: its pid has no file.
    _open_files.clear()


def _read_header(path: str) -> tuple[int, int | None, int] | None:
    try:
        with open(path, "rb") as f:
            line = f.readline(200)
    except OSError:
        return None
    parts = dict(p.split(b"=", 1) for p in line.split()[1:] if b"=" in p)
    if not line.startswith(b"healthkit-stack-dump "):
        return None
    try:
        start = parts[b"start_time"]
        return (
            int(parts[b"pid"]),
            None if start == b"?" else int(start),
            int(parts[b"signal"]),
        )
    except (KeyError, ValueError):
        return None


def signalled_by_us(pid: int | None, signum: int, *, within: float = 300.0) -> bool:
    """Whether this process sent ``signum`` to ``pid`` as a stack-dump request in the last
    ``within`` seconds (a death is diagnosed right after it; the window keeps a much later
    process that reuses the pid from being blamed on us)."""
    if pid is None:
        return False
    now = time.monotonic()
    return any(
        p == pid and s == signum and now - sent <= within
        for (p, _), (s, sent) in _signalled.items()
    )


def _may_signal(directory: str, pid: int, signum: int) -> bool:
    header = _read_header(stack_file(directory, pid))
    if header is None:
        return False
    file_pid, file_start, file_signum = header
    if file_pid != pid or file_signum != signum or file_start is None:
        return False
    stat = read_proc_stat(pid)
    if stat is None or stat.start_time != file_start or stat.state in ("Z", "X"):
        return False  # gone, or the pid now names a process that never opted in
    return catches_signal(pid, signum)


def dump_stacks(
    directory: str, pids: list[int], *, signum: int = DEFAULT_SIGNAL, timeout: float = 2.0
) -> dict[int, str | None]:
    """Ask live processes that called :func:`enable_stack_dumps` for their stacks, all at once.

    Returns ``pid -> dump``; ``None`` for a process that is not signalled (it never opted
    in, withdrew at exit, or its pid was recycled: the signal could kill it) or that did not
    answer within ``timeout``.
    """
    sig = int(check_signal(signum, "signum"))
    bound = check_timeout(timeout, "timeout", allow_none=False)
    assert bound is not None
    if isinstance(pids, (str, bytes)) or not hasattr(pids, "__iter__"):
        raise InvalidArgumentTypeError(f"pids must be a list of pids, got {pids!r}", "pids")
    pids = list(pids)
    for pid in pids:
        check_pid(pid, "pids")
    started: dict[int, int] = {}
    for pid in pids:
        if pid in started or not _may_signal(directory, pid, sig):
            continue
        path = stack_file(directory, pid)
        try:
            before = os.path.getsize(path)
            stat = read_proc_stat(pid)
            _signalled[(pid, stat.start_time if stat else None)] = (sig, time.monotonic())
            os.kill(pid, sig)
        except (ProcessLookupError, FileNotFoundError):
            continue
        except PermissionError:
            continue
        started[pid] = before
    # The handler is C code writing synchronously (microseconds); it needs no GIL. Poll
    # briefly until each file has grown and then held still once: this runs only on the
    # failure path.
    sizes = dict(started)
    done: set[int] = set()
    deadline = time.monotonic() + bound
    while len(done) < len(started) and time.monotonic() < deadline:
        time.sleep(0.005)
        for pid, before in started.items():
            if pid in done:
                continue
            try:
                size = os.path.getsize(stack_file(directory, pid))
            except OSError:
                done.add(pid)  # withdrawn at exit meanwhile
                continue
            if size > before and size == sizes[pid]:
                done.add(pid)
            sizes[pid] = size
    out: dict[int, str | None] = {pid: None for pid in pids}
    for pid, before in started.items():
        try:
            with open(stack_file(directory, pid), errors="replace") as f:
                f.seek(before)
                out[pid] = f.read() or None
        except OSError:
            out[pid] = None
    return out
