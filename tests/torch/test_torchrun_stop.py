"""torchrun stopping a healthy job is never reported as a helper failure: the agent SIGTERMs
each worker's process group, so every rank's helper dies of the same signal while the rank
checkpoints in its handler. No rank may fire, and no error file may blame a helper."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from linereader import LineReader
from testutil import free_port

pytest.importorskip("torch")

import healthkit as hk

JOB = str(Path(__file__).parent.parent / "scripts" / "torchrun_stop_job.py")


def run_and_stop(
    log_dir: Path, mode: str, start_method: str, extra: tuple[str, ...] = ()
) -> tuple[int, str, list[int]]:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "torch.distributed.run", "--nnodes=1",
            "--nproc_per_node=2", "--rdzv_backend=c10d",
            f"--rdzv_endpoint=127.0.0.1:{port}", "--rdzv_id=hkstop", "--max_restarts=0",
            f"--log-dir={log_dir}", JOB, "--mode", mode, "--start-method", start_method,
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    out = LineReader(proc.stdout)
    helpers = [int(m.group(1)) for m in out.matches(r"HELPER \d+ (\d+)", 2, timeout=120)]
    try:
        assert len(helpers) == 2, "\n".join(out.lines)
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)  # stop the job: the agent SIGTERMs every worker group
        proc.wait(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # our own session: torchrun and its ranks
            proc.wait()
        hk.stop(helpers, request=lambda: None, grace=10, kill_after=0, kill_timeout=10)
        text = out.rest()
        proc.stdout.close()
    return proc.returncode, text, helpers


def _timeout() -> float:
    """Five minutes per run: a run takes about 15 s, so only a hang comes near it."""
    return 300.0 * int(os.environ.get("HEALTHKIT_SOAK_TORCHRUN_RUNS", "1"))


@pytest.mark.timeout(_timeout())
@pytest.mark.parametrize(
    ("mode", "start_method", "extra"),
    [
        ("thread", "fork", ()),
        ("sidecar", "spawn", ()),
        # ranks whose asyncio loop installs its SIGTERM handler after arm()
        ("thread", "fork", ("--asyncio",)),
        ("sidecar", "fork", ("--asyncio",)),
    ],
)
def test_torchrun_stopping_a_healthy_job_fires_nothing(
    mode: str, start_method: str, extra: tuple[str, ...], tmp_path: Path
) -> None:
    runs = int(os.environ.get("HEALTHKIT_SOAK_TORCHRUN_RUNS", "1"))  # scripts/soak: 10 per cell
    for i in range(runs):
        log_dir = tmp_path / f"logs-{i}"
        _, out, helpers = run_and_stop(log_dir, mode, start_method, extra)
        assert "Received" in out and "SIGTERM" in out, out  # torchrun did stop the job
        # A helper's death may be noted at WARNING as part of the stop; nothing fires.
        assert "ERROR" not in out and "still running after the stop's grace" not in out, out
        for line in out.splitlines():
            if "healthkit" in line:
                assert "taken as its share of this process's stop" in line, out
        blamed = [ln for ln in out.splitlines() if "taken as its share" not in ln]
        for pid in helpers:
            assert not any(f"(pid {pid})" in ln for ln in blamed), out
        error_files = list(log_dir.rglob("error.json"))
        assert error_files == [], [p.read_text() for p in error_files]
