"""Shared test fixtures. Every test is checked for leaks: no child process, zombie, thread or
file descriptor may outlive it (tests that start processes must end them, by pid)."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator

import pytest
from testutil import close_interrupted_torch_probes

from healthkit import lowlevel

# A suite started as a background job of a non-interactive shell (`cmd &`, nohup, some CI
# runners) inherits SIGINT ignored, and an ignored signal stays ignored across fork and exec:
# every process the tests start would shrug off the Ctrl-C the stop tests send and wait for
# their timeouts. Those tests model a terminal's Ctrl-C, so give SIGINT its usual disposition
# here: Python's KeyboardInterrupt handler in this process, the default in exec'd children.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _children(pid: int) -> set[int]:
    """Direct children of ``pid`` (any state, zombies included) from /proc."""
    return set(lowlevel.children(pid))


def _fds() -> set[int]:
    """Open fds, less multiprocessing's shared-memory heap arenas: the heap is process-wide,
    grows by a new arena (one fd each, named ``pym-<pid>-...``) when a test's shared values
    no longer fit, and never shrinks, so a new arena is not the leak of the test that grew it."""
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if "/pym-" not in target:
            out.add(int(fd))
    return out


def _describe_fd(fd: int) -> str:
    try:
        return f"{fd} -> {os.readlink(f'/proc/self/fd/{fd}')}"
    except OSError:
        return f"{fd} (closed since)"


def _describe(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rpartition(")")[2].split()[0]
    except OSError:
        return f"{pid} (gone)"
    return f"{pid} [{state}] {cmd[:120]}"


# Processes that are meant to outlive a single test (multiprocessing's forkserver and
# resource tracker are per-interpreter singletons, started on first use).
_SINGLETONS = ("multiprocessing.forkserver", "multiprocessing.resource_tracker")


def _is_singleton(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().decode(errors="replace")
    except OSError:
        return True
    return any(s in cmd for s in _SINGLETONS)


@pytest.fixture(autouse=True, scope="session")
def _multiprocessing_heap() -> None:
    """Allocate multiprocessing's process-wide shared-memory heap once, up front.

    Its arena keeps one fd open for the life of the process; created inside a test it
    would look like that test's leak.
    """
    import multiprocessing

    multiprocessing.get_context("spawn").RawArray("b", 1)


@pytest.fixture(autouse=True, scope="session")
def _stop_signal_pipe() -> None:
    """Start healthkit's stop listener once, up front: the first ``arm()`` of a process
    creates its socketpair (it backs ``signal.set_wakeup_fd``) and its thread, which live as
    long as the process, so created inside a test they would look like that test's leak."""
    from healthkit._watch import stopsignals as _stopsignals

    assert _stopsignals.install()


@pytest.fixture(autouse=True)
def no_leaks(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail the test if it leaves a child process, a zombie, a thread or an fd behind."""
    if request.node.get_closest_marker("allow_leaks"):
        yield
        return
    me = os.getpid()
    children_before = _children(me)
    threads_before = set(threading.enumerate())
    fds_before = _fds()
    yield
    # What only a reference cycle still holds (an exception's frames: a file torch opened in
    # the frame a signal handler raised from) is garbage, not a leak of the test's.
    import gc

    gc.collect()
    deadline = time.monotonic() + 5.0
    while True:
        children = {p for p in _children(me) - children_before if not _is_singleton(p)}
        threads = {t for t in set(threading.enumerate()) - threads_before if t.is_alive()}
        fds = _fds() - fds_before
        if not (children or threads or fds) or time.monotonic() > deadline:
            break
        time.sleep(0.02)  # let exiting threads and processes finish (bounded)
    fds -= close_interrupted_torch_probes(fds)
    problems = []
    if children:
        problems.append("child processes left: " + "; ".join(_describe(p) for p in children))
        for pid in children:  # clean up so one leak does not cascade into every later test
            try:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
    if threads:
        frames = sys._current_frames()
        problems.append(
            "threads left: "
            + "; ".join(
                f"{t.name} at {''.join(traceback.format_stack(frames[t.ident])[-3:]).strip()}"
                if t.ident in frames
                else t.name
                for t in threads
            )
        )
    if fds:
        described = ", ".join(_describe_fd(fd) for fd in sorted(fds))
        problems.append(f"file descriptors left: {described}")
    if problems:
        pytest.fail("leak check: " + " | ".join(problems))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "allow_leaks: skip the leak check (justify in the test)")
