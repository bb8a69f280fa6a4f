"""The public API's error convention, table-driven: every public constructor and function of
``healthkit``, ``healthkit.actions`` and ``healthkit.lowlevel`` has a row with a bad value of
each argument it takes, and must refuse it at the call with a typed
:class:`healthkit.HealthkitError` that names the argument. A public callable without a row
fails the test, so new API cannot skip the convention. Also: public module names, pickling
of every exported error, and that no name renamed before the first release lingers."""

from __future__ import annotations

import inspect
import math
import os
import pickle
import signal
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from api_table import Case, cases, check, missing_rows

import healthkit
from healthkit import (
    BoundedBarrier,
    DisarmableWatchdog,
    HealthkitError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    ProcessWatch,
    WatchSet,
    _shared,
    actions,
    lowlevel,
)
from healthkit.actions import FailureEvent

pytestmark = pytest.mark.security


# ------------------------------------------------------------------------ no old names
@pytest.mark.parametrize(
    "old", ["InvalidTimeoutError", "InvalidExitCodeError", "InvalidEnvValueError"]
)
def test_names_renamed_before_the_first_release_are_gone(old: str) -> None:
    """Nothing was released under the old names, so none is kept as an alias."""
    assert old not in healthkit.__all__
    with pytest.raises(AttributeError):
        getattr(healthkit, old)
    assert not hasattr(DisarmableWatchdog, "kill_grace")
    assert not hasattr(lowlevel, "renamed_argument")
    with pytest.raises(TypeError, match="kill_grace"):
        DisarmableWatchdog(kill_grace=3.0)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="term_timeout"):
        healthkit.stop([], term_timeout=0.2)  # type: ignore[call-arg]


def test_the_new_names_do_not_warn(child: subprocess.Popen[bytes]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        DisarmableWatchdog(kill_after=1.0)
        healthkit.stop([child], kill_after=0.2)


def test_argument_errors_are_value_errors_and_type_errors_stay_type_errors() -> None:
    assert issubclass(InvalidArgumentError, ValueError)
    assert issubclass(InvalidArgumentTypeError, (ValueError, TypeError))
    with pytest.raises(TypeError) as info:
        DisarmableWatchdog(kill_after="2")  # type: ignore[arg-type]
    assert isinstance(info.value, HealthkitError) and info.value.argument == "kill_after"  # type: ignore[attr-defined]


# ----------------------------------------------------------------------------- public names
PUBLIC_MODULES = [healthkit, healthkit.actions, healthkit.lowlevel]


def _exported(module: Any) -> Iterator[tuple[str, Any]]:
    for name in module.__all__:
        obj = getattr(module, name)
        if isinstance(obj, type) or inspect.isfunction(obj):
            yield name, obj


@pytest.mark.parametrize("module", PUBLIC_MODULES, ids=lambda m: m.__name__)
def test_every_exported_object_reports_its_public_module(module: Any) -> None:
    wrong = {
        name: obj.__module__ for name, obj in _exported(module) if obj.__module__ != module.__name__
    }
    assert not wrong, f"{module.__name__}: {wrong}"


def _diagnosis() -> healthkit.Diagnosis:
    diagnoser = healthkit.ExitDiagnoser()
    try:
        return diagnoser.diagnose(-9, name="sampling worker 1", pid=4242, evidence=False)
    finally:
        diagnoser.close()


def _error_examples() -> dict[type[BaseException], BaseException]:
    d = _diagnosis()
    party = healthkit.PartyReport(rank=0, name="w0", pid=4242, state="dead", arrived=False)
    barrier = {"barrier_name": "init", "elapsed": 1.5, "bound": 3.0, "parties": (party,)}
    return {
        HealthkitError: HealthkitError("x"),
        healthkit.NoSuchProcessError: healthkit.NoSuchProcessError("pid 4242"),
        healthkit.ProcessNotStartedError: healthkit.ProcessNotStartedError("not started"),
        healthkit.WatchClosedError: healthkit.WatchClosedError("closed"),
        InvalidArgumentError: InvalidArgumentError("kill_after must be >= 0", "kill_after"),
        InvalidArgumentTypeError: InvalidArgumentTypeError("name must be a str", "name"),
        healthkit.InterpreterShutdownError: healthkit.InterpreterShutdownError("shutdown"),
        healthkit.UsageError: healthkit.UsageError("from another process"),
        healthkit.UnsupportedError: healthkit.UnsupportedError("needs pidfd"),
        healthkit.ProcessDiedError: healthkit.ProcessDiedError("died", d),
        healthkit.BarrierBrokenError: healthkit.BarrierBrokenError("broken", **barrier),
        healthkit.BarrierTimeoutError: healthkit.BarrierTimeoutError("timed out", **barrier),
        healthkit.SidecarError: healthkit.SidecarError("no sidecar"),
        healthkit.lowlevel.EnvValueWarning: healthkit.lowlevel.EnvValueWarning("X='abc'"),
    }


def _state(error: BaseException) -> tuple[Any, ...]:
    return (type(error), error.args, str(error), vars(error))


def test_every_exported_error_pickles_with_its_attributes() -> None:
    examples = _error_examples()
    errors = [
        obj
        for module in PUBLIC_MODULES
        for _, obj in _exported(module)
        if issubclass_safe(obj, BaseException)
    ]
    missing = [e.__name__ for e in errors if e not in examples]
    assert not missing, f"exported errors without a pickling example: {missing}"
    for error in examples.values():
        copy = pickle.loads(pickle.dumps(error))
        assert _state(copy) == _state(error)
    died = pickle.loads(pickle.dumps(examples[healthkit.ProcessDiedError]))
    assert died.diagnosis.cause == healthkit.Cause.SIGKILL_UNCONFIRMED  # type: ignore[attr-defined]
    assert pickle.loads(pickle.dumps(examples[InvalidArgumentError])).argument == "kill_after"  # type: ignore[attr-defined]


def issubclass_safe(obj: object, cls: type) -> bool:
    return isinstance(obj, type) and issubclass(obj, cls)


def test_an_error_crosses_a_process_boundary(tmp_path: Any) -> None:
    """Unpickled where only the public name is known: a fresh interpreter."""
    path = tmp_path / "error.pickle"
    path.write_bytes(pickle.dumps(_error_examples()[healthkit.ProcessDiedError]))
    code = (
        "import pickle, sys; e = pickle.loads(open(sys.argv[1], 'rb').read()); "
        "print(type(e).__module__, type(e).__qualname__, e.diagnosis.pid)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=60
    )
    assert out.stdout.split() == ["healthkit", "ProcessDiedError", "4242"], out.stderr


# ----------------------------------------------------------------------------- the table
@attrs.frozen
class Env:
    """What a case may need: a live child of this test (real, reaped after the test)."""

    child: subprocess.Popen[bytes]
    tmp: Path


@pytest.fixture
def env(child: subprocess.Popen[bytes], tmp_path: Path) -> Env:
    return Env(child, tmp_path)


T = InvalidArgumentTypeError


def _in_watch_set(call: Any) -> None:
    with WatchSet() as ws:
        call(ws)


NAN = math.nan
BAD_CTX = "fork"  # the review's case: a start-method name where a context is expected


def _barrier_wait(**kwargs: Any) -> None:
    barrier = BoundedBarrier(1, timeout=5)
    try:
        barrier.wait([], **kwargs)
    finally:
        barrier.close()


def _watch_of(e: Env, call: Any) -> None:
    with ProcessWatch(e.child) as w:
        call(w)


def _with_env(value: str, call: Any) -> Any:
    old = os.environ.get("HEALTHKIT_TEST_X")
    os.environ["HEALTHKIT_TEST_X"] = value
    try:
        return call()
    finally:
        if old is None:
            del os.environ["HEALTHKIT_TEST_X"]
        else:
            os.environ["HEALTHKIT_TEST_X"] = old


def _diagnose(**kwargs: Any) -> None:
    diagnoser = healthkit.ExitDiagnoser(kmsg_path=None)
    try:
        diagnoser.diagnose(9, **kwargs)
    finally:
        diagnoser.close()


_SERVER_ID = "0123456789abcdef" * 2  # a well-formed server id; nothing listens at _ADDR
_ADDR = [("127.0.0.1", 1)]


def _status() -> healthkit.ExitStatus:
    return healthkit.ExitStatus(returncode=-15, source="test")


CORE: dict[str, dict[str, Case | list[Case]]] = {
    "healthkit.BoundedBarrier": {
        "parties": [
            Case(lambda e: BoundedBarrier(-1, timeout=5)),
            Case(lambda e: BoundedBarrier(0, timeout=5), label="none"),
            Case(lambda e: BoundedBarrier("2", timeout=5), T),
        ],
        "timeout": [
            Case(lambda e: BoundedBarrier(1, timeout=0)),
            Case(lambda e: BoundedBarrier(1, timeout=NAN)),
        ],
        "hint": Case(lambda e: BoundedBarrier(1, timeout=5, hint=5), T),
        "ctx": Case(lambda e: BoundedBarrier(1, timeout=5, ctx=BAD_CTX), T),
        "name": Case(lambda e: BoundedBarrier(1, timeout=5, name=5), T),
        "worker_label": Case(lambda e: BoundedBarrier(1, timeout=5, worker_label=None), T),
        "abort_grace": Case(lambda e: BoundedBarrier(1, timeout=5, abort_grace=-1)),
    },
    "healthkit.BoundedBarrier.wait": {
        "on_failure": Case(lambda e: _barrier_wait(on_failure=5), T),
        "diagnoser": Case(lambda e: _barrier_wait(diagnoser="x"), T),
    },
    "healthkit.DisarmableWatchdog": {
        "watches": [
            Case(lambda e: DisarmableWatchdog(["abc"]), T),
            Case(lambda e: DisarmableWatchdog([os.getpid()]), named="target", label="itself"),
        ],
        "actions": [
            Case(lambda e: DisarmableWatchdog(actions=[5]), T),
            Case(lambda e: DisarmableWatchdog(mode="sidecar", actions=[]), label="sidecar"),
        ],
        "mode": Case(lambda e: DisarmableWatchdog(mode="bogus")),
        "name": Case(lambda e: DisarmableWatchdog(name=5), T),
        "diagnoser": [
            Case(lambda e: DisarmableWatchdog(diagnoser="x"), T),
            Case(
                lambda e: DisarmableWatchdog(
                    mode="sidecar",
                    diagnoser=type("Mine", (healthkit.ExitDiagnoser,), {})(kmsg_path=None),
                ),
                label="sidecar-subclass",
            ),
        ],
        "on_clean_exit": Case(lambda e: DisarmableWatchdog(on_clean_exit="bogus")),
        "exit_code": [
            Case(lambda e: DisarmableWatchdog(exit_code=256)),
            Case(lambda e: DisarmableWatchdog(exit_code="1"), T),
        ],
        "kill_after": Case(lambda e: DisarmableWatchdog(kill_after=-1)),
        "rss_sample_interval": Case(lambda e: DisarmableWatchdog(rss_sample_interval=0.001)),
        "stop_grace": Case(lambda e: DisarmableWatchdog(stop_grace=NAN)),
        "job_notice": Case(lambda e: DisarmableWatchdog(job_notice="on"), T),  # type: ignore[arg-type]
    },
    "healthkit.DisarmableWatchdog.disarm": {
        "reason": Case(lambda e: DisarmableWatchdog().disarm(reason=5), T),  # type: ignore[arg-type]
    },
    "healthkit.ExitDiagnoser": {
        "proc_root": Case(lambda e: healthkit.ExitDiagnoser(proc_root=5), T),
        "cgroup_root": Case(lambda e: healthkit.ExitDiagnoser(cgroup_root=None), T),
        "kmsg_path": [
            Case(lambda e: healthkit.ExitDiagnoser(kmsg_path=5), T),
            Case(lambda e: healthkit.ExitDiagnoser(kmsg_path="/nonexistent"), label="missing"),
        ],
        "shm_path": Case(lambda e: healthkit.ExitDiagnoser(shm_path=""), T),
        "cgroup": Case(lambda e: healthkit.ExitDiagnoser(cgroup="/sys/fs/cgroup"), T),
        "history": Case(lambda e: healthkit.ExitDiagnoser(history="yes"), T),
        "records": Case(lambda e: healthkit.ExitDiagnoser(records=5), T),
        "local_evidence": Case(lambda e: healthkit.ExitDiagnoser(local_evidence=0), T),
    },
    "healthkit.ExitDiagnoser.diagnose": {
        "name": Case(lambda e: _diagnose(name=5), T),
        "pid": Case(lambda e: _diagnose(pid="1"), T),
        "start_time": Case(lambda e: _diagnose(pid=1, start_time=-1)),
    },
    "healthkit.ProcessWatch": {
        "target": [
            Case(lambda e: ProcessWatch("abc"), T),
            Case(lambda e: ProcessWatch(2**40), healthkit.NoSuchProcessError, "pid"),
            Case(lambda e: ProcessWatch(os.getpid()), label="itself"),
        ],
        "name": Case(lambda e: ProcessWatch(e.child.pid, name=5), T),
        "proc_root": Case(lambda e: ProcessWatch(e.child.pid, proc_root=None), T),
        "use_pidfd": Case(lambda e: ProcessWatch(e.child.pid, use_pidfd="no"), T),
    },
    "healthkit.ProgressWatch": {
        "stall_timeout": [
            Case(lambda e: healthkit.ProgressWatch(0)),
            Case(lambda e: healthkit.ProgressWatch(0.01)),
            Case(lambda e: healthkit.ProgressWatch(NAN)),
            Case(lambda e: healthkit.ProgressWatch("1"), T),
        ],
        "name": Case(lambda e: healthkit.ProgressWatch(1, name=5), T),
        "who": Case(lambda e: healthkit.ProgressWatch(1, who=5), T),
        "callers": Case(lambda e: healthkit.ProgressWatch(1, callers=1), T),
    },
    "healthkit.WatchSet": {
        "watches": [Case(lambda e: WatchSet(5), T), Case(lambda e: WatchSet([e.child.pid]), T)],
    },
    "healthkit.ProcessWatch.send_signal": {
        "sig": [
            Case(lambda e: _watch_of(e, lambda w: w.send_signal(999)), label="999"),
            Case(lambda e: _watch_of(e, lambda w: w.send_signal(-1)), label="-1"),
            Case(lambda e: _watch_of(e, lambda w: w.send_signal("SIGTERM")), T, label="name"),
        ],
    },
    "healthkit.WatchSet.add": {"watch": Case(lambda e: _in_watch_set(lambda ws: ws.add("x")), T)},
    "healthkit.WatchSet.remove": {
        "watch": Case(lambda e: _in_watch_set(lambda ws: ws.remove("x")), T)
    },
    "healthkit.dump_helper_stacks": {
        "pids": [
            Case(lambda e: healthkit.dump_helper_stacks(5), T),
            Case(lambda e: healthkit.dump_helper_stacks([-1]), healthkit.NoSuchProcessError),
        ],
        "below": Case(lambda e: healthkit.dump_helper_stacks([], below="x"), T),
        "directory": Case(lambda e: healthkit.dump_helper_stacks([], directory=5), T),
        "timeout": Case(lambda e: healthkit.dump_helper_stacks([], timeout=-1)),
    },
    "healthkit.record_dir": {},
    "healthkit.record_exception": {
        "func": Case(lambda e: healthkit.record_exception(5), T),
        "stacks": Case(lambda e: healthkit.record_exception(stacks="x"), T),
    },
    "healthkit.stop": {
        "targets": [
            Case(lambda e: healthkit.stop(5), T),
            Case(lambda e: healthkit.stop(["abc"]), T, label="str"),
            Case(lambda e: healthkit.stop([-1]), label="-1"),
            Case(lambda e: healthkit.stop([0]), label="0"),
            Case(lambda e: healthkit.stop([2**40]), label="2**40"),
        ],
        "request": Case(lambda e: healthkit.stop([e.child], request=5), T),
        "grace": Case(lambda e: healthkit.stop([e.child], grace=-1)),
        "kill_after": Case(lambda e: healthkit.stop([e.child], kill_after=NAN)),
        "kill_timeout": Case(lambda e: healthkit.stop([e.child], kill_timeout="5"), T),
        "name": Case(lambda e: healthkit.stop([e.child], name=5), T),
        "log": Case(lambda e: healthkit.stop([e.child], log="healthkit"), T),
    },
    "healthkit.actions.FailureEvent": {
        "diagnosis": Case(lambda e: FailureEvent(5, "wd"), T),
        "watchdog_name": Case(lambda e: FailureEvent(_diagnosis(), 5), T),
        "owner_pid": Case(lambda e: FailureEvent(_diagnosis(), "wd", "1"), T),
        "brief": [
            Case(lambda e: FailureEvent(_diagnosis, "wd"), T, label="missing"),
            Case(lambda e: FailureEvent(_diagnosis, "wd", brief="x"), T),
        ],
    },
    "healthkit.actions.default_actions": {
        "exit_code": Case(lambda e: actions.default_actions(0)),
    },
    "healthkit.actions.exit_process": {
        "code": Case(lambda e: actions.exit_process(256)),
        "terminate_children": Case(lambda e: actions.exit_process(1, "no"), T),
    },
    "healthkit.actions.log_diagnosis": {
        "logger": Case(lambda e: actions.log_diagnosis("healthkit"), T),
        "level": Case(lambda e: actions.log_diagnosis(level="ERROR"), T),
    },
    "healthkit.actions.raise_in_main_thread": {
        "signum": [
            Case(lambda e: actions.raise_in_main_thread(signal.SIGKILL), label="SIGKILL"),
            Case(lambda e: actions.raise_in_main_thread(signal.SIGTERM), label="SIGTERM"),
            Case(lambda e: actions.raise_in_main_thread("SIGUSR1"), T),
        ],
    },
    "healthkit.actions.raise_in_cell": {
        "shell": Case(lambda e: actions.raise_in_cell(object()), T),
        "signum": Case(
            lambda e: actions.raise_in_cell(
                type("Shell", (), {"events": None, "input_transformers_post": []})(),
                signal.SIGKILL,
            )
        ),
    },
    "healthkit.actions.write_torchelastic_error_file": {
        "path": Case(lambda e: actions.write_torchelastic_error_file(5), T),
    },
    "healthkit.lowlevel.publish_job_failure": {
        "failure": Case(lambda e: lowlevel.publish_job_failure("oom"), T),  # type: ignore[arg-type]
        "name": Case(lambda e: lowlevel.publish_job_failure(ValueError("x"), name=5), T),  # type: ignore[arg-type]
    },
    "healthkit.lowlevel.children": {
        "pid": Case(lambda e: lowlevel.children("1"), T),
        "proc_root": Case(lambda e: lowlevel.children(1, proc_root=5), T),
    },
    "healthkit.lowlevel.descendants": {
        "pid": Case(lambda e: lowlevel.descendants(-1), healthkit.NoSuchProcessError),
        "proc_root": Case(lambda e: lowlevel.descendants(1, proc_root=b"/proc"), T),
    },
    "healthkit.lowlevel.MemoryCgroup": {
        "version": [
            Case(lambda e: lowlevel.MemoryCgroup(3, "/sys/fs/cgroup")),
            Case(lambda e: lowlevel.MemoryCgroup("2", "/sys/fs/cgroup"), T),
        ],
        "path": Case(lambda e: lowlevel.MemoryCgroup(2, 5), T),  # type: ignore[arg-type]
        "root": Case(lambda e: lowlevel.MemoryCgroup(2, "/x", None), T),  # type: ignore[arg-type]
    },
    "healthkit.lowlevel.find_memory_cgroup": {
        "pid": [
            Case(lambda e: lowlevel.find_memory_cgroup("1"), T),
            Case(lambda e: lowlevel.find_memory_cgroup(-1), healthkit.NoSuchProcessError),
        ],
        "proc_root": Case(lambda e: lowlevel.find_memory_cgroup(proc_root=5), T),  # type: ignore[arg-type]
        "cgroup_root": Case(lambda e: lowlevel.find_memory_cgroup(cgroup_root=""), T),
    },
    "healthkit.lowlevel.read_proc_stat": {
        "pid": Case(lambda e: lowlevel.read_proc_stat(1.0), T),
        "proc_root": Case(lambda e: lowlevel.read_proc_stat(1, proc_root=None), T),
    },
    "healthkit.lowlevel.current_episode": {
        "history": Case(lambda e: lowlevel.current_episode(5, 0.0, 1.0), T),
        "now": Case(lambda e: lowlevel.current_episode([], NAN, 1.0), T),
        "grace": Case(lambda e: lowlevel.current_episode([], 0.0, -1.0)),
        "survived": [
            Case(lambda e: lowlevel.current_episode([], 0.0, 1.0, 5.0), T),  # type: ignore[arg-type]
            Case(lambda e: lowlevel.current_episode([], 0.0, 1.0, ["1"]), T),  # type: ignore[list-item]
        ],
    },
    "healthkit.lowlevel.decide": {
        "status": Case(lambda e: lowlevel.decide(-15, armed=True), T),
        "armed": Case(lambda e: lowlevel.decide(_status(), armed=1), T),
        "on_clean_exit": Case(lambda e: lowlevel.decide(_status(), armed=True, on_clean_exit="x")),
        "stopped_by_healthkit": Case(
            lambda e: lowlevel.decide(None, armed=True, stopped_by_healthkit=None), T
        ),
        "stop": Case(lambda e: lowlevel.decide(_status(), armed=True, stop=1.0), T),
        "stop_grace": Case(lambda e: lowlevel.decide(_status(), armed=True, stop_grace=-1)),
        "now": Case(lambda e: lowlevel.decide(_status(), armed=True, now="0"), T),
        "same_group": Case(lambda e: lowlevel.decide(None, armed=True, same_group="y"), T),
        "owner_exiting": Case(lambda e: lowlevel.decide(None, armed=True, owner_exiting=0), T),
        "owner_gone": Case(lambda e: lowlevel.decide(None, armed=True, owner_gone=None), T),
    },
    "healthkit.lowlevel.EndingClassifier": {
        "name": Case(lambda e: lowlevel.EndingClassifier(5), T),  # type: ignore[arg-type]
        "stop_grace": [Case(lambda e: lowlevel.EndingClassifier(stop_grace=-1)),
                       Case(lambda e: lowlevel.EndingClassifier(stop_grace="35"), T)],  # type: ignore[arg-type]
        "log": Case(lambda e: lowlevel.EndingClassifier(log="healthkit"), T),  # type: ignore[arg-type]
    },
    "healthkit.lowlevel.LeaseServer": {
        "on_end": Case(lambda e: lowlevel.LeaseServer(None), T),  # type: ignore[arg-type]
        "connection_timeout": [
            Case(lambda e: lowlevel.LeaseServer(print, connection_timeout=0)),
            Case(lambda e: lowlevel.LeaseServer(print, connection_timeout=NAN)),
            Case(lambda e: lowlevel.LeaseServer(print, connection_timeout=1.5), label="below-2"),
            Case(lambda e: lowlevel.LeaseServer(print, connection_timeout="10"), T),  # type: ignore[arg-type]
        ],
        "bind_host": Case(lambda e: lowlevel.LeaseServer(print, bind_host=None), T),  # type: ignore[arg-type]
    },
    "healthkit.lowlevel.Lease.open": {
        "addresses": [
            Case(lambda e: lowlevel.Lease.open([], _SERVER_ID), label="empty"),
            Case(lambda e: lowlevel.Lease.open("127.0.0.1:1", _SERVER_ID), T, label="str"),  # type: ignore[arg-type]
            Case(lambda e: lowlevel.Lease.open([("127.0.0.1", "1")], _SERVER_ID), T),  # type: ignore[list-item]
            Case(lambda e: lowlevel.Lease.open([("127.0.0.1", 0)], _SERVER_ID), label="port"),
        ],
        "server_id": [
            Case(lambda e: lowlevel.Lease.open([("127.0.0.1", 1)], "HKGLT1")),
            Case(lambda e: lowlevel.Lease.open([("127.0.0.1", 1)], _SERVER_ID.upper())),
            Case(lambda e: lowlevel.Lease.open([("127.0.0.1", 1)], None), T),  # type: ignore[arg-type]
        ],
        "connection_timeout": [
            Case(lambda e: lowlevel.Lease.open(_ADDR, _SERVER_ID, connection_timeout=-1)),
            Case(lambda e: lowlevel.Lease.open(_ADDR, _SERVER_ID, connection_timeout=NAN)),
        ],
        "connect_timeout": Case(
            lambda e: lowlevel.Lease.open(_ADDR, _SERVER_ID, connect_timeout=0)
        ),
    },
    "healthkit.lowlevel.decide_stall": {
        "quiet_for": [Case(lambda e: lowlevel.decide_stall("1", stall_timeout=1, armed=True), T),
                      Case(lambda e: lowlevel.decide_stall(-1, stall_timeout=1, armed=True), T)],
        "stall_timeout": Case(lambda e: lowlevel.decide_stall(1, stall_timeout=-1, armed=True)),
        "armed": Case(lambda e: lowlevel.decide_stall(1, stall_timeout=1, armed=1), T),
        "stop": Case(lambda e: lowlevel.decide_stall(1, stall_timeout=1, armed=True, stop=1.0), T),
        "stop_grace": Case(
            lambda e: lowlevel.decide_stall(1, stall_timeout=1, armed=True, stop_grace=NAN)
        ),
        "now": Case(lambda e: lowlevel.decide_stall(1, stall_timeout=1, armed=True, now="0"), T),
        "owner_exiting": Case(
            lambda e: lowlevel.decide_stall(1, stall_timeout=1, armed=True, owner_exiting=0), T
        ),
    },
    "healthkit.lowlevel.enable_quiet_stack_dumps": {
        "directory": Case(lambda e: lowlevel.enable_quiet_stack_dumps(5), T),  # type: ignore[arg-type]
    },
    "healthkit.lowlevel.die_with_parent": {
        "parent_pid": Case(lambda e: lowlevel.die_with_parent("1"), T),
        "sig": Case(lambda e: lowlevel.die_with_parent(os.getppid(), sig=99999)),
    },
    "healthkit.lowlevel.flush_logging": {
        "log": Case(lambda e: lowlevel.flush_logging("healthkit"), T),  # type: ignore[arg-type]
    },
    "healthkit.lowlevel.dump_stacks": {
        "directory": Case(lambda e: lowlevel.dump_stacks(5, []), T),
        "pids": Case(lambda e: lowlevel.dump_stacks(str(e.tmp), 5), T),
        "signum": Case(lambda e: lowlevel.dump_stacks(str(e.tmp), [], signum=signal.SIGKILL)),
        "timeout": Case(lambda e: lowlevel.dump_stacks(str(e.tmp), [], timeout=math.inf)),
    },
    "healthkit.lowlevel.enable_stack_dumps": {
        "directory": Case(lambda e: lowlevel.enable_stack_dumps(5), T),
        "signum": Case(lambda e: lowlevel.enable_stack_dumps(str(e.tmp), signum=signal.SIGKILL)),
    },
    "healthkit.lowlevel.note_stop": {
        "signum": [
            Case(lambda e: lowlevel.note_stop(99999), label="99999"),
            *(
                Case(lambda e, s=s: lowlevel.note_stop(s), label=s.name)
                for s in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD, signal.SIGUSR1)
            ),
        ],
    },
    "healthkit.lowlevel.set_thread_name": {"name": Case(lambda e: lowlevel.set_thread_name(5), T)},
    "healthkit.lowlevel.stop_like": {"status": Case(lambda e: lowlevel.stop_like(-15), T)},
    "healthkit._shared.sysv_shm_segments": {
        "proc_root": Case(lambda e: _shared.sysv_shm_segments(5), T),  # type: ignore[arg-type]
    },
    "healthkit._shared.check_bool": {
        "value": Case(lambda e: _shared.check_bool(1, "flag"), T, "flag")
    },
    "healthkit._shared.check_bound": {
        "value": Case(lambda e: _shared.check_bound(0, "bound"), named="bound")
    },
    "healthkit._shared.check_callable": {
        "value": Case(lambda e: _shared.check_callable(5, "fn"), T, "fn")
    },
    "healthkit._shared.check_choice": {
        "value": Case(lambda e: _shared.check_choice("c", ("a", "b"), "mode"), named="mode")
    },
    "healthkit._shared.check_exit_code": {
        "value": Case(lambda e: _shared.check_exit_code(0, "code"), named="code")
    },
    "healthkit._shared.check_int": {
        "value": Case(lambda e: _shared.check_int(0, "n", minimum=1), named="n")
    },
    "healthkit._shared.check_seconds": {
        "value": Case(lambda e: _shared.check_seconds(None, "wait"), named="wait")
    },
    "healthkit._shared.check_timeout": {
        "value": Case(lambda e: _shared.check_timeout(-1, "wait"), named="wait")
    },
    "healthkit.lowlevel.env_seconds": {
        "name": Case(lambda e: lowlevel.env_seconds("", 5), T),
        "default": Case(
            lambda e: lowlevel.env_seconds("HEALTHKIT_TEST_X", 0),
            named="default of $HEALTHKIT_TEST_X",
        ),
        "strict": [
            Case(lambda e: lowlevel.env_seconds("HEALTHKIT_TEST_X", 5, strict="yes"), T),
            *(
                Case(
                    lambda e, v=v: _with_env(
                        v, lambda: lowlevel.env_seconds("HEALTHKIT_TEST_X", 5, strict=True)
                    ),
                    named="HEALTHKIT_TEST_X",
                    label=repr(v),
                )
                for v in (" 5", "", "5 ")
            ),
        ],
        "multiplier": Case(lambda e: lowlevel.env_seconds("HEALTHKIT_TEST_X", 5, multiplier=0)),
    },
    "healthkit.lowlevel.read_env_seconds": {
        "name": Case(lambda e: lowlevel.read_env_seconds(None, 5), T),
        "default": Case(
            lambda e: lowlevel.read_env_seconds("HEALTHKIT_TEST_X", NAN),
            named="default of $HEALTHKIT_TEST_X",
        ),
        "strict": Case(lambda e: lowlevel.read_env_seconds("HEALTHKIT_TEST_X", 5, strict=1), T),
        "multiplier": Case(
            lambda e: lowlevel.read_env_seconds("HEALTHKIT_TEST_X", 5, multiplier="3"), T
        ),
    },
}

#: Public callables that take no input from a caller: values healthkit builds and returns,
#: errors it raises, enums and type aliases.
CORE_EXEMPT = {
    **{
        f"healthkit.{n}": "a value healthkit returns"
        for n in (
            "Cause",
            "Diagnosis",
            "ExitStatus",
            "Heartbeat",  # made by ProgressWatch (its .heartbeat), never by the user
            "HelperException",
            "PartyReport",
            "StopReport",
        )
    },
    **{
        f"healthkit.lowlevel.{n}": "a value healthkit returns"
        for n in ("Decision", "ProcStat", "StopEpisode", "Verdict")
    },
    "healthkit.actions.Action": "a protocol (any callable taking a FailureEvent)",
    "healthkit.lowlevel.note_stop_survived": "takes no argument",
    "healthkit.lowlevel.Lease": "made by Lease.open (its row), never by the user",
    "healthkit.lowlevel.OnCleanExit": "a type alias",
    "healthkit.lowlevel.EnvValueWarning": "a warning category",
    **{
        f"healthkit.{n}": "an error (its pickling is tested above)"
        for n in healthkit.__all__
        if isinstance(getattr(healthkit, n), type)
        and issubclass(getattr(healthkit, n), BaseException)
    },
}
#: Arguments that configure a validator: given by the code that calls it, not by its user.
CORE_EXEMPT_ARGUMENTS = {
    f"healthkit._shared.{fn}({arg})": "the validator's own configuration, given by code"
    for fn, args in {
        "check_bool": ["what"],
        "check_bound": ["what"],
        "check_callable": ["what"],
        "check_choice": ["choices", "what"],
        "check_exit_code": ["what"],
        "check_int": ["what", "minimum", "maximum"],
        "check_seconds": ["what"],
        "check_timeout": ["what", "allow_none", "positive", "minimum"],
    }.items()
    for arg in args
}


def test_every_public_callable_has_a_row() -> None:
    missing = missing_rows(PUBLIC_MODULES, CORE, CORE_EXEMPT, CORE_EXEMPT_ARGUMENTS)
    assert not missing, f"public API without a bad-input row in CORE: {missing}"


def test_every_validator_the_integrations_share_has_a_row() -> None:
    """Not public, but what refuses the integrations' bad input: the same convention."""
    exempt = {
        "healthkit._shared.publish": "called by code at import, with its own names",
        "healthkit._shared.at_exit": "called by the integrations' code with its own steps",
    }
    missing = missing_rows([_shared], CORE, exempt, CORE_EXEMPT_ARGUMENTS)
    assert not missing, f"shared validators without a bad-input row in CORE: {missing}"


@pytest.mark.parametrize(("arg", "case"), cases(CORE))
def test_bad_input_is_refused_at_the_call(arg: str, case: Case, env: Env) -> None:
    check(arg, case, env)
    assert env.child.poll() is None  # nothing was signalled on the way
