"""healthkit_graphlearn's row of the API table (see tests/api_table.py): a bad value of every
argument of every public constructor and function, refused at the call with a typed
:class:`healthkit.HealthkitError` naming it; public module names; exported errors pickle.
Nothing here starts a server or imports graph-learn: each refusal comes first."""

from __future__ import annotations

import math
import pickle
import types
from typing import Any

import healthkit_graphlearn as hkgl
import pytest
from api_table import Case, cases, check, missing_rows, public_callables

import healthkit as hk

T = hk.InvalidArgumentTypeError
CLUSTER = {"server": "127.0.0.1:1,127.0.0.1:2", "client_count": 4}
GRAPH = object()  # never touched: every case is refused before anything starts
NOT_GL = "graphlearn"  # a module's name where the module is expected
ENV = hkgl.DistEnv()


def _launch(**kwargs: Any) -> Any:
    """Local rank 1 by default: a valid call returns None there without starting a server."""
    cluster, task_index = kwargs.pop("cluster", CLUSTER), kwargs.pop("task_index", 0)
    return hkgl.launch_sampler_server(GRAPH, cluster, task_index, **{"local_rank": 1, **kwargs})


GL: dict[str, dict[str, Case | list[Case]]] = {
    "healthkit_graphlearn.DistEnv": {
        "world_size": Case(lambda e: hkgl.DistEnv(world_size=0)),
        "rank": Case(lambda e: hkgl.DistEnv(world_size=2, rank=2)),
        "local_world_size": Case(lambda e: hkgl.DistEnv(world_size=2, local_world_size=3)),
        "local_rank": Case(lambda e: hkgl.DistEnv(local_rank=-1)),
        "group_rank": Case(lambda e: hkgl.DistEnv(group_rank="0"), T),
    },
    "healthkit_graphlearn.client_task_index": {
        "client_id": Case(lambda e: hkgl.client_task_index(1.0, env=ENV), T),
        "num_client_per_rank": Case(lambda e: hkgl.client_task_index(num_client_per_rank=0)),
        "client_id_bias": Case(lambda e: hkgl.client_task_index(client_id_bias=-1)),
        "env": Case(lambda e: hkgl.client_task_index(env={"RANK": 0}), T),
    },
    "healthkit_graphlearn.die_with_rank": {
        "rank_pid": [
            Case(lambda e: hkgl.die_with_rank("1"), T),
            Case(lambda e: hkgl.die_with_rank(-3), hk.NoSuchProcessError, "rank_pid", "-3"),
        ],
    },
    "healthkit_graphlearn.exchange_server_addresses": {
        "address": [Case(lambda e: hkgl.exchange_server_addresses(5, env=ENV), T),
                    Case(lambda e: hkgl.exchange_server_addresses(None, env=ENV), label="rank0")],
        "env": Case(lambda e: hkgl.exchange_server_addresses("h:1", env=5), T),
        "exchange": Case(lambda e: hkgl.exchange_server_addresses("h:1", exchange="gather")),
        "group": Case(lambda e: hkgl.exchange_server_addresses("h:1", env=ENV, group=object())),
    },
    "healthkit_graphlearn.free_port": {
        "host": [
            Case(lambda e: hkgl.free_port(None), T),
            Case(lambda e: hkgl.free_port("no.such.host"), label="unresolvable"),
            Case(lambda e: hkgl.free_port("192.0.2.1"), label="not-this-machine"),  # TEST-NET-1
        ]
    },
    "healthkit_graphlearn.get_cluster_spec": {
        "num_client_per_rank": Case(lambda e: hkgl.get_cluster_spec(0)),
        "host": Case(lambda e: hkgl.get_cluster_spec(host=5), T),
        "port": Case(lambda e: hkgl.get_cluster_spec(port=0)),
        "exchange": Case(lambda e: hkgl.get_cluster_spec(exchange="reduce")),
        "group": Case(lambda e: hkgl.get_cluster_spec(env=ENV, port=1, group=object())),
        "env": Case(lambda e: hkgl.get_cluster_spec(env="env"), T),
    },
    "healthkit_graphlearn.graphlearn_build": {
        "gl": Case(lambda e: hkgl.graphlearn_build(NOT_GL), T),
    },
    "healthkit_graphlearn.import_graphlearn": {},
    "healthkit_graphlearn.launch_sampler_server": {
        "cluster": [Case(lambda e: _launch(cluster="127.0.0.1:1"), T),
                    Case(lambda e: _launch(cluster={"server": "h:1"}), label="no-clients")],
        "task_index": [Case(lambda e: _launch(task_index=2)),
                       Case(lambda e: _launch(task_index=-1))],
        "local_rank": Case(lambda e: _launch(local_rank=-1)),
        "mode": Case(lambda e: _launch(mode="process")),
        "wait": Case(lambda e: _launch(wait="no"), T),
        "ready_timeout": Case(lambda e: _launch(ready_timeout=math.nan)),
        "arm": Case(lambda e: _launch(arm=None), T),
        "on_clean_exit": Case(lambda e: _launch(on_clean_exit="raise")),
        "exit_code": Case(lambda e: _launch(exit_code=0)),
        "actions": [Case(lambda e: _launch(actions=[])),
                    Case(lambda e: _launch(mode="thread", actions=[5]), T)],
        "stall_timeout": [Case(lambda e: _launch(stall_timeout=0)),
                          Case(lambda e: _launch(stall_timeout="60"), T)],
    },
    "healthkit_graphlearn.server_address": {
        "host": Case(lambda e: hkgl.server_address(host=b"h", port=1), T),
        "port": [Case(lambda e: hkgl.server_address("127.0.0.1", 65536)),
                 Case(lambda e: hkgl.server_address("127.0.0.1", "1"), T)],
    },
    "healthkit_graphlearn.set_load_graph_thread_num": {
        "num": [Case(lambda e: hkgl.set_load_graph_thread_num(0)),
                Case(lambda e: hkgl.set_load_graph_thread_num(True), T)],
        "gl": Case(lambda e: hkgl.set_load_graph_thread_num(2, NOT_GL), T),
    },
    "healthkit_graphlearn.set_use_string_hash_id": {
        "gl": Case(lambda e: hkgl.set_use_string_hash_id(NOT_GL), T),
    },
    "healthkit_graphlearn.shorten_client_retries": {
        "retry_times": Case(lambda e: hkgl.shorten_client_retries(0)),
        "timeout": Case(lambda e: hkgl.shorten_client_retries(2, 0)),
        "gl": Case(lambda e: hkgl.shorten_client_retries(2, gl=NOT_GL), T),
    },
}  # fmt: skip

GL_EXEMPT = {
    "healthkit_graphlearn.ClientRetryBudget": "a value shorten_client_retries returns",
    "healthkit_graphlearn.GraphLearnBuild": "a value graphlearn_build returns",
    "healthkit_graphlearn.SamplerServer": "built by launch_sampler_server",
    "healthkit_graphlearn.server_call": "takes no argument",
    **{f"healthkit_graphlearn.{n}": "an error (its pickling is tested below)"
       for n in hkgl.__all__
       if isinstance(getattr(hkgl, n), type) and issubclass(getattr(hkgl, n), BaseException)},
}  # fmt: skip
GL_EXEMPT_ARGUMENTS = {
    "healthkit_graphlearn.launch_sampler_server(graph)": "GL's Graph, used by GL in the server",
}


def test_every_public_callable_has_a_row() -> None:
    missing = missing_rows([hkgl], GL, GL_EXEMPT, GL_EXEMPT_ARGUMENTS)
    assert not missing, f"public API without a bad-input row in GL: {missing}"


@pytest.mark.parametrize(("arg", "case"), cases(GL))
def test_bad_input_is_refused_at_the_call(arg: str, case: Case) -> None:
    check(arg, case, None)


def test_every_exported_object_reports_its_public_module() -> None:
    wrong = {k: o.__module__ for k, o in public_callables([hkgl]) if o.__module__ != hkgl.__name__}
    assert not wrong, wrong
    # Also when the private module was imported first, before the public name was used.
    from healthkit_graphlearn._tzrec.cluster import get_cluster_spec

    assert get_cluster_spec.__module__ == "healthkit_graphlearn"


def test_every_exported_error_pickles_with_its_attributes() -> None:
    diagnoser = hk.ExitDiagnoser()
    try:
        d = diagnoser.diagnose(-9, name="graphlearn sampler server 0", pid=4242, evidence=False)
    finally:
        diagnoser.close()
    examples: dict[type[BaseException], BaseException] = {
        hkgl.SamplerServerError: hkgl.SamplerServerError("stopped before ready"),
        hkgl.SamplerServerStartupError: hkgl.SamplerServerStartupError("died", d),
        hkgl.SamplerServerTimeoutError: hkgl.SamplerServerTimeoutError("not ready"),
        hkgl.LaunchContextError: hkgl.LaunchContextError("forked child"),
        hkgl.GraphLearnFeatureError: hkgl.GraphLearnFeatureError("no set_retry_times"),
        hkgl.GraphLearnImportError: hkgl.GraphLearnImportError("no graphlearn"),
    }
    errors = [o for _, o in public_callables([hkgl]) if isinstance(o, type)]
    errors = [o for o in errors if issubclass(o, BaseException)]
    assert sorted(e.__name__ for e in errors) == sorted(e.__name__ for e in examples)
    for error in examples.values():
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error)
        assert (copy.args, str(copy), vars(copy)) == (error.args, str(error), vars(error))
    died = pickle.loads(pickle.dumps(examples[hkgl.SamplerServerStartupError]))
    assert died.diagnosis.pid == 4242  # type: ignore[attr-defined]
    assert isinstance(types.ModuleType, type)


def test_stop_takes_kill_after_and_wait_ready_takes_timeout() -> None:
    """Checked before the server is touched: shown on a bare instance. ``stop()``'s bound
    is ``kill_after`` (its pre-release name ``timeout=`` is gone); ``wait_ready(timeout=)``
    bounds the wait for readiness. On a launched server:
    test_launcher.py::test_stop_kill_after_is_the_wait_before_sigkill_on_a_launched_server."""
    unlaunched = object.__new__(hkgl.SamplerServer)
    with pytest.raises(TypeError, match="timeout"):
        unlaunched.stop(timeout=1.0)  # type: ignore[call-arg]
    with pytest.raises(hk.InvalidArgumentError) as info:
        unlaunched.stop(kill_after=-1)
    assert info.value.argument == "kill_after"
    with pytest.raises(hk.InvalidArgumentError) as info:
        unlaunched.wait_ready(timeout=-1)
    assert info.value.argument == "timeout"
