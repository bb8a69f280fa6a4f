"""Cluster-spec helpers: tzrec's shape ({"server": "h:p,...", "client_count": N}) from the
torchrun environment, through real gloo collectives and without torch.distributed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import healthkit_graphlearn as hkgl
import pytest
from healthkit_graphlearn import DistEnv
from testutil import free_port

import healthkit as hk

RANK_SCRIPT = Path(__file__).parent / "scripts" / "cluster_rank.py"


# --------------------------------------------------------------------------- environment
def test_the_environment_defaults_to_a_single_process() -> None:
    assert DistEnv.from_environ({}) == DistEnv(1, 0, 1, 0, 0)
    env = DistEnv.from_environ(
        {"WORLD_SIZE": "8", "RANK": "5", "LOCAL_WORLD_SIZE": "4", "LOCAL_RANK": "1",
         "GROUP_RANK": "1"}
    )  # fmt: skip
    assert (env.rank, env.local_rank, env.group_rank, env.group_size) == (5, 1, 1, 2)
    assert DistEnv.from_environ({"LOCAL_RANK": " "}) == DistEnv()  # blank counts as unset


@pytest.mark.parametrize(
    ("environ", "match"),
    [
        ({"WORLD_SIZE": "0"}, "WORLD_SIZE='0' is not an integer >= 1"),
        ({"RANK": "x"}, "RANK='x' is not an integer >= 0"),
        ({"WORLD_SIZE": "2", "RANK": "2"}, "RANK=2 must be < WORLD_SIZE=2"),
        ({"LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": "2", "WORLD_SIZE": "2"}, "LOCAL_RANK=2 must be"),
        ({"LOCAL_WORLD_SIZE": "4", "WORLD_SIZE": "2"}, "LOCAL_WORLD_SIZE=4 must be <="),
    ],
)
def test_a_bad_environment_is_rejected_naming_the_variable(
    environ: dict[str, str], match: str
) -> None:
    with pytest.raises(hk.InvalidArgumentError, match=match):
        DistEnv.from_environ(environ)


# --------------------------------------------------------------------------- no torch.distributed
def test_a_single_process_gets_its_own_server_without_torch() -> None:
    spec = hkgl.get_cluster_spec(3, host="127.0.0.1", port=4567, env=DistEnv())
    assert spec == {"server": "127.0.0.1:4567", "client_count": 3}
    free = hkgl.get_cluster_spec(host="127.0.0.1", env=DistEnv())
    host, port = str(free["server"]).split(":")
    assert host == "127.0.0.1" and 0 < int(port) < 65536


def test_without_torch_distributed_a_multi_process_job_is_refused() -> None:
    # tzrec would return this node's own address (or "0.0.0.0:0" on local rank 1).
    if "torch.distributed" in sys.modules:
        import torch.distributed as dist

        assert not dist.is_initialized()
    with pytest.raises(hk.UsageError, match="init_process_group"):
        hkgl.get_cluster_spec(host="127.0.0.1", env=DistEnv(world_size=2, local_world_size=2))
    with pytest.raises(hk.UsageError, match="init_process_group"):
        hkgl.get_cluster_spec(env=DistEnv(world_size=2, rank=1, local_world_size=2, local_rank=1))


def test_only_local_rank_0_passes_an_address() -> None:
    with pytest.raises(ValueError, match="must pass its address"):
        hkgl.exchange_server_addresses(None, env=DistEnv())
    with pytest.raises(ValueError, match="pass None on the other ranks"):
        hkgl.exchange_server_addresses(
            "h:1", env=DistEnv(world_size=2, rank=1, local_world_size=2, local_rank=1)
        )
    with pytest.raises(ValueError, match="exchange must be"):
        hkgl.exchange_server_addresses("h:1", env=DistEnv(), exchange="broadcast")  # type: ignore[arg-type]


def test_client_task_indexes_follow_tzrec_and_never_collide() -> None:
    env = DistEnv(world_size=4, rank=2, local_world_size=2, local_rank=0, group_rank=1)
    assert hkgl.client_task_index(1, num_client_per_rank=2, env=env) == 5  # 2 x RANK + id
    assert hkgl.client_task_index(num_client_per_rank=3, client_id_bias=2, env=env) == 8
    assert hkgl.client_task_index(env=DistEnv()) == 0  # main process: client id 0
    with pytest.raises(ValueError, match="raise num_client_per_rank"):
        hkgl.client_task_index(2, num_client_per_rank=2, env=env)
    with pytest.raises(ValueError, match="num_client_per_rank must be an int >= 1"):
        hkgl.client_task_index(0, num_client_per_rank=0, env=env)


# --------------------------------------------------------------------------- real gloo
def _run_ranks(
    tmp_path: Path, exchange: str, host: str, nodes: list[int]
) -> list[dict[str, object]]:
    """One process per rank; ``nodes[i]`` is the node (GROUP_RANK) of rank i."""
    world = len(nodes)
    port = free_port()
    procs = []
    for rank, node in enumerate(nodes):
        local = [r for r, n in enumerate(nodes) if n == node]
        env = {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "WORLD_SIZE": str(world), "RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(len(local)), "LOCAL_RANK": str(local.index(rank)),
            "GROUP_RANK": str(node), "OMP_NUM_THREADS": "1",
        }  # fmt: skip
        cmd = [sys.executable, str(RANK_SCRIPT), exchange, host]
        procs.append(
            subprocess.Popen(
                cmd,
                cwd=tmp_path,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    outs = []
    deadline = time.monotonic() + 200  # one bound for the whole job, within the test's 240 s
    try:
        for p in procs:
            out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            assert p.returncode == 0, err[-3000:]
            line = next(ln for ln in out.splitlines() if ln.startswith("SPEC "))
            outs.append(json.loads(line[5:]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate()
    return outs


@pytest.mark.timeout(240)
def test_all_reduce_gives_every_rank_the_servers_in_node_order(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    # 2 nodes x 2 ranks; node N's server listens on 127.0.0.(N+1) (all loopback).
    outs = _run_ranks(tmp_path, "all_reduce", "127.0.0.{node}", [0, 0, 1, 1])
    specs = [o["spec"] for o in outs]
    assert all(s == specs[0] for s in specs)
    servers = str(specs[0]["server"]).split(",")  # type: ignore[index]
    assert [s.rpartition(":")[0] for s in servers] == ["127.0.0.1", "127.0.0.2"]
    assert specs[0]["client_count"] == 8  # type: ignore[index]  # 4 ranks x 2 clients
    assert sorted(t for o in outs for t in o["tasks"]) == list(range(8))  # type: ignore[attr-defined]


@pytest.mark.timeout(240)
def test_all_gather_carries_host_names_and_uneven_nodes(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    # 3 ranks on node 0, 1 on node 1: tzrec's all_reduce table cannot describe this.
    outs = _run_ranks(tmp_path, "all_gather", "localhost", [0, 0, 0, 1])
    specs = [o["spec"] for o in outs]
    assert all(s == specs[0] for s in specs)
    servers = str(specs[0]["server"]).split(",")  # type: ignore[index]
    assert len(servers) == 2 and all(s.startswith("localhost:") for s in servers)


def test_the_servers_port_is_picked_below_the_ephemeral_range_and_free() -> None:
    """As the tests' own picker: a port from bind(0) is where every connect() and torch's
    RPC listeners take theirs, so one of the job's own sockets could take it first."""
    import socket

    from testutil import ephemeral_ports

    low, _ = ephemeral_ports()
    ports = {hkgl.free_port() for _ in range(20)}
    assert all(10000 <= p < low for p in ports), sorted(ports)
    assert len(ports) > 1
    port = hkgl.free_port("0.0.0.0")
    with socket.socket() as s:
        s.bind(("0.0.0.0", port))  # free: the server can bind it
