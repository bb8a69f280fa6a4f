"""The one owner of healthkit's process-wide state: the fork hook, the exit sequence and the
event bus.

healthkit keeps state per process: the armed watchdogs (``_watchdog``), the stop-signal
listener and its witness (``_stopsignals``), the job-wide link (``_jobnotice``), the stack-dump
files (``_stacks``), the progress pages' locks (``_progress``), the stop routine's listeners
(``_stop``). Each module registers here, by name, what a forked child must forget and what
interpreter exit must do, so that the order is written down in one place and a failing step
is logged (never swallowed, never stopping the others).

**Fork.** One ``os.register_at_fork(after_in_child=...)`` runs every registered step in the
order the steps were registered, then drops every event subscription: a forked child's
subscribers are its parent's (a sidecar link's socket among them), and a ``stop()`` or a stop
signal in the child is not the parent's to announce.

**Exit.** CPython's normal exit runs, in order: (1) callbacks registered with
``threading._register_atexit`` (LIFO), (2) the join of every non-daemon thread, (3) ``atexit``
hooks, LIFO, among them ``multiprocessing.util._exit_function``, which SIGTERMs daemon
children. The sequence here:

* phase ``"threads"``, at (1): steps run in registration order (``_jobnotice`` closes the
  job link before finalization);
* then, still at (1), one ``atexit`` hook is registered: the newest, so it runs first at (3),
  before multiprocessing's teardown of daemon children, whenever the user called
  ``log_to_stderr()`` (which re-registers that hook);
* phase ``"atexit"``, at (3): steps run in registration order (``_watchdog`` disarms every
  armed watchdog, so a helper that multiprocessing's hook ends is never reported;
  ``_stacks`` withdraws its dump files). Between (1) and (3) the watchdogs keep watching: a
  helper's death while a non-daemon thread is joined would otherwise hang that join.

**Events.** Synchronous, in the publisher's thread; a subscriber that raises is logged at
ERROR with its name and the event (an announcement that did not reach a sidecar becomes a
false report, so it must leave a trace):

* :data:`STOP_SIGNAL` ``(signal, when)``: a stop signal delivered to or noted by this process
  (``_stopsignals``, before its byte is consumed, so a peeking sidecar never misses it);
* :data:`STOP_SURVIVED` ``(when,)``: the application said it carries on after a stop;
* :data:`STOPPING` ``(pid, start_time)``: :func:`healthkit.stop` is about to end that process;
* :data:`JOB_FAILURE` ``(failure,)``: another rank of the job failed (``_jobnotice``).

**The wakeup fd.** While healthkit listens for stop signals, ``_stopsignals`` holds the
interpreter's wakeup fd (``signal.set_wakeup_fd``) and replaces ``signal.set_wakeup_fd`` for
the whole process with a function of the same contract that records the application's fd
and relays every signal byte to it. A forked child gets the application's fd back.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from collections.abc import Callable
from typing import Final, Literal

logger = logging.getLogger("healthkit")

__all__ = [
    "JOB_FAILURE",
    "STOPPING",
    "STOP_SIGNAL",
    "STOP_SURVIVED",
    "at_exit",
    "at_fork_in_child",
    "publish",
    "subscribe",
    "unsubscribe",
]

Topic = Literal["stop signal", "stop survived", "stopping", "job failure"]
STOP_SIGNAL: Final[Topic] = "stop signal"
STOP_SURVIVED: Final[Topic] = "stop survived"
STOPPING: Final[Topic] = "stopping"
JOB_FAILURE: Final[Topic] = "job failure"

Step = tuple[str, Callable[[], None]]

_lock = threading.Lock()
_fork_steps: list[Step] = []
_exit_steps: dict[str, list[Step]] = {"threads": [], "atexit": []}
_exit_hooked = False
_subscribers: dict[Topic, list[Callable[..., None]]] = {
    STOP_SIGNAL: [],
    STOP_SURVIVED: [],
    STOPPING: [],
    JOB_FAILURE: [],
}


def _run(steps: list[Step], when: str) -> None:
    for name, fn in steps:
        try:
            fn()
        except Exception:  # one failed step must not keep the others from running
            logger.error("healthkit: %s: the step %r failed", when, name, exc_info=True)


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()  # another thread of the parent may have held it at the fork
    _run(list(_fork_steps), "in a forked child")
    for subscribers in _subscribers.values():
        subscribers.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def at_fork_in_child(name: str, fn: Callable[[], None]) -> None:
    """Run ``fn()`` in every child forked from now on (after the steps registered before it).
    Registering the same ``name`` again is a no-op."""
    with _lock:
        if all(n != name for n, _ in _fork_steps):
            _fork_steps.append((name, fn))


def _threads_phase() -> None:
    _run(list(_exit_steps["threads"]), "at interpreter exit")
    try:
        atexit.register(_atexit_phase)  # the newest hook: it runs first at (3)
    except Exception:  # atexit already running: now rather than never
        _atexit_phase()


def _atexit_phase() -> None:
    _run(list(_exit_steps["atexit"]), "at interpreter exit")


def at_exit(phase: Literal["threads", "atexit"], name: str, fn: Callable[[], None]) -> None:
    """Run ``fn()`` at interpreter exit in ``phase`` (see the module's docstring), after the
    steps registered before it. Registering the same ``name`` again is a no-op."""
    global _exit_hooked
    with _lock:
        steps = _exit_steps[phase]
        if all(n != name for n, _ in steps):
            steps.append((name, fn))
        if _exit_hooked:
            return
        _exit_hooked = True
    try:
        threading._register_atexit(_threads_phase)  # type: ignore[attr-defined]
    except RuntimeError:  # threading is shutting down already
        atexit.register(_threads_phase)


def subscribe(topic: Topic, fn: Callable[..., None]) -> None:
    """Call ``fn(*event)`` for each event on ``topic`` published from now on."""
    with _lock:
        if fn not in _subscribers[topic]:
            _subscribers[topic].append(fn)


def unsubscribe(topic: Topic, fn: Callable[..., None]) -> None:
    with _lock:
        if fn in _subscribers[topic]:
            _subscribers[topic].remove(fn)


def publish(topic: Topic, *event: object) -> int:
    """Tell every subscriber of ``topic``, in the caller's thread; returns how many were
    told. A subscriber that raises is logged at ERROR and the others are still told."""
    with _lock:
        subscribers = list(_subscribers[topic])
    for fn in subscribers:
        try:
            fn(*event)
        except Exception:
            logger.error(
                "healthkit: telling %r of a %s event %r failed", fn, topic, event, exc_info=True
            )
    return len(subscribers)
