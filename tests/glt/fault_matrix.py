"""The fault matrix of docs/benchmarks-glt.md: each fault run N times in its own process
group on the current environment's graphlearn-torch, printed as a markdown table and, with
``--save``, kept as raw runs that ``benchmarks/glt_bench.py`` renders into its page
(``scripts/bench`` runs it on both builds).

    .venv-glt/bin/python tests/glt/fault_matrix.py 3     # GLT 0.2.4, torch 2.3
    .venv-glt28/bin/python tests/glt/fault_matrix.py 3   # GLT from source, torch 2.8

"Time" is from the fault (the SIGKILL, the worker's raise or report, the ``shutdown()``
call) to the error reaching the caller (to the workers being gone for a killed trainer, to
``shutdown()`` returning), teardown of the other workers included. "Left over" counts the
processes of the run's group alive after it ended and the SysV segments its processes
created that were still there (the runner removes them, so a failing run leaves nothing).
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import glt_scenarios as sc


def _scenario(name: str, args: list[str], time_key: str) -> Callable[[], dict[str, Any]]:
    def run() -> dict[str, Any]:
        r = sc.run_scenario(name, args, timeout=150)
        res = r.results[-1] if r.results else {}
        return {
            "error": res.get("type", "none" if r.returncode == 0 else f"rc={r.returncode}"),
            "time": res.get(time_key),
            "procs": len(r.survivors) + len(res.get("children_left", [])),
            "segments": len(r.leaked_segments) + len(res.get("segments_left", [])),
            "hung": r.returncode is None,
        }

    return run


def _trainer(phase: str) -> Callable[[], dict[str, Any]]:
    def run() -> dict[str, Any]:
        r = sc.sigkill_trainer(phase, watch_s=30.0)
        gone = r.get("gone_after_s") or [None]
        return {
            "error": "(trainer gone)",
            "time": max(gone) if None not in gone else None,
            "procs": len(r.get("survivors", [])),
            "segments": len(r.get("segments_left", [])) + len(r.get("dev_shm_left", [])),
            "hung": "error" in r,
        }

    return run


FAULTS: list[tuple[str, Callable[[], dict[str, Any]]]] = [
    ("worker SIGKILLed during init (0.5 s after spawn)",
     _scenario("hk-init-sigkill", ["0.5"], "after_kill_s")),
    ("worker SIGKILLed at the init barrier (arrived, peer 20 s late)",
     _scenario("hk-init-sigkill-arrived", ["0.3"], "after_kill_s")),
    ("sampler factory raises during init (worker 1)",
     _scenario("hk-init-raise", [], "after_raise_s")),
    ("worker SIGKILLed mid-epoch (after batch 1, consumer paused 0.5 s)",
     _scenario("hk-epoch-sigkill", ["0.5", "0"], "after_kill_s")),
    ("sampling error in a live worker: default sampler, feature lookup",
     _scenario("hk-sampling-error", ["features"], "after_raise_s")),
    ("sampling error in a live worker: custom factory, `_sample_from_nodes` raises",
     _scenario("hk-sampling-error", ["nodes"], "after_raise_s")),
    ("trainer SIGKILLed mid-epoch: until both workers are gone",
     _trainer("epoch")),
    ("trainer SIGKILLed during init (workers in bring-up): until both are gone",
     _trainer("init")),
    ("`shutdown()` during an epoch, workers parked in `send()` (grace 0.5 s)",
     _scenario("hk-shutdown-mid-epoch", ["0.5"], "shutdown_s")),
]  # fmt: skip

#: Row names of runs saved before a fault was renamed, and its name now (the same scenario,
#: the same arguments): the page names each fault as :data:`FAULTS` does.
RENAMED_FAULTS = {
    "`shutdown()` during an epoch, workers parked in `send()` (stop_timeout 0.5 s)":
        "`shutdown()` during an epoch, workers parked in `send()` (grace 0.5 s)",
}  # fmt: skip


def measure(runs: int) -> dict[str, Any]:
    """Every fault ``runs`` times on this environment's graphlearn-torch: the raw runs."""
    import graphlearn_torch  # noqa: F401
    import healthkit_glt as hg
    import numpy
    import torch

    return {
        "command": f"{os.path.relpath(sys.executable)} tests/glt/fault_matrix.py {runs}",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "glt": hg.glt_version(),
        "software": f"graphlearn-torch {hg.glt_version()}, torch {torch.__version__}, "
        f"numpy {numpy.__version__}, Python {platform.python_version()}, CPU only",
        "runs": runs,
        "faults": [{"fault": name, "runs": [fn() for _ in range(runs)]} for name, fn in FAULTS],
    }


def markdown(saved: dict[str, Any]) -> list[str]:
    """The matrix of one build as a markdown table, from the raw runs of :func:`measure`."""
    lines = [
        f"- Command: `{saved['command']}`",
        f"- Date: {saved['date']}",
        f"- Software: {saved['software']}",
        "",
        "| fault | error raised | time to it (median) | runs | processes left | segments left |",
        "|---|---|---|---|---|---|",
    ]
    for row in saved["faults"]:
        results = row["runs"]
        errors = sorted({r["error"] for r in results})
        times = [r["time"] for r in results if r["time"] is not None]
        med = f"{statistics.median(times):.2f} s" if times else "n/a"
        each = ", ".join(f"{t:.2f}" for t in times)
        hung = sum(r["hung"] for r in results)
        err = ", ".join(f"`{e}`" if not e.startswith("(") else e for e in errors)
        if hung:
            err += f" ({hung} of {len(results)} runs hung)"
        name = RENAMED_FAULTS.get(row["fault"], row["fault"])
        lines.append(
            f"| {name} | {err} | {med} | {each} | {sum(r['procs'] for r in results)} "
            f"| {sum(r['segments'] for r in results)} |"
        )
    return lines


def main(argv: list[str]) -> int:
    import argparse
    import json

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", type=int, nargs="?", default=3, help="runs per fault")
    ap.add_argument("--save", help="also write the raw runs to this JSON file")
    args = ap.parse_args(argv)
    saved = measure(args.runs)
    if args.save:
        with open(args.save, "w") as f:
            json.dump(saved, f, indent=1)
    print("\n".join(markdown(saved)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
