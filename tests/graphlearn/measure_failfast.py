"""Measure how fast the owning rank ends after its GL server is SIGKILLed mid-sampling.

    .venv-glt/bin/python tests/graphlearn/measure_failfast.py [RUNS]

The owner (scripts/gl_owner.py sample-loop) calls ``sampler.get()`` in a loop in its main
thread, so the kill nearly always lands during a GL call, which then holds the GIL through
GL's retries. Time = from ``kill -9 <server>`` (this process) to the owner's exit (its pidfd).
Not a test: the figures go into docs/graphlearn.md.
"""

from __future__ import annotations

import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gl_procs import Owner

CONFIGS = [
    ("sidecar, GL default retries", ["--mode", "sidecar"]),
    ("thread + shorten_client_retries(2)", ["--mode", "thread", "--shorten", "2"]),
    ("thread + shorten_client_retries(1)", ["--mode", "thread", "--shorten", "1"]),
    ("sidecar + shorten_client_retries(2)", ["--mode", "sidecar", "--shorten", "2"]),
    ("thread, GL default retries (cap 30 s)", ["--mode", "thread"]),
]


def once(args: list[str], cap: float) -> tuple[float, int | None, bool]:
    with tempfile.TemporaryDirectory() as d:
        owner = Owner(Path(d), "sample-loop", *args)
        owner.wait_ready()
        time.sleep(0.5)
        t0 = time.monotonic()
        os.kill(owner.server, signal.SIGKILL)
        try:
            owner.proc.wait(cap)
        except Exception:
            pass
        elapsed = time.monotonic() - t0
        rc, _, err = owner.finish(timeout=0)
        return elapsed, rc, "was killed by SIGKILL" in err


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    for label, args in CONFIGS:
        n = 1 if "cap" in label else runs
        res = [once(args, 30.0) for _ in range(n)]
        times = sorted(t for t, _, _ in res)
        print(
            f"{label:40s} n={n} median={statistics.median(times):.3f}s max={times[-1]:.3f}s "
            f"rc={sorted({rc for _, rc, _ in res}, key=str)} "
            f"diagnosed={sum(d for _, _, d in res)}/{n}",
            flush=True,
        )


if __name__ == "__main__":
    main()
