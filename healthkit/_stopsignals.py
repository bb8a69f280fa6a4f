"""Knowing that this process is being stopped, so that helpers dying with it are not blamed.

Launchers stop jobs by signalling whole process groups: torchrun ``killpg(SIGTERM)``s each
worker's group, a terminal's Ctrl-C reaches the whole foreground group. Helpers in the
owner's group then die of the same signal (or, forked, run the owner's inherited handler and
exit 0 or 1) while the owner is still running its own cleanup. Seen from the helper alone that
is a crash; it is a shutdown. The watchdog asks this module whether the owner was asked to
stop before it blames a helper for a stop-like death.

Mechanism: ``signal.set_wakeup_fd``. CPython's C-level signal handler writes the signal number
to that fd when the signal is *delivered*, for every signal that has a Python-level handler:
the default SIGINT handler and any handler the application installs, before or after
``arm()``. It does so without the GIL, before any Python code runs, so it works while the main
thread sits in native code, and a sidecar holding the read end learns of it even then.
Signals left at ``SIG_DFL`` (SIGTERM and SIGHUP by default) kill the process outright: there is
no owner left to protect and nothing to tell apart.

When the wakeup fd is already taken (an asyncio loop set it), existing Python-level handlers of
SIGTERM, SIGINT and SIGHUP are wrapped instead: the wrapper writes the same byte and then calls
the handler it replaced. Handlers at ``SIG_DFL``/``SIG_IGN`` are never replaced, so
installing healthkit never changes how the process reacts to a signal. An application that
later replaces both (an asyncio loop started after ``arm()`` with ``add_signal_handler``)
calls :func:`note_stop` from its handler.

The state is per process: a stop seen once stays seen (a process asked to stop is stopping).
A forked child starts with a clean state and gives the wakeup fd back, so a helper's own
signals are never taken for the owner's.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any, Final

__all__ = ["STOP_SIGNALS", "install", "note_stop", "read_fd", "stop_seen"]

#: The signals that mean "stop" when a launcher, a terminal or a scheduler sends them.
STOP_SIGNALS: Final = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP})

_lock = threading.Lock()
_pid: int | None = None  # the process the state below belongs to
_read: int | None = None
_write: int | None = None
_wakeup_ours = False
_wrapped: dict[int, Any] = {}  # signum -> the handler our wrapper chains to
_seen: tuple[signal.Signals, float] | None = None
_listeners: list[Callable[[signal.Signals], None]] = []
_sources: list[Callable[[], None]] = []
_at_fork_registered = False


def install() -> bool:
    """Start noticing stop signals in this process; idempotent. Main thread only.

    Returns ``False`` when called from another thread before any main-thread call (the
    signal machinery can only be changed from the main thread); stop detection is then
    unavailable and group stops may be reported as helper failures.
    """
    global _pid, _read, _write, _wakeup_ours, _at_fork_registered
    with _lock:
        if _pid == os.getpid():
            return True
        if threading.current_thread() is not threading.main_thread():
            return False
        r, w = os.pipe()  # close-on-exec: spawned and exec'd children never see it
        os.set_blocking(r, False)
        os.set_blocking(w, False)
        try:
            previous = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        except ValueError:  # not the main interpreter
            os.close(r)
            os.close(w)
            return False
        if previous != -1:
            signal.set_wakeup_fd(previous)  # someone else's (asyncio): leave it to them
            _wakeup_ours = False
            for signum in STOP_SIGNALS:
                _wrap(signum)
        else:
            _wakeup_ours = True
        _pid, _read, _write = os.getpid(), r, w
        if not _at_fork_registered:
            os.register_at_fork(after_in_child=_reset_in_child)
            _at_fork_registered = True
        return True


def _wrap(signum: int) -> None:
    current = signal.getsignal(signum)
    if not callable(current) or getattr(current, "_healthkit_stop_wrapper", False):
        return  # SIG_DFL, SIG_IGN, set from C (None), or already ours

    def wrapper(sig: int, frame: Any) -> Any:
        _write_byte(sig)
        return current(sig, frame)

    wrapper._healthkit_stop_wrapper = True  # type: ignore[attr-defined]
    signal.signal(signum, wrapper)
    _wrapped[signum] = current


def _write_byte(sig: int) -> None:
    # Runs in a signal handler: no locks, no allocation beyond the byte.
    fd = _write
    if fd is None or _pid != os.getpid():
        return
    with contextlib.suppress(OSError):
        os.write(fd, bytes([sig]))


def _reset_in_child() -> None:
    """After fork, in the child: the parent's pipe and stop state are not ours."""
    global _pid, _read, _write, _wakeup_ours, _seen
    if _wakeup_ours:
        with contextlib.suppress(Exception):
            # The child's main thread is the thread that forked. Give back only our own fd.
            previous = signal.set_wakeup_fd(-1)
            if previous != _write:
                signal.set_wakeup_fd(previous)
    for fd in (_read, _write):
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
    _pid = _read = _write = None
    _wakeup_ours = False
    _seen = None
    _listeners.clear()
    _sources.clear()
    # Wrapped handlers stay (they chain and write nothing: _pid no longer matches).


def read_fd() -> int | None:
    """The read end of the stop pipe (bytes are signal numbers), or ``None``."""
    return _read if _pid == os.getpid() else None


def note_stop(signum: int = signal.SIGTERM) -> None:
    """Record that this process is being stopped (for handlers healthkit cannot see).

    Call it from a signal handler installed in a way healthkit cannot observe, e.g. an
    asyncio ``loop.add_signal_handler`` set up after arming a watchdog.
    """
    sig = signal.Signals(signum)
    _write_byte(sig)  # wakes a watcher (or a sidecar) blocked on the pipe
    _record(sig)


def _record(sig: signal.Signals) -> None:
    global _seen
    with _lock:
        if _seen is not None:
            return
        _seen = (sig, time.monotonic())
        listeners = list(_listeners)
    for listener in listeners:
        with contextlib.suppress(Exception):
            listener(sig)


def drain() -> None:
    """Read what the pipe holds and remember the first stop signal in it."""
    fd = read_fd()
    if fd is None:
        return
    stop: signal.Signals | None = None
    while True:
        try:
            data = os.read(fd, 4096)
        except (BlockingIOError, OSError):
            break
        if not data:
            break
        for byte in data:
            if stop is None and byte in STOP_SIGNALS:
                stop = signal.Signals(byte)
    if stop is not None:
        _record(stop)


def stop_seen() -> tuple[signal.Signals, float] | None:
    """``(signal, monotonic time)`` of the first stop request this process received."""
    drain()
    if _seen is None:
        for source in list(_sources):
            with contextlib.suppress(Exception):
                source()
    return _seen


def record(signum: int) -> None:
    """Record a stop learned elsewhere (a sidecar that read the pipe first)."""
    _record(signal.Signals(signum))


def add_source(fn: Callable[[], None]) -> None:
    """Have :func:`stop_seen` call ``fn()``, which may :func:`record` a stop it learned.

    A sidecar holds a copy of the pipe's read end and may read a stop byte before this
    process does; its link reports it back through such a source.
    """
    with _lock:
        if fn not in _sources:
            _sources.append(fn)


def remove_source(fn: Callable[[], None]) -> None:
    with _lock, contextlib.suppress(ValueError):
        _sources.remove(fn)


def add_listener(fn: Callable[[signal.Signals], None]) -> None:
    """Call ``fn(signal)`` once when a stop is first recorded (from whoever records it)."""
    with _lock:
        if fn not in _listeners:
            _listeners.append(fn)
        seen = _seen
    if seen is not None:
        with contextlib.suppress(Exception):
            fn(seen[0])


def remove_listener(fn: Callable[[signal.Signals], None]) -> None:
    with _lock, contextlib.suppress(ValueError):
        _listeners.remove(fn)
