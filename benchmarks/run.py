"""Run healthkit's benchmarks and write their report.

    .venv/bin/python benchmarks/run.py            # full: docs/benchmarks.md + docs/img/
    .venv/bin/python benchmarks/run.py --quick    # smoke run (< 2 min), temporary directory
    scripts/bench [--quick]                       # the same, building .venv first

A full run takes about 30 minutes on a quiet 2-core machine and up to about 40 under load
(latency 11-18, idle 6, teardown 6, barrier 2-4, scale 1-2): every target's sample size is
declared in its section's code before measuring (``TARGETS``; rules in ``_protocol.py``),
and a p99 needs 1,000 trials per method. A run replaces the whole report: verdicts are judged on one
run's samples, never on a mix of runs.

Options: ``--out DIR`` writes the report (``benchmarks.md``, ``img/``, ``results.json``) into
DIR instead; ``--only latency,idle`` runs some sections (the others' targets then read "not
measured"); ``--report-only results.json`` rewrites the report from saved raw samples
without measuring (confidence intervals are recomputed from them). The quick mode asserts
nothing about times and gives no verdicts: it proves the benchmark code runs end to end.
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

import report  # noqa: E402
from _common import ROOT, machine, section  # noqa: E402

SECTIONS = report.SECTIONS
FORMAT = 2  # results.json with raw samples and the declared targets of each section


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke run, under 2 minutes")
    ap.add_argument("--out", help="directory for benchmarks.md, img/ and results.json")
    ap.add_argument("--only", help=f"comma-separated sections among {', '.join(SECTIONS)}")
    ap.add_argument(
        "--report-only",
        metavar="RESULTS_JSON",
        help="rewrite the report from saved results, measure nothing",
    )
    args = ap.parse_args(argv)

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

    if args.report_only:
        saved: dict[str, Any] = json.loads(Path(args.report_only).read_text())
        if saved.get("format") != FORMAT:
            ap.error(
                f"{args.report_only} was written by an older benchmarks/run.py, without "
                "the raw samples and declared targets the report is computed from; "
                "re-run the benchmarks"
            )
        if saved.get("quick") and not args.out:  # never over the committed page
            out = Path(tempfile.mkdtemp(prefix="healthkit-bench-quick-"))
            md, img = out / "benchmarks.md", out / "img"
        report.write(saved, md, img, ROOT)
        print(f"[bench] report rewritten: {md}")
        return 0

    names = list(SECTIONS)
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = set(names) - set(SECTIONS)
        if unknown:
            ap.error(f"unknown sections: {', '.join(sorted(unknown))}")

    command = os.environ.get("HEALTHKIT_BENCH_COMMAND") or shlex.join(
        [
            os.path.relpath(sys.executable, ROOT),
            os.path.relpath(__file__, ROOT),
            *(argv if argv is not None else sys.argv[1:]),
        ]
    )
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
    results: dict[str, Any] = {
        "format": FORMAT,
        "command": command,
        "quick": args.quick,
        "date": date,
        "machine": machine(),
        "sections": {},
    }
    t0 = time.monotonic()
    status = 0
    for name in names:
        with section(results["sections"], name) as entry:
            # the protocol, declared before measuring, is saved with the samples
            entry["targets"] = [t.as_dict() for t in SECTIONS[name].TARGETS]
            try:
                entry["result"] = SECTIONS[name].run(args.quick)
            except Exception:
                entry["error"] = traceback.format_exc()
                print(entry["error"], file=sys.stderr)
                status = 1
        # save as we go: a late failure keeps the earlier measurements
        results["total_s"] = time.monotonic() - t0
        raw.write_text(json.dumps(results, indent=1, default=str))
    report.write(results, md, img, ROOT)
    print(
        f"[bench] {len(names)} sections in {time.monotonic() - t0:.0f} s; report: {md}; "
        f"raw results: {raw}"
    )
    return status


if __name__ == "__main__":
    sys.exit(main())
