"""``healthkit.lowlevel.EndingClassifier``: the watchdog's firing rule asked about one ending,
with real signals. Each case runs as a script in its own session (a group stop must not reach
the test runner): an owner that handles SIGTERM and goes on, and a helper in its group.

- a SIGTERM to the whole group (another process sends it, as torchrun does): the helper's
  death is its share of the stop, deferred, not a failure; once the stop's grace is over with
  the owner still running, the same death is a failure after all (deferred, never dropped);
- the same SIGTERM to the helper alone, nothing stopping the owner: a failure;
- a helper SIGKILLed while its group is being stopped: a failure, stop or not;
- a helper ended by ``healthkit.stop()``: not a failure.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from healthkit import ProcessWatch, lowlevel

GRACE_S = 1.0


def _helper(ignore_term: bool = False) -> subprocess.Popen[bytes]:
    code = "import signal, time\n"
    if ignore_term:
        code += "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    code += "print('up', flush=True)\ntime.sleep(120)\n"
    helper = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert helper.stdout is not None
    assert helper.stdout.readline() == b"up\n"  # its handlers are in place
    return helper


def _group_stop() -> None:
    """SIGTERM to this process's group, from another process (in its own session)."""
    subprocess.run(
        [sys.executable, "-c", "import os, signal, sys; os.killpg(int(sys.argv[1]), 15)",
         str(os.getpgrp())],
        start_new_session=True, check=True, timeout=60,
    )  # fmt: skip


def owner(case: str) -> None:
    """The script side: print one JSON line per decision."""
    import healthkit

    stops: list[float] = []
    signal.signal(signal.SIGTERM, lambda s, f: stops.append(time.monotonic()))
    classifier = lowlevel.EndingClassifier("test helpers", stop_grace=GRACE_S)
    helper = _helper(ignore_term=case == "kill-in-stop")
    out: dict[str, object] = {}
    with ProcessWatch(helper, name="helper") as watch:
        if case == "group":
            _group_stop()
        elif case == "alone":
            os.kill(helper.pid, signal.SIGTERM)
        elif case == "kill-in-stop":
            _group_stop()  # the helper ignores it
            os.kill(helper.pid, signal.SIGKILL)
        elif case == "healthkit-stop":
            healthkit.stop([helper], grace=0.0, kill_after=5.0)
        watch.wait(30)
        d = classifier.classify(watch)
        out["first"] = [d.verdict.name, d.reason, d.until is not None]
        if case == "group":
            time.sleep(GRACE_S + 0.2)  # the owner lives on past the stop's grace
            d = classifier.classify(watch)
            out["after_grace"] = [d.verdict.name, d.reason]
            out["settled"] = classifier.classify(watch) == d
    helper.wait()
    classifier.close()
    out["stops_seen"] = len(stops)
    print("RESULT " + json.dumps(out), flush=True)


def _run(case: str) -> dict[str, object]:
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), case],
        capture_output=True, text=True, timeout=90, start_new_session=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )  # fmt: skip
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout + proc.stderr
    result: dict[str, object] = json.loads(lines[-1][len("RESULT ") :])
    result["log"] = proc.stderr
    return result


@pytest.mark.timeout(120)
def test_a_helper_ended_by_a_group_stop_is_deferred_then_a_failure_if_the_owner_lives_on() -> None:
    r = _run("group")
    assert r["stops_seen"] == 1
    verdict, reason, has_until = r["first"]  # type: ignore[misc]
    assert verdict == "DEFER" and has_until, r
    assert "taken as its share of this process's stop (SIGTERM received" in reason
    assert "taken as its share of this process's stop" in str(r["log"])  # said once, WARNING
    verdict, reason = r["after_grace"]  # type: ignore[misc]
    assert verdict == "FIRE", r
    assert "still running after the stop" in reason
    assert r["settled"] is True


@pytest.mark.timeout(120)
def test_the_same_sigterm_to_the_helper_alone_is_a_failure() -> None:
    r = _run("alone")
    assert r["stops_seen"] == 0
    assert r["first"][0] == "FIRE" and r["first"][1] == "abnormal exit", r  # type: ignore[index]


@pytest.mark.timeout(120)
def test_a_helper_sigkilled_during_a_group_stop_is_a_failure() -> None:
    r = _run("kill-in-stop")
    assert r["stops_seen"] == 1
    assert r["first"][0] == "FIRE", r  # type: ignore[index]


@pytest.mark.timeout(120)
def test_a_helper_ended_by_healthkit_stop_is_not_a_failure() -> None:
    r = _run("healthkit-stop")
    assert r["first"][0] == "IGNORE" and "healthkit.stop()" in r["first"][1], r  # type: ignore[index]


def test_bad_input_to_classify_is_refused_naming_it(child: subprocess.Popen[bytes]) -> None:
    classifier = lowlevel.EndingClassifier()
    try:
        with pytest.raises(TypeError) as info:
            classifier.classify(os.getpid())  # type: ignore[arg-type]
        assert info.value.argument == "watch"  # type: ignore[attr-defined]
        with ProcessWatch(child) as watch:
            with pytest.raises(ValueError, match="on_clean_exit"):
                classifier.classify(watch, on_clean_exit="never")  # type: ignore[arg-type]
            assert classifier.classify(watch).verdict is lowlevel.Verdict.KEEP_WATCHING
    finally:
        classifier.close()


if __name__ == "__main__":
    owner(sys.argv[1])
