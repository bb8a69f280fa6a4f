"""The sidecar watcher: a small separate process that does not need the owner's GIL.

Why: a graph-learn client call against a dead server retries for minutes inside native code
*holding the GIL*; no Python thread of that process can run, so a thread watchdog cannot
fire. The sidecar watches the same pids through pidfds (it is not their parent, so it reads
the exit status from the zombie's ``/proc/<pid>/stat`` while the stuck owner has not reaped
it), logs the diagnosis to the shared stderr, writes the torchelastic error file and then
kills the owner (SIGTERM, SIGKILL after a grace period) so the launcher tears the job down.

Protocol: JSON lines over a socketpair. Owner -> sidecar: ``config``, ``watch``, ``disarm``.
Sidecar -> owner: ``ready``/``watching`` acknowledgements. The sidecar exits on ``disarm``,
on EOF, and when the owner's pidfd says the owner died (EOF alone is not enough: forked
children of the owner inherit its end of the socket).
"""

from __future__ import annotations

import json
import logging
import os
import selectors
import signal
import socket
import subprocess
import sys
from typing import TYPE_CHECKING, Any

from healthkit._actions import (
    FailureEvent,
    log_diagnosis,
    write_torchelastic_error_file,
)
from healthkit._diagnosis import ExitDiagnoser
from healthkit._errors import HealthkitError, NoSuchProcessError
from healthkit._watch import ExitStatus, ProcessWatch, read_proc_stat

if TYPE_CHECKING:
    from healthkit._watchdog import DisarmableWatchdog, _Entry

__all__ = ["SidecarLink"]

logger = logging.getLogger("healthkit")

# "-c", not "-m healthkit._sidecar": runpy would warn that the module is already imported.
_SIDECAR_MAIN = "import sys; from healthkit._sidecar import main; sys.exit(main(sys.argv))"
_START_TIMEOUT_S = 30.0  # interpreter start-up on a loaded 2-core machine


class SidecarError(HealthkitError, RuntimeError):
    """The sidecar watcher could not be started or stopped talking."""


class SidecarLink:
    """The owner's end: starts the sidecar and tells it what to watch."""

    def __init__(self, watchdog: DisarmableWatchdog) -> None:
        ours, theirs = socket.socketpair()
        pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (pkg_root, env.get("PYTHONPATH", "")) if p
        )
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _SIDECAR_MAIN, str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            env=env,
        )
        theirs.close()
        self._sock = ours
        self._sock.settimeout(_START_TIMEOUT_S)
        self._buf = b""
        me = read_proc_stat(os.getpid())
        self._send(
            op="config",
            owner_pid=os.getpid(),
            owner_start_time=me.start_time if me else None,
            name=watchdog.name,
            clean_exit_policy=watchdog.clean_exit_policy,
            kill_grace=watchdog.kill_grace,
        )
        self._expect("ready")

    @property
    def pid(self) -> int:
        return self._proc.pid

    def watch(self, entry: _Entry) -> None:
        w = entry.watch
        stat = read_proc_stat(w.pid)
        self._send(
            op="watch",
            pid=w.pid,
            name=w.name,
            start_time=stat.start_time if stat else None,
            run_until_disarmed=entry.run_until_disarmed,
        )
        self._expect("watching")

    def wait_for_action(self, timeout: float) -> None:
        """Give the sidecar time to act on a death it is seeing (it will stop us)."""
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    def disarm(self, timeout: float | None) -> None:
        try:
            self._send(op="disarm")
        except OSError:
            pass
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._sock.close()

    def _send(self, **msg: Any) -> None:
        self._sock.sendall(json.dumps(msg).encode() + b"\n")

    def _expect(self, word: str) -> None:
        while b"\n" not in self._buf:
            try:
                chunk = self._sock.recv(4096)
            except TimeoutError:
                chunk = b""
            if not chunk:
                self._proc.kill()
                self._proc.wait()
                self._sock.close()
                raise SidecarError(
                    f"the healthkit sidecar (pid {self._proc.pid}) did not answer {word!r}; "
                    "its stderr above says why (is healthkit importable by sys.executable?)"
                )
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        if line.decode() != word:
            raise SidecarError(f"sidecar protocol error: expected {word!r}, got {line!r}")


# ---------------------------------------------------------------------- sidecar process
def _kill_owner(owner_pidfd: int, grace: float) -> None:
    try:
        signal.pidfd_send_signal(owner_pidfd, signal.SIGTERM)
    except ProcessLookupError:
        return
    sel = selectors.DefaultSelector()
    sel.register(owner_pidfd, selectors.EVENT_READ)
    gone = bool(sel.select(grace))
    sel.close()
    if not gone:  # a SIGTERM handler that cannot run while the GIL is held
        try:
            signal.pidfd_send_signal(owner_pidfd, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _open_watch(pid: int, name: str, start_time: int | None) -> ProcessWatch | ExitStatus:
    """A watch on the owner's process, or its status if it is already gone or replaced."""
    try:
        watch = ProcessWatch(pid, name=name)
    except NoSuchProcessError:
        return ExitStatus(None, "unknown: gone before the sidecar could watch it")
    stat = read_proc_stat(pid)
    if start_time is not None and (stat is None or stat.start_time != start_time):
        watch.close()  # the pid now names another process: ours died already
        return ExitStatus(None, "unknown: gone before the sidecar could watch it")
    return watch


def main(argv: list[str]) -> int:
    from healthkit._watchdog import Verdict, decide

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the owner to handle
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format="%(asctime)s %(levelname)s healthkit sidecar: %(message)s",
    )
    sock = socket.socket(fileno=int(argv[1]))
    buf = b""

    def read_messages() -> list[dict[str, Any]] | None:
        nonlocal buf
        chunk = sock.recv(65536)
        if not chunk:
            return None
        buf += chunk
        *lines, buf = buf.split(b"\n")
        return [json.loads(line) for line in lines if line]

    config: dict[str, Any] | None = None
    while config is None:
        msgs = read_messages()
        if msgs is None:
            return 0
        config = msgs[0]
    owner_pidfd = os.pidfd_open(config["owner_pid"])
    diagnoser = ExitDiagnoser()
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ, "control")
    sel.register(owner_pidfd, selectors.EVENT_READ, "owner")
    sock.sendall(b"ready\n")
    entries: dict[int, tuple[ProcessWatch, bool]] = {}

    def fire(watch_or_status: ProcessWatch | ExitStatus, name: str, pid: int) -> int:
        diagnosis = diagnoser.diagnose(watch_or_status, name=name, pid=pid)
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
        _kill_owner(owner_pidfd, float(config["kill_grace"]))
        # The owner had no chance to stop its helpers (its atexit hooks did not run):
        # stop the other processes it asked us to watch, as its normal exit would have.
        for other, _ in entries.values():
            other.terminate()
        return 0

    while True:
        for key, _ in sel.select():
            if key.data == "owner":
                return 0  # the owner is gone: nothing left to protect
            if key.data == "control":
                msgs = read_messages()
                if msgs is None:
                    return 0
                for msg in msgs:
                    if msg["op"] == "disarm":
                        return 0
                    if msg["op"] == "watch":
                        opened = _open_watch(msg["pid"], msg["name"], msg["start_time"])
                        sock.sendall(b"watching\n")
                        if isinstance(opened, ExitStatus):
                            return fire(opened, msg["name"], msg["pid"])
                        entries[opened.fileno()] = (opened, bool(msg["run_until_disarmed"]))
                        sel.register(opened.fileno(), selectors.EVENT_READ, "watch")
                continue
            watch, until_disarmed = entries[key.fd]
            verdict = decide(
                watch.poll(),
                armed=True,
                run_until_disarmed=until_disarmed,
                clean_exit_policy=config["clean_exit_policy"],
            )
            if verdict is Verdict.FIRE:
                return fire(watch, watch.name, watch.pid)
            if verdict in (Verdict.IGNORE, Verdict.WARN):
                if verdict is Verdict.WARN:
                    logger.warning(
                        "%s, although it was declared to run until disarmed",
                        diagnoser.diagnose(watch),
                    )
                sel.unregister(key.fd)
                del entries[key.fd]
                watch.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
