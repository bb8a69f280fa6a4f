"""The public API's error convention, table-driven: every public constructor and function of
``healthkit``, ``healthkit.actions`` and ``healthkit.lowlevel`` has a row with a bad value of
each argument it takes, and must refuse it at the call with a typed
:class:`healthkit.HealthkitError` that names the argument. A public callable without a row
fails the test, so new API cannot skip the convention. Also: public module names, pickling
of every exported error, and the deprecated names that still work for one release."""

from __future__ import annotations

import subprocess
import sys
import warnings
from collections.abc import Iterator

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
