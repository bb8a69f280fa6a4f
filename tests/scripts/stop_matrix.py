"""The group-stop matrix: owners of watched helpers stopped by a signal to their whole process
group (torchrun's ``killpg(SIGTERM)``, a terminal's Ctrl-C), and the twin where only one
helper is stopped. Used by the test suite (a few runs per cell) and by ``scripts/soak``
(the full counts).

Each run starts ``stop_owner.py`` in its own session (as torchrun starts a worker), waits for
it to arm, signals the group (or one helper) and reads how it ended. Runs of a cell go in
parallel batches: most of a run is waiting.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import healthkit as hk

OWNER = str(Path(__file__).with_name("stop_owner.py"))
START_METHODS = ("fork", "spawn", "forkserver")
MODES = ("thread", "sidecar")
STOPS = ("term", "int")
CLEANUPS = (0.0, 0.2, 10.0)


@dataclass
class Cell:
    mode: str
    start_method: str
    stop: str  # "term" (group SIGTERM, handler) | "int" (group SIGINT) | "helper-alone"
    cleanup: float

    def name(self) -> str:
        return f"{self.stop}/{self.start_method}/cleanup={self.cleanup:g}s/{self.mode}"


@dataclass
class CellResult:
    cell: Cell
    runs: int = 0
    fired: int = 0
    not_fired: int = 0
    failures: list[str] = field(default_factory=list)  # runs that broke the expectation
    seconds: float = 0.0

    @property
    def expect_fire(self) -> bool:
        return self.cell.stop == "helper-alone"

    @property
    def ok(self) -> bool:
        return not self.failures


class _Run:
    def __init__(self, cell: Cell, workdir: str, index: int) -> None:
        self.cell = cell
        self.error_file = os.path.join(workdir, f"error-{index}.json")
        stop = "term" if cell.stop == "helper-alone" else cell.stop
        self.proc = subprocess.Popen(
            [
                sys.executable, OWNER, "--mode", cell.mode, "--start-method",
                cell.start_method, "--stop", stop, "--cleanup", str(cell.cleanup),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # as torchrun starts each worker
            env={**os.environ, "TORCHELASTIC_ERROR_FILE": self.error_file},
        )  # fmt: skip
        self.pids: list[int] = []

    def wait_ready(self, timeout: float = 120) -> None:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                return
            if line.startswith("READY"):
                self.pids = [int(x) for x in line.split()[1:] if x != "0"]
                return

    def stop(self) -> None:
        if not self.pids:
            return
        if self.cell.stop == "helper-alone":
            os.kill(self.pids[0], signal.SIGTERM)  # only that helper: someone stopped it
        else:
            sig = signal.SIGTERM if self.cell.stop == "term" else signal.SIGINT
            os.killpg(self.proc.pid, sig)  # the owner leads its own group

    def finish(self, timeout: float) -> tuple[bool, str]:
        """(fired, description) once the owner has ended; strays are killed by pidfd."""
        try:
            _out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _out, err = self.proc.communicate()
            _end(self.pids)
            return False, f"owner did not end within {timeout:.0f}s; stderr: {err[-500:]}"
        stray = _end(self.pids)
        fired = os.path.exists(self.error_file)
        rc = self.proc.returncode
        desc = f"rc={rc} error_file={fired} strays={stray} stderr={err.strip()[-400:]!r}"
        if fired or rc != 0:
            fired = True
        if stray:
            return fired, "helpers left running: " + desc
        return fired, desc


def _end(pids: Iterable[int]) -> list[int]:
    """Let what a run left behind end by itself for 10 s, then kill it with the product's own
    ladder (by pidfd, never a recycled pid); return the pids that had to be killed."""
    report = hk.stop(pids, request=lambda: None, grace=10, term_timeout=0, kill_timeout=10)
    return [*report.terminated, *report.killed, *report.survivors]


def run_cell(cell: Cell, runs: int, *, parallel: int = 4) -> CellResult:
    result = CellResult(cell)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hk-stop-") as workdir:
        index = 0
        while index < runs:
            batch = [_Run(cell, workdir, index + i) for i in range(min(parallel, runs - index))]
            index += len(batch)
            for r in batch:
                r.wait_ready()
            time.sleep(0.05)  # let every watcher block in its wait
            for r in batch:
                r.stop()
            for r in batch:
                fired, desc = r.finish(timeout=cell.cleanup + 60)
                result.runs += 1
                if fired:
                    result.fired += 1
                else:
                    result.not_fired += 1
                broke = fired != result.expect_fire or "left running" in desc
                if not r.pids:
                    broke, desc = True, "owner never reported READY: " + desc
                if broke:
                    result.failures.append(desc)
    result.seconds = time.monotonic() - t0
    return result


def run_cells_together(cells: list[Cell], runs: int) -> list[CellResult]:
    """Every run of every cell in one parallel batch (for the long-cleanup cells, where
    each run is mostly waiting)."""
    results = [CellResult(c) for c in cells]
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hk-stop-") as workdir:
        batch = [
            (res, _Run(res.cell, workdir, i * runs + k))
            for i, res in enumerate(results)
            for k in range(runs)
        ]
        for _, r in batch:
            r.wait_ready()
        time.sleep(0.05)
        for _, r in batch:
            r.stop()
        for res, r in batch:
            fired, desc = r.finish(timeout=res.cell.cleanup + 60)
            res.runs += 1
            res.fired += fired
            res.not_fired += not fired
            if fired != res.expect_fire or "left running" in desc or not r.pids:
                res.failures.append(desc)
    for res in results:
        res.seconds = time.monotonic() - t0
    return results


def all_cells() -> list[Cell]:
    cells = [
        Cell(mode, sm, stop, cleanup)
        for stop in STOPS
        for sm in START_METHODS
        for cleanup in CLEANUPS
        for mode in MODES
    ]
    cells += [Cell(mode, sm, "helper-alone", 0.0) for sm in START_METHODS for mode in MODES]
    return cells


def _print(res: CellResult) -> None:
    verdict = "ok" if res.ok else f"BROKEN ({len(res.failures)})"
    print(
        f"{res.cell.name():45s} runs={res.runs:4d} fired={res.fired:4d} "
        f"{res.seconds:6.1f}s {verdict}",
        flush=True,
    )


def main(argv: list[str]) -> int:
    """``stop_matrix.py RUNS LONG_RUNS OUT.json``: every cell, RUNS runs (LONG_RUNS for the
    10 s cleanup cells); writes the counts and prints one line per cell."""
    runs, long_runs, out = int(argv[0]), int(argv[1]), argv[2]
    results = []
    cells = all_cells()
    long_cells = [c for c in cells if c.cleanup >= 10]
    for cell in cells:
        if cell.cleanup >= 10:
            continue
        results.append(run_cell(cell, runs, parallel=4))
        _print(results[-1])
    for stop in STOPS:  # the 10 s cells: each stop's six cells together, LONG_RUNS each
        group = [c for c in long_cells if c.stop == stop]
        for res in run_cells_together(group, long_runs):
            results.append(res)
            _print(res)
    Path(out).write_text(

        json.dumps(
            [{**asdict(r.cell), "runs": r.runs, "fired": r.fired, "failures": r.failures,
              "seconds": round(r.seconds, 1)} for r in results],
            indent=1,
        )
    )  # fmt: skip
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
