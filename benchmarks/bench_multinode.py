"""Multi-node teardown: two torchrun agents as two "nodes" on localhost, 2 ranks each (gloo),
node 1's rank 2 loses its helper to SIGKILL. Stock vs healthkit, same job script
(``tests/scripts/multinode_job.py``), node 0's ranks in one of three phases:

- ``collective``: a gloo all_reduce with node 1 (the peer's death closes sockets);
- ``local``: a node-local all_reduce and a wait on their own healthy helper (the CPU
  stand-in for NCCL, which never notices a dead peer);
- ``compute``: no collective.

The kill comes 1 s after every rank is ready, in both modes: a sidecar's own link to the
store may still be coming up then (it imports torch in the background after ``arm()``), and
the rank's link, up since ``arm()``, carries the notice both ways. Per run: the time from the
kill until every rank and helper of both nodes is gone, until every process of the job
(agents and witnesses included) is gone, the 1-minute load average at the kill, and whether
each node's torchrun summary names the helper (its pid and "killed by SIGKILL"). A stock run
still going ``--hung-after`` seconds after the kill is recorded as hung, then killed. Also a
rank's own OOM kill (rank 3 in a 256 MiB memory cgroup): whether both summaries name it, and
when node 0's ranks were gone after the kill.

    .venv/bin/python benchmarks/bench_multinode.py --runs 5 --stock-runs 1 --oom-runs 1
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from multinode import Job, root_cause  # noqa: E402
from testutil import NoMemoryCgroup, memory_cgroup, remove_cgroup  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "multinode.json"


def one_run(variant: str, phase: str, hung_after: float) -> dict[str, object]:
    args = ["--phase-a", phase]
    if variant != "stock":
        args = ["--healthkit", "--mode", variant, *args]
    job = Job(args)
    try:
        job.wait_ready()
        _, (_, _, helper) = sorted(job.by_node(1).items())[0]
        time.sleep(1.0)
        load1 = os.getloadavg()[0]
        killed = time.monotonic()
        os.kill(helper, signal.SIGKILL)
        ranks = job.wait_gone(job.ranks(), killed, hung_after)
        everything = job.wait_all_gone(killed, 10.0) if ranks is not None else None
    finally:
        results = job.finish(timeout=1)
    cause = f"sampler-server (pid {helper}) was killed by SIGKILL"
    named = [cause in root_cause(out) for _, out in results]
    return {"variant": variant, "phase": phase, "ranks_gone_s": ranks, "all_gone_s": everything,
            "named_per_node": named, "load1": load1}


def oom_run(hung_after: float) -> dict[str, object]:
    try:
        cgroup = memory_cgroup(256 << 20, "rank-oom")
    except NoMemoryCgroup as e:
        return {"skipped": f"no memory cgroup: {e}"}
    try:
        job = Job(["--healthkit", "--phase-a", "compute", "--phase-b", "compute",
                   "--rank-oom", "3", "--cgroup", cgroup])  # fmt: skip
        try:
            job.wait_ready()
            started = time.monotonic()
            oom_pid = job.by_node(1)[3][1]
            while os.path.exists(f"/proc/{oom_pid}") and time.monotonic() - started < 60:
                time.sleep(0.002)
            died = time.monotonic()
            node0 = [pid for _, pid, _ in job.by_node(0).values()]
            told = job.wait_gone(node0, died, hung_after)
        finally:
            results = job.finish(timeout=5)
    finally:
        remove_cgroup(cgroup)
    rx = r"rank 3 \(pid \d+\) was killed by SIGKILL: the kernel's OOM killer \(confirmed\)"
    return {"node0_gone_after_death_s": told,
            "named_per_node": [bool(re.search(rx, root_cause(out))) for _, out in results]}


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--stock-runs", type=int, default=5)
    ap.add_argument("--oom-runs", type=int, default=5)
    ap.add_argument("--hung-after", type=float, default=20.0)
    ap.add_argument("--quick", action="store_true", help="1 run per cell: proves it works")
    ap.add_argument("--only", default="", help="comma-separated variants to run (thread, "
                    "sidecar, stock); the results file is then not written")
    args = ap.parse_args()
    if args.quick:
        args.runs = args.stock_runs = args.oom_runs = 1
    cells = [(v, p, args.runs) for v in ("thread",) for p in ("collective", "local", "compute")]
    cells += [("sidecar", p, args.runs) for p in ("collective", "local", "compute")]
    cells += [("stock", p, args.stock_runs) for p in ("collective", "local", "compute")]
    if args.only:
        keep = set(args.only.split(","))
        cells = [c for c in cells if c[0] in keep]
    runs: list[dict[str, object]] = []
    load = [os.getloadavg()]
    for i in range(max(n for _, _, n in cells)):  # interleaved: drift hits every cell alike
        for variant, phase, n in cells:
            if i < n:
                r = one_run(variant, phase, args.hung_after)
                runs.append(r)
                print(json.dumps(r), flush=True)
    ooms = []
    for _ in range(args.oom_runs):
        r = oom_run(args.hung_after)
        ooms.append(r)
        print(json.dumps(r), flush=True)
    load.append(os.getloadavg())
    table = []
    for variant, phase, _ in cells:
        mine = [r for r in runs if r["variant"] == variant and r["phase"] == phase]
        gone = [float(r["ranks_gone_s"]) for r in mine if r["ranks_gone_s"] is not None]  # type: ignore[arg-type]
        alls = [float(r["all_gone_s"]) for r in mine if r["all_gone_s"] is not None]  # type: ignore[arg-type]
        named = [all(r["named_per_node"]) for r in mine]  # type: ignore[arg-type]
        table.append({
            "variant": variant, "phase": phase, "runs": len(mine),
            "hung": len(mine) - len(gone),
            "ranks_gone_p50_s": statistics.median(gone) if gone else None,
            "ranks_gone_p99_s": pct(gone, 0.99) if gone else None,
            "ranks_gone_max_s": max(gone) if gone else None,
            "all_gone_p50_s": statistics.median(alls) if alls else None,
            "all_gone_max_s": max(alls) if alls else None,
            "both_nodes_named": f"{sum(named)}/{len(mine)}",
        })  # fmt: skip
    out = {"command": " ".join(["benchmarks/bench_multinode.py", *sys.argv[1:]]),
           "loadavg_start_end": load, "table": table, "oom": ooms, "runs": runs}
    if not args.quick and not args.only:
        RESULTS.write_text(json.dumps(out, indent=1) + "\n")
    print("\n| node 0's ranks | watched by | runs | hung | every rank gone p50 / p99 / max | "
          "whole job gone p50 / max | both summaries name the helper |")
    print("|---|---|---:|---:|---|---|---|")
    for t in table:
        def f(x: object) -> str:
            return "-" if x is None else f"{float(x):.2f} s"  # type: ignore[arg-type]
        who = "stock" if t["variant"] == "stock" else f"healthkit {t['variant']}"
        gone = " / ".join(f(t[k]) for k in ("ranks_gone_p50_s", "ranks_gone_p99_s",
                                             "ranks_gone_max_s"))
        print(f"| {t['phase']} | {who} | {t['runs']} | {t['hung']} | {gone} | "
              f"{f(t['all_gone_p50_s'])} / {f(t['all_gone_max_s'])} | {t['both_nodes_named']} |")
    for r in ooms:
        print("rank OOM:", json.dumps(r))


if __name__ == "__main__":
    main()
