"""A rank that owns a real GL sampler server through launch_sampler_server, driven by the tests.

Run it with a scratch directory as the current directory (GL writes glog files there).
It prints ``READY server=<pid> sidecar=<pid or 0>`` once the server serves (and, for the
sampling scenarios, once the first sample came back), then plays its scenario:

  sample       clients sample (``--workers 0``: in this process; N: in N DataLoader workers),
               print ``RESULT <json>``, then return from main *without* stopping anything
               (the interpreter-exit teardown path)
  sample-stop  the same, then ``server.stop()`` after the client closed
  stop-kill-after  ``server.stop(kill_after=1.0)`` on the SIGSTOPped server (the old keyword
               ``timeout=`` refused first); print ``RESULT`` with the warnings caught
  duplicate    launch twice; print whether the second call returned the same handle
  serve        sleep (an idle owner) until killed
  sample-loop  sample in a loop in this process (a GL call is in flight almost always)
  exit-after-death  kill the server and leave main at once, before the watcher can run
  startup-death / ready-timeout   launch a server that cannot become ready
  startup-exception   launch a server whose graph.init() raises a Python exception (GL's
               own ValueError for a cluster schema it rejects; the launcher's checks let no
               such schema through, so the graph object's init raises it here)
  background   ``wait=False``: print ``LAUNCHED`` at once, check ``wait_ready`` (a short
               timeout raises, a long one returns), hold until ``--hold`` s after the launch,
               sample in this process, print ``RESULT``
  background-death   ``wait=False`` with a node file that does not exist (the server aborts
               while loading); ``--arm 0``: print how ``wait_ready`` raised; else sleep
  background-deadline   ``wait=False`` with ``--ready-timeout`` shorter than loading takes
  stall        ``stall_timeout=--stall-timeout`` (T), clients in ``--workers`` DataLoader
               workers, each call inside ``server_call()``. Slow: the server is SIGSTOPped
               for 0.4 T then continued, over and over, for 3 T while batches are read;
               idle: no batch read for 2 T, the server stopped all along; then a batch is
               read with the server still stopped (print ``WAITING <monotonic>``): the rank
               must be failed with the server's state and stacks
  stall-stop   the same clients; the server stopped and a call in flight, this process is
               sent SIGTERM (handled: a graceful stop), takes 2 T to stop, continues the
               server and exits 0: nothing may fire
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import gl_harness
import healthkit_graphlearn as hkgl

SKIP_RC = 77
EXPAND = 2


def _ready(server: hkgl.SamplerServer | None) -> None:
    sidecar = 0
    if server is not None and server.watchdog.sidecar_pid is not None:
        sidecar = server.watchdog.sidecar_pid
    pid = server.pid if server is not None else 0
    print(f"READY server={pid} sidecar={sidecar}", flush=True)


def _sample_main(gl: Any, graph: Any, cluster: dict[str, Any], n: int) -> list[list[int]]:
    gl.set_tracker_mode(0)
    graph.init(task_index=hkgl.client_task_index(), job_name="client", cluster=cluster)
    sampler = graph.negative_sampler(gl_harness.NODE_TYPE, EXPAND, strategy="node_weight")
    return [row for i in range(n) for row in sampler.get([i % 100, (i + 1) % 100]).ids.tolist()]


def _negative_samples(
    gl: Any, graph: Any, cluster: dict[str, Any], workers: int, length: int, timed: bool
) -> Any:
    """A dataset whose DataLoader workers each open their own GL client lazily, as tzrec's
    sampler does; ``timed``: each sampling call is one the rank times (server_call)."""
    import contextlib

    import torch
    from torch.utils.data import Dataset

    class NegativeSamples(Dataset[Any]):
        def __init__(self) -> None:
            self.sampler: Any = None

        def __len__(self) -> int:
            return length

        def __getitem__(self, i: int) -> Any:
            if self.sampler is None:
                gl.set_tracker_mode(0)
                task = hkgl.client_task_index(num_client_per_rank=workers)
                graph.init(task_index=task, job_name="client", cluster=cluster)
                self.sampler = graph.negative_sampler(
                    gl_harness.NODE_TYPE, EXPAND, strategy="node_weight"
                )
            with hkgl.server_call() if timed else contextlib.nullcontext():
                ids = self.sampler.get([i % 100]).ids.reshape(-1)
            return torch.as_tensor(ids), torch.tensor(os.getpid())

    return NegativeSamples()


def _sample_workers(gl: Any, graph: Any, cluster: dict[str, Any], workers: int) -> dict[str, Any]:
    from torch.utils.data import DataLoader

    samples = _negative_samples(gl, graph, cluster, workers, 8, timed=False)
    pids: set[int] = set()
    ids: list[int] = []
    for batch_ids, batch_pids in DataLoader(samples, batch_size=2, num_workers=workers):
        ids += batch_ids.reshape(-1).tolist()
        pids.update(batch_pids.tolist())
    return {"ids": ids, "client_pids": sorted(pids)}


def _stall(args: Any, gl: Any, graph: Any, cluster: dict[str, Any]) -> int:
    import signal
    import threading

    from torch.utils.data import DataLoader

    workers, T = args.workers, args.stall_timeout
    server = hkgl.launch_sampler_server(graph, cluster, 0, mode=args.mode, stall_timeout=T)
    assert server is not None

    samples = _negative_samples(gl, graph, cluster, workers, 100_000, timed=True)
    loader = DataLoader(samples, batch_size=2, num_workers=workers)
    batches = iter(loader)
    pids = {int(p) for _ in range(2 * workers) for p in next(batches)[1].tolist()}
    print("WORKERS " + " ".join(map(str, sorted(pids))), flush=True)
    _ready(server)
    if args.scenario == "stall-stop":
        stops: list[int] = []
        signal.signal(signal.SIGTERM, lambda sig, frame: stops.append(sig))
        time.sleep(0.5)  # the prefetches complete; then no call is in flight
        os.kill(server.pid, signal.SIGSTOP)
        next(batches)  # a prefetched batch: its worker now calls the stopped server
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGTERM)  # a launcher's stop, handled gracefully
        time.sleep(2 * T)  # the call stays unanswered past T while the stop is under way
        os.kill(server.pid, signal.SIGCONT)
        next(batches)
        server.stop()
        print("RESULT " + json.dumps({"stops": stops}), flush=True)
        return 0
    # Slow: answers held back 0.4 T at a time, for 3 T.
    done = threading.Event()

    def hold_back() -> None:
        while not done.wait(0.05):
            os.kill(server.pid, signal.SIGSTOP)
            time.sleep(0.4 * T)
            os.kill(server.pid, signal.SIGCONT)

    slowing = threading.Thread(target=hold_back)
    slowing.start()
    read = 0
    until = time.monotonic() + 3 * T
    while time.monotonic() < until:
        next(batches)
        read += 1
    done.set()
    slowing.join()
    time.sleep(0.5)  # the prefetches complete; then no call is in flight
    os.kill(server.pid, signal.SIGSTOP)
    print(f"IDLE {read} batches read while slowed", flush=True)
    time.sleep(2 * T)  # idle: the stopped server is no stall while nobody calls it
    print(f"WAITING {time.monotonic()}", flush=True)
    next(batches)  # its worker's next call is never answered
    time.sleep(60)
    print("NOT FIRED", flush=True)
    return 1


def _background(args: Any, gl: Any, graph: Any, cluster: dict[str, Any]) -> int:
    started = time.monotonic()
    server = hkgl.launch_sampler_server(
        graph,
        cluster,
        0,
        mode=args.mode,
        wait=False,
        ready_timeout=args.ready_timeout,
        arm=bool(args.arm),
    )
    assert server is not None
    launched = {"after_s": time.monotonic() - started, "ready": server.ready}
    launched["ready_after"] = server.ready_after
    print("LAUNCHED " + json.dumps(launched), flush=True)
    _ready(server)
    if args.scenario == "background-death" and not args.arm:
        try:
            server.wait_ready(60)
        except hkgl.SamplerServerError as e:
            d = getattr(e, "diagnosis", None)
            print("RAISED " + json.dumps({
                "type": type(e).__name__,
                "message": str(e),
                "signal": d.signal.name if d is not None and d.signal else None,
            }), flush=True)  # fmt: skip
            server.stop()
            return 0
        return 1
    if args.scenario != "background":
        time.sleep(600)  # the watchdog ends this process
        return 1
    result: dict[str, Any] = {}
    try:
        server.wait_ready(0.01)
        result["short_wait"] = "returned"
    except hkgl.SamplerServerTimeoutError as e:
        result["short_wait"] = type(e).__name__ + ": " + str(e)
    result["ready_after"] = server.wait_ready(60)
    result["ready"] = server.ready
    time.sleep(max(0.0, args.hold - (time.monotonic() - started)))
    result["alive_after_hold"] = server.is_alive()
    rows = _sample_main(gl, graph, cluster, 4)
    result["ids"] = [i for row in rows for i in row]
    result["repr"] = repr(server)
    print("RESULT " + json.dumps(result), flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("scenario")
    ap.add_argument("--mode", default="sidecar")
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--shorten", type=int, default=0, help="shorten_client_retries(N) if N > 0")
    ap.add_argument("--ready-timeout", type=float, default=None)
    ap.add_argument("--hold", type=float, default=0.0)
    ap.add_argument("--arm", type=int, default=1)
    ap.add_argument("--stall-timeout", type=float, default=1.0)
    args = ap.parse_args()
    logging.basicConfig(
        stream=sys.stderr, level=logging.INFO, format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        gl = hkgl.import_graphlearn()
    except hkgl.GraphLearnImportError as e:
        print(e, file=sys.stderr)
        return SKIP_RC

    node_file = gl_harness.write_node_file(Path.cwd() / "items.txt")
    if args.scenario in ("startup-death", "background-death"):
        node_file = str(Path.cwd() / "missing-items.txt")  # GL aborts while loading it
    graph = gl_harness.build_graph(gl, node_file)
    clients = max(args.workers, 1)
    cluster: dict[str, Any] = hkgl.get_cluster_spec(clients, host="127.0.0.1")

    if args.scenario == "startup-exception":

        def init(*args: Any, **kwargs: Any) -> None:
            raise ValueError("Invalid cluster schema")  # GL's deploy_in_server_mode

        graph.init = init  # the forked server inherits it

    if args.scenario in ("startup-death", "ready-timeout", "startup-exception"):
        timeout = 0.5 if args.scenario == "ready-timeout" else None
        started = time.monotonic()
        try:
            hkgl.launch_sampler_server(graph, cluster, 0, mode=args.mode, ready_timeout=timeout)
        except hkgl.SamplerServerError as e:
            import multiprocessing

            d = getattr(e, "diagnosis", None)
            print("RAISED " + json.dumps({
                "type": type(e).__name__,
                "message": str(e),
                "signal": d.signal.name if d is not None and d.signal else None,
                "cause": d.cause.name if d is not None else None,
                "exception": d.exception.summary if d is not None and d.exception else None,
                "after_s": time.monotonic() - started,
                "children": [p.pid for p in multiprocessing.active_children()],
            }), flush=True)  # fmt: skip
            return 0
        print("NOT RAISED", flush=True)
        return 1

    if args.scenario.startswith("background"):
        return _background(args, gl, graph, cluster)

    if args.scenario.startswith("stall"):
        return _stall(args, gl, graph, cluster)

    server = hkgl.launch_sampler_server(graph, cluster, 0, mode=args.mode)
    assert server is not None

    if args.scenario == "duplicate":
        again = hkgl.launch_sampler_server(graph, cluster, 0, mode=args.mode)
        other = hkgl.launch_sampler_server(graph, {**cluster, "client_count": 9}, 0, mode=args.mode)
        import multiprocessing

        _ready(server)
        print(f"SAME {again is server and other is server}", flush=True)
        servers = [p for p in multiprocessing.active_children() if "sampler server" in p.name]
        print(f"COUNT {len(servers)}", flush=True)
        return 0

    if args.scenario == "exit-after-death":
        # The server dies and the main thread exits at once, before the watcher can report:
        # what a client's UnavailableError propagating out of main looks like.
        _ready(server)
        import ctypes
        import signal

        os.kill(server.pid, signal.SIGKILL)
        siginfo = ctypes.create_string_buffer(128)
        # libc waitid through PyDLL keeps the GIL: the watcher thread cannot run meanwhile.
        # P_PID = 1; WEXITED | WNOWAIT: wait until it is a zombie, without reaping it.
        ctypes.PyDLL(None).waitid(1, server.pid, siginfo, os.WEXITED | os.WNOWAIT)
        sys.exit(3)

    if args.scenario == "serve":
        _ready(server)
        time.sleep(600)
        return 1

    if args.scenario == "stop-kill-after":
        import signal
        import warnings

        _ready(server)
        outcome: dict[str, Any] = {"server_pid": server.pid}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                server.stop(timeout=1.0)  # type: ignore[call-arg]
            except TypeError as e:
                outcome["old_name_refused"] = "timeout" in str(e)
            outcome["alive_after_refusal"] = server.is_alive()
            # Stopped, it cannot act on SIGTERM: only the SIGKILL `kill_after` seconds later
            # ends it, so the time stop() takes shows which value it used.
            os.kill(server.pid, signal.SIGSTOP)
            started = time.monotonic()
            outcome["stop_exitcode"] = server.stop(kill_after=1.0)
            outcome["stop_s"] = time.monotonic() - started
        outcome["warnings"] = [f"{w.category.__name__}: {w.message}" for w in caught]
        print("RESULT " + json.dumps(outcome), flush=True)
        return 0

    if args.scenario == "sample-loop":
        gl.set_tracker_mode(0)
        graph.init(task_index=0, job_name="client", cluster=cluster)
        sampler = graph.negative_sampler(gl_harness.NODE_TYPE, EXPAND, strategy="node_weight")
        sampler.get([0, 1])
        if args.shorten:
            hkgl.shorten_client_retries(args.shorten)
        _ready(server)
        calls = 0
        while True:  # the test SIGKILLs the server; this call then blocks holding the GIL
            sampler.get(list(range(64)))
            calls += 1

    if args.workers == 0:
        rows = _sample_main(gl, graph, cluster, 4)
        result: dict[str, Any] = {"ids": [i for row in rows for i in row]}
        result["client_pids"] = [os.getpid()]
    else:
        result = _sample_workers(gl, graph, cluster, args.workers)
    result["server_pid"] = server.pid
    result["server_alive"] = server.is_alive()
    _ready(server)
    if args.scenario == "sample-stop":
        if args.workers == 0:
            graph.close()  # the client's goodbye lets the server's close() return by itself
        result["stop_exitcode"] = server.stop(grace=15.0 if args.workers == 0 else 0.0)
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
