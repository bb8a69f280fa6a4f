"""healthkit._runtime, the one owner of process-wide state: the exit sequence runs its steps
in their phases and order (a failing step is logged and the others still run), a forked child
runs the fork steps and hears none of its parent's subscribers, and a subscriber that raises
is logged at ERROR, never swallowed."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from healthkit import _runtime

EXIT_SEQUENCE = textwrap.dedent(
    """
    import multiprocessing as mp, threading, time
    from healthkit import _runtime

    def sleeper():
        time.sleep(60)

    if __name__ == "__main__":
        helper = mp.get_context("fork").Process(target=sleeper, daemon=True)
        helper.start()

        def joined():
            time.sleep(0.5)
            print("non-daemon thread joined", flush=True)

        def fails():
            raise ValueError("step failed on purpose")

        def atexit_step():
            # multiprocessing's own hook has not run yet: the daemon helper still lives.
            print("atexit step, helper alive:", helper.exitcode is None, flush=True)

        _runtime.at_exit("threads", "first threads step", lambda: print("threads step", flush=True))
        _runtime.at_exit("atexit", "a failing step", fails)
        _runtime.at_exit("atexit", "the atexit step", atexit_step)
        _runtime.at_exit("atexit", "the atexit step", lambda: print("registered twice"))
        mp.log_to_stderr(40)  # re-registers multiprocessing's exit hook after ours
        threading.Thread(target=joined).start()
        print("main returns", flush=True)
    """
)


@pytest.mark.timeout(60)
def test_the_exit_sequence_runs_its_phases_in_order_and_logs_a_failed_step(
    tmp_path: Path,
) -> None:
    script = tmp_path / "owner.py"
    script.write_text(EXIT_SEQUENCE)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=50)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines == [
        "main returns",
        "threads step",
        "non-daemon thread joined",
        "atexit step, helper alive: True",
    ], proc.stdout + proc.stderr
    assert "at interpreter exit: the step 'a failing step' failed" in proc.stderr
    assert "ValueError: step failed on purpose" in proc.stderr


@pytest.mark.timeout(60)
def test_a_forked_child_runs_the_fork_steps_and_hears_no_parent_subscriber() -> None:
    told: list[tuple[object, ...]] = []
    ran: list[str] = []

    def subscriber(*event: object) -> None:
        told.append(event)

    _runtime.subscribe(_runtime.STOPPING, subscriber)
    _runtime.at_fork_in_child("test: first", lambda: ran.append("first"))
    _runtime.at_fork_in_child("test: second", lambda: ran.append("second"))
    try:
        pid = os.fork()
        if pid == 0:  # the child: the steps ran, in order; the parent's subscriber is gone
            ok = ran[-2:] == ["first", "second"] and (
                _runtime.publish(_runtime.STOPPING, 1, 2) == 0 and not told
            )
            os._exit(0 if ok else 3)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        # The twin: in the parent the subscriber still hears it.
        assert _runtime.publish(_runtime.STOPPING, 1, 2) >= 1
        assert told == [(1, 2)]
        assert ran == []
    finally:
        _runtime.unsubscribe(_runtime.STOPPING, subscriber)
        with _runtime._lock:
            _runtime._fork_steps[:] = [
                s for s in _runtime._fork_steps if not s[0].startswith("test: ")
            ]


def test_a_subscriber_that_raises_is_logged_and_the_others_are_still_told(
    caplog: pytest.LogCaptureFixture,
) -> None:
    told: list[float] = []

    def broken(when: float) -> None:
        raise OSError("the sidecar's socket is closed")

    _runtime.subscribe(_runtime.STOP_SURVIVED, broken)
    _runtime.subscribe(_runtime.STOP_SURVIVED, told.append)
    try:
        with caplog.at_level(logging.ERROR, logger="healthkit"):
            assert _runtime.publish(_runtime.STOP_SURVIVED, 12.5) == 2
    finally:
        _runtime.unsubscribe(_runtime.STOP_SURVIVED, broken)
        _runtime.unsubscribe(_runtime.STOP_SURVIVED, told.append)
    assert told == [12.5]
    [record] = [r for r in caplog.records if "stop survived" in r.getMessage()]
    assert record.levelno == logging.ERROR and "broken" in record.getMessage()
    assert record.exc_info is not None and "socket is closed" in str(record.exc_info[1])
