"""Bad input over the public API and the CLI: wrong types, out-of-range numbers, NaN/inf,
values longer than the OS can wait, garbage environment values, malformed kernel files.
Each gets a typed :class:`healthkit.HealthkitError` naming what to change, and leaks nothing
(the suite's leak check runs after every test)."""

from __future__ import annotations

import logging
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import healthkit
from healthkit import (
    BoundedBarrier,
    Cause,
    DisarmableWatchdog,
    ExitDiagnoser,
    HealthkitError,
    InterpreterShutdownError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    NoSuchProcessError,
    ProcessWatch,
    WatchSet,
)
from healthkit._diagnose.evidence import MemoryCgroup, find_memory_cgroup
from healthkit._os.proc import read_proc_stat
from healthkit.lowlevel import MAX_TIMEOUT_S, EnvValueWarning

pytestmark = pytest.mark.security

THIRTY_DAYS = 30 * 86400.0
ENV = "HEALTHKIT_TEST_BOUND_SECONDS"


@pytest.fixture
def watch(child: subprocess.Popen[bytes]) -> Iterator[ProcessWatch]:
    with ProcessWatch(child) as w:
        yield w


def _raises(fn: Callable[[], Any], error: type[BaseException], *names: str) -> BaseException:
    with pytest.raises(error) as info:
        fn()
    assert isinstance(info.value, HealthkitError)
    for name in names:
        assert name in str(info.value), (name, str(info.value))
    return info.value


BAD_TIMEOUTS = [math.nan, math.inf, -math.inf, -1.0, THIRTY_DAYS, 2.2e6, 10**400, "1", [1]]


# ----------------------------------------------------------------------------- timeouts
@pytest.mark.parametrize("value", BAD_TIMEOUTS, ids=repr)
def test_process_watch_wait_rejects(watch: ProcessWatch, value: Any) -> None:
    err = _raises(lambda: watch.wait(value), InvalidArgumentError, "timeout")
    assert isinstance(err, InvalidArgumentError) and err.argument == "timeout"
    assert watch.poll() is None  # still usable


@pytest.mark.parametrize("value", BAD_TIMEOUTS, ids=repr)
def test_watch_set_wait_rejects(watch: ProcessWatch, value: Any) -> None:
    with WatchSet([watch]) as ws:
        _raises(lambda: ws.wait(value), InvalidArgumentError, "timeout")


def test_the_longest_accepted_wait_does_not_overflow(
    watch: ProcessWatch, child: subprocess.Popen[bytes]
) -> None:
    """The non-firing twin: MAX_TIMEOUT_S itself is waited on (and ended by the death)."""
    child.kill()
    assert watch.wait(MAX_TIMEOUT_S) is not None
    with WatchSet() as ws:
        ws.wake()
        assert ws.wait(MAX_TIMEOUT_S) == []


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"rss_sample_interval": THIRTY_DAYS}, ["rss_sample_interval", "longer than the OS"]),
        ({"rss_sample_interval": 0}, ["rss_sample_interval", ">= 0.01"]),
        ({"rss_sample_interval": math.nan}, ["rss_sample_interval"]),
        ({"rss_sample_interval": "5"}, ["rss_sample_interval"]),
        ({"kill_after": math.inf}, ["kill_after"]),
        ({"kill_after": THIRTY_DAYS}, ["kill_after"]),
        ({"kill_after": None}, ["kill_after"]),
    ],
)
def test_watchdog_rejects_bad_intervals(kwargs: dict[str, Any], names: list[str]) -> None:
    _raises(lambda: DisarmableWatchdog(**kwargs), InvalidArgumentError, *names)


def test_watchdog_disarm_rejects_a_bad_timeout() -> None:
    wd = DisarmableWatchdog()
    _raises(lambda: wd.disarm(THIRTY_DAYS), InvalidArgumentError, "timeout")


def test_a_slow_rss_interval_still_fires(child: subprocess.Popen[bytes]) -> None:
    """The review's case was a 30-day interval that killed the watcher thread: the longest
    accepted one must keep the watcher alive and fire on a SIGKILL."""
    fired: list[healthkit.actions.FailureEvent] = []
    wd = DisarmableWatchdog(
        [child], actions=[fired.append], rss_sample_interval=MAX_TIMEOUT_S
    ).arm()
    try:
        child.kill()
        deadline = time.monotonic() + 30
        while not fired and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        wd.disarm()
    assert fired and fired[0].diagnosis.signal is signal.SIGKILL


@pytest.mark.parametrize(
    ("timeout", "names"),
    [
        (0, ["timeout must be > 0"]),
        (-1, ["timeout"]),
        (math.nan, ["timeout"]),
        (3e6, ["timeout", "longer than the OS can wait"]),
        (MAX_TIMEOUT_S, ["timeout + 30s margin"]),
        ("10", ["timeout"]),
    ],
)
def test_barrier_rejects_bad_bounds(timeout: Any, names: list[str]) -> None:
    _raises(lambda: BoundedBarrier(1, timeout=timeout), InvalidArgumentError, *names)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"parties": "2"}, InvalidArgumentTypeError),
        ({"parties": -1}, InvalidArgumentError),
        ({"parties": 10**9}, InvalidArgumentError),
        ({"parties": 1, "abort_grace": math.inf}, InvalidArgumentError),
    ],
)
def test_barrier_rejects_bad_arguments(kwargs: dict[str, Any], error: type[Exception]) -> None:
    kwargs.setdefault("timeout", 5)
    _raises(lambda: BoundedBarrier(**kwargs), error)


# ----------------------------------------------------------------------------- env values
@pytest.mark.parametrize("default", [-5, 0, math.nan, math.inf, THIRTY_DAYS, "5", None])
def test_env_defaults_are_validated(default: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    _raises(lambda: healthkit.lowlevel.env_seconds(ENV, default), InvalidArgumentError, ENV)
    _raises(
        lambda: healthkit.lowlevel.read_env_seconds(ENV, default, multiplier=3),
        InvalidArgumentError,
        ENV,
    )


def test_env_default_times_multiplier_must_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    _raises(
        lambda: healthkit.lowlevel.env_seconds(ENV, 1e6, multiplier=3.0), InvalidArgumentError, ENV
    )


@pytest.mark.parametrize("multiplier", [0, -3, math.nan, math.inf, "3"])
def test_env_multiplier_is_validated(multiplier: Any) -> None:
    _raises(
        lambda: healthkit.lowlevel.env_seconds(ENV, 5, multiplier=multiplier),
        InvalidArgumentError,
        "multiplier",
    )


@pytest.mark.parametrize(
    "raw",
    ["abc", "nan", "inf", "-inf", "-1", "0", "1e300", "2.2e6", "0x10", "5 s", "\udcff",
     "1e-320", "0.0001", "1e3", "1_0", "\u0661\u0660", "+5", "5.0.1", "."],
)  # fmt: skip
def test_garbage_env_values(raw: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, raw)
    with pytest.warns(EnvValueWarning, match=ENV):
        assert healthkit.lowlevel.env_seconds(ENV, 7) == 7.0
    err = _raises(
        lambda: healthkit.lowlevel.env_seconds(ENV, 7, strict=True), InvalidArgumentError, ENV
    )
    assert isinstance(err, InvalidArgumentError) and err.argument == ENV


@pytest.mark.parametrize(
    ("raw", "seconds"), [("30", 30.0), ("2.5", 2.5), (".5", 0.5), ("7.", 7.0),
                         ("0.001", 0.001), ("2147483", 2147483.0)]
)  # fmt: skip
def test_plain_decimal_env_values_are_read(
    raw: str, seconds: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The forms docs/security.md names, down to ENV_SECONDS_MIN: read silently."""
    monkeypatch.setenv(ENV, raw)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert healthkit.lowlevel.read_env_seconds(ENV, 7, strict=True) == (seconds, True)


@pytest.mark.parametrize("raw", [" 9", "9 ", " 9 ", "", " "])
def test_strict_takes_a_value_exactly_as_written(raw: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Strict: an empty value (a script lost what it meant to set) and spaces are refused,
    naming the variable; lenient: spaces are trimmed, and an empty value is unset, silently."""
    monkeypatch.setenv(ENV, raw)
    err = _raises(
        lambda: healthkit.lowlevel.env_seconds(ENV, 7, strict=True), InvalidArgumentError, ENV
    )
    assert ("empty" if raw == "" else "padded with spaces") in str(err)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        expected = (9.0, True) if raw.strip() else (7.0, False)
        assert healthkit.lowlevel.read_env_seconds(ENV, 7) == expected


def test_env_value_too_long_once_multiplied(monkeypatch: pytest.MonkeyPatch) -> None:
    """The review's barrier bound: 1e6 s x 3 overflowed in parent and worker."""
    monkeypatch.setenv(ENV, "1000000")
    with pytest.warns(EnvValueWarning, match="more than the OS can wait"):
        got = healthkit.lowlevel.read_env_seconds(ENV, 10, multiplier=3.0)
    assert got == (10.0, False)
    _raises(
        lambda: healthkit.lowlevel.env_seconds(ENV, 10, strict=True, multiplier=3.0),
        InvalidArgumentError,
        ENV,
        "too long",
    )
    monkeypatch.setenv(ENV, "100000")  # the twin: fits, used as given
    value, from_env = healthkit.lowlevel.read_env_seconds(ENV, 10, multiplier=3.0)
    assert (value, from_env) == (1e5, True)
    barrier = BoundedBarrier(1, timeout=3 * value)
    barrier.close()


# ----------------------------------------------------------------------------- exit codes
@pytest.mark.parametrize("code", [0, 256, -1, 1000, "1", 1.5, True, None])
def test_exit_codes_outside_1_to_255_are_rejected(code: Any) -> None:
    _raises(lambda: DisarmableWatchdog(exit_code=code), InvalidArgumentError, "exit_code")
    _raises(lambda: healthkit.actions.exit_process(code), InvalidArgumentError, "1..255")
    _raises(lambda: healthkit.actions.default_actions(code), InvalidArgumentError, "1..255")


def test_exit_code_255_is_what_the_launcher_sees() -> None:
    """The twin of 256-reads-as-0: the highest accepted code arrives intact."""
    script = textwrap.dedent("""
        import healthkit
        from healthkit import ExitDiagnoser
        from healthkit.actions import FailureEvent
        d = ExitDiagnoser(kmsg_path=None).diagnose(-9, name="helper", pid=4242)
        healthkit.actions.exit_process(255)(FailureEvent(d, "wd"))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    assert proc.returncode == 255


# ----------------------------------------------------------------------------- pids, targets
@pytest.mark.parametrize("target", ["abc", None, 1.5, b"1", object()], ids=repr)
def test_watchdog_rejects_what_it_cannot_watch(target: Any) -> None:
    err = _raises(lambda: DisarmableWatchdog([target]), InvalidArgumentTypeError, "watches")
    assert isinstance(err, TypeError)
    err = _raises(lambda: DisarmableWatchdog().watch(target), InvalidArgumentTypeError, "target")
    assert isinstance(err, TypeError)


@pytest.mark.parametrize("pid", [2**31, 2**63, 10**30, 0, -1])
def test_out_of_range_pids_name_no_process(pid: int) -> None:
    _raises(lambda: ProcessWatch(pid), NoSuchProcessError, "pid")
    _raises(lambda: DisarmableWatchdog([pid]), NoSuchProcessError)


@pytest.mark.parametrize("pid", ["1234", 1234.0, True, None])
def test_die_with_parent_rejects_a_non_pid_without_killing_anyone(pid: Any) -> None:
    """The review's ``die_with_parent("1234")`` SIGKILLed the caller at once; here the call
    runs in a child so that a regression shows as a SIGKILL instead of killing pytest."""
    script = textwrap.dedent(f"""
        import healthkit
        try:
            healthkit.lowlevel.die_with_parent({pid!r})
        except healthkit.InvalidArgumentTypeError as e:
            assert e.argument == "parent_pid", e
            print("rejected:", e)
    """)
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, (proc.returncode, proc.stderr)
    assert "rejected: parent_pid must be an int" in proc.stdout


def test_die_with_parent_rejects_a_bad_signal() -> None:
    _raises(
        lambda: healthkit.lowlevel.die_with_parent(os.getppid(), 999), InvalidArgumentError, "sig"
    )


def test_diagnose_rejects_impossible_return_codes() -> None:
    d = ExitDiagnoser(kmsg_path=None, cgroup_root="/nonexistent")
    for rc in (256, -65, 10**20):
        _raises(lambda rc=rc: d.diagnose(rc), InvalidArgumentError, "not a possible exit code")
    _raises(lambda: d.diagnose("1"), InvalidArgumentTypeError)  # type: ignore[arg-type]
    _raises(lambda: d.diagnose(1.5), InvalidArgumentTypeError)  # type: ignore[arg-type]
    _raises(lambda: d.diagnose(-9, pid=2**40), NoSuchProcessError)
    _raises(lambda: d.diagnose(-9, pid=42, start_time="7"),  # type: ignore[arg-type]
            InvalidArgumentTypeError, "start_time")
    _raises(lambda: d.diagnose(-9, pid=42, start_time=-1), InvalidArgumentError, "start_time")
    assert d.diagnose(255).cause is Cause.ERROR_EXIT
    assert d.diagnose(-64).cause is Cause.UNKNOWN


def test_stack_dump_arguments_are_validated(tmp_path: Path) -> None:
    _raises(
        lambda: healthkit.lowlevel.dump_stacks(str(tmp_path), ["1"]),
        InvalidArgumentTypeError,
        "pids",
    )
    _raises(
        lambda: healthkit.lowlevel.dump_stacks(str(tmp_path), [1], timeout=math.nan),
        InvalidArgumentError,
        "timeout",
    )
    _raises(
        lambda: healthkit.lowlevel.enable_stack_dumps(str(tmp_path), 999),
        InvalidArgumentError,
        "signum",
    )
    _raises(lambda: healthkit.dump_helper_stacks("123"), InvalidArgumentTypeError, "pids")
    _raises(lambda: healthkit.dump_helper_stacks([0]), NoSuchProcessError, "pids")
    _raises(lambda: healthkit.dump_helper_stacks([1], timeout=-1), InvalidArgumentError,
            "timeout")


def test_arm_during_interpreter_shutdown_says_so() -> None:
    script = textwrap.dedent("""
        import atexit, subprocess, sys
        import healthkit
        helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        def late():
            try:
                healthkit.DisarmableWatchdog([helper]).arm()
            except healthkit.InterpreterShutdownError as e:
                print("refused:", e)
            finally:
                helper.kill()
                helper.wait()
        atexit.register(late)
    """)
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert (
        "refused: healthkit watchdog: arm() was called during interpreter shutdown" in proc.stdout
    )
    assert issubclass(InterpreterShutdownError, RuntimeError)


# ----------------------------------------------------------------------------- bad files
def test_non_utf8_cgroup_files_read_as_unknown(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cg = tmp_path / "cg"
    cg.mkdir()
    (cg / "memory.events").write_bytes(b"oom 1\noom_kill \xff\xfe\n")
    (cg / "memory.peak").write_bytes(b"\xff\xfe\xfd")
    (cg / "memory.max").write_bytes(b"12\x00garbage")
    group = MemoryCgroup(2, str(cg))
    with caplog.at_level(logging.WARNING, logger="healthkit"):
        assert group.oom_kills() is None
        assert group.peak_bytes() is None
        assert group.limit_bytes() is None
    assert "memory.peak is malformed (not UTF-8" in caplog.text
    assert "memory.max is malformed (not an integer" in caplog.text
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_bytes(b"0::/\xff\n")
    assert find_memory_cgroup(proc_root=str(proc), cgroup_root=str(tmp_path)) is None


def test_a_watcher_survives_malformed_cgroup_files(
    tmp_path: Path, child: subprocess.Popen[bytes]
) -> None:
    """In the watcher thread an exception here would have ended the thread silently."""
    cg = tmp_path / "cg"
    cg.mkdir()
    (cg / "memory.events").write_bytes(b"oom_kill 0\n")
    (cg / "memory.peak").write_bytes(b"\xff")
    fired: list[healthkit.actions.FailureEvent] = []
    diagnoser = ExitDiagnoser(cgroup=MemoryCgroup(2, str(cg)), kmsg_path=None)
    (cg / "memory.events").write_bytes(b"oom_kill \xff\n")
    wd = DisarmableWatchdog([child], actions=[fired.append], diagnoser=diagnoser).arm()
    try:
        child.kill()
        deadline = time.monotonic() + 30
        while not fired and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        wd.disarm()
        diagnoser.close()
    assert fired and fired[0].diagnosis.cause is Cause.SIGKILL_UNCONFIRMED


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"123",
        b"123 (python",
        b"123 (python) S 1",
        b"123 (py) S x y" + b" 0" * 30,
        b"\xff\xfe) S 1 2 3",
    ],
)
def test_truncated_proc_stat_reads_as_unknown(
    tmp_path: Path, content: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "123").mkdir()
    (tmp_path / "123" / "stat").write_bytes(content)
    with caplog.at_level(logging.WARNING, logger="healthkit"):
        assert read_proc_stat(123, str(tmp_path)) is None
    assert "stat is malformed" in caplog.text


def test_a_full_proc_stat_still_parses() -> None:
    stat = read_proc_stat(os.getpid())
    assert stat is not None and stat.pid == os.getpid() and stat.state in "RS"


# ----------------------------------------------------------------------------- CLI
def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "healthkit", *args], capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["explain", "256"], "256 is not a possible exit status: exit statuses are 0..255"),
        (["explain", "99999999999999999999999"], "is not a possible exit status"),
        (["explain", "--", "-65"], "-65 is not a possible exit status"),
        (["explain", "1.5"], "invalid int value: '1.5'"),
        (["explain", "-9", "--pid", "0"], "--pid must be a positive integer"),
        (["explain", "-9", "--pid", str(2**31)], "--pid must be a positive integer"),
        (["explain", "-9", "--pid", "abc"], "invalid int value"),
        (["demo", "--hang-timeout", "nan"], "--hang-timeout must be a finite number"),
        (["demo", "--hang-timeout", "inf"], "--hang-timeout must be a finite number"),
        (["demo", "--hang-timeout", "0"], "--hang-timeout must be > 0"),
        (["demo", "--hang-timeout", "3e6"], "longer than the OS can wait"),
        (["stacks", "--timeout", "0"], "--timeout must be > 0"),
        (["stacks", "abc"], "invalid int value"),
        (["stacks", "0"], "PID must be a positive integer"),
        (["stacks", "--", "-1"], "PID must be a positive integer"),
    ],
)
def test_cli_rejects_bad_numbers(args: list[str], message: str) -> None:
    proc = run_cli(*args)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_doctor_reads_a_bounded_amount_of_a_bogus_kernel_log() -> None:
    start = time.monotonic()
    proc = run_cli("doctor", "--kmsg", "/dev/zero")
    assert proc.returncode == 0, proc.stderr
    assert "/dev/zero holds no kernel log records" in proc.stdout
    assert time.monotonic() - start < 50  # it used to loop forever


@pytest.mark.timeout(30)
def test_the_valid_neighbours_of_refused_input_still_work(
    child: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    """Each refusal has its twin that is accepted: a signal by its number, a watch of
    another process (the parent), a str reason, a kernel log file that exists."""
    with ProcessWatch(os.getppid()) as parent:
        assert parent.poll() is None
    with ProcessWatch(child) as w:
        w.send_signal(signal.SIGTERM)
        status = w.wait(10)
    assert status is not None and status.signal is signal.SIGTERM
    wd = healthkit.DisarmableWatchdog()
    wd.disarm(reason="done")
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    healthkit.ExitDiagnoser(kmsg_path=str(kmsg)).close()
    d = healthkit.ExitDiagnoser(kmsg_path=None)
    assert d.diagnose(9, name="loader").name == "loader"
    d.close()
    with healthkit.WatchSet() as ws, ProcessWatch(os.getppid()) as other:
        ws.remove(other)  # not in the set: no error
