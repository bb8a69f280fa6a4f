"""Knowing when this process is being stopped, so that helpers dying with it are not blamed.

Launchers stop jobs by signalling whole process groups: torchrun ``killpg(SIGTERM)``s each
worker's group, a terminal's Ctrl-C reaches the whole foreground group. Helpers in the
owner's group then die of the same signal (or, forked, run the owner's inherited handler and
exit 0 or 1) while the owner is still running its own cleanup. Seen from the helper alone that
is a crash; it is a shutdown. But a stop is an *episode*, not a state: a process that handles
a signal and carries on (a notebook's "Interrupt kernel", a training loop that catches
``KeyboardInterrupt``, a SIGHUP log reopen) is not stopping any more a few seconds later. This
module records *when* each stop signal reached this process; :func:`current_episode` turns
that history into the episode under way at a given moment, and the firing rule
(:func:`healthkit._decide.decide`) judges each death against it.

Two traces of a stop signal, both read when a death is judged:

* **Delivered.** ``signal.set_wakeup_fd``: CPython's C-level handler writes the signal number
  to that fd the moment a signal with a Python-level handler is delivered (the default SIGINT
  handler and any handler the application installs, before or after ``arm()``), without the
  GIL and before any Python code runs. healthkit keeps that fd (one end of a socketpair) for
  the life of the process. One listener thread per process reads it: for each byte it first
  *peeks* (records the time, tells the sidecars), then consumes. A sidecar holds a copy of the
  read end and only ever peeks, so a byte that the owner could not read yet (its GIL is held)
  is visible to it, and no two readers race for a byte.
* **Pending.** A signal the kernel has queued but no thread has taken yet (the main thread in an
  uninterruptible read from a slow NFS/FUSE file, the signal blocked) is in
  ``/proc/<pid>/status`` (``ShdPnd``/``SigPnd``).
* **Being handled.** Between the moment a thread takes a signal (it is no longer pending) and
  the moment the C handler has written its byte, the thread can be preempted (on a loaded
  machine, for milliseconds). While the handler runs, the kernel blocks that signal in the
  thread: a stop signal in a thread's ``SigBlk`` that the thread does not usually block is a
  stop being delivered right now (:class:`HandlerWatch`).

``killpg`` queues the signal on every member of the group before any of them can exit (the
exit takes the tasklist lock that ``killpg`` holds), so when a helper's death is seen, the
owner's share of the same group signal is already pending, being handled or delivered; read in
that order, a signal that moves on between two looks is caught by the next, and recognising a
group stop never needs a wait.

The application keeps its wakeup fd. ``signal.set_wakeup_fd`` is replaced, at the first
``install()``, by a function with the same contract (main thread only, returns the previous
fd) that records the application's fd instead of handing it to the interpreter; the listener
relays every byte to it. asyncio (``loop.add_signal_handler``) and trio therefore work as before,
whether their loop started before or after ``arm()``, and a finished ``asyncio.run()`` that set
the fd back to -1 does not blind healthkit. Code that reaches the C API directly, or a handler
written in C, leaves no trace here: such an application calls :func:`note_stop` from its
handler.

A forked child starts with no history and hands the interpreter the application's fd back.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import math
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from typing import Any, Final, Literal

import attrs

from healthkit import _runtime
from healthkit._errors import (
    InvalidArgumentError,
    InvalidArgumentTypeError,
    check_seconds,
    check_signal,
)
from healthkit._os.proc import (
    any_thread_running,
    read_fd_now,
    read_pending_signals,
    read_proc_stat,
    read_threads,
)

__all__ = [
    "STOP_SIGNALS",
    "HandlerWatch",
    "StopEpisode",
    "Witness",
    "acquire_witness",
    "current_episode",
    "episode",
    "HANDLER_CONFIRM_S",
    "install",
    "mask_not_stop",
    "may_be_taking_stop",
    "note_stop",
    "note_stop_survived",
    "pending_stop",
    "popen_with_stop_signals_blocked",
    "release_witness",
    "start_without_signals",
    "survived_marks",
    "take_signals_again",
    "witness_pid",
    "witness_watch",
    "died_at",
]

#: The signals that mean "stop" when a launcher, a terminal or a scheduler sends them.
STOP_SIGNALS: Final = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP})
_STOP_MASK: Final = sum(1 << (sig - 1) for sig in STOP_SIGNALS)  # as in /proc's SigBlk

#: How a stop signal was seen: delivered (the wakeup fd), pending (``/proc``, not yet taken
#: by any thread), being handled (taken, its handler still running), noted by the
#: application (:func:`note_stop`), or witnessed (received by another process of this
#: process's group that does nothing but record stop signals: :class:`Witness`).
Seen = Literal["delivered", "pending", "handling", "noted", "witnessed"]

_HISTORY = 64  # stop signals remembered; an episode never needs more than the last few


@attrs.frozen
class StopEpisode:
    """A stop of this process under way: the first stop signal of the episode and when it came.

    ``began`` is ``time.monotonic()`` (``CLOCK_MONOTONIC``, the same clock in every process of
    the machine, so a sidecar and its owner compare times directly).
    """

    signal: signal.Signals
    began: float
    seen: Seen
    #: Every stop signal of the episode, as each was seen (the first is the one above).
    signals: tuple[Signal, ...] = attrs.field(default=(), eq=False, repr=False)

    def preceded_by(self, died: float) -> bool:
        """Did a death the witness stamped at ``died`` come before every stop signal of this
        episode?

        Only the witness's own stamps order a death against a stop: a signal seen another way
        (delivered, pending, being handled) is stamped when it was noticed, which may be long
        after it came (the listener waiting for the GIL), never before. So: a stop stamped
        before the death came first, however it was seen; a later one is dated by the
        witness's stamp of the same signal, and one the witness never saw (sent to this
        process alone) cannot be ordered, so the stop stands.
        """
        if isinstance(died, bool) or not isinstance(died, (int, float)) or math.isnan(died):
            raise InvalidArgumentTypeError(
                f"died must be a time (time.monotonic()), got {died!r}", "died"
            )
        signals = self.signals or ((self.signal, self.began, self.seen),)
        witnessed = {sig for sig, _, seen in signals if seen == "witnessed"}
        for sig, at, seen in signals:
            if seen == "witnessed":
                if at <= died:  # in a tie the witness wrote the signal first: it came first
                    return False
            elif at < died or sig not in witnessed:
                return False
        return bool(witnessed)

    def describe(self, now: float) -> str:
        how = {
            "delivered": "received",
            "pending": "pending",
            "handling": "being handled",
            "noted": "noted",
            "witnessed": "received by the process group",
        }[self.seen]
        return f"{self.signal.name} {how} {max(0.0, now - self.began):.2f}s ago"


Signal = tuple[signal.Signals, float, Seen]


def current_episode(
    history: Iterable[Signal], now: float, grace: float, survived: Iterable[float] = ()
) -> StopEpisode | None:
    """The stop episode under way at ``now``, if any.

    An episode begins with a stop signal and lasts ``grace`` seconds; a stop signal inside it
    belongs to it (Ctrl-C pressed twice is one stop), a stop signal after it begins a new one.
    ``survived``: the times the application said it carries on after a stop
    (:func:`note_stop_survived`): each one ends the episode under way then, and the stop
    signals up to it belong to that ended episode. Pure: the same arguments always give the
    same episode.
    """
    if isinstance(history, (str, bytes)) or not isinstance(history, Iterable):
        raise InvalidArgumentTypeError(
            f"history must be an iterable of (signal, time, how seen), got {history!r}",
            "history",
        )
    if isinstance(now, bool) or not isinstance(now, (int, float)) or not math.isfinite(now):
        raise InvalidArgumentTypeError(f"now must be a finite number, got {now!r}", "now")
    check_seconds(grace, "grace")
    if isinstance(survived, (str, bytes)) or not isinstance(survived, Iterable):
        raise InvalidArgumentTypeError(
            f"survived must be an iterable of times (time.monotonic()), got {survived!r}",
            "survived",
        )
    marks = sorted(survived)
    for mark in marks:
        if isinstance(mark, bool) or not isinstance(mark, (int, float)) or math.isnan(mark):
            raise InvalidArgumentTypeError(
                f"survived must hold times (time.monotonic()), got {mark!r}", "survived"
            )

    def end(began: Signal) -> float:
        """When the episode that ``began`` opened is over: its grace, or the first time the
        application said it survived it."""
        over = began[1] + grace
        for mark in marks:
            if mark >= began[1]:
                return min(over, mark)
        return over

    began: Signal | None = None
    # History holds only signals that have arrived: one stamped after ``now`` arrived while
    # the caller was reading it (the read takes a moment), so it counts as arrived at ``now``.
    ordered = sorted(
        ((sig, min(when, now), seen) for sig, when, seen in history), key=lambda e: e[1]
    )
    for entry in ordered:
        if began is None:
            began = entry
            continue
        over = end(began)
        # A signal at the very moment of a "survived" still belongs to the stop it ended.
        if entry[1] > over or (entry[1] == over and over == began[1] + grace):
            began = entry
    if began is None or now >= end(began):
        return None
    signals = tuple(e for e in ordered if e[1] >= began[1])
    return StopEpisode(began[0], began[1], began[2], signals)


def pending_stop(pid: int) -> signal.Signals | None:
    """A stop signal queued for ``pid`` that no thread of it has taken yet, if any."""
    pending = read_pending_signals(pid)
    if not pending:
        return None
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        if sig in pending:
            return sig
    return None


#: How long a stop signal may look handled (blocked beyond a thread's usual mask) with no
#: other trace of any stop signal before it is taken for a mask instead. The kernel blocks
#: the signal only while the C-level handler runs (CPython's writes one byte and returns;
#: the Python handler runs later with the signal unblocked), microseconds, or a preemption
#: on a loaded machine: a second of it with nothing delivered, pending or witnessed is a
#: thread that blocked the stop signals itself (a critical section, a library), and no stop
#: signal was generated at all.
HANDLER_CONFIRM_S: Final = 1.0


def mask_not_stop(handling_since: float, now: float, others: Iterable[Signal]) -> bool:
    """Is a stop signal first seen "being handled" at ``handling_since`` a mask, not a
    stop? True once it has lasted :data:`HANDLER_CONFIRM_S` while no other trace of a stop
    signal (``others``: delivered, pending, noted, witnessed) came near it."""
    if now - handling_since < HANDLER_CONFIRM_S:
        return False
    near = handling_since - HANDLER_CONFIRM_S
    return not any(seen != "handling" and when >= near for _, when, seen in others)


class HandlerWatch:
    """Sees a stop signal of process ``pid`` while one of its threads runs its handler, and
    whether one of its threads may be taking a signal right now.

    A thread's usual mask is the least it has been seen to block (:meth:`learn` at arm time
    sees the main thread before any stop). On entry to a handler the kernel blocks the signal
    and the handler's ``sa_mask``, which CPython leaves empty: a stop signal blocked beyond the
    usual mask, with nothing else blocked beyond it, means a handler for it is running. A
    thread that blocks more than stop signals is masking on purpose, not handling: CPython's
    ``subprocess`` blocks every signal in the calling thread around its ``vfork()``, and
    :func:`start_without_signals` around a thread's start. A thread that blocks stop signals
    only, for a while, looks like a handler: a death seen then is deferred by the stop grace,
    never dropped.
    """

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._usual: dict[int, int] = {}
        self._lock = threading.Lock()

    def learn(self) -> None:
        self.handling()

    def handling(self) -> signal.Signals | None:
        threads = read_threads(self.pid, hold_gil=True)  # masks do not wait for the GIL
        if threads is None:
            return None
        with self._lock:
            usual = {tid: self._usual.get(tid, mask) & mask for tid, (_, mask) in threads.items()}
            self._usual = usual
        extra = 0
        for tid, (_, mask) in threads.items():
            beyond = mask & ~usual[tid]
            if beyond & ~_STOP_MASK == 0:
                extra |= beyond
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            if extra >> (sig - 1) & 1:
                return sig
        return None

    def accept(self) -> None:
        """Take every thread's mask as it is now as its usual one: a stop signal it blocks
        has stayed blocked too long for a handler (:func:`mask_not_stop`)."""
        threads = read_threads(self.pid, hold_gil=True)
        if threads is None:
            return
        with self._lock:
            self._usual = {tid: mask for tid, (_, mask) in threads.items()}

    def running(self, *, besides: int | None = None) -> bool:
        """Is a thread of the process (other than thread id ``besides``) on a CPU or waiting
        for one (``R``), or in an uninterruptible wait (``D``)?

        Only such a thread can be between taking a signal (it is no longer pending) and the
        kernel blocking it for the handler (it is not yet seen as handled): the kernel does
        both in the thread's own context. A process whose threads all sleep cannot be.
        """
        return any_thread_running(self.pid, besides=besides)


#: Signals healthkit's own threads never take: every signal but the ones a fault raises in
#: the faulting thread (those cannot be redirected) and the two that cannot be blocked.
_NOT_FOR_OUR_THREADS: Final = frozenset(signal.valid_signals()) - {
    signal.SIGKILL,
    signal.SIGSTOP,
    signal.SIGSEGV,
    signal.SIGBUS,
    signal.SIGFPE,
    signal.SIGILL,
    signal.SIGABRT,
    signal.SIGTRAP,
    signal.SIGSYS,
}


def start_without_signals(thread: threading.Thread) -> None:
    """Start ``thread`` with the process's signals blocked in it from birth.

    The kernel gives a signal sent to the process to any thread that does not block it.
    Python runs handlers in the main thread only, and a signal taken by another thread
    does not interrupt what the main thread waits in (``time.sleep``, a ``select``): a
    SIGTERM taken by one of healthkit's threads could wait a whole sleep before its handler
    ran. Blocked from birth (inherited from the creating thread, which blocks them for the
    moment of the start), the thread's mask is the same whenever :class:`HandlerWatch` first
    sees it, so it never looks like a handler running.
    """
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _NOT_FOR_OUR_THREADS)
    try:
        thread.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def popen_with_stop_signals_blocked(args: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """Start one of healthkit's helper programs (the sidecar, its link process) with the stop
    signals blocked from birth; the program unblocks them once its handlers are in place.

    A helper runs in its owner's process group, so a Ctrl-C or a launcher's group SIGTERM
    reaches it too. During its interpreter's start-up (seconds on a loaded machine) it has
    no handler yet: a SIGINT printed its ``KeyboardInterrupt`` traceback (healthkit's import
    path, in the job's output) and a SIGTERM ended it. A blocked signal waits instead (the
    mask survives ``exec``) and is taken by the handler the program installs first.
    """
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        return subprocess.Popen(args, **kwargs)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def take_signals_again() -> None:
    """In a thread started by :func:`start_without_signals`, before it runs the
    application's code (a watchdog's actions): what that code starts inherits a normal mask."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _NOT_FOR_OUR_THREADS)


class _Listener:
    """The per-process owner of the signal wakeup fd: the one reader of stop signals."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.rsock, self.wsock = socket.socketpair()  # close-on-exec: exec'd children never see it
        self.rsock.setblocking(False)
        self.wsock.setblocking(False)
        # Reentrant: note_stop() may run in a Python signal handler of the main thread while
        # that thread is inside history().
        self.lock = threading.RLock()
        self.history: collections.deque[Signal] = collections.deque(maxlen=_HISTORY)
        # When the application said it carries on after a stop (note_stop_survived), and
        # who hears of it (the sidecars).
        self.survived: collections.deque[float] = collections.deque(maxlen=_HISTORY)
        self.handlers = HandlerWatch(self.pid)
        # When each stop signal pending now, or being handled now, was first seen: one
        # episode with one start however many looks see it (a signal left blocked would
        # otherwise begin a new stop at every look, and never let a deferred death fire).
        self.pending_since: dict[signal.Signals, float] = {}
        self.handling_since: dict[signal.Signals, float] = {}
        self.app_fd = -1  # the application's wakeup fd: every byte is relayed to it
        self.app_warn = False
        self.thread = threading.Thread(
            target=self._listen, name="healthkit stop listener", daemon=True
        )

    def _listen(self) -> None:
        poller = select.poll()
        poller.register(self.rsock, select.POLLIN)
        while self.pid == os.getpid():
            with contextlib.suppress(InterruptedError):
                poller.poll()
            try:
                self.drain()
            except OSError:  # closed after fork in a child (this thread does not exist there)
                return

    def drain(self) -> None:
        """Record, announce and relay every byte waiting on the wakeup socket, then consume
        it. Peek first: until a byte is consumed, a sidecar peeking the same socket sees it."""
        with self.lock:
            while True:
                # The GIL kept (read_fd_now): a judge drains on every look, and with a
                # CPU-busy main thread each retake of the GIL can wait a switch interval.
                data = read_fd_now(self.rsock.fileno(), 4096, peek=True)
                if not data:
                    return
                now = time.monotonic()
                for byte in data:
                    if byte in STOP_SIGNALS:
                        self._record(signal.Signals(byte), now, "delivered")
                self._relay(data)
                read_fd_now(self.rsock.fileno(), len(data))

    def _record(self, sig: signal.Signals, when: float, seen: Seen) -> None:
        self.history.append((sig, when, seen))
        if seen in ("pending", "handling"):
            return  # a sidecar reads the owner's /proc itself
        _runtime.publish(_runtime.STOP_SIGNAL, sig, when)

    def _relay(self, data: bytes) -> None:
        fd = self.app_fd
        if fd < 0:
            return
        try:
            os.write(fd, data)
        except BlockingIOError:
            if self.app_warn:  # what the interpreter itself would have said
                sys.stderr.write(
                    "Exception ignored when trying to write to the signal wakeup fd:\n"
                    "BlockingIOError: [Errno 11] Resource temporarily unavailable\n"
                )
        except OSError:
            pass


#: The witness process: it records the stop signals its process group receives, and nothing
#: else. It inherits a mask (an owner that ``sigwait``\ s) and ignored signals from its
#: owner, so it sets both; every other signal whose default would end it is ignored, so only
#: SIGKILL, a stop of the group's job control, or its owner's end stop it.
_WITNESS_MAIN = r"""
import os, select, signal, sys, time
out, owner = int(sys.argv[1]), int(sys.argv[2])
stops = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
keep = stops | {signal.SIGKILL, signal.SIGSTOP, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU,
                signal.SIGCONT, signal.SIGCHLD, signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE,
                signal.SIGILL, signal.SIGABRT, signal.SIGTRAP, signal.SIGSYS, signal.SIGWINCH,
                signal.SIGURG}
def seen(signum, frame):
    try:
        os.write(out, b"%d %.6f\n" % (signum, time.monotonic()))
    except OSError:
        os._exit(0)  # the owner is gone
for sig in stops:
    signal.signal(sig, seen)
for sig in signal.valid_signals() - keep:
    signal.signal(sig, signal.SIG_IGN)
signal.pthread_sigmask(signal.SIG_SETMASK, ())
os.write(out, b"ready\n")
# The owner's helpers, by pidfd: each death is stamped on this process's clock, which never
# waits for the owner's GIL. A stop signal that reached this process before it saw a death is
# stamped no later than it: the kernel runs the C-level handler, which writes the signal's
# byte to the wakeup pipe, on the way back from select(), before this code reads the pipe
# (the Python handler may run a few bytecodes later: too late to order by).
wake_r, wake_w = os.pipe()
os.set_blocking(wake_r, False)
os.set_blocking(wake_w, False)
signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
try:  # a pidfd per helper: thousands of them are fine
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
except (ImportError, ValueError, OSError):
    pass
poller = select.poll()
poller.register(0, select.POLLIN)
poller.register(wake_r, select.POLLIN)
deaths, buf = {}, b""
while os.getppid() == owner:
    ready = [fd for fd, _ in poller.poll(1000)]
    died = time.monotonic()
    woke = b""
    try:
        while True:
            woke += os.read(wake_r, 4096)
    except BlockingIOError:
        pass
    ended = [fd for fd in ready if fd in deaths]
    if ended:
        for num in sorted({b for b in woke if b in stops}):
            os.write(out, b"%d %.6f\n" % (num, died))  # before the deaths, at the same time
    for fd in ended:
        os.write(out, b"D %d %d %.6f\n" % (*deaths.pop(fd), died))
        poller.unregister(fd)
        os.close(fd)
    if 0 not in ready:
        continue
    chunk = os.read(0, 4096)
    if not chunk:
        break
    *lines, buf = (buf + chunk).split(b"\n")
    for line in lines:
        try:
            pid, start = (int(x) for x in line.split())
            fd = os.pidfd_open(pid)
            with open("/proc/%d/stat" % pid) as f:
                same = int(f.read().rpartition(")")[2].split()[19]) == start
        except (ValueError, OSError):
            continue
        if same:
            deaths[fd] = (pid, start)
            poller.register(fd, select.POLLIN)
        else:
            os.close(fd)  # the pid was reused: not the helper
"""
_WITNESS_START_S = 30.0  # interpreter start-up on a loaded 2-core machine


class Witness:
    """A small process in this process's group that records each stop signal it receives.

    A signal sent to the group (torchrun's ``killpg(SIGTERM)``, a terminal's Ctrl-C) reaches
    every member at once, so the witness's record is this process's too, and nothing this
    process does can take it away: an event loop that binds ``signal.set_wakeup_fd`` before
    healthkit (uvloop), a ``sigwait`` that consumes the signal, a wakeup socket that a storm
    of other signals filled while the listener waited for the GIL. Its handler stamps the
    time in its own process (it never waits for anyone's GIL) and writes one line to a pipe,
    which holds thousands of lines until this process reads them. Between the kernel taking
    the signal and the line, the signal is pending for the witness or the witness is running
    (it runs for nothing else): :meth:`pending` and :meth:`busy` see that moment.

    A signal sent to this process alone does not reach the witness; the wakeup fd still
    records it when it can.

    It also stamps the deaths of the helpers it is told of (:meth:`watch`, by pidfd), on the
    same clock and in the same order as the signals: a death it saw before a stop signal it
    recorded came before that stop (:func:`died_at`), whenever this process gets to read it.
    """

    def __init__(self) -> None:
        self.owner = os.getpid()
        self.buf = b""
        #: (pid, start time) -> when the witness saw it end (its own clock), for the helpers
        #: it was told of
        self.deaths: dict[tuple[int, int], float] = {}
        rfd, wfd = os.pipe()
        # No handler may raise (a Ctrl-C) inside Popen: a child already forked would be left
        # running with nothing to end it. Blocked, the signal waits until it can be handled
        # below, where this object ends its witness; the witness clears the mask it inherits.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, _NOT_FOR_OUR_THREADS)
        try:
            try:
                self.proc = subprocess.Popen(
                    [sys.executable, "-I", "-S", "-c", _WITNESS_MAIN, str(wfd), str(self.owner)],
                    pass_fds=[wfd],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.DEVNULL,
                )
            finally:
                os.close(wfd)
        except BaseException:
            os.close(rfd)
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            raise
        self.rfd = rfd
        try:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # a Ctrl-C meanwhile: raised here
            self._wait_ready()
        except BaseException:  # never leave it running
            self.close()
            raise
        self.buf = self.buf.split(b"ready\n", 1)[1]
        os.set_blocking(rfd, False)
        self.pid = self.proc.pid

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + _WITNESS_START_S
        while b"ready\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.rfd], [], [], left)[0]:
                raise OSError("the stop-signal witness did not start in time")
            chunk = os.read(self.rfd, 4096)
            if not chunk:
                raise OSError("the stop-signal witness ended at start")
            self.buf += chunk

    def read(self) -> list[tuple[signal.Signals, float]]:
        """The stop signals recorded since the last read, with the witness's time for each."""
        while True:
            try:
                chunk = read_fd_now(self.rfd)  # the GIL kept, as the wakeup socket's
            except OSError:
                break
            if not chunk:
                break
            self.buf += chunk
        *lines, self.buf = self.buf.split(b"\n")
        out = []
        for line in lines:
            with contextlib.suppress(ValueError):
                if line.startswith(b"D "):
                    _, pid, start, at = line.split()
                    self.deaths[int(pid), int(start)] = float(at)
                    continue
                num, at = line.split()
                out.append((signal.Signals(int(num)), float(at)))
        return out

    def watch(self, processes: Iterable[tuple[int, int]]) -> None:
        """Stamp the deaths of ``processes`` (pid, start time in clock ticks: that process
        only, never a later one with the same pid) on the witness's clock. One write."""
        lines = b"".join(b"%d %d\n" % (pid, start) for pid, start in processes)
        if self.proc.stdin is None or not lines:
            return
        with contextlib.suppress(OSError, ValueError):
            self.proc.stdin.write(lines)
            self.proc.stdin.flush()

    def pending(self) -> signal.Signals | None:
        """A stop signal queued for the witness that its handler has not taken yet."""
        return pending_stop(self.pid)

    def busy(self) -> bool:
        """Is the witness running (it runs only to record a signal, or to end)?"""
        stat = read_proc_stat(self.pid)
        return stat is not None and stat.state in ("R", "D")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.rfd)
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        with contextlib.suppress(OSError):
            self.proc.kill()  # our unreaped child: the pid is still ours
        self.proc.wait()


_witness: Witness | None = None
_witness_users = 0


def acquire_witness() -> bool:
    """Start this process's witness, or count one more user of it. ``False`` if it could not
    start (the wakeup fd then stands alone)."""
    global _witness, _witness_users
    with _install_lock:
        if _witness is not None and _witness.owner != os.getpid():
            _witness, _witness_users = None, 0  # the parent's, in a forked child
        if _witness is None:
            try:
                _witness = Witness()
            except OSError:
                return False
        _witness_users += 1
        return True


def release_witness() -> None:
    """One user fewer; the last one ends the witness."""
    global _witness, _witness_users
    with _install_lock:
        if _witness is None or _witness.owner != os.getpid():
            return
        _witness_users -= 1
        if _witness_users > 0:
            return
        witness, _witness = _witness, None
    witness.close()


def witness_watch(processes: Iterable[tuple[int, int | None]]) -> None:
    """Have this process's witness stamp the deaths of ``processes`` (pid, start time) (see
    :func:`died_at`)."""
    witness = _this_witness()
    if witness is not None:
        with _install_lock:
            witness.watch((pid, start) for pid, start in processes if start is not None)


def died_at(pid: int, start_time: int | None) -> float | None:
    """When this process's witness saw ``pid`` (started at ``start_time``) end
    (``time.monotonic()``), if it watched it and has said so. Read with the stop signals, so
    the two are in the witness's order."""
    witness = _this_witness()
    if witness is None or start_time is None:
        return None
    history()
    return witness.deaths.get((pid, start_time))


def witness_pid() -> int | None:
    """The pid of this process's witness, if one runs (healthkit's own tree stops spare it)."""
    witness = _this_witness()
    return witness.pid if witness is not None else None


def _this_witness() -> Witness | None:
    witness = _witness
    return witness if witness is not None and witness.owner == os.getpid() else None


_listener: _Listener | None = None
_install_lock = threading.Lock()
_real_set_wakeup_fd = signal.set_wakeup_fd


def _set_wakeup_fd(fd: int, /, *, warn_on_full_buffer: bool = True) -> int:
    """``signal.set_wakeup_fd`` while healthkit holds the interpreter's wakeup fd: the same
    contract (main thread only, a valid non-blocking fd or -1, returns the previous one), but
    the fd is recorded and every signal byte is relayed to it by healthkit's listener."""
    listener = _listener
    if listener is None or listener.pid != os.getpid():
        return _real_set_wakeup_fd(fd, warn_on_full_buffer=warn_on_full_buffer)
    fd = fd.__index__()
    # Re-asserting ours checks the caller is the main thread of the main interpreter, with
    # the interpreter's own error.
    _real_set_wakeup_fd(listener.wsock.fileno(), warn_on_full_buffer=False)
    if fd != -1:
        os.fstat(fd)  # OSError for a closed fd, as the interpreter raises
        if os.get_blocking(fd):
            raise ValueError(f"the fd {fd} must be in non-blocking mode")
    previous, listener.app_fd, listener.app_warn = listener.app_fd, fd, warn_on_full_buffer
    return previous


functools.update_wrapper(_set_wakeup_fd, _real_set_wakeup_fd)


def install() -> bool:
    """Start noticing stop signals in this process; idempotent. Main thread only.

    Returns ``False`` when called from another thread before any main-thread call (the signal
    wakeup fd can only be set from the main thread); delivered stop signals then leave no
    trace, and only pending ones and :func:`note_stop` are seen.
    """
    global _listener
    with _install_lock:
        if _listener is not None and _listener.pid == os.getpid():
            return True
        if threading.current_thread() is not threading.main_thread():
            return False
        listener = _Listener()
        try:
            previous = _real_set_wakeup_fd(listener.wsock.fileno(), warn_on_full_buffer=False)
        except ValueError:  # not the main interpreter
            listener.rsock.close()
            listener.wsock.close()
            return False
        listener.app_fd = previous  # an asyncio loop already running: relay to it
        listener.handlers.learn()
        _listener = listener
        signal.set_wakeup_fd = _set_wakeup_fd
        start_without_signals(listener.thread)
        _runtime.at_fork_in_child("the parent's stop-signal listener and witness", _reset_in_child)
        return True


def _reset_in_child() -> None:
    """After fork, in the child: the parent's listener is not ours. Hand the interpreter the
    application's wakeup fd back (the child's main thread is the thread that forked)."""
    global _listener, _witness, _witness_users
    witness, _witness, _witness_users = _witness, None, 0
    if witness is not None:  # the parent's: never ours to end
        with contextlib.suppress(OSError):
            os.close(witness.rfd)
    listener, _listener = _listener, None
    if listener is None:
        return
    with contextlib.suppress(Exception):
        _real_set_wakeup_fd(listener.app_fd, warn_on_full_buffer=listener.app_warn)
    for sock in (listener.rsock, listener.wsock):
        with contextlib.suppress(OSError):
            sock.close()


def _here() -> _Listener | None:
    listener = _listener
    return listener if listener is not None and listener.pid == os.getpid() else None


def peek_fd() -> int | None:
    """The read end of the wakeup socket, for a sidecar to peek at (never to read)."""
    listener = _here()
    return listener.rsock.fileno() if listener is not None else None


def history() -> list[Signal]:
    """Every stop signal this process is known to have received, oldest first; a stop signal
    pending right now is added as seen now."""
    listener = _here()
    now = time.monotonic()
    # In the order a signal lives: queued (pending), taken (its handler running), delivered
    # (its byte on the socket), then read. Looked at in that order, a signal that moves on
    # between two looks is still caught by the next.
    sig = pending_stop(os.getpid())
    witness = _this_witness()
    witnessed = witness.pending() if witness is not None else None
    if listener is None:
        return [(sig, now, "pending")] if sig is not None else []
    handled = listener.handlers.handling() if sig is None else None
    with contextlib.suppress(OSError):
        listener.drain()
    with listener.lock:
        for since, seen_now in (
            (listener.pending_since, sig),
            (listener.handling_since, handled),
        ):
            for gone in [s for s in since if s != seen_now]:
                del since[gone]
        if sig is not None and sig not in listener.pending_since:
            listener.pending_since[sig] = now
            listener._record(sig, now, "pending")  # kept: its start does not move
        if witness is not None:
            for got, at in witness.read():
                listener._record(got, at, "witnessed")
        seen = list(listener.history)
    if witnessed is not None:
        seen.append((witnessed, now, "pending"))  # kept once its line is read
    # Not kept: if a handler was running, its byte is in the history from now on; if the
    # thread only blocked the signal for a while, nothing stays behind. Dated from when it
    # was first seen, so a mask that stays is one stop, not a new one at every look.
    if handled is None:
        return seen
    with listener.lock:
        began = listener.handling_since.setdefault(handled, now)
        if mask_not_stop(began, now, seen):
            # Blocked for good with no stop signal anywhere: a mask, learned as usual. A
            # stop signal sent from now on stays pending, and is seen as such.
            del listener.handling_since[handled]
            listener.handlers.accept()
            return seen
    return [*seen, (handled, began, "handling")]


def survived_marks() -> list[float]:
    """When the application said it carries on after a stop (:func:`note_stop_survived`)."""
    listener = _here()
    if listener is None:
        return []
    with listener.lock:
        return list(listener.survived)


def episode(
    now: float, grace: float, *, ignore: frozenset[signal.Signals] = frozenset()
) -> StopEpisode | None:
    """The stop episode of this process under way at ``now`` (see :func:`current_episode`).
    ``ignore``: signals that do not stop this process (SIGINT in an interactive shell)."""
    seen = [e for e in history() if e[0] not in ignore]
    return current_episode(seen, now, grace, survived_marks())


#: How long :func:`note_stop_survived` waits, at most, for a group stop signal still on its
#: way to a witness (pending for it, or its handler running) to be recorded before the mark.
_SETTLE_S = 0.2


def _settle(pids: Iterable[int]) -> None:
    """Wait (bounded) until none of ``pids`` has a stop signal pending or is running: a
    group stop still on its way to a witness is then recorded, with its own time, before the
    application's "survived" mark, so it cannot open a new stop after it."""
    deadline = time.monotonic() + _SETTLE_S
    pids = list(pids)
    while time.monotonic() < deadline:
        busy = False
        for pid in pids:
            stat = read_proc_stat(pid)
            if pending_stop(pid) is not None or (stat is not None and stat.state == "R"):
                busy = True
                break
        if not busy:
            return
        time.sleep(0.005)


def note_stop_survived(*, witnesses: Iterable[int] = ()) -> float | None:
    """Record that this process handled the stop signals it got so far and carries on.

    The stop episode under way ends now: a death it deferred is reported at once, and a
    later death is not deferred by it (a later stop signal opens a new episode). Returns the
    time of the mark (``time.monotonic()``), or ``None`` if healthkit watches no stop
    signals in this process. ``witnesses``: pids of other processes that record this
    process's group stops (sidecars), given a moment to record one on its way first.
    """
    listener = _here()
    if listener is None:
        return None
    witness = _this_witness()
    _settle([*([witness.pid] if witness is not None else []), *witnesses])
    history()  # every stop signal received so far is recorded, with its own time, first
    with listener.lock:
        now = time.monotonic()
        listener.survived.append(now)
        _runtime.publish(_runtime.STOP_SURVIVED, now)
    return now




def may_be_taking_stop() -> bool:
    """Could a thread of this process, other than the caller, be taking a signal right now
    (see :meth:`HandlerWatch.running`)? Then a stop may be on its way to being seen."""
    listener = _here()
    if listener is None:
        return False
    witness = _this_witness()
    if witness is not None and witness.busy():
        return True
    return listener.handlers.running(besides=threading.get_native_id())


def note_stop(signum: int = signal.SIGTERM) -> None:
    """Record that this process is being stopped, for handlers healthkit cannot see (one
    written in C, or a signal delivered through a route that bypasses the wakeup fd)."""
    sig = check_signal(signum, "signum")
    if sig not in STOP_SIGNALS:
        # A stop episode defers the report of a dead helper: only a signal that asks this
        # process to stop may open one (docs/security.md).
        raise InvalidArgumentError(
            f"signum must be a stop signal (SIGTERM, SIGINT or SIGHUP), got {sig.name}: "
            "note_stop() opens a stop episode, which defers the report of a dead helper",
            "signum",
        )
    listener = _here()
    if listener is None:
        if not install():
            return
        listener = _here()
        assert listener is not None
    with listener.lock:
        listener._record(sig, time.monotonic(), "noted")

