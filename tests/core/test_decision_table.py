"""One decision table, played against both watcher modes: the watcher thread and the sidecar
must fire on exactly the same endings, including the ones the sidecar cannot see for itself
(the owner reaped the helper first, the helper had ended before it was watched, SIGCHLD is
ignored and the kernel threw the status away)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import healthkit as hk
from healthkit.lowlevel import Verdict, decide

OWNER = str(Path(__file__).parent.parent / "scripts" / "owner.py")

# scenario -> (extra owner args, fires?, words the failure report must contain)
TABLE: dict[str, tuple[list[str], bool, tuple[str, ...]]] = {
    "allowed-exit0-joined": ([], False, ()),
    "allowed-exit0-before-watch": ([], False, ()),
    "until-exit0": (
        [], True, ("exited with code 0 while it was expected to run", "cause: returned early")
    ),
    "until-exit0-warn": ([], False, ()),
    "exit3-joined": ([], True, ("exited with code 3",)),
    "sigkill-joined": ([], True, ("was killed by SIGKILL",)),
    "sigchld-ignored-allowed-exit0": ([], False, ()),
    "sigchld-ignored-until-exit0": ([], True, ("unknown status", "SIGCHLD is set to SIG_IGN")),
}


def _run(scenario: str, mode: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], bool]:
    err = tmp_path / f"{scenario}-{mode}.json"
    extra = TABLE[scenario][0]
    proc = subprocess.run(
        [sys.executable, OWNER, scenario, "--mode", mode, *extra],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "TORCHELASTIC_ERROR_FILE": str(err)},
    )
    _end_strays(proc.stdout)
    fired = err.exists()
    if fired:
        report = json.loads(err.read_text())["message"]["extraInfo"]["py_callstack"]
        for word in TABLE[scenario][2]:
            assert word in report, f"{word!r} not in {report!r}"
    return proc, fired


def _end_strays(stdout: str) -> None:
    for line in stdout.splitlines():
        if line.startswith("READY"):
            pids = [int(x) for x in line.split()[1:] if x != "0"]
            hk.stop(pids, request=lambda: None, grace=10, term_timeout=0, kill_timeout=10)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["thread", "sidecar"])
@pytest.mark.parametrize("scenario", list(TABLE))
def test_both_modes_fire_on_the_same_endings(scenario: str, mode: str, tmp_path: Path) -> None:
    fires = TABLE[scenario][1]
    for _ in range(int(os.environ.get("HEALTHKIT_MATRIX_RUNS", "3"))):  # races: repeat
        proc, fired = _run(scenario, mode, tmp_path)
        assert fired is fires, (proc.returncode, proc.stderr)
        if fires:
            assert "SURVIVED" not in proc.stdout
            expected_rc = 1 if mode == "thread" else -signal.SIGTERM
            assert proc.returncode == expected_rc, proc.stderr
        else:
            assert "SURVIVED" in proc.stdout, proc.stderr
            assert proc.returncode == 0, proc.stderr
            assert "ERROR" not in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    ("rc", "on_clean_exit", "stopping", "verdict"),
    [
        (-15, "fail", True, Verdict.IGNORE),  # the helper's share of a group stop
        (-2, "fail", True, Verdict.IGNORE),
        (1, "fail", True, Verdict.IGNORE),  # a forked helper ran the inherited handler
        (0, "fail", True, Verdict.IGNORE),
        (-9, "fail", True, Verdict.FIRE),  # SIGKILL is never a stop request
        (-11, "ignore", True, Verdict.FIRE),  # nor a crash
        (None, "fail", False, Verdict.FIRE),  # unknown: it ended, that is enough
        (None, "warn", False, Verdict.WARN),
        (None, "ignore", False, Verdict.WARN),  # allowed to finish: nothing known wrong
        (None, "fail", True, Verdict.IGNORE),
    ],
)
def test_decide_with_stops_and_unknown_statuses(
    rc: int | None, on_clean_exit: str, stopping: bool, verdict: Verdict
) -> None:
    status = hk.ExitStatus(rc, "fabricated")
    got = decide(
        status,
        armed=True,
        on_clean_exit=on_clean_exit,  # type: ignore[arg-type]
        owner_stopping=stopping,
    )
    assert got is verdict
