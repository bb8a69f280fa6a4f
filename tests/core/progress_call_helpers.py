"""A real request/reply helper for the tests of ProgressWatch.call, and callers of it.

The helper answers requests on a Unix socket, one thread per connection, after the delay
each request asks for: a caller sends its delay in milliseconds and reads one byte back.
Stalling it is real: SIGSTOP leaves it alive (state T) with every call to it unanswered.
``python progress_call_helpers.py MODE SCENARIO STALL_TIMEOUT SOCKET`` is an owner that
watches it in thread or sidecar mode with the default actions (log, exit 1).
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))


def answers_calls(hb: Any, path: str, parent: int) -> None:
    """The helper: attach (its stacks can be read), then answer on ``path`` for ever."""
    from healthkit.lowlevel import die_with_parent

    die_with_parent(parent)  # SIGKILL ends it even while it is stopped
    hb.attach()
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(64)

    def serve(conn: socket.socket) -> None:
        with conn:
            while True:
                try:
                    data = conn.recv(16)
                    if not data:
                        return
                    time.sleep(int(data) / 1000)
                    conn.sendall(b"!")
                except OSError:  # its caller was ended
                    return

    while True:
        conn, _ = srv.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


def start_helper(watch: Any, path: str) -> Any:
    """Fork the helper and wait until it listens; returns its Process."""
    import multiprocessing as mp

    p = mp.get_context("fork").Process(
        target=answers_calls, args=(watch.heartbeat, path, os.getpid()), daemon=True,
        name="echo server",
    )  # fmt: skip
    p.start()
    deadline = time.monotonic() + 20
    while not os.path.exists(path) or watch.helper_pid is None:
        if time.monotonic() > deadline or not p.is_alive():
            raise RuntimeError("the helper did not start")
        time.sleep(0.01)
    return p


class Caller:
    """One connection to the helper; :meth:`ask` is one call, timed by ``watch.call()``."""

    def __init__(self, watch: Any, path: str) -> None:
        self.watch = watch
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)

    def ask(self, delay: float) -> None:
        with self.watch.call():
            self.sock.sendall(str(int(delay * 1000)).encode())
            if self.sock.recv(1) != b"!":
                raise RuntimeError("the helper hung up")

    def close(self) -> None:
        self.sock.close()


def calls_for_ever(watch: Any, path: str, delay: float, parent: int = 0) -> None:
    """A forked caller: call in a loop, each answer ``delay`` s later (until killed)."""
    if parent:
        from healthkit.lowlevel import die_with_parent

        die_with_parent(parent)
    c = Caller(watch, path)
    try:
        while True:
            c.ask(delay)
    except (OSError, RuntimeError):  # the helper was ended
        c.close()


def owner(mode: str, scenario: str, stall_timeout: float, path: str) -> int:
    """A process that owns the helper, two forked callers and one caller thread. After a
    few answers the helper is SIGSTOPped while calls are in flight. ``stuck``: the watchdog
    must end this process. ``stop``: this process is sent SIGTERM, handles it and takes
    4 timeouts to stop (then exits 0): nothing may fire."""
    import logging
    import multiprocessing as mp

    import healthkit

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    watch = healthkit.ProgressWatch(stall_timeout, name="echo server", who="rank 0",
                                    callers=True)  # fmt: skip
    helper = start_helper(watch, path)
    wd = healthkit.DisarmableWatchdog([helper], mode=mode)  # type: ignore[arg-type]
    wd.watch_progress(watch)
    wd.arm()
    delay = 0.01
    ctx = mp.get_context("fork")
    callers = [ctx.Process(target=calls_for_ever, args=(watch, path, delay, os.getpid()),
                           daemon=True) for _ in range(2)]  # fmt: skip
    for c in callers:
        c.start()
    mine = threading.Thread(target=calls_for_ever, args=(watch, path, delay), daemon=True)
    mine.start()
    print(f"callers {' '.join(str(c.pid) for c in callers)} {os.getpid()}", flush=True)
    time.sleep(0.3)
    os.kill(helper.pid, signal.SIGSTOP)
    print(f"stopped {time.monotonic()}", flush=True)
    if scenario == "stop":
        stops: list[int] = []
        signal.signal(signal.SIGTERM, lambda sig, frame: stops.append(sig))
        os.kill(os.getpid(), signal.SIGTERM)  # a launcher's stop, handled gracefully
        time.sleep(4 * stall_timeout)  # calls unanswered past the timeout while stopping
        wd.disarm()
        print(f"not fired {stops}", flush=True)
        os.kill(helper.pid, signal.SIGKILL)
        return 0
    time.sleep(30)
    print("not fired", flush=True)
    return 3


if __name__ == "__main__":
    sys.path.insert(0, HERE)
    sys.exit(owner(sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]))
