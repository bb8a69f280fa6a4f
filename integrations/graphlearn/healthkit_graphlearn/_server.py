"""Launch the GL sampler server in a process we own, under a DisarmableWatchdog.

Simplified from graph-learn's ``launch_server``/``_server_manager``
(``graphlearn/python/nn/pytorch/data/utils.py``), which tzrec calls on LOCAL_RANK 0. GL's
version starts a daemon process and returns nothing, so nobody can notice the server's death:
its clients retry a dead connection for ~17 minutes and the job dies of a collective timeout
that names no cause. Here:

* the server is forked (the graph object cannot be pickled) and its handle kept;
* it reports readiness over a pipe once ``graph.init()`` returns. By default the launcher
  waits for that *or* its death, within a bound: a server that dies while loading raises
  :class:`SamplerServerStartupError` with the diagnosis instead of leaving clients retrying.
  ``wait=False`` is tzrec's shape: the rank goes on (building its model, starting its
  DataLoader, whose workers' clients wait for the server themselves) while the server loads.
  The watchdog is armed at once, so a death while loading fails the rank like any other, and
  the readiness bound is kept by the kernel: the server arms ``ITIMER_REAL`` before
  ``graph.init()`` and disarms it after, so a server that is still not ready at the deadline
  dies of SIGALRM (no thread of the rank or the server needs the GIL for that) and the
  watchdog reports it;
* a DisarmableWatchdog watches it, by default from a sidecar process, because the rank's own
  threads cannot run while its GL client call holds the GIL;
* the server dies with its owner (``PR_SET_PDEATHSIG``), even when the owner is SIGKILLed;
* a second launch in the same process returns the first server (GL's guard raised instead;
  the tzrec PR had dropped it).

The stats channel is dropped on purpose. GL's ``_server_manager`` stores
``graph.server_get_stats()`` into a ``multiprocessing.Manager`` dict for ``get_counts()``. The
server here still calls ``server_get_stats()`` (so it runs GL's exact init -> stats -> close
sequence) but discards the result: nothing in tzrec reads ``get_counts()``, and the Manager
would be one more helper process that can die unwatched. Do not "restore" it; a project that
needs the counts can compute them from its node table.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, Literal

from healthkit import (
    DisarmableWatchdog,
    ExitDiagnoser,
    HealthkitError,
    Heartbeat,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    ProcessDiedError,
    ProcessWatch,
    ProgressWatch,
    WatchSet,
    record_exception,
    stop,
)
from healthkit._shared import (
    check_bool,
    check_bound,
    check_callable,
    check_choice,
    check_exit_code,
    check_seconds,
    check_timeout,
)
from healthkit.actions import Action
from healthkit.lowlevel import die_with_parent, env_seconds, set_thread_name
from healthkit_graphlearn._tzrec.env import DistEnv, check_index

__all__ = [
    "DEFAULT_READY_TIMEOUT",
    "READY_TIMEOUT_ENV",
    "LaunchContextError",
    "SamplerServer",
    "SamplerServerError",
    "SamplerServerStartupError",
    "SamplerServerTimeoutError",
    "launch_sampler_server",
    "server_call",
]

logger = logging.getLogger("healthkit.graphlearn")

WatchMode = Literal["sidecar", "thread"]
CleanExit = Literal["ignore", "warn", "fail"]

READY_TIMEOUT_ENV = "HEALTHKIT_GL_READY_TIMEOUT_SECONDS"
#: Loading a large node table can take minutes; a server that *dies* while loading is
#: reported at once whatever this bound is.
DEFAULT_READY_TIMEOUT = 600.0
_STOP_TIMEOUT = 10.0


class SamplerServerError(HealthkitError, RuntimeError):
    """Base class of the errors the sampler-server launcher raises."""


class SamplerServerStartupError(SamplerServerError, ProcessDiedError):
    """The server process died before it was ready to serve; ``diagnosis`` says how."""


class SamplerServerTimeoutError(SamplerServerError, TimeoutError):
    """The server was still not ready at the deadline; it has been stopped."""


class LaunchContextError(SamplerServerError):
    """Launching (or stopping) from a thread or process where it cannot be done safely."""


class SamplerServer:
    """The handle on a running GL sampler server: its process, watch and watchdog.

    ``stop()`` disarms the watchdog first, so ending the server on purpose is never reported
    as a crash. At interpreter exit nothing needs to be called: the watchdog disarms itself
    before multiprocessing's exit hook SIGTERMs the (daemon) server.
    """

    def __init__(
        self,
        process: BaseProcess,
        watch: ProcessWatch,
        watchdog: DisarmableWatchdog,
        cluster: Mapping[str, int | str],
        task_index: int,
        address: str,
        ready_after: float | None,
        run_until_disarmed: bool = False,
        *,
        ready_conn: Connection | None = None,
        started_at: float | None = None,
        ready_timeout: float | None = None,
        diagnoser: ExitDiagnoser | None = None,
        progress: ProgressWatch | None = None,
    ) -> None:
        self.process = process
        #: Times the client calls made through :meth:`call` (``stall_timeout`` given), or
        #: ``None``.
        self.progress = progress
        self.watch = watch
        self.watchdog = watchdog
        self.cluster: dict[str, int | str] = dict(cluster)
        self.task_index = task_index
        self.address = address
        #: Seconds from fork to "ready to serve" (``graph.init()`` returned in the server);
        #: ``None`` while a ``wait=False`` launch has not been seen ready (see :attr:`ready`).
        self.ready_after = ready_after
        self._run_until_disarmed = run_until_disarmed
        self._ready_conn = ready_conn  # wait=False: the read end of the readiness pipe
        self._started_at = started_at
        self._ready_timeout = ready_timeout
        self._diagnoser = diagnoser
        self._owner_pid = os.getpid()
        self._lock = threading.Lock()
        self._stopped = False
        self._exitcode: int | None = None

    @property
    def name(self) -> str:
        return self.watch.name

    @property
    def pid(self) -> int:
        return self.watch.pid

    @property
    def stopped(self) -> bool:
        return self._stopped

    @property
    def exitcode(self) -> int | None:
        """The server's exit code once it ended (``-N``: killed by signal N)."""
        if self._exitcode is None and not self._stopped and os.getpid() == self._owner_pid:
            return self.process.exitcode
        return self._exitcode

    def is_alive(self) -> bool:
        self._check_owner("check")
        return not self._stopped and self.process.is_alive()

    @property
    def ready(self) -> bool:
        """Whether the server said it serves (``graph.init()`` returned); never blocks."""
        if self.ready_after is not None:
            return True
        self._check_owner("check")
        with self._lock:
            return self._poll_ready(0.0)

    def wait_ready(self, timeout: float | None = None) -> float:
        """Block until the server serves; return :attr:`ready_after`. For ``wait=False``
        launches (a ``wait=True`` launch returns ready); the deadline of the launch still
        holds (past it the server dies of SIGALRM and the watchdog reports it).

        Raises:
            SamplerServerStartupError: it died before it was ready; carries the diagnosis.
            SamplerServerTimeoutError: not ready within ``timeout`` seconds (it keeps loading).
            LaunchContextError: called from a process forked from the launching one.
        """
        check_timeout(timeout, "timeout")
        if self.ready_after is not None:
            return self.ready_after
        self._check_owner("wait for")
        with self._lock:
            if self._poll_ready(timeout):
                assert self.ready_after is not None
                return self.ready_after
            if self._stopped:
                raise SamplerServerError(f"{self.name} was stopped before it was ready")
            # The pipe's EOF can come a moment before the kernel reports the exit.
            dying = self._ready_conn is None
            if self.watch.wait(_STOP_TIMEOUT if dying else 0.0) is None:
                raise SamplerServerTimeoutError(
                    f"{self.name} (pid {self.pid}) was not ready to serve after "
                    f"{timeout or 0:g} s; it keeps loading (its own deadline is "
                    f"{self._ready_timeout:g} s from the launch)"
                )
            diagnosis = (self._diagnoser or ExitDiagnoser()).diagnose(self.watch)
        raise SamplerServerStartupError(
            f"{self.name} died before it was ready to serve: {diagnosis}", diagnosis
        )

    def _poll_ready(self, timeout: float | None) -> bool:
        """With ``_lock`` held: read the readiness message if it comes within ``timeout``."""
        conn = self._ready_conn
        if self.ready_after is not None:
            return True
        if conn is None or self._stopped:
            return False
        if not _wait_message(conn, self.watch, timeout):
            return False
        try:
            conn.recv()
        except EOFError:  # it died before saying so; the caller reads how
            self._close_ready_conn()
            return False
        assert self._started_at is not None
        self.ready_after = time.monotonic() - self._started_at
        self._close_ready_conn()
        logger.info("%s is ready, %.1f s after its launch", self.name, self.ready_after)
        return True

    def _close_ready_conn(self) -> None:
        if self._ready_conn is not None:
            self._ready_conn.close()
            self._ready_conn = None

    def call(self) -> contextlib.AbstractContextManager[None]:
        """A GL client call to the server is in flight while the block runs (see
        :func:`server_call`); nothing is timed without ``stall_timeout`` or once stopped."""
        progress = self.progress
        if progress is None or self._stopped:
            return contextlib.nullcontext()
        return progress.call()

    def _check_owner(self, what: str) -> None:
        if os.getpid() != self._owner_pid:
            raise LaunchContextError(
                f"{self.name} belongs to pid {self._owner_pid}; a forked child (pid "
                f"{os.getpid()}) cannot {what} it: do that in the process that launched it"
            )

    def stop(
        self,
        kill_after: float = _STOP_TIMEOUT,
        *,
        grace: float = 0.0,
    ) -> int | None:
        """Disarm the watchdog, then end the server; returns its exit code. Idempotent.

        ``grace``: seconds to let it finish by itself first (after every client called
        ``close()`` it exits 0 about 4 s later); then SIGTERM, and SIGKILL after
        ``kill_after`` seconds.
        """
        check_seconds(kill_after, "kill_after")
        check_seconds(grace, "grace")
        self._check_owner("stop")
        with self._lock:
            if self._stopped:
                return self._exitcode
            self.watchdog.disarm(reason="SamplerServer.stop()")
            proc = self.process
            # Asked already when grace > 0: its clients closed, so it finishes by itself.
            stop(
                [proc],
                request=(lambda: None) if grace > 0 else None,
                grace=grace,
                kill_after=kill_after,
                kill_timeout=_STOP_TIMEOUT,
                name=self.name,
            )
            self._exitcode = proc.exitcode
            self.watch.close()
            if self.progress is not None:
                self.progress.close()
            self._close_ready_conn()
            self._stopped = True
        _forget(self)
        logger.info("%s stopped (exit code %s)", self.name, self._exitcode)
        return self._exitcode

    def __enter__(self) -> SamplerServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "stopped" if self._stopped else "armed" if self.watchdog.armed else "unwatched"
        if not self._stopped and self.ready_after is None:
            state += ", loading"
        return f"<SamplerServer {self.name!r} pid={self.pid} {state}>"


# One server per process: the duplicate-launch guard.
_launch_lock = threading.Lock()
_launched: SamplerServer | None = None


def server_call() -> contextlib.AbstractContextManager[None]:
    """Wrap each GL client call to this node's sampler server in ``with server_call():``.

    With ``launch_sampler_server(..., stall_timeout=T)``, a call unanswered for ``T``
    seconds while the server is alive fails the rank that launched it, with the server's
    state (``/proc`` state, wait channel, what each thread is blocked on) and stacks,
    instead of a hang until the collective's timeout. Works in the launching process, in
    any of its threads and in the processes forked from it (DataLoader workers), all at
    once, each call timed on its own; the cost is two stores and a memory barrier per
    call. Where no server was launched with a ``stall_timeout`` (the other local ranks,
    or none given) it does nothing."""
    server = _launched
    if server is None:
        return contextlib.nullcontext()
    return server.call()


def _forget(server: SamplerServer) -> None:
    global _launched
    with _launch_lock:
        if _launched is server:
            _launched = None


def launch_sampler_server(
    graph: Any,
    cluster: Mapping[str, int | str],
    task_index: int,
    *,
    local_rank: int | None = None,
    mode: WatchMode = "sidecar",
    wait: bool = True,
    ready_timeout: float | None = None,
    arm: bool = True,
    on_clean_exit: CleanExit = "ignore",
    exit_code: int = 1,
    actions: Sequence[Action] | None = None,
    stall_timeout: float | None = None,
) -> SamplerServer | None:
    """Start this node's GL sampler server and watch it; ``None`` on ranks that run none.

    Only ``local_rank`` 0 (default: ``$LOCAL_RANK``, else 0) starts a server; the other local
    ranks return ``None`` at once. ``task_index`` is the node's ``GROUP_RANK``. Call it from the
    main thread, before the clients (and before forking DataLoader workers).

    ``wait=True`` (default) blocks until the server is ready to serve (``graph.init()``
    returned in it), at most ``ready_timeout`` seconds (default
    ``$HEALTHKIT_GL_READY_TIMEOUT_SECONDS``, else 600), then arms a DisarmableWatchdog on it: on an
    abnormal exit the rank logs the diagnosis, writes the torchelastic error file and exits
    so torchrun tears the job down in seconds.

    ``wait=False`` returns at once with the watchdog already armed (tzrec's shape: the
    clients in DataLoader workers wait for the server themselves). A death while loading
    then fails the rank like any later death, and a server still not ready after
    ``ready_timeout`` dies of SIGALRM (a kernel timer it armed itself), which the watchdog
    reports. ``SamplerServer.ready`` / ``wait_ready()`` tell when it serves.

    ``mode="sidecar"`` (default) watches from a separate process: a client call against a
    dead server holds the GIL for minutes, so a watcher *thread* in this process cannot run
    (``mode="thread"`` is enough only together with :func:`shorten_client_retries`).
    ``on_clean_exit``: the server exits 0 only after all ``client_count`` clients called
    ``close()``, GL's orderly shutdown, so by default that is not a failure ("warn" logs it,
    "fail" treats it like a crash). ``actions`` (thread mode only) replaces the default
    log + error file + exit.

    ``stall_timeout``: a client call made inside :func:`server_call` (or
    ``SamplerServer.call()``) that the live server leaves unanswered for this many seconds
    fails the rank like a death, with the server's state and stacks. Calls are timed only
    once the server serves (its loading has ``ready_timeout``); no call in flight, nothing
    is timed. Default ``None``: calls are not timed.

    A second call in the same process returns the first server (and logs that it did).

    Raises:
        SamplerServerStartupError: the server died while starting; carries the diagnosis
            (``wait=True`` only).
        SamplerServerTimeoutError: not ready within ``ready_timeout``; it has been stopped
            (``wait=True`` only).
        LaunchContextError: called off the main thread, or in a process forked from the one
            that launched the server.
        InvalidArgumentError: ``LOCAL_RANK`` (or ``$HEALTHKIT_GL_READY_TIMEOUT_SECONDS``) is
            invalid.
        ValueError, TypeError: a bad argument; the message says which.
    """
    global _launched
    servers = _check_cluster(cluster)
    check_index(task_index, "task_index")
    if task_index >= len(servers):
        raise InvalidArgumentError(
            f"task_index={task_index} but cluster['server'] lists {len(servers)} server(s): "
            "a node's server has task_index = its GROUP_RANK, 0.."
            f"{len(servers) - 1}",
            "task_index",
        )
    check_choice(mode, ("sidecar", "thread"), "mode")
    check_bool(wait, "wait")
    check_bool(arm, "arm")
    check_choice(on_clean_exit, ("ignore", "warn", "fail"), "on_clean_exit")
    check_exit_code(exit_code, "exit_code")
    if stall_timeout is not None:
        check_timeout(stall_timeout, "stall_timeout", positive=True, minimum=0.05)
    if actions is not None:
        if mode != "thread":
            raise InvalidArgumentError(
                "actions= runs in this process, so it needs mode='thread' (the sidecar runs "
                "fixed actions): pass mode='thread', or drop actions=",
                "actions",
            )
        if isinstance(actions, (str, bytes)) or not isinstance(actions, Sequence):
            raise InvalidArgumentTypeError(
                f"actions must be a list of callables or None, got {actions!r}", "actions"
            )
        for action in actions:
            check_callable(action, "actions")
    if local_rank is None:
        local_rank = DistEnv.local_rank_from_environ()
    else:
        check_index(local_rank, "local_rank")
    if ready_timeout is None:
        ready_timeout = env_seconds(READY_TIMEOUT_ENV, DEFAULT_READY_TIMEOUT, strict=True)
    else:
        check_bound(ready_timeout, "ready_timeout")
    if local_rank != 0:
        logger.debug("LOCAL_RANK=%d: the node's sampler server runs on local rank 0", local_rank)
        return None

    with _launch_lock:
        existing = _launched
        if existing is not None and existing._owner_pid != os.getpid():
            raise LaunchContextError(
                f"this process (pid {os.getpid()}) was forked from pid {existing._owner_pid}, "
                f"which already runs {existing.name}: launch the server once, in the main "
                "process, before forking DataLoader workers"
            )
        if existing is not None and not existing.stopped:
            notes = []
            if existing.cluster != dict(cluster) or existing.task_index != task_index:
                notes.append(f"the new {cluster=}, {task_index=} are ignored")
            if existing.exitcode is not None:
                notes.append(f"it has exited with code {existing.exitcode}")
            logger.log(
                logging.WARNING if notes else logging.INFO,
                "a graphlearn sampler server was already launched by this process: returning "
                "%s instead of starting a second one%s",
                existing,
                f" ({'; '.join(notes)}; stop() it first to launch another)" if notes else "",
            )
            return existing
        if threading.current_thread() is not threading.main_thread():
            raise LaunchContextError(
                "launch_sampler_server must be called from the main thread: the server is "
                "killed when the thread that forked it ends (PR_SET_PDEATHSIG, the guarantee "
                f"that it never outlives this process), and {threading.current_thread().name!r}"
                " may end first"
            )
        server = _start(
            graph,
            dict(cluster),
            task_index,
            servers[task_index],
            mode=mode,
            wait=wait,
            ready_timeout=float(ready_timeout),
            arm=arm,
            on_clean_exit=on_clean_exit,
            exit_code=exit_code,
            actions=actions,
            stall_timeout=None if stall_timeout is None else float(stall_timeout),
        )
        _launched = server
        return server


def _check_cluster(cluster: object) -> list[str]:
    """The server list of a tzrec-shaped cluster spec, or an error saying what is wrong."""
    if not isinstance(cluster, Mapping):
        raise InvalidArgumentTypeError(
            "cluster must be a mapping like {'server': 'host:port,...', 'client_count': N} "
            f"(see get_cluster_spec), got {type(cluster).__name__}",
            "cluster",
        )
    raw = cluster.get("server")
    servers = [s.strip() for s in raw.split(",")] if isinstance(raw, str) else []
    if not servers or not all(_is_host_port(s) for s in servers):
        raise InvalidArgumentError(
            f"cluster['server'] must be 'host:port[,host:port...]' (one per node), got {raw!r}",
            "cluster",
        )
    count = cluster.get("client_count")
    clients = cluster.get("client")
    ok_count = isinstance(count, int) and not isinstance(count, bool) and count >= 1
    if not ok_count and not (isinstance(clients, str) and clients.strip()):
        raise InvalidArgumentError(
            "cluster needs 'client_count' (an int >= 1: WORLD_SIZE x clients per rank) or "
            f"'client'; got client_count={count!r}",
            "cluster",
        )
    return servers


def _is_host_port(s: str) -> bool:
    host, sep, port = s.rpartition(":")
    return bool(sep and host and port.isdigit() and 0 < int(port) < 65536)


def _gl_module(graph: Any) -> Any:
    """The ``graphlearn`` package the graph object comes from (already imported)."""
    mod = type(graph).__module__
    root = mod.split(".python.")[0] if ".python." in mod else mod.partition(".")[0]
    found = sys.modules.get(root)
    if found is not None and hasattr(found, "set_tracker_mode"):
        return found
    from healthkit_graphlearn._tzrec.gl_import import import_graphlearn

    return import_graphlearn()


@record_exception  # its exception, if it raises, names the cause in the owner's diagnosis
def _serve(
    graph: Any,
    cluster: dict[str, int | str],
    task_index: int,
    ready: Connection,
    unused_end: Connection,
    parent_pid: int,
    ready_deadline: float | None = None,
    heartbeat: Heartbeat | None = None,
) -> None:
    """The server process: GL's ``_server_manager`` with a readiness message, no stats.

    Wrapped in :func:`healthkit.record_exception`: a Python exception it raises (a bad
    cluster spec, a table that fails to load) reaches the owner's diagnosis and torchrun's
    root cause, and ``healthkit stacks`` can show where a live server is.

    ``ready_deadline``: seconds after which a server whose ``graph.init()`` has not returned
    dies of SIGALRM. A kernel timer, because ``init()`` holds the GIL: no Python code of this
    process runs until it returns.

    ``heartbeat``: the owner times client calls (``stall_timeout``). The server attaches
    before ``graph.init()`` (its stacks can then be read without interrupting it, GL's
    threads included) and says it is ready after: calls made while it loads are not
    timed."""
    die_with_parent(parent_pid)  # first: from here on it cannot outlive its owner
    set_thread_name("gl-sampler-srv")
    unused_end.close()
    # Inherited Python handlers cannot run while GL's native calls hold the GIL, which would
    # make the SIGTERM of multiprocessing's exit hook a no-op and hang the owner's exit.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # Ctrl-C is for the owner; the server ends with it (exit hook or parent-death signal).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # An explicit server list needs GL's RPC tracker mode; the default (file tracker) aborts.
    _gl_module(graph).set_tracker_mode(0)
    if heartbeat is not None:
        heartbeat.attach(ready=False)
    if ready_deadline is not None:
        signal.signal(signal.SIGALRM, signal.SIG_DFL)  # its default action: terminate
        signal.setitimer(signal.ITIMER_REAL, ready_deadline)
    graph.init(cluster=cluster, job_name="server", task_index=task_index)
    if ready_deadline is not None:
        signal.setitimer(signal.ITIMER_REAL, 0)
    if heartbeat is not None:
        heartbeat.ready()
    ready.send(os.getpid())
    ready.close()
    graph.server_get_stats()  # result dropped on purpose: see the module docstring
    graph.close()  # returns once all client_count clients called close()


def _start(
    graph: Any,
    cluster: dict[str, int | str],
    task_index: int,
    address: str,
    *,
    mode: WatchMode,
    wait: bool,
    ready_timeout: float,
    arm: bool,
    on_clean_exit: CleanExit,
    exit_code: int,
    actions: Sequence[Action] | None,
    stall_timeout: float | None = None,
) -> SamplerServer:
    name = f"graphlearn sampler server {task_index} at {address}"
    progress = None if stall_timeout is None else ProgressWatch(
        stall_timeout, name=name, callers=True
    )
    diagnoser = ExitDiagnoser()  # OOM evidence is counted from here on
    ctx = multiprocessing.get_context("fork")  # the graph object cannot be pickled
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(
        target=_serve,
        args=(
            graph,
            cluster,
            task_index,
            send,
            recv,
            os.getpid(),
            None if wait else ready_timeout,
            None if progress is None else progress.heartbeat,
        ),
        name=name,
        daemon=True,  # multiprocessing's exit hook ends it on a normal exit
    )
    started = time.monotonic()
    try:
        proc.start()
    except BaseException:
        recv.close()
        if progress is not None:
            progress.close()
        raise
    finally:
        send.close()  # the child holds the only write end: its death reads as EOF
    watch = ProcessWatch(proc, name=name)
    ready_after: float | None = None
    if wait:
        try:
            _wait_ready(recv, watch, diagnoser, ready_timeout)
        except BaseException:
            _kill(proc, watch)
            if progress is not None:
                progress.close()
            raise
        finally:
            recv.close()
        ready_after = time.monotonic() - started
    watchdog = DisarmableWatchdog(
        mode=mode,
        name="healthkit_graphlearn",
        diagnoser=diagnoser,
        exit_code=exit_code,
        actions=actions,
    )
    watchdog.watch(watch, on_clean_exit=on_clean_exit)
    if progress is not None:
        watchdog.watch_progress(progress)
    until_disarmed = on_clean_exit != "ignore"
    server = SamplerServer(
        proc,
        watch,
        watchdog,
        cluster,
        task_index,
        address,
        ready_after,
        until_disarmed,
        ready_conn=None if wait else recv,
        started_at=started,
        ready_timeout=ready_timeout,
        diagnoser=diagnoser,
        progress=progress,
    )
    if arm:
        try:
            watchdog.arm()
        except BaseException:
            _kill(proc, watch)
            server._close_ready_conn()
            if progress is not None:
                progress.close()
            raise
    watched = f"watched by the {mode} watchdog" if arm else "not watched (arm=False)"
    if wait:
        logger.info(
            "%s started as pid %d, ready after %.1f s, %s", name, proc.pid, ready_after, watched
        )
    else:
        logger.info(
            "%s started as pid %d, loading in the background, %s; if graph.init() has not "
            "returned after %g s it ends itself with SIGALRM (ready_timeout= or $%s)",
            name,
            proc.pid,
            watched,
            ready_timeout,
            READY_TIMEOUT_ENV,
        )
    return server


def _wait_message(conn: Connection, watch: ProcessWatch, timeout: float | None) -> bool:
    """Wait until ``conn`` is readable (the readiness message, or EOF when the server died
    before sending it), the server ends, or ``timeout`` passes; ``True`` if ``conn`` is
    readable."""
    readable: list[bool] = []
    fd = conn.fileno()
    with WatchSet([watch]) as ws:

        def on_ready() -> None:
            readable.append(True)
            ws.remove_fd(fd)  # read by the caller, after the wait
            ws.wake()

        ws.add_fd(fd, on_ready)
        ws.wait(timeout)
    return bool(readable)


def _wait_ready(
    recv: Connection, watch: ProcessWatch, diagnoser: ExitDiagnoser, timeout: float
) -> None:
    """Return once the server says it serves; raise as soon as it dies, or at the deadline."""
    said = _wait_message(recv, watch, timeout)
    if said:
        try:
            recv.recv()
            return
        except EOFError:
            pass  # it died before sending: every write end is closed
    if said or watch.poll() is not None:
        # The pipe's EOF can come a moment before the kernel reports the exit.
        if watch.wait(_STOP_TIMEOUT) is not None:
            diagnosis = diagnoser.diagnose(watch)
            raise SamplerServerStartupError(
                f"{watch.name} died while starting, before it was ready to serve; GL's own "
                f"error is in the stderr above and in its glog files in {os.getcwd()}. "
                f"Diagnosis: {diagnosis}",
                diagnosis,
            )
    raise SamplerServerTimeoutError(
        f"{watch.name} (pid {watch.pid}) was not ready to serve after {timeout:g} s "
        "(graph.init() had not returned), so it was stopped. If loading the graph takes "
        f"longer, raise ready_timeout= or ${READY_TIMEOUT_ENV}; otherwise look for the cause "
        f"in its glog files in {os.getcwd()}"
    )


def _kill(proc: BaseProcess, watch: ProcessWatch) -> None:
    stop([proc], kill_after=0, kill_timeout=_STOP_TIMEOUT, name=watch.name)
    watch.close()


import healthkit_graphlearn as _package  # noqa: E402

_package._publish(__name__)
