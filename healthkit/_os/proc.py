"""Readers of ``/proc``: the one place that parses what the kernel says about a process.

Every reader takes ``proc_root`` so tests can point it at a tree of real file formats, and
none raises on a process that is gone, a file it may not read, or a malformed file: the
caller then knows nothing (``None``/``False``), and a malformed file is logged once.
"""

from __future__ import annotations

import errno
import logging
import os
import select
import socket
import sys

import attrs

from healthkit._errors import check_pid, path_arg

__all__ = [
    "ProcStat",
    "catches_signal",
    "children",
    "descendants",
    "may_read_exit_code",
    "pidfd_identity",
    "read_peak_rss",
    "read_pending_signals",
    "read_proc_stat",
    "any_thread_running",
    "read_fd_now",
    "readable_now",
    "waitid_peek",
    "self_identity",
    "TaskWait",
    "read_task_wait",
    "status_ids",
    "sysv_shm_segments",
]

_log = logging.getLogger("healthkit")
_CAP_SYS_PTRACE = 19


class _HoldingGil:
    """``open``/``read``/``close`` called through ``ctypes.PyDLL``, which keeps the GIL across
    the call.

    Python's own file and directory calls release the GIL around every system call, and a
    thread that gave it up gets it back only when the running thread lets go: with a
    CPU-busy main thread, a retake can wait a switch interval (5 ms) or more. Measured from a
    second thread while the main thread spins (``benchmarks/bench_busy_deaths.py --reads
    1000``, two runs, 2 cores at load 14): one ``/proc/<pid>/stat`` read takes p50
    0.079-0.084 ms, p99 23-31 ms through ``open()``; p50 0.057-0.059 ms, p99 0.13-0.21 ms
    this way.
    Reads of ``/proc/<pid>/{stat,status}`` never wait on the process they describe, so
    holding the GIL across them costs the other threads microseconds. Not for reading this
    process's own threads' states (:func:`read_threads`): those that want the GIL would all
    show as waiting for it.
    """

    def __init__(self) -> None:
        import ctypes

        self.ctypes = ctypes
        lib = ctypes.PyDLL(None, use_errno=True)
        lib.open.argtypes = [ctypes.c_char_p, ctypes.c_int]
        lib.open.restype = ctypes.c_int
        lib.read.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
        lib.read.restype = ctypes.c_ssize_t
        lib.close.argtypes = [ctypes.c_int]
        lib.close.restype = ctypes.c_int
        lib.poll.argtypes = [ctypes.c_void_p, ctypes.c_ulong, ctypes.c_int]
        lib.poll.restype = ctypes.c_int
        lib.waitid.argtypes = [ctypes.c_int, ctypes.c_uint, ctypes.c_void_p, ctypes.c_int]
        lib.waitid.restype = ctypes.c_int
        lib.recv.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        lib.recv.restype = ctypes.c_ssize_t
        lib.opendir.argtypes = [ctypes.c_char_p]
        lib.opendir.restype = ctypes.c_void_p
        lib.readdir.argtypes = [ctypes.c_void_p]
        lib.readdir.restype = ctypes.c_void_p
        lib.closedir.argtypes = [ctypes.c_void_p]
        lib.closedir.restype = ctypes.c_int
        self.lib = lib
        # siginfo_t on 64-bit Linux: si_signo, si_errno, si_code, a pad, then the SIGCHLD
        # fields si_pid, si_uid, si_status at byte 16. Elsewhere, Python's own calls.
        self.siginfo_ok = ctypes.sizeof(ctypes.c_void_p) == 8 and sys.platform == "linux"
        # struct dirent on 64-bit Linux (glibc, musl): d_ino, d_off, d_reclen, d_type, d_name.
        self.d_name_offset = 19
        if not self.siginfo_ok:
            raise OSError("struct layouts known for 64-bit Linux only")

        class PollFd(ctypes.Structure):
            _fields_ = [("fd", ctypes.c_int), ("events", ctypes.c_short),
                        ("revents", ctypes.c_short)]  # fmt: skip

        self.PollFd = PollFd

    def read_fd(self, fd: int, size: int, *, peek: bool = False) -> bytes | None:
        """One ``read()`` (``recv(MSG_PEEK)`` with ``peek``) of a non-blocking fd: ``None``
        when nothing is waiting (``EAGAIN``), ``b""`` at its end."""
        ctypes, lib = self.ctypes, self.lib
        buf = ctypes.create_string_buffer(size)
        if peek:
            n = lib.recv(fd, buf, size, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        else:
            n = lib.read(fd, buf, size)
        if n < 0:
            err = ctypes.get_errno()
            if err in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR):
                return None
            raise OSError(err, os.strerror(err))
        data: bytes = buf.raw[:n]
        return data

    def listdir(self, path: str) -> list[str]:
        """The names in a directory (``.`` and ``..`` left out); ``OSError`` as
        ``os.listdir`` would raise it."""
        ctypes, lib = self.ctypes, self.lib
        d = lib.opendir(os.fsencode(path))
        if not d:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), path)
        names: list[str] = []
        try:
            while True:
                entry = lib.readdir(d)
                if not entry:
                    return names
                name = ctypes.string_at(entry + self.d_name_offset)
                if name not in (b".", b".."):
                    names.append(os.fsdecode(name))
        finally:
            lib.closedir(d)

    def readable_now(self, fd: int) -> bool:
        """``poll()`` with no wait: any event (readable, hung up, invalid) counts."""
        pfd = self.PollFd(fd, select.POLLIN, 0)
        n = self.lib.poll(self.ctypes.byref(pfd), 1, 0)
        if n < 0:
            err = self.ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        return bool(n > 0)

    def waitid_peek(self, pidfd: int) -> os.waitid_result | None:
        """``os.waitid(P_PIDFD, pidfd, WEXITED | WNOHANG | WNOWAIT)``: never blocks."""
        ctypes = self.ctypes
        info = (ctypes.c_int * 32)()  # 128 bytes
        flags = os.WEXITED | os.WNOHANG | os.WNOWAIT
        if self.lib.waitid(os.P_PIDFD, pidfd, info, flags) < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))  # ECHILD: ChildProcessError, as os.waitid
        signo, code, pid, uid, status = info[0], info[2], info[4], info[5], info[6]
        if pid == 0:
            return None  # WNOHANG and nothing to report, as os.waitid
        return os.waitid_result((pid, uid & 0xFFFFFFFF, signo, status, code))

    def read(self, path: str) -> bytes:
        """The whole file; ``OSError`` as ``open()`` would raise it."""
        ctypes, lib = self.ctypes, self.lib
        fd = lib.open(os.fsencode(path), os.O_RDONLY | os.O_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), path)
        try:
            chunks: list[bytes] = []
            buf = ctypes.create_string_buffer(4096)
            while True:
                n = lib.read(fd, buf, 4096)
                if n < 0:
                    err = ctypes.get_errno()
                    raise OSError(err, os.strerror(err), path)
                if n == 0:
                    return b"".join(chunks)
                chunks.append(buf.raw[:n])
        finally:
            lib.close(fd)


_holding: _HoldingGil | None = None


def _reader() -> _HoldingGil | None:
    global _holding
    if _holding is None:
        try:
            _holding = _HoldingGil()
        except (ImportError, OSError, AttributeError):  # no ctypes, or no such libc calls
            return None
    return _holding


def readable_now(fd: int) -> bool:
    """Whether ``fd`` has an event now (readable, hung up or invalid), the GIL kept: a
    watcher that just woke must not wait a switch interval again to ask."""
    reader = _reader()
    if reader is None:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(0))
    return reader.readable_now(fd)


def waitid_peek(pidfd: int) -> os.waitid_result | None:
    """The exit status of our child behind ``pidfd``, left for its owner to reap
    (``WNOWAIT``), or ``None`` while it runs; the GIL kept (the call never blocks).
    Raises ``ChildProcessError`` as ``os.waitid`` does."""
    reader = _reader()
    if reader is None:
        return os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    return reader.waitid_peek(pidfd)


def read_fd_now(fd: int, size: int = 65536, *, peek: bool = False) -> bytes | None:
    """One read (a ``MSG_PEEK`` receive with ``peek``) of a non-blocking fd, the GIL kept:
    ``None`` when nothing is waiting, ``b""`` at its end."""
    reader = _reader()
    if reader is None:
        try:
            if peek:
                with socket.socket(fileno=os.dup(fd)) as sock:
                    return sock.recv(size, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            return os.read(fd, size)
        except (BlockingIOError, InterruptedError):
            return None
    return reader.read_fd(fd, size, peek=peek)


def _listdir(path: str) -> list[str]:
    reader = _reader()
    return os.listdir(path) if reader is None else reader.listdir(path)


def read_small(path: str) -> bytes:
    """A small ``/proc`` file, read without giving up the GIL (see :class:`_HoldingGil`)."""
    reader = _reader()
    if reader is None:
        with open(path, "rb") as f:
            return f.read()
    return reader.read(path)


@attrs.frozen
class ProcStat:
    """The fields of ``/proc/<pid>/stat`` that healthkit needs."""

    pid: int
    comm: str
    state: str
    ppid: int
    pgrp: int
    start_time: int
    exit_status: int | None  # raw wait status (field 52), meaningful for a zombie


def read_proc_stat(pid: int, proc_root: str = "/proc") -> ProcStat | None:
    """Parse ``<proc_root>/<pid>/stat``; ``None`` when the process is gone, or when the
    file is truncated or garbled (logged as a warning: the caller then knows nothing)."""
    check_pid(pid, "pid")
    proc_root = path_arg(proc_root, "proc_root")
    try:
        raw = read_small(f"{proc_root}/{pid}/stat").decode("utf-8", "replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    except OSError as e:
        _log.warning("cannot read %s/%s/stat (%s): its state is unknown", proc_root, pid, e)
        return None
    # comm may contain spaces and parentheses: it ends at the *last* ')'.
    head, paren, tail = raw.rpartition(")")
    comm = head.partition("(")[2]
    fields = tail.split()
    # fields[0] is field 3 (state); field N is fields[N - 3].
    try:
        if not paren or len(fields) < 20:
            raise ValueError("too few fields")
        exit_status = int(fields[49]) if len(fields) > 49 else None
        return ProcStat(
            pid=pid,
            comm=comm,
            state=fields[0],
            ppid=int(fields[1]),
            pgrp=int(fields[2]),
            start_time=int(fields[19]),
            exit_status=exit_status,
        )
    except ValueError as e:
        _log.warning(
            "%s/%s/stat is malformed (%s: %r...): its state is unknown",
            proc_root, pid, e, raw[:80],
        )
        return None


def status_ids(path: str) -> tuple[list[int], list[int], int] | None:
    """(uids, gids, effective capabilities) from a ``/proc/<pid>/status`` file."""
    uids: list[int] = []
    gids: list[int] = []
    cap_eff = 0
    try:
        with open(path, "rb") as f:
            for line in f:
                if line.startswith(b"Uid:"):
                    uids = [int(x) for x in line.split()[1:]]
                elif line.startswith(b"Gid:"):
                    gids = [int(x) for x in line.split()[1:]]
                elif line.startswith(b"CapEff:"):
                    cap_eff = int(line.split()[1], 16)
    except (OSError, ValueError):
        return None
    if len(uids) < 4 or len(gids) < 4:
        return None
    return uids, gids, cap_eff


def may_read_exit_code(pid: int, proc_root: str) -> bool:
    """Whether the kernel shows us the exit code in ``pid``'s ``/proc/<pid>/stat``.

    It shows it only to callers that pass ``ptrace_may_access(PTRACE_MODE_READ_FSCREDS)``
    and prints a plain ``0`` to everyone else, which would read as a clean exit. That
    check is (LSMs aside): the target's real, effective and saved uid and gid all equal
    our fsuid and fsgid, or we hold CAP_SYS_PTRACE. Unknown credentials count as readable.
    """
    theirs = status_ids(f"{proc_root}/{pid}/status")
    mine = status_ids("/proc/self/status")
    if theirs is None or mine is None:
        return True
    if (mine[2] >> _CAP_SYS_PTRACE) & 1:
        return True
    fsuid, fsgid = mine[0][3], mine[1][3]
    return all(u == fsuid for u in theirs[0][:3]) and all(g == fsgid for g in theirs[1][:3])


def catches_signal(pid: int, signum: int, proc_root: str = "/proc") -> bool:
    """Whether the process has a handler installed for ``signum`` (``SigCgt``)."""
    try:
        with open(f"{proc_root}/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"SigCgt:"):
                    return bool((int(line.split()[1], 16) >> (signum - 1)) & 1)
    except (OSError, ValueError, IndexError):
        return False
    return False


def read_pending_signals(pid: int, proc_root: str = "/proc") -> frozenset[int] | None:
    """Signals sent to ``pid`` and not yet delivered: the process-wide set (``ShdPnd``, where
    ``kill()``/``killpg()`` put a signal) and its main thread's own (``SigPnd``).

    A signal stays pending while no thread can take it: the main thread in an uninterruptible
    wait (a slow NFS/FUSE read, ``vfork``), or the signal blocked. ``None``: gone or unreadable.
    """
    pending = 0
    found = False
    try:
        for line in read_small(f"{proc_root}/{pid}/status").splitlines():
            if line.startswith((b"SigPnd:", b"ShdPnd:")):
                pending |= int(line.split()[1], 16)
                found = True
    except (OSError, ValueError, IndexError):
        return None
    if not found:
        return None
    return frozenset(n for n in range(1, 65) if (pending >> (n - 1)) & 1)


def read_threads(
    pid: int, proc_root: str = "/proc", *, hold_gil: bool = False
) -> dict[int, tuple[str, int]] | None:
    """Each thread's scheduler state (``R``, ``S``, ``D``, ...) and blocked-signal mask
    (``SigBlk``), by thread id. While a thread runs a signal's handler the kernel blocks that
    signal in it (no ``SA_NODEFER``), so a signal that was taken but whose handler has not
    finished shows in the mask. ``None``: gone.

    ``hold_gil``: read without letting the GIL go (no switch-interval wait to get it back
    with a CPU-busy main thread): for the masks only. The states are then wrong for this
    process: its threads that want the GIL are all seen waiting for it (``S``), and a busy
    one would pass for an idle one (see :func:`any_thread_running`)."""
    try:
        tids = _listdir(f"{proc_root}/{pid}/task") if hold_gil else os.listdir(
            f"{proc_root}/{pid}/task"
        )
    except OSError:
        return None
    threads: dict[int, tuple[str, int]] = {}
    for tid in tids:
        state = "?"
        path = f"{proc_root}/{pid}/task/{tid}/status"
        try:
            if hold_gil:
                lines = read_small(path).splitlines()
            else:
                with open(path, "rb") as f:
                    lines = f.read().splitlines()
            for line in lines:
                if line.startswith(b"State:"):
                    state = line.split()[1].decode("ascii", "replace")
                elif line.startswith(b"SigBlk:"):
                    threads[int(tid)] = (state, int(line.split()[1], 16))
                    break
        except (OSError, ValueError, IndexError):
            continue  # the thread ended between the listing and the read
    return threads


def any_thread_running(pid: int, *, besides: int | None = None, proc_root: str = "/proc") -> bool:
    """Is a thread of ``pid`` (other than thread id ``besides``) on a CPU or waiting for one
    (``R``), or in an uninterruptible wait (``D``)? The main thread is looked at first, and
    the first one found answers.

    Each state is read by one ``read()`` that lets the GIL go (read holding it, this
    process's threads that want the GIL would be seen waiting for it), and only that call:
    with a CPU-busy main thread each retake of the GIL can wait a switch interval, and
    Python's ``open()`` and ``os.listdir`` let it go around every system call."""
    reader = _reader()
    if reader is None:
        threads = read_threads(pid, proc_root)
        return threads is not None and any(
            state in ("R", "D") for tid, (state, _) in threads.items() if tid != besides
        )
    try:
        tids = sorted((int(t) for t in reader.listdir(f"{proc_root}/{pid}/task")),
                      key=lambda t: t != pid)  # fmt: skip
    except (OSError, ValueError):
        return False
    lib, ctypes = reader.lib, reader.ctypes
    for tid in tids:
        if tid == besides:
            continue
        fd = lib.open(os.fsencode(f"{proc_root}/{pid}/task/{tid}/stat"), os.O_RDONLY | os.O_CLOEXEC)
        if fd < 0:
            ctypes.get_errno()
            continue  # ended since the listing
        try:
            raw = os.read(fd, 512)  # the one call that lets the GIL go
        except OSError:
            continue
        finally:
            lib.close(fd)
        fields = raw.rpartition(b")")[2].split()
        if fields and fields[0] in (b"R", b"D"):
            return True
    return False


def read_peak_rss(pid: int, proc_root: str = "/proc") -> int | None:
    """The kernel's peak resident set size (``VmHWM``) of a live process, in bytes."""
    try:
        with open(f"{proc_root}/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def children(pid: int, proc_root: str = "/proc") -> list[int]:
    """Direct children of ``pid`` (zombies included), from every thread's ``children`` file
    (a child belongs to the thread that forked it)."""
    check_pid(pid, "pid")
    proc_root = path_arg(proc_root, "proc_root")
    out: list[int] = []
    try:
        tids = os.listdir(f"{proc_root}/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"{proc_root}/{pid}/task/{tid}/children", "rb") as f:
                out.extend(int(x) for x in f.read().split())
        except (OSError, ValueError):
            continue
    return out


def descendants(pid: int, proc_root: str = "/proc") -> list[int]:
    """Every process below ``pid``, parents before their children."""
    check_pid(pid, "pid")
    proc_root = path_arg(proc_root, "proc_root")
    out: list[int] = []
    todo = [pid]
    while todo:
        kids = children(todo.pop(0), proc_root)
        out.extend(kids)
        todo.extend(kids)
    return out


def group_members(pgrp: int, proc_root: str = "/proc") -> list[int]:
    """Every live process of process group ``pgrp`` (zombies left out). Used for the helpers
    of a process that died: reparented, they can no longer be found below it."""
    check_pid(pgrp, "pgrp")
    proc_root = path_arg(proc_root, "proc_root")
    out: list[int] = []
    try:
        entries = os.listdir(proc_root)
    except OSError:
        return out
    for entry in entries:
        if not entry.isdigit():
            continue
        stat = read_proc_stat(int(entry), proc_root)
        if stat is not None and stat.pgrp == pgrp and stat.state not in ("Z", "X"):
            out.append(stat.pid)
    return out


_anon_dev: int | None = None


def pidfd_identity(pidfd: int) -> int | None:
    """The process a pidfd names, as one number for the whole boot: the pidfd's inode on
    pidfs (Linux 6.9+, 64-bit), shared by every pidfd of that process and never given to
    another. It tells two processes apart when they share a pid *and* a start time (a pid
    reused within one clock tick, 10 ms), which ``/proc/<pid>/stat`` cannot. ``None`` on
    older kernels, where every pidfd is the same anonymous inode."""
    global _anon_dev
    try:
        st = os.fstat(pidfd)
        if _anon_dev is None:
            import select

            with select.epoll() as probe:  # an anonymous inode on every kernel
                _anon_dev = os.fstat(probe.fileno()).st_dev
    except OSError:
        return None
    return None if st.st_dev == _anon_dev else st.st_ino


def self_identity() -> int | None:
    """:func:`pidfd_identity` of this process."""
    try:
        fd = os.pidfd_open(os.getpid())
    except (AttributeError, OSError):
        return None
    try:
        return pidfd_identity(fd)
    finally:
        os.close(fd)


# System call numbers of the blocking calls a stuck thread is usually in, by machine (the
# numbers differ between architectures; an unknown one is shown as its number).
_SYSCALLS: dict[str, dict[int, str]] = {
    "x86_64": {
        0: "read", 1: "write", 7: "poll", 17: "pread64", 19: "readv", 23: "select",
        34: "pause", 35: "nanosleep", 42: "connect", 43: "accept", 45: "recvfrom",
        47: "recvmsg", 61: "wait4", 202: "futex", 230: "clock_nanosleep", 232: "epoll_wait",
        247: "waitid", 270: "pselect6", 271: "ppoll", 281: "epoll_pwait", 288: "accept4",
        299: "recvmmsg", 441: "epoll_pwait2",
    },
    "aarch64": {
        63: "read", 64: "write", 65: "readv", 67: "pread64", 72: "pselect6", 73: "ppoll",
        22: "epoll_pwait", 98: "futex", 101: "nanosleep", 115: "clock_nanosleep",
        95: "waitid", 202: "accept", 203: "connect", 207: "recvfrom", 212: "recvmsg",
        242: "accept4", 260: "wait4", 441: "epoll_pwait2",
    },
}
# Calls whose first argument is a file descriptor worth naming.
_FD_CALLS = frozenset({
    "read", "write", "pread64", "readv", "recvfrom", "recvmsg", "recvmmsg", "accept",
    "accept4", "connect", "epoll_wait", "epoll_pwait", "epoll_pwait2",
})


@attrs.frozen
class TaskWait:
    """Where one thread of a live process is, as the kernel shows it."""

    tid: int
    comm: str
    state: str  # R running, S sleeping, D uninterruptible (often I/O), T stopped, ...
    wchan: str | None  # the kernel function it sleeps in ("0" or None: running/unknown)
    syscall: str | None  # "read(fd 5 -> /tmp/x)", "futex", "running", None if unreadable

    def describe(self) -> str:
        parts = [f"thread {self.tid} ({self.comm}): state {self.state}"]
        if self.syscall:
            parts.append(f"in {self.syscall}")
        if self.wchan and self.wchan != "0":
            parts.append(f"wchan {self.wchan}")
        return ", ".join(parts)


def _read_text(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace").strip()
    except OSError:
        return None


def _syscall(task: str, pid: int, proc_root: str) -> str | None:
    """``/proc/<pid>/task/<tid>/syscall`` in words: the call's name, and for a call on a
    file descriptor what the descriptor is (``/proc/<pid>/fd``). Needs ptrace access (the
    owner of a helper has it; another process may not): ``None`` then."""
    raw = _read_text(f"{task}/syscall")
    if raw is None:
        return None
    if raw == "running":
        return "running"
    fields = raw.split()
    try:
        nr = int(fields[0])
    except (ValueError, IndexError):
        return None
    if nr < 0:
        return "no system call"
    import platform

    name = _SYSCALLS.get(platform.machine(), {}).get(nr, f"system call {nr}")
    if name in _FD_CALLS and len(fields) > 1:
        try:
            fd = int(fields[1], 16)
        except ValueError:
            return name
        try:
            target = os.readlink(f"{proc_root}/{pid}/fd/{fd}")
        except OSError:
            target = "?"
        return f"{name}(fd {fd} -> {target})"
    return name


def read_task_wait(pid: int, proc_root: str = "/proc") -> list[TaskWait] | None:
    """Each thread's state, wait channel and system call (what it is blocked on), main
    thread first; ``None`` when the process is gone."""
    check_pid(pid, "pid")
    proc_root = path_arg(proc_root, "proc_root")
    try:
        tids = sorted(int(t) for t in os.listdir(f"{proc_root}/{pid}/task"))
    except (OSError, ValueError):
        return None
    tids.sort(key=lambda t: t != pid)
    out: list[TaskWait] = []
    for tid in tids:
        task = f"{proc_root}/{pid}/task/{tid}"
        raw = _read_text(f"{task}/stat")
        if raw is None:
            continue  # ended between the listing and the read
        head, _, tail = raw.rpartition(")")
        fields = tail.split()
        out.append(
            TaskWait(
                tid=tid,
                comm=head.partition("(")[2],
                state=fields[0] if fields else "?",
                wchan=_read_text(f"{task}/wchan"),
                syscall=_syscall(task, pid, proc_root),
            )
        )
    return out


def sysv_shm_segments(proc_root: str = "/proc") -> list[dict[str, str]]:
    """Every SysV shared-memory segment, as ``<proc_root>/sysvipc/shm`` lists it: one dict
    per segment, column name to value (``shmid``, ``perms`` in octal, ``cpid``, ``nattch``...).

    The one reader of that file: healthkit_glt follows its channel's segment with it, and
    tests/glt check for leaked segments. Unlike the readers above it raises ``OSError`` when
    the file cannot be read: "no segment" and "cannot tell" must not look alike to a leak
    check.
    """
    with open(os.path.join(path_arg(proc_root, "proc_root"), "sysvipc", "shm")) as f:
        header = f.readline().split()
        return [dict(zip(header, line.split(), strict=False)) for line in f]
