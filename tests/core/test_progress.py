"""ProgressWatch: a live helper that stops progressing while progress is expected fails the
job with its state and stacks; slow progress, idleness, a stop under way and a stall that
ends in time never do. Real helpers, real deadlocks, real signals."""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from progress_helpers import HERE, beats_with_gaps, sleeps_in_libc, sleeps_in_libc_plain_opt_in

import healthkit
from healthkit import (
    DisarmableWatchdog,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    ProgressWatch,
)
from healthkit._decide import Verdict, decide_stall
from healthkit._watch.stopsignals import StopEpisode
from healthkit.actions import FailureEvent

pytestmark = pytest.mark.timeout(60)

T = 0.5  # stall_timeout in these tests
FIRE_BOUND = T + 0.5  # the promise: a stall fires within stall_timeout + 0.5 s


# ----------------------------------------------------------------------------- must fire
def _run_owner(kind: str, method: str, mode: str, tmp_path: Path) -> tuple[int, str, str]:
    proc = subprocess.run(
        [sys.executable, os.path.join(HERE, "progress_helpers.py"), kind, method, mode,
         str(T), str(tmp_path)],
        capture_output=True, text=True, timeout=45, check=False,
        env={**os.environ, "HEALTHKIT_RECORD_DIR": str(tmp_path / "records")},
    )  # fmt: skip
    return proc.returncode, proc.stdout, proc.stderr


STUCK = {
    "locks": ("stuck_on_two_locks", "futex"),
    "fifo": ("stuck_reading_a_fifo", "read(fd "),
    "gil": ("stuck_in_c_holding_the_gil", "nanosleep"),
}


@pytest.mark.parametrize(
    ("kind", "method", "mode"),
    [
        ("locks", "fork", "thread"),
        ("fifo", "spawn", "thread"),
        ("gil", "forkserver", "thread"),
        ("locks", "spawn", "sidecar"),
        ("fifo", "fork", "sidecar"),
        ("gil", "fork", "sidecar"),
    ],
)
def test_a_stalled_helper_fails_the_owner_with_the_stuck_threads_stack(
    kind: str, method: str, mode: str, tmp_path: Path
) -> None:
    rc, out, err = _run_owner(kind, method, mode, tmp_path)
    function, syscall = STUCK[kind]
    report = f"stdout:\n{out}\nstderr:\n{err}"
    assert "not fired" not in out, report
    assert re.search(
        r"sampler 0 \(pid \d+\) stalled: no progress for \d+\.\d s while rank 0 waited for "
        r"a batch", err
    ), report
    assert f"in {function}" in err, report  # the stuck thread's Python stack
    assert "Python stacks of sampler 0" in err, report
    assert syscall in err, report  # what it is blocked on, from /proc
    if kind == "fifo":
        assert "nobody-writes" in err, report  # the fd's target
    waiting = float(re.search(r"waiting (\S+)", out).group(1))  # type: ignore[union-attr]
    if mode == "thread":
        assert rc == 1, report
        fired = float(re.search(r"fired (\S+)", out).group(1))  # type: ignore[union-attr]
        assert T - 0.05 <= fired - waiting <= FIRE_BOUND, report
    else:
        assert rc in (-signal.SIGTERM, -signal.SIGKILL), report
        assert "stopping the owner" in err, report
        # The sidecar's report line is stamped after the stacks were read (tens of ms).
        waiting_wall = float(re.search(r"waiting \S+ (\S+)", out).group(1))  # type: ignore[union-attr]
        logged = float(re.search(r"^(\S+) ERROR .* stalled: ", err, re.M).group(1))  # type: ignore[union-attr]
        assert T - 0.05 <= logged - waiting_wall <= FIRE_BOUND + 0.5, report


# ----------------------------------------------------------------------------- never fires
@pytest.mark.parametrize("mode", ["thread", "sidecar"])
@pytest.mark.parametrize("kind", ["slow", "idle"])
def test_slow_progress_and_idleness_never_fire_in_either_mode(
    kind: str, mode: str, tmp_path: Path
) -> None:
    rc, out, err = _run_owner(kind, "fork", mode, tmp_path)
    report = f"stdout:\n{out}\nstderr:\n{err}"
    assert rc == 0, report
    assert "not fired after" in out and "stalled" not in err, report
    beats = int(re.search(r"after (\d+) beats", out).group(1))  # type: ignore[union-attr]
    assert beats >= (15 if kind == "slow" else 3), report


@pytest.fixture
def fired() -> list[tuple[float, FailureEvent]]:
    return []


def _watchdog(fired: list[tuple[float, FailureEvent]], **kw: object) -> DisarmableWatchdog:
    def record(event: FailureEvent) -> None:
        fired.append((time.monotonic(), event))
        event.diagnosis  # noqa: B018 - gathered here, as log_diagnosis would

    return DisarmableWatchdog(actions=[record], **kw)  # type: ignore[arg-type]


@pytest.fixture
def helper_of() -> Iterator[list[mp.process.BaseProcess]]:
    started: list[mp.process.BaseProcess] = []
    yield started
    for p in started:
        p.kill()
        p.join(10)
        p.close()


def _start(helper_of: list[mp.process.BaseProcess], watch: ProgressWatch, gaps: list[float],
           method: str = "fork") -> mp.process.BaseProcess:
    p = mp.get_context(method).Process(target=beats_with_gaps, args=(watch.heartbeat, gaps),
                                       daemon=True)
    p.start()
    helper_of.append(p)
    deadline = time.monotonic() + 20
    while watch.helper_pid is None and time.monotonic() < deadline:
        time.sleep(0.01)
    return p


def test_slow_but_progressing_never_fires_and_fires_once_it_stops(
    fired: list[tuple[float, FailureEvent]], helper_of: list[mp.process.BaseProcess]
) -> None:
    T_ = 0.3
    with ProgressWatch(T_, name="slow sampler") as watch:
        # One beat every stall_timeout/2 for 10 timeouts, then none.
        _start(helper_of, watch, [T_ / 2] * 20)
        with _watchdog(fired) as wd:
            wd.watch_progress(watch)
            with watch.expecting("a batch"):
                time.sleep(10 * T_)
                assert fired == [], fired[0][1].diagnosis
                assert watch.beats >= 15
                began = time.monotonic()
                time.sleep(T_ + 1.0)  # the helper stopped beating at about 10 T
            assert len(fired) == 1
            d = fired[0][1].diagnosis
            assert d.cause is healthkit.Cause.STALLED
            assert "slow sampler" in d.who and "waited for a batch" in d.what
            assert fired[0][0] - began <= T_ + 0.5


def test_idle_never_fires_and_the_first_wait_after_it_does(
    fired: list[tuple[float, FailureEvent]], helper_of: list[mp.process.BaseProcess]
) -> None:
    with ProgressWatch(T) as watch:
        _start(helper_of, watch, [])  # never beats
        with _watchdog(fired) as wd:
            wd.watch_progress(watch)
            time.sleep(3 * T)  # nobody waits: idle between epochs
            assert fired == []
            began = time.monotonic()
            with watch.expecting("the next epoch's first batch"):
                time.sleep(T + 0.8)
            assert len(fired) == 1
            assert fired[0][0] - began <= FIRE_BOUND
            assert "the next epoch's first batch" in fired[0][1].diagnosis.what


def test_a_stall_that_ends_before_the_timeout_never_fires_and_a_longer_one_does(
    fired: list[tuple[float, FailureEvent]], helper_of: list[mp.process.BaseProcess]
) -> None:
    with ProgressWatch(T) as watch:
        # Stalls of 0.7 T, each ended by a beat, then one of 2.4 T.
        _start(helper_of, watch, [0.7 * T] * 6 + [2.4 * T])
        with _watchdog(fired) as wd:
            wd.watch_progress(watch)
            with watch.expecting("a batch"):
                time.sleep(6 * 0.7 * T)
                assert fired == []
                time.sleep(2.4 * T)
            assert len(fired) == 1


def test_a_stop_under_way_defers_and_a_stop_the_owner_survives_fires(
    fired: list[tuple[float, FailureEvent]],
    helper_of: list[mp.process.BaseProcess],
    caplog: pytest.LogCaptureFixture,
) -> None:
    got: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda s, f: got.append(s))
    try:
        with ProgressWatch(T) as watch:
            _start(helper_of, watch, [])
            with _watchdog(fired, stop_grace=1.5) as wd:
                wd.watch_progress(watch)
                with watch.expecting("a batch"):
                    os.kill(os.getpid(), signal.SIGTERM)  # a launcher's stop: real signal
                    stopped = time.monotonic()
                    time.sleep(1.3)  # stalled past T, but within the stop's grace
                    assert got == [signal.SIGTERM]
                    assert fired == []
                    assert "being stopped" in caplog.text
                    time.sleep(0.8)  # this process survived the stop: now it is a stall
                assert len(fired) == 1
                assert fired[0][0] - stopped <= 1.5 + 0.5
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_disarmed_watchdog_never_fires_on_a_stall(
    fired: list[tuple[float, FailureEvent]], helper_of: list[mp.process.BaseProcess]
) -> None:
    with ProgressWatch(T) as watch:
        _start(helper_of, watch, [])
        wd = _watchdog(fired).arm()
        wd.watch_progress(watch)
        with watch.expecting("a batch"):
            time.sleep(0.2 * T)
            wd.disarm()
            time.sleep(1.5 * T)
        assert fired == []


# ----------------------------------------------------------------------------- wake-ups
def _voluntary_switches(tid: int) -> int:
    with open(f"/proc/self/task/{tid}/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches")


def test_the_watcher_wakes_once_per_timeout_while_expected_and_never_while_idle(
    fired: list[tuple[float, FailureEvent]], helper_of: list[mp.process.BaseProcess]
) -> None:
    t = 0.2
    with ProgressWatch(t) as watch:
        _start(helper_of, watch, [0.02] * 200)  # beats 50 times a second for 4 s
        with _watchdog(fired) as wd:
            wd.watch_progress(watch)
            time.sleep(0.2)
            assert wd._thread is not None
            tid = wd._thread.native_id
            assert tid is not None
            before = _voluntary_switches(tid)
            time.sleep(1.0)  # idle, though the helper beats
            idle = _voluntary_switches(tid) - before
            before = _voluntary_switches(tid)
            with watch.expecting("a batch"):
                time.sleep(1.0)  # about 5 timeouts, 50 beats
            expected = _voluntary_switches(tid) - before
        assert fired == []
    assert idle == 0
    # One wake-up per timeout (5), one for the poke at the start of the wait, one to find
    # it over; a little slack for the GIL hand-offs of a loaded machine.
    assert 3 <= expected <= 12, expected


# ----------------------------------------------------------------------------- stacks
@pytest.mark.parametrize("quiet", [True, False])
def test_a_stack_dump_does_not_end_a_helper_in_libc_sleep_once_attached(
    quiet: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Measured finding: the plain opt-in runs the dump handler in the sleeping thread, and
    libc sleep() returns early; attached through a heartbeat, a dumper thread takes it."""
    monkeypatch.setenv("HEALTHKIT_RECORD_DIR", str(tmp_path))
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with ProgressWatch(5) as watch:
        if quiet:
            p = ctx.Process(target=sleeps_in_libc, args=(watch.heartbeat, 3, out))
        else:
            p = ctx.Process(target=sleeps_in_libc_plain_opt_in, args=(str(tmp_path), 3, out))
        p.start()
        try:
            assert out.get(timeout=30)[0] == "ready"
            time.sleep(0.3)
            stacks = healthkit.dump_helper_stacks([p.pid], directory=str(tmp_path))[p.pid]
            what, left = out.get(timeout=10)
            assert what == "returned"
            if quiet:
                assert left == 0  # slept its full 3 s
                assert stacks is not None and "sleeps_in_libc" in stacks
                assert "_dumper" not in stacks  # the dumper's own stack is left out
            else:
                assert left > 0  # sleep() returned early: the helper went on and ended
        finally:
            p.join(10)
            out.close()
            out.join_thread()


# ----------------------------------------------------------------------------- the rule
def test_the_stall_rule() -> None:
    ep = StopEpisode(signal.SIGTERM, 10.0, "delivered")
    rule = dict(stall_timeout=1.0, stop_grace=5.0, now=12.0)
    assert decide_stall(None, armed=True, **rule).verdict is Verdict.KEEP_WATCHING
    assert decide_stall(None, armed=True, **rule).until is None  # idle: no timer
    assert decide_stall(0.4, armed=True, **rule).until == pytest.approx(12.6)
    assert decide_stall(1.0, armed=True, **rule).verdict is Verdict.FIRE
    assert decide_stall(1.0, armed=False, **rule).verdict is Verdict.IGNORE
    assert decide_stall(1.0, armed=True, owner_exiting=True, **rule).verdict is Verdict.IGNORE
    deferred = decide_stall(1.0, armed=True, stop=ep, **rule)
    assert deferred.verdict is Verdict.DEFER and deferred.until == 15.0
    after = {**rule, "now": 15.0}
    assert decide_stall(1.0, armed=True, stop=ep, **after).verdict is Verdict.FIRE


# ----------------------------------------------------------------------------- bad input
def test_bad_input_is_refused_with_typed_errors() -> None:
    with ProgressWatch(1) as watch:
        with pytest.raises(InvalidArgumentTypeError, match="what"):
            watch.begin(5)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError, match="without a matching begin"):
            watch.end()
        with pytest.raises(InvalidArgumentTypeError, match="stacks"):
            watch.heartbeat.attach(stacks="yes")  # type: ignore[arg-type]
        wd = DisarmableWatchdog()
        with pytest.raises(InvalidArgumentTypeError, match="ProgressWatch"):
            wd.watch_progress("sampler")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="stall_timeout"):
            ProgressWatch(0.01)
        with pytest.raises(TypeError):
            ProgressWatch(True)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentTypeError, match="quiet_for"):
            watch.diagnose("1")  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentTypeError, match="dump"):
            watch.diagnose(1.0, dump=5)  # type: ignore[arg-type]
        report = watch.diagnose(1.5)  # nobody attached: says so, reads nothing
        assert report.cause is healthkit.Cause.STALLED and report.pid is None
        assert "no helper attached" in report.likely


def test_expecting_nests_and_reports_what_is_awaited() -> None:
    with ProgressWatch(1) as watch:
        assert watch.expected is None
        with watch.expecting("a batch"):
            with watch.expecting("a reply"):
                assert watch.expected == "a batch"
            assert watch.expected == "a batch"
        assert watch.expected is None
        q: queue.Queue[int] = queue.Queue()
        threading.Thread(target=q.put, args=(1,)).start()
        with watch.expecting("a batch"):
            assert q.get(timeout=5) == 1
        assert "idle" in repr(watch)


# ----------------------------------------------------------------------------- the example
def test_the_example_fails_with_the_deadlocked_fetchers_stacks(tmp_path: Path) -> None:
    example = Path(HERE).parents[1] / "examples" / "progress_watch.py"
    proc = subprocess.run(
        [sys.executable, str(example)], capture_output=True, text=True, timeout=45,
        check=False, env={**os.environ, "HEALTHKIT_RECORD_DIR": str(tmp_path)},
    )  # fmt: skip
    report = f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert proc.returncode == 1, report
    assert "step 1: batch 1" in proc.stdout and "step 2" not in proc.stdout, report
    assert re.search(
        r"ERROR healthkit: healthkit watchdog: feature fetcher \(pid \d+\) stalled: no "
        r"progress for 2\.\d s while pid \d+ waited for a batch: it is alive and blocked: "
        r"state S in futex",
        proc.stderr,
    ), report
    assert "Python stacks of feature fetcher" in proc.stderr, report
    assert "in refresh_index" in proc.stderr and "in fetch_features" in proc.stderr, report


def test_attach_blocks_the_dump_signal_in_the_helper_and_a_forked_child_takes_it_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from progress_helpers import attach_then_fork

    monkeypatch.setenv("HEALTHKIT_RECORD_DIR", str(tmp_path))
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with ProgressWatch(5) as watch:
        p = ctx.Process(target=attach_then_fork, args=(watch.heartbeat, out))
        p.start()
        try:
            helper_blocks, child_blocks = out.get(timeout=30)
        finally:
            p.join(10)
            out.close()
            out.join_thread()
    assert helper_blocks is True  # the dumper thread takes it instead
    assert child_blocks is False  # no dumper there: its one thread takes it, as before


def test_closing_a_watch_while_watched_is_idle_and_deaths_still_fire(
    fired: list[tuple[float, FailureEvent]], helper_of: list[mp.process.BaseProcess]
) -> None:
    watch = ProgressWatch(T)
    helper = _start(helper_of, watch, [])
    with _watchdog(fired) as wd:
        wd.watch(helper)
        wd.watch_progress(watch)
        watch.begin("a batch")
        watch.close()  # while expected, before the timeout
        time.sleep(2 * T)
        assert fired == []  # a closed watch is idle, and the watcher did not break
        assert wd.armed and wd.error is None
        helper.kill()
        deadline = time.monotonic() + 10
        while not fired and time.monotonic() < deadline:
            time.sleep(0.01)
    assert len(fired) == 1
    assert fired[0][1].diagnosis.cause is not healthkit.Cause.STALLED


@pytest.mark.timeout(60)
def test_healthkit_stacks_reads_an_attached_helper_without_ending_its_libc_sleep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`healthkit stacks <pid>` uses the same quiet dump: the helper's sleep(3) runs to its
    end, and the thread states from /proc come with the stacks."""
    monkeypatch.setenv("HEALTHKIT_RECORD_DIR", str(tmp_path))
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with ProgressWatch(5) as watch:
        p = ctx.Process(target=sleeps_in_libc, args=(watch.heartbeat, 3, out))
        p.start()
        try:
            assert out.get(timeout=30)[0] == "ready"
            time.sleep(0.3)
            cli = subprocess.run(
                [sys.executable, "-m", "healthkit", "stacks", str(p.pid), "--timeout", "10"],
                capture_output=True, text=True, timeout=30, check=False,
            )  # fmt: skip
            assert cli.returncode == 0, cli.stderr
            assert re.search(rf"=== pid {p.pid} \(\S+\):\n  thread {p.pid} \(\S+\): state S, "
                             r"in clock_nanosleep", cli.stdout), cli.stdout
            assert "in sleeps_in_libc" in cli.stdout and "returned early" not in cli.stdout
            assert out.get(timeout=10) == ("returned", 0)  # slept its full 3 s
        finally:
            p.join(10)
            out.close()
            out.join_thread()
