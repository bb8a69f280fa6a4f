"""The sidecar's own link to the job's store, in a process of its own (see
:class:`_LinkProcess`)."""

from __future__ import annotations

import contextlib
import json
import logging
import logging.handlers
import signal
import socket
import subprocess
import threading

from healthkit import _jobnotice, _runtime
from healthkit._watch.stopsignals import popen_with_stop_signals_blocked
from healthkit._watchdog.protocol import (
    NOTICE_FLUSH_S,
    LineReader,
    Message,
    Notice,
    ProtocolError,
    Publish,
    Ready,
    encode,
    link_command,
)

__all__ = ["LinkProcess", "link_main"]


logger = logging.getLogger("healthkit")


class LinkProcess:
    """The sidecar's own link to the job's store, in a process of its own. The link imports
    torch, and importing torch holds the importing process's GIL for up to a second at a
    time on a loaded machine: in the sidecar itself that stalled the loop that sees deaths
    and reads notices, in the first seconds after ``arm()``. Lines: ``publish`` (sidecar ->
    link); ``ready`` (the link is up, or failed for good) and ``notice`` (link -> sidecar).
    At end-of-file the link process finishes its publishes (bounded) and exits."""

    def __init__(self, job: _jobnotice.JobScope) -> None:
        ours, theirs = socket.socketpair()
        try:
            self.proc = popen_with_stop_signals_blocked(
                link_command(theirs.fileno(), job.to_dict()),
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
            )  # fmt: skip
        finally:
            theirs.close()
        self.sock = ours
        self.reader = LineReader()
        self.ready = False

    def fileno(self) -> int:
        return self.sock.fileno()

    def read(self) -> list[Message] | None:
        """The messages the link process sent (call when readable); None at end-of-file."""
        try:
            chunk = self.sock.recv(65536)
        except OSError:
            chunk = b""
        if not chunk:
            return None
        return [m for m in self.reader.feed(chunk) if not isinstance(m, ProtocolError)]

    def publish(self, failure: _jobnotice.JobFailure) -> None:
        with contextlib.suppress(OSError):
            self.sock.sendall(encode(Publish(notice=failure.to_bytes().decode())))

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


def link_main(argv: list[str]) -> int:
    """The link process: this process's link to the job's store, serving its sidecar."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        # A group stop is the owner's; this process ends when its sidecar does.
        signal.signal(sig, signal.SIG_IGN)
    # Blocked since its start (popen_with_stop_signals_blocked); ignored from now on.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
    sock = socket.socket(fileno=int(argv[0]))
    scope = _jobnotice.JobScope.from_dict(json.loads(argv[1]))
    lock = threading.Lock()

    def send(msg: Message) -> None:
        with lock, contextlib.suppress(OSError):
            sock.sendall(encode(msg))

    link = _jobnotice.start(scope)
    if link is None:
        return 0
    _runtime.subscribe(_runtime.JOB_FAILURE, lambda f: send(Notice(notice=f.to_bytes().decode())))

    def tell_ready() -> None:
        link._ready.wait()
        send(Ready())

    threading.Thread(target=tell_ready, name="healthkit link ready", daemon=True).start()
    reader = LineReader()
    while True:
        try:
            chunk = sock.recv(65536)
        except OSError:
            chunk = b""
        if not chunk:
            break
        for msg in reader.feed(chunk):
            if not isinstance(msg, Publish):
                continue
            try:
                failure = _jobnotice.JobFailure.from_bytes(msg.notice.encode())
            except (ValueError, KeyError, TypeError):
                continue
            _jobnotice.publish(failure)
    _jobnotice.flush(NOTICE_FLUSH_S)
    _jobnotice.close()
    return 0
