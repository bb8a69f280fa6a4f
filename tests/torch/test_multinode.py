"""One failure, one story, on every node: two real torchrun agents as two nodes on localhost
(c10d rendezvous, 2 ranks each, gloo). A helper's (or a rank's own) death on node 1 ends
every rank of both nodes, and each node's torchrun summary names the real cause; a healthy
end, a finished rank and a launcher's stop publish nothing."""

from __future__ import annotations

import datetime
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch")

import torch.distributed as dist
from multinode import Job, root_cause
from testutil import free_port, memory_cgroup_or_skip, remove_cgroup

import healthkit as hk
from healthkit import _jobnotice
from healthkit._jobnotice import JobFailure, JobScope, StoreLink

# How long a stock (or silent) node is watched after the death to call it hung: the healthkit
# jobs end in well under a second here.
HUNG_AFTER_S = 8.0
# How long a job runs before the kill or stop: a sidecar's link to the store comes up in the
# background after arm() (it imports torch), and a test of what reaches the other node wants
# the link up, as in a job that has been running for a while.
SETTLE_S = {"thread": 1.0, "sidecar": 4.0}
MODES = ["thread", "sidecar"]


def _kill(pid: int) -> float:
    t = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    return t


def _helper_of_node_1(job: Job) -> tuple[int, int]:
    rank, (_, _, helper) = sorted(job.by_node(1).items())[0]
    return rank, helper


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("mode", "phase"),
    [("thread", "collective"), ("thread", "local"), ("thread", "compute"), ("sidecar", "local")],
)
def test_a_helpers_death_on_one_node_ends_every_rank_and_every_summary_names_it(
    mode: str, phase: str
) -> None:
    """Node 0's ranks are (a) in a gloo all_reduce with node 1, (b) in a node-local
    collective and a wait on their own healthy helper (what NCCL's silence looks like), or
    (c) computing. Node 1's rank 2 loses its helper: every rank of both nodes is gone in
    seconds, and both summaries name the helper and how it died."""
    job = Job(["--healthkit", "--mode", mode, "--phase-a", phase])
    try:
        job.wait_ready()
        rank, helper = _helper_of_node_1(job)
        time.sleep(1.0)  # the job is running
        killed = _kill(helper)
        gone = job.wait_gone(job.ranks(), killed, 60)
    finally:
        results = job.finish()
    assert gone is not None, job.texts()
    cause = f"sampler-server (pid {helper}) was killed by SIGKILL"
    node0 = job.agents.index(job.agent_of(0))
    for i, (rc, out) in enumerate(results):
        assert rc not in (0, None), out
        root = root_cause(out)
        assert cause in root, f"agent {i}:\n{out}"
        if i == node0:  # the other node says where it happened
            assert re.search(rf"stopped because node 1 rank {rank} \([^)]*\): {re.escape(cause)}",
                             root), out


@pytest.mark.timeout(240)
def test_without_healthkit_the_other_node_hangs_and_names_nothing() -> None:
    """The same job and kill, stock: node 0's ranks (in a node-local wait) are still running
    long after node 1's helper died (until the collective timeout, 10 min here)."""
    job = Job(["--phase-a", "local"])
    try:
        job.wait_ready()
        _, helper = _helper_of_node_1(job)
        time.sleep(1.0)
        killed = _kill(helper)
        node0 = [pid for _, pid, _ in job.by_node(0).values()]
        gone = job.wait_gone(node0, killed, HUNG_AFTER_S)
    finally:
        results = job.finish(timeout=1)
    assert gone is None, "stock node 0 ended by itself:\n" + job.texts()
    assert not any("stopped because" in out for _, out in results)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", MODES)
def test_a_healthy_end_and_a_rank_that_finishes_early_publish_nothing(mode: str) -> None:
    """Every rank finishes (rank 3 at once, the others after 300 steps), disarming on the
    way: both agents succeed, no error file is written, no rank is stopped."""
    job = Job(["--healthkit", "--mode", mode, "--phase-a", "compute", "--phase-b", "compute",
               "--finish", "300", "--exit-early", "3"])  # fmt: skip
    try:
        job.wait_ready()
        results = job.finish(timeout=120)
    finally:
        job.kill_all()
    for rc, out in results:
        assert rc == 0, out
        assert "stopped because" not in out and "healthkit watchdog" not in out, out
    assert len(re.findall(r"JOB DONE", "\n".join(o for _, o in results))) == 4


def _stop_node_1(mode: str, stop: Callable[[Job], None],
                 between_agents: Callable[[], None] | None = None) -> str:
    """Node 0 and node 1 compute; ``stop`` stops node 1 the way a launcher or a user does.
    Node 1's ranks and helpers die of that stop, node 0's ranks go on (nobody told them to
    stop), no summary names a healthkit cause, and nothing says "stopped because"."""
    job = Job(["--healthkit", "--mode", mode, "--phase-a", "compute", "--phase-b", "compute"],
              between_agents=between_agents)
    try:
        job.wait_ready()
        time.sleep(SETTLE_S[mode])
        stop(job)
        node1 = [p for _, pid, helper in job.by_node(1).values() for p in (pid, helper)]
        assert job.wait_gone(node1, time.monotonic(), 60) is not None, job.texts()
        node0 = [pid for _, pid, _ in job.by_node(0).values()]
        still = job.wait_gone(node0, time.monotonic(), 4.0)
    finally:
        results = job.finish(timeout=1)
    assert still is None, "node 0 was stopped by node 1's stop:\n" + job.texts()
    for _, out in results:
        assert "stopped because" not in out, job.texts()
        assert "healthkit watchdog" not in root_cause(out), job.texts()
    return results[job.agents.index(job.agent_of(1))][1]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", MODES)
def test_a_launchers_stop_of_one_node_is_not_told_to_the_other(mode: str) -> None:
    """A scheduler preempts node 1: SIGTERM to its agent, which SIGTERMs its ranks' process
    groups (their helpers, sidecars and witnesses with them)."""
    node1 = _stop_node_1(mode, lambda job: job.agent_of(1).proc.send_signal(signal.SIGTERM))
    assert "closing signal SIGTERM" in node1, node1


def _wrap_the_pid_counter() -> None:
    """The next process gets the lowest pid again (as after 32,768 pids on a default
    machine), so agent 1 runs with a lower pid than agent 0."""
    with open(NS_LAST_PID, "w") as f:
        f.write(str(int(Path("/proc/sys/kernel/pid_max").read_text()) - 1))


NS_LAST_PID = "/proc/sys/kernel/ns_last_pid"


@pytest.mark.timeout(240)
@pytest.mark.skipif(not os.access(NS_LAST_PID, os.W_OK), reason="needs CAP_SYS_ADMIN")
def test_node_1_is_not_the_stores_host_when_the_pid_counter_wraps_between_the_agents() -> None:
    """c10d numbers the nodes by (address, agent pid). With one address for both agents, a
    pid wrap between their starts made the store's host node 1: a stop of node 1 took the
    store from node 0 and torchrun ended node 0 too (a failed CI run). The agents' addresses
    keep the first one node 0, whatever the pids."""
    _stop_node_1("thread", lambda job: job.agent_of(1).proc.send_signal(signal.SIGTERM),
                 between_agents=_wrap_the_pid_counter)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", MODES)
def test_a_ctrl_c_in_one_nodes_terminal_is_not_told_to_the_other(mode: str) -> None:
    """A user presses Ctrl-C in node 1's terminal: SIGINT to the agent's foreground process
    group (its ranks run in sessions of their own, so only the agent gets it). torchrun's
    agent takes it as a death signal and passes SIGINT itself on to each rank's process
    group (``_shutdown(SIGINT)`` -> ``killpg(rank, SIGINT)``): the ranks end in a
    KeyboardInterrupt, their helpers of the same SIGINT. A stop, not a failure."""
    node1 = _stop_node_1(mode, lambda job: os.killpg(job.agent_of(1).proc.pid, signal.SIGINT))
    assert "closing signal SIGINT" in node1, node1  # the ranks got SIGINT, not SIGTERM


@pytest.mark.timeout(240)
def test_a_ranks_own_oom_kill_is_named_on_its_node_and_on_the_other() -> None:
    """Rank 3 (node 1) is OOM-killed in a 256 MiB memory cgroup: the process beside it
    writes its error file (torchrun's root cause: OOM confirmed, with the rank's evidence)
    and tells the job, so node 0's summary names rank 3 too."""
    cgroup = memory_cgroup_or_skip(256 << 20, "rank-oom")
    try:
        job = Job(["--healthkit", "--phase-a", "compute", "--phase-b", "compute",
                   "--rank-oom", "3", "--cgroup", cgroup])  # fmt: skip
        try:
            job.wait_ready()
            node1 = [p for _, pid, helper in job.by_node(1).values() for p in (pid, helper)]
            gone = job.wait_gone(job.ranks(), time.monotonic(), 90)
        finally:
            results = job.finish()
    finally:
        remove_cgroup(cgroup)
    assert gone is not None and node1, job.texts()
    for rc, out in results:
        assert rc not in (0, None), out
        root = root_cause(out)
        assert re.search(r"rank 3 \(pid \d+\) was killed by SIGKILL: the kernel's OOM killer "
                         r"\(confirmed\)", root), out
    node0 = results[job.agents.index(job.agent_of(0))][1]
    assert re.search(r"stopped because node 1 rank 3 \([^)]*\): rank 3", root_cause(node0)), node0


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", MODES)
def test_a_restarted_job_is_not_ended_by_the_notice_of_the_round_before(mode: str) -> None:
    """torchrun restarts the job after node 1's helper dies (--max_restarts=1): the notice
    of round 0 ended round 0 on both nodes, and round 1 runs to its end on both. (Without a
    process group: gloo itself cannot restart two agents on one host here, stock or not:
    round 1's mesh connects to round 0's stale addresses in the agent store.)"""
    job = Job(["--healthkit", "--mode", mode, "--phase-a", "compute", "--phase-b", "compute",
               "--finish", "300", "--restarted-only", "--no-process-group"],
              max_restarts=1)  # fmt: skip
    try:
        job.wait_ready()
        _, helper = _helper_of_node_1(job)
        time.sleep(SETTLE_S[mode])
        _kill(helper)
        job.wait_ready(timeout=150, round=1)
        results = job.finish(timeout=150)
    finally:
        job.kill_all()
    for rc, out in results:
        assert rc == 0, out
    text = "\n".join(o for _, o in results)
    assert text.count("stopped because node 1 rank 2") >= 1, text  # round 0 was told
    assert text.count("JOB DONE") == 4, text  # round 1 ended normally on every rank


@pytest.mark.timeout(240)
def test_a_rank_that_exits_with_a_code_and_no_error_file_is_named_on_both_nodes() -> None:
    """Rank 3 calls sys.exit(5) (no @record, no error file): its witness stays through the
    interpreter's exit, writes rank 3's error file and, having waited for a notice that
    would explain it, tells the job."""
    job = Job(["--healthkit", "--phase-a", "compute", "--phase-b", "compute",
               "--rank-exits", "3:5", "--no-process-group"])  # fmt: skip
    try:
        job.wait_ready()
        gone = job.wait_gone(job.ranks(), time.monotonic(), 90)
    finally:
        results = job.finish()
    assert gone is not None, job.texts()
    for rc, out in results:
        assert rc not in (0, None), out
        assert re.search(r"rank 3 \(pid \d+\) exited with code 5", root_cause(out)), out
    node0 = results[job.agents.index(job.agent_of(0))][1]
    assert "stopped because node 1 rank 3" in root_cause(node0), node0


# ---------------------------------------------------------------- the notice itself
class Store:
    """A real TCPStore server in this process, and the links the test made to it. Torn
    down in order: links closed, server gone (their blocked waits then end), threads joined."""

    def __init__(self) -> None:
        self.servers = [dist.TCPStore("127.0.0.1", free_port(), is_master=True,
                                      wait_for_workers=False,
                                      timeout=datetime.timedelta(seconds=30))]
        self.port = self.servers[0].port
        self.links: list[StoreLink] = []

    def scope(self, restart: int = 0, rank: int = 0) -> JobScope:
        return JobScope(addr="127.0.0.1", port=self.port, run_id="t", restart=restart,
                        rank=rank, node_rank=rank, local_rank=0, host="h")

    def link(self, scope: JobScope, on: Callable[[JobFailure], None]) -> StoreLink:
        link = StoreLink(scope, on)
        self.links.append(link)
        return link

    def close(self) -> None:
        for link in self.links:
            link.close()
        for link in self.links:
            link.join(20)
        self.servers.clear()


@pytest.fixture(scope="module", autouse=True)
def _torch_store_singletons() -> None:
    """torch keeps a pipe for the life of the process from its first TCPStore on: made
    here, before the per-test leak check, it is not taken for a test's leak."""
    dist.TCPStore("127.0.0.1", free_port(), is_master=True, wait_for_workers=False)


@pytest.fixture
def store() -> Iterator[Store]:
    s = Store()
    yield s
    s.close()


def _failure(scope: JobScope) -> JobFailure:
    d = hk.ExitDiagnoser().diagnose(-9, name="sampler-server", pid=4242, evidence=False)
    return JobFailure.of(d, scope, origin_pid=1)


@pytest.mark.timeout(60)
def test_a_notice_from_one_restart_round_never_ends_the_next(store: Store) -> None:
    got: dict[int, JobFailure] = {}
    events = {r: threading.Event() for r in (0, 1)}

    def listener(restart: int) -> StoreLink:
        def on(f: JobFailure) -> None:
            got[restart] = f
            events[restart].set()
        return store.link(store.scope(restart, rank=5), on)

    round1 = listener(1)
    round0 = listener(0)
    publisher = store.link(store.scope(0, rank=1), lambda f: None)
    assert publisher.publish(_failure(publisher.scope))
    assert events[0].wait(10), "round 0's listener was not told"
    assert round0 is not round1
    assert not events[1].wait(1.5), "round 1 was told of round 0's failure"
    late = threading.Event()  # a listener that comes after the notice still gets it
    store.link(store.scope(0, rank=7), lambda f: late.set())
    assert late.wait(10)
    told = got[0].diagnosis()
    assert str(told).startswith("stopped because node 1 rank 1 (h): sampler-server (pid 4242)")
    assert told.signal is signal.SIGKILL and told.cause is hk.Cause.SIGKILL_UNCONFIRMED
    # Only the first failure is published: a second rank's is not (it is a consequence).
    assert not publisher.publish(_failure(publisher.scope))


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "raw",
    [b"\x00\xff not json", b'{"v": 2}', b'{"v": 1, "origin": 5}', b"[" * 20000,
     b'{"v": 1, "origin": "x", "evidence": [], "wall_time": "nan"}'],
)
def test_a_malformed_or_oversized_notice_is_ignored_not_obeyed(store: Store, raw: bytes) -> None:
    """The store is unauthenticated: a notice is data, checked field by field and bounded."""
    told = threading.Event()
    link = store.link(store.scope(), lambda f: told.set())
    forger = store.link(store.scope(rank=9), lambda f: None)
    assert forger.publish_raw(raw)
    link.join(10)  # it read the slot, refused the notice and ended
    assert not link._thread.is_alive()
    assert not told.is_set()
    with pytest.raises(ValueError):
        JobFailure.from_bytes(raw)


def test_the_switch_is_read_strictly() -> None:
    assert _jobnotice.notice_wanted(None, {}) is True
    assert _jobnotice.notice_wanted(None, {"HEALTHKIT_JOB_NOTICE": "0"}) is False
    assert _jobnotice.notice_wanted(None, {"HEALTHKIT_JOB_NOTICE": " off "}) is False
    assert _jobnotice.notice_wanted(False, {"HEALTHKIT_JOB_NOTICE": "1"}) is False
    with pytest.raises(hk.InvalidArgumentError, match="HEALTHKIT_JOB_NOTICE"):
        _jobnotice.notice_wanted(None, {"HEALTHKIT_JOB_NOTICE": "maybe"})
    with pytest.raises(hk.InvalidArgumentTypeError, match="job_notice"):
        hk.DisarmableWatchdog(job_notice="yes")  # type: ignore[arg-type]
    assert JobScope.from_env({}) is None
    assert JobScope.from_env({"MASTER_ADDR": "h", "MASTER_PORT": "99999"}) is None
    scope = JobScope.from_env({"MASTER_ADDR": "h", "MASTER_PORT": "29500", "RANK": "3",
                               "GROUP_RANK": "1", "TORCHELASTIC_RUN_ID": "r",
                               "TORCHELASTIC_RESTART_COUNT": "2"})
    assert scope is not None and scope.key == "healthkit/job-failure/v1/r/2/notice"
    assert scope.origin.startswith("node 1 rank 3 (")


@pytest.mark.timeout(300)
def test_the_two_node_demo_shows_the_hang_and_the_named_cause_on_both_nodes() -> None:
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "healthkit", "demo", "--scenario", "two-nodes",
         "--hang-timeout", "5"],
        capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    out = proc.stdout
    # The stock run's ranks (each in a session of its own, below the agent) are gone too
    # (zombies aside: init reaps them).
    left = []
    for line in subprocess.run(["ps", "-eo", "pid=,stat=,args="], capture_output=True,
                               text=True).stdout.splitlines():
        pid, stat, args = line.split(None, 2)
        if "healthkit._tools.demo_multinode" in args and not stat.startswith("Z"):
            left.append(pid)
    assert left == [], f"the demo left its ranks running: {left}"
    assert proc.returncode == 0, out + proc.stderr
    stock, guarded = out.split("[2/2] with healthkit")
    assert "STILL HUNG after 5 s" in stock and "(no summary: the node never ended)" in stock
    helper = re.search(r"killing node 1's sampler-server \(pid (\d+)\)", guarded)
    assert helper is not None, out
    cause = f"sampler-server (pid {helper.group(1)}) was killed by SIGKILL"
    assert re.search(rf"node 0's torchrun root cause: healthkit watchdog: stopped because "
                     rf"node 1 rank \d \([^)]*\): {re.escape(cause)}", guarded), out
    assert re.search(rf"node 1's torchrun root cause: healthkit watchdog: {re.escape(cause)}",
                     guarded), out


HOSTS_THE_STORE = """
import datetime, multiprocessing as mp, os, sys, time
import torch.distributed as dist
import healthkit as hk
from healthkit import _jobnotice

def sleeper():
    time.sleep(60)

if __name__ == "__main__":
    server = dist.TCPStore("127.0.0.1", int(sys.argv[1]), is_master=True,
                           wait_for_workers=False, timeout=datetime.timedelta(seconds=30))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1], RANK="0")
    helper = mp.get_context("fork").Process(target=sleeper, daemon=True)
    helper.start()
    wd = hk.DisarmableWatchdog([helper]).arm()
    assert _jobnotice._link is not None and _jobnotice._link._ready.wait(30)
    while _jobnotice._link._slot is None:
        time.sleep(0.01)
    if sys.argv[2] == "disarm":
        wd.disarm()
    print("EXITING", flush=True)
    # A normal exit: this process hosts the store (as rank 0 does when the launcher runs
    # none), so the listener's wait ends while the interpreter shuts down.
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["disarm", "at-exit"])
def test_a_rank_that_hosts_the_store_exits_cleanly_with_the_listener_waiting(
    how: str, tmp_path: Path
) -> None:
    """A daemon thread whose C++ wait returns during finalization aborts the process
    (SIGABRT, 'terminate called without an active exception'): the listener is woken
    through its own slot and joined before finalization, so a healthy exit stays 0."""
    import subprocess
    import sys

    script = tmp_path / "rank0.py"
    script.write_text(HOSTS_THE_STORE)
    proc = subprocess.run([sys.executable, str(script), str(free_port()), how],
                          capture_output=True, text=True, timeout=100)  # fmt: skip
    assert "EXITING" in proc.stdout, proc.stderr
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "terminate called" not in proc.stderr
