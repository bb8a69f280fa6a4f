"""DistSamplingProducer: GLT's multiprocessing sampling producer that fails instead of hanging.

Three places where stock GLT 0.2.4 waits forever, and what this producer does instead:

- ``init()``: ``barrier.wait()`` with no bound; a worker that dies during bring-up leaves the
  parent there forever. Here the rendezvous is a :class:`healthkit.BoundedBarrier` bounded
  by ``k x`` the bring-up RPC timeout, which fails within milliseconds of a death and at the
  bound when a worker is merely stuck (with its stack), then tears the workers down.
- the epoch: ``ShmChannel.recv()`` with no bound; a worker that dies mid-epoch leaves the
  consumer there forever, and ``recv(timeout_ms)`` does not help when the dead worker had
  already claimed a ring block (an unbounded ``sem_wait`` in C++ that no signal can end).
  Here :meth:`DistSamplingProducer.recv` calls the C++ receive only once the next block is
  written, and otherwise waits on every worker's exit fd (pidfd), so a death ends the wait
  within milliseconds and raises :class:`SamplingWorkerDiedError` with a diagnosis
  (:mod:`healthkit_glt._receive` has how, and the fallback for other channels).
- a sampling error in a live worker: GLT's event loop logs the coroutine's exception and
  drops it; the worker lives on, its batch never comes, and ``recv()`` waits forever. Here
  the worker reports it on the producer's error pipe and :meth:`DistSamplingProducer.recv`
  raises :class:`SamplingError` (rank, traceback) within milliseconds.
- ``shutdown()``: sequential 5 s joins per worker, a ``terminate()`` without a join (zombies,
  exit code ``None``), and a flag set only after the work. Here it is idempotent (flag
  first), bounded (STOP, a joint join, terminate, kill), and stops watching before it tears
  down, so workers that exit 0 on our SIGTERM (torch's handlers) are never reported.

And where stock GLT leaks: workers whose trainer was SIGKILLed live on (reparented to init);
here each worker gets the kernel's parent-death signal. The channel's SysV segment outlives
a SIGKILLed trainer and stays attached after ``shutdown()`` until the loader is collected;
here it is marked for removal as soon as the workers are started and released by the
teardown (:class:`healthkit_glt._adapter.ring.RingSegment`).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import multiprocessing
import multiprocessing.connection
import os
import queue
import time
import weakref
from collections.abc import Mapping, Sequence
from multiprocessing.process import BaseProcess
from typing import Any

from graphlearn_torch.channel import ChannelBase, QueueTimeoutError
from graphlearn_torch.distributed import DistMpSamplingProducer
from graphlearn_torch.distributed.dist_sampling_producer import MpCommand
from graphlearn_torch.utils import seed_everything

from healthkit import (
    BarrierBrokenError,
    BoundedBarrier,
    Diagnosis,
    ExitDiagnoser,
    HealthkitError,
    InvalidArgumentTypeError,
    ProcessDiedError,
    ProcessWatch,
    ProgressWatch,
    UsageError,
    stop,
)
from healthkit._shared import (
    at_exit,
    check_bool,
    check_bound,
    check_callable,
    check_int,
    check_seconds,
    check_timeout,
)
from healthkit.lowlevel import (
    MAX_TIMEOUT_S,
    Decision,
    EndingClassifier,
    decide_stall,
    publish_job_failure,
)
from healthkit.lowlevel import Verdict as Verdict
from healthkit_glt._adapter.producer import seeds_indexes
from healthkit_glt._adapter.ring import RingSegment
from healthkit_glt._config import (
    DEFAULT_INIT_TIMEOUT_MULTIPLIER,
    TimeoutPlan,
    resolve_timeouts,
)
from healthkit_glt._receive import (
    ErrorReported,
    Receiver,
    ReceiverMode,
    check_receiver_mode,
    open_receiver,
)
from healthkit_glt._worker import (
    ErrorReports,
    SamplerFactory,
    SamplingWorkerContext,
    WorkerLoop,
    _worker_entry,
    create_dist_sampler,
    default_worker_loop,
)

__all__ = [
    "DistSamplingProducer",
    "SamplingError",
    "SamplingStalledError",
    "SamplingStoppedError",
    "SamplingWorkerDiedError",
]

logger = logging.getLogger("healthkit.glt")

INIT_ABORT_GRACE_S = 0.05


class SamplingWorkerDiedError(ProcessDiedError):
    """A sampling worker died after the init barrier (mid-epoch or between epochs).

    ``diagnosis`` is the first dead worker's; ``diagnoses`` has every dead worker's;
    ``rank`` is the first dead worker's rank. The producer is torn down when this is raised.
    """

    def __init__(
        self, message: str, diagnosis: Diagnosis, *, rank: int, diagnoses: tuple[Diagnosis, ...]
    ) -> None:
        super().__init__(message, diagnosis)
        self.rank = rank
        self.diagnoses = diagnoses


class SamplingStoppedError(HealthkitError, RuntimeError):
    """The sampling workers ended while this process was being stopped (a launcher's SIGTERM
    to the process group, torchrun's; Ctrl-C): their share of the stop, not a failure.

    The loader cannot go on without them, so ``recv()`` raises this instead of a batch; it
    is not published to the job and not logged as an error. ``ranks`` are the ended
    workers', ``reasons`` why the firing rule excused each (the stop signal, how long ago).
    The producer is torn down when this is raised. A stop is an episode: if this process
    is still running once its grace is over (or said it carries on:
    ``healthkit.lowlevel.note_stop_survived()``), a later use of the producer raises the
    deaths as :class:`SamplingWorkerDiedError` after all.
    """

    def __init__(self, message: str, *, ranks: tuple[int, ...], reasons: tuple[str, ...]) -> None:
        super().__init__(message)
        self.ranks = ranks
        self.reasons = reasons


class SamplingError(HealthkitError, RuntimeError):
    """A sampling worker's sampler raised (a bad seed index, a feature lookup error, an RPC
    error to a peer's partition) while the worker stayed alive.

    ``rank`` and ``pid`` are the worker's, ``worker_traceback`` the traceback text from the
    worker, ``raised_at`` the worker's ``time.time()`` at the report. The producer is torn
    down when this is raised: the epoch cannot complete without that worker's batches.
    """

    def __init__(
        self,
        message: str,
        *,
        rank: int,
        worker_traceback: str,
        raised_at: float,
        pid: int | None = None,
    ) -> None:
        super().__init__(message)
        self.rank = rank
        self.pid = pid
        self.worker_traceback = worker_traceback
        self.raised_at = raised_at


def drop_frames(e: BaseException) -> None:
    """Detach the tracebacks, and so the frames, of ``e`` and of the exceptions chained to
    it (``__cause__``, ``__context__``): for an exception kept (or chained) after its frames
    are of no use, whose frames would otherwise keep their locals alive in a cycle."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [e]
    while todo:
        x = todo.pop()
        if x is None or id(x) in seen:
            continue
        seen.add(id(x))
        x.__traceback__ = None
        todo += [x.__cause__, x.__context__]


class SamplingStalledError(HealthkitError, TimeoutError):
    """Every sampling worker is alive, but none sent a batch for ``stall_timeout`` seconds
    while the loader waited for one (a deadlock, a read that never returns, a peer's RPC
    that never answers).

    ``stalled_for`` is how long the loader waited with no batch; ``diagnoses`` has each live
    worker's state (what it is blocked on), beats and Python stacks, as a
    :class:`healthkit.Diagnosis` with cause ``STALLED``; ``ranks`` their ranks, in order.
    The producer is torn down when this is raised.
    """

    def __init__(
        self,
        message: str,
        *,
        stalled_for: float,
        ranks: tuple[int, ...],
        diagnoses: tuple[Diagnosis, ...],
    ) -> None:
        super().__init__(message)
        self.stalled_for = stalled_for
        self.ranks = ranks
        self.diagnoses = diagnoses


Failure = SamplingWorkerDiedError | SamplingError | SamplingStalledError | SamplingStoppedError


def _raised(d: Diagnosis | None) -> bool:
    """Did the worker end of an exception of its own (its record names it)? An interrupt
    is a stop, not a cause."""
    return d is not None and d.exception is not None and d.exception.type != "KeyboardInterrupt"


def _worker_exceptions(dead: Sequence[tuple[int, Diagnosis | None]]) -> str:
    """Each dead worker's own exception, as its record tells it (its diagnosis names the
    record): the last frames and the exception, as a traceback ends. The full traceback is
    in the record and in the worker's stderr."""
    parts = []
    for rank, d in dead:
        if d is None or not _raised(d):
            continue
        exc = d.exception
        assert exc is not None
        where = f" (in {exc.context})" if exc.context else ""
        parts.append(f"--- sampling worker {rank} raised ---{where}")
        parts.append(f"Traceback (last frames; the full one: {exc.path}, and the worker's stderr):")
        for frame in exc.frames:
            first, *source = frame.splitlines() or [""]
            parts.append(f"  {first.strip()}")
            parts += [f"    {line.strip()}" for line in source]
        parts.append(exc.summary)
    return "\n".join(parts)


_live_producers: weakref.WeakSet[DistSamplingProducer] = weakref.WeakSet()


def _shutdown_live_producers() -> None:
    """At interpreter exit: give live workers a clean STOP before multiprocessing's own exit
    hook SIGTERMs daemon children (the core's exit sequence runs its "atexit" phase first)."""
    for producer in list(_live_producers):
        with contextlib.suppress(Exception):
            producer.shutdown()


def _check_arguments(
    *,
    sampler_factory: object = create_dist_sampler,
    worker_loop: object = default_worker_loop,
    rpc_init_timeout: object = None,
    steady_state_rpc_timeout: object = None,
    init_timeout_multiplier: object = DEFAULT_INIT_TIMEOUT_MULTIPLIER,
    grace: object = 10.0,
    kill_after: object = 5.0,
    init_failure_grace: object = 2.0,
    receiver: object = "auto",
    recv_poll_ms: object = 500,
    worker_extra: object = None,
    strict_env: object = False,
    stall_timeout: object = None,
) -> tuple[float, float, float]:
    """The producer's own keyword arguments, checked (the shutdown bounds returned)."""
    grace_s = check_seconds(grace, "grace")
    kill_s = check_seconds(kill_after, "kill_after")
    init_failure_s = check_seconds(init_failure_grace, "init_failure_grace")
    check_callable(sampler_factory, "sampler_factory")
    check_callable(worker_loop, "worker_loop")
    for what, value in (
        ("rpc_init_timeout", rpc_init_timeout),
        ("steady_state_rpc_timeout", steady_state_rpc_timeout),
    ):
        if value is not None:
            check_bound(value, what)  # type: ignore[arg-type]
    check_bound(init_timeout_multiplier, "init_timeout_multiplier")  # type: ignore[arg-type]
    check_receiver_mode(receiver)  # type: ignore[arg-type]
    check_int(recv_poll_ms, "recv_poll_ms", minimum=1, maximum=MAX_TIMEOUT_S * 1000)
    if worker_extra is not None and not isinstance(worker_extra, dict):
        raise InvalidArgumentTypeError(
            f"worker_extra must be a dict or None, got {worker_extra!r}", "worker_extra"
        )
    check_bool(strict_env, "strict_env")
    if stall_timeout is not None:
        check_timeout(stall_timeout, "stall_timeout", positive=True, minimum=0.05)  # type: ignore[arg-type]
    return grace_s, kill_s, init_failure_s


def check_producer_kwargs(kwargs: object, producer_cls: object = None) -> None:
    """Refuse, where they are given, producer arguments that the producer would refuse
    later (on a server in server-client mode, or when the loader builds it): an unknown
    name, or a bad value of one of :class:`DistSamplingProducer`'s own arguments."""
    cls = DistSamplingProducer if producer_cls is None else producer_cls
    if not isinstance(cls, type):
        raise InvalidArgumentTypeError(
            f"producer_cls must be a class (a DistSamplingProducer subclass), got {cls!r}",
            "producer_cls",
        )
    if not isinstance(kwargs, Mapping):
        raise InvalidArgumentTypeError(
            f"producer_kwargs must be a dict of producer arguments, got {kwargs!r}",
            "producer_kwargs",
        )
    params = inspect.signature(cls).parameters.values()  # the constructor's, without self
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        known = sorted(p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY)
        for name in kwargs:
            if name not in known:
                raise InvalidArgumentTypeError(
                    f"{name}= is not an argument of {cls.__name__}; its keyword arguments are "
                    f"{', '.join(known)}",
                    str(name),
                )
    if issubclass(cls, DistSamplingProducer):
        own = inspect.signature(_check_arguments).parameters
        _check_arguments(**{k: v for k, v in kwargs.items() if k in own})


class DistSamplingProducer(DistMpSamplingProducer):  # type: ignore[misc]
    """GLT's ``DistMpSamplingProducer`` with bounded init, fail-fast steady state and a
    bounded shutdown; the sampler factory and the worker loop are pluggable (GiGL's hook).

    The first five arguments are GLT's. The rest (keyword-only):

    - ``sampler_factory``: builds each worker's sampler (default: GLT's
      ``DistNeighborSampler``, as stock). GiGL passes its ``create_dist_sampler`` here.
    - ``worker_loop``: a worker's whole life (default :func:`default_worker_loop`).
    - ``rpc_init_timeout``: bring-up RPC timeout, seconds (default
      ``$HEALTHKIT_GLT_RPC_INIT_TIMEOUT_SECONDS`` or 600).
    - ``steady_state_rpc_timeout``: set right after the barrier (default
      ``$HEALTHKIT_GLT_STEADY_STATE_RPC_TIMEOUT_SECONDS`` or ``worker_options.rpc_timeout``).
    - ``init_timeout_multiplier``: ``k``; the init barrier's bound is ``k x rpc_init_timeout``
      (default 3, as GiGL).
    - ``grace`` / ``kill_after``: shutdown's bounds: STOP then wait up to ``grace``; then
      SIGTERM and wait up to ``kill_after``; then SIGKILL (and up to ``kill_after`` more for
      the kernel to end them), as :func:`healthkit.stop` names them.
    - ``receiver``: how ``recv()`` waits (see :mod:`healthkit_glt._receive`): ``"auto"``
      (default) reads GLT's ShmChannel ring directly and falls back, with a warning, to a
      helper thread for other channels; ``"ring"`` requires the ring (raises
      :class:`healthkit_glt.RingLayoutError` at ``init()`` otherwise); ``"thread"`` always
      uses the thread.
    - ``recv_poll_ms``: how often the helper thread (``receiver="thread"`` or the fallback)
      checks for a stop while the channel is empty (not a failure timeout: a slow epoch is
      never failed for being slow).
    - ``worker_extra``: a picklable dict handed to custom worker loops as ``ctx.extra``.
    - ``stall_timeout``: fail ``recv()`` with :class:`SamplingStalledError` (each live
      worker's state and stacks) when no batch came for this many seconds while the loader
      waited, every worker alive (default ``None``: a stall is only logged, once, after the
      steady-state RPC timeout). Each worker beats a :class:`healthkit.Heartbeat` per batch
      sent; time the loader spends elsewhere (training) is never counted.
    - ``strict_env``: reject bad env values (:class:`healthkit.InvalidArgumentError`)
      instead of warning and using the default.
    """

    def __init__(
        self,
        data: Any,
        sampler_input: Any,
        sampling_config: Any,
        worker_options: Any,
        output_channel: ChannelBase,
        *,
        sampler_factory: SamplerFactory = create_dist_sampler,
        worker_loop: WorkerLoop = default_worker_loop,
        rpc_init_timeout: float | None = None,
        steady_state_rpc_timeout: float | None = None,
        init_timeout_multiplier: float = DEFAULT_INIT_TIMEOUT_MULTIPLIER,
        grace: float = 10.0,
        kill_after: float = 5.0,
        init_failure_grace: float = 2.0,
        receiver: ReceiverMode = "auto",
        recv_poll_ms: int = 500,
        worker_extra: dict[str, Any] | None = None,
        strict_env: bool = False,
        stall_timeout: float | None = None,
    ) -> None:
        # Every argument is checked before anything starts: a bad one fails here, naming
        # itself, not inside shutdown() or a worker.
        grace_s, kill_s, init_failure_s = _check_arguments(
            sampler_factory=sampler_factory,
            worker_loop=worker_loop,
            rpc_init_timeout=rpc_init_timeout,
            steady_state_rpc_timeout=steady_state_rpc_timeout,
            init_timeout_multiplier=init_timeout_multiplier,
            grace=grace,
            kill_after=kill_after,
            init_failure_grace=init_failure_grace,
            receiver=receiver,
            recv_poll_ms=recv_poll_ms,
            worker_extra=worker_extra,
            strict_env=strict_env,
            stall_timeout=stall_timeout,
        )
        # Everything shutdown() reads exists before anything can fail, so shutdown() (and
        # a loader's __del__) is safe on a producer whose construction or init() failed.
        self._shutdown = False
        self._workers: list[BaseProcess] = []
        self._task_queues: list[Any] = []
        self._receiver: Receiver | None = None
        self._init_barrier: BoundedBarrier | None = None
        self._failure: Failure | None = None
        # The firing rule asked about each dead worker (built at init(), in the thread that
        # builds the loader); the deaths a stop excused, decided again on a later use.
        self._endings: EndingClassifier | None = None
        self._excused: list[tuple[int, ProcessWatch]] = []
        self._reports_r: Any = None
        self._report_flag: Any = None
        self._segment: RingSegment | None = None
        self._diagnoser: ExitDiagnoser | None = None
        self._batches_received = 0  # since the last produce_all(), for the error message
        self._last_batch_at = time.monotonic()  # or the epoch's start: when the stall began
        self._stall_reported = False  # its stacks are logged once per stall
        self.stall_timeout: float | None = (
            None if stall_timeout is None else float(stall_timeout)
        )
        self._progress: list[ProgressWatch] = []  # one per worker, with stall_timeout
        self._waiting_since: float | None = None  # the loader waits for a batch since
        self._paused_at: float | None = None  # nobody asks since (see pause_waiting)
        super().__init__(data, sampler_input, sampling_config, worker_options, output_channel)
        self.timeouts: TimeoutPlan = resolve_timeouts(
            rpc_init_timeout=rpc_init_timeout,
            steady_state_rpc_timeout=steady_state_rpc_timeout,
            init_timeout_multiplier=init_timeout_multiplier,
            options_rpc_timeout=worker_options.rpc_timeout,
            strict_env=strict_env,
        )
        self._ctx = multiprocessing.get_context("spawn")
        # GLT makes this in the *default* context; handed to spawned workers it fails with
        # a SemLock error unless the user forced "spawn" globally. Ours needs no such step.
        self.sampling_completed_worker_count = self._ctx.Value("I", lock=True)
        self.sampler_factory = sampler_factory
        self.worker_loop = worker_loop
        self.grace = grace_s
        self.kill_after = kill_s
        self.init_failure_grace = init_failure_s
        self.receiver: ReceiverMode = receiver
        self.recv_poll_ms = recv_poll_ms
        self.worker_extra = dict(worker_extra or {})

    # ------------------------------------------------------------------ init
    def init(self) -> None:
        """Spawn the workers and wait for them at a BoundedBarrier.

        Raises :class:`healthkit.BarrierBrokenError` when a worker died first (with its
        diagnosis and, if it raised, its traceback), or :class:`healthkit.BarrierTimeoutError`
        when the bound passed with every worker alive (with the stuck workers' stacks). In
        both cases every worker is gone when it raises.
        """
        try:
            self._spawn_and_wait()
        except BarrierBrokenError as e:
            err = self._with_worker_exceptions(e)
            self._cleanup_files()
            # The barrier's error holds the frames it was raised through (the barrier's
            # wait, which holds the error and this producer's teardown), and ``err`` this
            # frame: reference cycles that kept a failed producer, its semaphores and fds,
            # until the cyclic GC ran. The message says it all; those frames go.
            drop_frames(e)
            try:
                raise err from None
            finally:
                del err
        except BaseException:
            self.shutdown()
            raise
        self._receiver = open_receiver(
            self.output_channel, self._workers, mode=self.receiver, poll_ms=self.recv_poll_ms,
            reports=self._reports_r, report_flag=self._report_flag,
        )  # fmt: skip
        _live_producers.add(self)
        at_exit("atexit", "healthkit_glt: live producers shut down", _shutdown_live_producers)

    def _spawn_and_wait(self) -> None:
        if self.sampling_config.seed is not None:
            seed_everything(self.sampling_config.seed)
        if not self.sampling_config.shuffle:
            unshuffled: list[Any] = seeds_indexes(self)
        else:
            unshuffled = [None] * self.num_workers
        plan = self.timeouts
        self._init_barrier = bb = BoundedBarrier(
            self.num_workers,
            timeout=plan.init_bound,
            hint=plan.init_hint,
            ctx=self._ctx,
            name="GLT sampling worker init barrier",
            worker_label="sampling worker",
            # A worker that arrived and then died is reported after this grace (it might
            # have passed just before dying): the 1 s default would delay that report.
            abort_grace=INIT_ABORT_GRACE_S,
        )
        if self._endings is None:
            self._endings = EndingClassifier("sampling workers", log=logger)
        # Before the first worker exists, as BoundedBarrier's own: the cgroup OOM counter's
        # baseline and the kernel-log position predate any worker's death, so an OOM kill
        # of a worker is confirmed, at init and mid-epoch alike.
        self._diagnoser = ExitDiagnoser()
        # Marked for removal before the workers attach: gone with its last attacher, even
        # when the trainer is SIGKILLed (see RingSegment).
        self._segment = RingSegment.adopt(
            self.output_channel, pinned=bool(getattr(self.worker_options, "pin_memory", False))
        )
        self._reports_r, reports_w = self._ctx.Pipe(duplex=False)
        self._report_flag = self._ctx.RawArray("b", 1)
        reports = ErrorReports(reports_w, self._ctx.Lock(), self._report_flag)
        # GLT's ShmChannel stalls with concurrent writers (see SerializedSendChannel).
        send_lock = self._ctx.Lock() if self.num_workers > 1 else None
        if self.stall_timeout is not None:
            self._progress = [
                ProgressWatch(self.stall_timeout, name=f"sampling worker {rank}", who="the loader")
                for rank in range(self.num_workers)
            ]
        for rank in range(self.num_workers):
            task_queue = self._ctx.Queue(self.num_workers * self.worker_options.worker_concurrency)
            self._task_queues.append(task_queue)
            wctx = SamplingWorkerContext(
                rank=rank,
                data=self.data,
                sampler_input=self.sampler_input,
                unshuffled_index=unshuffled[rank],
                sampling_config=self.sampling_config,
                worker_options=self.worker_options,
                channel=self.output_channel,
                task_queue=task_queue,
                sampling_completed_worker_count=self.sampling_completed_worker_count,
                barrier=bb,
                sampler_factory=self.sampler_factory,
                rpc_init_timeout=plan.rpc_init_timeout,
                steady_state_rpc_timeout=plan.steady_state_rpc_timeout,
                extra=self.worker_extra,
                send_lock=send_lock,
                parent_pid=os.getpid(),
                reports=reports,
                heartbeat=self._progress[rank].heartbeat if self._progress else None,
            )
            w = self._ctx.Process(
                target=_worker_entry,
                args=(self.worker_loop, wctx),
                name=f"sampling worker {rank}",
                daemon=True,
            )
            w.start()
            self._workers.append(w)
        reports_w.close()  # each worker has its own copy now
        logger.debug("waiting for %d sampling workers: %s", self.num_workers, plan.describe())
        bb.wait(
            self._workers, on_failure=self._teardown_after_init_failure, diagnoser=self._diagnoser
        )

    def _teardown_after_init_failure(self, error: BarrierBrokenError) -> None:
        # The barrier diagnosed every worker before calling this, so the exit 0 that torch's
        # SIGTERM handler gives our terminated workers cannot be mistaken for anything.
        # Workers that arrived leave by themselves through the broken barrier (and tear
        # down their RPC agent): they get a grace. Workers that never arrived are stuck in
        # bring-up (e.g. the RPC rendezvous, 30 min by default): SIGTERM them at once.
        stuck = {p.rank for p in error.parties if p.state == "not arrived"}
        for rank in sorted(stuck):
            with contextlib.suppress(Exception):
                self._workers[rank].terminate()
        self._shutdown = True
        self._teardown(grace=self.init_failure_grace, send_stop=False, cleanup=False)

    def _with_worker_exceptions(self, e: BarrierBrokenError) -> BarrierBrokenError:
        """The same error, headed by the worker that raised (if one did), plus the exception
        of every dead worker that raised, as its record tells it.

        Why a new first line: when one worker raises, its peers can die of the broken RPC
        connection within milliseconds of it, and the first death observed is not always
        the cause. A worker that left an exception record is the one that raised.
        """
        dead = [(r.rank, r.diagnosis) for r in e.dead]
        raisers = [(rank, d) for rank, d in dead if _raised(d)]
        if not raisers:
            return e
        rank, d = raisers[0]
        assert d is not None and d.exception is not None
        head = f"sampling worker {rank} raised during init: {d.exception.summary}\n"
        return type(e)(
            f"{head}{e}\n{_worker_exceptions(dead)}",
            barrier_name=e.barrier_name,
            elapsed=e.elapsed,
            bound=e.bound,
            parties=e.parties,
        )

    def _use_endings(self, endings: EndingClassifier) -> None:
        """Judge the workers' deaths with ``endings`` (built in this process's main thread,
        which is where noticing its stop signals can start) instead of one built by
        ``init()``. For producers built off the main thread, e.g. by a server's RPC threads."""
        if not isinstance(endings, EndingClassifier):
            raise InvalidArgumentTypeError(
                f"endings must be a healthkit.lowlevel.EndingClassifier, got {endings!r}",
                "endings",
            )
        self._endings = endings

    # ------------------------------------------------------------------ steady state
    def produce_all(self) -> None:
        """Start an epoch (GLT's, after checking that no worker died since the last one)."""
        if self._failure is not None:
            raise self._failed()
        self._batches_received = 0
        self._last_batch_at, self._stall_reported = time.monotonic(), False
        self._stop_waiting()
        super().produce_all()

    def recv(self, timeout_ms: int | None = None) -> Any:
        """The next sample message, or :class:`SamplingWorkerDiedError` within milliseconds
        of a worker's death (never a hang on a dead worker). An alive-but-slow producer is
        waited for, however long it takes: slowness is not a failure.

        ``timeout_ms`` (as ``ShmChannel.recv``'s): raise GLT's ``QueueTimeoutError`` when no
        message came within it, for a fetch loop that also watches something else (an
        epoch-done flag, a stop request). ``None`` or 0 waits as long as it takes.
        """
        if self._failure is not None:
            raise self._failed()
        receiver = self._receiver
        if receiver is None or self._shutdown:
            raise UsageError("this DistSamplingProducer is not running (init() or shut down)")
        try:
            msg, ended = self._receive(receiver, timeout_ms / 1000 if timeout_ms else None)
        except ErrorReported as report:
            raise self._fail_on_report(report) from None
        except QueueTimeoutError:
            self._report_stall()
            raise
        if not ended:
            self._batches_received += 1
            self._last_batch_at, self._stall_reported = time.monotonic(), False
            self._stop_waiting()
            return msg
        raise self._fail(ended)

    def _receive(self, receiver: Receiver, timeout: float | None) -> tuple[Any, list[ProcessWatch]]:
        """``receiver.receive``, bounded by the stall watch when there is one.

        The loader expects progress from its first ``recv()`` after a batch until the next
        batch, across calls that timed out (a fetch loop polling ``recv(timeout_ms=200)`` is
        one wait). Progress is a batch sent by any worker (its beat) or received here.
        """
        bound = self.stall_timeout
        if bound is None:
            return receiver.receive(timeout)
        now = time.monotonic()
        if self._waiting_since is None:
            self._waiting_since = now
            for watch in self._progress:
                watch.begin("a batch")
        elif self._paused_at is not None:  # asked again after a pause: it never counts
            self._waiting_since = self._resumed_wait(now)
        self._paused_at = None
        deadline = None if timeout is None else now + timeout
        while True:
            last = max([self._waiting_since] + [b for b in self._last_beats() if b is not None])
            quiet = time.monotonic() - last
            if decide_stall(quiet, stall_timeout=bound, armed=True).verdict is Verdict.FIRE:
                # One more look before failing. The beats and the channel were read a while
                # ago on a loaded machine (this thread can be descheduled between its last
                # look at the channel and here), and a worker beats only once its send has
                # returned: a batch already in the channel, or a beat since, is progress.
                try:
                    return receiver.receive(0)
                except QueueTimeoutError:
                    pass
                if any(b is not None and b > last for b in self._last_beats()):
                    continue
                raise self._fail_stalled(quiet)
            wait = bound - quiet
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise QueueTimeoutError()
                wait = min(wait, left)
            try:
                return receiver.receive(max(wait, 0.001))
            except QueueTimeoutError:
                continue

    def pause_waiting(self) -> None:
        """Nobody waits for a batch from now until the next ``recv()`` (server-client mode:
        a fetch answered "not yet", and the client may not ask again until its training
        step is done). The stall clock stops meanwhile: the quiet time before the pause
        still counts, the pause does not, and a batch sent during it starts the clock
        afresh. A fetch loop that asks again at once loses nothing of the wait."""
        if self._waiting_since is not None and self._paused_at is None:
            self._paused_at = time.monotonic()

    def _resumed_wait(self, now: float) -> float:
        """Where the stall clock starts when the wait resumes at ``now`` after a pause."""
        paused = self._paused_at
        assert paused is not None and self._waiting_since is not None
        base = max([self._waiting_since] + [b for b in self._last_beats() if b is not None])
        if base >= paused:  # a worker sent a batch during the pause
            return now
        return now - (paused - base)  # the quiet time before the pause, and no more

    def _stop_waiting(self) -> None:
        self._paused_at = None
        if self._waiting_since is not None:
            self._waiting_since = None
            for watch in self._progress:
                if watch.expected is not None:  # not closed by a teardown meanwhile
                    watch.end()

    def _last_beats(self) -> list[float | None]:
        return [p.last_beat for p in self._progress]

    def _fail_stalled(self, quiet: float) -> SamplingStalledError:
        """Every worker alive, no batch for ``stall_timeout`` while the loader waited: say
        where each one is stuck (state, what it is blocked on, its stacks read without
        interrupting it), then tear the producer down."""
        barrier = self._init_barrier
        dump = barrier.dump_stacks if barrier is not None else None
        ranks: list[int] = []
        diagnoses: list[Diagnosis] = []
        for rank, (w, watch) in enumerate(zip(self._workers, self._progress, strict=True)):
            if w.pid is None or not w.is_alive():
                continue
            ranks.append(rank)
            diagnoses.append(watch.diagnose(quiet, dump=dump))
        lines = [
            f"no batch for {quiet:.1f}s while the loader waited for batch "
            f"{self._batches_received + 1} of this epoch, every sampling worker alive: "
            f"longer than stall_timeout ({self.stall_timeout:g}s). Where each one is stuck:",
            *(f"  - {str(d).splitlines()[0]}" for d in diagnoses),
            "What to do: the stacks below show where each worker waits (a lock, a read, a "
            "peer's RPC); if a batch can honestly take longer, raise stall_timeout. This "
            "producer has been shut down.",
        ]
        for d in diagnoses:
            if d.stacks:
                lines.append(d.stacks.rstrip())
        err = SamplingStalledError(
            "\n".join(lines), stalled_for=quiet, ranks=tuple(ranks), diagnoses=tuple(diagnoses)
        )
        self._failure = err
        self._shutdown = True
        self._teardown(grace=0.0, send_stop=False)
        return err

    def _report_stall(self) -> None:
        """A timed receive found no batch and every worker alive. Once no batch has come for
        the steady-state RPC timeout (the bound a worker's own sampling RPCs get), the
        workers are likely stuck rather than slow: log where each one is, once per stall.
        Nothing is torn down: the caller's loop decides (a slow epoch is not a failure)."""
        stalled = time.monotonic() - self._last_batch_at
        bound = self.timeouts.steady_state_rpc_timeout
        barrier = self._init_barrier
        if self._stall_reported or stalled < bound or barrier is None:
            return
        self._stall_reported = True
        live = [w for w in self._workers if w.pid is not None and w.is_alive()]
        stacks = barrier.dump_stacks([w.pid for w in live if w.pid is not None])
        lines = [
            f"no batch for {stalled:.1f}s (batch {self._batches_received + 1} of this epoch) "
            f"while every sampling worker is alive: longer than the steady-state RPC timeout "
            f"({bound:g}s), so they are likely stuck rather than slow. Their stacks below show "
            "where each one waits (said once per stall; nothing is stopped)"
        ]
        for rank, w in enumerate(self._workers):
            if w in live:
                text = stacks.get(w.pid or 0) or "(no stack: it did not answer)"
                lines.append(f"--- stack of sampling worker {rank} (pid {w.pid}) ---")
                lines.append(text.rstrip())
        logger.warning("%s", "\n".join(lines))

    def _fail_on_report(self, report: ErrorReported) -> SamplingError:
        pid = self._workers[report.rank].pid if 0 <= report.rank < len(self._workers) else None
        err = SamplingError(
            f"sampling worker {report.rank} (pid {pid}) raised while sampling for batch "
            f"{self._batches_received + 1}: {report.summary or 'see its traceback below'}\n"
            "The worker is alive but its batches will never come; this producer has been "
            "shut down. What to do: fix the error below (seed indexes, features, the peer "
            "named in an RPC error), then build a new loader.\n"
            f"--- sampling worker {report.rank} raised ---\n{report.text.rstrip()}",
            rank=report.rank,
            pid=pid,
            worker_traceback=report.text,
            raised_at=report.raised_at,
        )
        self._failure = err
        self._shutdown = True
        publish_job_failure(err, name="healthkit_glt sampling producer")
        self._teardown(grace=0.0, send_stop=False)
        return err

    def _fail(self, ended: list[ProcessWatch]) -> SamplingWorkerDiedError | SamplingStoppedError:
        receiver = self._receiver
        assert receiver is not None
        # Survivors are usually parked in ShmChannel.send() and will never read STOP.
        self._shutdown = True
        try:
            return self._judge([(receiver.ranks[id(w)], w) for w in ended])
        finally:
            self._teardown(grace=0.0, send_stop=False)

    def _failed(self) -> Failure:
        """The failure to raise again; deaths a stop excused are decided again first (the
        stop may be over, with this process still running: then they are a failure)."""
        failure = self._failure
        assert failure is not None
        if isinstance(failure, SamplingStoppedError) and self._excused:
            return self._judge(self._excused, after_stop=True)
        return failure

    def _judge(
        self, ended: list[tuple[int, ProcessWatch]], *, after_stop: bool = False
    ) -> SamplingWorkerDiedError | SamplingStoppedError:
        """Ask the firing rule about each ended worker: a failure (a SIGKILL, a crash, an
        error exit, a stop this process survived), or its share of this process's stop."""
        endings = self._endings or EndingClassifier("sampling workers", log=logger)
        decisions = [endings.classify(w) for _, w in ended]
        if all(d.verdict is not Verdict.FIRE for d in decisions):
            return self._stopped(ended, decisions)
        self._excused = []
        diagnoser = self._diagnoser
        try:
            if diagnoser is None:  # torn down since (a stop's deaths, decided again)
                diagnoser = ExitDiagnoser()
            dead = sorted(
                ((rank, diagnoser.diagnose(w)) for rank, w in ended),
                key=lambda rd: rd[1].observed_at,
            )
        finally:
            if diagnoser is not None and diagnoser is not self._diagnoser:
                diagnoser.close()
        rank, first = dead[0]
        waited = (
            "ended while this process was being stopped, and this process is still running "
            "after the stop" if after_stop
            else f"died while the loader waited for batch {self._batches_received + 1}"
        )
        lines = [
            f"sampling worker {rank} {waited}; the epoch cannot complete",
            *(f"  - {d}" for _, d in dead),
            "What to do: fix what ended the worker (above), then build a new loader; this "
            "producer has been shut down.",
        ]
        if exceptions := _worker_exceptions(dead):
            lines.append(exceptions)
        err = SamplingWorkerDiedError(
            "\n".join(lines), first, rank=rank, diagnoses=tuple(d for _, d in dead)
        )
        self._failure = err
        publish_job_failure(first)  # the other ranks of the job learn why this one stops
        return err

    def _stopped(
        self, ended: list[tuple[int, ProcessWatch]], decisions: list[Decision]
    ) -> SamplingStoppedError:
        ranks = tuple(rank for rank, _ in ended)
        reasons = tuple(d.reason for d in decisions)
        err = SamplingStoppedError(
            f"sampling worker{'s' if len(ranks) > 1 else ''} "
            f"{', '.join(map(str, ranks))} ended while this process was being stopped, "
            f"{reasons[0].partition('; reported')[0]}: not a failure. The loader cannot go "
            f"on without {'them' if len(ranks) > 1 else 'it'}; this producer has been shut "
            "down. If this process carries on after the stop, build a new loader.",
            ranks=ranks,
            reasons=reasons,
        )
        self._failure = err
        self._excused = [
            (rank, w) for (rank, w), d in zip(ended, decisions, strict=True)
            if d.verdict is Verdict.DEFER
        ]  # fmt: skip
        return err

    # ------------------------------------------------------------------ shutdown
    def shutdown(self, grace: float | None = None) -> None:
        """Stop every worker, in bounded time; idempotent; safe after a failed init.

        STOP, then one shared join of ``grace`` (default: the constructor's), then
        SIGTERM and ``kill_after``, then SIGKILL and ``kill_after``. Watching stops
        first, so a worker ending during the teardown is never reported as a failure.
        ``grace=0``: no STOP, SIGTERM at once (nobody consumes any more: workers
        parked in ``send()`` would never read STOP).
        """
        if grace is not None:
            grace = check_seconds(grace, "grace")
        if getattr(self, "_shutdown", True):
            return
        grace_s = self.grace if grace is None else grace
        self._shutdown = True
        self._teardown(grace=grace_s, send_stop=grace_s > 0)

    def _teardown(self, *, grace: float, send_stop: bool, cleanup: bool = True) -> None:
        _live_producers.discard(self)
        receiver, self._receiver = self._receiver, None
        if receiver is not None:
            receiver.stop()
        workers = list(self._workers)
        try:

            def send_stop_commands() -> None:
                for q in self._task_queues:
                    with contextlib.suppress(queue.Full, ValueError, OSError):
                        q.put_nowait((MpCommand.STOP, None))

            # The product's one ladder: STOP, then SIGTERM, then SIGKILL, one deadline. A
            # STOP not obeyed in time is logged at WARNING (the workers then exit 0 through
            # torch's SIGTERM handler, and only that line tells); without STOP (a failure's
            # teardown) SIGTERM after the grace is the plan, not an escalation.
            stop(
                workers,
                request=send_stop_commands if send_stop else None,
                grace=grace,
                kill_after=self.kill_after,
                kill_timeout=self.kill_after,
                name="sampling workers",
                log=logger,
            )
        finally:
            for q in self._task_queues:
                with contextlib.suppress(Exception):
                    q.cancel_join_thread()
                    q.close()
            if receiver is not None:
                receiver.close()
            if self._reports_r is not None:
                self._reports_r.close()
                self._reports_r = None
            if cleanup:
                self._cleanup_files()

    def _cleanup_files(self) -> None:
        # Safe whatever runs still: workers and a stuck receive thread hold mappings of
        # their own, and the segment is marked for removal (see RingSegment).
        if self._segment is not None:
            self._segment.release(self.output_channel)
            self._segment = None
        if self._init_barrier is not None:
            self._init_barrier.close()
        if self._diagnoser is not None:
            self._diagnoser.close()
            self._diagnoser = None
        for watch in self._progress:
            watch.close()

    @property
    def workers(self) -> list[BaseProcess]:
        """The worker processes (for tests and diagnostics; do not join them yourself)."""
        return list(self._workers)

    @property
    def failure(self) -> Failure | None:
        """The steady-state failure that ended this producer, if any."""
        return self._failure

    def __repr__(self) -> str:
        state = "failed" if self._failure else "shut down" if self._shutdown else "running"
        return f"<DistSamplingProducer {state} workers={[w.pid for w in self._workers]}>"
