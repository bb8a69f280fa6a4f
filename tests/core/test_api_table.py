"""The public API's error convention, table-driven: every public constructor and function of
``healthkit``, ``healthkit.actions`` and ``healthkit.lowlevel`` has a row with a bad value of
each argument it takes, and must refuse it at the call with a typed
:class:`healthkit.HealthkitError` that names the argument. A public callable without a row
fails the test, so new API cannot skip the convention. Also: public module names, pickling
of every exported error, and the deprecated names that still work for one release."""

from __future__ import annotations

import inspect
import pickle
import subprocess
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

import healthkit
from healthkit import (
    DisarmableWatchdog,
    HealthkitError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
)

pytestmark = pytest.mark.security


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(30)


# ----------------------------------------------------------------------------- deprecated
@pytest.mark.parametrize(
    "old", ["InvalidTimeoutError", "InvalidExitCodeError", "InvalidEnvValueError"]
)
def test_old_error_names_are_aliases_that_warn(old: str) -> None:
    with pytest.warns(DeprecationWarning, match=f"healthkit.{old} is deprecated"):
        alias = getattr(healthkit, old)
    assert alias is InvalidArgumentError
    assert old not in healthkit.__all__
    with pytest.raises(AttributeError):
        healthkit.NoSuchName  # noqa: B018  # type: ignore[attr-defined]


def test_old_error_names_still_catch_what_they_caught() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        old_timeout = healthkit.InvalidTimeoutError  # type: ignore[attr-defined]
    with pytest.raises(old_timeout):
        DisarmableWatchdog(kill_after=-1)


def test_stop_term_timeout_is_the_old_name_of_kill_after(child: subprocess.Popen[bytes]) -> None:
    with pytest.warns(DeprecationWarning, match="term_timeout= is deprecated.*kill_after="):
        report = healthkit.stop([child], term_timeout=0.2)  # type: ignore[call-arg]
    assert report.terminated == (child.pid,)
    assert child.returncode is not None


def test_both_names_at_once_are_refused(child: subprocess.Popen[bytes]) -> None:
    with (
        pytest.warns(DeprecationWarning),
        pytest.raises(InvalidArgumentError, match="term_timeout"),
    ):
        healthkit.stop([child], term_timeout=1.0, kill_after=2.0)  # type: ignore[call-arg]
    assert child.poll() is None  # refused before anything was signalled


def test_watchdog_kill_grace_is_the_old_name_of_kill_after() -> None:
    with pytest.warns(DeprecationWarning, match="kill_grace= is deprecated"):
        wd = DisarmableWatchdog(kill_grace=3.0)  # type: ignore[call-arg]
    assert wd.kill_after == 3.0
    with pytest.warns(DeprecationWarning, match="kill_grace is deprecated"):
        assert wd.kill_grace == 3.0
    with pytest.warns(DeprecationWarning), pytest.raises(InvalidArgumentError, match="kill_grace"):
        DisarmableWatchdog(kill_grace=-1)  # type: ignore[call-arg]


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
