"""The stop matrix: owners of watched helpers stopped the way launchers stop jobs, the owners
that survive a stop, and the twins in which only a helper is stopped. Used by the test suite
(a few runs per cell) and by ``scripts/soak`` (the full counts).

Each run starts ``stop_owner.py`` in its own session (as torchrun starts a worker), waits for
it to arm, stops it and reads how it ended. A cell says how:

- ``how="group"``: the stop signal to the owner's whole process group (torchrun's
  ``killpg(SIGTERM)``, a terminal's Ctrl-C): must never fire;
- ``how="owner-then-each"``: the stop signal to the owner, then to each helper in turn (they
  are in their own sessions), as systemd stops a unit: must never fire;
- ``stop="helper-alone"``: SIGTERM to one helper only, the owner untouched: must fire;
- ``how="owner-alone"``: the stop signal to the owner only, which handles it and carries on;
  then a helper dies (``death``): must fire, once the stop's grace is over;
- ``owner="sig-ign"``: a group stop that the owner ignores: the helpers die of it and the owner
  carries on: must fire, once the stop's grace is over;
- ``how="owner-declares"``: as ``owner-alone``, but the owner says it carries on
  (``note_stop_survived()``) before a helper dies: must fire at once, the default 30 s grace
  notwithstanding; ``how="owner-declares-late"``: a helper dies while the stop is under way
  (deferred), then the owner says it carries on: must fire at once;
- ``how="death-then-group"`` (``owner="gil-held"``): a helper exits 1, then the group gets
  SIGTERM, both while the owner's main thread holds the GIL: the death came first and must
  fire (the twin: the group stop alone, which the helpers die of, never fires);
- ``how="helper-fails"``: no stop at all; a helper exits 1: must fire at once (the twin of
  ``owner="mask-after-arm"``'s group stops: a mask without a stop signal defers nothing; and
  of ``owner="storm-chld"``'s: a SIGCHLD storm is no stop).

Runs go in parallel batches: most of a run is waiting.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent))

from linereader import LineReader
from testutil import portable_paths

import healthkit as hk

OWNER = str(Path(__file__).with_name("stop_owner.py"))
START_METHODS = ("fork", "spawn", "forkserver")
MODES = ("thread", "sidecar")
STOPS = ("term", "int")
CLEANUPS = (0.0, 0.2, 10.0)
SIGNALS = {"term": signal.SIGTERM, "int": signal.SIGINT, "hup": signal.SIGHUP}
# Owners that live through a stop in some unusual way (stop_owner.py --owner).
OWNERS = (
    "uninterruptible",
    "asyncio-after-arm",
    "asyncio-before-arm",
    "asyncio-finished",
    "two-sidecars",
    "handler-stops-helper",
    "own-session",
    "uvloop",
    "uvloop-signal",
    "sigwait",
    "storm-alrm",
    "storm-chld",
    "sig-ign",
)
DEATHS = ("exit1", "exit3", "sigterm", "sigkill")
SURVIVED_GRACE = 2.0  # --stop-grace of the owners that survive their stop
MASK_S = 6  # how long the mask-after-arm owner blocks SIGINT and SIGTERM
GIL_HELD_S = 3  # how long the gil-held owner's main thread holds the GIL once ready
#: storm-chld: the stop (or the death) comes this long after the storm's children were let
#: go, when the last of its 400 (one a millisecond) has exited and the wakeup socket is full
#: (it holds 278 one-byte writes), while the owner's C call still holds the GIL.
STORM_S = 0.45
#: Cells that must fire at once (no stop defers them; the owner runs on the default 30 s
#: stop grace): seconds from the death, or the declaration, to the error file. A bound that
#: proves "not deferred" (below the mask, far below the grace), not a speed.
AT_ONCE_S = 4.5
#: The same bound for storm-chld, whose C calls hold the GIL for up to three seconds at a
#: time (thread mode sees the death only when one returns): still far below the grace.
STORM_AT_ONCE_S = 10.0


@dataclass
class Cell:
    mode: str
    start_method: str
    stop: str  # "term" | "int" | "hup" (the stop signal) | "helper-alone"
    cleanup: float
    owner: str = "plain"
    how: str = "group"  # "group" | "owner-then-each" | "owner-alone"
    death: str = ""  # owner-alone: how a helper then ends (exit1, exit3, sigterm, sigkill)

    def name(self) -> str:
        stop = "none" if self.how == "helper-fails" else self.stop
        parts = [stop, self.start_method, f"cleanup={self.cleanup:g}s", self.mode]
        if self.owner != "plain":
            parts.insert(0, self.owner)
        if self.how != "group" and self.stop != "helper-alone":
            parts.insert(0, self.how + (f":{self.death}" if self.death else ""))
        return "/".join(parts)

    @property
    def expect_fire(self) -> bool:
        # An owner that ignores the stop carries on without the helpers the stop ended.
        return (
            self.stop == "helper-alone"
            or self.how
            in ("owner-alone", "owner-declares", "owner-declares-late", "helper-fails",
                "death-then-group")
            or self.owner == "sig-ign"
        )

    @property
    def at_once(self) -> bool:
        """Must fire within :data:`AT_ONCE_S` of the death (or of the declaration)."""
        return self.how in ("owner-declares", "owner-declares-late", "helper-fails")


@dataclass
class CellResult:
    cell: Cell
    runs: int = 0
    fired: int = 0
    not_fired: int = 0
    failures: list[str] = field(default_factory=list)  # runs that broke the expectation
    seconds: float = 0.0
    # owner-alone: seconds from the end of the stop's grace to the firing (error file written)
    late_s: list[float] = field(default_factory=list)

    @property
    def expect_fire(self) -> bool:
        return self.cell.expect_fire

    @property
    def ok(self) -> bool:
        return not self.failures


class _Run:
    def __init__(self, cell: Cell, workdir: str, index: int) -> None:
        self.cell = cell
        self.error_file = os.path.join(workdir, f"error-{index}.json")
        stop = "term" if cell.stop == "helper-alone" else cell.stop
        args = [
            sys.executable, OWNER, "--mode", cell.mode, "--start-method", cell.start_method,
            "--stop", stop, "--cleanup", str(cell.cleanup), "--owner", cell.owner,
        ]  # fmt: skip
        if cell.owner == "sig-ign":
            args += ["--stop-grace", str(SURVIVED_GRACE)]
        if cell.how == "owner-alone":
            args += ["--survive", "--stop-grace", str(SURVIVED_GRACE)]
        elif cell.how == "owner-declares":
            args += ["--survive", "--declare"]  # the default stop grace
        elif cell.how == "owner-declares-late":
            args += ["--survive", "--declare-on-usr2"]
        if cell.death in ("exit1", "exit3"):
            args += ["--helper-death", cell.death]
        if cell.owner == "mask-after-arm":
            args += ["--blocked", str(MASK_S)]
        if cell.owner == "gil-held":
            args += ["--blocked", str(GIL_HELD_S)]
        self.proc = subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # as torchrun starts each worker
            env={**os.environ, "TORCHELASTIC_ERROR_FILE": self.error_file},
        )
        assert self.proc.stdout is not None
        self.out = LineReader(self.proc.stdout)
        self.pids: list[int] = []
        self.grace_ends: float | None = None
        self.ready_at = 0.0
        self.in_mask = True  # mask-after-arm: the death came while the mask was surely held
        self.in_window = True  # gil-held: the death and the stop came while the GIL was held
        self.timers: list[threading.Thread] = []
        self.sent_at: float | None = None  # storm-chld: when the stop (or the death) was sent

    def wait_ready(self, timeout: float = 120) -> None:
        found = self.out.until(r"^READY ", timeout)
        self.ready_at = time.monotonic()
        if found is not None:
            line = found.string.split()
            self.pids = [int(x) for x in line[1 : 1 + self._helpers()]]

    def _helpers(self) -> int:
        return 2

    def stop(self) -> None:
        if not self.pids:
            return
        cell = self.cell
        if cell.owner == "storm-chld":
            self._storm_window()
            self.sent_at = time.monotonic()
        if cell.stop == "helper-alone":
            # Only that helper: someone stopped it. (The helper that ignores SIGTERM is
            # killed the way the OOM killer would: a kill that healthkit.stop() did not make.)
            sig = signal.SIGKILL if cell.owner == "handler-stops-helper" else signal.SIGTERM
            os.kill(self.pids[0], sig)
            return
        sig = SIGNALS[cell.stop]
        if cell.how == "group":
            if cell.owner == "gil-held":  # the stop must come while the owner's GIL is held
                self.in_window = self._hold() < GIL_HELD_S - 1.0
            os.killpg(self.proc.pid, sig)  # the owner leads its own group
        elif cell.how == "owner-then-each":
            os.kill(self.proc.pid, sig)
            for pid in self.pids:
                time.sleep(0.01)
                os.kill(pid, signal.SIGTERM)
        elif cell.how == "death-then-group":
            # On a thread from the hold, not in turn: the next run's stop must not wait for it.
            late = self._hold()
            self.in_window = late < 0.4
            thread = threading.Thread(target=self._death_then_group, args=(late, sig))
            thread.start()
            self.timers = [thread]
        elif cell.how == "helper-fails":
            self.in_mask = time.monotonic() - self.ready_at < MASK_S - 2.0
            self.grace_ends = time.time()
            os.kill(self.pids[0], self._death())
        elif cell.how in ("owner-alone", "owner-declares", "owner-declares-late"):
            stopped = time.time()  # wall clock: compared with the error file's mtime
            os.kill(self.proc.pid, sig)
            if self.out.until(r"^HANDLED", 30) is None:
                return
            self.grace_ends = stopped + SURVIVED_GRACE
            if cell.how == "owner-declares":
                self.grace_ends = time.time()
            os.kill(self.pids[0], self._death())
            if cell.how == "owner-declares-late":
                time.sleep(1.0)  # deferred by the stop under way (the default 30 s grace)
                self.grace_ends = time.time()
                os.kill(self.proc.pid, signal.SIGUSR2)

    def _death_then_group(self, late: float, sig: signal.Signals) -> None:
        """gil-held: a helper exits 1 while the watcher cannot run; once it has ended (the
        kernel says so: a loaded machine can take a second to run its handler and exit), the
        launcher stops the job: at 1.5 s into the hold, and at least 0.3 s after the death.
        Both must come while the GIL is held, or the run tests nothing."""
        held_at = time.monotonic() - late
        time.sleep(max(0.0, 0.5 - late))
        try:
            pidfd = os.pidfd_open(self.pids[0])
        except OSError:
            self.in_window = False
            return
        try:
            os.kill(self.pids[0], self._death())
            ended = select.select([pidfd], [], [], GIL_HELD_S)[0]
        finally:
            os.close(pidfd)
        stop_at = max(held_at + 1.5, time.monotonic() + 0.3)
        time.sleep(max(0.0, stop_at - time.monotonic()))
        if not ended or time.monotonic() > held_at + GIL_HELD_S - 0.5:
            self.in_window = False  # the death or the stop came too late to test anything
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    def _storm_window(self, timeout: float = 30) -> None:
        """storm-chld: wait until :data:`STORM_S` into a storm whose C call may still run
        (a storm let go less than 0.6 s ago), waiting for the next storm if need be."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.out.until(r"(?!)", 0.02)  # what the owner has said so far
            marks = [line.split() for line in self.out.lines
                     if line.startswith(("STORM ", "CALM "))]  # fmt: skip
            if marks and marks[-1][0] == "STORM":
                began = float(marks[-1][1])
                if time.monotonic() - began < 0.6:
                    time.sleep(max(0.0, began + STORM_S - time.monotonic()))
                    return
            self.out.until(r"(?!)", 0.05)

    def in_storm(self) -> bool:
        """storm-chld: the stop (or the death) came once the storm was over and while the
        owner's C call still held the GIL (its next mark, "CALM" or "STOP-RAN", is later)."""
        if self.sent_at is None:
            return False
        marks = [(line.split()[0], float(line.split()[1])) for line in self.out.lines
                 if line.startswith(("STORM ", "CALM ", "STOP-RAN "))]  # fmt: skip
        storms = [at for what, at in marks if what == "STORM" and at <= self.sent_at]
        if not storms or self.sent_at - storms[-1] < STORM_S - 0.05:
            return False
        after = [at for what, at in marks if what != "STORM" and at >= storms[-1]]
        return not after or after[0] > self.sent_at

    def _hold(self) -> float:
        """gil-held: tell the owner to take the GIL; seconds since it did."""
        os.kill(self.proc.pid, signal.SIGUSR2)
        found = self.out.until(r"^HOLDING ", 30)
        if found is None:
            return float("inf")
        return time.monotonic() - float(found.string.split()[1])

    def _death(self) -> signal.Signals:
        return {"sigterm": signal.SIGTERM, "sigkill": signal.SIGKILL}.get(
            self.cell.death, signal.SIGUSR1
        )

    def finish(self, timeout: float) -> tuple[bool, str, float | None]:
        """(fired, description, seconds after the grace) once the owner has ended; strays are
        killed by pidfd."""
        for timer in self.timers:
            timer.join()
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            _end(self.pids)
            self._close()
            return False, f"owner did not end within {timeout:.0f}s", None
        stray = _end(self.pids)  # first: a helper still running holds the owner's stderr open
        if self.cell.owner == "storm-chld":
            self.out.until(r"(?!)", 5)  # its marks, to the end (the storm's children are gone)
        err = self._close()
        fired = os.path.exists(self.error_file)
        rc = self.proc.returncode
        desc = f"rc={rc} error_file={fired} strays={stray} stderr={err.strip()[-400:]!r}"
        if fired or rc != 0:
            fired = True
        late = None
        if self.grace_ends is not None and fired and os.path.exists(self.error_file):
            late = os.stat(self.error_file).st_mtime - self.grace_ends  # written as it fired
        if stray:
            return fired, "helpers left running: " + desc, late
        return fired, desc, late

    def _close(self) -> str:
        """The owner's stderr (read with a deadline: a stray grandchild may hold it open)."""
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self.proc.stdout.close()
        err = LineReader(self.proc.stderr)
        err.until(r"(?!)", 5)  # everything until EOF, or 5 s
        self.proc.stderr.close()
        return "\n".join(err.lines)


def _end(pids: Iterable[int]) -> list[int]:
    """Let what a run left behind end by itself for 10 s, then kill it with the product's own
    ladder (by pidfd, never a recycled pid); return the pids that had to be killed."""
    report = hk.stop(pids, request=lambda: None, grace=10, kill_after=0, kill_timeout=10)
    return [*report.terminated, *report.killed, *report.survivors]


def _settle(cell: Cell) -> float:
    """How long to let a ready owner settle before stopping it: every watcher blocked in its
    wait; the uninterruptible owner inside its wait; the storm's wakeup socket full."""
    if cell.owner == "storm-alrm":  # the wakeup socket is full 0.3 s into the storm
        return 0.6
    return 0.5 if cell.owner == "uninterruptible" else 0.05


def _record(res: CellResult, run: _Run) -> None:
    fired, desc, late = run.finish(timeout=res.cell.cleanup + 60)
    res.runs += 1
    res.fired += fired
    res.not_fired += not fired
    if late is not None and fired:
        res.late_s.append(round(late, 3))
    broke = fired != res.expect_fire or "left running" in desc
    if not run.pids:
        broke, desc = True, "owner never reported READY: " + desc
    deferred = res.cell.death in ("exit1", "exit3", "sigterm")  # stop-like: excused at first
    # File times come from the kernel's coarse clock (a tick behind at most): 20 ms of slack.
    if res.cell.how == "owner-alone" and deferred and fired and late is not None and late < -0.02:
        broke, desc = True, f"fired {-late:.2f}s before the stop's grace ended: " + desc
    if res.cell.how == "owner-declares-late" and fired and late is not None and late < -0.02:
        broke, desc = True, f"fired {-late:.2f}s before the owner said it survived: " + desc
    at_once_s = STORM_AT_ONCE_S if res.cell.owner == "storm-chld" else AT_ONCE_S
    if res.cell.at_once and fired and (late is None or late > at_once_s):
        broke, desc = True, f"fired {late}s after the death (not at once): " + desc
    if res.cell.owner == "gil-held" and not run.in_window:
        broke, desc = True, "the stop came after the owner's GIL was free (no test of it): " + desc
    if res.cell.owner == "storm-chld" and not run.in_storm():
        broke, desc = True, "sent outside the storm's held GIL (no test of it): " + desc
    if res.cell.owner == "mask-after-arm" and not run.in_mask:
        broke, desc = True, "the helper died after the mask had ended (no test of it): " + desc
    told = Path(run.error_file).read_text() if os.path.exists(run.error_file) else ""
    if res.cell.how == "helper-fails" and "being stopped" in told + desc:
        broke, desc = True, "said the owner was being stopped (it never was): " + desc
    if broke:
        res.failures.append(desc)


def run_cell(cell: Cell, runs: int, *, parallel: int = 4) -> CellResult:
    return run_cells_together([cell], runs, parallel=parallel)[0]


def run_cells_together(cells: list[Cell], runs: int, *, parallel: int = 64) -> list[CellResult]:
    """Every run of every cell, ``parallel`` owners at a time (each run is mostly waiting)."""
    results = [CellResult(c) for c in cells]
    todo = [(res, k) for res in results for k in range(runs)]
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hk-stop-") as workdir:
        for start in range(0, len(todo), parallel):
            batch = [
                (res, _Run(res.cell, workdir, start + i))
                for i, (res, _) in enumerate(todo[start : start + parallel])
            ]
            for _, r in batch:
                r.wait_ready()
            time.sleep(max(_settle(r.cell) for _, r in batch))
            for _, r in batch:
                r.stop()
            for res, r in batch:
                _record(res, r)
    for res in results:
        res.seconds = time.monotonic() - t0
    return results


def group_cells() -> list[Cell]:
    """The original matrix: plain owners, every start method, every cleanup."""
    cells = [
        Cell(mode, sm, stop, cleanup)
        for stop in STOPS
        for sm in START_METHODS
        for cleanup in CLEANUPS
        for mode in MODES
    ]
    cells += [Cell(mode, sm, "helper-alone", 0.0) for sm in START_METHODS for mode in MODES]
    return cells


def owner_cells() -> list[Cell]:
    """Owners that live through a group stop in unusual ways, and each one's twin in which
    only a helper is stopped."""
    cells = []
    for owner in OWNERS:
        modes = ("sidecar",) if owner == "two-sidecars" else MODES
        # A forked helper inherits an ignored SIGINT: only SIGTERM ends the helpers of sig-ign.
        one = ("handler-stops-helper", "own-session", "sig-ign")
        stops = ("term",) if owner in one else STOPS
        how = "owner-then-each" if owner == "own-session" else "group"
        for mode in modes:
            cells += [Cell(mode, "fork", stop, 0.2, owner, how) for stop in stops]
            cells.append(Cell(mode, "fork", "helper-alone", 0.0, owner))
            if owner == "storm-chld":  # no stop at all: a helper's exit 1 in the storm
                cells.append(Cell(mode, "fork", "term", 0.2, owner, "helper-fails", "exit1"))
    return cells


def survived_cells() -> list[Cell]:
    """The owner alone is stopped and carries on; then a helper dies, every way."""
    return [
        Cell(mode, "fork", stop, 0.0, "plain", "owner-alone", death)
        for stop in ("int", "hup", "term")
        for death in DEATHS
        for mode in MODES
    ]


def declared_cells() -> list[Cell]:
    """The owner alone is stopped, carries on and says so; a helper dies after that, or
    during the stop and before it says so: every run fires at once."""
    cells = [
        Cell(mode, "fork", stop, 0.0, "plain", "owner-declares", death)
        for stop in ("int", "term")
        for death in ("exit1", "sigterm")
        for mode in MODES
    ]
    cells += [
        Cell(mode, "fork", stop, 0.0, "plain", "owner-declares-late", "exit1")
        for stop in ("int", "term")
        for mode in MODES
    ]
    return cells


def mask_cells() -> list[Cell]:
    """A thread blocks the stop signals after arm(): with no stop signal a helper's exit 1
    fires at once; with a group stop during the mask nothing fires."""
    cells = []
    for mode in MODES:
        cells.append(Cell(mode, "fork", "term", 0.2, "mask-after-arm", "helper-fails", "exit1"))
        cells += [Cell(mode, "fork", stop, 0.2, "mask-after-arm") for stop in STOPS]
    return cells


def late_observation_cells() -> list[Cell]:
    """A death seen late (the owner's GIL held for seconds) is judged at the moment it
    happened: before a group stop, it fires; the group stop alone never does. Both modes."""
    cells = []
    for mode in MODES:
        cells.append(Cell(mode, "fork", "term", 0.2, "gil-held", "death-then-group", "exit1"))
        cells.append(Cell(mode, "fork", "term", 0.2, "gil-held"))
    return cells


def all_cells() -> list[Cell]:
    return (group_cells() + owner_cells() + survived_cells() + declared_cells() + mask_cells()
            + late_observation_cells())  # fmt: skip


def _print(res: CellResult) -> None:
    verdict = "ok" if res.ok else f"BROKEN ({len(res.failures)})"
    late = f" late(max)={max(res.late_s):.2f}s" if res.late_s else ""
    print(
        f"{res.cell.name():60s} runs={res.runs:4d} fired={res.fired:4d} "
        f"{res.seconds:6.1f}s {verdict}{late}",
        flush=True,
    )


def main(argv: list[str]) -> int:
    """``stop_matrix.py RUNS LONG_RUNS OUT.json [FIELD=VALUE ...]``: every cell (or those whose
    fields match every FIELD=VALUE, e.g. ``how=group mode=sidecar``), RUNS runs (LONG_RUNS
    for the 10 s cleanup cells); writes the counts and prints one line per cell."""
    runs, long_runs, out = int(argv[0]), int(argv[1]), argv[2]
    wanted = dict(arg.split("=", 1) for arg in argv[3:])
    results = []
    cells = [
        c for c in all_cells() if all(str(getattr(c, k)) == v for k, v in wanted.items())
    ]
    for cell in cells:
        if cell.cleanup >= 10:
            continue
        results.append(run_cell(cell, runs, parallel=4))
        _print(results[-1])
    long_cells = [c for c in cells if c.cleanup >= 10]
    for stop in STOPS:  # the 10 s cells: each stop's six cells together, LONG_RUNS each
        group = [c for c in long_cells if c.stop == stop]
        for res in run_cells_together(group, long_runs):
            results.append(res)
            _print(res)
    Path(out).write_text(
        portable_paths(json.dumps(
            [{**asdict(r.cell), "runs": r.runs, "fired": r.fired, "failures": r.failures,
              "late_s": r.late_s, "seconds": round(r.seconds, 1)} for r in results],
            indent=1,
        ))
    )  # fmt: skip
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
