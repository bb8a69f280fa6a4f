"""stop(): the one way to end a set of processes: ask, SIGTERM, SIGKILL, one shared deadline.

Every owner of helper processes needs the same ladder at teardown: ask them to finish (a STOP
command, a closed queue), wait a little, SIGTERM those that did not, wait, SIGKILL the rest,
wait, and say which ones never ended. Written once here, it is the same everywhere: signals go
through pidfds (never a recycled pid), the waiting is one WatchSet (no polling), the bound is
the sum of the three steps measured from one start (not per process), and each escalation is
logged at WARNING, because a worker that had to be SIGKILLed is a fact someone will look for.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from multiprocessing.process import BaseProcess

import attrs

from healthkit import _runtime
from healthkit._errors import (
    PID_MAX_LIMIT,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    NoSuchProcessError,
    check_callable,
    check_timeout,
)
from healthkit._os.proc import descendants, read_proc_stat
from healthkit._watch.process import ExitStatus, ProcessWatch, WatchSet

__all__ = [
    "StopReport",
    "stop",
    "stopped_by_healthkit",
    "watch_tree",
]

logger = logging.getLogger("healthkit")

# The processes stop() has set out to end, as (pid, start time): with its start time a pid
# names one process for good, so this is a permanent fact about each, and a watchdog never
# reports a process healthkit itself ended (a SIGTERM handler that stops a helper which
# ignores SIGTERM: the SIGKILL that follows is ours, not the OOM killer's).
_stopping: collections.deque[tuple[int, int | None]] = collections.deque(maxlen=4096)
_stopping_lock = threading.Lock()


def stopped_by_healthkit(pid: int, start_time: int | None) -> bool:
    """Whether :func:`stop` set out to end this process (same pid and start time)."""
    with _stopping_lock:
        return (pid, start_time) in _stopping or (
            start_time is None and any(p == pid for p, _ in _stopping)
        )


def _fresh_lock_in_child() -> None:
    """Another thread of the parent may have held the lock at the fork. (The child's
    subscribers are dropped by :mod:`healthkit._runtime`: a stop() the child makes is not
    the parent's, and must not be announced to the parent's sidecar.)"""
    global _stopping_lock
    _stopping_lock = threading.Lock()


_runtime.at_fork_in_child("a fresh lock for stop()'s record", _fresh_lock_in_child)


def _note_stopping(watches: Iterable[ProcessWatch]) -> None:
    """Record that :func:`stop` sets out to end ``watches``, and announce each one
    (:data:`healthkit._runtime.STOPPING`): a sidecar not told would report it as a failure."""
    keys = [(w.pid, w.start_time) for w in watches]
    with _stopping_lock:
        _stopping.extend(keys)
    for pid, start_time in keys:
        _runtime.publish(_runtime.STOPPING, pid, start_time)

StopTarget = ProcessWatch | BaseProcess | subprocess.Popen[bytes] | subprocess.Popen[str] | int


@attrs.frozen
class StopReport:
    """How a :func:`stop` went: which processes needed which step, and their statuses."""

    ended_when_asked: tuple[int, ...]  # pids that ended within the grace
    terminated: tuple[int, ...]  # pids that needed SIGTERM
    killed: tuple[int, ...]  # pids that needed SIGKILL
    survivors: tuple[int, ...]  # pids still running after SIGKILL and its wait
    statuses: dict[int, ExitStatus | None]
    seconds: float

    @property
    def escalated(self) -> bool:
        return bool(self.terminated or self.killed or self.survivors)


def _check_targets(targets: object) -> list[StopTarget]:
    """Every target, checked before anything is signalled: a pid that no process can have
    (``0``, ``-1``, past ``PID_MAX_LIMIT``) is a caller's bug, not a process already gone."""
    if isinstance(targets, (str, bytes)) or not isinstance(targets, Iterable):
        raise InvalidArgumentTypeError(
            f"targets must be a list of processes (Process, Popen, ProcessWatch or pid), got "
            f"{targets!r}",
            "targets",
        )
    checked: list[StopTarget] = []
    for target in targets:
        if isinstance(target, (ProcessWatch, BaseProcess, subprocess.Popen)):
            checked.append(target)
        elif isinstance(target, int) and not isinstance(target, bool):
            if not 1 <= target <= PID_MAX_LIMIT:
                raise InvalidArgumentError(
                    f"targets holds {target}, which no process can have as its pid (pids are "
                    f"1..{PID_MAX_LIMIT}; 0 and -1 would mean process groups to kill(2))",
                    "targets",
                )
            checked.append(target)
        else:
            raise InvalidArgumentTypeError(
                f"targets must hold a Process, Popen, ProcessWatch or pid, got {target!r}",
                "targets",
            )
    return checked


def stop(
    targets: Iterable[StopTarget],
    *,
    request: Callable[[], None] | None = None,
    grace: float = 0.0,
    kill_after: float = 5.0,
    kill_timeout: float = 5.0,
    name: str = "processes",
    log: logging.Logger | None = None,
) -> StopReport:
    """Stop ``targets`` with the STOP -> join -> SIGTERM -> SIGKILL ladder and return a report.

    ``request()`` (optional) asks them to finish by themselves (e.g. puts a STOP command on
    their queues); then up to ``grace`` seconds for them to end; SIGTERM to the rest and up to
    ``kill_after`` seconds (``0``: no SIGTERM step); SIGKILL to the rest and up to
    ``kill_timeout`` seconds for them to end. The whole call is bounded by
    ``grace + kill_after + kill_timeout``. Processes whose owner objects are given
    (``Process``, ``Popen``) are reaped through them; bare pids are left to their parent.
    Each escalation is logged at WARNING on ``log`` (default: ``healthkit``).
    """
    grace_s = check_timeout(grace, "grace", allow_none=False)
    term_s = check_timeout(kill_after, "kill_after", allow_none=False)
    kill_s = check_timeout(kill_timeout, "kill_timeout", allow_none=False)
    assert grace_s is not None and term_s is not None and kill_s is not None
    if request is not None:
        check_callable(request, "request")
    if not isinstance(name, str):
        raise InvalidArgumentTypeError(f"name must be a str, got {name!r}", "name")
    if log is not None and not isinstance(log, logging.Logger):
        raise InvalidArgumentTypeError(f"log must be a logging.Logger, got {log!r}", "log")
    targets = _check_targets(targets)
    log = log or logger
    started = time.monotonic()
    owners: list[BaseProcess | subprocess.Popen[bytes] | subprocess.Popen[str]] = []
    watches: list[ProcessWatch] = []
    built: list[ProcessWatch] = []
    for target in targets:
        if isinstance(target, ProcessWatch):
            watches.append(target)
            continue
        if isinstance(target, BaseProcess) and target.pid is None:
            continue  # never started: nothing to stop
        try:
            watch = ProcessWatch(target)
        except NoSuchProcessError:
            continue  # a bare pid already gone
        watches.append(watch)
        built.append(watch)
        if not isinstance(target, int):
            owners.append(target)
    try:
        _note_stopping(w for w in watches if w.poll() is None)
        if request is not None:
            try:
                request()
            except Exception:
                log.debug("stop(%s): the stop request failed; escalating", name, exc_info=True)
        alive = _wait_all(watches, started + grace_s)
        terminated = tuple(w.pid for w in alive)
        next_step = "SIGTERM" if term_s > 0 else "SIGKILL"
        if alive and request is not None:
            log.warning(
                "%s %s did not end within %.3gs of the stop request; sending %s",
                name, list(terminated), grace_s, next_step,
            )  # fmt: skip
        if alive and term_s > 0:
            for w in alive:
                w.send_signal(signal.SIGTERM)
            alive = _wait_all(alive, started + grace_s + term_s)
            if alive:
                log.warning(
                    "%s %s ignored SIGTERM for %.3gs; sending SIGKILL",
                    name, [w.pid for w in alive], term_s,
                )  # fmt: skip
        killed = tuple(w.pid for w in alive)
        if alive:
            for w in alive:
                w.kill()
            alive = _wait_all(alive, started + grace_s + term_s + kill_s)
        survivors = tuple(w.pid for w in alive)
        if alive:
            log.error(
                "%s %s still running %.3gs after SIGKILL (stuck in the kernel: D state?)",
                name, list(survivors), kill_s,
            )  # fmt: skip
        for owner in owners:
            _reap(owner)
        ended_first = tuple(w.pid for w in watches if w.pid not in terminated)
        return StopReport(
            ended_when_asked=ended_first,
            terminated=tuple(p for p in terminated if p not in killed),
            killed=tuple(p for p in killed if p not in survivors),
            survivors=survivors,
            statuses={w.pid: w.status for w in watches},
            seconds=time.monotonic() - started,
        )
    finally:
        for w in built:
            w.close()


def watch_tree(pid: int, *, exclude: Iterable[int] = ()) -> list[ProcessWatch]:
    """Watches on every process below ``pid`` (parents first), each pinned by a pidfd.

    Why before acting: once ``pid`` dies its children are reparented and can no longer be
    found from it, and a pid read from ``/proc`` may be reused before it is signalled. Each
    pidfd is opened right after the listing and its process's start time compared with the
    listing's, so a reused pid is never included. ``exclude``: pids to leave out (the caller).
    """
    skip = set(exclude)
    watches: list[ProcessWatch] = []
    for child in descendants(pid):
        if child in skip:
            continue
        listed = read_proc_stat(child)
        if listed is None:
            continue
        try:
            watch = ProcessWatch(child)
        except NoSuchProcessError:
            continue
        now = read_proc_stat(child)
        if now is None or now.start_time != listed.start_time:
            watch.close()
            continue
        watches.append(watch)
    return watches


def _wait_all(watches: list[ProcessWatch], deadline: float) -> list[ProcessWatch]:
    """Wait until every watch has ended or ``deadline`` passes; return those still running."""
    alive = [w for w in watches if w.poll() is None]
    if not alive:
        return []
    with WatchSet(alive) as ws:
        while len(ws):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            for w in ws.wait(remaining):
                ws.remove(w)
        return list(ws)


def _reap(owner: BaseProcess | subprocess.Popen[bytes] | subprocess.Popen[str]) -> None:
    """Collect an ended process through its owner object (bounded: it has ended)."""
    with contextlib.suppress(Exception):
        if isinstance(owner, BaseProcess):
            if owner.exitcode is None:
                owner.join(1.0)
            else:
                owner.join(0)
        else:
            owner.wait(1.0)
