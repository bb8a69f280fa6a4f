"""ProcessWatch and WatchSet: know the instant a process dies, without polling.

Mechanism (Linux fast path): a pidfd opened at construction. It becomes readable when the
process has exited (it is a zombie by then), it pins the process identity so a recycled pid
cannot fool us, and it works for processes that are not our children. For children the exit
status is *peeked* with ``waitid(P_PIDFD, ..., WNOWAIT)``, so there is no window where the
process is known dead but its exit code is not.

Watching never changes what ``multiprocessing`` or ``subprocess`` report. A watch never reaps:
the zombie stays for its owner (``Process.join()``, ``Popen.wait()``, ``os.waitpid``), whose
answer stays authoritative; reaping it ourselves would race the owner's own ``waitpid`` and,
for a bare pid, make ``Popen.wait()`` report 0. The owner objects are only read passively
(their ``returncode`` attribute), never polled, with one exception: a ``forkserver`` Process is
not our child and its exit code arrives over its sentinel pipe, which only one reader may
consume. Its ``poll()`` is serialised (see :func:`_serialize_forkserver_poll`) so that our read
and the owner's own ``join()`` in another thread can no longer race for it (the loser of that
race, in the standard library alone, reads 255).

Fallback (no pidfd): ``Process.sentinel``. The sentinel is a pipe that closes while the child
exits, *before* the kernel has made it a zombie, so ``waitpid(WNOHANG)`` can still answer
"running" for a moment after the sentinel fires. That race is closed with a short bounded
blocking ``join``, never a sleep loop.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import selectors
import signal
import subprocess
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from multiprocessing.process import BaseProcess
from typing import Final

import attrs

from healthkit._errors import (
    InvalidArgumentError,
    InvalidArgumentTypeError,
    NoSuchProcessError,
    ProcessNotStartedError,
    UnsupportedError,
    WatchClosedError,
    check_bool,
    check_callable,
    check_int,
    check_pid,
    check_signal,
    check_str,
    check_timeout,
    path_arg,
)
from healthkit._os.proc import (
    may_read_exit_code,
    pidfd_identity,
    read_peak_rss,
    read_proc_stat,
    readable_now,
    waitid_peek,
)

_log = logging.getLogger("healthkit")

__all__ = ["ExitStatus", "ProcessWatch", "WatchSet", "read_proc_stat"]

HAVE_PIDFD: Final = hasattr(os, "pidfd_open") and hasattr(os, "P_PIDFD")

# How long to wait for a concurrent reaper (another thread calling is_alive()/wait() on the
# same Process/Popen) to publish the return code it took from the kernel.
_REAPER_HANDOFF_S: Final = 1.0
# How long a forkserver may take to report a dead child's exit code to the Process object.
_OWNER_HANDOFF_S: Final = 5.0


@attrs.frozen
class ExitStatus:
    """How a process ended, as far as it can be known.

    ``returncode`` follows the ``subprocess``/``multiprocessing`` convention: ``>= 0`` is the
    exit code, ``-N`` means killed by signal N, ``None`` means the process is gone but its
    status could not be read (a non-child already reaped by its own parent).
    """

    returncode: int | None
    source: str
    observed_at: float = attrs.field(factory=time.monotonic)
    observed_at_wall: float = attrs.field(factory=time.time)
    core_dumped: bool = False

    @property
    def signal(self) -> signal.Signals | None:
        """The signal that killed the process, if it was killed by one."""
        if self.returncode is None or self.returncode >= 0:
            return None
        try:
            return signal.Signals(-self.returncode)
        except ValueError:
            return None

    @property
    def exit_code(self) -> int | None:
        """The exit code passed to ``exit()``, if the process exited by itself."""
        if self.returncode is None or self.returncode < 0:
            return None
        return self.returncode


def _status_from_siginfo(info: os.waitid_result, source: str) -> ExitStatus:
    if info.si_code == os.CLD_EXITED:
        return ExitStatus(info.si_status, source)
    return ExitStatus(-info.si_status, source, core_dumped=info.si_code == os.CLD_DUMPED)


#: ``ExitStatus.source`` when a non-child's zombie hides its exit code from us.
UNKNOWN_NOT_PERMITTED: Final = "unknown: not permitted to read another user's exit status"
#: ``ExitStatus.source`` when our own child was reaped by someone else (``Popen.wait()``,
#: ``os.waitpid``) before its status could be read, with no owner object to ask.
UNKNOWN_REAPED_ELSEWHERE: Final = "unknown: our child, reaped elsewhere before it was read"
#: ``ExitStatus.source`` when the kernel discarded a child's status (SIGCHLD ignored).
UNKNOWN_SIGCHLD_IGNORED: Final = "unknown: SIGCHLD is ignored in this process"


def sigchld_ignored() -> bool:
    """Whether SIGCHLD is set to ``SIG_IGN`` here: children are then reaped by the kernel
    the moment they exit and their exit status is thrown away, for us and for
    ``multiprocessing``/``subprocess`` alike."""
    try:
        return signal.getsignal(signal.SIGCHLD) == signal.SIG_IGN
    except (ValueError, OSError):
        return False


def _is_forkserver(process: BaseProcess) -> bool:
    popen = getattr(process, "_popen", None)
    return type(popen).__module__ == "multiprocessing.popen_forkserver"


def _serialize_forkserver_poll(process: BaseProcess) -> None:
    """Make ``poll()`` of a forkserver Process's Popen safe to call from several threads.

    The forkserver sends a dead child's exit code over the Process's sentinel pipe, and
    ``popen_forkserver.Popen.poll`` reads it there: when two threads poll at once (a user's
    ``join()`` and our watcher), one reads the code and the other reads end-of-file and sets
    ``returncode = 255`` (seen in 5 of 100 runs). A per-object lock around the read makes the
    second caller find the code the first one read. The blocking wait for the pipe happens
    outside the lock, as before, so a blocking ``join()`` never holds up a poll.
    """
    popen = getattr(process, "_popen", None)
    if popen is None or getattr(popen, "_healthkit_poll_lock", None) is not None:
        return
    if not _is_forkserver(process):
        return  # fork/spawn children are never polled by us: waitid(WNOWAIT) peeks instead
    original = type(popen).poll
    lock = threading.Lock()
    # Weakly: a closure holding the Popen would make a cycle, and the Popen's sentinel fd
    # is closed by a finalizer that runs when the Popen is freed, not at the next gc pass.
    ref = weakref.ref(popen)

    def poll(flag: int = os.WNOHANG) -> int | None:
        target = ref()
        if target is None:
            return None
        if target.returncode is not None:
            return target.returncode  # type: ignore[no-any-return]
        if flag != os.WNOHANG:
            from multiprocessing.connection import wait

            wait([target.sentinel])
        with lock:
            if target.returncode is not None:
                return target.returncode
            return original(target, os.WNOHANG)  # type: ignore[no-any-return]

    popen._healthkit_poll_lock = lock
    popen.poll = poll


def _readable_now(fd: int) -> bool:
    return readable_now(fd)


class ProcessWatch:
    """A handle on one process that tells, event-driven, when and how it ended.

    Build it from a started ``multiprocessing.Process`` (``torch.multiprocessing`` too), a
    ``subprocess.Popen`` or a bare pid. ``fileno()`` is readable once the process has exited,
    so many watches can be waited on from one thread (see :class:`WatchSet`). It never
    reaps: an ended child stays a zombie until its owner collects it (``join()``,
    ``wait()``, ``os.waitpid``), so ``Process.exitcode`` and ``Popen.returncode`` stay
    exactly what they would be without the watch.
    """

    def __init__(
        self,
        target: BaseProcess | subprocess.Popen[bytes] | subprocess.Popen[str] | int,
        *,
        name: str | None = None,
        proc_root: str = "/proc",
        use_pidfd: bool = True,
    ) -> None:
        check_str(name, "name", allow_none=True)
        proc_root = path_arg(proc_root, "proc_root")
        check_bool(use_pidfd, "use_pidfd")
        self._lock = threading.Lock()
        self._status: ExitStatus | None = None
        self._closed = False
        self._pidfd: int | None = None
        self._done_fd: int | None = None
        self._proc_root = proc_root
        self._process: BaseProcess | None = None
        self._popen: subprocess.Popen[bytes] | subprocess.Popen[str] | None = None
        self._start_time: int | None = None
        self._identity: int | None = None
        self._exit_code_readable = True
        self._peak_rss: int | None = None
        self.is_child = True
        #: The process group the process was in when the watch was made (``None`` if
        #: unknown): a helper in its owner's group receives the owner's group signals.
        self.pgrp: int | None = None

        if isinstance(target, BaseProcess):
            if target.pid is None:
                raise ProcessNotStartedError(
                    f"{target.name} has not been started; call start() before watching it"
                )
            self._process = target
            pid = target.pid
            default_name = target.name
            _serialize_forkserver_poll(target)
        elif isinstance(target, subprocess.Popen):
            self._popen = target
            pid = target.pid
            args = target.args
            first = args[0] if isinstance(args, (list, tuple)) and args else args
            default_name = f"{os.path.basename(str(first))}"
        elif isinstance(target, int) and not isinstance(target, bool):
            pid = check_pid(target)
            default_name = f"pid {target}"
        else:
            raise InvalidArgumentTypeError(
                "target must be a multiprocessing.Process, a subprocess.Popen or a pid, "
                f"got {target!r} ({type(target).__name__})",
                "target",
            )
        if pid == os.getpid():
            raise InvalidArgumentError(
                f"target: pid {pid} is this process; a process cannot see its own death, so this "
                "watch could never report anything. Watch the helper processes it depends "
                "on (or watch this process from another one, e.g. mode='sidecar')",
                "target",
            )
        self.pid: int = pid
        self.name: str = name if name is not None else default_name

        owner_code = self._owner_returncode()
        if owner_code is not None:
            # Already reaped by its owner: nothing left to watch, the answer is known.
            self._status = ExitStatus(owner_code, "owner")
        elif HAVE_PIDFD and use_pidfd and self._open_pidfd():
            pass  # pinned by a pidfd (or found to be over already)
        elif self._process is None:
            raise UnsupportedError(
                "watching a Popen or a bare pid needs pidfd (Linux >= 5.4); "
                "watch a multiprocessing.Process instead"
            )
        if self._status is not None:
            # Already over: still hand out a pollable fd, one that is always readable.
            r, w = os.pipe()
            os.close(w)
            self._done_fd = r

    # ------------------------------------------------------------------ construction
    def _open_pidfd(self) -> bool:
        """Open and pin the pidfd; ``False`` when the kernel lacks pidfd support (Python
        has the calls, the kernel does not: pidfd_open needs 5.3, waitid(P_PIDFD) 5.4)."""
        try:
            self._pidfd = os.pidfd_open(self.pid)
        except ProcessLookupError:
            if self._process is None and self._popen is None:
                raise NoSuchProcessError(
                    f"no process with pid {self.pid}: check the pid (it may have exited "
                    "already and been reaped)"
                ) from None
            # Our child, reaped by someone else before we looked: its owner may know.
            code = self._wait_owner_returncode()
            self._status = ExitStatus(code, "owner" if code is not None else "unknown")
            return True
        except OSError as e:
            if e.errno in (errno.ENOSYS, errno.EPERM):  # old kernel; seccomp (old Docker)
                return False
            raise
        os.set_inheritable(self._pidfd, False)
        owner_code = self._owner_returncode()
        if owner_code is not None:
            # Reaped by its owner between our first look and pidfd_open(): the pidfd may
            # name a process that recycled the pid. The owner's answer is the right one.
            os.close(self._pidfd)
            self._pidfd = None
            self._status = ExitStatus(owner_code, "owner")
            return True
        try:
            os.waitid(os.P_PIDFD, self._pidfd, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            self.is_child = False
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            os.close(self._pidfd)  # Linux 5.3: pidfd_open, but no waitid(P_PIDFD)
            self._pidfd = None
            return False
        stat = read_proc_stat(self.pid, self._proc_root)
        if not self.is_child:
            self._exit_code_readable = may_read_exit_code(self.pid, self._proc_root)
        # The stat just read is this process's only if it still existed (maybe as a zombie,
        # which keeps its pid) *after* the read: a signal 0 through the pidfd proves it.
        # Otherwise the pid may already name a newcomer, whose start time must not be
        # pinned as ours.
        try:
            signal.pidfd_send_signal(self._pidfd, 0)
        except ProcessLookupError:
            stat = None
        except PermissionError:
            pass  # it exists; we may just not signal it
        self._start_time = stat.start_time if stat is not None else None
        self.pgrp = stat.pgrp if stat is not None else None
        # Finer than the start time where the kernel has it: see pidfd_identity.
        self._identity = pidfd_identity(self._pidfd) if stat is not None else None
        return True

    # ------------------------------------------------------------------ public API
    @property
    def status(self) -> ExitStatus | None:
        """The exit status once collected (by :meth:`poll` or :meth:`wait`), else ``None``."""
        return self._status

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def start_time(self) -> int | None:
        """The process's start time (``/proc/<pid>/stat`` field 22, clock ticks since boot),
        read while the pid was pinned to it; ``None`` if it was gone by then. With the pid
        it names the process: a later process that reuses the pid has another start time."""
        return self._start_time

    @property
    def peak_rss_bytes(self) -> int | None:
        """Highest resident set size seen by :meth:`sample_rss` while the process lived."""
        return self._peak_rss

    def fileno(self) -> int:
        """A file descriptor that becomes readable when the process has exited."""
        self._check_open()
        if self._pidfd is not None:
            return self._pidfd
        if self._done_fd is not None:
            return self._done_fd
        assert self._process is not None
        return self._process.sentinel

    def poll(self) -> ExitStatus | None:
        """The exit status if the process has ended, else ``None``; never blocks long.

        Raises :class:`WatchClosedError` after :meth:`close` (read :attr:`status` then).
        """
        self._check_open()
        if self._status is not None:
            return self._status
        if not _readable_now(self.fileno()):
            return None
        return self._collect()

    def wait(self, timeout: float | None = None) -> ExitStatus | None:
        """Block until the process ends (``None`` if ``timeout`` seconds pass first).

        Raises :class:`WatchClosedError` after :meth:`close` (read :attr:`status` then).
        """
        timeout = check_timeout(timeout, "timeout")
        self._check_open()
        if self._status is not None:
            return self._status
        poller = select.poll()
        poller.register(self.fileno(), select.POLLIN)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            ms = None if remaining is None else int(remaining * 1000) + 1
            if poller.poll(ms):
                return self._collect()
            if deadline is not None and time.monotonic() >= deadline:
                return None

    def peek(self) -> ExitStatus | None:
        """Like :meth:`poll`, but never reaps: an ended child stays a zombie.

        For code that must leave the zombie to someone else, e.g. a sidecar watcher that
        reads the exit status from ``/proc/<pid>/stat``. ``None`` while running.
        """
        self._check_open()
        if self._status is not None:
            return self._status
        if self._pidfd is None or not _readable_now(self._pidfd):
            return None
        # Under the collection lock: another thread may be reaping it right now (between
        # its waitpid() and publishing the code); wait for that instead of seeing nothing.
        with self._lock:
            if self._status is not None:
                return self._status
            if not self.is_child:
                return self._status_from_zombie()
            try:
                info = os.waitid(os.P_PIDFD, self._pidfd, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                info = None
            if info is None:  # reaped by its owner from another thread
                code = self._wait_owner_returncode()
                return None if code is None else ExitStatus(code, "owner")
            return _status_from_siginfo(info, "waitid")

    def is_alive(self) -> bool:
        return self.poll() is None

    def send_signal(self, sig: int) -> None:
        """Signal the process through its pidfd, so a recycled pid is never hit. ``sig`` is
        a signal of this platform (``signal.SIGTERM`` or its int; not its name)."""
        sig = check_signal(sig, "sig")
        self._check_open()
        if self._status is not None:
            return
        try:
            if self._pidfd is not None:
                signal.pidfd_send_signal(self._pidfd, sig)
            elif self._owner_returncode() is None:
                # Sentinel mode: no pidfd pins the identity, so only signal while the
                # owner has not reaped the child (after that the pid may be recycled).
                os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def sample_rss(self) -> int | None:
        """Read the kernel's peak RSS (VmHWM) of the live process; remember the maximum.

        Cheap (one small /proc read). A process killed by the OOM killer cannot be read
        afterwards, so callers that want this evidence sample while it is alive.
        """
        if self._status is not None or self._closed:
            return self._peak_rss
        if self._pidfd is not None and _readable_now(self._pidfd):
            return self._peak_rss  # exited: the pid may already name someone else
        rss = read_peak_rss(self.pid, self._proc_root)
        if rss is not None and (self._peak_rss is None or rss > self._peak_rss):
            self._peak_rss = rss
        return self._peak_rss

    def close(self) -> None:
        """Release the pidfd. Idempotent. The collected :attr:`status` stays readable.

        Closing does not reap: close a child's watch after it ended (or let the owning
        ``Process``/``Popen`` reap it), or it stays a zombie.
        """
        # Under the lock: a collection in another thread must not use the pidfd while (or
        # after) it is closed, when its number may already name another file.
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for fd in (self._pidfd, self._done_fd):
                if fd is not None:
                    os.close(fd)
            self._pidfd = self._done_fd = None

    def _check_open(self) -> None:
        if self._closed:
            raise WatchClosedError(f"the watch on {self.name} (pid {self.pid}) is closed")

    def __enter__(self) -> ProcessWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def __repr__(self) -> str:
        state = "running" if self._status is None else f"exited {self._status.returncode}"
        return f"<ProcessWatch {self.name!r} pid={self.pid} {state}>"

    # ------------------------------------------------------------------ collection
    def _owner_returncode(self) -> int | None:
        """What the owner object already knows, read without polling (which could reap)."""
        if self._process is not None:
            popen = getattr(self._process, "_popen", None)
            code = getattr(popen, "returncode", None)
            return code if isinstance(code, int) else None
        if self._popen is not None:
            return self._popen.returncode
        return None

    def _ask_forkserver(self) -> None:
        """Read a forkserver child's code from its sentinel pipe, through its own (serialised)
        ``Popen.wait`` rather than ``Process.join``, which would also drop it from
        multiprocessing's child list: that is for the owner's ``join()`` to do."""
        popen = getattr(self._process, "_popen", None)
        if popen is not None:
            with contextlib.suppress(OSError, ValueError):
                popen.wait(_OWNER_HANDOFF_S)

    def _wait_owner_returncode(self) -> int | None:
        """Someone else reaped the child; give its owner a moment to publish the code.

        Not when SIGCHLD is ignored: the kernel then reaps children itself and discards
        their status, so nobody will ever publish one.
        """
        if sigchld_ignored():
            return None
        if self._process is not None and _is_forkserver(self._process):
            # Nobody else may ever ask: the code waits in the sentinel pipe until read.
            self._ask_forkserver()
            return self._owner_returncode()
        deadline = time.monotonic() + _REAPER_HANDOFF_S
        while True:
            code = self._owner_returncode()
            if code is not None or time.monotonic() >= deadline:
                return code
            time.sleep(0.001)

    def _collect(self) -> ExitStatus:
        with self._lock:
            if self._status is None:
                self._check_open()
                self._status = (
                    self._collect_pidfd() if self._pidfd is not None else self._collect_sentinel()
                )
            return self._status

    def _collect_pidfd(self) -> ExitStatus:
        assert self._pidfd is not None
        if not self.is_child:
            # The zombie's status is readable only until its own parent reaps it; read it
            # first. A forkserver Process is such a non-child, and its owner object learns
            # the exit code from the forkserver over a pipe: ask it too (authoritative).
            status = self._status_from_zombie()
            if self._process is not None:
                self._ask_forkserver()
                code = self._owner_returncode()
                if code is not None:
                    return ExitStatus(code, "multiprocessing", core_dumped=status.core_dumped)
            return status
        try:
            # The GIL kept: with a CPU-busy main thread each retake of it can wait a switch
            # interval, between the wake-up and the action (benchmarks/bench_busy_deaths.py).
            info = waitid_peek(self._pidfd)
        except ChildProcessError:
            info = None  # reaped under us by another thread (e.g. Process.is_alive())
        if info is None:
            code = self._wait_owner_returncode()
            if code is not None:
                return ExitStatus(code, "owner")
            return ExitStatus(
                None, UNKNOWN_SIGCHLD_IGNORED if sigchld_ignored() else UNKNOWN_REAPED_ELSEWHERE
            )
        return _status_from_siginfo(info, "waitid")  # the zombie stays for its owner

    def _status_from_zombie(self) -> ExitStatus:
        if not self._exit_code_readable:
            return ExitStatus(None, UNKNOWN_NOT_PERMITTED)
        stat = read_proc_stat(self.pid, self._proc_root)
        if (
            stat is not None
            and stat.state in ("Z", "X")
            and stat.start_time == self._start_time
            and stat.exit_status is not None
        ):
            return ExitStatus(
                os.waitstatus_to_exitcode(stat.exit_status),
                f"{self._proc_root}/{self.pid}/stat",
                core_dumped=bool(stat.exit_status & 0x80),
            )
        return ExitStatus(None, "unknown: not our child, already reaped by its parent")

    def _collect_sentinel(self) -> ExitStatus:
        assert self._process is not None
        # No pidfd (old kernel): the sentinel closes before the child is a zombie, and the
        # only way to read the status is the owner's own poll. A blocking join on an
        # exiting process is bounded by the kernel finishing exit(), so bound it generously.
        self._process.join(_REAPER_HANDOFF_S)
        code = self._owner_returncode()
        return ExitStatus(code, "multiprocessing" if code is not None else "unknown")


@attrs.frozen
class _PlainFd:
    fd: int
    on_ready: Callable[[], None]


class WatchSet:
    """Wait for the first of many watches to end, from one thread, without polling.

    Backed by ``selectors.DefaultSelector`` (epoll on Linux, so thousands of watches are
    fine) plus a wake-up pipe: another thread may :meth:`add`, :meth:`remove`,
    :meth:`wake` or :meth:`close` while :meth:`wait` blocks. Readiness is level-triggered:
    a watch whose process has ended is returned by every :meth:`wait` until it is removed.
    Each watch costs one file descriptor (its pidfd), so mind ``RLIMIT_NOFILE``.
    """

    def __init__(self, watches: Iterable[ProcessWatch] = ()) -> None:
        if isinstance(watches, (str, bytes)) or not isinstance(watches, Iterable):
            raise InvalidArgumentTypeError(
                f"watches must be an iterable of healthkit.ProcessWatch, got {watches!r}",
                "watches",
            )
        watches = list(watches)
        for w in watches:
            if not isinstance(w, ProcessWatch):
                raise InvalidArgumentTypeError(
                    f"watches must hold healthkit.ProcessWatch objects (wrap a Process, Popen "
                    f"or pid in ProcessWatch(...)), got {w!r}",
                    "watches",
                )
        self._selector = selectors.DefaultSelector()
        self._lock = threading.Lock()
        # Guards the wake-up pipe's fds against close(): writing to a closed fd *number*
        # could write into whatever file reuses it. Reentrant because wake() may run in a
        # signal handler that interrupted this same thread while it held the lock.
        self._wake_lock = threading.RLock()
        self._watches: dict[int, tuple[ProcessWatch, int]] = {}  # id(watch) -> (watch, fd)
        self._plain: dict[int, _PlainFd] = {}  # fd -> callback holder
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._closed = False
        self._released = False
        self._woken = False
        self._waiters = 0
        for w in watches:
            self.add(w)

    def add(self, watch: ProcessWatch) -> None:
        """Start waiting on ``watch``; adding the same watch twice is a no-op."""
        if not isinstance(watch, ProcessWatch):
            raise InvalidArgumentTypeError(
                f"watch must be a healthkit.ProcessWatch (wrap a Process, Popen or pid in "
                f"ProcessWatch(...)), got {watch!r}",
                "watch",
            )
        with self._lock:
            self._check_open()
            if id(watch) in self._watches:
                return
            fd = watch.fileno()
            stale = self._selector.get_map().get(fd)
            if stale is not None and isinstance(stale.data, ProcessWatch) and stale.data.closed:
                # A watch closed while still in the set left its fd number registered (the
                # kernel dropped the file from epoll, the selector's map did not); that
                # number now belongs to this watch.
                self._watches.pop(id(stale.data), None)
                self._selector.unregister(fd)
            self._selector.register(fd, selectors.EVENT_READ, watch)
            self._watches[id(watch)] = (watch, fd)
            if self._waiters:
                self._poke()  # selectors other than epoll only see new fds on the next call

    def add_fd(self, fd: int, on_ready: Callable[[], None]) -> None:
        """Also wait on a plain fd (a wake-up or readiness pipe, a socket).

        Whenever ``fd`` is readable, :meth:`wait` calls ``on_ready()`` in the waiting thread
        and goes on waiting; ``on_ready`` must consume what made the fd readable (the
        readiness is level-triggered) and may call :meth:`wake` to make :meth:`wait` return.
        The fd stays the caller's: :meth:`close` does not close it.
        """
        check_int(fd, "fd", minimum=0)
        check_callable(on_ready, "on_ready")
        with self._lock:
            self._check_open()
            if fd in self._plain:
                raise InvalidArgumentError(
                    f"fd {fd} is already in this WatchSet: remove_fd() it first", "fd"
                )
            holder = _PlainFd(fd, on_ready)
            self._selector.register(fd, selectors.EVENT_READ, holder)
            self._plain[fd] = holder
            if self._waiters:
                self._poke()

    def remove_fd(self, fd: int) -> None:
        """Stop waiting on a plain fd added with :meth:`add_fd` (no error if absent)."""
        with self._lock:
            if self._closed or self._plain.pop(fd, None) is None:
                return
            self._selector.unregister(fd)
            if self._waiters:
                self._poke()

    def remove(self, watch: ProcessWatch) -> None:
        """Stop waiting on ``watch`` (no error if it is not in the set)."""
        if not isinstance(watch, ProcessWatch):
            raise InvalidArgumentTypeError(
                f"watch must be a ProcessWatch (remove_fd() takes a plain fd), got {watch!r} "
                f"({type(watch).__name__})",
                "watch",
            )
        with self._lock:
            if self._closed:
                return
            entry = self._watches.pop(id(watch), None)
            if entry is None:
                return
            key = self._selector.get_map().get(entry[1])
            if key is not None and key.data is watch:
                self._selector.unregister(entry[1])
            if self._waiters:
                self._poke()

    def __len__(self) -> int:
        return len(self._watches)

    def __iter__(self) -> Iterator[ProcessWatch]:
        with self._lock:
            return iter([w for w, _ in self._watches.values()])

    @property
    def closed(self) -> bool:
        return self._closed

    def fileno(self) -> int:
        """An fd (the epoll instance) that is readable whenever a watch in the set has ended,
        a plain fd is readable, or :meth:`wake` was called.

        For waiting from another loop: register it with ``asyncio``'s ``add_reader`` or a
        bare ``poll()``, then call ``wait(0)`` to collect what happened. A hot loop that
        wakes every millisecond pays one ``poll()`` on one fd, however many watches there
        are. Invalid after :meth:`close`.
        """
        with self._lock:
            self._check_open()
            return self._selector.fileno()

    def wake(self) -> None:
        """Make a blocked :meth:`wait` return now (from any thread or a signal handler).

        With no :meth:`wait` in progress, the next one returns at once.
        """
        self._woken = True
        self._poke()

    def wait(self, timeout: float | None = None) -> list[ProcessWatch]:
        """Block until a watch ends, :meth:`wake` is called or ``timeout`` passes.

        Returns the watches whose process has ended, with their status collected (an empty
        list on timeout or wake-up). :meth:`add` and :meth:`remove` from other threads
        take effect without making it return. Raises :class:`WatchClosedError` if the set
        is (or gets) closed.
        """
        timeout = check_timeout(timeout, "timeout")
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            self._check_open()
            self._waiters += 1
        try:
            while True:
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                events = self._selector.select(remaining)
                if self._closed:
                    raise WatchClosedError("this WatchSet was closed while waiting on it")
                ended: list[ProcessWatch] = []
                for key, _ in events:
                    if key.data is None:
                        self._drain_wake()
                        continue
                    if isinstance(key.data, _PlainFd):
                        if self._plain.get(key.fd) is key.data:
                            key.data.on_ready()
                        continue
                    watch = key.data
                    entry = self._watches.get(id(watch))
                    if entry is None or entry[0] is not watch or watch.closed:
                        continue  # removed (or closed) by another thread meanwhile
                    try:
                        status = watch.poll()
                    except WatchClosedError:
                        continue
                    if status is not None:
                        ended.append(watch)
                if ended or self._woken:
                    self._woken = False
                    return ended
                if deadline is not None and time.monotonic() >= deadline:
                    return []
        finally:
            with self._lock:
                self._waiters -= 1
                if self._closed and not self._waiters:
                    self._release()

    def close(self) -> None:
        """Release the selector and the wake-up pipe (the watches stay open). Idempotent.

        A :meth:`wait` blocked in another thread raises :class:`WatchClosedError`; the
        resources are released when it has left.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._watches.clear()
            self._plain.clear()
            if self._waiters:
                self._poke()  # the last waiter to leave releases
            else:
                self._release()

    def __enter__(self) -> WatchSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise WatchClosedError("this WatchSet is closed")

    def _poke(self) -> None:
        with self._wake_lock:
            if self._released:
                return
            try:
                os.write(self._wake_w, b"\0")
            except OSError:
                pass  # pipe full: a wake-up is already pending

    def _release(self) -> None:
        with self._wake_lock:
            if self._released:
                return
            self._released = True
            self._selector.close()
            os.close(self._wake_r)
            os.close(self._wake_w)

    def _drain_wake(self) -> None:
        with self._wake_lock:
            if self._released:
                return
            try:
                while os.read(self._wake_r, 4096):
                    pass
            except BlockingIOError:
                pass
