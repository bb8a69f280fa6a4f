"""Run healthkit's benchmarks and write their report.

    .venv/bin/python benchmarks/run.py            # full: docs/benchmarks.md + docs/img/
    .venv/bin/python benchmarks/run.py --quick    # smoke run (< 2 min), temporary directory
    scripts/bench [--quick]                       # the same, building .venv first

Options: ``--out DIR`` writes the report (``benchmarks.md``, ``img/``, ``results.json``) into
DIR instead; ``--only latency,idle`` runs some sections; ``--report-only results.json``
rewrites the report from saved results without measuring. The quick mode asserts nothing
about times: it proves the benchmark code runs end to end.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import bench_barrier  # noqa: E402
import bench_idle  # noqa: E402
import bench_latency  # noqa: E402
import bench_scale  # noqa: E402
import bench_teardown  # noqa: E402
import report  # noqa: E402
from _common import ROOT, machine, section  # noqa: E402

SECTIONS = {
    "latency": bench_latency.run,
    "idle": bench_idle.run,
    "scale": bench_scale.run,
    "barrier": bench_barrier.run,
    "teardown": bench_teardown.run,
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke run, under 2 minutes")
    ap.add_argument("--out", help="directory for benchmarks.md, img/ and results.json")
    ap.add_argument("--only", help=f"comma-separated sections among {', '.join(SECTIONS)}")
    ap.add_argument("--report-only", metavar="RESULTS_JSON",
                    help="rewrite the report from saved results, measure nothing")
    ap.add_argument("--merge-into", metavar="RESULTS_JSON",
                    help="re-measure the --only sections, replace them in these saved results "
                         "and rewrite their report (each section keeps its own command/date)")
    args = ap.parse_args(argv)

    if args.merge_into and (args.quick or not args.only):
        ap.error("--merge-into needs --only and a full (not --quick) run")
    if args.out:
        out = Path(args.out).resolve()
        md, img, raw = out / "benchmarks.md", out / "img", out / "results.json"
    elif args.quick:
        out = Path(tempfile.mkdtemp(prefix="healthkit-bench-quick-"))
        md, img, raw = out / "benchmarks.md", out / "img", out / "results.json"
    else:
        md, img = ROOT / "docs" / "benchmarks.md", ROOT / "docs" / "img"
        raw = HERE / "results" / "full.json"
    md.parent.mkdir(parents=True, exist_ok=True)
    raw.parent.mkdir(parents=True, exist_ok=True)
    if args.merge_into:
        raw = Path(args.merge_into).resolve()

    if args.report_only:
        results = json.loads(Path(args.report_only).read_text())
        report.write(results, md, img, ROOT)
        print(f"[bench] report rewritten: {md}")
        return 0

    names = list(SECTIONS)
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = set(names) - set(SECTIONS)
        if unknown:
            ap.error(f"unknown sections: {', '.join(sorted(unknown))}")

    command = os.environ.get("HEALTHKIT_BENCH_COMMAND") or shlex.join(
        [os.path.relpath(sys.executable, ROOT), os.path.relpath(__file__, ROOT),
         *(argv if argv is not None else sys.argv[1:])]
    )
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
    results: dict[str, Any] = {
        "command": command,
        "quick": args.quick,
        "date": date,
        "machine": machine(),
        "sections": {},
    }
    merged: dict[str, Any] | None = None
    if args.merge_into:
        merged = json.loads(raw.read_text())
    t0 = time.monotonic()
    status = 0
    for name in names:
        with section(results["sections"], name) as entry:
            if merged is not None:
                entry["command"], entry["date"] = command, date
            try:
                entry["result"] = SECTIONS[name](args.quick)
            except Exception:
                entry["error"] = traceback.format_exc()
                print(entry["error"], file=sys.stderr)
                status = 1
        if merged is not None:
            old = merged["sections"].get(name)
            if old is not None:  # keep earlier runs: a target is judged on every run
                prev = old.pop("previous_runs", [])
                results["sections"][name]["previous_runs"] = [*prev, old]
            merged["sections"][name] = results["sections"][name]
        else:  # save as we go: a late failure keeps the earlier measurements
            results["total_s"] = time.monotonic() - t0
        raw.write_text(json.dumps(merged or results, indent=1, default=str))
    if merged is not None:
        results = merged
    else:
        results["total_s"] = time.monotonic() - t0
    raw.write_text(json.dumps(results, indent=1, default=str))
    report.write(results, md, img, ROOT)
    print(f"[bench] {len(names)} sections in {time.monotonic() - t0:.0f} s; report: {md}; "
          f"raw results: {raw}")
    return status


if __name__ == "__main__":
    sys.exit(main())
