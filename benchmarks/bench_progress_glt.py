"""GLT sampling throughput with and without the progress watch (healthkit_glt's
``stall_timeout``), side by side in one run.

Two ``healthkit_glt.DistNeighborLoader`` s in one process, alive together (multiprocessing
mode, ``--workers`` sampling workers each, 2 by default, the graph, seeds and options of
``glt_bench.py``'s end-to-end runs: 391 batches an epoch, a channel of one epoch's
batches): the baseline without ``stall_timeout``, the other with ``stall_timeout=60``
(each worker beats a ``healthkit.Heartbeat`` per batch sent; the loader's receive is bounded
by the watch). After
one untimed epoch of each, ``ROUNDS`` rounds each run the epochs base, watched, watched,
base (a consumer that drops each batch: the highest batch rate, where a per-batch cost shows
most); only one loader samples at a time, so load from other processes hits both alike
within a round, seconds apart. Per round: the ratio of the watched loader's mean wall time
per epoch (and process-tree CPU per batch) to the baseline's. Both statistics are shown,
each with a percentile-bootstrap CI over the rounds (``_protocol.py``'s constants): the
arithmetic mean of the per-round ratios, minus 1 (the declared statistic of the first run,
``"declared": "mean"``), and their geometric mean, minus 1 (declared from the second run on,
``"declared": "geomean"``: under heavy load a round's ratio is skewed, one slow epoch of the
watched loader weighing more than one of the baseline's, and the arithmetic mean is biased
upwards; the log ratio is not). The verdict is taken on the run's declared statistic:
"< +1 %" met when the CI's upper end is under it, not met when its lower end is over it,
else not resolved, with its CI. The load average at the start of every round is kept
beside it. A run saves what it has after every round (``"complete": false`` until done).

Usage (one run per GLT stack; results in ``benchmarks/results/progress-glt-<version>.json``,
rendered into ``docs/benchmarks-progress.md`` with ``bench_progress.py``'s figures)::

    .venv-glt/bin/python benchmarks/bench_progress_glt.py [--rounds 40] [--workers 2]
    .venv-glt/bin/python benchmarks/bench_progress_glt.py --rounds 900 --workers 1

One sampling worker per loader gives the highest batch rate on 2 CPUs (about 1.2 ms a batch
against 3.3 ms with two: two workers and the consumer contend for the two cores), so a
per-batch cost shows most, and the per-round spread is smaller (sd of the log ratio about 15 %
against 22 % on an idle machine); the spread is the epochs' own, so resolving 1 % takes rounds
by the hundred (a soak run, not the suite's).
    .venv-glt/bin/python benchmarks/bench_progress_glt.py --quick   # smoke, temporary dir
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import tree_cpu_s  # noqa: E402
from _protocol import CONFIDENCE, RESAMPLES, SEED, bootstrap_ci  # noqa: E402

ROOT = HERE.parent
BASE, WATCHED = "without", "with"
ORDER = (BASE, WATCHED, WATCHED, BASE)  # one round
STALL_TIMEOUT_S = 60.0
LIMIT = 0.01
SEED_REPEATS = 25  # as glt_bench.SEED_REPEATS: 391 batches an epoch
RESULTS = ROOT / "benchmarks" / "results" / "progress-glt-{}.json"  # version-date-time
COMMAND = "{python} benchmarks/bench_progress_glt.py --rounds {rounds} --workers {workers}"


def _epoch(loader: Any) -> dict[str, float]:
    t, c, n = time.perf_counter(), tree_cpu_s(), 0
    for batch in loader:
        n += 1
        del batch  # release the ring slot at once
    return {"wall_s": time.perf_counter() - t, "cpu_s": tree_cpu_s() - c, "batches": n}


def measure(rounds: int, save: Any, workers: int = 2) -> list[dict[str, Any]]:
    """``rounds`` rounds of ``ORDER`` with ``workers`` sampling workers per loader; each
    epoch raw, with its round and the load average (1 min) when its round began;
    ``save(epochs)`` after each round."""
    sys.path.insert(0, str(ROOT / "tests" / "glt"))
    import glt_fixtures as fx
    import healthkit_glt as hg
    import torch

    fx.set_spawn()
    fx.init_single_process_context()
    dataset = fx.build_dataset()
    seeds = torch.arange(fx.NUM_NODES).repeat(SEED_REPEATS)
    loaders: dict[str, Any] = {}
    try:
        for name in (BASE, WATCHED):
            extra = {"stall_timeout": STALL_TIMEOUT_S} if name == WATCHED else {}
            loaders[name] = hg.DistNeighborLoader(
                dataset, list(fx.NUM_NEIGHBORS), seeds, batch_size=fx.BATCH_SIZE, shuffle=True,
                collect_features=True, to_device=torch.device("cpu"),
                random_seed=fx.LOADER_SEED,
                worker_options=fx.make_worker_options(
                    num_workers=workers, channel_capacity=fx.one_epoch_capacity(len(seeds))),
                **extra,
            )  # fmt: skip
        for name in (BASE, WATCHED):
            _epoch(loaders[name])  # warm-up, not timed
        out = []
        for r in range(rounds):
            load = os.getloadavg()[0]
            for name in ORDER:
                out.append({"round": r, "loader": name, "load": load, **_epoch(loaders[name])})
            print(f"[progress-glt] round {r}: {out[-4:]}", file=sys.stderr, flush=True)
            save(out)
        return out
    finally:
        for loader in loaders.values():
            loader.shutdown()


def per_round(epochs: list[dict[str, Any]], metric: str) -> list[float]:
    """Per round: the watched loader's mean wall s per epoch (``wall``) or CPU s per batch
    (``cpu``) over the baseline's (a ratio)."""
    out = []
    for r in sorted({e["round"] for e in epochs}):
        value: dict[str, float] = {}
        for name in (BASE, WATCHED):
            rows = [e for e in epochs if e["round"] == r and e["loader"] == name]
            if not rows:
                break
            if metric == "wall":
                value[name] = statistics.mean(e["wall_s"] for e in rows)
            else:
                value[name] = sum(e["cpu_s"] for e in rows) / sum(e["batches"] for e in rows)
        if len(value) == 2 and value[BASE] > 0:
            out.append(value[WATCHED] / value[BASE])
    return out


def totals_ratio(epochs: list[dict[str, Any]], metric: str) -> dict[str, Any]:
    """The whole run's throughput comparison: the watched loader's total wall time (``wall``)
    or CPU per batch (``cpu``) over the baseline's, minus 1, with a percentile-bootstrap CI
    over the rounds (each round resampled whole). Shown beside the declared statistic; slow
    epochs weigh most in it, so its CI is the widest."""
    import numpy as np

    rounds = sorted({e["round"] for e in epochs})
    cols = {k: np.zeros(len(rounds)) for k in ("wb", "ww", "cb", "cw", "nb", "nw")}
    where = {r: i for i, r in enumerate(rounds)}
    for e in epochs:
        i, w = where[e["round"]], e["loader"] == WATCHED
        cols["ww" if w else "wb"][i] += e["wall_s"]
        cols["cw" if w else "cb"][i] += e["cpu_s"]
        cols["nw" if w else "nb"][i] += e["batches"]

    def ratio(idx: Any) -> Any:
        c = {k: v[idx].sum(axis=-1) for k, v in cols.items()}
        if metric == "wall":
            return c["ww"] / c["wb"] - 1
        return (c["cw"] / c["nw"]) / (c["cb"] / c["nb"]) - 1

    est = float(ratio(np.arange(len(rounds))))
    if len(rounds) < 2:
        return {"estimate": est, "ci": None}
    # The shared bootstrap resamples round indices; the ratio is taken per resample.
    lo, hi = bootstrap_ci(range(len(rounds)), lambda idx: ratio(idx.astype(int)))
    return {"estimate": est, "ci": [lo, hi]}


def verdict(ratios: list[float], statistic: str, quick: bool) -> dict[str, Any]:
    """The statistic (``mean`` or ``geomean`` of the ratios, minus 1) with its CI, and the
    verdict on it against ``LIMIT``."""
    import math

    import numpy as np

    if statistic == "mean":
        values = [x - 1 for x in ratios]
        stat = lambda a: a.mean(axis=1)  # noqa: E731
        back = lambda x: x  # noqa: E731
    else:
        values = [math.log(x) for x in ratios]
        stat = lambda a: a.mean(axis=1)  # noqa: E731
        back = lambda x: math.exp(x) - 1  # noqa: E731
    est = back(float(np.mean(values)))
    if len(values) < 2:
        return {"estimate": est, "ci": None, "verdict": "too few rounds"}
    lo, hi = (back(x) for x in bootstrap_ci(values, stat))
    if quick:
        v = "quick run: no verdict"
    elif hi < LIMIT:
        v = "**met**"
    elif lo > LIMIT:
        v = "**not met**: a measured overhead"
    else:
        v = f"not resolved here: CI {100 * lo:+.1f} % to {100 * hi:+.1f} %"
    return {"estimate": est, "ci": [lo, hi], "verdict": v}


def section(result: dict[str, Any], name: str = "") -> list[str]:
    """The page's lines for one saved run (used by ``bench_progress.render``); ``name``:
    its results file."""
    epochs = result["epochs"]
    loads = sorted({(e["round"], e["load"]) for e in epochs})
    load_values = [x for _, x in loads]
    batches = sorted({e["batches"] for e in epochs})
    pct = lambda x: f"{100 * x:+.2f} %"  # noqa: E731
    lines = [
        f"### {result['software']}" + (f" (`benchmarks/results/{name}`)" if name else ""),
        "",
        f"`{result['command']}` on {result['date']}: {len(loads)} rounds"
        + ("" if result.get("complete", True) else f" (stopped early, of {result['rounds']})")
        + f", {2 * len(loads)} timed epochs of {', '.join(map(str, batches))} batches per "
        f"loader, {result['total_s']:.0f} s in all; declared statistic: "
        + ("geometric mean" if result.get("declared", "mean") == "geomean" else
           "arithmetic mean")
        + ". Load average (1 min) at the start of the "
        f"rounds: {min(load_values):.2f} to {max(load_values):.2f}, median "
        f"{statistics.median(load_values):.2f}.",
        "",
        f"| with the watch vs without | geometric mean of the per-round ratios, minus 1 "
        f"({CONFIDENCE:.0%} CI) | arithmetic mean, minus 1 ({CONFIDENCE:.0%} CI) | "
        f"the run's totals, minus 1 ({CONFIDENCE:.0%} CI) | "
        "verdict (< +1 %), on the declared statistic |",
        "|---|---:|---:|---:|---|",
    ]
    declared = result.get("declared", "mean")
    quick = bool(result.get("quick"))
    for metric, what in (("wall", "wall time per epoch"), ("cpu", "process-tree CPU per batch")):
        ratios = per_round(epochs, metric)
        cells = []
        for stat in ("geomean", "mean"):
            v = verdict(ratios, stat, quick)
            ci = f"{pct(v['ci'][0])} to {pct(v['ci'][1])}" if v["ci"] else "-"
            cells.append((f"{pct(v['estimate'])} ({ci})", v["verdict"]))
        chosen = cells[0][1] if declared == "geomean" else cells[1][1]
        t = totals_ratio(epochs, metric)
        total = pct(t["estimate"]) + (
            f" ({pct(t['ci'][0])} to {pct(t['ci'][1])})" if t["ci"] else "")
        lines.append(f"| {what} | {cells[0][0]} | {cells[1][0]} | {total} | {chosen} |")
    lines += [
        "",
        "The arithmetic mean of per-round ratios sits above the geometric one by about half "
        "the variance of their logarithm, whatever the watch costs (a ratio's mean is pulled "
        "up by its spread); the run's totals (all the watched epochs' time over all the "
        "baseline's) weigh the slowest epochs most.",
    ]
    lines += [
        "",
        "| loader | batches/s per epoch: median (min-max) | wall s per epoch: median | "
        "CPU ms per batch: median |",
        "|---|---:|---:|---:|",
    ]
    watched = f"with `stall_timeout={result['stall_timeout_s']:g}`"
    for name, label in ((BASE, "without `stall_timeout`"), (WATCHED, watched)):
        rows = [e for e in epochs if e["loader"] == name]
        rate = [e["batches"] / e["wall_s"] for e in rows]
        lines.append(
            f"| {label} | {statistics.median(rate):.0f} ({min(rate):.0f}-{max(rate):.0f}) | "
            f"{statistics.median(e['wall_s'] for e in rows):.3f} | "
            f"{1e3 * statistics.median(e['cpu_s'] / e['batches'] for e in rows):.2f} |"
        )
    wall = per_round(epochs, "wall")
    lines += [
        "",
        "Per round, in run order (load average at its start: wall-time difference):",
        "",
        "; ".join(f"{x:.1f}: {pct(d - 1)}" for (_, x), d in zip(loads, wall, strict=False))
        + ".",
        "",
    ]
    return lines


def main(argv: list[str]) -> int:
    import healthkit_glt as hg
    import torch

    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--workers", type=int, default=2, help="sampling workers per loader")
    args = ap.parse_args(argv)
    rounds = 2 if args.quick else args.rounds
    python = "python" if args.quick else os.path.relpath(sys.executable, ROOT)
    t0 = time.monotonic()
    if args.quick:
        out = Path(tempfile.mkdtemp(prefix="hk-bench-progress-glt-")) / "progress-glt.json"
    else:
        stamp = time.strftime("%Y%m%d-%H%M")
        out = Path(str(RESULTS).format(f"{hg.glt_version()}-{stamp}"))

    def save(epochs: list[dict[str, Any]], complete: bool = False) -> dict[str, Any]:
        result: dict[str, Any] = {
            "command": COMMAND.format(python=python, rounds=rounds, workers=args.workers)
            + (" --quick" if args.quick else ""),
            "quick": args.quick,
            "complete": complete,
            "date": time.strftime("%Y-%m-%d"),
            "software": f"torch {torch.__version__}, graphlearn-torch {hg.glt_version()}, "
            f"Python {platform.python_version()}, {os.cpu_count()} CPUs",
            "rounds": rounds,
            "workers": args.workers,
            "declared": "geomean",
            "stall_timeout_s": STALL_TIMEOUT_S,
            "bootstrap": {"confidence": CONFIDENCE, "resamples": RESAMPLES, "seed": SEED},
            "epochs": epochs,
            "total_s": time.monotonic() - t0,
        }
        out.write_text(json.dumps(result, indent=1))
        return result

    result = save(measure(rounds, save, args.workers), complete=True)
    print("\n".join(section(result)))
    print(f"written to {out}")
    if not args.quick:
        import bench_progress

        saved = json.loads((ROOT / "benchmarks" / "results" / "progress.json").read_text())
        (ROOT / "docs" / "benchmarks-progress.md").write_text(bench_progress.render(saved))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
