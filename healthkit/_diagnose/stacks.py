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

Without interrupting (:func:`enable_quiet_stack_dumps`). A signal whose handler runs in a
thread cuts short the system call that thread is in, whatever ``SA_RESTART`` says, for the
calls the kernel never restarts after a handler: ``nanosleep`` (libc ``sleep()`` returns
early), ``poll``/``epoll_wait``/``select``, a futex wait with a timeout. A helper blocked in
C code then returns from it, which a dump must never cause. So the opt-in can also block the
dump signal in the calling thread (and so in every thread it starts later) and start one
thread, the dumper, that leaves it unblocked and sleeps in a ``read()`` that never returns:
the kernel hands a process-directed signal to a thread that does not block it, so
faulthandler's C handler runs in the dumper, writes every thread's stack (it needs no GIL:
this works while another thread holds it in a C call) and the dumper's ``read()`` is
restarted. The other threads never see the signal. Threads started *before* the opt-in keep
it unblocked and could still be chosen, so opt in at the start of the helper. A forked child
takes the signal again in its one thread (as without the quiet opt-in); a program the helper
executes afterwards (``subprocess``, a spawned Python) starts with it blocked, as signal masks
are inherited across ``exec``: healthkit's own opt-ins in it unblock it, another program that
relies on SIGUSR2 must unblock it itself.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import signal
import stat as stat_module
import threading
import time
from collections.abc import Iterable
from typing import IO

from healthkit import _runtime
from healthkit._errors import (
    InvalidArgumentError,
    InvalidArgumentTypeError,
    check_bool,
    check_path,
    check_pid,
    check_signal,
    check_timeout,
    path_arg,
)
from healthkit._os.proc import catches_signal, descendants, read_proc_stat
from healthkit._os.safefile import UnsafePathError, open_directory
from healthkit._os.userdir import record_dir

__all__ = [
    "dump_helper_stacks",
    "dump_stacks",
    "enable_quiet_stack_dumps",
    "enable_stack_dumps",
    "stack_file",
]

logger = logging.getLogger("healthkit")

DEFAULT_SIGNAL = signal.SIGUSR2
_HEADER = "healthkit-stack-dump pid={pid} start_time={start} signal={signum}\n"
_open_files: dict[str, tuple[IO[str], int]] = {}
# (pid, start time) -> (signal, monotonic time) of every dump request this process sent.
_signalled: dict[tuple[int, int | None], tuple[int, float]] = {}
# Signals this process set to SIG_IGN when it withdrew an opt-in.
_ignored_by_us: set[int] = set()
# Signals a dumper thread answers in this process (see enable_quiet_stack_dumps).
_quiet: set[int] = set()
_quiet_lock = threading.Lock()
_DUMPER_NAME = "healthkit stack dumper"
_dumper_pipes: list[tuple[int, int]] = []


def stack_file(directory: str, pid: int) -> str:
    return os.path.join(directory, f"stack-{pid}.txt")


def _catchable(signum: object) -> signal.Signals:
    """A stack-dump signal: one a handler can catch (SIGKILL/SIGSTOP would end or stop)."""
    sig = check_signal(signum, "signum")
    if sig in (signal.SIGKILL, signal.SIGSTOP):
        raise InvalidArgumentError(
            f"signum {sig.name} cannot be caught, so no process can dump on it; use "
            "signal.SIGUSR2 (the default)",
            "signum",
        )
    return sig


def enable_stack_dumps(directory: str, signum: int = DEFAULT_SIGNAL) -> str | None:
    """Make this process dump all thread stacks to a file in ``directory`` on ``signum``.

    Call it at the start of a worker. Idempotent. Returns the file path, or ``None`` (with
    a warning) when the file cannot be created, e.g. the directory is gone: stacks are a
    diagnostic, never a reason for a worker's start-up to fail. The directory is opened
    without following a symlink another user could have planted (:mod:`healthkit._os.safefile`).
    """
    if not isinstance(directory, (str, os.PathLike)):
        raise InvalidArgumentTypeError(
            f"directory must be a path, got {directory!r}", "directory"
        )
    sig = _catchable(signum)
    return _enable(os.fspath(directory), sig, private=False)


def enable_private_stack_dumps(directory: str) -> str | None:
    """:func:`enable_stack_dumps` in this user's private record directory (made if
    missing), unless the process already handles the signal itself. Returns the file only
    when this call opted in (so the caller withdraws only what it made): ``None`` when the
    process had opted in already (a nested wrapped call) or was not opted in."""
    if stack_file(directory, os.getpid()) in _open_files:
        return None
    try:
        handler = signal.getsignal(DEFAULT_SIGNAL)
    except ValueError:
        return None
    # SIG_IGN set by an earlier withdrawal of ours (a wrapped function called again) is not
    # the application's handler.
    ours = handler == signal.SIG_IGN and int(DEFAULT_SIGNAL) in _ignored_by_us
    if handler not in (signal.SIG_DFL, None) and not ours:
        logger.debug("stack dumps not enabled: SIGUSR2 already has a handler here")
        return None
    return _enable(directory, DEFAULT_SIGNAL, private=True)


def enable_quiet_stack_dumps(directory: str) -> bool:
    """:func:`enable_private_stack_dumps`, answered by a dumper thread so that a dump never
    interrupts what the other threads are doing (see the module's docstring). Call it from
    the helper's main thread before it starts threads. A process that already opted in
    (anywhere) keeps that opt-in, now answered quietly. Returns whether this process now
    answers dumps that way: ``False`` when the application handles SIGUSR2 itself."""
    directory = path_arg(directory, "directory")
    if any(sig == int(DEFAULT_SIGNAL) for _, sig in _open_files.values()):
        # Already opted in (a BoundedBarrier's worker, record_exception): answer that
        # opt-in quietly; a second registration would take the signal from it.
        return _start_dumper(DEFAULT_SIGNAL)
    if enable_private_stack_dumps(directory) is None:
        return False
    return _start_dumper(DEFAULT_SIGNAL)


#: The dumper thread's kernel name (``comm``), so that reports can leave it out.
DUMPER_COMM = "hk-stack-dumper"


def _dumper(sig: int, fd: int) -> None:
    from healthkit._os.orphan import set_thread_name

    set_thread_name(DUMPER_COMM)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
    # Never returns: the write end stays open in this process. A handler running in this
    # thread restarts the read (SA_RESTART, set by faulthandler); nothing else wakes it.
    while True:
        try:
            if not os.read(fd, 1):
                return
        except OSError:
            return


def _start_dumper(sig: signal.Signals) -> bool:
    with _quiet_lock:
        if int(sig) in _quiet:
            return True
        try:
            r, w = os.pipe2(os.O_CLOEXEC)
        except OSError:
            return False
        thread = threading.Thread(target=_dumper, args=(int(sig), r), name=_DUMPER_NAME,
                                  daemon=True)
        _dumper_pipes.append((r, w))  # kept open for the life of the process
        # Blocked here first, so the dumper is the one thread left that takes it.
        signal.pthread_sigmask(signal.SIG_BLOCK, {sig})
        thread.start()
        _quiet.add(int(sig))
        return True


def strip_dumper(text: str) -> str:
    """A dump without the dumper thread's own stack (it only says where it sleeps)."""
    blocks = text.split("\n\n")
    kept = [b for b in blocks if "in _dumper\n" not in b + "\n"]
    return "\n\n".join(kept)


def _enable(directory: str, sig: signal.Signals, *, private: bool) -> str | None:
    path = stack_file(directory, os.getpid())
    if path in _open_files:
        return path
    if int(sig) not in _quiet:
        # A thread that inherited a block from a quiet parent (forked, or spawned from its
        # main thread) must take the signal again, or its dump would never come.
        with contextlib.suppress(ValueError, OSError):
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
    stat = read_proc_stat(os.getpid())
    try:
        dir_fd = open_directory(directory, create=private, private=private)
    except (UnsafePathError, OSError) as e:
        logger.warning("stack dumps not enabled: cannot create %s (%s)", path,
                       getattr(e, "strerror", None) or e)
        return None
    try:
        fd = os.open(
            os.path.basename(path),
            os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
            0o600,
            dir_fd=dir_fd,
        )
    except OSError as e:
        logger.warning("stack dumps not enabled: cannot create %s (%s)", path, e.strerror)
        return None
    finally:
        os.close(dir_fd)
    if private:
        _prune_stale(directory)
    f = open(fd, "w")  # noqa: SIM115 - must stay open for the signal handler
    f.write(_HEADER.format(pid=os.getpid(), start=stat.start_time if stat else "?",
                           signum=int(sig)))
    f.flush()
    faulthandler.register(sig, file=f, all_threads=True, chain=False)
    _open_files[path] = (f, int(sig))
    # At atexit, not threading's earlier phase: stacks stay available while the interpreter
    # joins non-daemon threads, the most common place to hang at exit.
    _runtime.at_exit("atexit", "withdraw the stack-dump opt-ins", _withdraw_all)
    _runtime.at_fork_in_child("forget the parent's stack-dump opt-ins", _forget_after_fork)
    return path


def withdraw_stack_dumps(path: str) -> None:
    """Withdraw one opt-in made by this process (see :func:`_withdraw_all`)."""
    entry = _open_files.pop(path, None)
    if entry is not None:
        _withdraw(path, *entry)


def _prune_stale(directory: str, scan: int = 256) -> None:
    """Remove opt-in files of processes that are gone (a SIGKILLed helper cannot withdraw
    its own); looks at most at ``scan`` entries, so a helper's start-up stays cheap."""
    try:
        names = sorted(os.listdir(directory))[:scan]
    except OSError:
        return
    for name in names:
        if not (name.startswith("stack-") and name.endswith(".txt")):
            continue
        path = os.path.join(directory, name)
        header = _read_header(path)
        if header is None:
            continue
        pid, start, _ = header
        stat = read_proc_stat(pid)
        if stat is None or stat.start_time != start or stat.state in ("Z", "X"):
            try:
                os.unlink(path)
            except OSError:
                pass


def _withdraw_all() -> None:
    """At interpreter exit: stop handling the dump signal, ignore it from now on, and
    delete the opt-in files, so that a late request neither kills nor finds us."""
    for path, (f, signum) in list(_open_files.items()):
        _withdraw(path, f, signum)
    _open_files.clear()


def _withdraw(path: str, f: IO[str], signum: int) -> None:
    try:
        faulthandler.unregister(signum)
        signal.signal(signum, signal.SIG_IGN)
        _ignored_by_us.add(signum)
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


def _forget_after_fork() -> None:
    # A forked child inherits the handler but not the identity: its pid has no file; and not
    # the dumper thread, so its one thread takes the signal again.
    _open_files.clear()
    for sig in _quiet:
        # As before the quiet opt-in: a forked child takes the signal in its one thread.
        with contextlib.suppress(ValueError, OSError):
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
    _quiet.clear()
    for pipe in _dumper_pipes:
        for fd in pipe:
            with contextlib.suppress(OSError):
                os.close(fd)
    _dumper_pipes.clear()


def _read_header(path: str) -> tuple[int, int | None, int] | None:
    # O_NONBLOCK and a regular-file check: a FIFO planted under the name must not block us.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat_module.S_ISREG(os.fstat(fd).st_mode):
            return None
        line = os.read(fd, 200).partition(b"\n")[0]
    except OSError:
        return None
    finally:
        os.close(fd)
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


def is_opted_in(directory: str, pid: int, signum: int = DEFAULT_SIGNAL) -> bool:
    """Whether ``pid`` is alive and opted in to stack dumps in ``directory`` right now."""
    return _may_signal(directory, pid, signum)


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
    directory = path_arg(directory, "directory")
    sig = int(_catchable(signum))
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
            # Pinned by a pidfd, then checked again: the signal cannot reach a process that
            # took over the pid after the checks above.
            pidfd = os.pidfd_open(pid)
        except (ProcessLookupError, FileNotFoundError, PermissionError):
            continue
        try:
            stat = read_proc_stat(pid)
            header = _read_header(path)
            if stat is None or header is None or header[1] != stat.start_time:
                continue
            _signalled[(pid, stat.start_time)] = (sig, time.monotonic())
            signal.pidfd_send_signal(pidfd, sig)
        except (ProcessLookupError, PermissionError):
            continue
        finally:
            os.close(pidfd)
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
                out[pid] = strip_dumper(f.read()) or None
        except OSError:
            out[pid] = None
    return out


def opted_in(directory: str) -> list[int]:
    """The live processes whose stack-dump opt-in is in ``directory`` (sorted pids)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    out = []
    for name in names:
        if not (name.startswith("stack-") and name.endswith(".txt")):
            continue
        try:
            pid = int(name[len("stack-"):-len(".txt")])
        except ValueError:
            continue
        if _may_signal(directory, pid, DEFAULT_SIGNAL):
            out.append(pid)
    return sorted(out)


def dump_helper_stacks(
    pids: Iterable[int] | None = None,
    *,
    below: bool = True,
    directory: str | None = None,
    timeout: float = 2.0,
) -> dict[int, str | None]:
    """The Python stacks of running helpers, e.g. to see where a job's helpers are stuck.

    ``pids`` are the processes to ask, and with ``below`` every process below them
    (give a rank's pid to get its helpers); ``None`` asks every live process of this user
    that opted in. A helper answers when it opted in to stack dumps in ``directory``
    (default :func:`healthkit.record_dir`): :func:`healthkit.record_exception` does so
    for its entry point, :func:`healthkit.lowlevel.enable_stack_dumps` explicitly. Returns
    ``pid -> stacks`` (``None`` for a process that did not opt in or did not answer within
    ``timeout``). Nothing is sent to a process that did not opt in: the signal would kill it.
    """
    check_bool(below, "below")
    directory = check_path(directory, "directory", allow_none=True) or record_dir()
    if pids is None:
        targets = opted_in(directory)
    else:
        if isinstance(pids, (str, bytes)) or not hasattr(pids, "__iter__"):
            raise InvalidArgumentTypeError(
                f"pids must be an iterable of pids, got {pids!r}", "pids"
            )
        targets = []
        for pid in pids:
            check_pid(pid, "pids")
            targets.append(pid)
            if below:
                targets.extend(descendants(pid))
        targets = [p for p in dict.fromkeys(targets) if p != os.getpid()]
    return dump_stacks(directory, targets, timeout=timeout)
