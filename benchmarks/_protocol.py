"""The verdict protocol: every target is declared in code before anything is measured, and
every run is judged by the same rules, from its raw samples.

A declaration fixes the sample size of a full run, the statistic and the rule. The rules:

- a percentile (``p50``, ``p99``) or a median gets a percentile-bootstrap confidence
  interval (``CONFIDENCE``, ``RESAMPLES`` resamples, fixed ``SEED``, so a re-render of the
  same raw samples gives the same interval). **met** only when the interval's upper end is
  under the target; **not met** when its lower end is over it; otherwise *not resolved*;
- ``every run``: met only when no run reached the target, and the verdict carries the
  one-sided upper bound on the share of runs that could be over it (few runs cannot show
  more than that); not met when any run reached it or never ended;
- ``zero``: a count that must be 0 at every point measured (no sampling involved).

A full run with fewer samples than declared is *not resolved*; a quick run gets no verdict.
Trials in which the reaction never came are kept, as the time the benchmark gave up
waiting (a lower bound of their latency), never dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

CONFIDENCE = 0.95
RESAMPLES = 5000
SEED = 20261203
QUICK_VERDICT = "quick run: no verdict"
# A percentile q is printed only with at least 10 samples beyond it: n * (1 - q) >= 10,
# so p50 needs 20 samples, p90 100 and p99 1,000.
BEYOND_MIN = 10

RULES = {
    "percentile": (
        f"percentile bootstrap, {CONFIDENCE:.0%} CI, {RESAMPLES} resamples, seed {SEED}: "
        "met if the CI's upper end is under the target, not met if its lower end is over "
        "it, otherwise not resolved"
    ),
    "every run": (
        "met if no run reached the target (shown with the one-sided "
        f"{CONFIDENCE:.0%} upper bound on the share of runs over it); not met if any did"
    ),
    "zero": "met if the count is 0 at every N measured; not met otherwise",
    "mean difference": (
        "relative difference of the two loaders' means over their blocks (ours / stock - 1); "
        f"each loader's blocks resampled independently, percentile bootstrap, {CONFIDENCE:.0%} "
        f"CI, {RESAMPLES} resamples, seed {SEED}: met if the CI's upper end is under the "
        "target, not met if its lower end is over it, otherwise not resolved here (with the "
        "CI's half-width)"
    ),
}


@dataclass(frozen=True)
class Target:
    """One declared target. ``key`` names the samples it is judged on within its section."""

    key: str
    what: str
    statistic: str  # "p50", "p99", "median", "every run", "zero", "mean difference"
    limit: float
    unit: str  # "s", "%", "count", "x" (a ratio)
    n: int  # samples (trials, rounds, runs or windows) of a full run
    # Judged on the ratio of the statistic to the same statistic of this key's samples in
    # the same run (e.g. the kernel's floor); ``limit`` is then the ratio's bound.
    relative_to: str = ""

    @property
    def kind(self) -> str:
        return (
            "percentile"
            if self.statistic.startswith("p") or self.statistic == "median"
            else self.statistic
        )

    @property
    def rule(self) -> str:
        if self.relative_to:
            return (
                f"{RULES[self.kind]}; the interval is the ratio's: both samples resampled "
                f'independently, against "{self.relative_to}" in the same run'
            )
        return RULES[self.kind]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Verdict:
    """One row of the verdict table."""

    what: str
    statistic: str
    estimate: str
    ci: str
    n: str
    verdict: str


def quantile(statistic: str) -> float:
    """``"p99"`` -> 0.99; ``"median"`` -> 0.5."""
    return 0.5 if statistic == "median" else float(statistic[1:]) / 100


def shown(n: int, q: float) -> bool:
    """Whether a q-percentile of n samples is printed (see ``BEYOND_MIN``)."""
    return n * (1 - q) >= BEYOND_MIN - 1e-9


def bootstrap_ci(values: Sequence[float], stat: Callable[[Any], Any]) -> tuple[float, float]:
    """Percentile-bootstrap CI of ``stat`` (a function of a 2-D array, along axis 1)."""
    import numpy as np

    a = np.asarray(values, dtype=float)
    rng = np.random.default_rng(SEED)
    reps = stat(rng.choice(a, size=(RESAMPLES, a.size), replace=True))
    tail = (1 - CONFIDENCE) / 2 * 100
    return float(np.percentile(reps, tail)), float(np.percentile(reps, 100 - tail))


def percentile_ci(values: Sequence[float], q: float) -> tuple[float, float, float]:
    """(estimate, CI low, CI high) of the q-percentile (numpy's linear interpolation)."""
    import numpy as np

    est = float(np.percentile(np.asarray(values, dtype=float), q * 100))
    lo, hi = bootstrap_ci(values, lambda m: np.percentile(m, q * 100, axis=1))
    return est, lo, hi


def ratio_ci(
    values: Sequence[float], base: Sequence[float], q: float
) -> tuple[float, float, float]:
    """(estimate, CI low, CI high) of percentile(values) / percentile(base): both samples
    are resampled independently, the same number of times, and the ratio taken per resample."""
    import numpy as np

    a, b = np.asarray(values, dtype=float), np.asarray(base, dtype=float)
    rng = np.random.default_rng(SEED)
    ra = np.percentile(rng.choice(a, size=(RESAMPLES, a.size), replace=True), q * 100, axis=1)
    rb = np.percentile(rng.choice(b, size=(RESAMPLES, b.size), replace=True), q * 100, axis=1)
    reps = ra / rb
    tail = (1 - CONFIDENCE) / 2 * 100
    est = float(np.percentile(a, q * 100) / np.percentile(b, q * 100))
    return est, float(np.percentile(reps, tail)), float(np.percentile(reps, 100 - tail))


def judge_ratio(
    t: Target,
    values: Sequence[float],
    base: Sequence[float],
    quick: bool,
    fmt: Callable[[float], str],
    gave_up: Sequence[float] = (),
) -> Verdict:
    """A percentile of ``values`` against ``t.limit`` times the same percentile of ``base``
    (the same run's reference), with the bootstrap CI of the ratio."""
    sample = [*values, *gave_up]
    n = min(len(sample), len(base))
    n_text = f"{len(sample)} vs {len(base)}" + (f" ({len(gave_up)} given up)" if gave_up else "")
    if not sample or not base:
        return Verdict(t.what, t.statistic, "n/a", "", n_text, "not measured")
    q = quantile(t.statistic)
    verdict = _short(t, n, quick)
    if not shown(n, q):
        need = round(BEYOND_MIN / (1 - q))
        return Verdict(
            t.what, t.statistic, f"- (needs n >= {need})", "", n_text, verdict or "not resolved"
        )
    est, lo, hi = ratio_ci(sample, base, q)
    ref = float(percentile_ci(base, q)[0])
    verdict = verdict or interval_verdict(t.limit, lo, hi, lambda x: f"{x:.2f}x")
    return Verdict(
        t.what,
        f"{t.statistic} ratio",
        f"{est:.2f}x ({fmt(est * ref)} vs {fmt(ref)})",
        f"{lo:.2f}x to {hi:.2f}x",
        n_text,
        verdict,
    )


def mean_difference_ci(
    values: Sequence[float], base: Sequence[float]
) -> tuple[float, float, float]:
    """(estimate, CI low, CI high) of mean(values) / mean(base) - 1, both samples resampled
    independently (the unit is whatever one value stands for: here a block of epochs)."""
    import numpy as np

    a, b = np.asarray(values, dtype=float), np.asarray(base, dtype=float)
    rng = np.random.default_rng(SEED)
    ra = rng.choice(a, size=(RESAMPLES, a.size), replace=True).mean(axis=1)
    rb = rng.choice(b, size=(RESAMPLES, b.size), replace=True).mean(axis=1)
    reps = ra / rb - 1
    tail = (1 - CONFIDENCE) / 2 * 100
    est = float(a.mean() / b.mean() - 1)
    return est, float(np.percentile(reps, tail)), float(np.percentile(reps, 100 - tail))


def judge_difference(
    t: Target, values: Sequence[float], base: Sequence[float], quick: bool
) -> Verdict:
    """``values`` against ``base`` (the same run's stock figures): the relative difference of
    their means must stay under ``t.limit``. A CI too wide to decide is reported as such,
    with its half-width, never as met."""
    n = min(len(values), len(base))
    n_text = f"{len(values)} vs {len(base)} blocks"
    if n < 2:
        return Verdict(t.what, t.statistic, "n/a", "", n_text, "not measured")
    est, lo, hi = mean_difference_ci(values, base)
    pct = lambda x: f"{100 * x:+.2f} %"  # noqa: E731
    verdict = _short(t, n, quick)
    if verdict is None:
        if hi < t.limit:
            verdict = "**met**"
        elif lo > t.limit:
            verdict = "**not met**"
        else:
            verdict = f"not resolved here: CI ±{50 * (hi - lo):.1f} %"
    return Verdict(t.what, t.statistic, pct(est), f"{pct(lo)} to {pct(hi)}", n_text, verdict)


def interval_verdict(limit: float, lo: float, hi: float, fmt: Callable[[float], str]) -> str:
    if hi < limit:
        return "**met**"
    if lo > limit:
        return "**not met**"
    return f"not resolved (CI {fmt(lo)} to {fmt(hi)})"


def _short(t: Target, n: int, quick: bool) -> str | None:
    """The verdict when the sample cannot be judged at all, else None."""
    if quick:
        return QUICK_VERDICT
    if n < t.n:
        return f"not resolved (n = {n}, fewer than the declared {t.n})"
    return None


def judge_percentile(
    t: Target,
    values: Sequence[float],
    quick: bool,
    fmt: Callable[[float], str],
    gave_up: Sequence[float] = (),
) -> Verdict:
    """A percentile target over ``values`` plus the trials given up at ``gave_up``."""
    sample = [*values, *gave_up]
    n = len(sample)
    n_text = f"{n}" + (f" ({len(gave_up)} given up)" if gave_up else "")
    if n == 0:
        return Verdict(t.what, t.statistic, "n/a", "", "0", "not measured")
    q = quantile(t.statistic)
    verdict = _short(t, n, quick)
    if not shown(n, q):  # too few samples to print this percentile at all
        need = round(BEYOND_MIN / (1 - q))
        return Verdict(
            t.what, t.statistic, f"- (needs n >= {need})", "", n_text, verdict or "not resolved"
        )
    est, lo, hi = percentile_ci(sample, q)
    verdict = verdict or interval_verdict(t.limit, lo, hi, fmt)
    return Verdict(t.what, t.statistic, fmt(est), f"{fmt(lo)} to {fmt(hi)}", n_text, verdict)


def judge_interval(
    t: Target,
    est: float,
    lo: float,
    hi: float,
    n: int,
    quick: bool,
    fmt: Callable[[float], str],
) -> Verdict:
    """A target whose estimate and CI the section computed (same bootstrap, same rule)."""
    verdict = _short(t, n, quick) or interval_verdict(t.limit, lo, hi, fmt)
    return Verdict(t.what, t.statistic, fmt(est), f"{fmt(lo)} to {fmt(hi)}", str(n), verdict)


def share_bound(n: int) -> float:
    """One-sided upper confidence bound on a rate when 0 of n runs showed it (exact)."""
    return float(1.0 - (1.0 - CONFIDENCE) ** (1.0 / n))


def judge_every_run(
    t: Target,
    values: Sequence[float],
    never_ended: int,
    quick: bool,
    fmt: Callable[[float], str],
) -> Verdict:
    """Every run must stay under ``t.limit``; a run that never ended counts as over it."""
    n = len(values) + never_ended
    if n == 0:
        return Verdict(t.what, t.statistic, "n/a", "", "0", "not measured")
    over = sum(v >= t.limit for v in values) + never_ended
    est = ("never ended" if never_ended else fmt(max(values))) if n else "n/a"
    n_text = f"{n}" + (f" ({never_ended} never ended)" if never_ended else "")
    if over:
        ci = f"{over}/{n} runs over"
    else:
        ci = f"0/{n} runs over; share over < {share_bound(n):.1%}"
    verdict = _short(t, n, quick)
    if verdict is None:
        verdict = (
            "**not met**"
            if over
            else (
                f"**met** in every run (share over the target < {share_bound(n):.1%}, "
                f"{CONFIDENCE:.0%} bound)"
            )
        )
    return Verdict(t.what, "max (every run)", est, ci, n_text, verdict)


def judge_zero(t: Target, counts: Sequence[int], points: str, quick: bool) -> Verdict:
    """A count that must be 0 at every point measured."""
    if not counts:
        return Verdict(t.what, t.statistic, "n/a", "", "0", "not measured")
    verdict = _short(t, len(counts), quick) or (
        "**met**" if all(c == 0 for c in counts) else "**not met**"
    )
    return Verdict(t.what, "count", ", ".join(map(str, counts)), "exact count", points, verdict)


def targets_from(entry: dict[str, Any], declared: Sequence[Target]) -> list[Target]:
    """The targets a run declared (saved in its results), else the code's declarations."""
    saved = entry.get("targets")
    return [Target(**d) for d in saved] if saved else list(declared)
