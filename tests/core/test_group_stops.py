"""Stops are not failures, and not a state either. An owner stopped by a signal to its whole
process group (torchrun's killpg(SIGTERM), a terminal's Ctrl-C) never fires, whatever its
helpers die of and however the owner lives through the stop (its main thread in an
uninterruptible read, an asyncio loop holding the signal wakeup fd, uvloop taking it for good,
a ``sigwait``, a signal storm (SIGALRM, or SIGCHLD from hundreds of short-lived children)
filling the wakeup socket while a C call holds the GIL, two sidecars, a handler that stops a
helper itself, helpers in their own sessions stopped one by one); an owner that ignores the
stop carries on, so the helpers it ended are reported; a helper stopped alone still fires;
and an owner that survives its stop reports a helper that dies during it once the stop's
grace is over. The suite runs every cell a few times; the full
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
    SURVIVED_GRACE,
    Cell,
    declared_cells,
    late_observation_cells,
    mask_cells,
    owner_cells,
    run_cell,
    run_cells_together,
    survived_cells,
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


@pytest.mark.timeout(600)
def test_owners_that_live_through_a_stop_unusually_never_fire_and_their_twins_do() -> None:
    """Each cell's runs and every cell at once: the owners mostly wait."""
    cells = owner_cells()
    calm = [c for c in cells if c.owner != "storm-chld"]
    results = run_cells_together(calm, runs=max(1, RUNS - 1), parallel=24)
    # Each SIGCHLD-storm owner forks hundreds of children a second: once each, four at a
    # time, so the storms do not starve the other lanes of a loaded suite run (the soak runs
    # the full counts).
    storms = [c for c in cells if c.owner == "storm-chld"]
    results += run_cells_together(storms, runs=1, parallel=4)
    broken = {r.cell.name(): r.failures for r in results if not r.ok}
    assert not broken, broken
    twins = [r for r in results if r.cell.expect_fire]
    assert twins and all(r.fired == r.runs for r in twins)
    stops = [r for r in results if not r.cell.expect_fire]
    assert len(stops) >= 10 and all(r.fired == 0 for r in stops)
    # The owners whose stop evidence a library takes away from the wakeup fd, both modes.
    for owner in ("uvloop", "uvloop-signal", "sigwait", "storm-alrm", "storm-chld"):
        assert {r.cell.mode for r in stops if r.cell.owner == owner} == set(MODES), owner
    # A SIGCHLD storm is no stop: a helper's exit 1 in it fires, both modes.
    storm = [r for r in twins if r.cell.owner == "storm-chld" and r.cell.how == "helper-fails"]
    assert {r.cell.mode for r in storm} == set(MODES) and all(r.late_s for r in storm)
    ignored = [r for r in results if r.cell.owner == "sig-ign" and r.cell.stop == "term"]
    assert ignored and all(r.fired == r.runs for r in ignored)  # the owner carries on


@pytest.mark.timeout(600)
def test_an_owner_that_survives_its_stop_reports_a_helper_that_died_during_it() -> None:
    """SIGINT, SIGHUP or SIGTERM to the owner alone, handled; then a helper exits 1 or 3, or
    dies of SIGTERM or SIGKILL: every run fires. A stop-like death waits for the stop's grace
    (never fires before it); SIGKILL fires at once."""
    results = run_cells_together(survived_cells(), runs=max(1, RUNS - 1), parallel=24)
    broken = {r.cell.name(): r.failures for r in results if not r.ok}
    assert not broken, broken
    assert all(r.fired == r.runs > 0 for r in results)
    for r in results:
        # Fired after the grace, and not long after it (a bound that proves "then", not speed).
        assert all(late < SURVIVED_GRACE + 10 for late in r.late_s), (r.cell.name(), r.late_s)


@pytest.mark.timeout(300)
def test_a_declared_survivor_is_told_at_once_and_a_mask_without_a_stop_defers_nothing() -> None:
    """An owner that says it carries on after its stop (``note_stop_survived()``): a helper's
    death after that, or one the stop deferred before it, fires at once (the default 30 s
    grace notwithstanding). A thread that blocks SIGINT and SIGTERM after ``arm()`` with no
    stop signal ever sent: a helper's exit 1 fires at once, and the diagnosis does not say the
    owner was being stopped; the twins, a group stop during that mask, never fire. Both
    modes."""
    # The mask cells first, on their own: each death must come while its owner's mask is
    # still held (the declared cells' stops take seconds in turn).
    results = run_cells_together(mask_cells(), runs=1, parallel=24)
    results += run_cells_together(declared_cells(), runs=1, parallel=24)
    broken = {r.cell.name(): r.failures for r in results if not r.ok}
    assert not broken, broken
    for r in results:
        assert r.fired == (r.runs if r.cell.expect_fire else 0), r.cell.name()
    assert {r.cell.mode for r in results if not r.cell.expect_fire} == set(MODES)
    assert all(r.late_s for r in results if r.cell.at_once)


@pytest.mark.timeout(300)
def test_a_death_seen_late_is_judged_at_the_moment_it_happened() -> None:
    """The owner's main thread holds the GIL for 3 s in a C call; a helper exits 1 at 0.5 s
    and the group gets SIGTERM at 1.5 s: the death came first, and fires (thread mode: the
    witness stamps it on its own clock; the sidecar has its own). The twin: the group
    SIGTERM alone, which the helpers die of, while the GIL is held: never fires."""
    results = run_cells_together(late_observation_cells(), runs=max(1, RUNS - 1), parallel=24)
    broken = {r.cell.name(): r.failures for r in results if not r.ok}
    assert not broken, broken
    for r in results:
        assert r.fired == (r.runs if r.cell.expect_fire else 0), r.cell.name()
    assert {r.cell.mode for r in results if r.cell.expect_fire} == set(MODES)
