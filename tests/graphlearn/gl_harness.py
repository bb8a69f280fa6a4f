"""Helpers for tests that run a real Alibaba graph-learn (GL) sampler server and clients.

Importing this module does not import GL (nor numpy): every helper that needs GL takes the
module returned by ``healthkit_graphlearn._tzrec.gl_import.import_graphlearn()`` or calls it itself.

Run GL only in a *subprocess* of the pytest process (see ``test_gl_smoke.py``): GL writes glog
files into the current directory, starts native threads, and a client call against a dead server
holds the GIL for up to ~17 min with GL's default retry settings.

The flow mirrors tzrec's NegativeSampler (tzrec/datasets/sampler.py): a node table with a
``id:int64<TAB>weight:float<TAB>attrs:string`` header, ``gl.Graph().node(path, "item",
decoder=gl.Decoder(attr_types=..., weighted=True, attr_delimiter=":"))``,
``gl.set_tracker_mode(0)``, cluster ``{"server": "ip:port", "client_count": N}``, a server process
running ``init(job_name="server") -> server_get_stats() -> close()`` and clients running
``init(job_name="client", task_index=i)`` then
``negative_sampler("item", k, strategy="node_weight").get(ids)``.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import sys
import time
from collections.abc import Mapping
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from types import ModuleType
from typing import Any

# tests/: the shared test helpers, also for the scripts that import this module.
_TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _TESTS not in sys.path:
    sys.path.append(_TESTS)
from testutil import free_port as free_port  # noqa: E402

NODE_TYPE = "item"
ATTR_TYPES = ("int", "int", "string")  # what write_node_file puts in the attrs column


def write_node_file(path: str | os.PathLike[str], num_nodes: int = 100) -> str:
    """Write a tzrec-style weighted node table: ids ``0..num_nodes-1``, weight 1, 3 attrs."""
    with open(path, "w", encoding="utf-8") as f:
        f.write("id:int64\tweight:float\tattrs:string\n")
        for i in range(num_nodes):
            f.write(f"{i}\t1\t{i}:{i + 1000}:s{i}\n")
    return os.fspath(path)


def build_graph(gl: ModuleType, node_file: str) -> Any:
    """The graph tzrec's NegativeSampler builds: one weighted node type with attributes."""
    decoder = gl.Decoder(attr_types=list(ATTR_TYPES), weighted=True, attr_delimiter=":")
    return gl.Graph().node(node_file, node_type=NODE_TYPE, decoder=decoder)


def cluster_spec(port: int, client_count: int = 1, host: str = "127.0.0.1") -> dict[str, int | str]:
    """One server on ``host:port`` serving ``client_count`` clients (tzrec's shape)."""
    return {"server": f"{host}:{port}", "client_count": client_count}


def server_main(
    graph: Any,
    cluster: Mapping[str, int | str],
    task_index: int = 0,
    ready: Connection | None = None,
) -> None:
    """Target of the (fork) server process: init, report readiness, serve until all clients stop.

    ``graph.init(job_name="server")`` returns once the data is loaded and served ("Data is ready
    for serving"); ``graph.close()`` then blocks until every one of ``client_count`` clients has
    called ``close()`` (forever if one never does). The stats are read and dropped, as tzrec does.
    """
    graph.init(cluster=dict(cluster), job_name="server", task_index=task_index)
    if ready is not None:
        ready.send(os.getpid())
        ready.close()
    graph.server_get_stats()
    graph.close()


def start_server(
    graph: Any, cluster: Mapping[str, int | str], ready_timeout: float = 60.0
) -> BaseProcess:
    """Fork a daemon server process and wait until it serves (or dies, or the timeout passes).

    Waiting for readiness before the first client call matters: without it the first call
    fails and GL's client retries with 2, 4, ... s sleeps (first sample after ~6 s instead of
    ~4 s), and shortening GL's retries before the server is ready makes start-up fail.
    """
    ctx = multiprocessing.get_context("fork")  # the graph object cannot be pickled
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(
        target=server_main, args=(graph, cluster, 0, send), daemon=True, name="gl-server"
    )
    proc.start()
    send.close()
    try:
        ready = multiprocessing.connection.wait([recv, proc.sentinel], timeout=ready_timeout)
        if recv not in ready:
            stop_process(proc)
            raise RuntimeError(
                f"GL server did not become ready in {ready_timeout} s (exitcode {proc.exitcode})"
            )
        recv.recv()
    finally:
        recv.close()
    return proc


def stop_process(proc: BaseProcess, grace: float = 5.0) -> int | None:
    """Join ``proc``; SIGTERM it after ``grace`` s, SIGKILL 5 s later. Returns the exit code."""
    proc.join(grace)
    if proc.exitcode is None:
        proc.terminate()
        proc.join(5.0)
    if proc.exitcode is None:
        proc.kill()
        proc.join()
    return proc.exitcode


def run_smoke(
    workdir: str, num_nodes: int = 100, batch: int = 4, expand: int = 2
) -> dict[str, Any]:
    """Server (fork) + one client in this process: negative-sample once, tear down cleanly.

    Must run with ``workdir`` as the current directory (glog writes files there). Returns plain
    data for the caller to assert on.
    """
    from healthkit_graphlearn._tzrec.gl_import import import_graphlearn

    gl = import_graphlearn()
    t0 = time.monotonic()
    node_file = write_node_file(os.path.join(workdir, "items.txt"), num_nodes)
    graph = build_graph(gl, node_file)
    cluster = cluster_spec(free_port(), client_count=1)
    gl.set_tracker_mode(0)
    server = start_server(graph, cluster)
    t_ready = time.monotonic()
    # Safe only now that the server is ready: a failing call gives up after 2 + 4 s, not 17 min.
    gl.set_retry_times(3)
    gl.set_timeout(10)
    graph.init(task_index=0, job_name="client", cluster=cluster)
    sampler = graph.negative_sampler(NODE_TYPE, expand, strategy="node_weight")
    nodes = sampler.get(list(range(batch)))
    t_sampled = time.monotonic()
    ids = nodes.ids.tolist()
    graph.close()  # client stop: lets the server's close() return
    exitcode = stop_process(server, grace=15.0)
    return {
        "ids": ids,
        "server_pid": server.pid,
        "server_exitcode": exitcode,
        "ready_s": t_ready - t0,
        "first_sample_s": t_sampled - t_ready,
        "teardown_s": time.monotonic() - t_sampled,
    }


if __name__ == "__main__":  # python gl_harness.py: a manual smoke run in a temp dir
    import json
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        os.chdir(d)
        print(json.dumps(run_smoke(d)))
