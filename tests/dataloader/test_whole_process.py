"""What a whole training process does with a watched loader: its normal exit with persistent
workers still running, a Ctrl-C or a launcher's SIGTERM of its process group (all silent),
and its death by a killed worker (the error, and torchrun's error file, carry the line)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.timeout(90)


def reported(err: str) -> bool:
    """Did anything blame a worker (healthkit's error or log line, or torch's own)?"""
    return any(s in err for s in ("DataLoaderWorkerError", "DataLoader worker ",
                                  "raised at the DataLoader's next batch"))


def start(mode: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(HERE / "dl_job.py"), mode],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, **env}, start_new_session=True,
    )


def ready(proc: subprocess.Popen[str]) -> list[int]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("READY"), (line, proc.stderr.read() if proc.stderr else "")
    return [int(p) for p in line.split()[1:]]


def finish(proc: subprocess.Popen[str], timeout: float = 60) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return proc.returncode, err


def test_persistent_workers_ended_by_interpreter_exit_are_not_reported() -> None:
    proc = start("exit-persistent")
    ready(proc)
    code, err = finish(proc)
    assert code == 0, err
    assert not reported(err), err


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_of_the_whole_process_group_is_not_reported(sig: signal.Signals) -> None:
    """Ctrl-C (SIGINT to the foreground group) or a launcher's killpg(SIGTERM): the workers
    end with their owner; the owner ends of the signal, and nothing blames a worker."""
    proc = start("loop")
    ready(proc)
    time.sleep(0.3)
    os.killpg(proc.pid, sig)
    code, err = finish(proc)
    assert code != 0
    assert not reported(err), err
    if sig == signal.SIGINT:
        assert "KeyboardInterrupt" in err, err


def test_a_killed_worker_ends_the_process_with_the_line_in_torchruns_error_file(
    tmp_path: Path,
) -> None:
    """The twin: the same loop, worker 1 SIGKILLed; the uncaught DataLoaderWorkerError ends
    the process, and TORCHELASTIC_ERROR_FILE (torchrun's root cause) carries the line."""
    error_file = tmp_path / "error.json"
    proc = start("kill-worker", TORCHELASTIC_ERROR_FILE=str(error_file))
    pids = ready(proc)
    code, err = finish(proc)
    assert code == 1, err
    line = f"DataLoader worker 1 (pid {pids[1]}) was killed by SIGKILL: possibly the OOM killer"
    assert f"healthkit_torch.DataLoaderWorkerError: {line}" in err, err
    payload = json.loads(error_file.read_text())
    assert line in payload["message"]["message"], payload
    assert "num_workers=2" in payload["message"]["extraInfo"]["py_callstack"], payload
