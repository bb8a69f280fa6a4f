"""The job-wide failure notice: one rank's failure, told to every rank of the job.

Why: on one node a dead helper ends its rank in milliseconds, and torchrun's agent tears that
node down. The other nodes learn nothing: a rank in a gloo collective with the dead one ends
with a nameless socket error, a rank computing or waiting on its own data (or in an NCCL
collective, which never notices a dead peer) waits for its own timeout, 10 to 30 minutes.
Every node already shares one thing: the launcher's c10d store (torchrun's agent store,
``MASTER_ADDR:MASTER_PORT``). The first rank that fails writes its failure there; every other
rank of the job waits on that key in a blocking ``store.wait`` (no polling, no CPU, one idle
TCP connection), then logs the original cause, writes it into its own torchelastic error
file and ends. Each node's torchrun summary then names the real cause.

The flow::

    rank fails (watchdog fires, barrier fails, witness sees the rank die)
      -> publish(): add(COUNT) == 1 ? set(NOTICE, JSON)     # the first failure only
    every other rank: a daemon thread blocked in wait([NOTICE])
      -> get(NOTICE) -> JobFailure -> each subscriber (an armed watchdog, or the sidecar)

Scope: keys are named by the run id and the restart count torchrun gives each worker, so a
notice from restart round N never ends round N+1. Trust: the store is unauthenticated; a
notice is data (bounded JSON, never executed, every field checked), and anyone who can reach
the store can already end the job (docs/multinode.md).

torch is imported only here, lazily, in a background thread when a link starts (never at
``import healthkit``). A process without a launcher's store keeps single-node behaviour,
said once at INFO.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from healthkit import _runtime
from healthkit._diagnose.diagnosis import Cause, Diagnosis
from healthkit._errors import InvalidArgumentError, InvalidArgumentTypeError

__all__ = [
    "ENV_SWITCH",
    "JobFailure",
    "JobScope",
    "notice_wanted",
    "publish_job_failure",
]

logger = logging.getLogger("healthkit")

#: ``0``/``off``/``false`` turns the job-wide notice off, ``1``/``on``/``true`` (the default
#: under a launcher) keeps it on.
ENV_SWITCH = "HEALTHKIT_JOB_NOTICE"
_ON = ("1", "on", "true", "yes")
_OFF = ("0", "off", "false", "no")

KEY_ROOT = "healthkit/job-failure/v1"
#: A notice larger than this is not read (the store is shared and unauthenticated).
MAX_NOTICE_BYTES = 16 * 1024
_MAX_FIELD = 2000
_MAX_EVIDENCE = 16
_CONNECT_TIMEOUT_S = 60.0  # the agent's store exists before ranks start; rank 0's may not yet
_OP_TIMEOUT_S = 10.0
_WAIT_SLICE_S = 3600.0  # one wake-up an hour while the job is healthy


def notice_wanted(argument: bool | None, environ: Mapping[str, str] | None = None) -> bool:
    """Whether the job-wide notice is wanted: the argument if given, else the environment
    switch, else on. (On is not enough: a store must be found, see :meth:`JobScope.from_env`.)
    """
    if argument is not None:
        if not isinstance(argument, bool):
            raise InvalidArgumentTypeError(
                f"job_notice must be True, False or None (decided by {ENV_SWITCH}), got "
                f"{argument!r}",
                "job_notice",
            )
        return argument
    env = os.environ if environ is None else environ
    raw = env.get(ENV_SWITCH)
    if raw is None:
        return True
    value = raw.strip().lower()
    if value in _ON:
        return True
    if value in _OFF:
        return False
    raise InvalidArgumentError(
        f"{ENV_SWITCH}={raw!r} is not understood: set it to 1 (on, the default) or 0 (off)",
        ENV_SWITCH,
    )


def _int_env(env: Mapping[str, str], name: str) -> int | None:
    try:
        return int(env[name])
    except (KeyError, ValueError):
        return None


@attrs.frozen
class JobScope:
    """Where this rank is in the job, and where the job's store is."""

    addr: str
    port: int
    run_id: str
    restart: int
    rank: int | None
    node_rank: int | None
    local_rank: int | None
    host: str

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> JobScope | None:
        """The scope torchrun (or any launcher setting ``MASTER_ADDR``/``MASTER_PORT``)
        gives this process; ``None`` outside such a launcher."""
        env = os.environ if environ is None else environ
        addr = env.get("MASTER_ADDR")
        port = _int_env(env, "MASTER_PORT")
        if not addr or port is None or not 0 < port < 65536:
            return None
        return cls(
            addr=addr,
            port=port,
            run_id=env.get("TORCHELASTIC_RUN_ID", "none")[:200],
            restart=_int_env(env, "TORCHELASTIC_RESTART_COUNT") or 0,
            rank=_int_env(env, "RANK"),
            node_rank=_int_env(env, "GROUP_RANK"),
            local_rank=_int_env(env, "LOCAL_RANK"),
            host=socket.gethostname(),
        )

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> JobScope:
        return cls(**{f.name: d[f.name] for f in attrs.fields(cls)})

    @property
    def key(self) -> str:
        return f"{KEY_ROOT}/{self.run_id}/{self.restart}/notice"

    @property
    def count_key(self) -> str:
        return f"{KEY_ROOT}/{self.run_id}/{self.restart}/count"

    @property
    def listeners_key(self) -> str:
        return f"{KEY_ROOT}/{self.run_id}/{self.restart}/listeners"

    def slot_key(self, slot: int) -> str:
        return f"{KEY_ROOT}/{self.run_id}/{self.restart}/slot/{slot}"

    @property
    def origin(self) -> str:
        """How other nodes name this rank: ``node 1 rank 3 (host-b)``."""
        parts = []
        if self.node_rank is not None:
            parts.append(f"node {self.node_rank}")
        parts.append(f"rank {self.rank}" if self.rank is not None else f"pid {os.getpid()}")
        return " ".join(parts) + f" ({self.host})"


def _text(value: object, limit: int = _MAX_FIELD) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected text, got {type(value).__name__}")
    return value[:limit]


def _opt_int(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected an int, got {type(value).__name__}")
    return value


@attrs.frozen
class JobFailure:
    """The notice one rank publishes: where it failed and the diagnosis, as data."""

    origin: str  # "node 1 rank 3 (host-b)"
    origin_pid: int  # the rank's pid
    name: str
    pid: int | None
    exit_code: int | None
    signal: int | None
    cause: str
    what: str
    likely: str
    evidence: tuple[str, ...]
    hint: str
    wall_time: float

    @classmethod
    def of(cls, diagnosis: Diagnosis, scope: JobScope, *, origin_pid: int | None = None
           ) -> JobFailure:
        hint = diagnosis.hint
        likely = diagnosis.likely
        if diagnosis.exception is not None:
            likely = f"{likely}; it raised {diagnosis.exception.summary}".lstrip("; ")
        return cls(
            origin=scope.origin,
            origin_pid=os.getpid() if origin_pid is None else origin_pid,
            name=diagnosis.name[:_MAX_FIELD],
            pid=diagnosis.pid,
            exit_code=diagnosis.exit_code,
            signal=int(diagnosis.signal) if diagnosis.signal is not None else None,
            cause=diagnosis.cause.value,
            what=diagnosis.what[:_MAX_FIELD],
            likely=likely[:_MAX_FIELD],
            evidence=tuple(e[:_MAX_FIELD] for e in diagnosis.evidence[:_MAX_EVIDENCE]),
            hint=hint[:_MAX_FIELD],
            wall_time=time.time(),
        )

    @classmethod
    def of_error(cls, name: str, error: BaseException, scope: JobScope) -> JobFailure:
        """A failure that is an error raised in the rank (a barrier, a loader), not a death."""
        text = str(error).strip() or type(error).__name__
        first, _, rest = text.partition("\n")
        return cls(
            origin=scope.origin,
            origin_pid=os.getpid(),
            name=name[:_MAX_FIELD],
            pid=os.getpid(),
            exit_code=None,
            signal=None,
            cause=Cause.ERROR_EXIT.value,
            what=f"failed: {type(error).__name__}: {first}"[:_MAX_FIELD],
            likely="",
            evidence=tuple(line.strip()[:_MAX_FIELD] for line in rest.splitlines()[:_MAX_EVIDENCE]
                           if line.strip()),
            hint="",
            wall_time=time.time(),
        )

    def to_bytes(self) -> bytes:
        data = json.dumps({"v": 1, **attrs.asdict(self)}).encode()
        return data if len(data) <= MAX_NOTICE_BYTES else self._trimmed()

    def _trimmed(self) -> bytes:
        short = attrs.evolve(self, evidence=self.evidence[:2], hint=self.hint[:200])
        return json.dumps({"v": 1, **attrs.asdict(short)}).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> JobFailure:
        """Parse a notice read from the store; ``ValueError`` for anything malformed."""
        if len(raw) > MAX_NOTICE_BYTES:
            raise ValueError(f"notice of {len(raw)} bytes (limit {MAX_NOTICE_BYTES})")
        d = json.loads(raw.decode("utf-8", errors="strict"))
        if not isinstance(d, dict) or d.get("v") != 1:
            raise ValueError("not a version-1 notice")
        evidence = d.get("evidence")
        if not isinstance(evidence, list):
            raise ValueError("evidence is not a list")
        wall = d.get("wall_time")
        if not isinstance(wall, (int, float)) or not math.isfinite(wall):
            raise ValueError("wall_time is not a number")
        origin_pid = _opt_int(d.get("origin_pid"))
        return cls(
            origin=_text(d.get("origin"), 300),
            origin_pid=origin_pid if origin_pid is not None else -1,
            name=_text(d.get("name")),
            pid=_opt_int(d.get("pid")),
            exit_code=_opt_int(d.get("exit_code")),
            signal=_opt_int(d.get("signal")),
            cause=_text(d.get("cause"), 100),
            what=_text(d.get("what")),
            likely=_text(d.get("likely")),
            evidence=tuple(_text(e) for e in evidence[:_MAX_EVIDENCE]),
            hint=_text(d.get("hint")),
            wall_time=float(wall),
        )

    def diagnosis(self) -> Diagnosis:
        """The failure as this rank reports it: the original diagnosis, said to have
        happened elsewhere (``stopped because node 1 rank 3 (host-b): ...``)."""
        import signal as _signal

        try:
            cause = Cause(self.cause)
        except ValueError:
            cause = Cause.UNKNOWN
        sig: _signal.Signals | None = None
        if self.signal is not None:
            try:
                sig = _signal.Signals(self.signal)
            except ValueError:
                sig = None
        return Diagnosis(
            name=self.name,
            pid=self.pid,
            exit_code=self.exit_code,
            signal=sig,
            cause=cause,
            what=self.what,
            likely=self.likely,
            evidence=self.evidence,
            hint=self.hint,
            observed_at=time.monotonic(),
            observed_at_wall=self.wall_time,
            elsewhere=self.origin,
        )


Subscriber = Callable[[JobFailure], None]


class StoreLink:
    """This process's two clients of the job's store: a listener blocked in ``wait`` and a
    publisher (a TCPStore client serialises its operations, so a publish must not queue
    behind the blocked wait).

    Each listener waits on a key of its own, a *slot* numbered by ``add(LISTENERS, 1)``, and
    not on the notice key itself, so that it can be woken without telling anyone anything:
    ``close()`` writes ``bye`` into its slot. That matters at interpreter exit: a daemon
    thread whose C++ ``wait`` returns once finalization has begun (this rank hosts the store,
    or the store goes away) is ended by CPython with a forced unwind through torch's frames,
    and the process aborts ("terminate called without an active exception", SIGABRT). So the
    listener is closed and joined before finalization (the ``"threads"`` phase of
    :mod:`healthkit._runtime`'s exit sequence). The publisher writes the notice key first,
    then every slot taken so far; a listener checks the notice key after taking its slot, so
    it cannot miss a notice published between the two.
    """

    def __init__(self, scope: JobScope, on_notice: Subscriber) -> None:
        self.scope = scope
        self._on_notice = on_notice
        self._ready = threading.Event()
        self._publisher: Any = None
        self._slot: int | None = None
        self._listener_fd: int | None = None
        self._failed: str | None = None
        self.closed = False
        self._thread = threading.Thread(
            target=self._run, name="healthkit job notice", daemon=True
        )
        self._thread.start()

    def _client(self, timeout: float) -> Any:
        import datetime

        import torch.distributed as dist

        return dist.TCPStore(  # type: ignore[attr-defined]
            self.scope.addr,
            self.scope.port,
            is_master=False,
            timeout=datetime.timedelta(seconds=timeout),
        )

    def _find_listener_fd(self, before: set[int]) -> int | None:
        """The listener client's socket: the one socket opened by its construction that is
        connected to the store. None if that is not certain (another thread connected to
        the same store at the same moment): then only the wake-up through its slot is
        used."""
        found = []
        for fd in _socket_fds() - before:
            try:
                with socket.socket(fileno=os.dup(fd)) as s:
                    peer = s.getpeername()
            except OSError:
                continue
            if isinstance(peer, tuple) and peer[1] == self.scope.port:
                found.append(fd)
        return found[0] if len(found) == 1 else None

    def _run(self) -> None:
        try:
            self._publisher = self._client(_CONNECT_TIMEOUT_S)
            self._publisher.set_timeout(_timedelta(_OP_TIMEOUT_S))
            before = _socket_fds()
            listener = self._client(_CONNECT_TIMEOUT_S)
            self._listener_fd = self._find_listener_fd(before)
            slot = int(listener.add(self.scope.listeners_key, 1))
            self._slot = slot
            early = bool(listener.check([self.scope.key]))
        except Exception as e:  # no torch, no store: single-node behaviour
            self._failed = f"{type(e).__name__}: {e}"
            logger.info(
                "healthkit: the job's store at %s:%d cannot be reached (%s); a failure here is "
                "not told to the other ranks, and theirs not to this one",
                self.scope.addr, self.scope.port, self._failed,
            )
            self._ready.set()
            return
        self._ready.set()
        key = self.scope.key if early else self.scope.slot_key(slot)
        logger.debug("job notice: waiting on %s at %s:%d", key, self.scope.addr, self.scope.port)
        while not self.closed:
            try:
                listener.wait([key], _timedelta(_WAIT_SLICE_S))
            except Exception as e:
                if self.closed:
                    return
                if "timeout" in str(e).lower():
                    # A timed-out wait can leave the client's stream out of step in older
                    # torch: start a fresh client for the next slice.
                    try:
                        listener = self._client(_CONNECT_TIMEOUT_S)
                    except Exception:
                        return
                    continue
                logger.debug("job notice: the job's store went away (%s): no more notices", str(e))
                return
            try:
                raw = bytes(listener.get(key))
                if raw == _BYE or self.closed:
                    return
                failure = JobFailure.from_bytes(raw)
            except Exception as e:
                if self.closed:
                    return
                # Text only: a record holding the exception would keep this frame (and the
                # store client in it) alive.
                logger.warning("job notice: a malformed notice in the job's store was ignored "
                               "(%s)", f"{type(e).__name__}: {e}")
                return
            if not self.closed:
                self._on_notice(failure)
            return

    def ready(self) -> bool:
        """Whether this link is up (or has failed for good): a publish would not wait."""
        return self._ready.is_set()

    def publish(self, failure: JobFailure, timeout: float = _CONNECT_TIMEOUT_S) -> bool:
        """Publish ``failure`` unless another rank's came first; False if not published."""
        return self.publish_raw(failure.to_bytes(), timeout)

    def publish_raw(self, payload: bytes, timeout: float = _CONNECT_TIMEOUT_S) -> bool:
        """Publish these bytes as the notice (what any writer of the store could do)."""
        if not self._ready.wait(timeout) or self._publisher is None:
            logger.warning(
                "job notice: not told to the other ranks (the job's store %s)",
                "was not reached yet" if self._failed is None else f"failed: {self._failed}",
            )
            return False
        pub = self._publisher
        try:
            if int(pub.add(self.scope.count_key, 1)) != 1:
                return False  # another rank's failure came first: it is the cause
            pub.set(self.scope.key, payload)  # first: a listener that comes later sees it
            for slot in range(1, int(pub.add(self.scope.listeners_key, 0)) + 1):
                if slot != self._slot:
                    pub.set(self.scope.slot_key(slot), payload)
        except Exception as e:
            logger.warning("job notice: publishing to the job's store failed (%s)",
                           f"{type(e).__name__}: {e}")
            return False
        return True

    def close(self, timeout: float = 2.0) -> None:
        """Stop listening: wake the waiting thread through its own slot and join it
        (bounded). Called before interpreter finalization; idempotent."""
        if self.closed:
            return
        self.closed = True
        pub, slot = self._publisher, self._slot
        if pub is not None and slot is not None:
            try:
                pub.set_timeout(_timedelta(timeout))  # never hold up an exit for long
                pub.set(self.scope.slot_key(slot), _BYE)
            except Exception:
                logger.debug("job notice: waking the listener failed", exc_info=True)
        if self._thread is not threading.current_thread():
            self._thread.join(min(timeout, 0.5))
            fd = self._listener_fd
            if self._thread.is_alive() and fd is not None:
                # The store could not be told (it is gone, yet the connection is held open,
                # e.g. by a forked child's copy of the server's socket): end the wait on our
                # side of the connection, before finalization can.
                try:
                    with socket.socket(fileno=os.dup(fd)) as s:
                        s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                self._thread.join(timeout)
        self._publisher = None

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)


_BYE = b"bye"


def _socket_fds() -> set[int]:
    out: set[int] = set()
    try:
        entries = os.listdir("/proc/self/fd")
    except OSError:
        return out
    for entry in entries:
        try:
            if os.readlink(f"/proc/self/fd/{entry}").startswith("socket:"):
                out.add(int(entry))
        except OSError:
            continue
    return out


def _timedelta(seconds: float) -> Any:
    import datetime

    return datetime.timedelta(seconds=seconds)


# ---------------------------------------------------------------- this process's link
# One link per process, shared by every armed watchdog (and the barrier): one connection
# pair to the store, one waiting thread. Reset in a forked child (the clients' sockets are
# the parent's).
_lock = threading.Lock()
_link: StoreLink | None = None
_told: JobFailure | None = None  # the notice this process got (it then never publishes)
_published = False  # this process published the job's failure
_said_unavailable = False


# Links a forked child inherited: kept, never used and never destroyed there. A TCPStore
# client's destructor in the child would shut down the socket it shares with its parent
# (seen: a DataLoader worker's exit cut its rank's publisher, whose interpreter-exit wake-up
# of the listener then failed, and the rank aborted at exit).
_inherited: list[StoreLink] = []


def _after_fork_in_child() -> None:
    global _link, _told, _published
    if _link is not None:
        _inherited.append(_link)
    _link = None
    _pending.clear()
    _told = None
    _published = False


def _deliver(failure: JobFailure) -> None:
    global _told
    with _lock:
        if failure.origin_pid == os.getpid():
            return  # our own (published here, or by our sidecar for us)
        _told = failure
    if not _runtime.publish(_runtime.JOB_FAILURE, failure):
        logger.debug("job notice: %s (no watchdog armed here: nothing to stop)",
                    failure.diagnosis())


def start(scope: JobScope | None = None) -> StoreLink | None:
    """Start this process's link (idempotent); ``None`` outside a launcher with a store."""
    global _link, _said_unavailable
    scope = scope or JobScope.from_env()
    with _lock:
        if scope is None:
            if not _said_unavailable:
                _said_unavailable = True
                # INFO only for what looks like a job (a rank torchrun started) whose store
                # cannot be used; a plain program is not a job and hears nothing of it.
                in_a_job = "RANK" in os.environ or "TORCHELASTIC_RUN_ID" in os.environ
                logger.log(
                    logging.INFO if in_a_job else logging.DEBUG,
                    "healthkit: no launcher store (MASTER_ADDR/MASTER_PORT unset): a failure "
                    "here ends this process tree only; other ranks are not told",
                )
            return None
        if _link is None:
            _runtime.at_fork_in_child("the parent's job link", _after_fork_in_child)
            _runtime.at_exit("threads", "close the job link", close)  # see StoreLink
            _link = StoreLink(scope, _deliver)
        return _link


def close() -> None:
    """Close this process's link, if any (at interpreter exit, before finalization)."""
    link = _link
    if link is not None:
        link.close()



def told() -> JobFailure | None:
    """The notice this process received, if any."""
    return _told


_pending: list[threading.Thread] = []
#: How long a publish waits for the link to be up (torch imported, store reached).
_READY_WAIT_S = 30.0


def publish(failure: JobFailure) -> bool:
    """Publish this process's failure to the job, once, unless it is itself following
    another rank's notice: in a background thread, so that the local actions never wait
    for the store (:func:`flush` waits for it before this process ends). True if a publish
    was started. Never raises."""
    global _published
    with _lock:
        link = _link
        if link is None or _told is not None or _published:
            return False
        _published = True

    def run() -> None:
        try:
            link.publish(failure, _READY_WAIT_S)
        except Exception:  # never let the notice get in the way of the local actions
            logger.debug("job notice: publish failed", exc_info=True)

    thread = threading.Thread(target=run, name="healthkit job notice publish", daemon=True)
    thread.start()
    _pending.append(thread)
    return True


def flush(timeout: float) -> None:
    """Wait (at most ``timeout`` seconds) until the publishes started here are done: called
    right before this process ends itself (``os._exit`` would lose a notice in flight)."""
    deadline = time.monotonic() + timeout
    for thread in list(_pending):
        thread.join(max(0.0, deadline - time.monotonic()))


def publish_diagnosis(diagnosis: Diagnosis) -> bool:
    link = _link
    if link is None:
        return False
    return publish(JobFailure.of(diagnosis, link.scope))


def publish_error(name: str, error: BaseException) -> bool:
    """For a barrier or a loader that fails this rank: publish it if this process has a
    link (a watchdog armed under a launcher). Never raises."""
    link = _link
    if link is None:
        return False
    try:
        failure = JobFailure.of_error(name, error, link.scope)
    except Exception:
        return False
    return publish(failure)


def publish_job_failure(failure: Diagnosis | BaseException, *, name: str = "this rank") -> bool:
    """Tell the rest of the job why this rank is failing: a helper's :class:`Diagnosis`, or
    an error raised here (a barrier, a loader; ``name`` says what raised it).

    For integrations and custom producers whose failure is not a watched death. The first
    failure of the job is published, once; a no-op (``False``) unless a watchdog armed in
    this process started the job-wide notice (under torchrun, by default), or this
    process is itself following another rank's notice. Never raises.
    """
    if not isinstance(name, str):
        raise InvalidArgumentTypeError(f"name must be a str, got {name!r}", "name")
    if isinstance(failure, Diagnosis):
        return publish_diagnosis(failure)
    if isinstance(failure, BaseException):
        return publish_error(name, failure)
    raise InvalidArgumentTypeError(
        f"failure must be a healthkit.Diagnosis or an exception, got {failure!r}", "failure"
    )


def abort_process_groups(timeout: float = 2.0) -> None:
    """Abort torch.distributed's process groups, if any, so that a collective blocked on a
    dead peer returns (NCCL never notices one) and teardown does not hang. Bounded: the
    abort runs in a daemon thread waited for ``timeout`` seconds. Never imports torch."""
    import sys

    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    if c10d is None:
        return
    abort = getattr(c10d, "_abort_process_group", None)
    is_init = getattr(c10d, "is_initialized", None)
    if abort is None or is_init is None:
        return
    try:
        if not is_init():
            return
    except Exception:
        return

    def run() -> None:
        try:
            abort()
        except Exception:
            logger.debug("aborting the process groups failed", exc_info=True)

    t = threading.Thread(target=run, name="healthkit abort process groups", daemon=True)
    t.start()
    t.join(timeout)
