"""ProgressWatch.call: a request to a live helper left unanswered for stall_timeout fails the
owner, whichever thread or forked process made it; slow answers, idle callers, a caller that
dies mid-call and a stop under way never do. A real helper answering on a socket, stalled by
a real SIGSTOP; callers in threads and forked processes."""

from __future__ import annotations

import multiprocessing as mp
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from progress_call_helpers import HERE, Caller, calls_for_ever, start_helper

import healthkit
from healthkit import (
    DisarmableWatchdog,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    ProgressWatch,
)
from healthkit.actions import FailureEvent

pytestmark = pytest.mark.timeout(60)

T = 0.5
FIRE_BOUND = T + 0.5  # the promise: within stall_timeout + 0.5 s


@pytest.fixture
def fired() -> list[tuple[float, FailureEvent]]:
    return []


def _watchdog(fired: list[tuple[float, FailureEvent]], **kw: object) -> DisarmableWatchdog:
    """A watchdog that records what fires. Its stop grace is short: other tests of this
    process send it SIGTERM (a stop episode), and within the default grace (30 s) a stall is
    rightly deferred."""
    def record(event: FailureEvent) -> None:
        fired.append((time.monotonic(), event))
        event.diagnosis  # noqa: B018 - gathered here, as log_diagnosis would

    kw.setdefault("stop_grace", 2.0)
    return DisarmableWatchdog(actions=[record], **kw)  # type: ignore[arg-type]


@pytest.fixture
def procs() -> Iterator[list[mp.process.BaseProcess]]:
    """Processes a test started: each is continued, killed and joined at the end."""
    started: list[mp.process.BaseProcess] = []
    yield started
    for p in started:
        if p.pid is not None and p.exitcode is None:
            os.kill(p.pid, signal.SIGCONT)
            p.kill()
        p.join(10)
        p.close()


def _sock(tmp_path: Path) -> str:
    return str(tmp_path / "helper.sock")


def _fork_caller(procs: list[mp.process.BaseProcess], watch: ProgressWatch, path: str,
                 delay: float) -> mp.process.BaseProcess:  # fmt: skip
    p = mp.get_context("fork").Process(
        target=calls_for_ever, args=(watch, path, delay, os.getpid()), daemon=True
    )
    p.start()
    procs.append(p)
    return p


def _switches(tid: int) -> int:
    with open(f"/proc/self/task/{tid}/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches")


def _ask_once(caller: Caller) -> None:
    try:
        caller.ask(0.01)
    except (OSError, RuntimeError):
        pass  # the helper was killed at the end of the test


# ------------------------------------------------------------------- thread mode, in process
def test_slow_answers_to_many_callers_never_fire_and_an_unanswered_call_does(
    fired: list[tuple[float, FailureEvent]],
    procs: list[mp.process.BaseProcess],
    tmp_path: Path,
) -> None:
    path = _sock(tmp_path)
    with ProgressWatch(T, name="echo server", who="rank 0", callers=True) as watch:
        helper = start_helper(watch, path)
        procs.append(helper)
        with _watchdog(fired) as wd:
            wd.watch_progress(watch)
            # Two forked callers and a thread, each answered 0.4 T after asking, for 6 T.
            callers = [_fork_caller(procs, watch, path, 0.4 * T) for _ in range(2)]
            mine = threading.Thread(target=calls_for_ever, args=(watch, path, 0.4 * T))
            mine.start()
            time.sleep(6 * T)
            assert fired == [], fired[0][1].diagnosis
            assert helper.pid is not None
            os.kill(helper.pid, signal.SIGSTOP)  # alive, answering nothing
            stopped = time.monotonic()
            deadline = stopped + 10
            while not fired and time.monotonic() < deadline:
                time.sleep(0.02)
            assert len(fired) == 1
            # A call in flight at the stop began at most 0.4 T before it.
            assert fired[0][0] - stopped <= FIRE_BOUND
            d = fired[0][1].diagnosis
            assert d.cause is healthkit.Cause.STALLED and d.pid == helper.pid
            callers_pids = {str(p.pid) for p in callers} | {str(os.getpid())}
            m = re.search(r"a call made for rank 0 by pid (\d+)", d.what)
            assert m and m.group(1) in callers_pids, d.what
            assert "state T" in d.likely and "do_signal_stop" in d.likely, d.likely
            os.kill(helper.pid, signal.SIGKILL)  # the thread's call returns (hung up)
            mine.join(10)


def test_idle_callers_never_fire_and_the_first_call_after_does(
    fired: list[tuple[float, FailureEvent]],
    procs: list[mp.process.BaseProcess],
    tmp_path: Path,
) -> None:
    path = _sock(tmp_path)
    with ProgressWatch(T, name="echo server", callers=True) as watch:
        helper = start_helper(watch, path)
        procs.append(helper)
        caller = Caller(watch, path)
        try:
            with _watchdog(fired) as wd:
                wd.watch_progress(watch)
                for _ in range(5):
                    caller.ask(0.01)
                assert helper.pid is not None and wd._thread is not None
                os.kill(helper.pid, signal.SIGSTOP)  # stuck, but nobody calls it
                time.sleep(T + 0.3)  # the watcher's last look finds the last call over
                tid = wd._thread.native_id
                assert tid is not None
                before = _switches(tid)
                time.sleep(3 * T)
                assert _switches(tid) - before == 0  # no wake-up while idle
                assert fired == []
                # The first call after the idle time rings the watcher and is timed.
                began = time.monotonic()
                t = threading.Thread(target=_ask_once, args=(caller,), daemon=True)
                t.start()
                while not fired and time.monotonic() < began + 10:
                    time.sleep(0.02)
                assert len(fired) == 1
                assert fired[0][0] - began <= FIRE_BOUND
            os.kill(helper.pid, signal.SIGKILL)
            t.join(10)
        finally:
            caller.close()


def test_a_caller_that_dies_mid_call_is_no_stall_and_a_live_one_beside_it_is(
    fired: list[tuple[float, FailureEvent]],
    procs: list[mp.process.BaseProcess],
    tmp_path: Path,
) -> None:
    path = _sock(tmp_path)
    with ProgressWatch(T, name="echo server", callers=True) as watch:
        helper = start_helper(watch, path)
        procs.append(helper)
        with _watchdog(fired) as wd:
            wd.watch_progress(watch)
            assert helper.pid is not None
            os.kill(helper.pid, signal.SIGSTOP)
            dying = _fork_caller(procs, watch, path, 0.01)  # its first call never returns
            time.sleep(0.2)
            dying.kill()  # a DataLoader worker ended by its loader, mid-call
            dying.join(10)
            time.sleep(2 * T)
            assert fired == [], fired[0][1].diagnosis.what
            live = _fork_caller(procs, watch, path, 0.01)  # same helper, a live caller
            began = time.monotonic()
            while not fired and time.monotonic() < began + 10:
                time.sleep(0.02)
            assert len(fired) == 1 and fired[0][0] - began <= FIRE_BOUND
            assert f"by pid {live.pid} " in fired[0][1].diagnosis.what


def test_a_stop_under_way_defers_an_unanswered_call_and_fires_if_the_owner_survives(
    fired: list[tuple[float, FailureEvent]],
    procs: list[mp.process.BaseProcess],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    path = _sock(tmp_path)
    got: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda s, f: got.append(s))
    try:
        with ProgressWatch(T, name="echo server", callers=True) as watch:
            helper = start_helper(watch, path)
            procs.append(helper)
            with _watchdog(fired, stop_grace=1.5) as wd:
                wd.watch_progress(watch)
                assert helper.pid is not None
                os.kill(helper.pid, signal.SIGSTOP)
                _fork_caller(procs, watch, path, 0.01)
                os.kill(os.getpid(), signal.SIGTERM)  # a launcher's stop: real signal
                stopped = time.monotonic()
                time.sleep(1.2)  # unanswered past T, but within the stop's grace
                assert got == [signal.SIGTERM] and fired == []
                assert "being stopped" in caplog.text
                while not fired and time.monotonic() < stopped + 10:
                    time.sleep(0.02)
                assert len(fired) == 1 and fired[0][0] - stopped <= 1.5 + 0.5
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_call_slots_are_claimed_once_per_thread_and_taken_again_when_it_ends() -> None:
    from healthkit._progress import _CLAIMED

    with ProgressWatch(T, callers=True) as watch:
        def one_call() -> None:
            with watch.call():
                pass

        for _ in range(5):  # five threads, one after the other
            t = threading.Thread(target=one_call)
            t.start()
            t.join()
        with watch.call(), watch.call():  # nested: the outer call times it
            pass
        assert watch._v[_CLAIMED] <= 2  # an ended thread's slot is taken again
    with ProgressWatch(T) as plain, pytest.raises(InvalidArgumentError, match="callers=True"):
        with plain.call():
            pass
    with pytest.raises(InvalidArgumentTypeError):
        ProgressWatch(T, callers=1)  # type: ignore[arg-type]


# -------------------------------------------------------------------- sidecar mode, owner
@pytest.mark.parametrize("scenario", ["stuck", "stop"])
def test_in_sidecar_mode_an_unanswered_call_fails_the_owner_and_a_stop_under_way_never_does(
    tmp_path: Path, scenario: str
) -> None:
    """Slow answers and idle callers in sidecar mode: tests/graphlearn/test_server_stall.py
    (a real GL server)."""
    proc = subprocess.run(
        [sys.executable, os.path.join(HERE, "progress_call_helpers.py"), "sidecar", scenario,
         str(T), _sock(tmp_path)],
        capture_output=True, text=True, timeout=45, check=False,
        env={**os.environ, "HEALTHKIT_RECORD_DIR": str(tmp_path / "records")},
    )  # fmt: skip
    if scenario == "stop":
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "not fired [15]" in proc.stdout, (proc.stdout, proc.stderr[-3000:])
        assert "stalled: a call" not in proc.stderr, proc.stderr[-3000:]
        assert "being stopped" in proc.stderr, proc.stderr[-3000:]
        return
    assert proc.returncode == -signal.SIGTERM, (proc.stdout, proc.stderr[-3000:])
    callers = proc.stdout.split("callers ")[1].split()[:3]  # two forked, and the owner
    m = re.search(
        r"echo server \(pid \d+\) stalled: a call made for rank 0 by pid (\d+)(?:, thread \d+)? "
        r"unanswered for [\d.]+ s: it is alive and blocked: state T .*wchan do_signal_stop",
        proc.stderr,
    )
    assert m and m.group(1) in callers, proc.stderr[-3000:]
    assert "not fired" not in proc.stdout
