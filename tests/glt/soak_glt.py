"""The full counts behind the glt suite's samples, on this environment's graphlearn-torch:

- fail-and-rebuild: CYCLES cycles (worker death, sampler error, init failure in turn) in one
  process; every cycle must end with the footprint the process had before the first (SysV
  segments, SysV and /dev/shm mappings, /dev/shm names, fds, threads, children);
- server-client faults: RUNS runs of ``glt_server_scenarios.py faults hk``, each held to
  the suite's expectations (errors, their times, nothing left);
- a long-lived server: CYCLES + 1 failed producers (worker death, sampler error, init
  failure in turn; ``glt_server_scenarios.py fail-rebuild``), its cyclic GC off: after
  every cycle its fds and named semaphores are what they were after the first.

    .venv-glt/bin/python tests/glt/soak_glt.py 20 5 benchmarks/results/soak-glt-0.2.4.json

Prints one line per cell; exit 1 if any run broke its expectation. ``scripts/soak`` runs it
on both builds.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import glt_scenarios as sc
import glt_server_scenarios as ssc
from testutil import portable_paths


def fail_rebuild(cycles: int) -> dict[str, Any]:
    run = sc.run_scenario("hk-fail-rebuild", [str(cycles)], timeout=60 + 30 * cycles)
    r = run.results[-1] if run.results else {}
    runs = r.get("runs", [])
    expected = ["SamplingWorkerDiedError", "SamplingError", "BarrierBrokenError"]
    bad = [i for i, x in enumerate(runs) if x["diff"] or x["raised"] != expected[i % 3]]
    ok = (run.returncode == 0 and len(runs) == cycles and not bad and not run.survivors
          and not run.leaked_segments)  # fmt: skip
    return {"cycles": cycles, "ok": ok, "bad_cycles": bad, "runs": runs,
            "before": r.get("before"), "after": r.get("after"), "rc": run.returncode,
            "left": [run.survivors, run.leaked_segments]}  # fmt: skip


def server_fail_rebuild(cycles: int) -> dict[str, Any]:
    kinds = "worker-death,sampler-error,init-failure"
    run = ssc.run("fail-rebuild", [str(cycles + 1), "0", kinds], timeout=300 + 60 * cycles)
    r = run.results[-1] if run.results else {}
    per = r.get("per_cycle") or []
    keys = ("fds", "semaphores", "semaphore_files")
    bad = [i for i, x in enumerate(per)
           if any(x[k] != per[0][k] for k in keys) or x["outcome"] == "finished"]  # fmt: skip
    ok = (run.returncode == 0 and len(per) == cycles + 1 and not bad and not run.survivors
          and not run.leaked_segments)  # fmt: skip
    return {"cycles": cycles, "ok": ok, "bad_cycles": bad, "per_cycle": per,
            "rc": run.returncode, "left": [run.survivors, run.leaked_segments]}  # fmt: skip


def _fault_ok(r: dict[str, Any]) -> list[str]:
    """The suite's expectations for one healthkit faults run; what broke them."""
    broken = []
    wk, sk, ck = r.get("worker_kill", {}), r.get("server_kill", {}), r.get("client_kill", {})
    if wk.get("type") != "RemoteSamplingError" or not wk.get("after_kill_s", 99) < 5.0:
        broken.append(f"worker_kill {wk.get('type')} {wk.get('after_kill_s')}")
    if (r.get("sampler_error") or {}).get("type") != "RemoteSamplingError":
        broken.append("sampler_error")
    if ck.get("survivors") or not (ck.get("workers_gone_after_s") or 99) < 15.0:
        broken.append(f"client_kill {ck}")
    if sk.get("type") != "SamplingServerLostError" or not sk.get("after_kill_s", 99) < 5.0:
        broken.append(f"server_kill {sk.get('type')} {sk.get('after_kill_s')}")
    if sk.get("survivors") or r.get("segments_left") or r.get("orphan_segments_removed"):
        broken.append("left something")
    if not (r.get("a_rebuilt_epoch") or {}).get("every_seed_once"):
        broken.append("rebuilt epoch")
    return broken


def server_client(runs: int) -> dict[str, Any]:
    out = []
    for _ in range(runs):
        run = ssc.run("faults", ["hk"], timeout=420)
        r = run.results[-1] if run.results else {"error": "no result"}
        r.pop("events", None)
        broken = _fault_ok(r) if "error" not in r else [r["error"]]
        if run.returncode != 0 or run.survivors or run.leaked_segments:
            broken.append(f"rc {run.returncode}, left {run.survivors} {run.leaked_segments}")
        out.append({"broken": broken, **{k: r.get(k) for k in (
            "worker_kill", "sampler_error", "client_kill", "server_kill")}})  # fmt: skip
    return {"runs": runs, "ok": all(not x["broken"] for x in out), "results": out}


def main(argv: list[str]) -> int:
    import healthkit_glt as hg

    cycles, runs, path = int(argv[0]), int(argv[1]), argv[2]
    t0 = time.monotonic()
    fr = fail_rebuild(cycles)
    print(f"fail-and-rebuild, {cycles} cycles in one process: "
          f"{'ok' if fr['ok'] else 'BROKEN ' + str(fr['bad_cycles'])}; footprint "
          f"{'unchanged' if fr['ok'] else 'see ' + path}", flush=True)  # fmt: skip
    sfr = server_fail_rebuild(cycles)
    print(f"a long-lived server, {cycles} failed producers after the first: "
          f"{'ok' if sfr['ok'] else 'BROKEN ' + str(sfr['bad_cycles'])}; fds and semaphores "
          f"{'unchanged' if sfr['ok'] else 'see ' + path}", flush=True)  # fmt: skip
    sc_res = server_client(runs)

    def med(key: str, field: str) -> str:
        xs = [x[key][field] for x in sc_res["results"]
              if x.get(key) and x[key].get(field) is not None]  # fmt: skip
        return f"{statistics.median(xs):.3f} s (max {max(xs):.3f})" if xs else "n/a"

    print(f"server-client faults, {runs} runs: {'ok' if sc_res['ok'] else 'BROKEN'}; worker "
          f"kill to error {med('worker_kill', 'after_kill_s')}, sampler raise to error "
          f"{med('sampler_error', 'after_raise_s')}, client kill to its workers gone "
          f"{med('client_kill', 'workers_gone_after_s')}, server kill to error "
          f"{med('server_kill', 'after_kill_s')}", flush=True)  # fmt: skip
    with open(path, "w") as f:
        f.write(portable_paths(json.dumps(
            {"command": f"{os.path.relpath(sys.executable)} tests/glt/soak_glt.py "
             f"{' '.join(argv)}", "glt": hg.glt_version(),
             "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
             "seconds": time.monotonic() - t0, "fail_rebuild": fr,
             "server_fail_rebuild": sfr, "server_client": sc_res}, indent=1)))  # fmt: skip
    return 0 if fr["ok"] and sfr["ok"] and sc_res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
