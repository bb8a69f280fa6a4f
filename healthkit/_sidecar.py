"""The sidecar watcher: a small separate process that does not need the owner's GIL.

Why: a graph-learn client call against a dead server retries for minutes inside native code
*holding the GIL*; no Python thread of that process can run, so a thread watchdog cannot
fire. The sidecar watches the same pids through pidfds (it is not their parent, so it reads
the exit status from the zombie's ``/proc/<pid>/stat`` while the stuck owner has not reaped
it), logs the diagnosis through the owner's logging configuration (its file and stream
handlers, level and format as they were at ``arm()``), writes the torchelastic error file and then
stops the owner (SIGTERM, SIGKILL after a grace period) so the launcher tears the job down.

It judges deaths exactly as the owner's watcher thread does (:class:`healthkit._judge.Judge`
over :func:`healthkit._decide.decide`), from what it knows:

* a status it cannot read (the owner reaped the helper first, which is routine when the
  owner ``join()``s) is taken from the owner, whose watcher thread reports every status it
  learns; only when none comes is it "unknown", which fires for a process declared to run
  until disarmed and never for one allowed to finish;
* the owner's stop episode: the stop signals the owner's listener recorded (sent here before
  each byte is consumed), the stop signals the sidecar itself received (it is in the owner's
  process group: a group stop reaches both), a byte still unread on the owner's wakeup
  socket (the sidecar holds a copy of its read end and only ever *peeks*: the owner's GIL
  may be held, so nobody there can read it), and a stop signal still pending for the owner
  (``/proc/<owner>/status``);
* the processes :func:`healthkit.stop` in the owner set out to end (sent here before any
  signal), which are never reported.

Isolation: the sidecar runs as ``python -I``: neither the working directory, ``PYTHONPATH``
nor the user site can put code into it (it runs as the owner's user, often root). healthkit
itself is imported from the exact directory the owner imported it from, and attrs from the
owner's copy if the isolated path lacks it.

Signals: the sidecar survives SIGINT, SIGTERM and SIGHUP, and records when each came. It is in
the owner's process group, so a Ctrl-C or torchrun's group SIGTERM reaches it too: it must keep
watching while the owner cleans up, and its own record of the signal is evidence of the
owner's stop that no library in the owner (uvloop, a ``sigwait``, a signal storm) can take
away. It exits on ``disarm``, on end-of-file and when the owner is gone (its pidfd
is readable, it is a zombie, or SIGKILL is pending for it; end-of-file alone is not enough:
forked children of the owner inherit its end of the socket).

Protocol: one JSON object per line, both ways, over a socketpair (``op`` names the message).

==================  =========================================================================
owner -> sidecar
==================  =========================================================================
``config``          ``owner_pid``, ``owner_pgrp``, ``name``, ``kill_after``, ``stop_grace``,
                    ``second_look``, ``logging`` (:func:`logging_plan`), ``diagnoser``
                    (the owner's diagnoser's settings), ``rss_sample_interval``; answered
                    by ``ready``
``watch``           ``pid``, ``name``, ``start_time``, ``on_clean_exit``, ``pgrp``, ``ended``,
                    ``returncode`` (what the owner already knows); answered by ``watching``
``status``          ``pid``, ``returncode``, ``source``: how a watched process ended, as the
                    owner learned it
``stop``            ``signal``, ``at`` (``CLOCK_MONOTONIC`` seconds): a stop signal reached the
                    owner (sent before the owner consumes its byte)
``stopped``         ``pid``, ``start_time``: :func:`healthkit.stop` is about to end it
``progress``        ``fd``, ``bell``, ``name``, ``who``, ``stall_timeout``: watch a progress
                    page (opened through ``/proc/<owner>/fd/<fd>``; ``bell``, if not null,
                    the pipe its callers ring, opened the same way); answered by ``watching``
``expect``          a wait for progress began while no timer was set: look at the pages
``notice``          ``notice`` (JSON text): another rank's failure notice, heard first by the
                    owner's link to the job's store (the sidecar's may still be coming up)
``disarm``          exit now
==================  =========================================================================

==================  =========================================================================
sidecar -> owner
==================  =========================================================================
``ready``           the answer to ``config``
``watching``        the answer to ``watch``
``log``             ``level``, ``msg``, ``created``: one of the sidecar's log records, for the
                    owner's handlers it cannot write through (only when ``logging.relay``)
``flush``           the diagnosis is logged: flush those handlers and answer ``logged``
                    (waited for briefly before the owner is stopped)
``publish``         ``notice`` (JSON text): publish this failure through the owner's link to
                    the job's store (the sidecar's own is not up yet); answered by
                    ``published`` with ``ok`` (whether the notice is in the store; waited for
                    briefly before the owner is stopped; if not ok, the sidecar publishes)
==================  =========================================================================

owner -> sidecar, also: ``logged`` (the answer to ``flush``), ``published`` (to ``publish``).

Under a launcher's job, sidecar mode: the sidecar starts its own link to the job's store in a
*link process* of its own (see :class:`_LinkProcess`: importing torch there does not stall the
sidecar's loop).
"""

from __future__ import annotations

import contextlib
import json
import logging
import logging.handlers
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import attrs

from healthkit import _jobnotice, _judge, _runtime
from healthkit._actions import (
    TORCHELASTIC_ERROR_FILE,
    FailureEvent,
    emit,
    flush_logging,
    log_diagnosis,
    write_torchelastic_error_file,
)
from healthkit._decide import Decision, Verdict, check_on_clean_exit
from healthkit._diagnose.diagnosis import Diagnosis, ExitDiagnoser
from healthkit._errors import HealthkitError, NoSuchProcessError
from healthkit._judge import Judge, Watched, early_exit_wording, survived_stop_wording
from healthkit._os.proc import ProcStat, group_members, read_pending_signals, read_proc_stat
from healthkit._progress import ProgressWatch, Tracker, stall_diagnosis
from healthkit._watch import stopsignals as _stopsignals
from healthkit._watch.process import UNKNOWN_NOT_PERMITTED, ExitStatus, ProcessWatch, WatchSet
from healthkit._watch.stop import stop, watch_tree
from healthkit._watch.stopsignals import STOP_SIGNALS, Signal, StopEpisode, current_episode

__all__ = ["SidecarError", "SidecarLink"]

logger = logging.getLogger("healthkit")

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))
# Isolated start: import this very healthkit package by path (nothing else from its parent
# directory), and attrs from the owner's copy only when the isolated path has none.
_SIDECAR_MAIN = """\
import importlib.util, sys
pkg, attrs_dir = sys.argv[1], sys.argv[2]
try:
    import attrs
except ImportError:
    sys.path.append(attrs_dir)
spec = importlib.util.spec_from_file_location(
    "healthkit", pkg + "/__init__.py", submodule_search_locations=[pkg])
module = importlib.util.module_from_spec(spec)
sys.modules["healthkit"] = module
spec.loader.exec_module(module)
from healthkit._sidecar import main
sys.exit(main(sys.argv[3:]))
"""
_START_TIMEOUT_S = 30.0  # interpreter start-up on a loaded 2-core machine
# How long the sidecar waits for the owner's word on a status it could not read itself.
_OWNER_STATUS_WAIT_S = 2.0


class SidecarError(HealthkitError, RuntimeError):
    """The sidecar watcher could not be started or stopped talking."""


def _attrs_dir() -> str:
    import attrs

    return os.path.dirname(os.path.dirname(os.path.abspath(attrs.__file__)))


def _line(**msg: Any) -> bytes:
    return json.dumps(msg).encode() + b"\n"


_SIDECAR_FORMAT = "%(asctime)s %(levelname)s healthkit sidecar: %(message)s"
_STYLES = {logging.PercentStyle: "%", logging.StrFormatStyle: "{", logging.StringTemplateStyle: "$"}


def logging_plan(
    log: logging.Logger,
) -> tuple[dict[str, Any], list[int], list[logging.Handler]]:
    """How the sidecar logs as ``log`` would in the owner: its effective level, whether it is
    disabled, and the handlers a record from it reaches that another process can write
    through (file handlers by path, stream handlers by file descriptor), each with its
    level and format. Also the descriptors the sidecar must inherit, and the other handlers
    (a queue, syslog, a stream with no descriptor, pytest's capture): the sidecar sends its
    records to the owner for those (``relay``), and the owner hands them over while it can."""
    handlers: list[dict[str, Any]] = []
    not_carried: list[logging.Handler] = []
    fds: list[int] = []
    current: logging.Logger | None = log
    seen: set[int] = set()
    while current is not None:
        for h in current.handlers:
            if id(h) in seen:
                continue
            seen.add(id(h))
            spec = _handler_spec(h)
            if spec is None:
                not_carried.append(h)
                continue
            handlers.append(spec)
            fd = spec.get("fd")
            if isinstance(fd, int) and fd > 2:
                fds.append(fd)
        current = current.parent if current.propagate else None
    plan = {
        "level": log.getEffectiveLevel(),
        "disabled": log.disabled,
        "handlers": handlers,
        "relay": bool(not_carried),
    }
    return plan, fds, not_carried


def _handler_spec(h: logging.Handler) -> dict[str, Any] | None:
    fmt = h.formatter
    if fmt is not None and type(fmt) is not logging.Formatter:
        # A formatter class of the application's own (JSON, structured): the sidecar cannot
        # run its code (it imports nothing of the application), and writing plain text into
        # that file would break it. Its lines are relayed to the owner, which formats them.
        return None
    spec: dict[str, Any] = {
        "level": h.level,
        "fmt": fmt._fmt if fmt is not None else None,
        "datefmt": fmt.datefmt if fmt is not None else None,
        "style": _STYLES.get(type(fmt._style), "%") if fmt is not None else "%",
    }
    if isinstance(h, logging.FileHandler):
        return {**spec, "path": h.baseFilename, "encoding": h.encoding}
    if type(h) is logging.StreamHandler:  # a subclass may write elsewhere than its stream
        try:
            fd = h.stream.fileno()
        except (AttributeError, OSError, ValueError):
            return None
        return {**spec, "fd": fd}
    return None


def apply_logging_plan(plan: dict[str, Any] | None) -> logging.Handler | None:
    """In the sidecar: the owner's handlers, level and ``disabled`` for ``healthkit``; with
    no handler carried, the sidecar's own line on its stderr (at the owner's level). When
    the plan relays lines to the owner, that stderr line is returned instead of installed:
    it is written only for lines the owner did not take (see :class:`_RelayHandler`)."""
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    log = logging.getLogger("healthkit")
    if plan is None:
        plan = {"level": logging.INFO, "disabled": False, "handlers": []}
    built: list[logging.Handler] = []
    for spec in plan["handlers"]:
        try:
            handler: logging.Handler
            if "path" in spec:
                handler = logging.FileHandler(spec["path"], encoding=spec["encoding"], delay=True)
            else:
                stream = os.fdopen(os.dup(spec["fd"]), "w", buffering=1, closefd=True)
                handler = logging.StreamHandler(stream)
        except OSError:
            continue
        if spec["fmt"] is not None or spec["datefmt"] is not None:
            handler.setFormatter(
                logging.Formatter(spec["fmt"], spec["datefmt"], style=spec["style"])
            )
        handler.setLevel(spec["level"])
        built.append(handler)
    fallback: logging.Handler | None = None
    if not built:
        fallback = logging.StreamHandler(sys.stderr)
        fallback.setFormatter(logging.Formatter(_SIDECAR_FORMAT))
        if not plan.get("relay"):
            built.append(fallback)
            fallback = None
    for handler in built:
        log.addHandler(handler)
    log.propagate = False
    log.setLevel(plan["level"])
    log.disabled = bool(plan["disabled"])
    return fallback


class SidecarLink:
    """The owner's end: starts the sidecar and tells it what to watch and what it learns."""

    def __init__(
        self,
        *,
        name: str,
        kill_after: float,
        stop_grace: float,
        witness: bool = False,
        job: _jobnotice.JobScope | None = None,
        diagnoser: dict[str, Any] | None = None,
        rss_sample_interval: float | None = None,
    ) -> None:
        ours, theirs = socket.socketpair()
        peek = _stopsignals.peek_fd()
        peek_copy = os.dup(peek) if peek is not None else None
        log_plan, log_fds, self._relay_to = logging_plan(logger)
        pass_fds = [theirs.fileno()] + ([peek_copy] if peek_copy is not None else []) + log_fds
        try:
            self._proc = subprocess.Popen(
                [
                    sys.executable, "-I", "-c", _SIDECAR_MAIN, _PKG_DIR, _attrs_dir(),
                    str(theirs.fileno()), str(peek_copy if peek_copy is not None else -1),
                ],
                pass_fds=pass_fds,
                stdin=subprocess.DEVNULL,
            )  # fmt: skip
        finally:
            theirs.close()
            if peek_copy is not None:
                os.close(peek_copy)
        self._sock = ours
        self._sock.settimeout(_START_TIMEOUT_S)
        self._buf = b""
        self._lock = threading.Lock()
        self._closed = False
        self._send(
            op="config",
            owner_pid=os.getpid(),
            owner_pgrp=os.getpgrp(),
            name=name,
            kill_after=kill_after,
            stop_grace=stop_grace,
            second_look=_judge.SECOND_LOOK_S,
            logging=log_plan,
            witness=witness,
            job=job.to_dict() if job is not None else None,
            error_file=os.environ.get(TORCHELASTIC_ERROR_FILE),
            diagnoser=diagnoser,
            rss_sample_interval=rss_sample_interval,
        )
        self._expect("ready")
        if self._relay_to:
            logger.debug(
                "%s: the sidecar sends its lines here for %s (it writes through file and "
                "stream handlers itself)",
                name,
                ", ".join(map(repr, self._relay_to)),
            )
        # From here on every stop signal and every healthkit.stop() target is announced
        # before it can matter; the ones before are sent once, now.
        _runtime.subscribe(_runtime.STOP_SIGNAL, self._stop_signal)
        _runtime.subscribe(_runtime.STOP_SURVIVED, self._survived)
        _runtime.subscribe(_runtime.STOPPING, self._stopping)
        for sig, at, seen in _stopsignals.history():
            if seen != "pending":
                self._stop_signal(sig, at)
        for at in _stopsignals.survived_marks():
            self._survived(at)

    @property
    def pid(self) -> int:
        return self._proc.pid

    def process_watch_status(self) -> int | None:
        """The sidecar's exit code if it has ended (it is then reaped), else None."""
        return self._proc.poll()

    def process_watch(self) -> ProcessWatch:
        """A watch on the sidecar itself, so the owner notices if it dies."""
        return ProcessWatch(self._proc, name="healthkit sidecar")

    def watch(self, record: Watched) -> None:
        """Watch ``record``'s process, telling what the owner already knows of it."""
        w = record.watch
        ended = None
        if w is not None:
            ended = w.status if w.closed else w.peek()
        with self._lock:
            self._send(
                op="watch",
                pid=record.pid,
                name=record.name,
                start_time=record.start_time,
                on_clean_exit=record.on_clean_exit,
                pgrp=record.pgrp,
                ended=ended is not None,
                returncode=ended.returncode if ended is not None else None,
            )
            self._expect("watching")

    def progress(self, watch: ProgressWatch) -> None:
        """Watch a progress page too (the sidecar maps it through ``/proc``)."""
        with self._lock:
            self._send(
                op="progress",
                fd=watch.fileno(),
                bell=watch.bell,
                name=watch.name,
                who=watch.who,
                stall_timeout=watch.stall_timeout,
            )
            self._expect("watching")

    def expect(self) -> None:
        """A wait for progress began and no timer is set: tell the sidecar to look."""
        self._send_quietly(op="expect")

    def status(self, pid: int, status: ExitStatus | None) -> None:
        """Tell the sidecar how ``pid`` ended, as far as the owner knows."""
        self._send_quietly(
            op="status",
            pid=pid,
            returncode=status.returncode if status else None,
            source=status.source if status else "unknown",
        )

    def _stop_signal(self, sig: signal.Signals, at: float) -> None:
        self._send_quietly(op="stop", signal=int(sig), at=at)

    def _survived(self, at: float) -> None:
        self._send_quietly(op="survived", at=at)

    def _stopping(self, pid: int, start_time: int | None) -> None:
        self._send_quietly(op="stopped", pid=pid, start_time=start_time)

    def notice(self, failure: _jobnotice.JobFailure) -> None:
        """Pass another rank's notice on to the sidecar (this process heard it first)."""
        self._send_quietly(op="notice", notice=failure.to_bytes().decode())

    def _send_quietly(self, **msg: Any) -> None:
        if self._closed:
            return
        with contextlib.suppress(OSError), self._lock:
            self._sock.sendall(_line(**msg))

    @property
    def relays(self) -> bool:
        """Whether the sidecar sends its log records here (handlers it cannot write to)."""
        return bool(self._relay_to)

    def fileno(self) -> int:
        return self._sock.fileno()

    def take_messages(self) -> bool:
        """Handle what the sidecar sent (its log records), without waiting; False once it
        closed the link. Called by the owner's watcher thread when the socket is readable."""
        with self._lock:
            if self._closed:
                return False
            self._sock.settimeout(0)
            try:
                chunk = self._sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                return True
            except OSError:
                return False
            finally:
                self._sock.settimeout(_START_TIMEOUT_S)
            if not chunk:
                return False
            self._buf += chunk
            while b"\n" in self._buf:
                line, _, self._buf = self._buf.partition(b"\n")
                self._on_sidecar_line(line)
            return True

    def _on_sidecar_line(self, line: bytes) -> bool:
        """Handle a log record or a flush request; False for anything else (a reply)."""
        try:
            msg = json.loads(line)
        except ValueError:
            return False
        op = msg.get("op") if isinstance(msg, dict) else None
        if op == "log":
            record = logging.LogRecord(
                logger.name, int(msg["level"]), "(healthkit sidecar)", 0, msg["msg"], None, None
            )
            record.created = float(msg["created"])
            for handler in self._relay_to:
                if record.levelno >= handler.level:
                    with contextlib.suppress(Exception):
                        handler.handle(record)
            return True
        if op == "publish":
            # The sidecar fired before its own link to the job's store was up: publish
            # through this process's (up since arm()), then answer, so that the sidecar
            # stops this process only once the notice is out. Bounded: it stops us anyway.
            # Only through a link that is up: a publish is then a few store round trips
            # (not a connect the sidecar's stop could cut between the counter and the notice).
            try:
                failure = _jobnotice.JobFailure.from_bytes(str(msg["notice"]).encode())
            except (KeyError, ValueError):
                failure = None
            link = _jobnotice._link
            ok = False
            if (failure is not None and link is not None and link.ready()
                    and _jobnotice.told() is None):
                ok = link.publish(failure, _OWNER_PUBLISH_WAIT_S)
            with contextlib.suppress(OSError):
                self._sock.sendall(_line(op="published", ok=ok))
            return True
        if op == "flush":
            for handler in self._relay_to:
                with contextlib.suppress(Exception):
                    handler.flush()
                    _drain_queue(handler)
            with contextlib.suppress(OSError):
                self._sock.sendall(_line(op="logged", n=msg.get("n")))
            return True
        return False

    def wait_for_action(self, timeout: float) -> None:
        """Give the sidecar time to act on a death it is seeing (it will stop us)."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout)

    def leave(self) -> None:
        """This process is exiting (its interpreter shuts down): a witness keeps watching
        until it is gone, to tell an exit code no error file explains. Nothing is waited
        for; the socket closes with this process."""
        self._send_quietly(op="exiting")

    def disarm(self, timeout: float | None) -> None:
        self._send_quietly(op="disarm")
        if timeout is None:
            self._proc.wait()
        else:
            stop([self._proc], grace=timeout, kill_after=0, name="the healthkit sidecar")
        self.close()

    def close(self) -> None:
        """Release the socket (the sidecar, if alive, exits on end-of-file) and reap it."""
        _runtime.unsubscribe(_runtime.STOP_SIGNAL, self._stop_signal)
        _runtime.unsubscribe(_runtime.STOP_SURVIVED, self._survived)
        _runtime.unsubscribe(_runtime.STOPPING, self._stopping)
        if self._closed:
            return
        self._closed = True
        self._sock.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(_START_TIMEOUT_S)

    def _send(self, **msg: Any) -> None:
        self._sock.sendall(_line(**msg))

    def _expect(self, word: str) -> None:
        while b"\n" not in self._buf:
            try:
                chunk = self._sock.recv(4096)
            except (TimeoutError, OSError):
                chunk = b""
            if not chunk:
                stop([self._proc], kill_after=0, name="the healthkit sidecar")
                self._sock.close()
                self._closed = True
                raise SidecarError(
                    f"the healthkit sidecar (pid {self._proc.pid}) did not answer {word!r}; "
                    "its stderr above says why (is healthkit importable by sys.executable?)"
                )
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        if self._on_sidecar_line(line):
            self._expect(word)  # a log record relayed meanwhile: the reply is next
            return
        try:
            op = json.loads(line).get("op")
        except (ValueError, AttributeError):
            op = None
        if op != word:
            raise SidecarError(f"sidecar protocol error: expected {word!r}, got {line!r}")


# ---------------------------------------------------------------------- sidecar process
def _drain_queue(handler: logging.Handler, timeout: float = 2.0) -> None:
    """A ``QueueHandler``'s ``flush`` writes nothing: its records are written later by the
    application's ``QueueListener`` thread. "logged" lets the sidecar stop this process, so
    wait (bounded) until that listener has taken every record (``task_done``); a queue that
    does not count its tasks (a multiprocessing queue) is handed over as it is."""
    queue = getattr(handler, "queue", None)
    if not isinstance(handler, logging.handlers.QueueHandler) or queue is None:
        return
    deadline = time.monotonic() + timeout
    while getattr(queue, "unfinished_tasks", 0) and time.monotonic() < deadline:
        time.sleep(0.005)


class _RelayHandler(logging.Handler):
    """In the sidecar: send each record to the owner, for its handlers the sidecar cannot
    write through itself.

    With ``fallback`` (the owner has no handler the sidecar writes through), each line is
    also kept until the owner confirms it took it (``logged`` answers a ``flush`` that
    counts the lines sent), and written to ``fallback`` (stderr) only if it never does (its
    GIL held, or gone): a line printed by both would show twice on a QueueHandler's
    console."""

    def __init__(self, sock: socket.socket, fallback: logging.Handler | None) -> None:
        super().__init__()
        self.sock = sock
        self.fallback = fallback
        self.sent = 0
        self.unconfirmed: list[tuple[int, logging.LogRecord]] = []

    def emit(self, record: logging.LogRecord) -> None:
        msg = _line(op="log", level=record.levelno, msg=record.getMessage(), created=record.created)
        self.sent += 1
        if self.fallback is not None:
            self.unconfirmed.append((self.sent, record))
            msg += _line(op="flush", n=self.sent)
        with contextlib.suppress(OSError):
            self.sock.sendall(msg)

    def confirmed(self, n: object) -> None:
        """The owner handed the first ``n`` lines to its handlers."""
        if isinstance(n, int):
            self.unconfirmed = [(i, r) for i, r in self.unconfirmed if i > n]

    def write_unconfirmed(self) -> None:
        """The owner will not take them: write them to ``fallback`` (stderr)."""
        pending, self.unconfirmed = self.unconfirmed, []
        if self.fallback is not None:
            for _, record in pending:
                if record.levelno >= self.fallback.level:
                    self.fallback.handle(record)
            self.fallback.flush()


# How long the sidecar waits for the owner to hand its lines to the handlers it could not
# write through, before it stops the owner (whose GIL may be held: then nobody answers).
_OWNER_LOGGED_WAIT_S = 0.5
# How long the sidecar waits for the owner to publish a failure through the owner's link
# (its own is still coming up) before it stops the owner (whose GIL may be held).
_OWNER_PUBLISH_WAIT_S = 0.5
# A rank that exits with a code is often a consequence of another rank's failure (its
# collective saw the peer vanish): its witness waits this long for that notice first.
_EXIT_CODE_NOTICE_DELAY_S = 2.0
# How long the sidecar waits, before it exits, for its notice to reach the job's store (a
# witness imports torch for it only once the owner has died).
_NOTICE_FLUSH_S = 30.0


class _LinkProcess:
    """The sidecar's own link to the job's store, in a process of its own. The link imports
    torch, and importing torch holds the importing process's GIL for up to a second at a
    time on a loaded machine: in the sidecar itself that stalled the loop that sees deaths
    and reads notices, in the first seconds after ``arm()``. Lines: ``publish`` (sidecar ->
    link); ``ready`` (the link is up, or failed for good) and ``notice`` (link -> sidecar).
    At end-of-file the link process finishes its publishes (bounded) and exits."""

    def __init__(self, job: _jobnotice.JobScope) -> None:
        ours, theirs = socket.socketpair()
        try:
            self.proc = subprocess.Popen(
                [
                    sys.executable, "-I", "-c", _SIDECAR_MAIN, _PKG_DIR, _attrs_dir(), "link",
                    str(theirs.fileno()), json.dumps(job.to_dict()),
                ],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
            )  # fmt: skip
        finally:
            theirs.close()
        self.sock = ours
        self.buf = b""
        self.ready = False

    def fileno(self) -> int:
        return self.sock.fileno()

    def read(self) -> list[dict[str, Any]] | None:
        """The lines the link process sent (call when readable); None at end-of-file."""
        try:
            chunk = self.sock.recv(65536)
        except OSError:
            chunk = b""
        if not chunk:
            return None
        self.buf += chunk
        *lines, self.buf = self.buf.split(b"\n")
        out = []
        for line in lines:
            with contextlib.suppress(ValueError):
                msg = json.loads(line)
                if isinstance(msg, dict):
                    out.append(msg)
        return out

    def publish(self, failure: _jobnotice.JobFailure) -> None:
        with contextlib.suppress(OSError):
            self.sock.sendall(_line(op="publish", notice=failure.to_bytes().decode()))

    def finish(self, timeout: float) -> None:
        """No more requests: let it finish its publishes (bounded), then reap it."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_WR)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.sock.close()


def _link_main(argv: list[str]) -> int:
    """The link process: this process's link to the job's store, serving its sidecar."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        # A group stop is the owner's; this process ends when its sidecar does.
        signal.signal(sig, signal.SIG_IGN)
    sock = socket.socket(fileno=int(argv[0]))
    scope = _jobnotice.JobScope.from_dict(json.loads(argv[1]))
    lock = threading.Lock()

    def send(**msg: Any) -> None:
        with lock, contextlib.suppress(OSError):
            sock.sendall(_line(**msg))

    link = _jobnotice.start(scope)
    if link is None:
        return 0
    _runtime.subscribe(
        _runtime.JOB_FAILURE, lambda f: send(op="notice", notice=f.to_bytes().decode())
    )

    def tell_ready() -> None:
        link._ready.wait()
        send(op="ready")

    threading.Thread(target=tell_ready, name="healthkit link ready", daemon=True).start()
    buf = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except OSError:
            chunk = b""
        if not chunk:
            break
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            try:
                msg = json.loads(line)
                failure = _jobnotice.JobFailure.from_bytes(str(msg["notice"]).encode())
            except (ValueError, KeyError, TypeError):
                continue
            _jobnotice.publish(failure)
    _jobnotice.flush(_NOTICE_FLUSH_S)
    _jobnotice.close()
    return 0


class _Sidecar:
    def __init__(self, sock: socket.socket, peek_fd: int | None) -> None:
        self.sock = sock
        self.peek = socket.socket(fileno=peek_fd) if peek_fd is not None else None
        self.buf = b""
        self.done = False  # disarmed, end-of-file or owner gone
        self.owner_status: dict[int, ExitStatus] = {}
        self.records: dict[int, Watched] = {}  # id(record) -> record
        self.by_watch: dict[int, Watched] = {}  # id(watch) -> record
        self.seen: list[Watched] = []  # deaths seen, not yet judged
        self.stop_history: list[Signal] = []  # the owner's stop signals, as it reported them
        self.survived: list[float] = []  # when the owner said it carries on after a stop
        self.unread_since: float | None = None  # first peek of a stop byte the owner left unread
        self.pending_since: dict[signal.Signals, float] = {}  # first seen pending for the owner
        self.handling_since: dict[signal.Signals, float] = {}  # first seen being handled
        self.stopped: set[tuple[int, int | None]] = set()  # healthkit.stop() targets
        self.config: dict[str, Any] = {}
        self.waits = WatchSet()
        self.diagnoser: ExitDiagnoser | None = None
        self.owner: ProcessWatch | None = None
        self.judge: Judge | None = None
        self.handlers: _stopsignals.HandlerWatch | None = None
        self.fired = False
        self.owner_logged = False  # the owner answered a flush of the relayed lines
        self.owner_publishing = False  # the owner was asked to publish a failure for us
        self.owner_published = False  # ...and answered
        self.owner_published_ok = False  # ...that the notice is in the store
        self.unpublished: _jobnotice.JobFailure | None = None  # left to the owner so far
        self.disarmed = False  # the owner said so: its end after that is not ours to tell
        self.owner_exiting = False  # its interpreter is shutting down (a witness stays)
        self.job: _jobnotice.JobScope | None = None
        self.notice: _jobnotice.JobFailure | None = None  # another rank's, to act on
        self.linkproc: _LinkProcess | None = None  # sidecar mode under a launcher's job
        self.owner_stat: ProcStat | None = None
        self.relay: _RelayHandler | None = None
        self.trackers: list[Tracker] = []

    # ---- messages
    def read_messages(self) -> list[dict[str, Any]] | None:
        chunk = self.sock.recv(65536)
        if not chunk:
            return None
        self.buf += chunk
        *lines, self.buf = self.buf.split(b"\n")
        return [json.loads(line) for line in lines if line]

    def read_pending_messages(self) -> None:
        """Take every message already sent, without waiting (before a judgement: a stop or
        a healthkit.stop() announced just before the death is then known)."""
        self.sock.setblocking(False)
        try:
            while not self.done:
                try:
                    msgs = self.read_messages()
                except (BlockingIOError, InterruptedError):
                    return
                if msgs is None:
                    self.done = True
                    return
                for msg in msgs:
                    self.on_message(msg)
        finally:
            self.sock.setblocking(True)

    def pump(self, until: Callable[[], bool], timeout: float) -> None:
        """Handle control messages until ``until()`` or timeout; deaths seen meanwhile wait
        in :attr:`seen`."""
        deadline = time.monotonic() + timeout
        while not until() and not self.done:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self.note_deaths(self.waits.wait(remaining))

    def note_deaths(self, ended: list[ProcessWatch]) -> None:
        for watch in ended:
            self.waits.remove(watch)  # level-triggered: seen once is enough
            if watch is self.owner:
                self.done = True  # the owner is gone: nothing left to protect
            else:
                self.seen.append(self.by_watch[id(watch)])

    def on_control(self) -> None:
        msgs = self.read_messages()
        if msgs is None:
            self.done = True  # the owner closed the link
        for msg in msgs or ():
            self.on_message(msg)
            if self.done:
                break
        self.waits.wake()  # a pump waits for what a message says

    def on_message(self, msg: dict[str, Any]) -> None:
        op = msg["op"]
        if op == "disarm":
            self.done = True
            self.disarmed = True
        elif op == "logged":
            self.owner_logged = True
            if self.relay is not None:
                self.relay.confirmed(msg.get("n"))
        elif op == "published":
            self.owner_published = True
            self.owner_published_ok = bool(msg.get("ok"))
        elif op == "notice":  # another rank's, heard first by the owner's link
            try:
                failure = _jobnotice.JobFailure.from_bytes(str(msg["notice"]).encode())
            except (KeyError, ValueError):
                logger.warning("a malformed notice from the owner was ignored")
            else:
                self.follow(failure)
        elif op == "exiting":
            self.owner_exiting = True  # its exit code is still ours to tell
        elif op == "stop":
            self.stop_history.append((signal.Signals(msg["signal"]), float(msg["at"]), "delivered"))
        elif op == "survived":
            at = float(msg["at"])
            self.survived.append(at)
            if self.judge is not None:  # what that stop deferred is decided again now
                self.judge.resume(list(self.records.values()), at)
            for tracker in self.trackers:
                if tracker.due is not None:
                    tracker.due = min(tracker.due, at)
        elif op == "stopped":
            self.stopped.add((msg["pid"], msg["start_time"]))
        elif op == "status":
            self.owner_status[msg["pid"]] = ExitStatus(msg["returncode"], msg["source"])
        elif op == "expect":
            pass  # on_control wakes the loop, which looks at the untimed pages
        elif op == "progress":
            self.open_progress(msg)
            self.sock.sendall(_line(op="watching"))
        elif op == "watch":
            record = self.open(msg)
            self.sock.sendall(_line(op="watching"))
            if record.watch is None:
                self.seen.append(record)

    def open(self, msg: dict[str, Any]) -> Watched:
        record = Watched(
            pid=msg["pid"],
            name=msg["name"],
            on_clean_exit=check_on_clean_exit(msg["on_clean_exit"]),
            pgrp=msg.get("pgrp"),
            start_time=msg.get("start_time"),
        )
        self.records[id(record)] = record
        if msg["ended"]:
            record.status = ExitStatus(msg["returncode"], "owner")
            return record
        try:
            watch = ProcessWatch(record.pid, name=record.name)
        except NoSuchProcessError:
            return record  # gone already: the owner will say how
        stat = read_proc_stat(record.pid)
        if record.start_time is not None and (stat is None or stat.start_time != record.start_time):
            watch.close()  # the pid now names another process: ours died already
            return record
        record.watch = watch
        self.by_watch[id(watch)] = record
        self.waits.add(watch)
        return record

    def open_progress(self, msg: dict[str, Any]) -> None:
        assert self.owner is not None
        path = f"/proc/{self.owner.pid}/fd/{int(msg['fd'])}"
        try:
            bell = msg.get("bell")
            tracker = Tracker.open(
                path,
                float(msg["stall_timeout"]),
                str(msg["name"]),
                str(msg["who"]),
                bell=None if bell is None else f"/proc/{self.owner.pid}/fd/{int(bell)}",
            )
        except (OSError, ValueError) as e:
            logger.error(
                "%s: cannot map the progress page of %s (%s: %s): its stalls are not watched",
                self.config.get("name"), msg.get("name"), path, e,
            )
            return
        self.trackers.append(tracker)
        if tracker.bell is not None:

            def rung() -> None:  # a call began while no timer was set: look
                tracker.drain()
                self.waits.wake()

            self.waits.add_fd(tracker.bell, rung)

    def look_progress(self) -> None:
        """Look at each progress page that is due or not timed yet."""
        now = time.monotonic()
        for tracker in self.trackers:
            if self.done:
                return
            if tracker.due is not None and tracker.due > now:
                continue
            decision, quiet = tracker.look(
                now,
                armed=not self.done,
                stop=self.episode,
                stop_grace=float(self.config["stop_grace"]),
            )
            if decision.verdict is Verdict.FIRE and quiet is not None and not self.fired:
                tracker.fired = True
                stalled = stall_diagnosis(tracker, quiet)
                self.tell_job(stalled)
                self.act(stalled)
            elif decision.verdict is Verdict.DEFER:
                logger.warning("%s stalled; %s", tracker.name, decision.reason)

    # ---- what the sidecar knows of its owner
    def episode(self, now: float) -> StopEpisode | None:
        """The owner's stop episode at ``now``: a stop signal still pending for it, one whose
        handler is running in it, a stop byte it has not read yet (its GIL may be held), and
        what it reported. Looked at in the order a signal lives (queued, taken, delivered,
        read and reported before its byte is consumed), so a signal that moves on between two
        looks is caught by the next."""
        assert self.owner is not None
        history: list[Signal] = []
        pending = _stopsignals.pending_stop(self.owner.pid)
        handled = None
        if pending is None and self.handlers is not None:
            handled = self.handlers.handling()
        # Dated from when each was first seen: a signal left pending (blocked), or a mask
        # that stays, is one stop with one start, not a new stop at every look.
        for since, seen_now in ((self.pending_since, pending), (self.handling_since, handled)):
            for gone in [s for s in since if s != seen_now]:
                del since[gone]
        if pending is not None:
            history.append((pending, self.pending_since.setdefault(pending, now), "pending"))
        if self.peek is not None:
            try:
                unread = self.peek.recv(4096, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                unread = b""
            except OSError:
                unread = b""
            stops = [b for b in unread if b in STOP_SIGNALS]
            if stops:
                if self.unread_since is None:
                    self.unread_since = now
                history.append((signal.Signals(stops[0]), self.unread_since, "delivered"))
            else:
                self.unread_since = None
        self.read_pending_messages()
        history.extend(self.stop_history)
        # Taken off the sidecar's own pending set when it returned from the wait that saw the
        # death; its handler has run since (at the first bytecode boundary).
        history.extend((sig, at, "witnessed") for sig, at in _group_stops)
        if handled is not None:
            began = self.handling_since.setdefault(handled, now)
            if _stopsignals.mask_not_stop(began, now, history):
                # Blocked for good with no stop signal anywhere: a mask, not a stop.
                del self.handling_since[handled]
                if self.handlers is not None:
                    self.handlers.accept()
            else:
                history.append((handled, began, "handling"))
        return current_episode(history, now, float(self.config["stop_grace"]), self.survived)

    def owner_gone(self) -> bool:
        """Whether the owner is dead or dying: its pidfd is readable only once all its
        threads are gone, but a helper that dies *with* it (a parent-death signal, or the
        SIGKILL torchrun sends to the whole group) can be seen before that."""
        assert self.owner is not None
        if self.owner.poll() is not None:
            return True
        stat = read_proc_stat(self.owner.pid)
        if stat is None or stat.state in ("Z", "X"):
            return True
        pending = read_pending_signals(self.owner.pid)
        return pending is not None and signal.SIGKILL in pending

    # ---- judging
    def status_of(self, record: Watched) -> ExitStatus:
        status = record.status
        if record.watch is not None:
            status = record.watch.poll()
            self.waits.remove(record.watch)
        if status is None or (status.returncode is None and status.source != UNKNOWN_NOT_PERMITTED):
            # The owner reaped it before we could read the zombie: its watcher thread
            # tells us what it learned (unless its GIL is held, and then it cannot reap).
            pid = record.pid
            self.pump(lambda: pid in self.owner_status, _OWNER_STATUS_WAIT_S)
            told = self.owner_status.get(pid)
            if told is not None and (
                told.returncode is not None or status is None or told.source != "unknown"
            ):
                status = told  # the owner knows better (the code, or why it is unknown)
            elif status is None:
                status = ExitStatus(None, "unknown: gone before the sidecar could read it")
        return status

    def on_death(self, record: Watched) -> None:
        status = self.status_of(record)
        if self.done:
            return
        self.read_pending_messages()  # a healthkit.stop() announced before it signalled
        assert self.judge is not None
        self.judge.judge(record, status, owner_gone=self.owner_gone())
        if self.owner_gone():
            self.done = True

    def describe(self, record: Watched, status: ExitStatus) -> Diagnosis:
        assert self.diagnoser is not None
        subject: ProcessWatch | ExitStatus = (
            record.watch if record.watch is not None and record.watch.status is status else status
        )
        # The start time names the process for good: its exception record and its kernel-log
        # OOM record are found even when the owner reaped it before the sidecar read it.
        diagnosis = self.diagnoser.diagnose(
            subject, name=record.name, pid=record.pid, start_time=record.start_time
        )
        return early_exit_wording(diagnosis, record, self.diagnoser)

    def fire(self, record: Watched, status: ExitStatus, excused: Decision | None) -> None:
        if self.fired:
            return
        diagnosis = self.describe(record, status)
        if excused is not None:
            diagnosis = survived_stop_wording(diagnosis, excused)
        self.tell_job(diagnosis)
        self.act(diagnosis)

    def tell_job(self, diagnosis: Diagnosis) -> None:
        """Publish the owner's failure to the job (a no-op outside a launcher's job)."""
        if self.job is None:
            return
        failure = _jobnotice.JobFailure.of(
            diagnosis, self.job, origin_pid=int(self.config["owner_pid"]))
        if self.linkproc is not None and not self.linkproc.ready:
            # This link is still coming up (torch is being imported: seconds on a loaded
            # machine). The owner's is up: it publishes first, and act() waits (bounded) for
            # its answer before stopping it; this one publishes only if the owner could not.
            with contextlib.suppress(OSError):
                self.sock.sendall(_line(op="publish", notice=failure.to_bytes().decode()))
                self.owner_publishing = True
                self.unpublished = failure
                return
        self.publish(failure)

    def publish(self, failure: _jobnotice.JobFailure) -> None:
        if self.linkproc is not None:
            self.linkproc.publish(failure)
        else:
            _jobnotice.publish(failure)

    def on_link(self) -> None:
        """Lines from the link process: it is up, or another rank's notice."""
        assert self.linkproc is not None
        msgs = self.linkproc.read()
        if msgs is None:
            self.waits.remove_fd(self.linkproc.fileno())
            return
        for msg in msgs:
            if msg.get("op") == "ready":
                self.linkproc.ready = True
            elif msg.get("op") == "notice":
                try:
                    failure = _jobnotice.JobFailure.from_bytes(str(msg["notice"]).encode())
                except (KeyError, ValueError):
                    continue
                self.follow(failure)

    def act(self, diagnosis: Diagnosis) -> None:
        """Log, write the error file, then stop the owner and its helpers."""
        self.fired = True
        config = self.config
        event = FailureEvent(diagnosis, config["name"] + " (sidecar)", config["owner_pid"])
        for action in (log_diagnosis(), write_torchelastic_error_file()):
            try:
                action(event)
            except Exception:
                logger.exception("action %r failed", action)
        emit(
            logger,
            logging.ERROR,
            f"stopping the owner (pid {config['owner_pid']}) so the launcher tears the job down",
        )
        flush_logging(logger)
        if self.relay is not None:
            # The owner writes these lines to its other handlers if it still can.
            self.owner_logged = False
            with contextlib.suppress(OSError):
                self.sock.sendall(_line(op="flush", n=self.relay.sent))
            self.pump(lambda: self.owner_logged and not self.relay_pending(),
                      _OWNER_LOGGED_WAIT_S)
            self.relay.write_unconfirmed()
        if self.owner_publishing:
            self.pump(lambda: self.owner_published, _OWNER_PUBLISH_WAIT_S)
        if self.unpublished is not None and not self.owner_published_ok:
            # The owner could not (its GIL held, its link down): this link publishes once
            # up (this process waits for it before it ends).
            self.publish(self.unpublished)
        self.unpublished = None
        assert self.owner is not None
        # The owner's whole helper tree (DataLoader workers, its own helpers' children),
        # listed while the owner lives: once it dies they are reparented out of reach.
        tree = watch_tree(self.owner.pid, exclude=self.ours())
        # SIGTERM, then SIGKILL after the grace: a Python SIGTERM handler cannot run while
        # the owner's GIL is held. The owner and its helpers at once, on one deadline: one
        # after the other, the helpers outlived the owner by its whole exit.
        grace = float(config["kill_after"])
        stop([self.owner, *tree], kill_after=grace, name="the owner and its helpers")
        for watch in tree:
            watch.close()
        # The owner had no chance to stop its helpers (its atexit hooks did not run):
        # stop the other processes it asked us to watch, as its normal exit would have.
        for other in self.records.values():
            if other.watch is not None:
                other.watch.terminate()
        self.done = True

    # ---- the job-wide notice
    def follow(self, failure: _jobnotice.JobFailure) -> None:
        """Another rank failed first (told by the link process or by the owner): tell it in
        the owner's log and error file, then stop the owner as for a failure of our own."""
        if failure.origin_pid == self.config["owner_pid"]:
            return
        self.notice = failure
        self.waits.wake()  # the main loop acts: one thread judges and acts

    def witness_owner_end(self) -> None:
        """The owner itself ended while armed: if that was a failure (a kill that no stop
        explains, a crash, an exit code with no error file written), write the rank's
        torchelastic error file with its diagnosis, then tell the job. A stop (SIGTERM,
        SIGINT, SIGHUP, or any end while a stop signal is under way) is never told."""
        assert self.owner is not None and self.diagnoser is not None
        status = self.owner.wait(10.0 if self.owner_exiting else 1.0)
        if status is None or status.returncode is None or status.returncode == 0:
            return  # still running, or an end we cannot read: nothing to say
        self.read_pending_messages()
        if self.disarmed:
            return
        now = time.monotonic()
        code = status.returncode
        if code < 0:
            sig = signal.Signals(-code)
            if sig in STOP_SIGNALS:
                return
            if sig is signal.SIGKILL and self.episode(now) is not None:
                return  # the launcher's SIGKILL after its stop's grace
        else:
            if self.episode(now) is not None:
                return
            path = self.config.get("error_file")
            if path and os.path.exists(path):
                return  # the rank wrote its own story (@record, a watchdog, a notice)
        name = self.rank_name()
        diagnosis = self.diagnoser.diagnose(
            self.owner, name=name, pid=self.owner.pid,
            start_time=(self.owner_stat.start_time if self.owner_stat else None),
        )
        if code > 0:  # a rank, not a helper: its traceback is in its log, and @record
            diagnosis = attrs.evolve(diagnosis, hint=(
                "Its traceback, if it raised, is in its log (stderr); decorate the rank's "
                "entry point with torch.distributed.elastic.multiprocessing.errors.record to "
                "have torchrun show it here"))
        event = FailureEvent(diagnosis, self.config["name"] + " (witness)", self.owner.pid)
        write_torchelastic_error_file(self.config.get("error_file"))(event)
        log_diagnosis()(event)
        flush_logging(logger)
        self.stop_orphans()
        if self.job is None:
            return
        if code > 0:
            # An exit code is often the consequence of another rank's failure (a collective
            # that saw the peer vanish): let the cause's notice arrive first.
            _jobnotice.start(self.job)
            time.sleep(_EXIT_CODE_NOTICE_DELAY_S)
        else:
            _jobnotice.start(self.job)
        _jobnotice.publish(_jobnotice.JobFailure.of(diagnosis, self.job,
                                                    origin_pid=self.owner.pid))

    def stop_orphans(self) -> None:
        """Stop what the dead owner left in its own process group (its helpers, now
        reparented): a launcher signals the group of a rank it stops, but not of a rank that
        died by itself, so a daemon helper of an OOM-killed rank would outlive the job.
        Only when the owner led its group (torchrun starts each rank in a session of its
        own): a group it merely joined may hold processes that are not its."""
        assert self.owner is not None
        stat = self.owner_stat
        if stat is None or stat.pgrp != self.owner.pid:
            return
        watches: list[ProcessWatch] = []
        for pid in group_members(stat.pgrp):
            if pid in self.ours():
                continue
            listed = read_proc_stat(pid)
            try:
                watch = ProcessWatch(pid, name=f"pid {pid}")
            except NoSuchProcessError:
                continue
            again = read_proc_stat(pid)
            if listed is None or again is None or again.start_time != listed.start_time:
                watch.close()  # the pid was reused between the listing and the pidfd
                continue
            watches.append(watch)
        if watches:
            stop(watches, kill_after=float(self.config["kill_after"]),
                 name="the dead rank's helpers")
            for watch in watches:
                watch.close()

    def ours(self) -> list[int]:
        """This process and its link process: in the owner's tree and group, never stopped
        with it (they end by themselves once the owner is gone)."""
        return [os.getpid()] + ([self.linkproc.proc.pid] if self.linkproc is not None else [])

    def rank_name(self) -> str:
        job = self.job
        if job is not None and job.rank is not None:
            return f"rank {job.rank}"
        return "the owner"
    def relay_pending(self) -> bool:
        return self.relay is not None and bool(self.relay.unconfirmed)

    # ---- main loop
    def run(self) -> int:
        try:
            return self._run()
        finally:
            if self.relay is not None:
                self.relay.write_unconfirmed()  # the owner is gone or let us go

    def _run(self) -> int:
        while not self.config:
            msgs = self.read_messages()
            if msgs is None:
                return 0
            self.config = msgs[0]
        fallback = apply_logging_plan(self.config.get("logging"))
        if (self.config.get("logging") or {}).get("relay"):
            self.relay = _RelayHandler(self.sock, fallback)
            logging.getLogger("healthkit").addHandler(self.relay)
        try:
            self.owner = ProcessWatch(self.config["owner_pid"], name="owner")
        except NoSuchProcessError:
            return 0
        self.owner_stat = read_proc_stat(self.owner.pid)
        self.handlers = _stopsignals.HandlerWatch(self.owner.pid)
        self.handlers.learn()  # the owner waits in arm() for "ready": no handler is running
        # The owner's diagnoser, built again here: its cgroup, kernel log, record
        # directory and the OOM counter's baseline ("during this run" is the owner's run).
        settings = self.config.get("diagnoser")
        self.diagnoser = (
            ExitDiagnoser._from_settings(settings) if settings else ExitDiagnoser()
        )
        interval: float | None = self.config.get("rss_sample_interval")
        self.judge = Judge(
            name=self.config["name"] + " (sidecar)",
            log=logger,
            stop_grace=float(self.config["stop_grace"]),
            owner_pgrp=int(self.config["owner_pgrp"]),
            episode=self.episode,
            stopped_by_healthkit=lambda r: (r.pid, r.start_time) in self.stopped,
            describe=self.describe,
            fire=self.fire,
            armed=lambda: not self.done,
            second_look=float(self.config.get("second_look", _judge.SECOND_LOOK_S)),
            may_be_taking_stop=lambda: self.handlers is None or self.handlers.running(),
        )
        self.waits.add_fd(self.sock.fileno(), self.on_control)
        self.waits.add(self.owner)
        job = self.config.get("job")
        if job is not None:
            self.job = _jobnotice.JobScope.from_dict(job)
            if not self.config.get("witness"):
                # Sidecar mode: this process publishes the owner's failures and acts on the
                # other ranks' (the owner's GIL may be held). A witness starts its link only
                # if the owner dies (torch is imported then, not for every healthy rank).
                self.linkproc = _LinkProcess(self.job)
                self.waits.add_fd(self.linkproc.fileno(), self.on_link)
        self.sock.sendall(_line(op="ready"))
        next_sample = time.monotonic() + interval if interval else None
        with self.waits:
            while True:
                while self.seen and not self.done:
                    self.on_death(self.seen.pop(0))
                if self.notice is not None and not self.done and not self.fired:
                    self.act(self.notice.diagnosis())
                if self.done:
                    # The owner's own end is told under a launcher's job only (its error
                    # file, the other ranks); elsewhere whoever started it sees it.
                    if not self.disarmed and not self.fired and self.job is not None:
                        self.witness_owner_end()
                    _jobnotice.flush(_NOTICE_FLUSH_S)  # this process outlives the owner
                    if self.linkproc is not None:
                        self.linkproc.finish(_NOTICE_FLUSH_S + 5.0)
                    return 0
                due = Judge.next_due(list(self.records.values()))
                dues = [t.due for t in self.trackers if t.due is not None]
                dues += [t for t in (due, next_sample) if t is not None]
                timeout = max(0.0, min(dues) - time.monotonic()) if dues else None
                self.note_deaths(self.waits.wait(timeout))
                if next_sample is not None and time.monotonic() >= next_sample:
                    # Peak RSS while alive, as the owner's thread samples it: the line of
                    # a helper that died of memory then says how much it held.
                    for record in self.records.values():
                        if record.watch is not None and record.watch.status is None:
                            record.watch.sample_rss()
                    next_sample = time.monotonic() + (interval or 0.0)
                if self.trackers and not self.seen and not self.done:
                    self.look_progress()
                    if self.done:
                        continue  # it fired: the top of the loop ends it
                if due is not None and time.monotonic() >= due and not self.done:
                    self.read_pending_messages()
                    self.judge.expire(list(self.records.values()), owner_gone=self.owner_gone())
                    if self.owner_gone():
                        self.done = True


#: The stop signals this sidecar received, with when (``CLOCK_MONOTONIC``): it is in the
#: owner's process group, so a group stop reaches it as it reaches the owner.
_group_stops: list[tuple[signal.Signals, float]] = []


def _witness(signum: int, frame: object) -> None:
    _group_stops.append((signal.Signals(signum), time.monotonic()))


def main(argv: list[str]) -> int:
    if argv and argv[0] == "link":
        return _link_main(argv[1:])
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        # Group stops are for the owner to handle; the sidecar keeps watching, and keeps the
        # time as the owner's stop evidence that nothing in the owner can take away.
        signal.signal(sig, _witness)
    # Inherited from the thread that started it (an owner that sigwait()s blocks them).
    signal.pthread_sigmask(signal.SIG_UNBLOCK, list(STOP_SIGNALS))
    # Until the owner's configuration arrives (apply_logging_plan), its own line on stderr.
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format=_SIDECAR_FORMAT)
    sock = socket.socket(fileno=int(argv[0]))
    peek_fd = int(argv[1])
    return _Sidecar(sock, peek_fd if peek_fd >= 0 else None).run()
