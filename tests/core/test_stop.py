"""healthkit.stop(): the one ladder (ask, SIGTERM, SIGKILL) with one shared deadline."""

from __future__ import annotations

import logging
import multiprocessing as mp
import signal
import subprocess
import sys
import time

import pytest
from helpers import reaped

import healthkit as hk
from healthkit._watch.stop import stop


def wait_for_event(event: object) -> None:
    event.wait(60)  # type: ignore[attr-defined]


def ignore_sigterm_forever(ready: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ready.set()  # type: ignore[attr-defined]
    time.sleep(60)


@pytest.mark.timeout(60)
def test_processes_that_end_when_asked_are_not_signalled(caplog: pytest.LogCaptureFixture) -> None:
    ctx = mp.get_context("fork")
    event = ctx.Event()
    procs = [ctx.Process(target=wait_for_event, args=(event,)) for _ in range(3)]
    for p in procs:
        p.start()
    with caplog.at_level(logging.WARNING, logger="healthkit"):
        report = stop(procs, request=event.set, grace=10)
    assert sorted(report.ended_when_asked) == sorted(p.pid for p in procs)
    assert not report.escalated
    statuses = [report.statuses[p.pid] for p in procs]
    assert all(s is not None and s.returncode == 0 for s in statuses)
    assert all(p.exitcode == 0 and reaped(p.pid) for p in procs)  # reaped through the owner
    assert caplog.records == []
    for p in procs:
        p.close()


@pytest.mark.timeout(60)
def test_the_ladder_escalates_to_sigkill_logs_each_step_and_stays_bounded(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    stubborn = ctx.Process(target=ignore_sigterm_forever, args=(ready,))
    stubborn.start()
    polite = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    assert ready.wait(30)
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="healthkit"):
        report = stop(
            [stubborn, polite], request=lambda: None, grace=0.2, kill_after=1.0,
            kill_timeout=5.0, name="sampling workers",
        )  # fmt: skip
    elapsed = time.monotonic() - t0
    assert elapsed < 0.2 + 1.0 + 5.0 + 1.0
    assert set(report.terminated) == {polite.pid}
    assert report.killed == (stubborn.pid,)
    assert report.survivors == ()
    assert stubborn.exitcode == -signal.SIGKILL and polite.returncode == -signal.SIGTERM
    messages = [r.getMessage() for r in caplog.records]
    assert any("did not end within" in m and "sending SIGTERM" in m for m in messages)
    assert any("ignored SIGTERM" in m and str(stubborn.pid) in m for m in messages)
    stubborn.close()


@pytest.mark.timeout(30)
def test_bad_bounds_are_rejected_and_gone_or_unstarted_targets_are_skipped() -> None:
    with pytest.raises(hk.InvalidArgumentError):
        stop([], grace=-1)
    with pytest.raises(hk.InvalidArgumentError):
        stop([], kill_timeout=float("nan"))
    never_started = mp.get_context("fork").Process(target=time.sleep, args=(1,))
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    report = stop([never_started, done], kill_after=1)
    assert not report.escalated


@pytest.mark.timeout(30)
def test_without_a_request_sigterm_comes_first_and_is_not_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    with caplog.at_level(logging.WARNING, logger="healthkit"):
        report = stop([sleeper], kill_after=10)
    assert report.terminated == (sleeper.pid,) and not report.killed
    assert sleeper.returncode == -signal.SIGTERM
    assert report.seconds < 10
    assert caplog.records == []


@pytest.mark.timeout(30)
def test_a_kill_after_of_0_goes_straight_to_sigkill() -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    report = stop([sleeper], kill_after=0)
    assert report.killed == (sleeper.pid,) and not report.terminated
    assert sleeper.returncode == -signal.SIGKILL
