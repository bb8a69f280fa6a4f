"""The page skeleton of docs/benchmarks.md: header, machine, command, the declared protocol,
the verdict table (assembled from the sections' target rows) and links.

Each section (``bench_*.py``) owns its plot, its part of the page and its verdicts; this
module only puts them together, so the page can be re-rendered from saved raw results.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType
from typing import Any

import bench_barrier
import bench_idle
import bench_latency
import bench_scale
import bench_teardown
from _common import Page
from _protocol import BEYOND_MIN, CONFIDENCE, QUICK_VERDICT, Verdict, targets_from

SECTIONS: dict[str, ModuleType] = {
    m.NAME: m for m in (bench_latency, bench_idle, bench_scale, bench_barrier, bench_teardown)
}

DOCS_LINKS = {
    "docs/benchmarks-progress.md": "Progress watch: the cost of a beat, wake-ups per watch, "
    "stall to action",
    "docs/benchmarks-glt.md": "GLT (graphlearn-torch) figures",
    "docs/benchmarks-dataloader.md": "DataLoader workers: death-to-error latency and throughput, "
    "stock torch vs healthkit_torch",
    "docs/graphlearn.md": "graph-learn (tzrec sampler server) integration and figures",
    "docs/glt.md": "GLT integration guide",
}


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} minutes"


def _result(results: dict[str, Any], name: str) -> dict[str, Any] | None:
    entry = results["sections"].get(name)
    if not entry or "result" not in entry:
        return None
    r: dict[str, Any] = entry["result"]
    return r


def verdict_rows(results: dict[str, Any]) -> list[Verdict]:
    """Every declared target of every section, judged on this run's raw samples."""
    quick = bool(results.get("quick"))
    rows: list[Verdict] = []
    for name, mod in SECTIONS.items():
        entry = results["sections"].get(name)
        r = _result(results, name)
        if entry is not None and r is not None:
            rows += mod.verdicts(r, entry, quick)
            continue
        why = "section not run" if entry is None else "section failed"
        for t in targets_from(entry or {}, mod.TARGETS):
            rows.append(
                Verdict(
                    t.what,
                    t.statistic,
                    "n/a",
                    "",
                    "0",
                    QUICK_VERDICT if quick else f"not measured ({why})",
                )
            )
    return rows


def _protocol_md(results: dict[str, Any]) -> list[str]:
    L = ["## Protocol", ""]
    L.append(
        "Each target is declared in its section's code (`TARGETS` in "
        "`benchmarks/bench_*.py`, rules in `benchmarks/_protocol.py`) before anything is "
        "measured, and saved with the run's raw results; every run is judged the same "
        "way. A trial in which the reaction never came counts at the time the benchmark "
        "gave up waiting. A full run with fewer samples than declared is *not "
        f"resolved*; a quick run gets `{QUICK_VERDICT}`. In the tables a percentile is "
        f"printed only with at least {BEYOND_MIN} samples beyond it (p50: 20, p90: 100, "
        "p99: 1,000)."
    )
    L.append("")
    L.append("| target | statistic | n (full run) | verdict rule |")
    L.append("|---|---|---:|---|")
    for name, mod in SECTIONS.items():
        for t in targets_from(results["sections"].get(name) or {}, mod.TARGETS):
            L.append(f"| {t.what} | {t.statistic} | {t.n} | {t.rule} |")
    L.append("")
    return L


def _verdicts_md(results: dict[str, Any]) -> list[str]:
    L = ["## Verdicts", ""]
    L.append(f"| target | statistic | estimate | {CONFIDENCE:.0%} CI | n | verdict |")
    L.append("|---|---|---:|---|---:|---|")
    for v in verdict_rows(results):
        L.append(f"| {v.what} | {v.statistic} | {v.estimate} | {v.ci} | {v.n} | {v.verdict} |")
    L.append("")
    return L


def write(results: dict[str, Any], md_path: Path, img_dir: Path, root: Path) -> None:
    img_dir.mkdir(parents=True, exist_ok=True)
    rel_img = os.path.relpath(img_dir, md_path.parent)
    quick = bool(results.get("quick"))

    def link(rel: str) -> str:
        return os.path.relpath(root / rel, md_path.parent)

    m = results["machine"]
    L: list[str] = ["# healthkit benchmarks", ""]
    L.append(
        "Written by `benchmarks/run.py` from the raw samples of one run, saved with it "
        "(`benchmarks/results/full.json` for a full run). Every figure and every verdict "
        "below is computed from that run; rows marked *analytical* come from a model, "
        "not from a measurement."
    )
    L.append("")
    if quick:
        L.append(
            "**Quick run**: tiny sample sizes, to show that the benchmark code runs; no verdicts."
        )
        L.append("")
    L.append(
        f"Reproduce (builds the core environment, then runs everything; this run took "
        f"{_duration(results['total_s'])}):"
    )
    L.append("")
    L.append("```")
    L.append("scripts/bench            # full run: rewrites this file and docs/img/bench-*.png")
    L.append("scripts/bench --quick    # smoke run (< 2 min), writes to a temporary directory")
    L.append(".venv/bin/python benchmarks/run.py --report-only benchmarks/results/full.json")
    L.append("                         # re-render this page from the saved raw samples")
    L.append("```")
    L.append("")
    L.append(f"- command line of this run: `{results['command']}`")
    L.append(f"- date (UTC): {results['date']}; total wall time {results['total_s']:.0f} s")
    L.append(
        f"- machine: {m['cores']} cores ({m['cpu']}), {m['memory_gib']} GiB RAM, Linux "
        f"{m['kernel']}, Python {m['python']}, torch {m['torch']}, healthkit "
        f"{m['healthkit']}, numpy {m['numpy']}, matplotlib {m['matplotlib']}"
    )
    L.append(
        f"- clock: {m['clock']}, the same clock in every process, so a timestamp taken in "
        "one process can be subtracted from one taken in another"
    )
    L.append(
        "- competing methods were measured side by side in the same run (trials "
        "interleaved, or run concurrently). Load average (1/5/15 min) per section:"
    )
    L.append("")
    L.append("| section | wall time | load before | load after |")
    L.append("|---|---:|---|---|")
    for name, e in results["sections"].items():
        lb = "/".join(f"{x:.2f}" for x in e["load_before"])
        la = "/".join(f"{x:.2f}" for x in e["load_after"])
        L.append(f"| {name} | {e['wall_s']:.0f} s | {lb} | {la} |")
    L.append("")
    failed = [n for n, e in results["sections"].items() if "error" in e]
    if failed:
        L.append(
            f"**Sections that failed in this run:** {', '.join(failed)} (the traceback "
            "is in the raw results)."
        )
        L.append("")

    L += _protocol_md(results)
    L += _verdicts_md(results)

    for name, mod in SECTIONS.items():
        r = _result(results, name)
        if r is None:
            continue
        mod.plot(r, img_dir / mod.IMG)
        L += mod.markdown(r, Page(img=f"{rel_img}/{mod.IMG}", link=link, quick=quick))

    L.append("## Integration figures")
    L.append("")
    for rel, what in DOCS_LINKS.items():
        if (root / rel).exists():
            L.append(f"- [{what}]({link(rel)})")
    L.append("")
    md_path.write_text("\n".join(L))
