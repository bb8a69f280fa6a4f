"""healthkit_glt's row of the API table (see tests/api_table.py): a bad value of every
argument of every public constructor and function, refused at the call with a typed
:class:`healthkit.HealthkitError` naming it; public module names; exported errors pickle.

GLT's own arguments (a dataset, a sampling config, worker options, a channel) are passed to
GLT unchanged and checked by GLT: they are listed as exempt, with that reason.
"""

from __future__ import annotations

import gc
import math
import os
import pickle
import sys
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("graphlearn_torch")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import glt_fixtures as fx
import healthkit_glt as hg
from api_table import Case, arguments, cases, check, missing_rows, public_callables

import healthkit as hk

pytestmark = pytest.mark.glt

T = hk.InvalidArgumentTypeError
NAN = math.nan


@pytest.fixture(scope="module", autouse=True)
def multiprocessing_singletons() -> None:
    """Per-interpreter singletons a producer starts (the resource tracker, the mp heap's
    arena), made before the per-test leak snapshot, as in test_healthkit_glt.py."""
    import multiprocessing as mp
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    value = mp.get_context("spawn").Value("I", lock=True)
    big = mp.get_context("spawn").RawArray("b", 1 << 20)
    del value, big


@pytest.fixture(scope="module")
def channel() -> Iterator[Any]:
    from graphlearn_torch.channel import ShmChannel

    ch = ShmChannel(2, "1MB")
    yield ch
    del ch
    gc.collect()


def _producer(**kwargs: Any) -> Any:
    # The producer's own arguments are checked before GLT's constructor sees its five.
    return hg.DistSamplingProducer(None, None, None, None, None, **kwargs)


def _loader(**kwargs: Any) -> Any:
    return hg.DistNeighborLoader(None, [5], None, worker_options=fx.make_worker_options(), **kwargs)


# The three loaders check their own arguments before GLT's __init__ sees its own (data=None
# here), each through the one base they share.
LOADERS = {
    "DistNeighborLoader": _loader,
    "DistLinkNeighborLoader": lambda **kw: hg.DistLinkNeighborLoader(
        None, [5], worker_options=fx.make_worker_options(), **kw
    ),
    "DistSubGraphLoader": lambda **kw: hg.DistSubGraphLoader(
        None, None, worker_options=fx.make_worker_options(), **kw
    ),
}


def _loader_rows(build: Any) -> dict[str, Case | list[Case]]:
    return {
        "producer_cls": Case(lambda e: build(producer_cls=5), T),
        "producer_kwargs": [
            Case(lambda e: build(grace_period=5), T, "grace_period", label="unknown"),
            Case(lambda e: build(grace=-1), named="grace", label="value"),
            Case(lambda e: build(stop_timeout=1.0), T, "stop_timeout", label="old-name"),
            Case(lambda e: build(fetch_wait=1.0), T, "fetch_wait", label="remote-only"),
            Case(lambda e: build(stall_timeout=0), named="stall_timeout", label="stall"),
        ],
    }


def _context() -> hg.SamplingWorkerContext:
    return hg.SamplingWorkerContext(
        0, None, None, None, None, None, None, None, None, None, hg.create_dist_sampler, 1.0, 1.0
    )


def _init_server(**kwargs: Any) -> Any:
    args: dict[str, Any] = {
        "num_servers": 1, "server_rank": 0, "dataset": None, "master_addr": "127.0.0.1",
        "master_port": 29500, **kwargs,
    }  # fmt: skip
    return hg.init_server(**args)


def _resolve(**kwargs: Any) -> Any:
    args: dict[str, Any] = {
        "rpc_init_timeout": None, "steady_state_rpc_timeout": None,
        "init_timeout_multiplier": 3.0, "options_rpc_timeout": 30.0, **kwargs,
    }  # fmt: skip
    return hg.resolve_timeouts(**args)


def _lock() -> Any:
    return threading.Lock()  # what matters here is the channel


CTX_FUNCTIONS = [
    "default_worker_loop", "init_sampling_worker", "pass_init_barrier", "start_sampler",
]  # fmt: skip

GLT: dict[str, dict[str, Case | list[Case]]] = {
    "healthkit_glt.DistSamplingProducer": {
        "sampler_factory": Case(lambda e: _producer(sampler_factory=5), T),
        "worker_loop": Case(lambda e: _producer(worker_loop="loop"), T),
        "rpc_init_timeout": Case(lambda e: _producer(rpc_init_timeout=0)),
        "steady_state_rpc_timeout": Case(lambda e: _producer(steady_state_rpc_timeout=NAN)),
        "init_timeout_multiplier": Case(lambda e: _producer(init_timeout_multiplier=-3)),
        "grace": [Case(lambda e: _producer(grace="10"), T),
                  Case(lambda e: _producer(grace=-1))],
        "kill_after": Case(lambda e: _producer(kill_after=math.inf)),
        "init_failure_grace": Case(lambda e: _producer(init_failure_grace=None)),
        "receiver": Case(lambda e: _producer(receiver="fast")),
        "recv_poll_ms": Case(lambda e: _producer(recv_poll_ms=0)),
        "worker_extra": Case(lambda e: _producer(worker_extra=[1]), T),
        "strict_env": Case(lambda e: _producer(strict_env="yes"), T),
        "stall_timeout": [Case(lambda e: _producer(stall_timeout=0)),
                          Case(lambda e: _producer(stall_timeout="60"), T)],
    },
    **{f"healthkit_glt.{name}": _loader_rows(build) for name, build in LOADERS.items()},
    "healthkit_glt.DistServer": {
        "producer_kwargs": [Case(lambda e: hg.DistServer(None, producer_kwargs=[1]), T),
                            Case(lambda e: hg.DistServer(None, producer_kwargs={"bogus": 1}),
                                 T, "bogus", label="unknown")],
        "connection_timeout": Case(lambda e: hg.DistServer(None, connection_timeout=0)),
        "lease_host": Case(lambda e: hg.DistServer(None, lease_host=5), T),
        "lease_bind": Case(lambda e: hg.DistServer(None, lease_bind=None), T),
    },
    "healthkit_glt.init_server": {
        "num_servers": Case(lambda e: _init_server(num_servers=0)),
        "server_rank": Case(lambda e: _init_server(server_rank=1)),
        "master_addr": Case(lambda e: _init_server(master_addr=None), T),
        "master_port": Case(lambda e: _init_server(master_port=70000)),
        "num_clients": Case(lambda e: _init_server(num_clients=-1)),
        "num_rpc_threads": Case(lambda e: _init_server(num_rpc_threads=0)),
        "request_timeout": Case(lambda e: _init_server(request_timeout=-1)),
        "server_group_name": Case(lambda e: _init_server(server_group_name=5), T),
        "is_dynamic": Case(lambda e: _init_server(is_dynamic="no"), T),
        "connection_timeout": Case(lambda e: _init_server(connection_timeout=NAN)),
        "lease_host": Case(lambda e: _init_server(lease_host=5), T),
        "lease_bind": Case(lambda e: _init_server(lease_bind=None), T),
    },
    "healthkit_glt.SerializedSendChannel": {
        "channel": Case(lambda e: hg.SerializedSendChannel(5, _lock()), T),
        "lock": Case(lambda e: hg.SerializedSendChannel(e, 5), T),
    },
    "healthkit_glt.open_receiver": {
        "channel": Case(lambda e: hg.open_receiver(5, []), T),
        "workers": Case(lambda e: hg.open_receiver(e, [5]), T),
        "mode": Case(lambda e: hg.open_receiver(e, [], mode="fast")),
        "poll_ms": Case(lambda e: hg.open_receiver(e, [], poll_ms=0)),
        "reports": Case(lambda e: hg.open_receiver(e, [], reports=5), T),
        "report_flag": Case(lambda e: hg.open_receiver(e, [], report_flag=5), T),
    },
    "healthkit_glt.resolve_timeouts": {
        "rpc_init_timeout": Case(lambda e: _resolve(rpc_init_timeout=-1)),
        "steady_state_rpc_timeout": Case(lambda e: _resolve(steady_state_rpc_timeout=0)),
        "init_timeout_multiplier": Case(lambda e: _resolve(init_timeout_multiplier=NAN)),
        "options_rpc_timeout": Case(lambda e: _resolve(options_rpc_timeout=0),
                                    named="worker_options.rpc_timeout"),
        "strict_env": Case(lambda e: _resolve(strict_env=1), T),
    },
    "healthkit_glt.narrow_rpc_timeout": {
        "rank": Case(lambda e: hg.narrow_rpc_timeout(-1, 1.0, 1.0)),
        "bringup": Case(lambda e: hg.narrow_rpc_timeout(0, 0, 1.0)),
        "steady": Case(lambda e: hg.narrow_rpc_timeout(0, 1.0, NAN)),
    },
    **{f"healthkit_glt.{fn}": {"ctx": Case(lambda e, fn=fn: getattr(hg, fn)(None), T)}
       for fn in CTX_FUNCTIONS},
    "healthkit_glt.run_task_loop": {"ctx": Case(lambda e: hg.run_task_loop("ctx", None), T)},
    "healthkit_glt.report_sampling_error": {
        "ctx": Case(lambda e: hg.report_sampling_error(5, "tb"), T),
        "text": Case(lambda e: hg.report_sampling_error(_context(), b"tb"), T),
        "summary": Case(lambda e: hg.report_sampling_error(_context(), "tb", None), T),
    },
    "healthkit_glt.create_dist_sampler": {},
    "healthkit_glt.teardown_sampling_worker": {},
    "healthkit_glt.glt_build": {},
    "healthkit_glt.glt_version": {},
    "healthkit_glt.wait_and_shutdown_server": {},
}  # fmt: skip

GLT_EXEMPT = {
    "healthkit_glt.Receiver": "a protocol (what open_receiver returns)",
    "healthkit_glt.SamplerFactory": "a protocol (any callable with create_dist_sampler's shape)",
    "healthkit_glt.SamplingWorkerContext": "built by the producer and handed to the worker loop",
    "healthkit_glt.ServerFailure": "a value the servers report",
    "healthkit_glt.ServerHello": "a value the servers report",
    "healthkit_glt.TimeoutPlan": "a value resolve_timeouts returns",
    **{f"healthkit_glt.{n}": "an error (its pickling is tested below)" for n in hg.__all__
       if isinstance(getattr(hg, n), type) and issubclass(getattr(hg, n), BaseException)},
}  # fmt: skip
GLT_OWN = "GLT's own argument, passed to GLT unchanged (GLT checks it)"
GLT_EXEMPT_ARGUMENTS = {
    **{f"healthkit_glt.DistSamplingProducer({a})": GLT_OWN for a in (
        "data", "sampler_input", "sampling_config", "worker_options", "output_channel")},
    **{f"healthkit_glt.{loader}({a})": GLT_OWN for loader in LOADERS for a in (
        "data", "num_neighbors", "batch_size", "shuffle", "drop_last", "with_edge",
        "with_weight", "edge_dir", "collect_features", "to_device", "random_seed",
        "worker_options")},
    **{f"healthkit_glt.{loader}(input_nodes)": GLT_OWN
       for loader in ("DistNeighborLoader", "DistSubGraphLoader")},
    **{f"healthkit_glt.DistLinkNeighborLoader({a})": GLT_OWN
       for a in ("edge_label_index", "edge_label", "neg_sampling")},
    "healthkit_glt.DistServer(dataset)": GLT_OWN,
    "healthkit_glt.init_server(dataset)": GLT_OWN,
    **{f"healthkit_glt.create_dist_sampler({a})": GLT_OWN for a in (
        "data", "sampling_config", "worker_options", "channel", "current_device")},
    "healthkit_glt.run_task_loop(sampler)": "the sampler start_sampler returned, used as is",
    "healthkit_glt.teardown_sampling_worker(sampler)": "a GLT sampler or None (a partial start)",
}  # fmt: skip


def test_every_public_callable_has_a_row() -> None:
    missing = missing_rows([hg], GLT, GLT_EXEMPT, GLT_EXEMPT_ARGUMENTS)
    # **producer_kwargs has no name in the signature: its row is checked here.
    for loader in LOADERS:
        assert "producer_kwargs" in GLT[f"healthkit_glt.{loader}"]
        assert "producer_kwargs" not in arguments(getattr(hg, loader))
    assert not missing, f"public API without a bad-input row in GLT: {missing}"


@pytest.mark.parametrize(("arg", "case"), cases(GLT))
def test_bad_input_is_refused_at_the_call(arg: str, case: Case, channel: Any) -> None:
    check(arg, case, channel)


def test_every_exported_object_reports_its_public_module() -> None:
    wrong = {
        key: obj.__module__
        for key, obj in public_callables([hg])
        if obj.__module__ not in ("healthkit_glt", "healthkit")  # the core's errors: healthkit
    }
    assert not wrong, wrong
    assert hg.SamplingWorkerDiedError.__module__ == "healthkit_glt"
    assert hg.BarrierBrokenError.__module__ == "healthkit"


def _diagnosis() -> hk.Diagnosis:
    diagnoser = hk.ExitDiagnoser()
    try:
        return diagnoser.diagnose(-9, name="sampling worker 1", pid=4242, evidence=False)
    finally:
        diagnoser.close()


def test_every_exported_error_pickles_with_its_attributes() -> None:
    d = _diagnosis()
    examples: dict[type[BaseException], BaseException] = {
        hg.SamplingWorkerDiedError: hg.SamplingWorkerDiedError("died", d, rank=1, diagnoses=(d,)),
        hg.SamplingError: hg.SamplingError(
            "raised", rank=0, worker_traceback="Traceback ...", raised_at=1.5, pid=4242
        ),
        hg.RemoteSamplingError: hg.RemoteSamplingError(
            "failed", kind="worker died", server_rank=0, host="vm", diagnosis=d
        ),
        hg.SamplingServerLostError: hg.SamplingServerLostError(
            "gone", kind="server lost", server_rank=1
        ),
        hg.SamplingStalledError: hg.SamplingStalledError(
            "stalled", stalled_for=60.0, ranks=(0, 1), diagnoses=(d,)
        ),
        hg.SamplingStoppedError: hg.SamplingStoppedError(
            "stopped", ranks=(1,), reasons=("taken as its share of this process's stop",)
        ),
        hg.RingLayoutError: hg.RingLayoutError("not GLT 0.2.4's ring"),
        hg.BarrierBrokenError: hg.BarrierBrokenError(
            "broken", barrier_name="init", elapsed=1.0, bound=3.0
        ),
        hg.BarrierTimeoutError: hg.BarrierTimeoutError(
            "timed out", barrier_name="init", elapsed=3.0, bound=3.0
        ),
    }
    errors = [o for _, o in public_callables([hg]) if issubclass_(o, BaseException)]
    assert sorted(e.__name__ for e in errors) == sorted(e.__name__ for e in examples)
    for error in examples.values():
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error)
        assert (copy.args, str(copy), vars(copy)) == (error.args, str(error), vars(error))
    # Every error healthkit_glt exports is one of healthkit's (callers catch one family).
    import healthkit as hk

    outside = [e.__name__ for e in errors if not issubclass(e, hk.HealthkitError)]
    assert not outside, f"not HealthkitError subclasses: {outside}"
    lost = pickle.loads(pickle.dumps(examples[hg.SamplingServerLostError]))
    assert isinstance(lost, ConnectionError) and lost.server_rank == 1  # type: ignore[attr-defined]


def issubclass_(obj: object, cls: type) -> bool:
    return isinstance(obj, type) and issubclass(obj, cls)


def _producer_args() -> tuple[Any, tuple[Any, ...]]:
    """A ring and the positional arguments of a small DistSamplingProducer over it."""
    import torch
    from graphlearn_torch.channel import ShmChannel
    from graphlearn_torch.sampler import NodeSamplerInput, SamplingConfig, SamplingType

    fx.init_single_process_context()
    channel = ShmChannel(2, "1MB")
    config = SamplingConfig(SamplingType.NODE, [5, 5], 64, True, False, False, True,
                            with_neg=False, with_weight=False, edge_dir="out", seed=1)  # fmt: skip
    args = (fx.build_dataset(), NodeSamplerInput(node=torch.arange(10)), config,
            fx.make_worker_options(), channel)  # fmt: skip
    return channel, args


@pytest.mark.timeout(60)
def test_the_shutdown_bounds_are_grace_and_kill_after_and_the_old_names_are_gone() -> None:
    """The wait from the stop request to SIGTERM is ``grace`` and the one after each signal
    ``kill_after``, as in ``healthkit.stop()``; nothing was released under ``stop_timeout``
    or ``kill_timeout``, so neither is kept."""
    channel, args = _producer_args()
    for old in ("stop_timeout", "kill_timeout"):
        with pytest.raises(TypeError, match=old):
            hg.DistSamplingProducer(*args, **{old: 3.0})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        producer = hg.DistSamplingProducer(*args, grace=4.0, kill_after=3.0)
        assert (producer.grace, producer.kill_after) == (4.0, 3.0)
        assert not hasattr(producer, "stop_timeout") and not hasattr(producer, "kill_timeout")
        with pytest.raises(TypeError, match="stop_timeout"):
            producer.shutdown(stop_timeout=0.5)  # type: ignore[call-arg]
        producer.shutdown(grace=0.5)
    with pytest.raises(hk.InvalidArgumentError) as info:
        producer.shutdown(grace=-1)  # refused at the call, also once shut down
    assert info.value.argument == "grace"
    del producer, channel, args, info  # the tracebacks hold this frame, and so the dataset
    gc.collect()


def test_release_producer_takes_grace() -> None:
    """Checked before the server is touched: shown on a bare instance."""
    server = object.__new__(hg.DistServer)
    with pytest.raises(TypeError, match="stop_timeout"):
        server.release_producer(0, "token", stop_timeout=1.0)  # type: ignore[call-arg]
    with pytest.raises(hk.InvalidArgumentError) as info:
        server.release_producer(0, "token", grace=math.nan)
    assert info.value.argument == "grace"
