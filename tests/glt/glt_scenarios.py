"""Fault scenarios for healthkit_glt, each run as a script in its own process group.

Why subprocesses: a stock GLT hang (and any regression of ours) blocks inside C++ where no
Python-level timeout can interrupt it; a throwaway session can always be SIGKILLed as a
group at its deadline, and its leaked SysV segments removed by creator pid.

Run one by hand::

    .venv-glt/bin/python tests/glt/glt_scenarios.py hk-epoch-sigkill 0.5

Each scenario prints ``RESULT {json}`` lines that the tests parse. The worker loops and the
sampler factories below are module-level so that spawned workers can unpickle them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import glt_fixtures as fx
import glt_procs as procs
import glt_stock_hangs as stock

HERE = os.path.dirname(os.path.abspath(__file__))


# --- pluggable pieces used by the scenarios (run inside the spawned workers) --------------


MARKERS_ENV = "HK_TEST_MARKERS"  # where a hang says when it was reached (CLOCK_MONOTONIC)


def hang_in_sampler_factory(**kwargs: Any) -> Any:
    """A sampler factory stuck forever (the stack dump must name this function). It first
    writes when it got here: a bound that expired before then tested no stack."""
    markers = os.environ.get(MARKERS_ENV)
    if markers:
        with open(os.path.join(markers, f"reached-{os.getpid()}"), "w") as f:
            f.write(repr(time.monotonic()))
    while True:
        time.sleep(3600)


def failing_sampler_factory(**kwargs: Any) -> Any:
    raise ValueError(f"bad fan-out [5, 5] for this partition (injected by the test at "
                     f"t={time.time():.6f})")  # fmt: skip


def rank1_raises_loop(ctx: Any) -> None:
    """Default loop, but worker 1's sampler factory raises (after init_rpc, like a real
    sampler construction error)."""
    import healthkit_glt as hg

    if ctx.rank == 1:
        ctx.sampler_factory = failing_sampler_factory
    hg.default_worker_loop(ctx)


def rank1_hangs_loop(ctx: Any) -> None:
    import healthkit_glt as hg

    if ctx.rank == 1:
        ctx.sampler_factory = hang_in_sampler_factory
    hg.default_worker_loop(ctx)


def rank0_late_loop(ctx: Any) -> None:
    """Worker 0 reaches the barrier 20 s late; worker 1 writes a marker just before it
    waits there (the test then SIGKILLs worker 1 after it arrived)."""
    import healthkit_glt as hg

    sampler = None
    try:
        hg.init_sampling_worker(ctx)
        sampler = hg.start_sampler(ctx)
        if ctx.rank == 0:
            time.sleep(20)
        else:
            open(os.path.join(ctx.extra["markers"], "1"), "w").close()
        hg.pass_init_barrier(ctx)
        hg.run_task_loop(ctx, sampler)
    except hg.BarrierBrokenError:
        pass
    finally:
        hg.teardown_sampling_worker(sampler)


def rpc_timeout_reporting_loop(ctx: Any) -> None:
    """A custom worker loop (GiGL-style) built from the public steps that also reports the
    RPC timeout in force before and after the init barrier, read from inside the worker."""
    import healthkit_glt as hg
    from torch.distributed import rpc

    sampler = None
    try:
        hg.init_sampling_worker(ctx)
        before = rpc.get_rpc_timeout()
        sampler = hg.start_sampler(ctx)
        hg.pass_init_barrier(ctx)
        after = rpc.get_rpc_timeout()
        path = os.path.join(ctx.extra["report_dir"], f"rpc-timeout-{ctx.rank}.json")
        with open(path, "w") as f:
            json.dump({"before": before, "after": after}, f)
        hg.run_task_loop(ctx, sampler)
    finally:
        hg.teardown_sampling_worker(sampler)


def rank1_raises_mid_epoch_loop(ctx: Any) -> None:
    """Default life, but worker 1 raises once the epoch's first command came (past the
    barrier, the consumer waiting in recv()): an error of the worker itself, not of a
    sampling call, so it ends the worker (exit code 1) through its teardown."""
    import healthkit_glt as hg

    if ctx.rank != 1:
        hg.default_worker_loop(ctx)
        return
    sampler = None
    try:
        hg.init_sampling_worker(ctx)
        sampler = hg.start_sampler(ctx)
        hg.pass_init_barrier(ctx)
        ctx.task_queue.get()  # the epoch's SAMPLE_ALL
        raise RuntimeError("feature store connection lost (injected by the test)")
    finally:
        hg.teardown_sampling_worker(sampler)


# --- scenario helpers ---------------------------------------------------------------------


def _say(msg: str) -> None:
    print(f"[scenario {time.monotonic():.3f}] {msg}", flush=True)


def _result(**fields: Any) -> None:
    print("RESULT " + json.dumps(fields, default=str), flush=True)


def _kill_a_worker_during_init(victim: int, after: float, stamp: list[float]) -> None:
    def killer() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            pids = procs.spawned_worker_pids()
            if len(pids) == 2:
                time.sleep(after)
                os.kill(pids[victim], signal.SIGKILL)
                stamp.append(time.monotonic())
                _say(f"SIGKILLed sampling worker {victim} (pid {pids[victim]}) during init")
                return
            time.sleep(0.005)

    threading.Thread(target=killer, name="scenario-killer", daemon=True).start()


def _hk_loader(dataset: Any, **kwargs: Any) -> Any:
    import healthkit_glt as hg

    return fx.build_loader(dataset, fx.make_worker_options(), loader_cls=hg.DistNeighborLoader,
                          **kwargs)  # fmt: skip


def _error_fields(e: BaseException) -> dict[str, Any]:
    return {"type": type(e).__name__, "mro": [c.__name__ for c in type(e).__mro__],
            "message": str(e)}  # fmt: skip


# --- scenarios ----------------------------------------------------------------------------


def scenario_hk_init_sigkill(after: float = 0.5) -> None:
    """healthkit_glt: SIGKILL worker 0 during init; the loader must raise within seconds."""
    import healthkit as hk

    fx.init_single_process_context()
    dataset = fx.build_dataset()
    stamp: list[float] = []
    _kill_a_worker_during_init(0, after, stamp)
    t0 = time.monotonic()
    try:
        _hk_loader(dataset, rpc_init_timeout=60)
    except hk.BarrierBrokenError as e:
        now = time.monotonic()
        _result(outcome="raised", after_kill_s=now - stamp[0] if stamp else None,
                elapsed_s=now - t0, exit_codes=e.exit_codes,
                causes=[p.diagnosis.cause.name for p in e.dead if p.diagnosis],
                segments_left=procs.sysv_shm_created_by([os.getpid()]),
                children_left=procs.spawned_worker_pids(), **_error_fields(e))  # fmt: skip
        return
    _result(outcome="built")


def scenario_hk_init_sigkill_arrived(after: float = 0.3) -> None:
    """healthkit_glt: SIGKILL worker 1 ``after`` s after it arrived at the init barrier
    (worker 0 is 20 s late); the loader must raise within milliseconds."""
    import tempfile

    import healthkit as hk

    fx.init_single_process_context()
    dataset = fx.build_dataset()
    markers = tempfile.mkdtemp(prefix="hk-arrived-")
    stamp: list[float] = []

    def killer() -> None:
        deadline = time.monotonic() + 90
        while not os.listdir(markers) and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(after)
        pids = procs.spawned_worker_pids()
        os.kill(pids[1], signal.SIGKILL)
        stamp.append(time.monotonic())
        _say(f"SIGKILLed sampling worker 1 (pid {pids[1]}) at the init barrier")

    threading.Thread(target=killer, name="scenario-killer", daemon=True).start()
    try:
        _hk_loader(dataset, rpc_init_timeout=60, worker_loop=rank0_late_loop,
                   worker_extra={"markers": markers})  # fmt: skip
    except hk.BarrierBrokenError as e:
        now = time.monotonic()
        _result(outcome="raised", after_kill_s=now - stamp[0] if stamp else None,
                exit_codes=e.exit_codes, arrived_dead=[p.rank for p in e.dead if p.arrived],
                segments_left=procs.sysv_shm_created_by([os.getpid()]),
                children_left=procs.spawned_worker_pids(), **_error_fields(e))  # fmt: skip
        return
    _result(outcome="built")


def scenario_hk_shutdown_mid_epoch(grace: float = 0.5) -> None:
    """healthkit_glt: ``shutdown()`` while both workers are parked in ``send()`` with the
    ring full (the consumer stopped reading mid-epoch): STOP cannot be read, so the
    teardown escalates; every step must be logged at WARNING and the segment released with
    the loader still referenced."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    fx.init_single_process_context()
    loader = _hk_loader(fx.build_dataset(), grace=grace, kill_after=5.0)
    workers = loader.producer.workers
    it = iter(loader)
    held = fx.clone_batch(next(it))  # a clone: no view into the ring outlives the shutdown
    time.sleep(1.0)  # the ring fills with unread batches; both workers park in send()
    t = time.monotonic()
    loader.shutdown()
    took = time.monotonic() - t
    _result(outcome="shut down", shutdown_s=took, worker_exit_codes=[w.exitcode for w in workers],
            segments_left=procs.sysv_shm_created_by([os.getpid()]),
            children_left=procs.spawned_worker_pids())  # fmt: skip
    del held


def _reached_before(markers: str, pid: int | None, moment: float) -> bool:
    """Whether process ``pid`` wrote its "reached the hang" marker before ``moment``."""
    try:
        with open(os.path.join(markers, f"reached-{pid}")) as f:
            return float(f.read()) < moment
    except (OSError, ValueError):
        return False


def _init_failure(loop_name: str, **kwargs: Any) -> None:
    import shutil
    import tempfile

    import healthkit as hk

    fx.init_single_process_context()
    dataset = fx.build_dataset()
    markers = os.environ[MARKERS_ENV] = tempfile.mkdtemp(prefix="hk-markers-")
    t0 = time.monotonic()
    try:
        _hk_loader(dataset, worker_loop=globals()[loop_name], **kwargs)
    except hk.BarrierBrokenError as e:
        now = time.time()
        raised = [float(x) for x in re.findall(r"injected by the test at t=([0-9.]+)", str(e))]
        # The stuck workers that were in their hang when their stacks were dumped: that
        # came after the barrier measured ``elapsed`` from its start (later than t0).
        reached = [p.rank for p in e.not_arrived if _reached_before(markers, p.pid, t0 + e.elapsed)]
        _result(outcome="raised", elapsed_s=time.monotonic() - t0, exit_codes=e.exit_codes,
                hang_reached=reached,
                causes=[p.diagnosis.cause.name for p in e.dead if p.diagnosis],
                not_arrived=[p.rank for p in e.not_arrived],
                after_raise_s=now - raised[0] if raised else None,
                # the failed producer is still referenced (by this traceback's frames)
                segments_left=procs.sysv_shm_created_by([os.getpid()]),
                children_left=procs.spawned_worker_pids(), **_error_fields(e))  # fmt: skip
        return
    finally:
        shutil.rmtree(markers, ignore_errors=True)
    _result(outcome="built")


def scenario_hk_init_raise() -> None:
    """healthkit_glt: worker 1's sampler factory raises during init."""
    _init_failure("rank1_raises_loop", rpc_init_timeout=60)


def scenario_hk_init_hang(rpc_init_timeout: float = 30.0, k: float = 1.0) -> None:
    """healthkit_glt: worker 1 hangs in its sampler factory; the bound (k x bring-up) ends it."""
    _init_failure("rank1_hangs_loop", rpc_init_timeout=rpc_init_timeout, init_timeout_multiplier=k)


def scenario_hk_epoch_sigkill(
    pre_kill_sleep: float = 0.5, hold: float = 0, receiver: str = "auto"
) -> None:
    """healthkit_glt: SIGKILL worker 1 after the first batch of an epoch.

    ``pre_kill_sleep``: a slow consumer before the kill, so the workers are parked in
    ``ShmChannel.send`` with ring slots claimed (the case ``recv(timeout_ms)`` cannot end).
    ``hold``: keep the first batch (its ring slot) until after the kill, so both workers
    are parked with claimed slots and the dead one's may be next in line.
    ``receiver``: the producer's receiver mode (``auto``: the ring reader).
    """
    import healthkit_glt as hg

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    fx.init_single_process_context()
    loader = _hk_loader(fx.build_dataset(), receiver=receiver)
    workers = loader.producer.workers
    _say(f"loader ready; worker pids {[w.pid for w in workers]}")
    it = iter(loader)
    batch = next(it)
    if not hold:
        del batch
    time.sleep(pre_kill_sleep)
    os.kill(workers[1].pid, signal.SIGKILL)
    killed = time.monotonic()
    if hold:
        del batch
    _say(f"SIGKILLed sampling worker 1 (pid {workers[1].pid}) after batch 1")
    n = 1
    try:
        while True:  # next(), not a for loop: iter() again would start another epoch
            try:
                batch = next(it)
            except StopIteration:
                break
            n += 1
            del batch
    except hg.SamplingWorkerDiedError as e:
        now = time.monotonic()
        d = e.diagnosis
        again = None
        try:
            iter(loader)
        except hg.SamplingWorkerDiedError as e2:
            again = e2 is e
        _result(outcome="raised", after_kill_s=now - killed, batches=n, rank=e.rank,
                exit_code=d.exit_code, signal=d.signal.name if d.signal else None,
                cause=d.cause.name, worker_exit_codes=[w.exitcode for w in workers],
                children_left=procs.spawned_worker_pids(), same_error_on_reuse=again,
                receiver_thread_stuck=any(t.name == "healthkit-glt receiver"
                                          for t in threading.enumerate()),
                **_error_fields(e))  # fmt: skip
        loader.shutdown()  # idempotent: already torn down
        return
    _result(outcome="finished", batches=n)


def _records_of(directory: str, pids: Sequence[int]) -> dict[int, list[str]]:
    """The exception records ``pids`` left in ``directory`` (by name: exception-PID-...)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return {}
    return {p: sorted(n for n in names if n.startswith(f"exception-{p}-")) for p in pids}


def scenario_hk_epoch_raise() -> None:
    """healthkit_glt: worker 1 raises mid-epoch (an error of the worker, not of a sampling
    call); its exception is recorded (healthkit.record_exception) and named by the loader's
    error; worker 0, torn down by the producer, leaves no record."""
    import tempfile

    import healthkit_glt as hg

    records = tempfile.mkdtemp(prefix="hk-records-")
    os.environ["HEALTHKIT_RECORD_DIR"] = records  # the spawned workers inherit it
    fx.init_single_process_context()
    loader = _hk_loader(fx.build_dataset(), worker_loop=rank1_raises_mid_epoch_loop)
    workers = loader.producer.workers
    try:
        for batch in loader:
            del batch
    except hg.SamplingWorkerDiedError as e:
        d = e.diagnosis
        _result(outcome="raised", rank=e.rank, cause=d.cause.name, exit_code=d.exit_code,
                exception=d.exception.summary if d.exception else None,
                records=_records_of(records, [w.pid for w in workers]),
                worker_pids=[w.pid for w in workers],
                children_left=procs.spawned_worker_pids(), **_error_fields(e))  # fmt: skip
        return
    finally:
        loader.shutdown()
    _result(outcome="finished")


def scenario_hk_epoch_stop(how: str = "group") -> None:
    """healthkit_glt mid-epoch, in a process that handles SIGTERM and goes on (a training
    loop that saves a checkpoint on it). ``group``: another process SIGTERMs this process's
    whole group, as torchrun stops a worker; the sampling workers die of it. ``alone``:
    worker 1 alone gets a SIGTERM, nothing stops this process. ``kill``: the group stop,
    and worker 1 SIGKILLed as it comes. ``ctrl-c``: a Ctrl-C in the terminal (SIGINT to the
    foreground group): the workers end of it, this process catches the KeyboardInterrupt (as
    a notebook cell does) and asks for the next batch. ``ctrl-c-alone``: worker 1 alone gets
    the SIGINT. ``ctrl-c-exit``: the group's Ctrl-C, not caught: the script ends with the
    KeyboardInterrupt's traceback. Reports how the loader ended, and every line it logged at
    ERROR."""
    import subprocess

    import healthkit_glt as hg

    errors: list[str] = []

    class Errors(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.ERROR:
                errors.append(record.getMessage())

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger().addHandler(Errors())
    stops: list[float] = []
    signal.signal(signal.SIGTERM, lambda s, f: stops.append(time.monotonic()))
    fx.init_single_process_context()
    loader = _hk_loader(fx.build_dataset())
    workers = loader.producer.workers
    it = iter(loader)
    batch = next(it)
    del batch
    time.sleep(0.5)  # the ring fills; the workers park in send()
    if how == "kill":  # SIGKILL first: it cannot be the stop's share, whenever seen
        os.kill(workers[1].pid, signal.SIGKILL)
    # Sent by another process, as torchrun sends it: torch's worker handler exits 0 on its
    # parent's SIGTERM and dies of anyone else's. A negative pid: the whole group.
    target = workers[1].pid if how.endswith("alone") else -os.getpgrp()
    sig = signal.SIGINT if how.startswith("ctrl-c") else signal.SIGTERM
    interrupts = 0
    try:
        subprocess.run([sys.executable, "-c", "import os, sys; "
                        "os.kill(int(sys.argv[1]), int(sys.argv[2]))", str(target), str(int(sig))],
                       start_new_session=True, check=True, timeout=60)  # fmt: skip
        _say(f"stop sent ({how})")
        if how in ("ctrl-c", "ctrl-c-exit"):
            time.sleep(30)  # the KeyboardInterrupt comes here at the latest
    except KeyboardInterrupt:
        if how == "ctrl-c-exit":
            _say("KeyboardInterrupt: not caught")
            raise
        interrupts += 1
        _say("KeyboardInterrupt caught; asking for the next batch")
    n = 1
    try:
        while True:
            try:
                batch = next(it)
            except StopIteration:
                break
            n += 1
            del batch
    except (hg.SamplingStoppedError, hg.SamplingWorkerDiedError) as e:
        again = None
        try:
            iter(loader)
        except (hg.SamplingStoppedError, hg.SamplingWorkerDiedError) as e2:
            again = type(e2).__name__
        _result(outcome="raised", batches=n, stops_seen=len(stops), errors=errors,
                interrupts=interrupts,
                ranks=list(getattr(e, "ranks", [getattr(e, "rank", None)])),
                worker_exit_codes=[w.exitcode for w in workers], again=again,
                children_left=procs.spawned_worker_pids(), **_error_fields(e))  # fmt: skip
        loader.shutdown()
        return
    _result(outcome="finished", batches=n)


def _ring_has_claimed_block(shmid: int | None) -> bool | None:
    """Whether the ring's write block id is ahead of its read block id (read from the
    segment itself: the producer's teardown has released the channel object by now)."""
    from healthkit_glt._adapter.ring import RingLayoutError, RingView

    if shmid is None:
        return None
    try:
        ring = RingView.attach(shmid)
    except RingLayoutError:
        return None
    try:
        return ring.claimed() > 0
    finally:
        ring.close()


def _shm_perms(shmid: int) -> str | None:
    return next((r["perms"] for r in procs.sysv_shm_rows() if int(r["shmid"]) == shmid), None)


def scenario_hk_stuck_slot(wait_before_kill: float = 1.5, receiver: str = "auto") -> None:
    """healthkit_glt: make the next ring block one that a dead worker claimed.

    The consumer keeps two batches (a capacity-2 ring's every slot), so the next writer
    claims a block and waits for slot space; ``next()`` then waits for that block. Both
    workers are SIGKILLed there: the loader must still raise. With ``receiver="thread"``
    the helper thread is in the C++ wait on that block for good: the producer must say so
    and mark the segment for removal (the thread keeps it attached, so GLT's destructor
    never removes it). The ring reader never enters that wait: no thread, nothing stuck.
    """
    import healthkit_glt as hg

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    fx.init_single_process_context()
    from healthkit_glt._adapter.ring import channel_shmid

    loader = _hk_loader(fx.build_dataset(), receiver=receiver)
    producer = loader.producer
    shmid = channel_shmid(producer.output_channel)
    workers = producer.workers
    it = iter(loader)
    held = [next(it), next(it)]
    killed: list[float] = []

    def killer() -> None:
        time.sleep(wait_before_kill)
        for w in workers:
            os.kill(w.pid, signal.SIGKILL)
        killed.append(time.monotonic())
        _say(f"SIGKILLed both sampling workers {[w.pid for w in workers]}")

    threading.Thread(target=killer, name="scenario-killer", daemon=True).start()
    try:
        next(it)
    except hg.SamplingWorkerDiedError as e:
        now = time.monotonic()
        stuck = any(t.name == "healthkit-glt receiver" and t.is_alive()
                    for t in threading.enumerate())  # fmt: skip
        _result(outcome="raised", after_kill_s=now - killed[0], rank=e.rank,
                signal=e.diagnosis.signal.name if e.diagnosis.signal else None,
                receiver_thread_stuck=stuck, shmid=shmid, shm_perms=_shm_perms(shmid),
                # A claimed block that no receive has taken: the ring reader's case.
                claimed_block_left=_ring_has_claimed_block(shmid),
                children_left=procs.spawned_worker_pids(), **_error_fields(e))  # fmt: skip
    else:
        _result(outcome="returned")
    del held
    loader.shutdown()


def scenario_hk_exit_without_shutdown(epochs: int = 2) -> None:
    """healthkit_glt, nothing fails: a script runs epochs and just ends (no shutdown())."""
    fx.init_single_process_context()
    loader = _hk_loader(fx.build_dataset())
    for _ in range(epochs):
        fx.consume_epoch(loader)
    _result(outcome="done", worker_pids=[w.pid for w in loader.producer.workers])


def _channel_writer(channel: Any, messages: int, tag: int, lock: Any) -> None:
    """A sampling worker's sends without the sampling: ``messages`` numbered messages."""
    import healthkit_glt as hg
    import torch

    if lock is not None:
        channel = hg.SerializedSendChannel(channel, lock)
    for i in range(messages):
        channel.send({"i": torch.full((100,), i), "tag": torch.tensor([tag])})


def _channel_writer_then_wait(channel: Any, messages: int, sent: Any, go: Any) -> None:
    """:func:`_channel_writer`, then ``sent.set()`` and a wait for ``go`` before its exit 0
    (a worker that stays alive after its sends, as sampling workers do within an epoch)."""
    _channel_writer(channel, messages, 0, None)
    sent.set()
    go.wait(120)


def scenario_channel_writers(mode: str = "serialized", capacity: int = 2,
                             messages: int = 3000) -> None:  # fmt: skip
    """Two spawned writers send ``messages`` each into one ShmChannel; the consumer checks
    that each writer's messages arrive complete and in order. ``mode`` is ``serialized``
    (healthkit_glt's send lock) or ``stock`` (plain concurrent ``send``: GLT's lap race)."""
    import multiprocessing as mp

    from graphlearn_torch.channel import ShmChannel

    ctx = mp.get_context("spawn")
    channel = ShmChannel(capacity, "8MB")
    lock = ctx.Lock() if mode == "serialized" else None
    writers = [
        ctx.Process(target=_channel_writer, args=(channel, messages, tag, lock), daemon=True)
        for tag in range(2)
    ]
    for w in writers:
        w.start()
    t0 = time.monotonic()
    last = [-1, -1]
    out_of_order = received = 0
    while received < 2 * messages:
        msg = channel.recv()
        tag, i = int(msg["tag"][0]), int(msg["i"][0])
        out_of_order += i != last[tag] + 1
        last[tag] = i
        received += 1
        del msg
    seconds = time.monotonic() - t0
    for w in writers:
        w.join()
    _result(outcome="done", received=received, out_of_order=out_of_order, seconds=seconds,
            writer_exit_codes=[w.exitcode for w in writers])  # fmt: skip


def scenario_hk_trainer(phase: str = "epoch") -> None:
    """The trainer that the test SIGKILLs: it prints its workers and its channel segment,
    then waits. ``phase``:

    - ``epoch``: after the first batch of an epoch (workers past the barrier, parked in
      ``send()`` or waiting for a command);
    - ``init``: the workers are in their worker loop's bring-up (they entered it; the
      trainer waits at the init barrier);
    - ``startup``: 0.3 s after the workers were spawned, before any worker code ran
      (interpreter start-up, the trainer's imports, unpickling the producer's context).
    """
    import tempfile

    from healthkit_glt._adapter.ring import channel_shmid

    fx.init_single_process_context()
    dataset = fx.build_dataset()
    if phase in ("init", "startup"):
        markers = tempfile.mkdtemp(prefix="hk-trainer-")

        def report() -> None:
            deadline = time.monotonic() + 60
            while len(procs.spawned_worker_pids()) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            if phase == "startup":
                time.sleep(0.3)
            else:
                while len(os.listdir(markers)) < 2 and time.monotonic() < deadline:
                    time.sleep(0.01)
            _result(phase=phase, worker_pids=procs.spawned_worker_pids(), shmid=None)

        threading.Thread(target=report, daemon=True).start()
        _hk_loader(dataset, rpc_init_timeout=60, worker_loop=slow_init_loop,
                   worker_extra={"markers": markers})  # fmt: skip
        _say("UNEXPECTED: loader built")
        return
    loader = _hk_loader(dataset)
    it = iter(loader)
    batch = next(it)
    _result(phase=phase, worker_pids=[w.pid for w in loader.producer.workers],
            shmid=channel_shmid(loader.producer.output_channel))  # fmt: skip
    time.sleep(3600)
    del batch


def slow_init_loop(ctx: Any) -> None:
    """Default loop after a 30 s pause: the workers stay in bring-up while the test acts."""
    import healthkit_glt as hg

    open(os.path.join(ctx.extra["markers"], str(ctx.rank)), "w").close()
    time.sleep(30)
    hg.default_worker_loop(ctx)


def _raising_sampler_factory(*, raise_in: str, **kwargs: Any) -> Any:
    """GLT's real DistNeighborSampler whose coroutine ``raise_in`` raises on its 3rd call in
    worker 1 (worker 0 keeps sampling, so batches keep arriving while the error is
    reported). Module-level so that a ``functools.partial`` of it pickles."""
    import healthkit_glt as hg
    from graphlearn_torch.distributed import get_context
    from graphlearn_torch.distributed.dist_neighbor_sampler import DistNeighborSampler

    base = hg.create_dist_sampler(**kwargs)
    rank = get_context().rank
    calls = [0]
    original = getattr(base, raise_in)

    async def raising(*args: Any, **kw: Any) -> Any:
        calls[0] += 1
        if rank == 1 and calls[0] == 3:
            raise IndexError(f"seed index out of range in {raise_in} (injected by the test)")
        return await original(*args, **kw)

    assert isinstance(base, DistNeighborSampler)
    setattr(base, raise_in, raising)
    return base


def scenario_hk_sampling_error(entry: str = "nodes") -> None:
    """A sampling error inside a live worker. ``entry``:

    - ``features``: the default sampler and loader; the features cover nodes 0-499 of 1000,
      so the feature lookup in the sampler's coroutine raises (a real GLT error);
    - ``nodes`` / ``edges`` / ``subgraph``: a custom ``sampler_factory`` whose
      ``_sample_from_nodes`` / ``_sample_from_edges`` / ``_subgraph`` coroutine raises in
      worker 1 (the producer driven directly, as a GiGL-style loader does).
    """
    import functools

    import healthkit_glt as hg
    import torch
    from graphlearn_torch.channel import ShmChannel
    from graphlearn_torch.sampler import (
        EdgeSamplerInput,
        NodeSamplerInput,
        SamplingConfig,
        SamplingType,
    )

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    fx.init_single_process_context()
    dataset = fx.build_dataset()
    t0 = time.monotonic()
    batches = 0
    if entry == "features":
        dataset.init_node_features(torch.randn(500, fx.FEATURE_DIM), with_gpu=False)
        loader = _hk_loader(dataset)
        producer = loader.producer
        try:
            for _ in loader:
                batches += 1
        except hg.SamplingError as e:
            return _sampling_error_result(e, producer, batches, t0)
        finally:
            loader.shutdown()
        return _result(outcome="finished", batches=batches)
    stype, seeds, method = {
        "nodes": (SamplingType.NODE, NodeSamplerInput(node=torch.arange(fx.NUM_NODES)),
                  "_sample_from_nodes"),
        "edges": (SamplingType.LINK, EdgeSamplerInput(row=torch.arange(500),
                                                      col=torch.arange(500, 1000)),
                  "_sample_from_edges"),
        "subgraph": (SamplingType.SUBGRAPH, NodeSamplerInput(node=torch.arange(fx.NUM_NODES)),
                     "_subgraph"),
    }[entry]  # fmt: skip
    config = SamplingConfig(stype, list(fx.NUM_NEIGHBORS), 32, True, False, False, True,
                            with_neg=False, with_weight=False, edge_dir="out", seed=1)  # fmt: skip
    producer = hg.DistSamplingProducer(
        dataset, seeds, config, fx.make_worker_options(), ShmChannel(2, "16MB"),
        sampler_factory=functools.partial(_raising_sampler_factory, raise_in=method),
    )  # fmt: skip
    producer.init()
    try:
        producer.produce_all()
        expected = -(-len(seeds) // 32)
        while batches < expected:
            msg = producer.recv()
            batches += 1
            del msg
    except hg.SamplingError as e:
        return _sampling_error_result(e, producer, batches, t0)
    finally:
        producer.shutdown()
    _result(outcome="finished", batches=batches)


def _stalling_sampler_factory(**kwargs: Any) -> Any:
    """GLT's real DistNeighborSampler whose node sampling blocks for good from its 3rd call,
    in every worker: live workers that stop sending (the stack dump must name this)."""
    import healthkit_glt as hg

    base = hg.create_dist_sampler(**kwargs)
    calls = [0]
    original = base._sample_from_nodes

    async def stall_in_sampling_forever(*args: Any, **kw: Any) -> Any:
        calls[0] += 1
        while calls[0] >= 3:
            time.sleep(3600)
        return await original(*args, **kw)

    base._sample_from_nodes = stall_in_sampling_forever
    return base


def scenario_hk_steady_state_stall(bound: str = "3") -> None:
    """Every live worker stops sending mid-epoch; the fetch loop polls ``recv(timeout_ms=200)``
    (GiGL's shape). Reports each poll's outcome and what was logged, and when."""
    import healthkit_glt as hg
    import torch
    from graphlearn_torch.channel import QueueTimeoutError, ShmChannel
    from graphlearn_torch.sampler import NodeSamplerInput, SamplingConfig, SamplingType

    records: list[tuple[float, str, str]] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append((time.monotonic(), record.levelname, record.getMessage()))

    logging.getLogger("healthkit").addHandler(Keep())
    fx.init_single_process_context()
    dataset = fx.build_dataset()
    config = SamplingConfig(SamplingType.NODE, list(fx.NUM_NEIGHBORS), 32, True, False,
                            False, True, with_neg=False, with_weight=False, edge_dir="out",
                            seed=1)  # fmt: skip
    producer = hg.DistSamplingProducer(
        dataset, NodeSamplerInput(node=torch.arange(fx.NUM_NODES)), config,
        fx.make_worker_options(), ShmChannel(2, "16MB"),
        sampler_factory=_stalling_sampler_factory, steady_state_rpc_timeout=float(bound),
    )  # fmt: skip
    producer.init()
    batches, timeouts, last_batch = 0, 0, time.monotonic()
    try:
        producer.produce_all()
        deadline = time.monotonic() + 2 * float(bound) + 3  # a second log would come by then
        while time.monotonic() < deadline:
            try:
                producer.recv(timeout_ms=200)
                batches += 1
                last_batch = time.monotonic()
            except QueueTimeoutError:
                timeouts += 1
        alive = [w.is_alive() for w in producer.workers]
        pids = [w.pid for w in producer.workers]
    finally:
        # The workers never read STOP (stuck in the sampler): a short grace, then SIGTERM;
        # the escalation itself has tests of its own.
        producer.shutdown(grace=1.0)
    stalls = [(t - last_batch, m) for t, lvl, m in records if lvl == "WARNING" and "no batch" in m]
    _result(batches=batches, timeouts=timeouts, workers_alive=alive, worker_pids=pids,
            stalls=stalls, children_left=procs.spawned_worker_pids())  # fmt: skip


def _slow_sampler_factory(*, delay: float, **kwargs: Any) -> Any:
    """GLT's real DistNeighborSampler, each worker handing over a batch every ``delay``
    seconds: slow but progressing. The delay is a schedule, not a sleep added before each
    sampling: added, the real sampling time came on top of it (tens of ms more on a loaded
    machine, more for an epoch's cold first batch), and the two workers, started together,
    sent in pairs, so the loader waited ``delay`` plus the sampling with no batch: past
    ``stall_timeout`` at 0.9 x it. Worker ``r`` of ``n`` keeps ``r / n`` of a period behind
    worker 0, so the loader gets a batch about every ``delay / n``."""
    import asyncio

    import healthkit_glt as hg
    from graphlearn_torch.distributed import get_context

    base = hg.create_dist_sampler(**kwargs)
    original = base._sample_from_nodes
    group = get_context()
    offset = delay * group.rank / group.world_size
    due: list[float] = []

    async def slow_sampling(*args: Any, **kw: Any) -> Any:
        now = time.monotonic()
        if due:
            due[0] += delay
        else:
            due.append(now + offset)
        await asyncio.sleep(max(0.0, due[0] - now))
        return await original(*args, **kw)

    base._sample_from_nodes = slow_sampling
    return base


def scenario_hk_stall_timeout(mode: str = "stuck", stall: str = "2") -> None:
    """``stall_timeout`` set; the loop calls a blocking ``recv()``. ``stuck``: every worker
    blocks in its sampler from its 3rd batch (alive), and the loop trains for
    ``1.5 x stall`` after each batch (nobody waits meanwhile: never a stall), so the wait for
    the 5th batch is the stall; ``slow``: each worker hands over a batch every
    ``0.9 x stall`` s, half a period apart, for 10 timeouts. Reports how the epoch ended."""
    import functools

    import healthkit_glt as hg
    import torch
    from graphlearn_torch.channel import ShmChannel
    from graphlearn_torch.sampler import NodeSamplerInput, SamplingConfig, SamplingType

    bound = float(stall)
    fx.init_single_process_context()
    dataset = fx.build_dataset()
    config = SamplingConfig(SamplingType.NODE, list(fx.NUM_NEIGHBORS), 64, True, False,
                            False, True, with_neg=False, with_weight=False, edge_dir="out",
                            seed=1)  # fmt: skip
    # slow: each worker hands over a batch every 0.9 x stall_timeout, for 11 batches (10
    # timeouts), half a period apart: the loader's own gaps are about half that.
    factory = (
        _stalling_sampler_factory if mode == "stuck"
        else functools.partial(_slow_sampler_factory, delay=0.9 * bound)
    )
    seeds = 2 * 64 * (11 if mode == "slow" else 3)
    producer = hg.DistSamplingProducer(
        dataset, NodeSamplerInput(node=torch.arange(seeds) % fx.NUM_NODES), config,
        fx.make_worker_options(), ShmChannel(2, "16MB"),
        sampler_factory=factory, stall_timeout=bound,
    )  # fmt: skip
    producer.init()
    pids = [w.pid for w in producer.workers]
    batches, last_batch, t0 = 0, time.monotonic(), time.monotonic()
    expected = seeds // 64
    try:
        producer.produce_all()
        while batches < expected:
            producer.recv()
            batches += 1
            last_batch = time.monotonic()
            if mode == "stuck":
                time.sleep(1.5 * bound)  # training: nobody waits for a batch
        _result(outcome="finished", batches=batches, seconds=time.monotonic() - t0,
                worker_pids=pids)  # fmt: skip
    except hg.SamplingStalledError as e:
        _result(outcome="stalled", after_last_batch_s=time.monotonic() - last_batch,
                batches=batches, stalled_for=e.stalled_for, ranks=list(e.ranks),
                worker_pids=pids, workers_alive_after=[w.is_alive() for w in producer.workers],
                failure_kept=producer.failure is e,
                children_left=procs.spawned_worker_pids(), **_error_fields(e))  # fmt: skip
    finally:
        producer.shutdown(grace=1.0)


def _sampling_error_result(e: Any, producer: Any, batches: int, t0: float) -> None:
    now = time.time()
    workers = producer.workers
    _result(outcome="raised", after_raise_s=now - e.raised_at, rank=e.rank, pid=e.pid,
            worker_pids=[w.pid for w in workers], batches=batches,
            worker_traceback=e.worker_traceback, first_line=str(e).splitlines()[0],
            worker_exit_codes=[w.exitcode for w in workers],
            children_left=procs.spawned_worker_pids(), failure_kept=producer.failure is e,
            **_error_fields(e))  # fmt: skip


def _dev_shm_names(pids: Sequence[int]) -> list[str]:
    """POSIX shared memory (``/dev/shm``) whose name carries one of ``pids`` (torch's
    ``torch_<pid>_...``, multiprocessing's are unlinked at creation)."""
    try:
        names = os.listdir("/dev/shm")
    except OSError:
        return []
    return sorted(n for n in names if any(f"_{p}_" in n or n.endswith(f"_{p}") for p in pids))


def sigkill_trainer(phase: str, timeout: float = 120.0, watch_s: float = 5.0) -> dict[str, Any]:
    """Run ``hk-trainer PHASE`` in its own session, SIGKILL it once it reported its workers,
    then watch them: when each is gone (or that it outlived ``watch_s``), and which SysV
    segment of the trainer or POSIX shm of the group is left. Everything of the session is
    SIGKILLed and removed afterwards, so a failing run leaves nothing behind either."""
    import select
    import subprocess

    # A segment some earlier process left (a SIGKILLed run) may carry a creator pid the
    # kernel has since given to this trainer or a worker: only segments made from now count.
    older = {int(r["shmid"]) for r in procs.sysv_shm_rows()}

    def made_by(pids: Sequence[int]) -> list[int]:
        return [i for i in procs.sysv_shm_created_by(pids) if i not in older]

    with procs.sigusr1_stack_dumps() as (env, _):
        proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "hk-trainer", phase],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True,
            start_new_session=True,
        )  # fmt: skip
        assert proc.stdout is not None
        out: list[str] = []
        info: dict[str, Any] | None = None
        deadline = time.monotonic() + timeout
        try:
            while info is None and time.monotonic() < deadline:
                ready, _, _ = select.select([proc.stdout], [], [], 1.0)
                if not ready:
                    continue
                line = proc.stdout.readline()
                if not line:
                    break
                out.append(line)
                if line.startswith("RESULT "):
                    info = json.loads(line[7:])
            if info is None:
                return {"error": "the trainer never reported its workers", "output": "".join(out)}
            pids: list[int] = info["worker_pids"]
            os.kill(proc.pid, signal.SIGKILL)
            killed = time.monotonic()
            proc.wait()
            gone_after: dict[int, float | None] = {p: None for p in pids}
            while time.monotonic() - killed < watch_s and None in gone_after.values():
                for p in pids:
                    if gone_after[p] is None and not procs.alive(p):
                        gone_after[p] = time.monotonic() - killed
                time.sleep(0.005)
            survivors = [p for p in pids if procs.alive(p)]
            settle = time.monotonic() + 2.0  # the kernel frees a segment at the last detach
            while time.monotonic() < settle and made_by([proc.pid]):
                time.sleep(0.02)
            return {"worker_pids": pids, "gone_after_s": list(gone_after.values()),
                    "survivors": survivors, "shmid": info["shmid"],
                    "segments_left": made_by([proc.pid, *pids]),
                    "dev_shm_left": _dev_shm_names([proc.pid, *pids]),
                    "output": "".join(out)}  # fmt: skip
        finally:
            members = procs.pids_in_group(proc.pid)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                for p in members:
                    os.kill(p, signal.SIGKILL)  # reparented workers, by pid
            proc.wait()
            end = time.monotonic() + 10
            while any(procs.alive(p) for p in members) and time.monotonic() < end:
                time.sleep(0.02)
            procs.remove_orphan_sysv_shm([proc.pid, *members])
            proc.stdout.close()



# --- a worker OOM-killed by the kernel, for real ---------------------------------------------


def oom_worker_loop(ctx: Any) -> None:
    """Worker 1 passes the barrier, waits for its first command, then moves itself into the
    memory cgroup ``ctx.extra["cgroup"]`` (a small limit) and allocates until the kernel's
    OOM killer ends it. Worker 0 runs the default loop."""
    import healthkit_glt as hg

    if ctx.rank != 1:
        hg.default_worker_loop(ctx)
        return
    sampler = None
    try:
        hg.init_sampling_worker(ctx)
        sampler = hg.start_sampler(ctx)
        hg.pass_init_barrier(ctx)
        ctx.task_queue.get()  # the epoch's SAMPLE_ALL: the consumer is in recv() now
        with open(os.path.join(ctx.extra["cgroup"], "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
        hoard = []
        while True:  # touched pages: real memory, charged to the small cgroup
            hoard.append(bytearray(b"\x01") * (8 << 20))
    finally:
        hg.teardown_sampling_worker(sampler)


def scenario_hk_epoch_oom(cgroup: str) -> None:
    """healthkit_glt: sampling worker 1 is OOM-killed mid-epoch by the kernel (a memory cgroup
    made by the test); the error must say the OOM killer did it, confirmed."""
    import healthkit_glt as hg

    fx.init_single_process_context()
    loader = _hk_loader(fx.build_dataset(), worker_loop=oom_worker_loop,
                        worker_extra={"cgroup": cgroup})  # fmt: skip
    workers = loader.producer.workers
    t0 = time.monotonic()
    try:
        for batch in loader:
            del batch
    except hg.SamplingWorkerDiedError as e:
        d = e.diagnosis
        _result(outcome="raised", elapsed_s=time.monotonic() - t0, rank=e.rank, pid=d.pid,
                worker_pids=[w.pid for w in workers], cause=d.cause.name,
                signal=d.signal.name if d.signal else None, diagnosis=str(d),
                evidence=list(d.evidence), children_left=procs.spawned_worker_pids(),
                **_error_fields(e))  # fmt: skip
        return
    finally:
        loader.shutdown()
    _result(outcome="finished")


# --- fail and rebuild, many times, in one process ---------------------------------------------


def _footprint() -> dict[str, Any]:
    """What a loader can leave in this process: SysV segments it created, mappings of SysV or
    /dev/shm memory, /dev/shm names, fds, threads, children."""
    with open("/proc/self/maps") as f:
        maps = [line.split() for line in f]
    shm = sorted(" ".join(m[5:]) for m in maps if len(m) > 5 and m[5].startswith("/dev/shm/"))
    return {
        "segments": sorted(procs.sysv_shm_created_by([os.getpid()])),
        "sysv_mappings": sum(1 for m in maps if len(m) > 5 and m[5].startswith("/SYSV")),
        "dev_shm_mappings": shm,
        "dev_shm_names": _dev_shm_names([os.getpid()]),
        "fds": len(os.listdir("/proc/self/fd")),
        "threads": sorted(t.name for t in threading.enumerate()),
        "children": procs.spawned_worker_pids(),
    }


def _fail_once(kind: str, dataset: Any) -> str:
    """Build a loader, make it fail as ``kind`` says, catch, shut down; the way a script
    that retries does it (the last batch stays bound to the loop variable)."""
    import functools

    import healthkit_glt as hg

    import healthkit as hk

    if kind == "init-failure":
        try:
            _hk_loader(dataset, worker_loop=rank1_raises_loop, rpc_init_timeout=60)
        except hk.BarrierBrokenError as e:
            return type(e).__name__
        return "built"
    kwargs: dict[str, Any] = {}
    if kind == "sampler-error":
        kwargs["sampler_factory"] = functools.partial(
            _raising_sampler_factory, raise_in="_sample_from_nodes"
        )
    loader = _hk_loader(dataset, **kwargs)
    try:
        for n, _batch in enumerate(loader):  # _batch holds a view of the ring meanwhile
            if kind == "worker-death" and n == 1:
                os.kill(loader.producer.workers[1].pid, signal.SIGKILL)
    except (hg.SamplingWorkerDiedError, hg.SamplingError) as e:
        return type(e).__name__
    finally:
        loader.shutdown()
    return "finished"


def scenario_hk_fail_rebuild(cycles: int = 3) -> None:
    """``cycles`` fail-and-rebuild cycles in one process (worker death, sampler error, init
    failure, in turn): after each, with the loader and its last batch dropped, this
    process holds what it held before the first (after one warm-up cycle, which moves the
    dataset's tensors to shared memory, as any first loader does)."""
    import gc

    fx.init_single_process_context()
    dataset = fx.build_dataset()
    kinds = ["worker-death", "sampler-error", "init-failure"]
    _fail_once(kinds[0], dataset)
    gc.collect()
    before = _footprint()
    runs = []
    for i in range(cycles):
        kind = kinds[i % len(kinds)]
        t = time.monotonic()
        raised = _fail_once(kind, dataset)
        gc.collect()
        after = _footprint()
        diff = {k: (before[k], after[k]) for k in before if before[k] != after[k]}
        runs.append({"kind": kind, "raised": raised, "seconds": time.monotonic() - t,
                     "same": not diff, "diff": diff})  # fmt: skip
        _say(f"cycle {i + 1}/{cycles} {kind}: {raised}, footprint {diff or 'unchanged'}")
    _result(outcome="done", before=before, after=_footprint(), runs=runs)

SCENARIOS = {
    "hk-init-sigkill": lambda a: scenario_hk_init_sigkill(*(float(x) for x in a)),
    "hk-init-raise": lambda a: scenario_hk_init_raise(),
    "hk-init-sigkill-arrived": lambda a: scenario_hk_init_sigkill_arrived(*(float(x) for x in a)),
    "hk-shutdown-mid-epoch": lambda a: scenario_hk_shutdown_mid_epoch(*(float(x) for x in a)),
    "hk-init-hang": lambda a: scenario_hk_init_hang(*(float(x) for x in a)),
    "hk-epoch-sigkill": lambda a: scenario_hk_epoch_sigkill(*(float(x) for x in a[:2]), *a[2:]),
    "hk-exit-without-shutdown": lambda a: scenario_hk_exit_without_shutdown(*(int(x) for x in a)),
    "hk-stuck-slot": lambda a: scenario_hk_stuck_slot(*(float(x) for x in a[:1]), *a[1:]),
    "hk-trainer": lambda a: scenario_hk_trainer(*a),
    "hk-sampling-error": lambda a: scenario_hk_sampling_error(*a),
    "hk-epoch-oom": lambda a: scenario_hk_epoch_oom(*a),
    "hk-epoch-raise": lambda a: scenario_hk_epoch_raise(),
    "hk-epoch-stop": lambda a: scenario_hk_epoch_stop(*a),
    "hk-fail-rebuild": lambda a: scenario_hk_fail_rebuild(*(int(x) for x in a)),
    "hk-steady-state-stall": lambda a: scenario_hk_steady_state_stall(*a),
    "hk-stall-timeout": lambda a: scenario_hk_stall_timeout(*a),
    "channel-writers": lambda a: scenario_channel_writers(
        *(a[:1] + [int(x) for x in a[1:]])  # type: ignore[arg-type]
    ),
}


# --- runner -------------------------------------------------------------------------------


def run_scenario(name: str, args: Sequence[str] = (), timeout: float = 90.0) -> stock.Run:
    return stock.run_script(os.path.abspath(__file__), [name, *args], timeout)


def run_stock(
    name: str, args: Sequence[str] = (), timeout: float = 20.0, hang_after_kill: float | None = None
) -> stock.Run:
    """A stock-GLT scenario of ``glt_stock_hangs`` (``hang-init``, ``hang-epoch``);
    ``hang_after_kill``: see ``glt_stock_hangs.run_script``."""
    return stock.run_script(os.path.join(HERE, "glt_stock_hangs.py"), [name, *args], timeout,
                            hang_after_kill=hang_after_kill)  # fmt: skip


def main(argv: Sequence[str]) -> int:
    if not argv or argv[0] not in SCENARIOS:
        print(f"usage: glt_scenarios.py {{{','.join(SCENARIOS)}}} [args]")
        return 2
    SCENARIOS[argv[0]](list(argv[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
