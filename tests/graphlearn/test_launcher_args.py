"""What launch_sampler_server decides before it forks anything: which rank runs a server,
which arguments and environment values it refuses (and how it says so), and from where it
may be called. None of these touch GL, so they run in the pytest process."""

from __future__ import annotations

import subprocess
import sys
import threading
from typing import Any

import healthkit_graphlearn as hkgl
import pytest

import healthkit as hk

CLUSTER = {"server": "127.0.0.1:1,127.0.0.1:2", "client_count": 4}
GRAPH = object()  # never touched on these paths: nothing is forked


def test_importing_the_package_and_every_public_name_imports_neither_gl_torch_nor_numpy() -> None:
    code = (
        "import sys, healthkit_graphlearn as h\n"
        "assert sorted(h.__all__) == sorted(h._EXPORTS)\n"
        "for name in h.__all__:\n"
        "    getattr(h, name)\n"
        "print(','.join(m for m in ('graphlearn', 'torch', 'numpy', 'graphscope') "
        "if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == ""


@pytest.mark.parametrize("local_rank", [1, 3])
def test_only_local_rank_0_starts_a_server(local_rank: int) -> None:
    assert hkgl.launch_sampler_server(GRAPH, CLUSTER, 0, local_rank=local_rank) is None


def test_local_rank_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert hkgl.launch_sampler_server(GRAPH, CLUSTER, 1) is None


@pytest.mark.parametrize("raw", ["abc", "-1", "1.5", "0x1"])
def test_a_bad_local_rank_in_the_environment_is_rejected_naming_it(
    monkeypatch: pytest.MonkeyPatch, raw: str
) -> None:
    monkeypatch.setenv("LOCAL_RANK", raw)
    with pytest.raises(hk.InvalidArgumentError, match=rf"LOCAL_RANK={raw!r} is not an integer"):
        hkgl.launch_sampler_server(GRAPH, CLUSTER, 0)


def test_a_bad_ready_timeout_in_the_environment_is_rejected_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HEALTHKIT_GL_READY_TIMEOUT_SECONDS", "ten")
    with pytest.raises(hk.InvalidArgumentError, match="HEALTHKIT_GL_READY_TIMEOUT_SECONDS='ten'"):
        hkgl.launch_sampler_server(GRAPH, CLUSTER, 0, local_rank=1)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"cluster": "127.0.0.1:1"}, TypeError, "cluster must be a mapping"),
        ({"cluster": {"server": "", "client_count": 1}}, ValueError, "host:port"),
        ({"cluster": {"server": "127.0.0.1", "client_count": 1}}, ValueError, "host:port"),
        ({"cluster": {"server": "h:1"}}, ValueError, "client_count"),
        ({"cluster": {"server": "h:1", "client_count": 0}}, ValueError, "client_count"),
        ({"task_index": 2}, ValueError, "task_index=2 but cluster.*2 server"),
        ({"task_index": -1}, ValueError, "task_index must be an int >= 0"),
        ({"task_index": True}, TypeError, "task_index must be an int"),
        ({"local_rank": -1}, ValueError, "local_rank must be an int >= 0"),
        ({"mode": "process"}, ValueError, "mode must be one of 'sidecar', 'thread'"),
        ({"wait": "no"}, TypeError, "wait must be True or False"),
        ({"on_clean_exit": "raise"}, ValueError, "on_clean_exit must be"),
        ({"ready_timeout": 0}, ValueError, "ready_timeout must be > 0 seconds"),
        ({"ready_timeout": float("nan")}, ValueError, "ready_timeout must be a finite number"),
        ({"arm": 1}, TypeError, "arm must be True or False"),
        ({"exit_code": 256}, ValueError, "exit_code must be in 1..255"),
        ({"actions": []}, ValueError, "actions= runs in this process, so it needs mode='thread'"),
        ({"mode": "thread", "actions": [5]}, TypeError, "actions must be callable"),
    ],
)
def test_bad_arguments_are_rejected_before_anything_starts(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    args: dict[str, Any] = {"cluster": CLUSTER, "task_index": 0, "local_rank": 1, **kwargs}
    with pytest.raises(error, match=match) as info:
        hkgl.launch_sampler_server(GRAPH, args.pop("cluster"), args.pop("task_index"), **args)
    assert isinstance(info.value, hk.InvalidArgumentError)


def test_launching_off_the_main_thread_is_refused() -> None:
    # The parent-death signal is tied to the forking *thread*: a server forked from a thread
    # that ends would be SIGKILLed while healthy (test_orphan.py shows the kernel doing it).
    caught: list[BaseException] = []

    def launch() -> None:
        try:
            hkgl.launch_sampler_server(GRAPH, CLUSTER, 0, local_rank=0)
        except BaseException as e:
            caught.append(e)

    t = threading.Thread(target=launch, name="loader-thread")
    t.start()
    t.join(30)
    assert len(caught) == 1 and isinstance(caught[0], hkgl.LaunchContextError)
    assert "main thread" in str(caught[0]) and "'loader-thread'" in str(caught[0])


def test_errors_subclass_the_builtins_callers_already_catch() -> None:
    assert issubclass(hkgl.SamplerServerStartupError, hk.ProcessDiedError)
    assert issubclass(hkgl.SamplerServerStartupError, RuntimeError)
    assert issubclass(hkgl.SamplerServerTimeoutError, TimeoutError)
    assert issubclass(hkgl.LaunchContextError, hkgl.SamplerServerError)
    assert issubclass(hkgl.SamplerServerError, hk.HealthkitError)
    assert issubclass(hkgl.GraphLearnFeatureError, hk.HealthkitError)
    assert issubclass(hkgl.GraphLearnFeatureError, NotImplementedError)


def test_shortened_retries_are_validated_and_their_worst_case_is_known() -> None:
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="retry_times must be an int"):
            hkgl.shorten_client_retries(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"timeout must be an int in 1\.\."):
        hkgl.shorten_client_retries(2, timeout=0)
    # GL sleeps 2^k s between attempts k = 1..R-1; each attempt may take `timeout` s.
    assert hkgl.ClientRetryBudget(10, None).dead_server_block_s == 1022  # GL's default
    assert hkgl.ClientRetryBudget(2, None).dead_server_block_s == 2
    assert hkgl.ClientRetryBudget(1, None).dead_server_block_s == 0
    assert hkgl.ClientRetryBudget(2, 3).hung_server_block_s == 8  # measured: 8.00 s
