"""die_with_parent(): the kernel mechanism behind "a helper never outlives its owner", shown
without GL (test_launcher.py shows it with the real server)."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time
from multiprocessing.connection import Connection

import healthkit as hk
from healthkit.lowlevel import die_with_parent

ctx = mp.get_context("fork")


def _guarded_sleep(parent_pid: int, seconds: float) -> None:
    die_with_parent(parent_pid)
    time.sleep(seconds)


def _end(p: mp.process.BaseProcess, wait: float) -> int | None:
    """The exit code ``p`` reached by itself within ``wait`` s (None: it had to be killed)."""
    p.join(wait)
    code = p.exitcode
    if code is None:
        p.kill()
        p.join()
    p.close()
    return code


def _run(target: object, *args: object) -> int | None:
    p = ctx.Process(target=target, args=args, daemon=True)  # type: ignore[attr-defined]
    p.start()
    return _end(p, 20)


def test_a_child_whose_parent_already_died_kills_itself_at_once() -> None:
    # The race: the parent dies between fork() and prctl(); the child was reparented and the
    # death signal will never come. Fabricated by naming a "parent" that is not ours.
    started = time.monotonic()
    code = _run(_guarded_sleep, os.getpid() + 4_000_000, 30.0)  # no such parent
    assert code == -signal.SIGKILL
    assert time.monotonic() - started < 20


def test_a_child_whose_parent_lives_runs_normally() -> None:
    assert _run(_guarded_sleep, os.getpid(), 0.2) == 0


def _middle(conn: Connection) -> None:
    """A parent that starts a guarded child, reports its pid, and waits to be killed."""
    child = ctx.Process(target=_guarded_sleep, args=(os.getpid(), 60.0), daemon=True)
    child.start()
    conn.send(child.pid)
    time.sleep(60)


def test_a_child_dies_with_its_sigkilled_parent() -> None:
    recv, send = ctx.Pipe(duplex=False)
    middle = ctx.Process(target=_middle, args=(send,))  # daemonic ones may not fork
    middle.start()
    send.close()
    try:
        assert recv.poll(30)
        grandchild = hk.ProcessWatch(recv.recv())  # not our child: watched via its pidfd
    finally:
        recv.close()
    with grandchild:
        os.kill(middle.pid, signal.SIGKILL)  # type: ignore[arg-type]
        middle.join(30)
        assert grandchild.wait(10) is not None, "the child outlived its SIGKILLed parent"
    middle.close()


def _guarded_then_report(parent_pid: int, conn: Connection) -> None:
    die_with_parent(parent_pid)
    conn.send("armed")
    time.sleep(30)


def test_the_death_signal_follows_the_forking_thread_not_the_process() -> None:
    # Why launch_sampler_server insists on the main thread: the child is killed when the
    # *thread* that forked it ends, although the process lives on. (The thread waits until
    # the child armed the signal, as the launcher waits for the server to be ready.)
    box: list[mp.process.BaseProcess] = []

    def fork_from_a_short_lived_thread() -> None:
        recv, send = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_guarded_then_report, args=(os.getpid(), send), daemon=True)
        p.start()
        send.close()
        box.append(p)
        try:
            recv.poll(20)
        finally:
            recv.close()

    t = threading.Thread(target=fork_from_a_short_lived_thread)
    t.start()
    t.join(30)
    (p,) = box
    assert _end(p, 20) == -signal.SIGKILL
