"""Stops are not failures: an owner stopped by a signal to its whole process group (torchrun's
killpg(SIGTERM), a terminal's Ctrl-C) never fires, whatever its helpers die of; a helper
stopped alone still fires. The suite runs every cell of the matrix a few times; the full
counts (100 runs per cell) run from scripts/soak."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "scripts"))

from stop_matrix import (
    CLEANUPS,
    MODES,
    START_METHODS,
    STOPS,
    Cell,
    run_cell,
    run_cells_together,
)

SHORT = [c for c in CLEANUPS if c < 10]
# Runs per cell: 3 in the main tier, 1 per extra Python version (scripts/dists.sh).
RUNS = int(os.environ.get("HEALTHKIT_MATRIX_RUNS", "3"))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("cleanup", SHORT)
@pytest.mark.parametrize("start_method", START_METHODS)
@pytest.mark.parametrize("stop", STOPS)
def test_a_stop_sent_to_the_whole_group_never_fires(
    stop: str, start_method: str, cleanup: float, mode: str
) -> None:
    res = run_cell(Cell(mode, start_method, stop, cleanup), runs=RUNS, parallel=3)
    assert res.runs == RUNS
    assert res.fired == 0 and res.ok, res.failures


@pytest.mark.timeout(300)
def test_a_group_stop_during_a_ten_second_checkpoint_never_fires() -> None:
    cells = [Cell(m, sm, st, 10.0) for st in STOPS for sm in START_METHODS for m in MODES]
    results = run_cells_together(cells, runs=1)
    broken = {r.cell.name(): r.failures for r in results if not r.ok or r.fired}
    assert not broken, broken
    assert sum(r.runs for r in results) == len(cells)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("start_method", START_METHODS)
def test_a_helper_stopped_alone_still_fires(start_method: str, mode: str) -> None:
    res = run_cell(Cell(mode, start_method, "helper-alone", 0.0), runs=RUNS, parallel=3)
    assert res.fired == RUNS and res.ok, res.failures
