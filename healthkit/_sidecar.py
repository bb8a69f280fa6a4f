"""The sidecar watcher: a small separate process that does not need the owner's GIL.

Why: a graph-learn client call against a dead server retries for minutes inside native code
*holding the GIL*; no Python thread of that process can run, so a thread watchdog cannot
fire. The sidecar watches the same pids through pidfds (it is not their parent, so it reads
the exit status from the zombie's ``/proc/<pid>/stat`` while the stuck owner has not reaped
it), logs the diagnosis to the shared stderr, writes the torchelastic error file and then
kills the owner (SIGTERM, SIGKILL after a grace period) so the launcher tears the job down.

It decides with the same rule as the watcher thread (:func:`healthkit._decide.decide`) and
acts only on what it knows:

* a status it cannot read (the owner reaped the helper first, which is routine when the
  owner ``join()``s) is taken from the owner, whose watcher thread reports every status it
  learns; only when none comes is it "unknown", which fires for a process declared to run
  until disarmed and never for one allowed to finish;
* a stop-like death of a helper in the owner's process group waits up to ``stop_grace`` for
  the owner's stop signal, read from the owner's signal wakeup pipe (the sidecar holds a copy
  of its read end, so it learns of the stop even while the owner's main thread holds the GIL).

Isolation: the sidecar runs as ``python -I``: neither the working directory, ``PYTHONPATH``
nor the user site can put code into it (it runs as the owner's user, often root). healthkit
itself is imported from the exact directory the owner imported it from, and attrs from the
owner's copy if the isolated path lacks it.

Signals: the sidecar ignores SIGINT, SIGTERM and SIGHUP. It is in the owner's process group,
so a Ctrl-C or torchrun's group SIGTERM reaches it too, and it must keep watching while the
owner cleans up. It exits on ``disarm``, on end-of-file and when the owner's pidfd says the
owner died (end-of-file alone is not enough: forked children of the owner inherit its end of
the socket).

Protocol: JSON lines over a socketpair. Owner -> sidecar: ``config``, ``watch``, ``status``,
``stopping``, ``disarm``. Sidecar -> owner: ``ready``/``watching`` acknowledgements.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from healthkit import _stopsignals
from healthkit._actions import (
    FailureEvent,
    log_diagnosis,
    write_torchelastic_error_file,
)
from healthkit._decide import Verdict, check_on_clean_exit, decide, stop_like
from healthkit._diagnosis import ExitDiagnoser, returned_early
from healthkit._errors import HealthkitError, NoSuchProcessError
from healthkit._proc import read_proc_stat
from healthkit._stop import stop, watch_tree
from healthkit._watch import UNKNOWN_NOT_PERMITTED, ExitStatus, ProcessWatch, WatchSet

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


class SidecarLink:
    """The owner's end: starts the sidecar and tells it what to watch and what it learns."""

    def __init__(
        self,
        *,
        name: str,
        kill_grace: float,
        stop_grace: float,
        stop_fd: int | None,
    ) -> None:
        ours, theirs = socket.socketpair()
        stop_copy = os.dup(stop_fd) if stop_fd is not None else None
        pass_fds = [theirs.fileno()] + ([stop_copy] if stop_copy is not None else [])
        try:
            self._proc = subprocess.Popen(
                [
                    sys.executable, "-I", "-c", _SIDECAR_MAIN, _PKG_DIR, _attrs_dir(),
                    str(theirs.fileno()), str(stop_copy if stop_copy is not None else -1),
                ],
                pass_fds=pass_fds,
                stdin=subprocess.DEVNULL,
            )  # fmt: skip
        finally:
            theirs.close()
            if stop_copy is not None:
                os.close(stop_copy)
        self._sock = ours
        self._sock.settimeout(_START_TIMEOUT_S)
        self._buf = b""
        self._lock = threading.Lock()
        self._closed = False
        me = read_proc_stat(os.getpid())
        self._send(
            op="config",
            owner_pid=os.getpid(),
            owner_start_time=me.start_time if me else None,
            owner_pgrp=os.getpgrp(),
            name=name,
            kill_grace=kill_grace,
            stop_grace=stop_grace,
        )
        self._expect("ready")
        _stopsignals.add_listener(self._owner_stopping)
        _stopsignals.add_source(self._poll_stopping)

    @property
    def pid(self) -> int:
        return self._proc.pid

    def process_watch(self) -> ProcessWatch:
        """A watch on the sidecar itself, so the owner notices if it dies."""
        return ProcessWatch(self._proc, name="healthkit sidecar")

    def watch(
        self,
        *,
        pid: int,
        name: str,
        on_clean_exit: str,
        pgrp: int | None,
        ended: bool,
        returncode: int | None,
    ) -> None:
        """Watch ``pid``; ``ended``/``returncode``: what the owner already knows of it."""
        stat = read_proc_stat(pid)
        with self._lock:
            self._send(
                op="watch",
                pid=pid,
                name=name,
                start_time=stat.start_time if stat else None,
                on_clean_exit=on_clean_exit,
                pgrp=pgrp,
                ended=ended,
                returncode=returncode,
            )
            self._expect("watching")

    def status(self, pid: int, status: ExitStatus | None) -> None:
        """Tell the sidecar how ``pid`` ended, as far as the owner knows."""
        with contextlib.suppress(OSError), self._lock:
            self._send(
                op="status",
                pid=pid,
                returncode=status.returncode if status else None,
                source=status.source if status else "unknown",
            )

    def _owner_stopping(self, sig: signal.Signals) -> None:
        # May run in a signal handler: one small send, no lock (a unix socket delivers a
        # small send whole), never block.
        with contextlib.suppress(OSError):
            self._sock.send(json.dumps({"op": "stopping", "signal": int(sig)}).encode() + b"\n")

    def _poll_stopping(self) -> None:
        """Read a ``stopping`` report the sidecar may have sent (it read the stop byte
        first); never blocks, and leaves the socket to a request waiting for its answer."""
        if self._closed or not self._lock.acquire(blocking=False):
            return
        timeout = self._sock.gettimeout()
        self._sock.settimeout(0.0)  # with a timeout set, recv() would wait for data first
        try:
            while True:
                try:
                    chunk = self._sock.recv(4096)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError:
                    return
                if not chunk:
                    break
                self._buf += chunk
            self._take_stopping_lines()
        finally:
            self._sock.settimeout(timeout)
            self._lock.release()

    def _take_stopping_lines(self) -> None:
        kept = []
        *lines, rest = self._buf.split(b"\n")
        for line in lines:
            if line.startswith(b"stopping "):
                _stopsignals.record(int(line.split()[1]))
            else:
                kept.append(line)
        self._buf = b"".join(line + b"\n" for line in kept) + rest

    def wait_for_action(self, timeout: float) -> None:
        """Give the sidecar time to act on a death it is seeing (it will stop us)."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout)

    def disarm(self, timeout: float | None) -> None:
        with contextlib.suppress(OSError), self._lock:
            self._send(op="disarm")
        if timeout is None:
            self._proc.wait()
        else:
            stop([self._proc], grace=timeout, term_timeout=0, name="the healthkit sidecar")
        self.close()

    def close(self) -> None:
        """Release the socket (the sidecar, if alive, exits on end-of-file) and reap it."""
        _stopsignals.remove_listener(self._owner_stopping)
        _stopsignals.remove_source(self._poll_stopping)
        if self._closed:
            return
        self._closed = True
        self._sock.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(_START_TIMEOUT_S)

    def _send(self, **msg: Any) -> None:
        self._sock.sendall(json.dumps(msg).encode() + b"\n")

    def _expect(self, word: str) -> None:
        self._take_stopping_lines()
        while b"\n" not in self._buf:
            try:
                chunk = self._sock.recv(4096)
            except (TimeoutError, OSError):
                chunk = b""
            if not chunk:
                stop([self._proc], term_timeout=0, name="the healthkit sidecar")
                self._sock.close()
                self._closed = True
                raise SidecarError(
                    f"the healthkit sidecar (pid {self._proc.pid}) did not answer {word!r}; "
                    "its stderr above says why (is healthkit importable by sys.executable?)"
                )
            self._buf += chunk
            self._take_stopping_lines()
        line, _, self._buf = self._buf.partition(b"\n")
        if line.decode() != word:
            raise SidecarError(f"sidecar protocol error: expected {word!r}, got {line!r}")


# ---------------------------------------------------------------------- sidecar process
class _Watched:
    def __init__(
        self, watch: ProcessWatch | None, msg: dict[str, Any], status: ExitStatus | None
    ) -> None:
        self.watch = watch
        self.pid: int = msg["pid"]
        self.name: str = msg["name"]
        self.on_clean_exit = check_on_clean_exit(msg["on_clean_exit"])
        self.pgrp: int | None = msg.get("pgrp")
        self.start_time: int | None = msg.get("start_time")  # names it: records, kernel log
        self.status = status  # known before watching (ended, or gone already)


class _Sidecar:
    def __init__(self, sock: socket.socket, stop_fd: int | None) -> None:
        self.sock = sock
        self.stop_fd = stop_fd
        self.buf = b""
        self.stopping = False
        self.done = False  # disarmed, end-of-file or owner gone
        self.owner_status: dict[int, ExitStatus] = {}
        self.watched: dict[int, _Watched] = {}  # id(watch) -> entry
        self.pending: list[_Watched] = []  # deaths seen, not yet decided on
        self.config: dict[str, Any] = {}
        self.waits = WatchSet()
        self.diagnoser: ExitDiagnoser | None = None
        self.owner: ProcessWatch | None = None

    # ---- messages
    def read_messages(self) -> list[dict[str, Any]] | None:
        chunk = self.sock.recv(65536)
        if not chunk:
            return None
        self.buf += chunk
        *lines, self.buf = self.buf.split(b"\n")
        return [json.loads(line) for line in lines if line]

    def pump(self, until: Callable[[], bool], timeout: float) -> None:
        """Handle control messages and stop bytes until ``until()`` or timeout; deaths seen
        meanwhile wait in :attr:`pending`."""
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
                self.pending.append(self.watched[id(watch)])

    def on_control(self) -> None:
        msgs = self.read_messages()
        if msgs is None:
            self.done = True  # the owner closed the link
        for msg in msgs or ():
            self.on_message(msg)
            if self.done:
                break
        self.waits.wake()  # a pump waits for what a message says

    def drain_stop(self) -> None:
        assert self.stop_fd is not None
        self.waits.wake()
        while True:
            try:
                data = os.read(self.stop_fd, 4096)
            except OSError:
                return
            if not data:
                self.waits.remove_fd(self.stop_fd)
                self.stop_fd = None
                return
            stops = [b for b in data if b in _stopsignals.STOP_SIGNALS]
            if stops and not self.stopping:
                self.stopping = True
                # The owner may not have read it (we took the byte): tell it.
                with contextlib.suppress(OSError):
                    self.sock.sendall(b"stopping %d\n" % stops[0])

    def on_message(self, msg: dict[str, Any]) -> None:
        op = msg["op"]
        if op == "disarm":
            self.done = True
        elif op == "stopping":
            self.stopping = True
        elif op == "status":
            self.owner_status[msg["pid"]] = ExitStatus(msg["returncode"], msg["source"])
        elif op == "watch":
            entry = self.open(msg)
            self.sock.sendall(b"watching\n")
            if entry.watch is None:
                self.pending.append(entry)

    def open(self, msg: dict[str, Any]) -> _Watched:
        if msg["ended"]:
            return _Watched(None, msg, ExitStatus(msg["returncode"], "owner"))
        pid = msg["pid"]
        try:
            watch = ProcessWatch(pid, name=msg["name"])
        except NoSuchProcessError:
            return _Watched(None, msg, None)  # gone already: the owner will say how
        stat = read_proc_stat(pid)
        start_time = msg["start_time"]
        if start_time is not None and (stat is None or stat.start_time != start_time):
            watch.close()  # the pid now names another process: ours died already
            return _Watched(None, msg, None)
        entry = _Watched(watch, msg, None)
        self.watched[id(watch)] = entry
        self.waits.add(watch)
        return entry

    # ---- deciding
    def owner_exiting(self) -> bool:
        """Whether the owner is dying or dead: its pidfd is readable only once all its
        threads are gone, but a helper that dies *with* it (a parent-death signal sent when
        the owner's forking thread exits) can be seen before that."""
        assert self.owner is not None
        if self.owner.poll() is not None:
            return True
        stat = read_proc_stat(self.owner.pid)
        return stat is None or stat.state in ("Z", "X")

    def on_death(self, entry: _Watched) -> int | None:
        if self.owner_exiting():
            self.done = True  # it died with its owner (or is the owner's own teardown)
            return 0
        status = entry.status
        if entry.watch is not None:
            status = entry.watch.poll()
            self.waits.remove(entry.watch)
            del self.watched[id(entry.watch)]
        if status is None or (
            status.returncode is None and status.source != UNKNOWN_NOT_PERMITTED
        ):
            # The owner reaped it before we could read the zombie: its watcher thread
            # tells us what it learned (unless its GIL is held, and then it cannot reap).
            pid = entry.pid
            self.pump(lambda: pid in self.owner_status, _OWNER_STATUS_WAIT_S)
            told = self.owner_status.get(pid)
            if told is not None and (told.returncode is not None or status is None
                                     or told.source != "unknown"):
                status = told  # the owner knows better (the code, or why it is unknown)
            elif status is None:
                status = ExitStatus(None, "unknown: gone before the sidecar could read it")
        if self.done:
            return 0
        verdict = self.verdict(entry, status)
        same_group = entry.pgrp is None or entry.pgrp == self.config.get("owner_pgrp")
        if verdict in (Verdict.FIRE, Verdict.WARN) and same_group and stop_like(status):
            self.pump(lambda: self.stopping, float(self.config["stop_grace"]))
            if self.done:
                return 0
            verdict = self.verdict(entry, status)
        if verdict is Verdict.FIRE:
            return self.fire(entry, status)
        if verdict is Verdict.WARN:
            assert self.diagnoser is not None
            logger.warning(
                "%s; not acting on it",
                self.diagnoser.diagnose(status, name=entry.name, pid=entry.pid),
            )
        if entry.watch is not None:
            entry.watch.close()
        return None

    def verdict(self, entry: _Watched, status: ExitStatus) -> Verdict:
        return decide(
            status,
            armed=True,
            on_clean_exit=entry.on_clean_exit,
            owner_stopping=self.stopping,
        )

    def fire(self, entry: _Watched, status: ExitStatus) -> int:
        assert self.diagnoser is not None
        config = self.config
        subject: ProcessWatch | ExitStatus = (
            entry.watch if entry.watch is not None and entry.watch.status is status else status
        )
        diagnosis = self.diagnoser.diagnose(subject, name=entry.name, pid=entry.pid,
                                            start_time=entry.start_time)
        if diagnosis.exit_code == 0 and entry.on_clean_exit != "ignore":
            diagnosis = returned_early(diagnosis)
        event = FailureEvent(diagnosis, config["name"] + " (sidecar)", config["owner_pid"])
        for action in (log_diagnosis(), write_torchelastic_error_file()):
            try:
                action(event)
            except Exception:
                logger.exception("action %r failed", action)
        logger.error(
            "stopping the owner (pid %d) so the launcher tears the job down",
            config["owner_pid"],
        )
        assert self.owner is not None
        # The owner's whole helper tree (DataLoader workers, its own helpers' children),
        # listed while the owner lives: once it dies they are reparented out of reach.
        tree = watch_tree(self.owner.pid, exclude=[os.getpid()])
        # SIGTERM, then SIGKILL after the grace: a Python SIGTERM handler cannot run while
        # the owner's GIL is held.
        grace = float(config["kill_grace"])
        stop([self.owner], term_timeout=grace, name="the owner")
        stop(tree, term_timeout=grace, name="the owner's helpers")
        for watch in tree:
            watch.close()
        # The owner had no chance to stop its helpers (its atexit hooks did not run):
        # stop the other processes it asked us to watch, as its normal exit would have.
        for other in self.watched.values():
            if other.watch is not None:
                other.watch.terminate()
        return 0

    # ---- main loop
    def run(self) -> int:
        while not self.config:
            msgs = self.read_messages()
            if msgs is None:
                return 0
            self.config = msgs[0]
        try:
            self.owner = ProcessWatch(self.config["owner_pid"], name="owner")
        except NoSuchProcessError:
            return 0
        self.diagnoser = ExitDiagnoser()
        self.waits.add_fd(self.sock.fileno(), self.on_control)
        self.waits.add(self.owner)
        if self.stop_fd is not None:
            os.set_blocking(self.stop_fd, False)
            self.waits.add_fd(self.stop_fd, self.drain_stop)
        self.sock.sendall(b"ready\n")
        with self.waits:
            while True:
                while self.pending and not self.done:
                    code = self.on_death(self.pending.pop(0))
                    if code is not None:
                        return code
                if self.done:
                    return 0
                self.note_deaths(self.waits.wait())


def main(argv: list[str]) -> int:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # group stops are for the owner to handle
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format="%(asctime)s %(levelname)s healthkit sidecar: %(message)s",
    )
    sock = socket.socket(fileno=int(argv[0]))
    stop_fd = int(argv[1])
    return _Sidecar(sock, stop_fd if stop_fd >= 0 else None).run()
