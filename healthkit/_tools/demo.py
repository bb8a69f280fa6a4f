"""``healthkit demo``: the hang healthkit prevents, side by side with the fix, on real processes.

Each scenario runs a small job twice, the way a launcher (torchrun) would: once with the stock
pattern, bounded here by ``--hang-timeout`` and reported as "still hung", once with healthkit.
Nothing is simulated except scale: the helper really dies (a real OOM kill when this machine
lets us put it in a memory cgroup with a small limit, else a real SIGKILL, which is what the OOM
killer sends), and the job really hangs or fails.
"""

from __future__ import annotations

import ctypes
import json
import multiprocessing as mp
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

import attrs

from healthkit._actions import TORCHELASTIC_ERROR_FILE
from healthkit._barrier import BarrierBrokenError, BoundedBarrier
from healthkit._diagnose.evidence import find_memory_cgroup
from healthkit._os.bounds import env_seconds
from healthkit._watch.process import ProcessWatch, WatchSet
from healthkit._watch.stop import stop
from healthkit._watchdog import DisarmableWatchdog

SCENARIOS = ("server-oom", "worker-crash-at-init", "worker-hang-at-init", "helper-stall",
             "two-nodes", "dataloader-oom")
COLLECTIVE_TIMEOUT_S = 1800.0  # NCCL's default, and what the stuck rank would wait for
SERVER_MEMORY_LIMIT = 256 * 1024 * 1024
INIT_TIMEOUT_ENV = "SAMPLING_RPC_INIT_TIMEOUT_SECONDS"  # the demo's knob, GiGL-style
INIT_TIMEOUT_DEFAULT_S = 2.0  # x 3 = a 6 s init bound (GiGL: 3 x 600 s)
STALL_TIMEOUT_S = 2.0  # the demo's progress bound (a real sampler: 30 to 300 s)


# ---------------------------------------------------------------------------- the job
def _quiet(log_path: str) -> None:
    """Send this rank's stderr to its log file, as a launcher's log redirection would, and
    lead a process group of its own so the demo can stop everything it started."""
    os.setpgrp()
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stderr = os.fdopen(2, "w", buffering=1)


def _sampler_server(queue: Any, cgroup_dir: str | None) -> None:
    """Feeds batches and keeps them cached, a slow leak: under a memory limit, the OOM killer
    ends it. Without a limit, the demo kills it the way the OOM killer does."""
    if cgroup_dir is not None:
        with open(os.path.join(cgroup_dir, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    cache = []
    for i in range(100_000):
        if cgroup_dir is not None:
            cache.append(bytearray(8 * 1024 * 1024))  # touched pages: real memory
            for j in range(0, len(cache[-1]), 4096):
                cache[-1][j] = 1
        queue.put(i)
        time.sleep(0.05)


def _rank(rank: int, guarded: bool, barrier: Any, log_path: str, info: Any,
          cgroup_dir: str | None) -> None:
    _quiet(log_path)
    queue = None
    if rank == 0:
        ctx = mp.get_context("fork")
        queue = ctx.Queue()
        server = ctx.Process(
            target=_sampler_server, args=(queue, cgroup_dir), name="sampler-server", daemon=True
        )
        server.start()
        info.value = server.pid
        if guarded:
            DisarmableWatchdog([server]).arm()
    while True:  # the training loop
        if queue is not None:
            queue.get()  # a batch from the server: blocks forever once it is dead
        barrier.wait(COLLECTIVE_TIMEOUT_S)  # the collective (all_reduce)


def refresh_neighbour_cache(cache: Any, index: Any) -> None:
    """The server's cache refresher: takes the index, then the cache."""
    with index:
        time.sleep(0.1)
        with cache:
            pass


def _stalling_server(queue: Any, heartbeat: Any, stalled_at: Any) -> None:
    """Feeds batches, then deadlocks: its refresher takes two locks in the opposite order to
    the sampling loop. Alive, silent, holding everything up."""
    import threading

    if heartbeat is not None:
        heartbeat.attach()  # its stacks are readable without interrupting it
    cache, index = threading.Lock(), threading.Lock()
    for i in range(100_000):
        if i == 20:
            threading.Thread(
                target=refresh_neighbour_cache, args=(cache, index), daemon=True
            ).start()
            stalled_at.value = time.monotonic()
            with cache:
                time.sleep(0.1)
                with index:  # deadlock: the refresher holds index and waits for cache
                    pass
        queue.put(i)
        if heartbeat is not None:
            heartbeat.beat()
        time.sleep(0.05)


def _stall_rank(rank: int, guarded: bool, barrier: Any, log_path: str, info: Any,
                stalled_at: Any) -> None:
    _quiet(log_path)
    queue = None
    watch = None
    if rank == 0:
        from healthkit._progress import ProgressWatch

        ctx = mp.get_context("fork")
        queue = ctx.Queue()
        watch = ProgressWatch(STALL_TIMEOUT_S, name="sampler-server", who="rank 0") if guarded \
            else None
        server = ctx.Process(
            target=_stalling_server,
            args=(queue, watch.heartbeat if watch is not None else None, stalled_at),
            name="sampler-server",
            daemon=True,
        )
        server.start()
        info.value = server.pid
        if watch is not None:
            watchdog = DisarmableWatchdog([server])
            watchdog.watch_progress(watch)
            watchdog.arm()
    while True:  # the training loop
        if queue is not None:
            if watch is not None:
                with watch.expecting("a batch"):
                    queue.get()
            else:
                queue.get()  # blocks forever once the server is stuck
        barrier.wait(COLLECTIVE_TIMEOUT_S)  # the collective (all_reduce)


def connect_to_feature_store() -> None:
    time.sleep(3600)  # a worker stuck in its initialisation


def _sampling_worker(rank: int, scenario: str, plain_barrier: Any, bounded: Any) -> None:
    if bounded is not None:
        bounded.enable_stack_dumps()
    time.sleep(0.2)  # RPC set-up, sampler start
    if rank == 1 and scenario == "worker-crash-at-init":
        ctypes.string_at(0)  # a native crash (SIGSEGV) in an extension
    if rank == 1 and scenario == "worker-hang-at-init":
        connect_to_feature_store()
    try:
        if bounded is not None:
            bounded.worker_wait(rank)
        else:
            plain_barrier.wait()
        time.sleep(3600)  # the task loop
    except BarrierBrokenError:
        pass  # released by a broken barrier: teardown runs, the worker exits


def _producer(scenario: str, guarded: bool, log_path: str, error_file: str) -> None:
    _quiet(log_path)
    ctx = mp.get_context("spawn")
    bounded = (
        BoundedBarrier(
            2,
            timeout=3 * env_seconds(INIT_TIMEOUT_ENV, INIT_TIMEOUT_DEFAULT_S, multiplier=3),
            hint=f"raise ${INIT_TIMEOUT_ENV} (this bound is 3 x it)",
            ctx=ctx,
            name="sampling init barrier",
            worker_label="sampling worker",
        )
        if guarded else None
    )
    plain = ctx.Barrier(3) if not guarded else None
    workers = [
        ctx.Process(target=_sampling_worker, args=(r, scenario, plain, bounded), daemon=True)
        for r in range(2)
    ]
    for w in workers:
        w.start()
    if bounded is None:
        assert plain is not None
        plain.wait()  # the stock producer: unbounded (GiGL's bound is 3 x 600 s)
        return
    def teardown(error: BarrierBrokenError) -> None:
        stop(workers, kill_after=5, name="sampling workers")

    try:
        bounded.wait(workers, on_failure=teardown)
    except BarrierBrokenError as e:
        with open(error_file, "w") as f:
            json.dump({"message": {"message": str(e), "extraInfo": {"py_callstack": str(e)}}}, f)
        raise
    finally:
        bounded.close()


# ---------------------------------------------------------------------------- launcher
@attrs.define
class RunResult:
    outcome: str  # "hung" or "failed"
    seconds: float  # hang: how long we waited; failure: from the helper's death
    root_cause: str | None
    helper_death: str | None


class Console:
    """Writes to a terminal or a log file; the progress line is redrawn only on a TTY."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.tty = out.isatty()
        self._last_progress = -1.0

    def line(self, text: str = "") -> None:
        if self.tty and self._last_progress >= 0:
            self.out.write("\r\033[K")
        self._last_progress = -1.0
        self.out.write(text + "\n")
        self.out.flush()

    def progress(self, text: str, elapsed: float) -> None:
        if self.tty:
            self.out.write(f"\r\033[K  {text} {elapsed:5.1f} s")
            self.out.flush()
            self._last_progress = elapsed
        elif elapsed - self._last_progress >= 5.0 or self._last_progress < 0:
            self.out.write(f"  {text} {elapsed:5.1f} s\n")
            self.out.flush()
            self._last_progress = elapsed


@contextmanager
def _memory_cgroup() -> Iterator[str | None]:
    """A child memory cgroup with a small limit, when this machine lets us make one."""
    cg = find_memory_cgroup()
    if cg is None:
        yield None
        return
    path = os.path.join(cg.path, f"healthkit-demo-{os.getpid()}")
    try:
        os.mkdir(path)
        limit = "memory.limit_in_bytes" if cg.version == 1 else "memory.max"
        with open(os.path.join(path, limit), "w") as f:
            f.write(str(SERVER_MEMORY_LIMIT))
        if cg.version == 1 and os.path.exists(os.path.join(path, "memory.memsw.limit_in_bytes")):
            with open(os.path.join(path, "memory.memsw.limit_in_bytes"), "w") as f:
                f.write(str(SERVER_MEMORY_LIMIT))
        if cg.version == 2 and os.path.exists(os.path.join(path, "memory.swap.max")):
            with open(os.path.join(path, "memory.swap.max"), "w") as f:
                f.write("0")
    except OSError:
        try:
            os.rmdir(path)
        except OSError:
            pass
        yield None
        return
    try:
        yield path
    finally:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.rmdir(path)
                break
            except OSError:
                time.sleep(0.05)  # its last process is still exiting


def _stop_all(watches: list[ProcessWatch]) -> None:
    stop(watches, name="demo processes")


def _run_server_scenario(guarded: bool, hang_timeout: float, console: Console,
                         tmp: str) -> RunResult:
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(2)
    server_pid = ctx.Value("i", 0)
    with _memory_cgroup() as cgroup_dir:
        logs = [os.path.join(tmp, f"rank{r}-{guarded}.log") for r in range(2)]
        errs = [os.path.join(tmp, f"rank{r}-{guarded}.error.json") for r in range(2)]
        ranks = []
        for r in range(2):
            os.environ[TORCHELASTIC_ERROR_FILE] = errs[r]  # per rank, as torchrun sets it
            p = ctx.Process(target=_rank, args=(r, guarded, barrier, logs[r], server_pid,
                                                cgroup_dir), name=f"rank {r}")
            p.start()
            ranks.append(p)
        os.environ.pop(TORCHELASTIC_ERROR_FILE, None)
        watches = [ProcessWatch(p, name=p.name) for p in ranks]
        try:
            while server_pid.value == 0:
                if any(w.poll() is not None for w in watches):
                    raise RuntimeError("a rank died during start-up; see " + ", ".join(logs))
                time.sleep(0.01)
            server = ProcessWatch(server_pid.value, name="sampler-server")
            console.line(
                f"  job running: rank 0 (pid {ranks[0].pid}) with sampler-server "
                f"(pid {server.pid}), rank 1 (pid {ranks[1].pid})"
            )
            if cgroup_dir is None:
                time.sleep(1.0)
                console.line("  killing sampler-server with SIGKILL, as the OOM killer does "
                             "(no memory cgroup could be set up here)")
                server.kill()
            else:
                console.line(f"  sampler-server leaks memory under a "
                             f"{SERVER_MEMORY_LIMIT >> 20} MiB limit; the OOM killer will end it")
            server.wait()
            died_at = time.monotonic()
            death = _describe_server_death(server)
            server.close()
            console.line(f"  sampler-server died: {death}")
            return _watch_job(watches, died_at, hang_timeout, console, errs, logs)
        finally:
            _end_ranks(watches, ranks)


def _run_stall_scenario(guarded: bool, hang_timeout: float, console: Console,
                        tmp: str) -> RunResult:
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(2)
    server_pid = ctx.Value("i", 0)
    stalled_at = ctx.Value("d", 0.0)
    logs = [os.path.join(tmp, f"stall-rank{r}-{guarded}.log") for r in range(2)]
    errs = [os.path.join(tmp, f"stall-rank{r}-{guarded}.error.json") for r in range(2)]
    ranks = []
    for r in range(2):
        os.environ[TORCHELASTIC_ERROR_FILE] = errs[r]
        p = ctx.Process(target=_stall_rank,
                        args=(r, guarded, barrier, logs[r], server_pid, stalled_at),
                        name=f"rank {r}")
        p.start()
        ranks.append(p)
    os.environ.pop(TORCHELASTIC_ERROR_FILE, None)
    watches = [ProcessWatch(p, name=p.name) for p in ranks]
    try:
        while server_pid.value == 0 or stalled_at.value == 0.0:
            if any(w.poll() is not None for w in watches):
                raise RuntimeError("a rank died during start-up; see " + ", ".join(logs))
            time.sleep(0.01)
        console.line(
            f"  job running: rank 0 (pid {ranks[0].pid}) with sampler-server "
            f"(pid {server_pid.value}), rank 1 (pid {ranks[1].pid})"
        )
        console.line("  sampler-server deadlocks on two locks after 20 batches: it stays alive")
        return _watch_job(watches, stalled_at.value, hang_timeout, console, errs, logs,
                          since="the helper stalled")
    finally:
        _end_ranks(watches, ranks)


def _end_ranks(watches: list[ProcessWatch], ranks: list[Any]) -> None:
    """Stop the demo's ranks, release their watches and end each rank's process group."""
    _stop_all(watches)
    for w in watches:
        w.close()
    for p in ranks:
        p.join(5)
        _kill_group(p.pid)


def _kill_group(pgid: int | None) -> None:
    """Stop what a rank left behind (the stock pattern orphans its helpers)."""
    if pgid is None:
        return
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _describe_server_death(server: ProcessWatch) -> str:
    status = server.status
    if status is None or status.returncode is None:
        return "exit status not visible to the launcher"
    sig = status.signal
    return f"killed by {sig.name}" if sig else f"exit code {status.returncode}"


def _watch_job(watches: list[ProcessWatch], died_at: float, hang_timeout: float,
               console: Console, errs: list[str], logs: list[str],
               since: str = "the helper died") -> RunResult:
    """What torchrun does: wait for a rank to fail, then stop the others."""
    with WatchSet(watches) as ws:
        while True:
            elapsed = time.monotonic() - died_at
            if elapsed >= hang_timeout:
                console.line(f"  STILL HUNG after {hang_timeout:.0f} s")
                return RunResult("hung", hang_timeout, None, None)
            ended = ws.wait(min(0.2, hang_timeout - elapsed))
            failed = [w for w in ended if w.status is not None and w.status.returncode != 0]
            if failed:
                seconds = time.monotonic() - died_at
                rank = watches.index(failed[0])
                root = _read_error_file(errs[rank]) or _last_lines(logs[rank])
                console.line(f"  JOB FAILED {seconds * 1000:.0f} ms after {since} "
                             f"({failed[0].name} exited with code {failed[0].status.returncode}"  # type: ignore[union-attr]
                             "; the other ranks were stopped)")
                return RunResult("failed", seconds, root, None)
            for w in ended:
                ws.remove(w)
            console.progress("waiting for the job to notice...", time.monotonic() - died_at)


def _read_error_file(path: str) -> str | None:
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    text = data["message"]["extraInfo"]["py_callstack"]
    return str(text).strip()


def _last_lines(path: str, n: int = 3) -> str | None:
    try:
        with open(path) as f:
            lines = [ln.rstrip() for ln in f if ln.strip()]
    except OSError:
        return None
    return "\n".join(lines[-n:]) or None


def _run_init_scenario(scenario: str, guarded: bool, hang_timeout: float, console: Console,
                       tmp: str) -> RunResult:
    ctx = mp.get_context("spawn")
    log = os.path.join(tmp, f"producer-{guarded}.log")
    err = os.path.join(tmp, f"producer-{guarded}.error.json")
    producer = ctx.Process(target=_producer, args=(scenario, guarded, log, err),
                           name="producer (rank 0)")
    start = time.monotonic()
    producer.start()
    console.line(f"  job running: producer (pid {producer.pid}) spawning 2 sampling workers; "
                 + ("worker 1 crashes during init" if "crash" in scenario
                    else "worker 1 hangs during init"))
    watch = ProcessWatch(producer, name="producer (rank 0)")
    try:
        while True:
            elapsed = time.monotonic() - start
            if elapsed >= hang_timeout:
                console.line(f"  STILL HUNG after {hang_timeout:.0f} s: the producer waits at its "
                             "init barrier")
                return RunResult("hung", hang_timeout, None, None)
            status = watch.wait(min(0.2, hang_timeout - elapsed))
            if status is not None:
                seconds = time.monotonic() - start
                console.line(f"  JOB FAILED after {seconds:.2f} s (producer exit code "
                             f"{status.returncode})")
                return RunResult("failed", seconds, _read_error_file(err) or _last_lines(log),
                                 None)
            console.progress("waiting for the producer's init barrier...", elapsed)
    finally:
        _stop_all([watch])
        watch.close()
        producer.join(5)
        _kill_group(producer.pid)


def run(scenario: str, hang_timeout: float, out: TextIO = sys.stdout) -> dict[str, RunResult]:
    """Run one scenario without and with healthkit; print the story; return both results."""
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; choose one of {', '.join(SCENARIOS)}")
    if scenario == "two-nodes":  # torchrun agents: its own module (it needs torch)
        from healthkit._tools import demo_multinode as _demo_multinode

        two = _demo_multinode.run(hang_timeout, out)
        return {
            label: RunResult("hung" if "HUNG" in outcome else "failed", hang_timeout,
                             "\n".join(causes), None)
            for label, (outcome, causes) in two.items()
        }
    console = Console(out)
    if scenario == "dataloader-oom":
        return _run_dataloader_scenario(console, hang_timeout)
    # The stock producer, killed at the end of its run, leaves its barrier's semaphores to
    # multiprocessing's resource tracker, which would warn about them; that is the demo's
    # own clean-up, not something to show the reader.
    os.environ["PYTHONWARNINGS"] = "ignore:resource_tracker:UserWarning"
    intro = {
        "server-oom": "A 2-rank job: rank 0 owns a sampler server that feeds it batches; every "
        f"step both ranks meet in a collective (timeout {COLLECTIVE_TIMEOUT_S:.0f} s, NCCL's "
        "default). Then the sampler server runs out of memory.",
        "worker-crash-at-init": "A sampling producer spawns 2 workers and waits for them at an "
        "init barrier. Worker 1 crashes in native code (SIGSEGV) during its initialisation.",
        "worker-hang-at-init": "A sampling producer spawns 2 workers and waits for them at an "
        "init barrier. Worker 1 hangs in connect_to_feature_store() during its initialisation.",
        "helper-stall": "A 2-rank job: rank 0 owns a sampler server that feeds it batches; every "
        f"step both ranks meet in a collective (timeout {COLLECTIVE_TIMEOUT_S:.0f} s). Then the "
        "sampler server deadlocks: alive, but it never sends another batch. With healthkit, "
        f"rank 0 expects a batch within {STALL_TIMEOUT_S:.0f} s of progress (a ProgressWatch).",
    }[scenario]
    console.line(f"healthkit demo: {scenario}")
    console.line(intro)
    results: dict[str, RunResult] = {}
    with tempfile.TemporaryDirectory(prefix="healthkit-demo-") as tmp:
        for label, guarded in (("without healthkit", False), ("with healthkit", True)):
            console.line()
            console.line(f"[{'2/2' if guarded else '1/2'}] {label}")
            runner: Callable[..., RunResult] = (
                _run_server_scenario if scenario == "server-oom"
                else _run_stall_scenario if scenario == "helper-stall"
                else lambda g, h, c, t: _run_init_scenario(scenario, g, h, c, t)
            )
            # The guarded run is bounded by healthkit itself; the ceiling only stops a
            # regression from hanging the demo.
            ceiling = max(hang_timeout, 60.0) if guarded else hang_timeout
            result = runner(guarded, ceiling, console, tmp)
            if result.root_cause:
                console.line("  root cause, as the launcher reports it:")
                for ln in result.root_cause.splitlines():
                    console.line(f"    {ln}")
            results[label] = result
    console.line()
    console.line("Summary")
    for label, r in results.items():
        since = {"server-oom": "after the helper died",
                 "helper-stall": "after the helper stalled"}.get(scenario, "after start")
        what = (f"still hung after {r.seconds:.0f} s; the log names no cause"
                if r.outcome == "hung" else f"failed {r.seconds:.2f} s {since}, cause named")
        console.line(f"  {label + ':':20s} {what}")
    return results


def _run_dataloader_scenario(console: Console, hang_timeout: float) -> dict[str, RunResult]:
    """A DataLoader worker OOM-killed: the error the training loop gets, stock and watched."""
    from healthkit._tools import demo_dataloader as _demo_dataloader

    console.line("healthkit demo: dataloader-oom")
    console.line("A training loop reads a DataLoader with 2 worker processes. Worker 1 keeps a "
                 f"cache that grows until it runs out of memory (a {SERVER_MEMORY_LIMIT >> 20} "
                 "MiB memory cgroup).")
    results: dict[str, RunResult] = {}
    with _memory_cgroup() as cgroup_dir:
        if cgroup_dir is None:
            console.line("  (no memory cgroup could be set up here: worker 1 is SIGKILLed "
                         "instead, as the OOM killer would; healthkit then says unconfirmed)")
        for label, guarded in (("without healthkit", False), ("with healthkit_torch", True)):
            console.line()
            console.line(f"[{'2/2' if guarded else '1/2'}] {label}")
            took, error = _demo_dataloader.run_one(guarded, cgroup_dir,
                                                   max(hang_timeout, 60.0) * 3)
            console.line(f"  the training loop ended after {took:.1f} s (start-up included) with:")
            console.line(f"    {error}")
            results[label] = RunResult("failed", took, error, None)
    console.line()
    console.line("Summary")
    for label, r in results.items():
        named = "OOM confirmed" if "OOM killer (confirmed)" in (r.root_cause or "") else (
            "cause unconfirmed" if "unconfirmed" in (r.root_cause or "") else "no cause named")
        console.line(f"  {label + ':':22s} {named}")
    return results
