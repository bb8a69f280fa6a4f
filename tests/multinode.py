"""Two torchrun agents as two "nodes" on localhost, running tests/scripts/multinode_job.py:
start them, find each node's ranks and helpers, kill one, and time until every process of
the job is gone. Shared by the multi-node tests and benchmarks/bench_multinode.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from linereader import LineReader
from testutil import free_port

# Each agent's --local_addr: agent 0 (the store's host) stays node 0 whatever the pids (see
# the demo's note).
from healthkit._tools.demo_multinode import NODE_ADDRS

JOB = str(Path(__file__).parent / "scripts" / "multinode_job.py")
READY = r"READY node=(\d+) rank=(\d+) pid=(\d+) helper=(\d+) round=(\d+)"


class Agent:
    """One torchrun agent (a "node"), in its own session so all it started can be found."""

    def __init__(self, port: int, run_id: str, nproc: int, job_args: list[str],
                 env: dict[str, str], node: int, max_restarts: int = 0) -> None:
        self.cmd = [
            sys.executable, "-m", "torch.distributed.run", "--nnodes=2",
            f"--nproc_per_node={nproc}", "--rdzv_backend=c10d",
            f"--rdzv_endpoint=127.0.0.1:{port}", f"--rdzv_id={run_id}",
            f"--max_restarts={max_restarts}", f"--local_addr={NODE_ADDRS[node]}",
            "--monitor_interval=0.1", JOB, *job_args,
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True, env=env,
        )  # fmt: skip
        self.out = LineReader(self.proc.stdout)
        self.ready: dict[int, tuple[int, int, int]] = {}  # rank -> (node, pid, helper)

    def text(self) -> str:
        return "\n".join(self.out.lines)


class Job:
    """Two agents; agent 0 is started first, so it hosts the rendezvous store."""

    def __init__(self, job_args: list[str], *, nproc: int = 2, env: dict[str, str] | None = None,
                 max_restarts: int = 0, between_agents: Callable[[], None] | None = None) -> None:
        port = free_port()
        run_id = f"hk{os.getpid()}{time.monotonic_ns() % 100000}"
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(env or {})}
        self.nproc = nproc
        self.agents = [Agent(port, run_id, nproc, job_args, full_env, 0, max_restarts)]
        time.sleep(1.0)  # agent 0 binds the endpoint: it hosts the store
        if between_agents is not None:
            between_agents()
        self.agents.append(Agent(port, run_id, nproc, job_args, full_env, 1, max_restarts))
        self.known: set[int] = {a.proc.pid for a in self.agents}

    def wait_ready(self, timeout: float = 150, round: int = 0) -> None:
        """Until every rank of restart round ``round`` has said READY."""
        deadline = time.monotonic() + timeout
        want = self.nproc * (round + 1)
        for agent in self.agents:
            found = agent.out.matches(READY, want, max(0.0, deadline - time.monotonic()))
            found = [m for m in found if int(m.group(5)) == round]
            if len(found) < self.nproc:
                raise AssertionError("the job never became ready:\n" + self.texts())
            agent.ready = {}
            for m in found:
                node, rank, pid, helper, _ = map(int, m.groups())
                agent.ready[rank] = (node, pid, helper)
                self.known |= {pid, helper}

    def by_node(self, node: int) -> dict[int, tuple[int, int, int]]:
        """rank -> (node, pid, helper) for the ranks of ``node`` (GROUP_RANK)."""
        out = {}
        for agent in self.agents:
            out.update({r: v for r, v in agent.ready.items() if v[0] == node})
        return out

    def agent_of(self, node: int) -> Agent:
        for agent in self.agents:
            if any(v[0] == node for v in agent.ready.values()):
                return agent
        raise AssertionError(f"no agent runs node {node}")

    def alive(self) -> list[int]:
        """Every known process of the job that still runs (zombies count as gone)."""
        live = []
        for pid in sorted(self.known | set(self._descendants())):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            if stat[stat.rindex(")") + 2] != "Z":
                live.append(pid)
        return live

    def _descendants(self) -> list[int]:
        children: dict[int, list[int]] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as f:
                        stat = f.read()
                except OSError:
                    continue
                ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
                children.setdefault(ppid, []).append(int(entry))
        out, todo = [], [a.proc.pid for a in self.agents]
        while todo:
            pid = todo.pop()
            for child in children.get(pid, []):
                out.append(child)
                todo.append(child)
        return out

    def ranks(self) -> list[int]:
        """The pids of every rank and helper of the job."""
        return [p for a in self.agents for _, pid, helper in a.ready.values()
                for p in (pid, helper)]

    def wait_gone(self, pids: list[int], since: float, timeout: float) -> float | None:
        """Seconds from ``since`` until none of ``pids`` runs; None if some still do after
        ``timeout`` from now."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not [p for p in pids if _running(p)]:
                return time.monotonic() - since
            time.sleep(0.005)
        return None

    def wait_all_gone(self, since: float, timeout: float) -> float | None:
        """Seconds from ``since`` until no process of the job runs; None if some still do
        after ``timeout`` from now. Also snapshots the job's processes as they appear."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.known |= set(self._descendants())
            if not self.alive():
                return time.monotonic() - since
            time.sleep(0.01)
        return None

    def finish(self, timeout: float = 30) -> list[tuple[int | None, str]]:
        """Each agent's return code and output; everything still running is SIGKILLed."""
        deadline = time.monotonic() + timeout
        results = []
        for agent in self.agents:
            try:
                agent.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        self.kill_all()
        for agent in self.agents:
            try:
                agent.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
            rest = agent.out.rest()
            if agent.proc.stdout is not None:
                agent.proc.stdout.close()
            results.append((agent.proc.returncode, rest))
        return results

    def kill_all(self) -> None:
        self.known |= set(self._descendants())
        for pid in self.alive():
            if pid in self.known:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for agent in self.agents:
            try:
                os.killpg(agent.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def texts(self) -> str:
        return "\n".join(f"--- agent {i}\n{a.text()}" for i, a in enumerate(self.agents))


def root_cause(summary: str) -> str:
    """The 'Root Cause' block of a torchrun failure summary ('' if there is none)."""
    i = summary.find("Root Cause")
    return summary[i:] if i >= 0 else ""


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


