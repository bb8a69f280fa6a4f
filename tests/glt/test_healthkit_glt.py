"""healthkit_glt on real graphlearn-torch 0.2.4: 1,000-node random graph, 2 sampling workers.

Non-firing paths (normal epochs, shutdown, the RPC timeout narrowing) run in this process
under the leak check. Fault paths run in throwaway process groups (``glt_scenarios``):
stock GLT hangs inside C++ there, which only a group SIGKILL can end, and the receive
thread our producer may leave blocked after a mid-epoch death must not count as a leak of
this test process.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("graphlearn_torch")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import glt_fixtures as fx
import glt_procs as procs
import glt_scenarios as sc
import healthkit_glt as hg
from testutil import kernel_log_unusable, memory_cgroup_or_skip, remove_cgroup

import healthkit as hk

pytestmark = pytest.mark.glt

IN_PROCESS_TIMEOUT_S = 300  # GLT start-up is 5-10 s per loader here, more under load
GUARD_S = 270
SUBPROCESS_TIMEOUT_S = 240


# --- fixtures (and tests/glt/conftest.py's) ---------------------------------------------


@pytest.fixture
def glt_context() -> None:
    fx.init_single_process_context()


@pytest.fixture
def guard(request: pytest.FixtureRequest) -> Iterator[None]:
    """Last resort for an in-process hang inside C++ (glt_procs.hang_guard)."""
    with procs.hang_guard(request.node.nodeid, GUARD_S, procs.spawned_worker_pids):
        yield


def _segments_of(pid: int) -> set[int]:
    return set(procs.sysv_shm_created_by([pid]))


def _receiver_threads() -> int:
    return sum(t.name == "healthkit-glt receiver" for t in threading.enumerate())


def _no_tracebacks(output: str) -> list[str]:
    bad = ("Traceback", "Exception ignored", "Error", "error")
    return [line for line in output.splitlines() if any(b in line for b in bad)]


# --- configuration (no workers) -----------------------------------------------------------


def test_timeouts_default_to_600s_bring_up_k3_and_the_options_timeout_in_steady_state(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(hg.RPC_INIT_TIMEOUT_ENV, raising=False)
    monkeypatch.delenv(hg.STEADY_STATE_RPC_TIMEOUT_ENV, raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plan = hg.resolve_timeouts(
            rpc_init_timeout=None, steady_state_rpc_timeout=None,
            init_timeout_multiplier=hg.DEFAULT_INIT_TIMEOUT_MULTIPLIER, options_rpc_timeout=30,
        )  # fmt: skip
    assert (plan.rpc_init_timeout, plan.init_bound_seconds) == (600.0, 1800.0)
    assert plan.steady_state_rpc_timeout == 30.0
    assert plan.rpc_init_source == "default"
    assert f"raise ${hg.RPC_INIT_TIMEOUT_ENV}" in plan.init_hint


def test_env_vars_set_the_timeouts_and_arguments_override_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(hg.RPC_INIT_TIMEOUT_ENV, "120")
    monkeypatch.setenv(hg.STEADY_STATE_RPC_TIMEOUT_ENV, "45")
    plan = hg.resolve_timeouts(rpc_init_timeout=None, steady_state_rpc_timeout=None,
                               init_timeout_multiplier=3, options_rpc_timeout=30)  # fmt: skip
    assert (plan.rpc_init_timeout, plan.init_bound_seconds) == (120.0, 360.0)
    assert plan.steady_state_rpc_timeout == 45.0
    assert "$HEALTHKIT_GLT_RPC_INIT_TIMEOUT_SECONDS" in plan.describe()
    plan = hg.resolve_timeouts(rpc_init_timeout=10, steady_state_rpc_timeout=5,
                               init_timeout_multiplier=2, options_rpc_timeout=30)  # fmt: skip
    assert (plan.rpc_init_timeout, plan.init_bound_seconds, plan.steady_state_rpc_timeout) == (
        10.0, 20.0, 5.0,
    )  # fmt: skip


@pytest.mark.parametrize("raw", ["abc", "-5", "0", "nan", "inf"])
def test_bad_env_values_are_defaulted_with_a_warning_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, raw: str
) -> None:
    monkeypatch.setenv(hg.RPC_INIT_TIMEOUT_ENV, raw)
    monkeypatch.setenv(hg.STEADY_STATE_RPC_TIMEOUT_ENV, raw)
    with pytest.warns(hk.lowlevel.EnvValueWarning) as record:
        plan = hg.resolve_timeouts(rpc_init_timeout=None, steady_state_rpc_timeout=None,
                                   init_timeout_multiplier=3, options_rpc_timeout=30)  # fmt: skip
    names = " ".join(str(w.message) for w in record)
    assert hg.RPC_INIT_TIMEOUT_ENV in names and hg.STEADY_STATE_RPC_TIMEOUT_ENV in names
    assert (plan.rpc_init_timeout, plan.steady_state_rpc_timeout) == (600.0, 30.0)


def test_bad_env_values_are_rejected_in_strict_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(hg.RPC_INIT_TIMEOUT_ENV, "ten minutes")
    with pytest.raises(hk.InvalidArgumentError, match=hg.RPC_INIT_TIMEOUT_ENV):
        hg.resolve_timeouts(rpc_init_timeout=None, steady_state_rpc_timeout=None,
                            init_timeout_multiplier=3, options_rpc_timeout=30,
                            strict_env=True)  # fmt: skip


@pytest.mark.parametrize(
    "kwargs",
    [{"rpc_init_timeout": 0}, {"rpc_init_timeout": -1.0},
     {"steady_state_rpc_timeout": float("nan")}, {"init_timeout_multiplier": 0}],
)  # fmt: skip
def test_bad_timeout_arguments_are_rejected(kwargs: dict[str, float]) -> None:
    args: dict[str, float | None] = {"rpc_init_timeout": None, "steady_state_rpc_timeout": None,
                                     "init_timeout_multiplier": 3}  # fmt: skip
    args.update(kwargs)
    with pytest.raises(hk.InvalidArgumentError, match=next(iter(kwargs))):
        hg.resolve_timeouts(options_rpc_timeout=30, **args)  # type: ignore[arg-type]


@pytest.mark.timeout(60)
def test_shutdown_of_a_producer_that_never_started_is_a_safe_no_op(glt_context: None) -> None:
    import torch
    from graphlearn_torch.channel import ShmChannel
    from graphlearn_torch.sampler import NodeSamplerInput, SamplingConfig, SamplingType

    before = _segments_of(os.getpid())
    dataset = fx.build_dataset()
    channel = ShmChannel(2, "1MB")
    config = SamplingConfig(SamplingType.NODE, [5, 5], 64, True, False, False, True,
                            with_neg=False, with_weight=False, edge_dir="out", seed=1)  # fmt: skip
    producer = hg.DistSamplingProducer(
        dataset, NodeSamplerInput(node=torch.arange(10)), config, fx.make_worker_options(), channel
    )
    producer.shutdown()
    producer.shutdown()
    with pytest.raises(hk.UsageError, match="not running"):
        producer.recv()
    modes = "receiver must be one of 'auto', 'ring', 'thread'"
    with pytest.raises(hk.InvalidArgumentError, match=modes):
        hg.DistSamplingProducer(
            dataset, NodeSamplerInput(node=torch.arange(10)), config, fx.make_worker_options(),
            channel, receiver="fast",
        )  # fmt: skip
    del producer, channel
    gc.collect()
    assert _segments_of(os.getpid()) == before


def test_teardown_joins_a_worker_already_reaped_so_no_fd_outlives_the_producer() -> None:
    """A worker reaped by an ``exitcode`` read before the teardown (it exited first) must
    still be joined: multiprocessing otherwise keeps it in its child list, with its Popen's
    two pipe fds, until the next Process.start() (seen as a 2-fd leak after a test)."""
    import multiprocessing as mp
    import multiprocessing.process

    import healthkit

    worker = mp.get_context("spawn").Process(target=time.sleep, args=(0,))
    worker.start()
    os.waitid(os.P_PID, worker.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped yet
    assert worker.exitcode == 0  # reaped here, but still listed as a child
    assert worker in multiprocessing.process._children
    report = healthkit.stop([worker], grace=5.0)  # the ladder the producer's teardown uses
    assert report.survivors == () and not report.terminated
    assert worker not in multiprocessing.process._children
    del worker  # its fds close now; the leak check verifies it


# --- the receivers, on a real ring and a real writer process (no sampler) ------------------


def _spawn(target: object, *args: object) -> Any:
    import multiprocessing as mp

    process = mp.get_context("spawn").Process(target=target, args=args, daemon=True)
    process.start()
    return process


def _spawn_writer(channel: object, messages: int) -> Any:
    """A process that sends ``messages`` numbered messages into ``channel``, then exits."""
    return _spawn(sc._channel_writer, channel, messages, 0, None)


def _spawn_lingering_writer(channel: object, messages: int) -> tuple[Any, Any, Any]:
    """A writer that sends ``messages``, sets ``sent``, and stays alive until ``go`` is set
    (then exits 0): ``(process, sent, go)``."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    sent, go = ctx.Event(), ctx.Event()
    return _spawn(sc._channel_writer_then_wait, channel, messages, sent, go), sent, go


def _spawn_sleeper() -> Any:
    """A live process that never sends: a worker the receiver watches while nothing comes."""
    return _spawn(time.sleep, 60)


def _end(receiver: Any, *processes: Any) -> None:
    """Close the receiver (it must not be stuck) and end and reap our processes."""
    receiver.stop()
    assert receiver.close()
    for p in processes:
        if p is not None:
            p.kill()  # a no-op for one that has exited
            p.join(10)
            p.close()


@pytest.mark.timeout(120)
def test_ring_receiver_reports_a_writer_killed_on_a_claimed_block_and_never_enters_the_wait(
    glt_context: None,
) -> None:
    """The case stock recv() waits on forever: the next block is claimed, never written."""
    from graphlearn_torch.channel import ShmChannel
    from healthkit_glt._receive import RingReceiver, open_receiver

    before = _segments_of(os.getpid())
    channel = ShmChannel(1, "1MB")
    writer = _spawn_writer(channel, 2)
    receiver = open_receiver(channel, [writer])
    assert isinstance(receiver, RingReceiver)
    try:
        first, ended = receiver.receive()
        assert ended == [] and int(first["i"][0]) == 0
        # Holding block 0 keeps its slot: message 1's block is claimed, not written.
        deadline = time.monotonic() + 60
        while channel.empty():
            assert time.monotonic() < deadline, "the writer never claimed block 1"
            time.sleep(0.01)
        os.kill(writer.pid, signal.SIGKILL)
        t = time.monotonic()
        msg, ended = receiver.receive()
        waited = time.monotonic() - t
        assert msg is None and [receiver.ranks[id(w)] for w in ended] == [0]
        assert ended[0].poll().returncode == -signal.SIGKILL
        assert waited < 5.0
        assert not channel.empty()  # the claimed block is still there, unwritten
    finally:
        _end(receiver, writer)
    del first, ended, receiver, writer, channel
    gc.collect()
    assert _segments_of(os.getpid()) == before


@pytest.mark.timeout(120)
def test_ring_receiver_returns_every_written_message_in_order_then_a_clean_exit(
    glt_context: None,
) -> None:
    from graphlearn_torch.channel import ShmChannel
    from healthkit_glt._receive import open_receiver

    before = _segments_of(os.getpid())
    channel = ShmChannel(2, "1MB")
    writer, sent, go = _spawn_lingering_writer(channel, 50)  # sent: kept until the child has it
    receiver = open_receiver(channel, [writer], mode="ring")
    try:
        got = []
        for _ in range(50):
            msg, ended = receiver.receive()
            assert ended == []
            got.append(int(msg["i"][0]))
            del msg
        assert got == list(range(50))
        assert sent.is_set()
        go.set()
        msg, ended = receiver.receive()  # nothing more comes: the writer's exit is reported
        assert msg is None and ended[0].poll().returncode == 0
    finally:
        _end(receiver, writer)
    del ended, receiver, writer, channel
    gc.collect()
    assert _segments_of(os.getpid()) == before


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["ring", "thread"])
def test_a_known_death_stops_delivery_of_batches_already_written_by_a_survivor(
    glt_context: None, mode: str
) -> None:
    """Server-client mode's late report: a survivor's batches, already written, were
    delivered until the ring ran empty (seconds, and up to its whole share of an epoch,
    after the death). Once a worker's exit is known, no batch is delivered: the next
    receive reports the death. The twin: with both alive, the same written batches come in
    order."""
    from graphlearn_torch.channel import QueueTimeoutError, ShmChannel
    from healthkit_glt._receive import open_receiver

    channel = ShmChannel(4, "1MB")
    writer, sent, go = _spawn_lingering_writer(channel, 3)
    victim = _spawn_sleeper()
    receiver = open_receiver(channel, [writer, victim], mode=mode, poll_ms=50)  # type: ignore[arg-type]
    try:
        assert sent.wait(60), "the writer never sent its messages"
        msg, ended = receiver.receive(timeout=60)  # both alive: delivered
        assert ended == [] and int(msg["i"][0]) == 0
        del msg
        if mode == "thread":  # a result handed over before the death, waiting to be taken
            with pytest.raises(QueueTimeoutError):
                receiver.receive(timeout=0.0)  # the request stays pending
            deadline = time.monotonic() + 60
            while not receiver._results:  # type: ignore[attr-defined]
                assert time.monotonic() < deadline, "the receive thread never took message 1"
                time.sleep(0.01)
        os.kill(victim.pid, signal.SIGKILL)
        os.waitid(os.P_PID, victim.pid, os.WEXITED | os.WNOWAIT)  # ended, not reaped: known
        assert not channel.empty()  # messages 1 and 2 are written and ready
        msg, ended = receiver.receive(timeout=60)
        assert msg is None, f"a survivor's batch {int(msg['i'][0])} came after the death"
        assert [receiver.ranks[id(w)] for w in ended] == [1]
        assert ended[0].poll().returncode == -signal.SIGKILL
    finally:
        go.set()
        _end(receiver, writer, victim)
    del ended, receiver, writer, victim, channel
    gc.collect()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["ring", "thread"])
def test_a_receive_with_a_timeout_raises_glts_queue_timeout_and_the_next_one_gets_the_message(
    glt_context: None, mode: str
) -> None:
    """``recv(timeout_ms)``, the fetch loop's poll (GLT's server, GiGL's graph store): a
    live worker that sends nothing makes it raise ``QueueTimeoutError`` after the timeout,
    not earlier, not never; what comes later is the next receive's."""
    from graphlearn_torch.channel import QueueTimeoutError, ShmChannel
    from healthkit_glt._receive import open_receiver

    channel = ShmChannel(2, "1MB")
    sleeper = _spawn_sleeper()
    receiver = open_receiver(channel, [sleeper], mode=mode, poll_ms=50)  # type: ignore[arg-type]
    try:
        t = time.monotonic()
        with pytest.raises(QueueTimeoutError):
            receiver.receive(timeout=0.3)
        assert 0.3 <= time.monotonic() - t < 3.0
        writer = _spawn_writer(channel, 1)
        msg, ended = receiver.receive(timeout=60)
        assert ended == [] and int(msg["i"][0]) == 0
        del msg
        writer.join(30)
        writer.close()
    finally:
        _end(receiver, sleeper)
    del receiver, channel
    gc.collect()


@pytest.mark.timeout(120)
def test_ctrl_c_while_the_ring_reader_waits_raises_and_the_next_receive_still_works(
    glt_context: None,
) -> None:
    """KeyboardInterrupt (a real SIGINT) ends the wait at once and leaves the ring intact."""
    from graphlearn_torch.channel import ShmChannel
    from healthkit_glt._receive import open_receiver

    before = _segments_of(os.getpid())
    channel = ShmChannel(2, "1MB")
    sleeper = _spawn_sleeper()
    receiver = open_receiver(channel, [sleeper], mode="ring")
    main = threading.get_ident()
    interrupter = threading.Timer(0.5, signal.pthread_kill, (main, signal.SIGINT))
    writer = None
    try:
        interrupter.start()
        t = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            got = receiver.receive()  # nothing is ever written: only the SIGINT ends this
            pytest.fail(f"receive() returned {got!r} after {time.monotonic() - t:.2f}s; "
                        f"sleeper exit code {sleeper.exitcode}")  # fmt: skip
        assert time.monotonic() - t < 10.0
        writer = _spawn_writer(channel, 1)
        msg, ended = receiver.receive()
        assert ended == [] and int(msg["i"][0]) == 0
        del msg
    finally:
        interrupter.join()
        _end(receiver, sleeper, writer)
    del receiver, sleeper, writer, channel
    gc.collect()
    assert _segments_of(os.getpid()) == before


@pytest.mark.timeout(120)
def test_closing_the_ring_reader_from_another_thread_ends_a_waiting_receive(
    glt_context: None,
) -> None:
    """An atexit shutdown, or a user's watchdog thread, closes the receiver while the
    consumer waits: the receive raises instead of reading a detached segment."""
    from graphlearn_torch.channel import ShmChannel
    from healthkit_glt._receive import open_receiver

    channel = ShmChannel(2, "1MB")
    sleeper = _spawn_sleeper()
    receiver = open_receiver(channel, [sleeper], mode="ring")
    closer = threading.Timer(0.5, receiver.close)
    try:
        closer.start()
        with pytest.raises(hk.UsageError, match="shut down during a receive"):
            receiver.receive()
        assert receiver.close()  # idempotent
    finally:
        closer.join()
        _end(receiver, sleeper)
    del receiver, closer, sleeper, channel
    gc.collect()


@pytest.mark.timeout(120)
def test_a_signal_handler_that_closes_the_ring_reader_ends_its_receive_then_detaches(
    glt_context: None,
) -> None:
    """A handler that shuts the loader down (say on SIGTERM) runs on the receiving thread,
    inside the wait: the receive raises, and the segment and fds are released once it has
    returned, not under it."""
    from graphlearn_torch.channel import ShmChannel
    from healthkit_glt._receive import open_receiver

    before = _segments_of(os.getpid())
    channel = ShmChannel(2, "1MB")
    sleeper = _spawn_sleeper()
    fds = len(os.listdir("/proc/self/fd"))
    receiver = open_receiver(channel, [sleeper], mode="ring")
    previous = signal.signal(signal.SIGUSR2, lambda *_, close=receiver.close: close())
    interrupter = threading.Timer(0.5, signal.pthread_kill, (threading.get_ident(), signal.SIGUSR2))
    try:
        interrupter.start()
        t = time.monotonic()
        with pytest.raises(hk.UsageError, match="shut down during a receive"):
            receiver.receive()
        assert time.monotonic() - t < 10.0
        assert len(os.listdir("/proc/self/fd")) == fds  # pidfd and wake pipe closed
        with pytest.raises(hk.UsageError, match="shut down during a receive"):
            receiver.receive()
    finally:
        interrupter.join()
        signal.signal(signal.SIGUSR2, previous)
        _end(receiver, sleeper)
    del receiver, sleeper, channel
    gc.collect()
    assert _segments_of(os.getpid()) == before


@pytest.mark.timeout(60)
def test_a_c_library_whose_semaphores_differ_gets_the_thread_receiver(
    glt_context: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The ring reader reads a semaphore's value from its first word, as glibc stores it;
    another C library (cannot happen here: this one is checked to be glibc's layout) must
    get the helper thread."""
    from graphlearn_torch.channel import ShmChannel
    from healthkit_glt._adapter import ring
    from healthkit_glt._receive import ThreadReceiver, open_receiver

    assert ring.sem_value_word_works()  # this machine: the ring reader is used
    monkeypatch.setattr(ring, "sem_value_word_works", lambda: False)
    channel = ShmChannel(2, "1MB")
    with pytest.raises(hg.RingLayoutError, match="sem_t does not hold its value"):
        open_receiver(channel, [], mode="ring")
    with caplog.at_level("WARNING", logger="healthkit.glt"):
        fallback = open_receiver(channel, [])
    assert isinstance(fallback, ThreadReceiver)
    fallback.stop()
    assert fallback.close()
    del fallback, channel
    gc.collect()


@pytest.mark.timeout(60)
def test_a_ring_of_another_layout_is_refused_and_auto_falls_back_to_the_thread(
    glt_context: None, caplog: pytest.LogCaptureFixture
) -> None:
    """A GLT build with another ring layout (cannot happen with the pinned 0.2.4, so the
    header a real ShmChannel wrote is altered here) must never be read as 0.2.4's."""
    import ctypes
    import multiprocessing as mp

    from graphlearn_torch.channel import ShmChannel
    from healthkit_glt._adapter.ring import channel_shmid
    from healthkit_glt._receive import RingReceiver, ThreadReceiver, open_receiver

    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmat.restype = ctypes.c_void_p
    libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
    libc.shmdt.argtypes = [ctypes.c_void_p]
    channel = ShmChannel(2, "1MB")
    shmid = channel_shmid(channel)
    assert shmid is not None
    addr = libc.shmat(shmid, None, 0)
    header = (ctypes.c_size_t * 4).from_address(addr)
    data_offset = header[3]
    header[3] = data_offset + 16  # a block table of another size
    try:
        with pytest.raises(hg.RingLayoutError, match=r"not graphlearn-torch 0\.2\.4's layout"):
            open_receiver(channel, [], mode="ring")
        with caplog.at_level("WARNING", logger="healthkit.glt"):
            fallback = open_receiver(channel, [])
        assert isinstance(fallback, ThreadReceiver)
        assert "receiving through a helper thread instead" in caplog.text
        fallback.stop()
        assert fallback.close()
    finally:
        header[3] = data_offset
        del header
        libc.shmdt(addr)
    ring = open_receiver(channel, [], mode="ring")
    assert isinstance(ring, RingReceiver)
    ring.close()
    wrapped = hg.SerializedSendChannel(channel, mp.get_context("spawn").Lock())
    with pytest.raises(hg.RingLayoutError, match="SerializedSendChannel is not a GLT ShmChannel"):
        open_receiver(wrapped, [], mode="ring")
    with pytest.raises(hk.InvalidArgumentError, match="mode must be one of"):
        open_receiver(channel, [], mode="fast")  # type: ignore[arg-type]
    del wrapped, channel
    gc.collect()


# --- non-firing twins, in this process ----------------------------------------------------


@pytest.mark.timeout(IN_PROCESS_TIMEOUT_S, method="thread")
def test_epochs_give_the_same_batches_as_stock_glt_and_shutdown_is_clean_and_idempotent(
    glt_context: None,
    guard: None,
    stop_resource_sharer: None,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Any,
) -> None:
    import multiprocessing as mp

    # Where the workers would record an exception (healthkit.record_exception): a clean
    # run leaves nothing there.
    records = tmp_path / "records"
    monkeypatch.setenv("HEALTHKIT_RECORD_DIR", str(records))

    before = _segments_of(os.getpid())
    dataset = fx.build_dataset()
    epochs = 3
    # Stock GLT needs "spawn" as the default start method (its mp.Value); ours does not.
    # Stock runs with a channel capacity that rules out its concurrent-writer stall; ours
    # with GLT's default (2 here), where only its send lock keeps the two writers apart.
    start_method = mp.get_start_method(allow_none=True)
    fx.set_spawn()
    try:
        stock = fx.build_loader(
            dataset, fx.make_worker_options(channel_capacity=fx.STOCK_SAFE_CHANNEL_CAPACITY)
        )
        try:
            stock_sums = [fx.consume_epoch(stock).checksum for _ in range(epochs)]
        finally:
            stock.shutdown()
    finally:
        mp.set_start_method(start_method, force=True)
    del stock

    # The helper-thread receiver (the fallback for channels the ring reader cannot read)
    # must give the same batches too.
    fallback = fx.build_loader(
        dataset, fx.make_worker_options(), loader_cls=hg.DistNeighborLoader, receiver="thread"
    )
    try:
        fallback_sums = [fx.consume_epoch(fallback).checksum for _ in range(epochs)]
        assert _receiver_threads() == 1
    finally:
        fallback.shutdown()
    assert _receiver_threads() == 0
    del fallback

    loader = fx.build_loader(dataset, fx.make_worker_options(), loader_cls=hg.DistNeighborLoader)
    try:
        runs = [fx.consume_epoch(loader) for _ in range(epochs)]
        assert _receiver_threads() == 0  # the ring reader receives on the caller's thread
    finally:
        t = time.monotonic()
        loader.shutdown()
        shutdown_s = time.monotonic() - t
    t = time.monotonic()
    loader.shutdown()  # idempotent
    again_s = time.monotonic() - t
    producer = loader.producer
    workers = producer.workers
    assert [r.checksum for r in runs] == stock_sums == fallback_sums
    assert len(set(stock_sums)) == epochs  # reshuffled every epoch, reproducibly
    assert all(r.seeds == list(range(fx.NUM_NODES)) for r in runs)
    assert all(len(r.digests) == -(-fx.NUM_NODES // fx.BATCH_SIZE) for r in runs)
    assert [w.exitcode for w in workers] == [0, 0]  # STOP, not SIGTERM
    left = os.listdir(records) if records.exists() else []
    assert not [n for n in left if n.startswith("exception-")], left
    assert producer.failure is None
    assert producer._report_flag[0] == 0  # the clean path: no worker reported anything
    assert _segments_of(os.getpid()) == before  # released by shutdown(), loader referenced
    assert shutdown_s < producer.grace + 2 * producer.kill_after
    assert again_s < 0.1
    with pytest.raises(hk.UsageError, match="shut down"):
        iter(loader)
    del loader, producer, workers, runs
    gc.collect()
    assert _segments_of(os.getpid()) == before


@pytest.mark.timeout(IN_PROCESS_TIMEOUT_S, method="thread")
@pytest.mark.parametrize(
    ("rpc_init_timeout", "expected_after"),
    [(60.0, 30.0), (30.0, 30.0)],
    ids=["narrowed-60s-to-30s", "no-op-when-equal"],
)
def test_worker_reads_back_its_rpc_timeout_before_and_after_the_init_barrier(
    glt_context: None,
    guard: None,
    stop_resource_sharer: None,
    rpc_init_timeout: float,
    expected_after: float,
) -> None:
    with tempfile.TemporaryDirectory() as report_dir:
        loader = fx.build_loader(
            fx.build_dataset(),
            fx.make_worker_options(rpc_timeout=30.0),
            loader_cls=hg.DistNeighborLoader,
            worker_loop=sc.rpc_timeout_reporting_loop,
            rpc_init_timeout=rpc_init_timeout,
            worker_extra={"report_dir": report_dir},
        )
        try:
            epoch = fx.consume_epoch(loader)  # the custom loop samples like the default one
            reports = {}
            for rank in (0, 1):
                with open(os.path.join(report_dir, f"rpc-timeout-{rank}.json")) as f:
                    reports[rank] = json.load(f)
        finally:
            loader.shutdown()
    assert epoch.seeds == list(range(fx.NUM_NODES))
    assert loader.producer.timeouts.steady_state_rpc_timeout == 30.0
    for rank in (0, 1):
        assert reports[rank] == {"before": rpc_init_timeout, "after": expected_after}
    del loader
    gc.collect()


@pytest.mark.timeout(IN_PROCESS_TIMEOUT_S, method="thread")
def test_a_short_grace_reaches_the_teardown_of_running_workers(
    glt_context: None, guard: None, stop_resource_sharer: None, caplog: pytest.LogCaptureFixture
) -> None:
    """``grace`` (the wait from STOP to SIGTERM), given to the loader and to ``shutdown()``,
    reaches the teardown of running workers: a grace shorter than GLT's 1 s loop shutdown is
    logged as the escalation it is, with the value given."""
    before = _segments_of(os.getpid())
    loader = fx.build_loader(fx.build_dataset(), fx.make_worker_options(),
                             loader_cls=hg.DistNeighborLoader, grace=7.0)  # fmt: skip
    producer = loader.producer
    workers = producer.workers
    try:
        assert producer.grace == 7.0
        with caplog.at_level("WARNING", logger="healthkit.glt"):
            producer.shutdown(grace=0.001)
    finally:
        loader.shutdown()  # idempotent; the teardown if an assertion above failed
    assert "did not end within 0.001s of the stop request; sending SIGTERM" in caplog.text
    assert [w.exitcode for w in workers] == [0, 0]  # torch's SIGTERM handler: exit 0
    assert _segments_of(os.getpid()) == before
    del loader, producer, workers
    gc.collect()


# --- fault matrix, each in its own process group ------------------------------------------


@pytest.mark.timeout(SUBPROCESS_TIMEOUT_S)
def test_worker_sigkilled_during_init_stock_glt_hangs_healthkit_glt_fails_in_seconds() -> None:
    # Watched for 10 s after the kill (twice healthkit_glt's bound below), then killed.
    stock = sc.run_stock("hang-init", timeout=90.0, hang_after_kill=10.0)
    assert stock.returncode is None, stock.output
    assert sc.stock.KILL_MARK in stock.output, stock.output  # hung after the kill, not before
    # the loader's process, in the producer's unbounded barrier.wait() (FINDINGS §3)
    assert 'dist_sampling_producer.py", line 221 in init' in stock.stacks, stock.stacks

    run = sc.run_scenario("hk-init-sigkill", ["0.5"], timeout=120)
    r = run.result
    assert run.returncode == 0, run.output
    assert r["outcome"] == "raised" and r["type"] == "BarrierBrokenError"
    assert r["after_kill_s"] < 5.0
    assert r["exit_codes"] == {"0": -9}
    assert r["causes"] in (["SIGKILL_UNCONFIRMED"], ["OOM_KILLED"])
    assert "sampling worker 0" in r["message"] and "killed by SIGKILL" in r["message"]
    assert r["segments_left"] == []  # released though the failed producer is referenced
    assert r["children_left"] == []
    assert run.survivors == [] and run.leaked_segments == []
    assert "Exception ignored" not in run.output


@pytest.mark.timeout(SUBPROCESS_TIMEOUT_S)
def test_worker_raising_during_init_fails_the_loader_with_its_exit_code_and_traceback() -> None:
    run = sc.run_scenario("hk-init-raise", timeout=150)
    r = run.result
    assert run.returncode == 0, run.output
    assert r["outcome"] == "raised" and r["type"] == "BarrierBrokenError"
    assert r["exit_codes"] == {"1": 1} and r["causes"] == ["ERROR_EXIT"]
    # The raiser heads the error, whatever its peer died of, and it exits without an RPC
    # teardown first (that took 1.8-7.8 s): raise to error in well under a second here.
    assert r["message"].startswith(
        "sampling worker 1 raised during init: ValueError: bad fan-out [5, 5]"
    ), r["message"]
    assert r["after_raise_s"] < 3.0
    assert r["segments_left"] == []  # released though the failed producer is referenced
    # The worker's exception comes through the core's record (healthkit.record_exception),
    # as any helper's: its diagnosis names it, and the error ends with its last frames.
    assert "exited with code 1: it raised ValueError: bad fan-out [5, 5]" in r["message"]
    assert "in failing_sampler_factory [exception record " in r["message"]
    assert "--- sampling worker 1 raised ---" in r["message"]
    assert "glt_scenarios.py\", line" in r["message"], r["message"]
    assert "ValueError: bad fan-out [5, 5]" in r["message"].split("--- sampling worker 1")[-1]
    assert r["children_left"] == []
    assert run.survivors == [] and run.leaked_segments == []
    assert "Exception ignored" not in run.output


@pytest.mark.timeout(SUBPROCESS_TIMEOUT_S)
def test_worker_raising_mid_epoch_fails_the_loader_naming_its_exception_and_rank() -> None:
    """Past the barrier: the worker's exception is recorded through the core and named by
    the loader's error (type, message, where, and the worker); the worker the producer tore
    down afterwards (exit 0 on its SIGTERM) leaves no record."""
    run = sc.run_scenario("hk-epoch-raise", timeout=150)
    r = run.result
    assert run.returncode == 0, run.output
    assert r["outcome"] == "raised" and r["type"] == "SamplingWorkerDiedError", r
    assert (r["rank"], r["cause"], r["exit_code"]) == (1, "ERROR_EXIT", 1)
    lost = "RuntimeError: feature store connection lost (injected by the test)"
    assert r["exception"] == lost
    message = r["message"]
    assert message.startswith("sampling worker 1 died while the loader waited for batch")
    assert f"exited with code 1: it raised {lost} at glt_scenarios.py:" in message, message
    assert "in rank1_raises_mid_epoch_loop" in message
    assert "--- sampling worker 1 raised ---" in message and message.endswith(lost)
    worker0, worker1 = r["worker_pids"]
    assert r["records"][str(worker0)] == [] and len(r["records"][str(worker1)]) == 1
    assert r["children_left"] == []
    assert run.survivors == [] and run.leaked_segments == []


@pytest.mark.timeout(SUBPROCESS_TIMEOUT_S)
@pytest.mark.parametrize("how", ["group", "alone"])
def test_workers_ended_by_a_group_stop_are_not_a_failure_and_one_stopped_alone_is(
    how: str,
) -> None:
    """torchrun stops a rank with a SIGTERM to its process group: the sampling workers die
    of it while the trainer (which here handles SIGTERM and goes on, as a loop saving a
    checkpoint does) still waits for a batch. The core's rule excuses those deaths: the
    loader raises SamplingStoppedError, logs no error and publishes nothing. The twin: the
    same SIGTERM to one worker alone, no stop of the trainer, is a failure."""
    run = sc.run_scenario("hk-epoch-stop", [how], timeout=150)
    r = run.result
    assert run.returncode == 0, run.output
    assert r["outcome"] == "raised", r
    if how == "group":
        assert r["stops_seen"] == 1
        assert r["type"] == "SamplingStoppedError", r["message"]
        assert "ProcessDiedError" not in r["mro"] and "RuntimeError" in r["mro"]
        assert sorted(r["ranks"]) in ([0], [1], [0, 1]), r
        assert "ended while this process was being stopped" in r["message"]
        assert "(SIGTERM " in r["message"] and "not a failure" in r["message"]
        assert r["errors"] == [], r["errors"]
        assert r["again"] == "SamplingStoppedError"  # within the stop's grace
        assert "taken as its share of this process's stop" in run.output
    else:
        assert r["stops_seen"] == 0
        assert r["type"] == "SamplingWorkerDiedError", r["message"]
        assert r["ranks"] == [1] and "killed by SIGTERM" in r["message"]
        assert r["again"] == "SamplingWorkerDiedError"
    assert r["children_left"] == []
    assert run.survivors == [] and run.leaked_segments == []


@pytest.mark.timeout(SUBPROCESS_TIMEOUT_S)
@pytest.mark.parametrize("how", ["ctrl-c", "ctrl-c-alone"])
def test_a_ctrl_c_ends_the_workers_as_a_stop_and_a_sigint_to_one_worker_alone_is_a_failure(
    how: str,
) -> None:
    """A Ctrl-C in the terminal: SIGINT to the foreground group, trainer and workers alike.
    The workers end of it; the trainer catches its KeyboardInterrupt (a notebook cell, a
    loop that asks "really quit?") and asks for the next batch: SamplingStoppedError naming
    the SIGINT, nothing logged at ERROR, nothing published. The twin: the same SIGINT to
    worker 1 alone, nothing stops the trainer: a failure naming that worker and the SIGINT."""
    run = sc.run_scenario("hk-epoch-stop", [how], timeout=150)
    r = run.result
    assert run.returncode == 0, run.output
    assert r["outcome"] == "raised", r
    if how == "ctrl-c":
        assert r["interrupts"] == 1, r
        assert r["type"] == "SamplingStoppedError", r["message"]
        assert "ended while this process was being stopped" in r["message"]
        assert "(SIGINT " in r["message"] and "not a failure" in r["message"]
        assert r["errors"] == [], r["errors"]
    else:
        assert r["interrupts"] == 0, r
        assert r["type"] == "SamplingWorkerDiedError", r["message"]
        assert r["ranks"] == [1], r
        # the worker ends by SIGINT (not exit 0), so the diagnosis names what ended it
        assert "killed by SIGINT" in r["message"], r["message"]
        assert r["again"] == "SamplingWorkerDiedError"
    assert r["children_left"] == []
    assert run.survivors == [] and run.leaked_segments == []


@pytest.mark.timeout(SUBPROCESS_TIMEOUT_S)
def test_an_uncaught_ctrl_c_ends_the_script_with_its_traceback_and_nothing_else() -> None:
    """The usual Ctrl-C: nobody catches the KeyboardInterrupt. The script ends with its
    traceback, promptly (the interpreter's exit shuts the live loader down); no worker is
    reported dead, nothing is logged at ERROR, no process or ring segment is left."""
    run = sc.run_scenario("hk-epoch-stop", ["ctrl-c-exit"], timeout=150)
    assert run.returncode is not None, run.output  # not hung
    assert "KeyboardInterrupt: not caught" in run.output, run.output
    assert "Traceback" in run.output and "KeyboardInterrupt" in run.output
    assert run.results == [], run.results
    for line in run.output.splitlines():
        assert not line.startswith(("ERROR", "CRITICAL")), run.output
    assert "SamplingWorkerDiedError" not in run.output and "died" not in run.output, run.output
    assert run.survivors == [] and run.leaked_segments == []


@pytest.mark.timeout(2 * SUBPROCESS_TIMEOUT_S)
def test_worker_hanging_during_init_fails_at_the_bound_with_the_hanging_stack() -> None:
    """The stack must show where the worker hangs. A 15 s bound is several times a worker's
    start-up, but under heavy load the spawned workers were still in ``spawn_main`` when it
    expired: such a run tests nothing about the stack (the hang writes a marker when it is
    reached, and the scenario says whether that was before the stacks were dumped), so it
    is repeated once with a 3x bound, rather than every run paying the larger one."""
    for bound in (15, 45):
        run = sc.run_scenario("hk-init-hang", [str(bound), "1"], timeout=bound + 135)
        r = run.result
        assert run.returncode == 0, run.output
        assert r["outcome"] == "raised" and r["type"] == "BarrierTimeoutError"
        assert "TimeoutError" in r["mro"]
        assert bound <= r["elapsed_s"] < bound + 30
        assert r["exit_codes"] == {} and 1 in r["not_arrived"]
        assert f"(bound {bound}s)" in r["message"] and "1 x" in r["message"]
        assert r["children_left"] == []
        assert run.survivors == [] and run.leaked_segments == []
        if 1 in r["hang_reached"]:
            break
    else:
        pytest.fail(f"worker 1 had not reached its hang when a {bound}s bound expired")
    assert "hang_in_sampler_factory" in r["message"]


@pytest.mark.timeout(SUBPROCESS_TIMEOUT_S)
def test_worker_sigkilled_mid_epoch_stock_glt_hangs_healthkit_glt_fails_in_seconds() -> None:
    # Watched for 15 s after the kill (three times healthkit_glt's bound below), then killed.
    stock = sc.run_stock("hang-epoch", ["0", "0.5"], timeout=90.0, hang_after_kill=15.0)
    assert stock.returncode is None, stock.output  # hung in ShmChannel.recv
    assert sc.stock.KILL_MARK in stock.output, stock.output
    assert 'shm_channel.py", line 66 in recv' in stock.stacks, stock.stacks

    run = sc.run_scenario("hk-epoch-sigkill", ["0.5", "1"], timeout=120)
    r = run.result
    assert run.returncode == 0, run.output
    assert r["outcome"] == "raised" and r["type"] == "SamplingWorkerDiedError"
    assert "ProcessDiedError" in r["mro"]
    assert r["after_kill_s"] < 5.0
    assert (r["rank"], r["exit_code"], r["signal"]) == (1, -9, "SIGKILL")
    # killed by hand: never called an OOM kill, though the diagnoser now watches the kernel
    # log from before the workers start (the twin of the real OOM kill test below)
    assert r["cause"] == "SIGKILL_UNCONFIRMED"
    waited_for = r["batches"] + 1  # usually 2; a batch already in flight may still arrive
    assert f"sampling worker 1 died while the loader waited for batch {waited_for};" in r["message"]
    assert r["same_error_on_reuse"] is True
    assert r["children_left"] == []
    assert run.survivors == [] and run.leaked_segments == []


@pytest.mark.timeout(SUBPROCESS_TIMEOUT_S)
def test_worker_sigkilled_mid_epoch_with_a_fast_consumer_fails_in_seconds() -> None:
    run = sc.run_scenario("hk-epoch-sigkill", ["0", "0"], timeout=120)
    r = run.result
    assert run.returncode == 0, run.output
    assert r["type"] == "SamplingWorkerDiedError" and r["after_kill_s"] < 5.0
    assert (r["rank"], r["signal"]) == (1, "SIGKILL")
    assert run.survivors == [] and run.leaked_segments == []


@pytest.mark.timeout(SUBPROCESS_TIMEOUT_S)
def test_script_that_exits_without_shutdown_exits_0_quietly_and_leaves_nothing() -> None:
    run = sc.run_scenario("hk-exit-without-shutdown", ["2"], timeout=150)
    assert run.returncode == 0, run.output
    assert run.result["outcome"] == "done"
    assert _no_tracebacks(run.output) == [], run.output
    assert run.survivors == [] and run.leaked_segments == []


@pytest.mark.timeout(SUBPROCESS_TIMEOUT_S)
def test_two_writers_through_the_send_lock_deliver_every_message_in_order_at_capacity_2() -> None:
    # Without the lock, this exact run (GLT's plain concurrent send) stalled for good in
    # every one of 8 tries here: benchmarks/glt_bench.py measures it side by side.
    run = sc.run_scenario("channel-writers", ["serialized", "2", "3000"], timeout=120)
    assert run.returncode == 0, f"stalled ({run.elapsed_s:.0f} s):\n{run.stacks}\n{run.output}"
    r = run.result
    assert (r["received"], r["out_of_order"], r["writer_exit_codes"]) == (6000, 0, [0, 0])
    assert run.survivors == [] and run.leaked_segments == []


def test_the_send_lock_wraps_send_only_and_forwards_everything_else(glt_context: None) -> None:
    import multiprocessing as mp

    import torch
    from graphlearn_torch.channel import ChannelBase, ShmChannel

    lock = mp.get_context("spawn").Lock()
    inner = ShmChannel(2, "1MB")
    channel = hg.SerializedSendChannel(inner, lock)
    assert isinstance(channel, ChannelBase)
    assert channel.empty()  # forwarded
    channel.send({"x": torch.arange(3)})
    assert lock.acquire(block=False)  # released after the send
    lock.release()
    assert torch.equal(channel.recv(timeout_ms=1000)["x"], torch.arange(3))
    with pytest.raises(AttributeError, match="no_such_method"):
        channel.no_such_method  # noqa: B018
    del channel, inner
    gc.collect()


@pytest.mark.timeout(SUBPROCESS_TIMEOUT_S)
@pytest.mark.parametrize("receiver", ["auto", "thread"], ids=["ring-reader", "helper-thread"])
def test_next_block_claimed_by_a_dead_worker_fails_the_loader_and_frees_the_segment(
    receiver: str,
) -> None:
    run = sc.run_scenario("hk-stuck-slot", ["1.5", receiver], timeout=120)
    assert run.returncode == 0, f"{run.stacks}\n{run.output}"
    r = run.result
    assert r["outcome"] == "raised" and r["type"] == "SamplingWorkerDiedError", run.output
    assert r["signal"] == "SIGKILL" and r["after_kill_s"] < 10.0
    if receiver == "auto":
        # The ring reader waited beside the claimed block, never in it: nothing is stuck,
        # and GLT's own destructor removes the segment (the leak check below).
        assert r["claimed_block_left"] is True
        assert r["receiver_thread_stuck"] is False
        assert "stays blocked" not in run.output
    else:
        # The helper thread took the block and is in the C++ wait on it, for good.
        assert r["receiver_thread_stuck"] is True
        assert "stays blocked on a ring slot" in run.output
        assert f"channel segment {r['shmid']} marked for removal at exit" in run.output
        assert int(r["shm_perms"], 8) & 0o1000  # SHM_DEST: gone when the process exits
    assert r["children_left"] == []
    assert run.survivors == [] and run.leaked_segments == []


# --- the trainer itself SIGKILLed (OOM-killed) ---------------------------------------------


@pytest.mark.timeout(SUBPROCESS_TIMEOUT_S)
@pytest.mark.parametrize("phase", ["epoch", "init"], ids=["mid-epoch", "during-init"])
def test_sampling_workers_die_within_2s_of_a_sigkilled_trainer_and_leave_no_segment(
    phase: str,
) -> None:
    """Mid-epoch the workers are past the barrier, parked in ``send()`` or waiting for a
    command; during init they are in bring-up and the trainer waits at the barrier. Either
    way nothing but the kernel's parent-death signal tells them that the trainer is gone.
    Without it (before this was fixed) both workers were alive 5 s later, in every phase,
    and the channel's segment stayed in the kernel."""
    r = sc.sigkill_trainer(phase)
    assert "error" not in r, r
    assert r["survivors"] == [], f"workers outlived the trainer: {r}"
    assert all(t is not None and t < 2.0 for t in r["gone_after_s"]), r
    assert r["segments_left"] == [] and r["dev_shm_left"] == [], r


@pytest.mark.timeout(SUBPROCESS_TIMEOUT_S)
def test_workers_whose_trainer_died_before_they_started_end_themselves_when_they_start() -> None:
    """SIGKILLed 0.3 s after the spawn, before any worker code runs: the parent-death
    signal cannot be set yet (docs/glt.md, "Limits"); the worker notices that its parent is
    gone as its first step and ends itself, once its start-up is done."""
    r = sc.sigkill_trainer("startup", watch_s=30.0)
    assert "error" not in r, r
    assert r["survivors"] == [], f"workers outlived the trainer: {r}"
    assert all(t is not None and t < 30.0 for t in r["gone_after_s"]), r
    assert r["segments_left"] == [] and r["dev_shm_left"] == [], r


# --- a sampling error inside a live worker -------------------------------------------------


@pytest.mark.timeout(SUBPROCESS_TIMEOUT_S)
@pytest.mark.parametrize("entry", ["features", "nodes", "edges", "subgraph"])
def test_a_sampling_error_in_a_live_worker_fails_the_loader_with_rank_and_traceback(
    entry: str,
) -> None:
    """Stock GLT logs the coroutine's exception and drops it: the worker lives on and the
    consumer waits forever for a batch that never comes. ``features``: the default sampler
    and loader, a real feature lookup out of range; ``nodes`` / ``subgraph``: a custom
    sampler factory whose GLT coroutine raises in worker 1 while worker 0 keeps sampling;
    ``edges``: GLT's own link sampling, whose message ``ShmChannel.send`` rejects inside the
    coroutine on both supported builds (a real GLT error that stock GLT swallows)."""
    run = sc.run_scenario("hk-sampling-error", [entry], timeout=150)
    assert run.returncode == 0, run.output
    r = run.result
    assert r["outcome"] == "raised" and r["type"] == "SamplingError", run.output
    assert "HealthkitError" in r["mro"] and "RuntimeError" in r["mro"]
    assert r["failure_kept"] is True
    # from the worker's report to the caller, including the teardown of both workers
    assert r["after_raise_s"] < 5.0
    expected = {
        "features": "IndexError: index",
        "nodes": "IndexError: seed index out of range in _sample_from_nodes (injected",
        "edges": "TypeError: send(): incompatible function arguments",
        "subgraph": "IndexError: seed index out of range in _subgraph (injected",
    }[entry]
    assert (
        expected in r["worker_traceback"]
        and "Traceback (most recent call last)" in r["worker_traceback"]
    )
    # rank and pid of the live worker that raised (issue 25: the pid was missing)
    assert r["pid"] == r["worker_pids"][r["rank"]] and r["pid"] > 0
    assert r["first_line"].startswith(
        f"sampling worker {r['rank']} (pid {r['pid']}) raised while sampling"
    ), r["first_line"]
    assert expected in r["first_line"]
    if entry in ("nodes", "subgraph"):
        assert r["rank"] == 1
    assert r["children_left"] == []
    assert run.survivors == [] and run.leaked_segments == []


# --- init barrier: a worker SIGKILLed after it arrived --------------------------------------


@pytest.mark.timeout(SUBPROCESS_TIMEOUT_S)
def test_worker_sigkilled_after_arriving_at_the_barrier_fails_the_loader_in_milliseconds() -> None:
    """The barrier waits ``abort_grace`` for a party that arrived and died (it may have
    passed just before): 1 s by default made this take 2.2 s; the producer uses 0.05 s."""
    run = sc.run_scenario("hk-init-sigkill-arrived", ["0.3"], timeout=150)
    assert run.returncode == 0, run.output
    r = run.result
    assert r["outcome"] == "raised" and r["type"] == "BarrierBrokenError", run.output
    assert r["exit_codes"] == {"1": -9} and r["arrived_dead"] == [1]
    assert r["after_kill_s"] < 1.0
    assert r["segments_left"] == [] and r["children_left"] == []
    assert run.survivors == [] and run.leaked_segments == []


# --- shutdown() during an epoch: escalation visible, segment released -----------------------


@pytest.mark.timeout(SUBPROCESS_TIMEOUT_S)
def test_shutdown_during_an_epoch_logs_its_escalation_at_warning_and_releases_the_segment() -> None:
    """Both workers are parked in ``send()`` on a full ring and cannot read STOP: after
    ``grace`` they get SIGTERM and exit 0 through torch's handler, so the WARNING
    line is the only trace of the escalation."""
    run = sc.run_scenario("hk-shutdown-mid-epoch", ["0.5"], timeout=150)
    assert run.returncode == 0, run.output
    r = run.result
    assert "WARNING healthkit.glt: sampling workers" in run.output
    assert "did not end within 0.5s of the stop request; sending SIGTERM" in run.output
    assert r["worker_exit_codes"] == [0, 0]
    assert r["shutdown_s"] < 0.5 + 5.0 + 2.0
    assert r["segments_left"] == [] and r["children_left"] == []
    assert run.survivors == [] and run.leaked_segments == []


# --- which receiver this GLT build gets ------------------------------------------------------


@pytest.mark.timeout(60)
def test_this_glt_build_writes_the_ring_layout_the_ring_reader_checks(
    glt_context: None, caplog: pytest.LogCaptureFixture
) -> None:
    """Both supported builds (0.2.4 and 26fe3d4) write the layout; a build that does not
    gets the helper thread with a warning (test_a_ring_of_another_layout_...)."""
    from graphlearn_torch.channel import ShmChannel
    from healthkit_glt._receive import RingReceiver, open_receiver

    print(f"graphlearn-torch {hg.glt_version()} ({hg.glt_build()})")
    assert hg.glt_version() in ("0.2.4", "0.2.4+git26fe3d4")
    channel = ShmChannel(2, "1MB")
    with caplog.at_level("WARNING", logger="healthkit.glt"):
        receiver = open_receiver(channel, [])
    assert isinstance(receiver, RingReceiver), caplog.text
    assert "helper thread" not in caplog.text
    receiver.close()
    del receiver, channel
    gc.collect()


def test_this_glt_build_has_every_internal_the_adapter_touches_and_passes_the_check_silently(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The import-time self-check on the installed build (0.2.4 or 26fe3d4): known, every
    GLT private in ``_adapter.REQUIRED`` present (module globals, methods, and the instance
    attributes GLT's ``__init__`` assigns), no warning."""
    from healthkit_glt import _adapter

    with caplog.at_level("WARNING", logger="healthkit.glt"):
        _adapter.self_check()
    assert caplog.text == ""
    assert hg.glt_version() in _adapter.KNOWN_BUILDS


def test_a_glt_build_the_adapter_does_not_know_is_refused_naming_it(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same internals, unknown version: refused with an ImportError naming the build, the
    tested ones and what to do; accepted, with a warning, only when
    $HEALTHKIT_GLT_ACCEPT_BUILD names that very version."""
    from healthkit_glt import _adapter

    monkeypatch.delenv(_adapter.ACCEPT_BUILD_ENV, raising=False)
    with pytest.raises(ImportError) as err:
        _adapter.self_check(version="0.3.0")
    text = str(err.value)
    assert "graphlearn-torch 0.3.0 is not a build healthkit_glt knows" in text, text
    assert "0.2.4+git26fe3d4" in text and "HEALTHKIT_GLT_ACCEPT_BUILD=0.3.0" in text, text
    monkeypatch.setenv(_adapter.ACCEPT_BUILD_ENV, "0.3.1")  # another version: still refused
    with pytest.raises(ImportError, match=r"0\.3\.0 is not a build"):
        _adapter.self_check(version="0.3.0")
    monkeypatch.setenv(_adapter.ACCEPT_BUILD_ENV, "0.3.0")
    with caplog.at_level("WARNING", logger="healthkit.glt"):
        _adapter.self_check(version="0.3.0")
    assert "graphlearn-torch 0.3.0 is not a build healthkit_glt was tested with" in caplog.text
    assert "accepted by $HEALTHKIT_GLT_ACCEPT_BUILD" in caplog.text


@pytest.mark.parametrize(
    ("owner", "name", "named"),
    [
        (None, "_no_such_slot", "graphlearn_torch.distributed.dist_server._no_such_slot"),
        ("DistServer", "_no_such_pool", "graphlearn_torch.distributed.dist_server.DistServer."
         "_no_such_pool"),
    ],
)  # fmt: skip
def test_a_glt_build_that_lacks_an_internal_fails_the_check_naming_it(
    owner: str | None, name: str, named: str
) -> None:
    """A module global or an instance attribute GLT's ``__init__`` no longer assigns: the
    check raises ImportError naming the build, the missing name and what to do."""
    from healthkit_glt import _adapter

    required = (*_adapter.REQUIRED, ("graphlearn_torch.distributed.dist_server", owner, name))
    with pytest.raises(ImportError) as err:
        _adapter.self_check(version="0.3.0", required=required)
    text = str(err.value)
    assert f"graphlearn-torch 0.3.0 lacks {named}, which" in text, text
    assert "install a tested build" in text and "port _adapter/ to this one" in text, text


def _private_names_touched(path: Any) -> set[str]:
    """The private names (``_x``, not dunders) a module touches on something not its own
    ``self``/``cls``: attributes, ``getattr``-family names, and names imported from
    graphlearn_torch or torch."""
    import ast

    def private(name: object) -> bool:
        return isinstance(name, str) and name.startswith("_") and not name.startswith("__")

    def own(node: ast.expr) -> bool:
        return isinstance(node, ast.Name) and node.id in ("self", "cls")

    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and private(node.attr) and not own(node.value):
            names.add(node.attr)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in (
            "graphlearn_torch", "torch",
        ):  # fmt: skip
            names |= {alias.name for alias in node.names if private(alias.name)}
        elif (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
            and len(node.args) > 1 and isinstance(node.args[1], ast.Constant)
            and private(node.args[1].value) and not own(node.args[0])
        ):  # fmt: skip
            names.add(node.args[1].value)
    return names


def test_the_import_time_check_covers_every_glt_private_the_adapter_touches_and_only_it() -> None:
    """Every private the adapter's modules touch is in ``_adapter.REQUIRED`` (so the
    import-time check looks it up on the installed build, and finds it here), and the rest of
    healthkit_glt touches no private of GLT or torch: only its own, listed below."""
    from pathlib import Path

    from healthkit_glt import _adapter
    from healthkit_glt._adapter import build

    required = {name for _, _, name in _adapter.REQUIRED}
    assert all(build.present(*entry) for entry in _adapter.REQUIRED)
    package = Path(hg.__file__).parent
    adapter = sorted((package / "_adapter").glob("*.py"))
    assert {p.stem for p in adapter} >= {"build", "ring", "loader_state", "producer", "server"}
    touched = {p.stem: _private_names_touched(p) for p in adapter}
    assert {name for names in touched.values() for name in names} <= required, touched
    assert touched["ring"] == {"_queue"} and "_dist_server" in touched["server"], touched
    ours = {
        "_use_endings": "DistSamplingProducer's own (_server.py)",
        "_exit": "os._exit (_worker.py)",
    }
    for path in sorted(package.glob("*.py")):
        assert _private_names_touched(path) <= set(ours), path.name


# --- a real OOM kill of a sampling worker (issue: the producer's diagnoser came too late) ----


@pytest.mark.timeout(SUBPROCESS_TIMEOUT_S)
def test_a_worker_oom_killed_mid_epoch_by_the_kernel_is_reported_as_a_confirmed_oom_kill() -> None:
    """Worker 1 moves itself into a 128 MiB memory cgroup and allocates until the kernel's
    OOM killer ends it. The producer's diagnoser was built before the first worker
    started, so the kill is in its kernel-log window: "OOM killer (confirmed)". (Built
    after the death, as it was, it said "possibly the OOM killer, unconfirmed".) The
    opposite hole, a SIGKILL by hand called an OOM kill, is
    test_worker_sigkilled_mid_epoch_stock_glt_hangs_healthkit_glt_fails_in_seconds."""
    if (why := kernel_log_unusable()) is not None:
        pytest.skip(why)
    cgroup = memory_cgroup_or_skip(128 << 20, "glt-oom")
    try:
        run = sc.run_scenario("hk-epoch-oom", [cgroup], timeout=150)
    finally:
        remove_cgroup(cgroup)
    assert run.returncode == 0, run.output
    r = run.result
    assert r["outcome"] == "raised" and r["type"] == "SamplingWorkerDiedError", run.output
    assert (r["rank"], r["pid"], r["signal"]) == (1, r["worker_pids"][1], "SIGKILL")
    assert r["cause"] == "OOM_KILLED", r["diagnosis"]
    assert "OOM killer (confirmed)" in r["message"], r["message"]
    assert any(e.startswith("kernel log: ") and f"Killed process {r['pid']} " in e
               for e in r["evidence"]), r["evidence"]  # fmt: skip
    assert r["children_left"] == []
    assert run.survivors == [] and run.leaked_segments == []


# --- fail and rebuild in one process: nothing accumulates (scripts/soak runs 20) ------------


@pytest.mark.timeout(SUBPROCESS_TIMEOUT_S)
def test_failed_and_rebuilt_loaders_leave_this_process_as_it_was() -> None:
    """A worker death, a sampler error and an init failure, each caught, the loader shut
    down and dropped as a retrying script does it (the loop variable still holds the last
    batch, a view of the ring, during shutdown()): after each, no SysV segment, mapping,
    /dev/shm name, fd, thread or child more than before. Before the fix, each worker death
    left the ring's segment attached (nattch 1) for the life of the process."""
    run = sc.run_scenario("hk-fail-rebuild", ["3"], timeout=200)
    assert run.returncode == 0, run.output
    r = run.result
    assert [x["raised"] for x in r["runs"]] == [
        "SamplingWorkerDiedError", "SamplingError", "BarrierBrokenError"]  # fmt: skip
    assert [x["diff"] for x in r["runs"]] == [{}, {}, {}], r["runs"]
    assert r["before"]["segments"] == [] and r["before"]["sysv_mappings"] == 0
    assert run.survivors == [] and run.leaked_segments == []


@pytest.mark.timeout(SUBPROCESS_TIMEOUT_S)
def test_a_steady_state_stall_with_every_worker_alive_logs_their_stacks_once() -> None:
    """Live sampling workers stop sending mid-epoch; the fetch loop polls recv(timeout_ms=200).
    Every poll still raises QueueTimeoutError (the loop decides); once no batch has come for
    the steady-state RPC timeout (3 s here) the live workers' stacks are logged at WARNING,
    once for the whole stall, naming where they wait. Polls before the bound log nothing."""
    run = sc.run_scenario("hk-steady-state-stall", ["3"], timeout=150)
    assert run.returncode == 0, run.output
    r = run.result
    assert r["batches"] >= 2 and r["timeouts"] > 20, r  # polls went on, each one raised
    assert r["workers_alive"] == [True, True], r
    assert len(r["stalls"]) == 1, r["stalls"]  # once per stall, not once per poll
    after, text = r["stalls"][0]
    assert 3.0 <= after < 6.0, r["stalls"]  # not before the bound
    assert "while every sampling worker is alive" in text and "(3s)" in text, text
    for rank, pid in enumerate(r["worker_pids"]):
        assert f"--- stack of sampling worker {rank} (pid {pid}) ---" in text, text
    assert text.count("stall_in_sampling_forever") >= 2, text  # each worker's own frame
    assert r["children_left"] == [], r


def test_healthkit_glt_logs_under_healthkit_glt_in_the_healthkit_tree() -> None:
    """One logger tree: a setting on ``healthkit`` reaches healthkit_glt's lines too."""
    import importlib
    import logging

    for name in ("_adapter.build", "_adapter.ring", "_loader", "_producer", "_receive",
                 "_remote", "_server", "_worker"):  # fmt: skip
        module = importlib.import_module(f"healthkit_glt.{name}")
        assert module.logger is logging.getLogger("healthkit.glt"), name
    assert logging.getLogger("healthkit.glt").parent is logging.getLogger("healthkit")


@pytest.mark.timeout(SUBPROCESS_TIMEOUT_S)
def test_with_stall_timeout_live_workers_that_stop_sending_fail_the_loader_with_their_stacks() -> (
    None
):
    """stall_timeout=1: every worker blocks in its sampler from its 3rd batch, all alive.
    The loop trains 1.5 s after each batch: nobody waits then, so the 4 batches it gets pass
    silently; the wait for the 5th raises SamplingStalledError about 1 s in, with each
    worker's rank, pid, state and the stuck thread's stack, and the producer torn down."""
    run = sc.run_scenario("hk-stall-timeout", ["stuck", "1"], timeout=150)
    assert run.returncode == 0, run.output
    r = run.result
    assert r["outcome"] == "stalled", r
    assert r["batches"] == 4, r  # the idle time between them never counted
    assert 1.0 <= r["stalled_for"] <= 1.5, r
    assert r["type"] == "SamplingStalledError" and "TimeoutError" in r["mro"], r
    assert r["ranks"] == [0, 1] and r["failure_kept"], r
    text = r["message"]
    assert "no batch for 1.0s while the loader waited for batch 5" in text, text
    for rank, pid in enumerate(r["worker_pids"]):
        assert f"sampling worker {rank} (pid {pid}) stalled: no progress for" in text, text
        assert f"Python stacks of sampling worker {rank} (pid {pid})" in text, text
    assert "while the loader waited for a batch: it is alive and blocked: state S" in text, text
    assert text.count("in stall_in_sampling_forever") == 2, text  # each worker's stuck thread
    assert "other threads:" in text, text  # dozens of RPC threads, summed up
    assert r["workers_alive_after"] == [False, False] and r["children_left"] == [], r


@pytest.mark.timeout(SUBPROCESS_TIMEOUT_S)
def test_with_stall_timeout_slow_but_progressing_workers_never_fail_the_loader() -> None:
    """stall_timeout=0.6: each worker hands over a batch every 0.9 x stall_timeout, the two
    half a period apart, for about 10 timeouts: the epoch completes."""
    run = sc.run_scenario("hk-stall-timeout", ["slow", "0.6"], timeout=150)
    assert run.returncode == 0, run.output
    r = run.result
    assert r["outcome"] == "finished" and r["batches"] == 22, r
    assert r["seconds"] >= 5.0, r  # it was slow: about 10 x 0.6 s


def test_a_paused_wait_keeps_its_quiet_time_before_the_pause_and_never_counts_the_pause() -> None:
    """The stall clock of a wait that a fetch loop paused (server-client: a fetch answered
    "not yet", nobody asks meanwhile) and resumed: real beats on a real progress page, the
    producer's state set by hand (no workers needed for the rule itself)."""
    with hk.ProgressWatch(60) as watch:
        p = object.__new__(hg.DistSamplingProducer)
        p._progress, p._paused_at, p._waiting_since = [watch], None, None
        p.pause_waiting()  # no wait open: nothing to pause
        assert p._paused_at is None
        t = time.monotonic()
        # no beat at all: 4 s quiet before the pause count, the 6 s pause does not
        p._waiting_since = t - 10
        p.pause_waiting()
        first = p._paused_at
        assert first is not None and first >= t
        p.pause_waiting()  # paused already: the first pause's time stays
        assert p._paused_at == first
        p._paused_at = t - 6
        assert p._resumed_wait(t) == pytest.approx(t - 4)
        # a beat before the pause: the quiet time runs from it to the pause (2 s)
        watch.heartbeat.beat()
        beat = watch.last_beat
        assert beat is not None
        p._waiting_since, p._paused_at = beat - 5, beat + 2
        assert p._resumed_wait(beat + 10) == pytest.approx(beat + 8)
        # a beat during the pause (a batch sent while nobody asked): the clock starts afresh
        p._waiting_since, p._paused_at = beat - 5, beat - 1
        assert p._resumed_wait(beat + 10) == beat + 10
        p._stop_waiting()  # a batch received: no wait, no pause
        assert p._waiting_since is None and p._paused_at is None
