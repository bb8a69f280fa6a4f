"""Make a forked child die with its parent, even when the parent is SIGKILLed.

Why not a watcher thread in the child: a helper often sits in native calls that keep the GIL
(a graph-learn server in ``graph.init()``/``graph.close()``: a ticker thread there ticks once
in 7 s), so no Python thread of the child can run to notice anything. The kernel has to do
it: ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` sends SIGKILL to the child when its parent goes
away, whatever state the child is in.

Two kernel details shape the code:

* The race: if the parent dies after ``fork()`` but before the child calls ``prctl``, the child
  has already been reparented and the death signal will never come. Checking ``getppid()``
  against the parent's pid right *after* ``prctl`` closes it: from then on either the parent is
  still ours (and its death will signal us) or it is gone and we kill ourselves now.
* The "parent" is the *thread* that forked, not the process: the signal fires when that thread
  exits. Forking from a short-lived thread would kill a healthy server (and fire the watchdog),
  so callers fork from the main thread only.
"""

from __future__ import annotations

import ctypes
import os
import signal

from healthkit._errors import InvalidArgumentTypeError, check_pid, check_signal

__all__ = ["die_with_parent", "set_thread_name"]

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15


def _prctl(option: int, arg: int | bytes) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, arg, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl({option}) failed: {os.strerror(err)}")


def die_with_parent(parent_pid: int, sig: int = signal.SIGKILL) -> None:
    """In a freshly forked child: receive ``sig`` when the forking thread's process dies.

    ``parent_pid`` is the parent's pid as the parent read it before forking. If the parent
    is already gone, the child sends itself ``sig`` at once (so it ends exactly as it would
    had the kernel delivered the death signal). A ``parent_pid`` that is not a pid raises
    :class:`InvalidArgumentTypeError` (before anything is signalled).
    """
    check_pid(parent_pid, "parent_pid")
    sig = check_signal(sig, "sig")
    _prctl(_PR_SET_PDEATHSIG, int(sig))
    if os.getppid() != parent_pid:  # reparented before prctl took effect: the parent died
        os.kill(os.getpid(), sig)
        os._exit(128 + int(sig))  # only reached if ``sig`` is caught or ignored here


def set_thread_name(name: str) -> None:
    """Set this thread's kernel name (``comm``, 15 bytes), shown by ps/top; best effort.

    A helper named after its role ("gl-sampler-srv") is recognisable in ``ps`` and in the
    kernel's OOM-kill record, which names the process by this field.
    """
    if not isinstance(name, str):
        raise InvalidArgumentTypeError(f"name must be a str, got {name!r}", "name")
    try:
        _prctl(_PR_SET_NAME, name.encode()[:15])
    except OSError:
        pass
