"""``healthkit demo --scenario two-nodes``: a helper dies on one node of a two-node torchrun
job; what does the OTHER node see?

Two real torchrun agents on this machine act as two nodes (c10d rendezvous, 2 ranks each,
gloo). Every rank owns a sampler-server helper. Node 1's rank 2 loses its helper to SIGKILL
(what the OOM killer sends). Node 0's ranks are meanwhile in a node-local collective and a
wait on their own healthy helper: nothing they do involves node 1, which is how NCCL ranks
look when a peer dies (NCCL does not notice). Without healthkit, node 0 is still hung when
the demo gives up and its log names nothing; with it, both nodes end within a second and
each node's torchrun summary names the helper and how it died.

This module runs in two roles: the demo driver (``run``), and each rank of the job (run by
torchrun as ``python -m healthkit._tools.demo_multinode``; only that role imports torch).
"""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import sys
import time
from typing import TextIO

READY = re.compile(r"READY node=(\d+) rank=(\d+) helper=(\d+)")


# ---------------------------------------------------------------------------- a rank
def _feeder() -> None:  # a helper that lives, and that this demo's ranks never need
    time.sleep(3600)


def rank_main(guarded: bool) -> None:
    import datetime
    import multiprocessing as mp

    import torch
    import torch.distributed as dist

    from healthkit._watchdog import DisarmableWatchdog

    timeout = datetime.timedelta(seconds=1800)  # NCCL's default collective timeout
    dist.init_process_group("gloo", timeout=timeout)
    node, local = int(os.environ["GROUP_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    groups = [dist.new_group(list(range(n * local, (n + 1) * local)), timeout=timeout)
              for n in range(dist.get_world_size() // local)]  # fmt: skip
    helper = mp.get_context("fork").Process(target=_feeder, name="sampler-server", daemon=True)
    helper.start()
    if guarded:
        DisarmableWatchdog([helper]).arm()
    # One write: print() writes the text and the newline apart, and the ranks share a pipe.
    sys.stdout.write(f"READY node={node} rank={dist.get_rank()} helper={helper.pid}\n")
    sys.stdout.flush()
    dist.barrier()
    t = torch.zeros(1)
    while True:  # node-local work only, as an NCCL rank looks when a peer dies
        dist.all_reduce(t, group=groups[node])
        time.sleep(0.05)


# ---------------------------------------------------------------------------- the driver
def _free_port() -> int:
    import random
    import socket

    for _ in range(100):
        port = random.randint(20000, 30000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port found for the rendezvous")


# Each agent's address as the rendezvous knows it. c10d numbers the nodes in the order of
# (address, agent pid); the first agent started binds the endpoint and hosts the store. With
# one address for both, a pid counter that wraps between the two starts makes the store's
# host node 1. Two spellings of loopback that sort in start order keep it node 0.
NODE_ADDRS = ("127.0.0.1", "localhost")


class _Agent:
    def __init__(self, port: int, run_id: str, guarded: bool, node: int) -> None:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2",
               "--nproc_per_node=2", "--rdzv_backend=c10d",
               f"--rdzv_endpoint=127.0.0.1:{port}", f"--rdzv_id={run_id}", "--max_restarts=0",
               f"--local_addr={NODE_ADDRS[node]}",
               "--monitor_interval=0.1", "-m", "healthkit._tools.demo_multinode"]  # fmt: skip
        if guarded:
            cmd.append("--healthkit")
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
               "LOGLEVEL": "ERROR"}  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     start_new_session=True, env=env)  # fmt: skip
        self.lines: list[str] = []
        self._buf = b""

    def read(self, timeout: float) -> None:
        """Take what the agent printed, waiting at most ``timeout`` s for something."""
        assert self.proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            if not sel.select(timeout):
                return
        chunk = os.read(self.proc.stdout.fileno(), 65536)
        self._buf += chunk or b"\n"
        *done, self._buf = self._buf.split(b"\n")
        self.lines += [d.decode(errors="replace") for d in done]

    def kill(self) -> None:
        """The agent and everything below it: torchrun starts each rank in a session of its
        own, so the agent's process group alone would leave the ranks (and their helpers)
        running. Each is pinned by a pidfd before it is signalled."""
        from healthkit._watch.stop import watch_tree

        if self.proc.poll() is None:
            for watch in watch_tree(self.proc.pid):
                watch.kill()
                watch.close()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _one(guarded: bool, hang_timeout: float, out: TextIO) -> tuple[str, list[str]]:
    port = _free_port()
    run_id = f"healthkit-demo-{os.getpid()}-{int(guarded)}"
    agents = [_Agent(port, run_id, guarded, 0)]
    time.sleep(1.0)  # node 0's agent hosts the rendezvous store
    agents.append(_Agent(port, run_id, guarded, 1))
    try:
        ready: dict[int, tuple[int, int]] = {}  # rank -> (node, helper)
        deadline = time.monotonic() + 180
        while len(ready) < 4 and time.monotonic() < deadline:
            for a in agents:
                a.read(0.1)
                for line in a.lines:  # two ranks' lines can still share one
                    for m in READY.finditer(line):
                        ready[int(m.group(2))] = (int(m.group(1)), int(m.group(3)))
        if len(ready) < 4:
            return "the job did not start", ["\n".join(a.lines[-20:]) for a in agents]
        nodes = []  # each agent's node (GROUP_RANK), from its ranks' READY lines
        for a in agents:
            found = [m for x in a.lines for m in READY.finditer(x)]
            nodes.append(int(found[0].group(1)) if found else agents.index(a))
        helper = next(h for r, (n, h) in sorted(ready.items()) if n == 1)
        time.sleep(1.0 if not guarded else 2.0)
        out.write(f"  killing node 1's sampler-server (pid {helper}) with SIGKILL\n")
        out.flush()
        os.kill(helper, signal.SIGKILL)
        died = time.monotonic()
        while time.monotonic() - died < hang_timeout:
            for a in agents:
                a.read(0.05)
            if all(a.proc.poll() is not None for a in agents):
                break
        seconds = time.monotonic() - died
        running = [a for a in agents if a.proc.poll() is None]
        for a in agents:
            a.kill()
            a.proc.wait()
            a.read(0.5)
        hung = ", ".join(f"node {nodes[agents.index(a)]}" for a in running)
        outcome = (f"{hung} STILL HUNG after {hang_timeout:.0f} s" if running
                   else f"both nodes ended {seconds:.2f} s after the helper died")
        by_node = sorted(zip(nodes, (_root_cause(a.lines) for a in agents), strict=True))
        return outcome, [cause for _, cause in by_node]
    finally:
        for a in agents:
            a.kill()
            if a.proc.stdout is not None:
                a.proc.stdout.close()
            try:
                a.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass


def _root_cause(lines: list[str]) -> str:
    """The traceback line of torchrun's 'Root Cause' block, or why there is none."""
    text = "\n".join(lines)
    i = text.find("Root Cause")
    if i < 0:
        return "(no summary: the node never ended)"
    for line in text[i:].splitlines():
        if line.strip().startswith("traceback :"):
            return line.split(":", 1)[1].strip()
    return "(no traceback)"


def run(hang_timeout: float, out: TextIO = sys.stdout) -> dict[str, tuple[str, list[str]]]:
    """Run the two-node scenario without and with healthkit; print what each node says."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise RuntimeError("the two-nodes scenario runs torchrun: install torch first "
                           "(scripts/demo builds an environment with it)")
    out.write("healthkit demo: two-nodes\n"
              "A 2-node torchrun job (two agents on this machine, 2 ranks each, gloo). Every "
              "rank owns a sampler-server. Node 0's ranks wait on node-local work only (as NCCL "
              "ranks do: NCCL does not notice a dead peer). Then node 1's sampler-server is "
              "killed.\n")
    results = {}
    for label, guarded in (("without healthkit", False), ("with healthkit", True)):
        out.write(f"\n[{'2/2' if guarded else '1/2'}] {label}\n")
        out.flush()
        outcome, causes = _one(guarded, max(hang_timeout, 60.0) if guarded else hang_timeout,
                               out)
        out.write(f"  {outcome}\n")
        for node, cause in enumerate(causes):
            out.write(f"  node {node}'s torchrun root cause: {cause}\n")
        results[label] = (outcome, causes)
    out.flush()
    return results


if __name__ == "__main__":
    rank_main("--healthkit" in sys.argv[1:])
