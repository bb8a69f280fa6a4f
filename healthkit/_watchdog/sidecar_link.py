"""The owner's end of the sidecar: start it, tell it what to watch and what the owner learns,
hand its relayed log lines to the owner's handlers and publish for it while its own link to the
job's store is coming up. The messages are in :mod:`healthkit._watchdog.protocol`."""

from __future__ import annotations

import contextlib
import logging
import logging.handlers
import os
import signal
import socket
import subprocess
import threading
from typing import Any

from healthkit import _jobnotice, _judge, _runtime
from healthkit._actions import (
    TORCHELASTIC_ERROR_FILE,
)
from healthkit._errors import HealthkitError
from healthkit._judge import Watched
from healthkit._progress import ProgressWatch
from healthkit._watch import stopsignals as _stopsignals
from healthkit._watch.process import ExitStatus, ProcessWatch
from healthkit._watch.stop import stop
from healthkit._watchdog.logging_transfer import drain_queue, logging_plan
from healthkit._watchdog.protocol import (
    OWNER_PUBLISH_WAIT_S,
    START_TIMEOUT_S,
    Config,
    Disarm,
    Exiting,
    Expect,
    Flush,
    LineReader,
    Log,
    Logged,
    Message,
    Notice,
    Progress,
    ProtocolError,
    Publish,
    Published,
    Ready,
    Status,
    Stop,
    Stopped,
    Survived,
    Watch,
    Watching,
    encode,
    sidecar_command,
)

__all__ = ["SidecarError", "SidecarLink"]


logger = logging.getLogger("healthkit")


class SidecarError(HealthkitError, RuntimeError):
    """The sidecar watcher could not be started or stopped talking."""


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
            self._proc = _stopsignals.popen_with_stop_signals_blocked(
                sidecar_command(theirs.fileno(), peek_copy),
                pass_fds=pass_fds,
                stdin=subprocess.DEVNULL,
            )  # fmt: skip
        finally:
            theirs.close()
            if peek_copy is not None:
                os.close(peek_copy)
        self._sock = ours
        self._sock.settimeout(START_TIMEOUT_S)
        self._reader = LineReader()
        self._inbox: list[Message | ProtocolError] = []
        self._lock = threading.Lock()
        self._closed = False
        self._send(
            Config(
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
        )
        self._expect(Ready)
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
                Watch(
                    pid=record.pid,
                    name=record.name,
                    start_time=record.start_time,
                    on_clean_exit=record.on_clean_exit,
                    pgrp=record.pgrp,
                    ended=ended is not None,
                    returncode=ended.returncode if ended is not None else None,
                )
            )
            self._expect(Watching)

    def progress(self, watch: ProgressWatch) -> None:
        """Watch a progress page too (the sidecar maps it through ``/proc``)."""
        with self._lock:
            self._send(
                Progress(
                    fd=watch.fileno(),
                    bell=watch.bell,
                    name=watch.name,
                    who=watch.who,
                    stall_timeout=watch.stall_timeout,
                )
            )
            self._expect(Watching)

    def expect(self) -> None:
        """A wait for progress began and no timer is set: tell the sidecar to look."""
        self._send_quietly(Expect())

    def status(self, pid: int, status: ExitStatus | None) -> None:
        """Tell the sidecar how ``pid`` ended, as far as the owner knows."""
        self._send_quietly(
            Status(
                pid=pid,
                returncode=status.returncode if status else None,
                source=status.source if status else "unknown",
            )
        )

    def _stop_signal(self, sig: signal.Signals, at: float) -> None:
        self._send_quietly(Stop(signal=int(sig), at=at))

    def _survived(self, at: float) -> None:
        self._send_quietly(Survived(at=at))

    def _stopping(self, pid: int, start_time: int | None) -> None:
        self._send_quietly(Stopped(pid=pid, start_time=start_time))

    def notice(self, failure: _jobnotice.JobFailure) -> None:
        """Pass another rank's notice on to the sidecar (this process heard it first)."""
        self._send_quietly(Notice(notice=failure.to_bytes().decode()))

    def _send_quietly(self, msg: Message) -> None:
        if self._closed:
            return
        with contextlib.suppress(OSError), self._lock:
            self._sock.sendall(encode(msg))

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
                self._sock.settimeout(START_TIMEOUT_S)
            if not chunk:
                return False
            pending, self._inbox = [*self._inbox, *self._reader.feed(chunk)], []
            for msg in pending:
                self._on_request(msg)  # a late reply or a bad line: nothing waits for it
            return True

    def _on_request(self, msg: Message | ProtocolError) -> bool:
        """Handle a log record, a flush or a publish request; False for anything else (a
        reply, or a bad line)."""
        if isinstance(msg, Log):
            record = logging.LogRecord(
                logger.name, msg.level, "(healthkit sidecar)", 0, msg.msg, None, None
            )
            record.created = msg.created
            for handler in self._relay_to:
                if record.levelno >= handler.level:
                    with contextlib.suppress(Exception):
                        handler.handle(record)
            return True
        if isinstance(msg, Publish):
            # The sidecar fired before its own link to the job's store was up: publish
            # through this process's (up since arm()), then answer, so that the sidecar
            # stops this process only once the notice is out. Bounded: it stops us anyway.
            # Only through a link that is up: a publish is then a few store round trips
            # (not a connect the sidecar's stop could cut between the counter and the notice).
            try:
                failure: _jobnotice.JobFailure | None = _jobnotice.JobFailure.from_bytes(
                    msg.notice.encode()
                )
            except (KeyError, ValueError):
                failure = None
            link = _jobnotice._link
            ok = False
            if (
                failure is not None
                and link is not None
                and link.ready()
                and _jobnotice.told() is None
            ):
                ok = link.publish(failure, OWNER_PUBLISH_WAIT_S)
            with contextlib.suppress(OSError):
                self._sock.sendall(encode(Published(ok=ok)))
            return True
        if isinstance(msg, Flush):
            for handler in self._relay_to:
                with contextlib.suppress(Exception):
                    handler.flush()
                    drain_queue(handler)
            with contextlib.suppress(OSError):
                self._sock.sendall(encode(Logged(n=msg.n)))
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
        self._send_quietly(Exiting())

    def disarm(self, timeout: float | None) -> None:
        self._send_quietly(Disarm())
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
            self._proc.wait(START_TIMEOUT_S)

    def _send(self, msg: Message) -> None:
        self._sock.sendall(encode(msg))

    def _expect(self, reply: type[Message]) -> None:
        """Wait for ``reply``, handling the sidecar's requests that come first."""
        while True:
            while not self._inbox:
                try:
                    chunk = self._sock.recv(4096)
                except (TimeoutError, OSError):
                    chunk = b""
                if not chunk:
                    stop([self._proc], kill_after=0, name="the healthkit sidecar")
                    self._sock.close()
                    self._closed = True
                    raise SidecarError(
                        f"the healthkit sidecar (pid {self._proc.pid}) did not answer "
                        f"{reply.op!r}; its stderr above says why (is healthkit importable "
                        "by sys.executable?)"
                    )
                self._inbox.extend(self._reader.feed(chunk))
            msg = self._inbox.pop(0)
            if self._on_request(msg):
                continue  # a log record relayed meanwhile: the reply is next
            if not isinstance(msg, reply):
                raise SidecarError(f"sidecar protocol error: expected {reply.op!r}, got {msg!r}")
            return
