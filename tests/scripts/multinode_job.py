"""A two-node torchrun job (run by two agents, one per "node"): what a helper's or a rank's
death does to the OTHER node.

Every rank owns a helper (a forked feeder process) and, with --healthkit, a watchdog on it.
Each rank prints ``READY node=<GROUP_RANK> rank=<RANK> pid=<pid> helper=<helper pid>`` once it
runs, then, after every rank has said so (a store barrier), loops in the phase it was told:

- ``collective``: gloo ``all_reduce`` over the whole job (the peer's death closes sockets);
- ``local``: a node-local gloo group's ``all_reduce`` while waiting on its own healthy helper
  (a blocking read it never answers): nothing involves the other node, which is what NCCL's
  silence looks like to a rank (NCCL does not notice a dead peer);
- ``compute``: pure Python arithmetic, no collective at all.

``--phase-b`` sets the phase of node 1's ranks (default: collective, so that the death is seen
there at once without healthkit too). ``--rank-oom`` makes global rank R allocate until its
memory cgroup (``--cgroup DIR``, joined by the rank itself after arming) OOM-kills it.
``--finish N`` ends every rank normally after N steps (the healthy twin); ``--exit-early R``
makes rank R finish at once and return while the others go on (a rank that finishes early);
``--restarted-only`` applies ``--finish`` from torchrun's first restart on (round 0 runs until
something ends it). ``--rank-exits R:CODE``: rank R calls ``sys.exit(CODE)`` once running
(it writes no error file). ``--no-process-group``: no torch.distributed process group at all
(the notice needs only torchrun's store); only the ``compute`` phase then.
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing as mp
import os
import sys
import time

import torch
import torch.distributed as dist

import healthkit as hk


def feeder(conn: object) -> None:  # a helper that lives and never answers
    time.sleep(3600)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--healthkit", action="store_true")
    ap.add_argument("--mode", default="thread")
    ap.add_argument("--phase-a", default="collective", choices=["collective", "local", "compute"])
    ap.add_argument("--phase-b", default="collective", choices=["collective", "local", "compute"])
    ap.add_argument("--rank-oom", type=int, default=-1)
    ap.add_argument("--cgroup", default="")
    ap.add_argument("--finish", type=int, default=0)
    ap.add_argument("--exit-early", type=int, default=-1)
    ap.add_argument("--restarted-only", action="store_true")
    ap.add_argument("--no-process-group", action="store_true")
    ap.add_argument("--rank-exits", default="", help="R:CODE: rank R calls sys.exit(CODE)")
    ap.add_argument("--collective-timeout", type=float, default=600)
    args = ap.parse_args()

    timeout = datetime.timedelta(seconds=args.collective_timeout)
    pg = not args.no_process_group
    if pg:
        dist.init_process_group("gloo", timeout=timeout)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    node = int(os.environ["GROUP_RANK"])
    local_world = int(os.environ["LOCAL_WORLD_SIZE"])
    groups = [
        dist.new_group(list(range(n * local_world, (n + 1) * local_world)), timeout=timeout)
        for n in range(world // local_world)
    ] if pg else []
    ctx = mp.get_context("fork")
    ours, theirs = ctx.Pipe()
    helper = ctx.Process(target=feeder, args=(theirs,), name="sampler-server", daemon=True)
    helper.start()
    watchdog = hk.DisarmableWatchdog([helper], mode=args.mode).arm() if args.healthkit else None
    if rank == args.rank_oom and args.cgroup:
        with open(os.path.join(args.cgroup, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if args.restarted_only and restart == 0:
        args.finish = 0
    sys.stdout.write(f"READY node={node} rank={rank} pid={os.getpid()} helper={helper.pid} "
                     f"round={restart}\n")  # one write: the ranks share the agent's pipe
    sys.stdout.flush()
    if pg:
        dist.barrier()
    phase = args.phase_b if node == 1 else args.phase_a
    t = torch.zeros(1)
    hog: list[bytearray] = []
    step = 0
    if args.rank_exits:
        who, code = map(int, args.rank_exits.split(":"))
        if rank == who:
            time.sleep(0.5)
            sys.exit(code)  # no error file: nothing here records it
    while args.finish == 0 or step < args.finish:
        step += 1
        if rank == args.exit_early:
            break
        if rank == args.rank_oom:
            hog.append(bytearray(8 << 20))  # touched: bytearray zero-fills
            time.sleep(0.005)
            continue
        if phase == "collective":
            dist.all_reduce(t)
            time.sleep(0.01)
        elif phase == "local":
            dist.all_reduce(t, group=groups[node])
            if ours.poll(0.05):  # the helper never answers: a wait on node-local things only
                ours.recv()
        else:
            sum(i * i for i in range(20_000))
    if watchdog is not None:
        watchdog.disarm()
    if pg and rank != args.exit_early:
        dist.destroy_process_group()
    print(f"JOB DONE rank={rank}", flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
