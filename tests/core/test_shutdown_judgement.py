"""A death first seen at interpreter shutdown is judged by the same rule, from the same inputs,
as one the watcher sees while the owner runs: a real crash just before the exit still fires,
a clean exit that is allowed or a helper that healthkit.stop() ended does not, in thread and
sidecar mode.

In process (thread mode) the watcher thread is held off the judgement the way an exiting main
thread holding the GIL holds it off, so the death is seen by the exit hook's check first,
deterministically. Sidecar mode runs in an owner process (its sidecar stops its owner)."""

from __future__ import annotations

import faulthandler
import multiprocessing as mp
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import healthkit as hk

OWNER = str(Path(__file__).parent.parent / "scripts" / "owner.py")

pytestmark = pytest.mark.timeout(120)


def serve_forever() -> None:
    faulthandler.disable()  # pytest's, inherited: a SIGSEGV sent here needs no stack dump
    time.sleep(600)


def exit_0_when_told(go: threading.Event) -> None:
    go.wait(60)


class Recorder:
    def __init__(self) -> None:
        self.events: list[hk.actions.FailureEvent] = []
        self.fired = threading.Event()

    def __call__(self, event: hk.actions.FailureEvent) -> None:
        self.events.append(event)
        self.fired.set()


def _kill(sig: signal.Signals) -> Callable[[mp.process.BaseProcess, object], None]:
    def end(p: mp.process.BaseProcess, go: object) -> None:
        os.kill(p.pid, sig)  # type: ignore[arg-type]

    return end


def _exit_0(p: mp.process.BaseProcess, go: object) -> None:
    go.set()  # type: ignore[attr-defined]


def _healthkit_stop(p: mp.process.BaseProcess, go: object) -> None:
    hk.stop([p], kill_after=5)


# (how the helper ends, its on_clean_exit, whether that fires, the line that says so)
CASES = {
    "SIGKILL": (_kill(signal.SIGKILL), "fail", True, "killed by SIGKILL"),
    "SIGSEGV": (_kill(signal.SIGSEGV), "fail", True, "SIGSEGV"),
    "SIGTERM from elsewhere": (_kill(signal.SIGTERM), "fail", True, "SIGTERM"),
    "exit 0, may finish": (_exit_0, "ignore", False, ""),
    "exit 0, meant to run": (_exit_0, "fail", True, "expected to run until disarmed"),
    "ended by healthkit.stop": (_healthkit_stop, "fail", False, ""),
}


@pytest.mark.parametrize("seen", ["while running", "at shutdown"])
@pytest.mark.parametrize("case", list(CASES))
def test_a_death_is_judged_alike_while_running_and_at_shutdown(seen: str, case: str) -> None:
    end, rule, fires, words = CASES[case]
    ctx = mp.get_context("fork")
    go = ctx.Event()
    target = exit_0_when_told if end is _exit_0 else serve_forever
    p = ctx.Process(target=target, args=(go,) if target is exit_0_when_told else (), daemon=True)
    p.start()
    rec = Recorder()
    wd = hk.DisarmableWatchdog([p], actions=[rec], on_clean_exit=rule).arm()  # type: ignore[arg-type]
    try:
        (watch,) = wd.watches
        if seen == "at shutdown":
            # The watcher thread waits for this lock to judge; this thread holds it (it is
            # re-entrant here) and runs the check the exit hook runs before disarming.
            with wd._judging:
                end(p, go)
                assert watch.wait(30) is not None
                wd._report_death_before_shutdown()
                assert rec.fired.is_set() is fires  # decided here, before the watcher ran
        else:
            end(p, go)
            assert watch.wait(30) is not None
        if fires:
            assert rec.fired.wait(10)
        else:
            # Give the watcher thread its turn: it must stay silent too.
            time.sleep(0.5)
        (record,) = wd._records.values()
        assert record.settled or not fires
        assert len(rec.events) == (1 if fires else 0)  # once, whoever saw it first
        if fires:
            assert words in str(rec.events[0].diagnosis)
    finally:
        wd.disarm()
        go.set()
        if p.is_alive():
            p.kill()
        p.join(10)
        p.close()


def _run_owner(*args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    began = time.monotonic()
    proc = subprocess.run(
        [sys.executable, OWNER, *args], capture_output=True, text=True, timeout=60
    )
    return proc, time.monotonic() - began


@pytest.mark.parametrize("mode", ["thread", "sidecar"])
def test_a_crash_just_before_the_owner_exits_still_fires(mode: str) -> None:
    proc, _ = _run_owner("exit-right-after-death", "--mode", mode, "--death", "SIGSEGV")
    # Whichever runs first, the watcher or the exit's check, the crash is reported once.
    assert proc.stderr.count("was killed by SIGSEGV") == 1, proc.stderr
    assert "helper-0 (pid" in proc.stderr, proc.stderr
    assert proc.returncode == (1 if mode == "thread" else -signal.SIGTERM), proc.stderr


@pytest.mark.parametrize("mode", ["thread", "sidecar"])
def test_a_clean_exit_just_before_the_owner_exits_fires_only_when_it_was_not_allowed(
    mode: str,
) -> None:
    proc, took = _run_owner(
        "exit-right-after-clean-exit", "--mode", mode, "--helpers", "1", "--policy", "ignore"
    )
    assert (proc.returncode, proc.stderr) == (0, "")
    assert "MAIN THREAD DONE" in proc.stdout
    # Not held for the sidecar's action (kill_after + 5 s) that never comes.
    assert took < 20
    proc, _ = _run_owner(
        "exit-right-after-clean-exit", "--mode", mode, "--helpers", "1", "--policy", "fail"
    )
    assert "exited with code 0 while it was expected to run until disarmed" in proc.stderr
    assert proc.returncode == (1 if mode == "thread" else -signal.SIGTERM), proc.stderr


def test_the_rule_has_one_call_site_the_judge() -> None:
    """Shutdown included: a sidecar-mode owner's exit check asks the judge
    (``Judge.verdict``), it does not call the rule with inputs of its own."""
    root = Path(__file__).resolve().parents[2] / "healthkit"
    call = re.compile(r"(?<![\w.])decide\(")
    calls = [
        f"{path.relative_to(root)}:{line.strip()}"
        for path in sorted(root.rglob("*.py"))
        for line in path.read_text().splitlines()
        if call.search(line) and not line.lstrip().startswith("def ")
    ]
    assert calls == ["_judge.py:return decide("], calls
