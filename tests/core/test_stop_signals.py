"""How healthkit sees its own process being stopped, without changing what the application
sees: it keeps the signal wakeup fd and relays every byte to the fd the application set, with
``signal.set_wakeup_fd``'s own contract; asyncio's signal handlers keep working whether their
loop started before or after ``arm()``; and a stop that stays pending (no thread can take
it) is seen too."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading

import pytest

from healthkit import _stopsignals


def test_set_wakeup_fd_keeps_its_contract() -> None:
    a, b = socket.socketpair()
    a.setblocking(False)
    try:
        assert signal.set_wakeup_fd(a.fileno()) == -1  # returns the previous one
        assert signal.set_wakeup_fd(a.fileno(), warn_on_full_buffer=False) == a.fileno()
        errors: list[BaseException] = []

        def elsewhere() -> None:
            try:
                signal.set_wakeup_fd(-1)
            except ValueError as e:
                errors.append(e)

        t = threading.Thread(target=elsewhere)
        t.start()
        t.join()
        assert errors and "main thread" in str(errors[0])
        r, w = os.pipe()  # blocking: refused, as the interpreter refuses it
        try:
            with pytest.raises(ValueError, match="non-blocking"):
                signal.set_wakeup_fd(r)
        finally:
            os.close(r)
            os.close(w)
        with pytest.raises(OSError):
            signal.set_wakeup_fd(10_000)  # not an open fd
    finally:
        assert signal.set_wakeup_fd(-1) == a.fileno()
        a.close()
        b.close()


def test_every_signal_byte_reaches_the_applications_fd() -> None:
    a, b = socket.socketpair()
    a.setblocking(False)
    previous = signal.signal(signal.SIGUSR2, lambda *_: None)
    try:
        signal.set_wakeup_fd(a.fileno())
        os.kill(os.getpid(), signal.SIGUSR2)
        b.settimeout(10)
        assert b.recv(16) == bytes([signal.SIGUSR2])  # relayed by the stop listener
    finally:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGUSR2, previous)
        a.close()
        b.close()


def test_a_forked_child_gets_the_applications_fd_back() -> None:
    a, b = socket.socketpair()
    a.setblocking(False)
    try:
        signal.set_wakeup_fd(a.fileno())
        pid = os.fork()
        if pid == 0:  # the child: healthkit's listener is not here; the interpreter has a
            code = 0 if signal.set_wakeup_fd(-1) == a.fileno() else 1
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        signal.set_wakeup_fd(-1)
        a.close()
        b.close()


ASYNCIO_OWNER = """
import asyncio, os, signal, time
from healthkit import _stopsignals
import healthkit

def arm():
    healthkit.DisarmableWatchdog().arm()

async def main(arm_first):
    if arm_first:
        arm()
    got = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, got.set)
    if not arm_first:
        arm()
    os.kill(os.getpid(), signal.SIGTERM)
    await asyncio.wait_for(got.wait(), 10)  # asyncio's own handler still runs
    print("ASYNCIO HANDLER RAN")

{first}
asyncio.run(main({arm_first}))
episode = _stopsignals.episode(time.monotonic(), 30.0)
print("SEEN", episode.signal.name if episode else None)
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("first", "arm_first"),
    [
        ("", True),  # a loop that adds its handler after arm()
        ("", False),  # a loop running, its handler added, before arm()
        # an earlier asyncio.run() that used the wakeup fd and ended (it set it back to -1)
        ("asyncio.run(asyncio.sleep(0)); "
         "asyncio.new_event_loop().add_signal_handler(signal.SIGUSR2, print)", True),
    ],
    ids=["after-arm", "before-arm", "after-a-finished-run"],
)  # fmt: skip
def test_an_asyncio_loop_keeps_its_signals_and_healthkit_still_sees_the_stop(
    first: str, arm_first: bool
) -> None:
    code = ASYNCIO_OWNER.format(first=first, arm_first=arm_first)
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=50
    )
    assert proc.returncode == 0, proc.stderr
    assert "ASYNCIO HANDLER RAN" in proc.stdout
    assert "SEEN SIGTERM" in proc.stdout, proc.stdout


def test_a_signal_no_thread_can_take_is_seen_pending() -> None:
    """The stand-in for a main thread in an uninterruptible read: every thread of a child
    blocks SIGHUP, so it stays pending; healthkit reads it from /proc."""
    code = """
        import os, signal, threading, time
        from healthkit import _stopsignals
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
        os.kill(os.getpid(), signal.SIGHUP)
        print(_stopsignals.pending_stop(os.getpid()).name)
        print(_stopsignals.episode(time.monotonic(), 30.0).seen)
    """
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=50
    )
    assert proc.stdout.split() == ["SIGHUP", "pending"], proc.stderr
    # Its twin: nothing pending, no episode.
    assert _stopsignals.pending_stop(os.getpid()) is None


def test_note_stop_begins_an_episode_that_ends_after_the_grace() -> None:
    code = """
        import time
        from healthkit import _stopsignals
        assert _stopsignals.install()
        t = time.monotonic()
        _stopsignals.note_stop()
        print(_stopsignals.episode(time.monotonic(), 30.0).signal.name)
        print(_stopsignals.episode(t + 31.0, 30.0))
    """
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=50
    )
    assert proc.stdout.split() == ["SIGTERM", "None"], proc.stderr
