"""ProgressWatch and Heartbeat: notice a helper that is alive but stopped working.

A dead helper is seen through its pidfd; a live one that stopped producing (deadlocked on a
lock, blocked in a read from a file nobody writes, stuck in native code) leaves no such
trace. So the helper *beats* (:meth:`Heartbeat.beat`) whenever it makes progress, and the
owner declares when progress is *expected* (:meth:`ProgressWatch.expecting`: while it waits
for a batch, while a request is in flight). No beat for ``stall_timeout`` while progress is
expected is a stall, decided by :func:`healthkit._decide.decide_stall` and acted on by the
watchdog's actions, exactly as a death is. Idle time (between epochs, a long evaluation, a
checkpoint) is never a stall, because nobody expects progress then.

The shared page. One page of a ``memfd``, mapped shared: the helper's beat is two stores
into it (a counter and the ``CLOCK_MONOTONIC`` time, read through the vDSO): no system call,
no lock. It is reachable from every kind of helper: a forked one inherits the mapping, a
spawned or forkserver one receives the fd while it is started (pickled through
``multiprocessing``'s own fd passing), and the sidecar watcher opens it through
``/proc/<owner>/fd``.

Slot layout (int64): 0 beats, 1 last beat (ns), 2 helper pid, 3 helper start time, 4 since
when progress is expected (ns; 0: idle), 5 a watcher is timing this page (1/0), 6 call slots
claimed so far, 7 call slots there are; bytes 64-191 what the owner waits for (UTF-8); 24
since when the helper answers calls; from byte 200, with ``callers``, one call slot per calling
thread (4 int64: since when its call is
in flight (ns; 0: none), its pid, its tid, its process's start time).

Calls. A request to the helper may be made from many threads and forked processes at once
(DataLoader workers sharing one sampler server), so one "expected since" cannot say when each
call began nor end when the last one returns. Each calling thread claims a slot of its own
once (under a file lock, so two processes never take the same one; a slot whose thread is
gone is taken again), and then a call is two stores into it: the start time, then 0 when it
returns. The return is the progress: a call unanswered for ``stall_timeout`` is a stall,
whatever other calls do. A caller that finds no watcher timing rings a pipe (the *bell*) that
the watcher waits on: a pipe, because the caller may be a forked process that shares nothing
else with the watcher. A slot whose process died mid-call (a DataLoader worker ended by its
loader) is never a stall: the watcher checks the owner is alive before it fires.

Wake-ups. A watcher sets a timer only while progress is expected: at the last beat (or the
start of the wait, if later) plus ``stall_timeout``; it wakes there once, and either finds a
newer beat (and sets the next timer from it) or a stall. While idle it sets no timer. The
owner pokes the watcher only when a wait begins and no watcher is timing (slot 5): the owner
stores "expected" then reads "timing", the watcher stores "not timing" then reads "expected",
each with a full barrier between its store and its load (a lock acquired and released; a
locked instruction on x86), so at least one of them sees the other and a wait is never
missed.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing import reduction
from typing import Any, Final

import attrs

from healthkit import _runtime
from healthkit._decide import Decision, Verdict, decide_stall
from healthkit._diagnose.diagnosis import Cause, Diagnosis
from healthkit._errors import (
    InvalidArgumentError,
    InvalidArgumentTypeError,
    check_bool,
    check_callable,
    check_str,
    check_timeout,
)
from healthkit._os.proc import TaskWait, read_proc_stat, read_task_wait
from healthkit._watch.stopsignals import StopEpisode

__all__ = ["Heartbeat", "ProgressWatch", "Tracker", "stall_diagnosis"]

_PAGE: Final = 4096
_BEATS, _LAST, _PID, _START, _SINCE, _TIMING, _CLAIMED, _CALLERS = range(8)
_WHAT_AT, _WHAT_LEN = 64, 128
_READY: Final = 24  # int64 index: since when the helper answers calls (ns; 0: not yet)
_SLOTS_AT: Final = 25  # int64 index of the first call slot (byte 200)
_SLOT: Final = 4  # int64s per call slot: since, pid, tid, process start time
#: The most calling threads one watch can time at once (a slot is taken again once its
#: thread is gone); 8 pages.
MAX_CALLERS: Final = (8 * _PAGE // 8 - _SLOTS_AT) // _SLOT  # 1017
_NS = 1_000_000_000
_monotonic_ns = time.monotonic_ns
_fence_lock = threading.Lock()
_claim_lock = threading.Lock()  # threads of one process claiming call slots
_fork_generation = 0  # bumped in each forked child: a thread's claimed slot is its parent's


def _after_fork_in_child() -> None:
    # A lock held by another thread at fork stays held forever in the child.
    global _fence_lock, _claim_lock, _fork_generation
    _fence_lock = threading.Lock()
    _claim_lock = threading.Lock()
    _fork_generation += 1


_runtime.at_fork_in_child("fresh progress-page locks", _after_fork_in_child)


def _fence() -> None:
    """A full memory barrier between a store to the page and the load after it."""
    with _fence_lock:
        pass


def _map(fd: int) -> tuple[mmap.mmap, memoryview]:
    size = max(_PAGE, os.fstat(fd).st_size)
    mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    return mm, memoryview(mm).cast("q")


def _caller_alive(pid: int, tid: int, start_time: int) -> bool:
    """Whether the thread that claimed a call slot still exists (same process, by start
    time: a pid may have been handed to another process since)."""
    stat = read_proc_stat(pid)
    if stat is None or stat.state in ("Z", "X") or stat.start_time != start_time:
        return False
    return os.path.exists(f"/proc/{pid}/task/{tid}")


class Heartbeat:
    """The helper's end of a :class:`ProgressWatch`: :meth:`beat` after each unit of work.

    Pass it to the helper as an argument (``Process(target=..., args=(heartbeat,))``); it
    works with the fork, spawn and forkserver start methods. In the helper, call
    :meth:`attach` once at start.
    """

    __slots__ = ("_fd", "_mm", "_v", "name")

    def __init__(self, fd: int, name: str) -> None:
        self._fd = fd
        self._mm, self._v = _map(fd)
        self.name = name

    def beat(self) -> None:
        """Report progress: two stores into shared memory (no system call, no lock)."""
        v = self._v
        v[0] += 1
        v[1] = _monotonic_ns()

    def attach(self, *, stacks: bool = True, ready: bool = True) -> None:
        """In the helper, at its start: say which process beats (the owner shows this
        process's state when it stalls) and, with ``stacks``, let the owner read its Python
        stacks without interrupting it (a dumper thread answers; call this before the helper
        starts threads). Nothing happens if the application handles SIGUSR2 itself.

        ``ready=False``: the helper still starts up (loads a graph) and calls to it
        (:meth:`ProgressWatch.call`) are not timed until it calls :meth:`ready`; give its
        start-up a bound of its own."""
        check_bool(stacks, "stacks")
        check_bool(ready, "ready")
        pid = os.getpid()
        stat = read_proc_stat(pid)
        self._v[_START] = stat.start_time if stat is not None else 0
        self._v[_PID] = pid
        if ready:
            self.ready()
        if stacks:
            from healthkit._diagnose.stacks import enable_quiet_stack_dumps
            from healthkit._os.userdir import record_dir

            enable_quiet_stack_dumps(record_dir())

    def ready(self) -> None:
        """Calls to this helper are answered from now on: each call in flight is timed
        from the later of its start and now (see :meth:`attach`'s ``ready``)."""
        self._v[_READY] = _monotonic_ns()

    @property
    def beats(self) -> int:
        return int(self._v[_BEATS])

    def __reduce__(self) -> tuple[Any, ...]:
        # multiprocessing's fd passing: to a spawn/forkserver child while it is started.
        return (_rebuild_heartbeat, (reduction.DupFd(self._fd), self.name))

    def __repr__(self) -> str:
        return f"<healthkit Heartbeat {self.name!r} beats={self.beats}>"


def _rebuild_heartbeat(dup: Any, name: str) -> Heartbeat:
    return Heartbeat(dup.detach(), name)


def _default_who() -> str:
    rank = os.environ.get("RANK")
    if rank is not None and rank.isdigit():
        return f"rank {rank}"
    return f"pid {os.getpid()}"


class ProgressWatch:
    """The owner's end: declares when progress is expected, and is watched for stalls.

    Give it to a watchdog (:meth:`healthkit.DisarmableWatchdog.watch_progress`) and its
    :attr:`heartbeat` to the helper. Wrap each wait for the helper's work in
    :meth:`expecting`; a wait with no beat for ``stall_timeout`` seconds fires the
    watchdog with the helper's state and stacks. ``who`` names the waiter in the report
    (default ``rank <RANK>`` under torchrun, else this pid).

    ``callers=True``: requests to the helper are made from several threads or forked
    processes at once (DataLoader workers calling one server); wrap each in :meth:`call`,
    and each call is timed on its own, its return being the progress.
    """

    def __init__(
        self,
        stall_timeout: float,
        *,
        name: str = "helper",
        who: str | None = None,
        callers: bool = False,
    ) -> None:
        timeout = check_timeout(stall_timeout, "stall_timeout", allow_none=False, positive=True)
        assert timeout is not None
        if timeout < 0.05:
            raise InvalidArgumentError(
                f"stall_timeout must be >= 0.05 seconds (a watcher wakes once per timeout "
                f"while progress is expected), got {stall_timeout!r}",
                "stall_timeout",
            )
        check_str(name, "name")
        check_str(who, "who", allow_none=True)
        check_bool(callers, "callers")
        self.stall_timeout: float = timeout
        self.name = name
        self.who = who if who is not None else _default_who()
        fd = os.memfd_create("healthkit-progress", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, 8 * _PAGE if callers else _PAGE)
            self.heartbeat = Heartbeat(fd, name)
        except BaseException:
            os.close(fd)
            raise
        self._v = self.heartbeat._v
        self._bell: tuple[int, int] | None = None
        if callers:
            self._v[_CALLERS] = MAX_CALLERS
            self._bell = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._local = threading.local()
        self._lock = threading.Lock()
        self._depth = 0
        self._what = ""
        self._pokes: tuple[Callable[[], None], ...] = ()
        self._closed = False

    # ---- the owner's side
    @contextlib.contextmanager
    def expecting(self, what: str) -> Iterator[None]:
        """Progress is expected while the block runs (``what``: "a batch", "a reply")."""
        self.begin(what)
        try:
            yield
        finally:
            self.end()

    def begin(self, what: str) -> None:
        """Progress is expected from now until the matching :meth:`end` (calls nest)."""
        check_str(what, "what")
        with self._lock:
            self._depth += 1
            if self._depth > 1:
                return
            if what != self._what:
                raw = what.encode("utf-8", "replace")[: _WHAT_LEN - 1]
                self.heartbeat._mm[_WHAT_AT : _WHAT_AT + _WHAT_LEN] = raw.ljust(_WHAT_LEN, b"\0")
                self._what = what
            self._v[_SINCE] = _monotonic_ns()
        _fence()
        if not self._v[_TIMING]:
            for poke in self._pokes:
                with contextlib.suppress(Exception):
                    poke()

    def end(self) -> None:
        """The wait begun by :meth:`begin` is over (no wake-up: a watcher timing it finds
        it over at its next look and stops timing)."""
        with self._lock:
            if self._depth == 0:
                raise InvalidArgumentError(
                    "end() without a matching begin(): use 'with watch.expecting(...)'", "end"
                )
            self._depth -= 1
            if self._depth == 0:
                self._v[_SINCE] = 0

    def call(self) -> contextlib.AbstractContextManager[None]:
        """A request to the helper is in flight in this thread while the block runs; its
        return is the progress. Any thread, and any process forked from this one, may call
        at once; each call is timed on its own. Needs ``callers=True``. Costs two stores
        and a memory barrier per call (a slot is claimed once per thread)."""
        if self._closed:  # its helper was stopped on purpose: nothing to time
            return contextlib.nullcontext()
        local = self._local
        if getattr(local, "generation", -1) != _fork_generation:
            self._claim(local)
        return local.call  # type: ignore[no-any-return]

    def _claim(self, local: threading.local) -> None:
        """Claim this thread's call slot: a free one, or one whose thread is gone."""
        if self._bell is None:
            raise InvalidArgumentError(
                "call() needs a ProgressWatch made with callers=True", "callers"
            )
        pid, tid = os.getpid(), threading.get_native_id()
        stat = read_proc_stat(pid)
        start = stat.start_time if stat is not None else 0
        v = self._v
        with _claim_lock:
            # A lock of its own open file: flock excludes other open files of the memfd,
            # not the one a forked child shares with its parent.
            lock_fd = os.open(f"/proc/self/fd/{self.fileno()}", os.O_RDONLY | os.O_CLOEXEC)
            try:
                fcntl.flock(lock_fd, fcntl.LOCK_EX)
                claimed = int(v[_CLAIMED])
                for i in range(MAX_CALLERS):
                    at = _SLOTS_AT + i * _SLOT
                    if i >= claimed or v[at + 1] == 0 or not _caller_alive(
                        int(v[at + 1]), int(v[at + 2]), int(v[at + 3])
                    ):
                        break
                else:
                    raise InvalidArgumentError(
                        f"more than {MAX_CALLERS} live threads call through {self.name!r} "
                        "at once: use a ProgressWatch per group of callers",
                        "callers",
                    )
                v[at] = 0
                v[at + 1], v[at + 2], v[at + 3] = pid, tid, start
                if i >= claimed:
                    v[_CLAIMED] = i + 1
            finally:
                os.close(lock_fd)  # and with it the lock
        local.call = _Call(self, at)
        local.generation = _fork_generation

    def _ring(self) -> None:
        """Wake the watcher (it is not timing): one byte into the bell, never blocking."""
        assert self._bell is not None
        with contextlib.suppress(OSError):
            os.write(self._bell[1], b"\0")

    @property
    def bell(self) -> int | None:
        """The read end of the pipe callers ring when no watcher is timing (``callers=True``
        only): a watcher waits on it and drains it with :func:`drain`."""
        return self._bell[0] if self._bell is not None else None

    # ---- what it knows
    @property
    def expected(self) -> str | None:
        """What the owner is waiting for right now, or ``None`` when idle."""
        return self._what if self._depth else None

    @property
    def beats(self) -> int:
        return int(self._v[_BEATS])

    @property
    def last_beat(self) -> float | None:
        """When the helper last beat (``time.monotonic()`` seconds), or ``None``."""
        last = int(self._v[_LAST])
        return last / _NS if last else None

    def diagnose(
        self,
        quiet_for: float,
        *,
        dump: Callable[[list[int]], dict[int, str | None]] | None = None,
    ) -> Diagnosis:
        """The stall report of this watch's helper now, for a caller that decides stalls
        itself (``healthkit.lowlevel.decide_stall``): who waited for what, the helper's
        state, what it is blocked on and its stacks. ``quiet_for``: the seconds without
        progress to report; ``dump``: reads the stacks where the helper opted in to stack
        dumps, if not in healthkit's record directory."""
        if isinstance(quiet_for, bool) or not isinstance(quiet_for, (int, float)):
            raise InvalidArgumentTypeError(
                f"quiet_for must be a number of seconds, got {quiet_for!r}", "quiet_for"
            )
        if dump is not None:
            check_callable(dump, "dump")
        tracker = Tracker.of(self)
        try:
            return stall_diagnosis(tracker, float(quiet_for), dump=dump)
        finally:
            tracker.close()

    @property
    def helper_pid(self) -> int | None:
        """The pid of the helper that called :meth:`Heartbeat.attach`, if one did."""
        pid = int(self._v[_PID])
        return pid or None

    def fileno(self) -> int:
        """The shared page's fd (a sidecar watcher opens it through ``/proc``)."""
        return self.heartbeat._fd

    def add_poke(self, poke: Callable[[], None]) -> None:
        """Call ``poke()`` when a wait begins and no watcher is timing this watch."""
        with self._lock:
            self._pokes = (*self._pokes, poke)

    def remove_poke(self, poke: Callable[[], None]) -> None:
        with self._lock:
            self._pokes = tuple(p for p in self._pokes if p != poke)

    def close(self) -> None:
        """Release the owner's mapping and fd (a helper's copy stays valid). Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._pokes = ()
            self._depth = 0
            self._v[_SINCE] = 0  # closed while waiting: a watcher still looking sees idle
        with contextlib.suppress(Exception):
            self._v.release()
            self.heartbeat._v.release()
            self.heartbeat._mm.close()
        with contextlib.suppress(OSError):
            os.close(self.heartbeat._fd)
        if self._bell is not None:
            for fd in self._bell:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def __enter__(self) -> ProgressWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = f"expecting {self._what!r}" if self._depth else "idle"
        return (
            f"<healthkit ProgressWatch {self.name!r} stall_timeout={self.stall_timeout:g} "
            f"{state} beats={self.beats}>"
        )


class _Call:
    """One thread's call slot, entered for each call (reused: no allocation per call)."""

    __slots__ = ("_at", "_depth", "_v", "_watch")

    def __init__(self, watch: ProgressWatch, at: int) -> None:
        self._watch, self._v, self._at, self._depth = watch, watch._v, at, 0

    def __enter__(self) -> None:
        self._depth += 1
        if self._depth > 1:  # a call inside a call of this thread: the outer one times it
            return
        v = self._v
        try:
            v[self._at] = _monotonic_ns()
        except ValueError:  # closed since call() returned this: nothing to time
            return
        with _fence_lock:  # _fence(), inline: a full barrier between the store and the load
            pass
        if not v[_TIMING]:
            self._watch._ring()

    def __exit__(self, *exc: object) -> None:
        self._depth -= 1
        if self._depth == 0:
            try:
                self._v[self._at] = 0
            except ValueError:  # closed meanwhile: its mapping is gone
                pass


@attrs.define(eq=False)
class Tracker:
    """One watcher's view of one progress page: when to look next, and what it saw.

    Used alike by the owner's watcher thread and by the sidecar (which maps the page itself).
    """

    view: memoryview
    stall_timeout: float
    name: str
    who: str
    due: float | None = None  # monotonic seconds of the next look; None: idle, no timer
    fired: bool = False
    mm: mmap.mmap | None = None  # the sidecar's own mapping, closed with the tracker
    bell: int | None = None  # the read end of the callers' bell (see ProgressWatch.call)
    owns_bell: bool = False  # opened through /proc by the sidecar: closed with the tracker
    caller: tuple[int, int] | None = None  # (pid, tid) of the call timed last, if a call

    @classmethod
    def of(cls, watch: ProgressWatch) -> Tracker:
        """A tracker with its own mapping of the page: the owner may close its watch (and
        its mapping) while a watcher still looks."""
        mm, view = _map(watch.fileno())
        return cls(view, watch.stall_timeout, watch.name, watch.who, mm=mm, bell=watch.bell)

    @classmethod
    def open(
        cls, path: str, stall_timeout: float, name: str, who: str, bell: str | None = None
    ) -> Tracker:
        """Map the page at ``path`` (``/proc/<owner>/fd/<fd>``) and open the callers' bell
        at ``bell`` (the read end of a pipe: opening it there opens the same pipe)."""
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            mm, view = _map(fd)
        finally:
            os.close(fd)
        bell_fd = None
        if bell is not None:
            try:
                bell_fd = os.open(bell, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            except BaseException:
                view.release()
                mm.close()
                raise
        return cls(view, stall_timeout, name, who, mm=mm, bell=bell_fd, owns_bell=True)

    def drain(self) -> None:
        """Empty the bell (the watcher then looks at the page: a call began)."""
        if self.bell is None:
            return
        with contextlib.suppress(OSError):
            while os.read(self.bell, 512):
                pass

    def _expected_since(self, now_ns: int) -> int | None:
        """Since when progress is expected and not seen (ns), or ``None``: the later of the
        last beat and the start of the owner's wait, or the start of the oldest call in
        flight whose thread is still alive, whichever is older."""
        v = self.view
        oldest: int | None = None
        since = int(v[_SINCE])
        if since:
            oldest = max(int(v[_LAST]), since)
        self.caller = None
        ready = int(v[_READY])
        if v[_CALLERS] and ready:  # a helper still starting up is not stalled
            due_ns = now_ns - int(self.stall_timeout * _NS)
            for i in range(int(v[_CLAIMED])):
                at = _SLOTS_AT + i * _SLOT
                raw = int(v[at])
                call = max(raw, ready)
                if not raw or (oldest is not None and call >= oldest):
                    continue
                pid, tid = int(v[at + 1]), int(v[at + 2])
                # Only a call old enough to fire costs a look at /proc: its caller may be
                # gone mid-call (a DataLoader worker ended by its loader), which is no stall.
                if call <= due_ns and not _caller_alive(pid, tid, int(v[at + 3])):
                    continue
                if int(v[at]) != raw:
                    continue  # it returned meanwhile
                oldest, self.caller = call, (pid, tid)
        return oldest

    def quiet_for(self, now: float) -> float | None:
        """Seconds without progress while expected (``None``: idle). Starts timing, or
        stops when idle (see the module's docstring for the order of the loads)."""
        v = self.view
        now_ns = int(now * _NS)
        since = self._expected_since(now_ns)
        if since is None:
            v[_TIMING] = 0
            _fence()
            since = self._expected_since(now_ns)
            if since is None:
                return None
        v[_TIMING] = 1
        return max(0.0, now - since / _NS)

    def look(
        self,
        now: float,
        *,
        armed: bool,
        stop: Callable[[float], StopEpisode | None],
        stop_grace: float,
        owner_exiting: bool = False,
    ) -> tuple[Decision, float | None]:
        """Decide now; sets :attr:`due`. Returns the decision and the quiet time."""
        if self.fired:
            self.due = None
            return Decision(Verdict.IGNORE, "already reported"), None
        quiet = self.quiet_for(now)
        episode = stop(now) if quiet is not None and quiet >= self.stall_timeout else None
        decision = decide_stall(
            quiet,
            stall_timeout=self.stall_timeout,
            armed=armed,
            stop=episode,
            stop_grace=stop_grace,
            now=now,
            owner_exiting=owner_exiting,
        )
        self.due = decision.until
        return decision, quiet

    @property
    def what(self) -> str:
        raw = bytes(self.view.obj[_WHAT_AT : _WHAT_AT + _WHAT_LEN])  # type: ignore[index]
        return raw.partition(b"\0")[0].decode("utf-8", "replace") or "progress"

    @property
    def beats(self) -> int:
        return int(self.view[_BEATS])

    @property
    def last_beat(self) -> float | None:
        last = int(self.view[_LAST])
        return last / _NS if last else None

    @property
    def helper(self) -> tuple[int, int] | None:
        pid = int(self.view[_PID])
        return (pid, int(self.view[_START])) if pid else None

    def close(self) -> None:
        if self.mm is not None:
            with contextlib.suppress(Exception):
                self.view.release()
                self.mm.close()
        if self.owns_bell and self.bell is not None:
            with contextlib.suppress(OSError):
                os.close(self.bell)
            self.bell = None


def _py_spy(pid: int) -> str | None:
    """Native and Python frames from py-spy, when it is on ``PATH`` (never required).

    ``--native`` stops the process with ptrace for a moment; it fails on a process that is
    stopped already (SIGSTOP, a debugger). Then ``--nonblocking`` still reads its Python
    frames from its memory. Nothing is said when py-spy is absent or cannot read it (no
    ptrace permission): the report stands without it."""
    exe = shutil.which("py-spy")
    if exe is None:
        return None
    for how in ("--native", "--nonblocking"):
        try:
            out = subprocess.run(
                [exe, "dump", how, "--pid", str(pid)],
                capture_output=True, text=True, timeout=10, check=False,
            )  # fmt: skip
        except (OSError, subprocess.SubprocessError):
            return None
        if out.returncode == 0 and out.stdout.strip():
            return f"py-spy dump {how} --pid {pid}:\n{out.stdout.strip()}"
    return None


#: Up to this many threads are listed one by one; beyond, the main thread and a count of
#: the others by state and call (a sampler has dozens of RPC and event-loop threads).
_LISTED_THREADS = 4


def _describe_threads(tasks: list[TaskWait]) -> list[str]:
    if len(tasks) <= _LISTED_THREADS:
        return [t.describe() for t in tasks]
    counts: dict[str, int] = {}
    for t in tasks[1:]:
        call = (t.syscall or "?").partition("(")[0]
        key = f"{t.state} in {call}"
        counts[key] = counts.get(key, 0) + 1
    summary = ", ".join(f"{n} {k}" for k, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    return [tasks[0].describe(), f"{len(tasks) - 1} other threads: {summary}"]


def _stall_what(tracker: Tracker, quiet: float) -> str:
    caller = tracker.caller
    if caller is None:
        return (
            f"stalled: no progress for {quiet:.1f} s while {tracker.who} waited for "
            f"{tracker.what}"
        )
    pid, tid = caller
    where = f"pid {pid}" if pid == tid else f"pid {pid}, thread {tid}"
    return f"stalled: a call made for {tracker.who} by {where} unanswered for {quiet:.1f} s"


def stall_diagnosis(
    tracker: Tracker,
    quiet: float,
    *,
    evidence: bool = True,
    stack_timeout: float = 2.0,
    dump: Callable[[list[int]], dict[int, str | None]] | None = None,
) -> Diagnosis:
    """The report of a stall: who waited for what, for how long; the helper's state (each
    thread's state, wait channel and system call, with the file a read is blocked on) and,
    with ``evidence``, its Python stacks (a helper that attached with ``stacks=True``; not
    interrupted; ``dump`` reads them where the helper opted in, by default healthkit's
    record directory) and native frames when py-spy is installed."""
    helper = tracker.helper
    pid = helper[0] if helper else None
    last = tracker.last_beat
    beats = tracker.beats
    facts = []
    if tracker.caller is None or beats:  # a helper answering calls need not beat
        ago = f", the last {time.monotonic() - last:.1f} s ago" if last is not None else ""
        facts.append(f"{beats} beat{'s' if beats != 1 else ''} so far" + (ago or ", none yet"))
    likely = "it is alive but making no progress"
    stacks: str | None = None
    if pid is None:
        likely = "no helper attached to its heartbeat (call heartbeat.attach() in the helper)"
    elif evidence:
        stat = read_proc_stat(pid)
        if stat is None or stat.start_time != helper[1] or stat.state in ("Z", "X"):  # type: ignore[index]
            likely = "the helper that attached is gone (see its death, if watched)"
        else:
            from healthkit._diagnose.stacks import DUMPER_COMM

            tasks = [t for t in read_task_wait(pid) or [] if t.comm != DUMPER_COMM]
            facts.extend(_describe_threads(tasks))
            if tasks:
                main = tasks[0]
                likely = f"it is alive and blocked: state {main.state}" + (
                    f" in {main.syscall}" if main.syscall and main.syscall != "running" else ""
                ) + (f" (wchan {main.wchan})" if main.wchan and main.wchan != "0" else "")
            from healthkit._diagnose.stacks import dump_stacks
            from healthkit._os.userdir import record_dir

            stopped = bool(tasks) and tasks[0].state in ("T", "t")
            if stopped:
                dumped = None  # it cannot run its handler: waiting for a dump is no use
            elif dump is None:
                dumped = dump_stacks(record_dir(), [pid], timeout=stack_timeout).get(pid)
            else:  # the helper opted in elsewhere (a BoundedBarrier's directory)
                dumped = dump([pid]).get(pid)
            parts = []
            if dumped:
                parts.append(f"Python stacks of {tracker.name} (pid {pid}):\n{dumped.strip()}")
            elif stopped:
                facts.append(
                    "no Python stacks: it is stopped (SIGSTOP or a debugger), so it cannot "
                    "write them (py-spy, if installed, reads them below)"
                )
            else:
                facts.append("no Python stacks (the helper did not attach with stacks=True)")
            native = _py_spy(pid)
            if native:
                parts.append(native)
            stacks = "\n".join(parts) or None
    now_mono, now_wall = time.monotonic(), time.time()
    return Diagnosis(
        name=tracker.name,
        pid=pid,
        exit_code=None,
        signal=None,
        cause=Cause.STALLED,
        what=_stall_what(tracker, quiet),
        likely=likely,
        evidence=tuple(facts),
        hint=f"The stacks below show where it is stuck; if its work can legitimately take "
        f"longer than {tracker.stall_timeout:g} s "
        + ("to answer a call" if tracker.caller is not None else "between beats")
        + ", raise stall_timeout",
        observed_at=now_mono,
        observed_at_wall=now_wall,
        stacks=stacks,
    )
