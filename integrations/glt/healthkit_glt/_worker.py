"""The sampling worker: GLT's worker loop, cut into reusable steps, with a bounded init
barrier, the post-barrier RPC timeout narrowing and a teardown that always runs.

The steps are public so that a GiGL-like project can write its own worker loop (a custom
sampler hierarchy, extra set-up after the barrier) and still get every guarantee: call
:func:`init_sampling_worker`, build and start a sampler, call :func:`pass_init_barrier`,
run :func:`run_task_loop`, and call :func:`teardown_sampling_worker` in ``finally``.
:func:`default_worker_loop` is exactly that, and behaves like GLT 0.2.4's
``_sampling_worker_loop`` otherwise.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import queue
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

import attrs
from graphlearn_torch.channel import ChannelBase

from healthkit import (
    BarrierBrokenError,
    BoundedBarrier,
    Heartbeat,
    InvalidArgumentTypeError,
    record_exception,
)
from healthkit._shared import check_bound, check_int
from healthkit.lowlevel import die_with_parent, flush_logging
from healthkit_glt._adapter.producer import set_rpc_timeout, set_worker_signal_handlers

__all__ = [
    "SamplerFactory",
    "SamplingWorkerContext",
    "SerializedSendChannel",
    "WorkerLoop",
    "create_dist_sampler",
    "default_worker_loop",
    "init_sampling_worker",
    "narrow_rpc_timeout",
    "pass_init_barrier",
    "report_sampling_error",
    "run_task_loop",
    "start_sampler",
    "teardown_sampling_worker",
]

logger = logging.getLogger("healthkit.glt")


class SamplerFactory(Protocol):
    """Builds a worker's sampler (GiGL's ``create_dist_sampler`` shape).

    Called in the worker process, after ``init_rpc``, with keyword arguments. The result
    must offer GLT's ``DistNeighborSampler`` loop interface: ``start_loop()``,
    ``shutdown_loop()``, ``wait_all()`` and ``sample_from_nodes`` / ``sample_from_edges`` /
    ``subgraph``. It is pickled to the spawned workers: pass a module-level function or a
    ``functools.partial`` of one (e.g. with GiGL's ``sampler_options`` bound).
    """

    def __call__(
        self,
        *,
        data: Any,
        sampling_config: Any,
        worker_options: Any,
        channel: Any,
        current_device: Any,
    ) -> Any: ...


WorkerLoop = Callable[["SamplingWorkerContext"], None]
"""A worker's whole life. Pickled to the spawned worker (module-level function)."""


class _WrappedSendChannel(ChannelBase):  # type: ignore[misc]  # GLT has no types
    """A channel that wraps another's ``send()`` and forwards everything else to it."""

    def __init__(self, channel: Any) -> None:
        if not callable(getattr(channel, "send", None)):
            raise InvalidArgumentTypeError(
                f"channel must be a GLT channel (with send()), got {channel!r}", "channel"
            )
        self.channel = channel

    def recv(self, **kwargs: Any) -> Any:
        return self.channel.recv(**kwargs)

    def __getattr__(self, name: str) -> Any:
        try:
            channel = self.__dict__["channel"]
        except KeyError:
            raise AttributeError(name) from None
        return getattr(channel, name)


class SerializedSendChannel(_WrappedSendChannel):
    """A channel whose ``send()`` holds a lock shared by every sampling worker of a producer.

    Why: GLT 0.2.4's ``ShmChannel`` is not safe for concurrent writers. A writer claims a
    block id, waits for ring space, then takes the ring slot's write semaphore; that
    semaphore belongs to the slot, not to the block id, so a writer one lap ahead can take
    it first. The consumer then reads the wrong block, the block it waited for can never be
    released, and the consumer and every writer wait in ``sem_wait`` forever, all alive.
    With a capacity of 2 and two writers this stalls almost every run (see
    ``docs/benchmarks-glt.md``). One writer at a time cannot overtake itself. The lock is
    held for the copy into shared memory only; sampling still runs in parallel.

    Everything except ``send`` is forwarded to the wrapped channel.
    """

    def __init__(self, channel: Any, lock: Any) -> None:
        super().__init__(channel)
        if not (hasattr(lock, "__enter__") and hasattr(lock, "__exit__")):
            raise InvalidArgumentTypeError(
                f"lock must be a lock (multiprocessing's, shared with the other workers), got "
                f"{lock!r}",
                "lock",
            )
        self.lock = lock

    def send(self, msg: Any, **kwargs: Any) -> None:
        with self.lock:
            self.channel.send(msg, **kwargs)


class BeatingSendChannel(_WrappedSendChannel):
    """A channel whose every completed ``send()`` beats the worker's heartbeat: one sampled
    message handed to the loader is the progress the producer's stall watch waits for.

    Everything except ``send`` is forwarded to the wrapped channel.
    """

    def __init__(self, channel: Any, heartbeat: Heartbeat) -> None:
        super().__init__(channel)
        if not isinstance(heartbeat, Heartbeat):
            raise InvalidArgumentTypeError(
                f"heartbeat must be a healthkit.Heartbeat, got {heartbeat!r}", "heartbeat"
            )
        self.heartbeat = heartbeat

    def send(self, msg: Any, **kwargs: Any) -> None:
        self.channel.send(msg, **kwargs)
        self.heartbeat.beat()


def create_dist_sampler(
    *, data: Any, sampling_config: Any, worker_options: Any, channel: Any, current_device: Any
) -> Any:
    """The default factory: GLT's ``DistNeighborSampler``, built exactly as stock GLT does."""
    from graphlearn_torch.distributed.dist_neighbor_sampler import DistNeighborSampler

    c = sampling_config
    return DistNeighborSampler(
        data,
        c.num_neighbors,
        c.with_edge,
        c.with_neg,
        c.with_weight,
        c.edge_dir,
        c.collect_features,
        channel,
        worker_options.use_all2all,
        worker_options.worker_concurrency,
        current_device,
        seed=c.seed,
    )


@attrs.define
class SamplingWorkerContext:
    """Everything one sampling worker gets from its producer (one object, pickled once).

    ``rpc_init_timeout`` is the bring-up RPC timeout used by ``init_rpc`` (and the gloo
    group); ``steady_state_rpc_timeout`` is what :func:`pass_init_barrier` narrows to.
    ``sampler_factory`` builds the sampler; ``extra`` carries whatever a custom worker loop
    needs (it must pickle). ``send_lock`` (a lock from the producer's multiprocessing
    context, ``None`` with one worker) serialises the workers' sends: see
    :class:`SerializedSendChannel`.
    """

    rank: int
    data: Any
    sampler_input: Any
    unshuffled_index: Any
    sampling_config: Any
    worker_options: Any
    channel: Any
    task_queue: Any
    sampling_completed_worker_count: Any
    barrier: BoundedBarrier
    sampler_factory: SamplerFactory
    rpc_init_timeout: float
    steady_state_rpc_timeout: float
    extra: dict[str, Any] = attrs.field(factory=dict)
    send_lock: Any = None
    parent_pid: int | None = None
    reports: ErrorReports | None = None
    #: Beaten after each message sent, when the producer has a ``stall_timeout``.
    heartbeat: Heartbeat | None = None
    failed: threading.Event = attrs.field(factory=threading.Event, init=False, eq=False)

    def __getstate__(self) -> dict[str, Any]:
        state = {a.name: getattr(self, a.name) for a in attrs.fields(type(self)) if a.init}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)  # type: ignore[misc]


@attrs.define
class ErrorReports:
    """The producer's error channel: how a worker whose sampler raised tells the consumer.

    ``conn`` is the write end of one pipe shared by the workers (``lock`` serialises the
    writers), ``flag`` one shared byte set after a report is written, so the consumer sees it
    between two batches with a single memory read. Nothing is sent while nothing fails.
    """

    conn: Any
    lock: Any
    flag: Any


def _check_context(ctx: object) -> None:
    if not isinstance(ctx, SamplingWorkerContext):
        raise InvalidArgumentTypeError(
            f"ctx must be the SamplingWorkerContext the producer hands to the worker loop, "
            f"got {ctx!r}",
            "ctx",
        )


def _summary(e: BaseException) -> str:
    """The exception's first line (``IndexError: index 702 is out of bounds ...``)."""
    lines = "".join(traceback.format_exception_only(type(e), e)).strip().splitlines()
    return lines[0] if lines else type(e).__name__


def report_sampling_error(ctx: SamplingWorkerContext, text: str, summary: str = "") -> bool:
    """Send ``text`` (a traceback) to the consumer as this worker's sampling error;
    ``summary`` (one line, e.g. the exception's type and message) heads the consumer's error.

    Only the first error of a worker is sent; later ones are logged. The worker stops
    issuing samples (``ctx.failed`` is set) and waits for the producer's teardown. Returns
    whether it was sent. Safe from any thread (the sampler's event loop calls it).
    """
    _check_context(ctx)
    for what, value in (("text", text), ("summary", summary)):
        if not isinstance(value, str):
            raise InvalidArgumentTypeError(f"{what} must be a str, got {value!r}", what)
    first = not ctx.failed.is_set()
    ctx.failed.set()
    logger.error("sampling worker %d: sampling raised:\n%s", ctx.rank, text.rstrip())
    reports = ctx.reports
    if not first or reports is None:
        return False
    try:
        with reports.lock:
            reports.conn.send((ctx.rank, text, summary, time.time()))
        reports.flag[0] = 1
    except (OSError, ValueError):
        return False  # the producer is gone or closing: nobody to tell
    return True


def _guard_sampler(ctx: SamplingWorkerContext, sampler: Any) -> None:
    """Report what GLT's event loop would swallow.

    GLT's ``DistNeighborSampler`` (and any sampler built on its ``ConcurrentEventLoop``,
    e.g. GiGL's) runs each ``sample_from_*`` / ``subgraph`` as a coroutine through
    ``add_task``, whose done-callback logs an exception and drops it: the worker stays
    alive, no message is sent and the consumer would wait forever. The sampler's
    ``add_task`` is wrapped on the instance so the coroutine and its callback report first.
    """
    add_task = getattr(sampler, "add_task", None)
    if not callable(add_task):
        return

    async def reporting(coro: Coroutine[Any, Any, Any]) -> Any:
        try:
            return await coro
        except Exception as e:
            report_sampling_error(ctx, traceback.format_exc(), _summary(e))
            raise

    def guarded_add_task(coro: Any, callback: Any = None) -> Any:
        if callback is None:
            return add_task(reporting(coro))

        def reporting_callback(result: Any) -> Any:
            try:
                return callback(result)
            except Exception as e:
                report_sampling_error(ctx, traceback.format_exc(), _summary(e))
                raise

        return add_task(reporting(coro), reporting_callback)

    sampler.add_task = guarded_add_task


def init_sampling_worker(ctx: SamplingWorkerContext) -> None:
    """GLT's worker bring-up: worker group, optional gloo group, signal handlers, ``init_rpc``.

    ``init_rpc`` gets the *bring-up* timeout. GLT's ``init_rpc`` ends with a 1 s sleep and
    gathers every worker's info; a worker that loses the gather dies here, before the
    barrier, which the parent's BoundedBarrier turns into a diagnosed failure.
    """
    _check_context(ctx)
    import torch
    from graphlearn_torch.distributed import init_rpc, init_worker_group
    from graphlearn_torch.utils import ensure_device

    opts = ctx.worker_options
    init_worker_group(
        world_size=opts.worker_world_size,
        rank=opts.worker_ranks[ctx.rank],
        group_name="_sampling_worker_subprocess",
    )
    if opts.use_all2all:
        torch.distributed.init_process_group(
            backend="gloo",
            timeout=datetime.timedelta(seconds=ctx.rpc_init_timeout),
            rank=opts.worker_ranks[ctx.rank],
            world_size=opts.worker_world_size,
            init_method=f"tcp://{opts.master_addr}:{opts.master_port}",
        )
    num_rpc_threads = (
        min(ctx.data.num_partitions, 16) if opts.num_rpc_threads is None else opts.num_rpc_threads
    )
    ensure_device(opts.worker_devices[ctx.rank])
    # torch's DataLoader worker handlers: a SIGTERM from the parent makes the worker exit 0.
    set_worker_signal_handlers()
    torch.set_num_threads(num_rpc_threads + 1)
    init_rpc(
        master_addr=opts.master_addr,
        master_port=opts.master_port,
        num_rpc_threads=num_rpc_threads,
        rpc_timeout=ctx.rpc_init_timeout,
    )


def start_sampler(ctx: SamplingWorkerContext) -> Any:
    """Seed like stock GLT, build the sampler with the context's factory, start its loop.

    The factory gets the channel wrapped in :class:`SerializedSendChannel` when the context
    has a ``send_lock`` (more than one worker), and in :class:`BeatingSendChannel` when it has
    a ``heartbeat`` (the producer watches for stalls).
    """
    _check_context(ctx)
    from graphlearn_torch.utils import seed_everything

    if ctx.sampling_config.seed is not None:
        seed_everything(ctx.sampling_config.seed)
    channel = ctx.channel
    if ctx.send_lock is not None:
        channel = SerializedSendChannel(channel, ctx.send_lock)
    if ctx.heartbeat is not None:
        channel = BeatingSendChannel(channel, ctx.heartbeat)
    sampler = ctx.sampler_factory(
        data=ctx.data,
        sampling_config=ctx.sampling_config,
        worker_options=ctx.worker_options,
        channel=channel,
        current_device=ctx.worker_options.worker_devices[ctx.rank],
    )
    _guard_sampler(ctx, sampler)
    sampler.start_loop()
    return sampler


def narrow_rpc_timeout(rank: int, bringup: float, steady: float) -> float:
    """Set this worker's default RPC request timeout to ``steady``; return the value read back.

    Why right after the barrier: before it, every worker may still be waiting for slow
    peers, and the generous bring-up value keeps that from failing; after it, the same value
    would let a stuck sampling RPC hide for minutes. A no-op when the two are equal. The new
    default applies to RPCs issued afterwards by this process's agent (torch's
    ``_set_rpc_timeout`` is the only setter; ``get_rpc_timeout`` reads it back).
    """
    check_int(rank, "rank", minimum=0)
    check_bound(bringup, "bringup")
    check_bound(steady, "steady")
    from torch.distributed import rpc

    get_timeout = rpc.get_rpc_timeout  # type: ignore[attr-defined,unused-ignore]
    if steady == bringup:
        logger.debug("sampling worker %d: RPC timeout stays %gs (bring-up == steady)", rank, steady)
        return float(get_timeout())
    set_rpc_timeout(float(steady))
    now = float(get_timeout())
    logger.info(
        "sampling worker %d past the init barrier; RPC request timeout narrowed from %gs "
        "(bring-up) to %gs (steady state)",
        rank,
        bringup,
        now,
    )
    return now


def pass_init_barrier(ctx: SamplingWorkerContext) -> float:
    """Wait at the producer's BoundedBarrier, then narrow the RPC timeout.

    Raises :class:`healthkit.BarrierBrokenError` when the parent gave up (a peer died, the
    bound passed) or died; let it reach your ``finally`` so the teardown runs. Returns the
    RPC timeout now in force.
    """
    _check_context(ctx)
    ctx.barrier.worker_wait(ctx.rank)
    return narrow_rpc_timeout(ctx.rank, ctx.rpc_init_timeout, ctx.steady_state_rpc_timeout)


def run_task_loop(ctx: SamplingWorkerContext, sampler: Any) -> None:
    """GLT's command loop: ``SAMPLE_ALL`` one epoch's seeds, until ``STOP``.

    A sampling call that raises (here, or in the sampler's event loop: see
    :func:`start_sampler`) is reported to the consumer with :func:`report_sampling_error`;
    the worker then issues no more samples and waits for ``STOP`` or the producer's SIGTERM.
    """
    _check_context(ctx)
    from graphlearn_torch.distributed.dist_sampling_producer import (
        MP_STATUS_CHECK_INTERVAL,
        MpCommand,
    )
    from graphlearn_torch.sampler import SamplingType
    from torch.utils.data.dataloader import DataLoader

    cfg = ctx.sampling_config
    unshuffled = (
        DataLoader(
            ctx.unshuffled_index,
            batch_size=cfg.batch_size,
            shuffle=False,
            drop_last=cfg.drop_last,
        )
        if ctx.unshuffled_index is not None
        else None
    )
    sample = {
        SamplingType.NODE: sampler.sample_from_nodes,
        SamplingType.LINK: sampler.sample_from_edges,
        SamplingType.SUBGRAPH: sampler.subgraph,
    }[cfg.sampling_type]
    while True:
        try:
            command, args = ctx.task_queue.get(timeout=MP_STATUS_CHECK_INTERVAL)
        except queue.Empty:
            continue
        if command == MpCommand.STOP:
            return
        if command != MpCommand.SAMPLE_ALL:
            raise RuntimeError(f"unknown command {command!r}")
        if args is None:
            if unshuffled is None:
                raise RuntimeError("SAMPLE_ALL without seeds needs an unshuffled index")
            loader: Any = unshuffled
        else:
            loader = DataLoader(
                args, batch_size=cfg.batch_size, shuffle=False, drop_last=cfg.drop_last
            )
        if ctx.failed.is_set():
            continue  # reported: the producer is tearing down
        try:
            for index in loader:
                if ctx.failed.is_set():
                    break
                sample(ctx.sampler_input[index])
            sampler.wait_all()
        except Exception as e:
            report_sampling_error(ctx, traceback.format_exc(), _summary(e))
        if ctx.failed.is_set():
            continue
        with ctx.sampling_completed_worker_count.get_lock():
            ctx.sampling_completed_worker_count.value += 1  # non-atomic: the lock is needed


def teardown_sampling_worker(sampler: Any) -> None:
    """Stop the sampler's event loop and the RPC agent. Safe after a partial bring-up."""
    from graphlearn_torch.distributed import shutdown_rpc

    try:
        if sampler is not None:
            sampler.shutdown_loop()
    finally:
        shutdown_rpc(graceful=False)


def default_worker_loop(ctx: SamplingWorkerContext) -> None:
    """GLT's worker life with the healthkit guarantees (see the module docstring).

    An exception before the init barrier passed (a sampler factory that raises, a failed
    ``init_rpc``) ends the worker at once, exit code 1, with its exception recorded for the
    parent (:func:`healthkit.record_exception`): an orderly RPC shutdown first would delay
    the parent's report by seconds, and let a peer die of the broken connection first and
    be reported as the cause.

    A KeyboardInterrupt (a Ctrl-C reaches the whole foreground group) prints nothing: the
    trainer reports it itself. After the teardown the worker ends by SIGINT, as an
    interpreter does for an uncaught one, so its exit status says what ended it: the trainer
    reads a group's Ctrl-C as a stop, and a SIGINT sent to this worker alone as a failure
    naming SIGINT (not "exited cleanly").
    """
    _check_context(ctx)
    sampler = None
    passed = False
    interrupted = False
    try:
        init_sampling_worker(ctx)
        sampler = start_sampler(ctx)
        pass_init_barrier(ctx)
        passed = True
        run_task_loop(ctx, sampler)
    except BarrierBrokenError as e:
        # The parent already reports the failure (with this worker's state); exiting
        # through finally is the orderly part, so no traceback here.
        logger.info("sampling worker %d: %s; tearing down", ctx.rank, e)
    except KeyboardInterrupt:
        interrupted = True  # the main process raises KeyboardInterrupt itself
    except BaseException as e:
        if not passed:
            _exit_now(e)
        raise
    finally:
        teardown_sampling_worker(sampler)
    if interrupted:
        _end_by_sigint()


def _end_by_sigint() -> None:
    """End this process by SIGINT's default action (exit status: killed by SIGINT)."""
    flush_logging(logger)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    os.kill(os.getpid(), signal.SIGINT)
    os._exit(128 + signal.SIGINT)  # not reached: the signal ends the process first


def _exit_now(e: BaseException) -> None:
    """Record ``e`` for the parent's diagnosis, print it, and exit 1 now (no teardown)."""
    with contextlib.suppress(BaseException), record_exception(stacks=False):
        raise e
    traceback.print_exception(type(e), e, e.__traceback__)
    flush_logging(logger)
    os._exit(1)


def _worker_entry(worker_loop: WorkerLoop, ctx: SamplingWorkerContext) -> None:
    """The spawned process's target: die with the trainer, stack dumps on, run the loop with
    its exception recorded for the parent (:func:`healthkit.record_exception`): the
    producer's diagnosis of the worker then names it, as any helper's (an exit code alone
    says "1", not "what raised").

    Why the parent-death signal first: nothing else tells a worker that its trainer was
    SIGKILLed (OOM). Past the barrier it waits for commands or sits in ``send()`` forever,
    reparented to init, holding memory and the ring; the kernel's SIGKILL ends it instead.
    """
    if ctx.parent_pid is not None:
        die_with_parent(ctx.parent_pid)
    ctx.barrier.enable_stack_dumps()
    if ctx.heartbeat is not None:
        # Which process beats, and its barrier stack dumps answered by a dumper thread: a
        # stall report reads them without interrupting the worker.
        ctx.heartbeat.attach()
    # stacks=False: the barrier's own stack dumps answer (enabled above).
    with record_exception(stacks=False):
        worker_loop(ctx)
