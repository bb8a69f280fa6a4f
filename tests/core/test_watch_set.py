"""WatchSet: one thread waits on many watches; other threads add, remove, wake and close."""

from __future__ import annotations

import contextlib
import os
import random
import resource
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from helpers import blocked_in_epoll

from healthkit import InvalidArgumentError, ProcessWatch, WatchClosedError, WatchSet


@contextlib.contextmanager
def sleepers(n: int) -> Iterator[list[tuple[subprocess.Popen[bytes], ProcessWatch]]]:
    """``n`` watched ``sleep`` processes; all killed, reaped and closed afterwards."""
    procs: list[tuple[subprocess.Popen[bytes], ProcessWatch]] = []
    try:
        for _ in range(n):
            p = subprocess.Popen(["sleep", "600"])
            procs.append((p, ProcessWatch(p)))
        yield procs
    finally:
        for _, w in procs:
            if not w.closed and w.status is None:
                w.kill()
        for p, w in procs:
            if not w.closed and w.status is None:
                w.wait(30)
            w.close()
            if p.returncode is None:  # its watch was closed before it was reaped
                p.kill()
                p.wait(30)


class Waiter:
    """Runs ``WatchSet.wait`` in a thread and keeps what it returned or raised."""

    def __init__(self, ws: WatchSet, timeout: float | None = None) -> None:
        self.result: list[ProcessWatch] | None = None
        self.error: BaseException | None = None
        self.returned_at: float | None = None

        def run() -> None:
            try:
                self.result = ws.wait(timeout)
            except BaseException as e:
                self.error = e
            self.returned_at = time.monotonic()

        self.thread = threading.Thread(target=run, name="watchset-waiter")
        self.thread.start()

    def blocked(self) -> bool:
        return blocked_in_epoll(self.thread.native_id)

    def join(self, timeout: float = 30) -> None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "wait() did not return"


@pytest.mark.timeout(30)
def test_wait_returns_the_watch_whose_process_ended() -> None:
    with sleepers(3) as procs, WatchSet(w for _, w in procs) as ws:
        assert len(ws) == 3
        procs[1][1].kill()
        ended = ws.wait(timeout=20)
        assert ended == [procs[1][1]]
        assert ended[0].status is not None and ended[0].status.returncode == -9


@pytest.mark.timeout(30)
def test_wait_times_out_with_an_empty_list() -> None:
    with sleepers(2) as procs, WatchSet(w for _, w in procs) as ws:
        t0 = time.monotonic()
        assert ws.wait(timeout=0.2) == []
        assert time.monotonic() - t0 >= 0.19
        assert ws.wait(timeout=0) == []
    with WatchSet() as empty:
        assert empty.wait(timeout=0.05) == []


@pytest.mark.timeout(30)
def test_an_ended_watch_is_returned_again_until_removed() -> None:
    with sleepers(2) as procs, WatchSet(w for _, w in procs) as ws:
        dead = procs[0][1]
        dead.kill()
        assert ws.wait(20) == [dead]
        assert ws.wait(20) == [dead]  # level-triggered
        ws.remove(dead)
        ws.remove(dead)  # removing twice is fine
        assert ws.wait(timeout=0.05) == []
        assert list(ws) == [procs[1][1]]


@pytest.mark.timeout(30)
def test_adding_from_the_constructor_does_not_make_wait_return_early() -> None:
    # Each add() must not leave a pending wake-up that makes the first wait() return [].
    with sleepers(3) as procs:
        ws = WatchSet(w for _, w in procs)
        ws.add(procs[0][1])  # adding the same watch again is a no-op
        try:
            procs[2][1].kill()
            assert ws.wait(timeout=20) == [procs[2][1]]
        finally:
            ws.close()


@pytest.mark.timeout(30)
def test_add_from_another_thread_while_wait_blocks() -> None:
    with sleepers(2) as procs, WatchSet([procs[0][1]]) as ws:
        waiter = Waiter(ws, timeout=25)
        assert waiter.blocked()
        late = procs[1][1]
        ws.add(late)
        late.kill()
        waiter.join()
        assert waiter.error is None
        assert waiter.result == [late]


@pytest.mark.timeout(30)
def test_remove_from_another_thread_while_wait_blocks() -> None:
    with sleepers(2) as procs, WatchSet(w for _, w in procs) as ws:
        waiter = Waiter(ws, timeout=25)
        assert waiter.blocked()
        gone = procs[0][1]
        ws.remove(gone)
        gone.kill()  # its death must not be reported: it is no longer in the set
        waiter.thread.join(0.3)
        assert waiter.thread.is_alive(), "remove() or a removed watch ended the wait"
        procs[1][1].kill()
        waiter.join()
        assert waiter.result == [procs[1][1]]


@pytest.mark.timeout(30)
def test_wake_from_another_thread_returns_an_empty_list() -> None:
    with sleepers(1) as procs, WatchSet(w for _, w in procs) as ws:
        waiter = Waiter(ws)  # no timeout: only wake() can end it
        assert waiter.blocked()
        ws.wake()
        waiter.join()
        assert waiter.error is None and waiter.result == []
        # A wake-up with nobody waiting makes the next wait() return at once, and only it.
        ws.wake()
        assert ws.wait(timeout=20) == []
        assert ws.wait(timeout=0.05) == []


@pytest.mark.timeout(30)
def test_wake_from_a_signal_handler_ends_the_wait() -> None:
    with sleepers(1) as procs, WatchSet(w for _, w in procs) as ws:
        old = signal.signal(signal.SIGUSR1, lambda *_: ws.wake())
        try:
            timer = threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGUSR1))
            timer.start()
            assert ws.wait(timeout=20) == []
            timer.join()
        finally:
            signal.signal(signal.SIGUSR1, old)


def test_a_closed_set_raises_watch_closed() -> None:
    with sleepers(1) as procs:
        ws = WatchSet(w for _, w in procs)
        ws.close()
        ws.close()  # idempotent
        assert ws.closed
        with pytest.raises(WatchClosedError) as info:
            ws.wait(0)
        assert isinstance(info.value, ValueError)
        with pytest.raises(WatchClosedError):
            ws.add(procs[0][1])
        ws.remove(procs[0][1])  # a no-op, not an error
        ws.wake()  # a no-op: the pipe is gone, nothing is written to a reused fd number
        assert not procs[0][1].closed  # closing the set leaves the watches open


@pytest.mark.timeout(30)
def test_close_from_another_thread_ends_a_blocked_wait_with_watch_closed() -> None:
    with sleepers(1) as procs:
        ws = WatchSet(w for _, w in procs)
        waiter = Waiter(ws)  # no timeout: a close that did not wake it would hang here
        assert waiter.blocked()
        ws.close()
        waiter.join()
        assert isinstance(waiter.error, WatchClosedError)
        # The selector and the wake-up pipe were released by the waiter on its way out
        # (the leak check after this test proves no fd is left).


@pytest.mark.parametrize("timeout", [-1, float("nan"), "x"])
def test_wait_rejects_a_bad_timeout(timeout: Any) -> None:
    with WatchSet() as ws, pytest.raises(InvalidArgumentError):
        ws.wait(timeout)


@pytest.mark.timeout(30)
def test_a_watch_closed_inside_the_set_does_not_block_its_fd_number() -> None:
    with sleepers(1) as procs, WatchSet() as ws:
        old = procs[0][1]
        ws.add(old)
        old_fd = old.fileno()
        old.kill()
        old.wait(30)
        old.close()  # closed without remove(): its fd number is free again
        p = subprocess.Popen(["sleep", "600"])
        with ProcessWatch(p) as new:
            if new.fileno() != old_fd:
                pytest.skip("the kernel did not hand out the same fd number")
            ws.add(new)  # must not fail with "fd already registered"
            assert list(ws) == [new]
            new.kill()
            assert ws.wait(20) == [new]
        p.wait(30)


@pytest.mark.timeout(120)
def test_one_thousand_watches_report_exactly_the_one_that_died() -> None:
    n = 1000
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = n + 200  # one pidfd per watch, plus the epoll fd, the pipe and pytest's own
    if soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            pytest.skip(f"RLIMIT_NOFILE hard limit {hard} < {need}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    try:
        with sleepers(n) as procs, WatchSet(w for _, w in procs) as ws:
            assert len(ws) == n
            victim_proc, victim = procs[random.randrange(n)]
            assert ws.wait(timeout=0) == []
            t0 = time.monotonic()
            os.kill(victim_proc.pid, signal.SIGKILL)
            ended = ws.wait(timeout=60)
            latency = time.monotonic() - t0
            assert ended == [victim]
            assert victim.status is not None and victim.status.returncode == -9
            assert victim_proc.returncode is None  # left for its owner to reap
            assert victim_proc.wait(30) == -9
            assert latency < 10, f"{latency:.3f}s to notice one death among {n}"
            ws.remove(victim)

            # Now all of them, collected through the set alone.
            for p, _ in procs:
                if p.returncode is None:
                    p.kill()
            collected = 1
            deadline = time.monotonic() + 60
            while len(ws) and time.monotonic() < deadline:
                for w in ws.wait(timeout=max(0.0, deadline - time.monotonic())):
                    ws.remove(w)
                    collected += 1
            assert collected == n
            assert all(w.status is not None and w.status.returncode == -9 for _, w in procs)
            assert all(p.wait(30) == -9 for p, _ in procs)  # their owners still reap them
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.timeout(30)
def test_watches_of_every_kind_share_one_set() -> None:
    import multiprocessing as mp

    import helpers

    p_fork = mp.get_context("fork").Process(target=helpers.sleep_forever)
    p_srv = mp.get_context("forkserver").Process(target=helpers.sleep_forever)
    p_fork.start()
    p_srv.start()
    popen = subprocess.Popen(["sleep", "600"])
    watches = [ProcessWatch(p_fork), ProcessWatch(p_srv), ProcessWatch(popen)]
    kill: list[Callable[[], None]] = [p_fork.kill, p_srv.kill, popen.kill]
    try:
        with WatchSet(watches) as ws:
            seen: set[int] = set()
            for i, w in enumerate(watches):
                kill[i]()
                ended = ws.wait(20)
                assert ended == [w]
                seen.add(id(w))
                ws.remove(w)
            assert len(seen) == 3
    finally:
        for w, k in zip(watches, kill, strict=True):
            if w.status is None:
                k()
                w.wait(30)
            w.close()
        for p in (p_fork, p_srv):
            p.join(30)
            p.close()
        popen.wait(30)


@pytest.mark.timeout(30)
def test_fileno_is_readable_exactly_when_wait_has_something() -> None:
    """The epoll fd lets another loop wait on the set: quiet while every process runs and
    nothing was woken; readable after a death, a plain fd's data or wake(); wait(0) then
    collects it."""
    import select

    with sleepers(2) as procs, WatchSet(w for _, w in procs) as ws:
        poller = select.poll()
        poller.register(ws.fileno(), select.POLLIN)
        assert poller.poll(100) == []  # every process runs: not readable
        ws.wake()
        assert poller.poll(5000) != []
        assert ws.wait(0) == []  # the wake-up, consumed
        assert poller.poll(100) == []
        r, w = os.pipe()
        seen: list[bytes] = []
        try:
            ws.add_fd(r, lambda: seen.append(os.read(r, 64)))
            os.write(w, b"x")
            assert poller.poll(5000) != []
            assert ws.wait(0) == [] and seen == [b"x"]
            assert poller.poll(100) == []
            ws.remove_fd(r)
        finally:
            os.close(r)
            os.close(w)
        procs[0][1].kill()
        assert poller.poll(5000) != []
        assert ws.wait(0) == [procs[0][1]]
    with pytest.raises(WatchClosedError):
        ws.fileno()
