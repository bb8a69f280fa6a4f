"""A helper's own exception, carried into its owner's diagnosis: real processes started with
fork, spawn and forkserver, and a subprocess; the stops that must not be recorded; the record
of an earlier process with the same pid; the size cap; the error file; on-demand stacks."""

from __future__ import annotations

import inspect
import json
import multiprocessing as mp
import os
import re
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import HERE, PYTHON

import healthkit as hk
from healthkit._diagnose import stacks as _stacks
from healthkit._diagnose.records import read_record, record_name, write_record
from healthkit._os import userdir as _userdir
from healthkit.actions import FailureEvent, write_torchelastic_error_file


@pytest.fixture
def records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private record directory of this test's own, inherited by every child it starts."""
    directory = tmp_path / "records"
    monkeypatch.setenv(_userdir.RECORD_DIR_ENV, str(directory))
    yield directory


def load_shard(n: int) -> None:
    raise ValueError(f"bad shard {n}")


RAISED_AT = f"test_records.py:{load_shard.__code__.co_firstlineno + 1}"  # the raise above


@hk.record_exception
def decorated_helper(n: int) -> None:
    load_shard(n)


def plain_helper(n: int) -> None:
    load_shard(n)


def exits(how: str) -> None:
    if how == "clean":
        return
    if how == "sys.exit(0)":
        sys.exit(0)
    if how == "sys.exit()":
        sys.exit()
    raise KeyboardInterrupt


def _run(target: object, args: tuple[object, ...], method: str) -> hk.Diagnosis:
    ctx = mp.get_context(method)
    p = ctx.Process(target=target, args=args, name="shard-loader")  # type: ignore[arg-type]
    p.start()
    with hk.ProcessWatch(p) as w:
        assert w.wait(60) is not None
        diagnoser = hk.ExitDiagnoser(kmsg_path=None)
        try:
            d = diagnoser.diagnose(w)
        finally:
            diagnoser.close()
    p.join(30)
    assert p.exitcode == d.exit_code  # watching changed nothing multiprocessing reports
    p.close()
    return d


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("method", "wrapped"),
    [("fork", "decorator"), ("spawn", "decorator"), ("forkserver", "decorator"),
     ("spawn", "inline")],
)
def test_a_helpers_exception_is_its_diagnosis(records: Path, method: str, wrapped: str) -> None:
    target = decorated_helper if wrapped == "decorator" else hk.record_exception(plain_helper)
    d = _run(target, (7,), method)
    assert d.cause is hk.Cause.ERROR_EXIT and d.exit_code == 1
    exc = d.exception
    assert exc is not None
    assert (exc.type, exc.message, exc.pid) == ("ValueError", "bad shard 7", d.pid)
    assert exc.where == f"{RAISED_AT} in load_shard"
    assert exc.frames[-1].splitlines()[1].strip() == 'raise ValueError(f"bad shard {n}")'
    line = str(d)
    assert line.startswith(
        f"shard-loader (pid {d.pid}) exited with code 1: it raised ValueError: bad shard 7 "
        f"at {RAISED_AT} in load_shard [exception record "
    ), line
    assert "Fix the cause of that exception" in line
    # The record: private, in a private directory, holding the whole traceback. A
    # forkserver started before this test set the variable gives its children its own,
    # older environment: the helper writes to the default directory, where it is found too.
    path = Path(exc.path)
    where = records if method != "forkserver" else Path(_userdir.default_record_dir())
    assert path.parent == where
    assert stat.S_IMODE(where.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text()
    assert "Traceback (most recent call last):" in text and text.endswith(
        "ValueError: bad shard 7\n"
    )
    # The opt-in to stack dumps ended with the entry point.
    assert not list(where.glob(f"stack-{d.pid}.txt"))
    if where != records:
        path.unlink()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["clean", "sys.exit(0)", "sys.exit()"])
def test_clean_exits_write_no_record(records: Path, how: str) -> None:
    d = _run(hk.record_exception(exits), (how,), "fork")
    assert d.exception is None
    assert not list(records.glob("exception-*"))
    assert d.cause is hk.Cause.CLEAN_EXIT


@pytest.mark.timeout(60)
def test_an_interrupt_is_recorded_and_named_as_one_not_as_an_error(records: Path) -> None:
    """A KeyboardInterrupt exits 1 like any error; its record makes the diagnosis say
    "interrupted" and how to keep the helper out of its owner's interrupts, not "wrap it in
    record_exception" (it is wrapped). The twin: the same exit 1 unwrapped reads as the
    generic code 1."""
    d = _run(hk.record_exception(exits), ("KeyboardInterrupt",), "fork")
    assert d.cause is hk.Cause.ERROR_EXIT and d.exit_code == 1
    assert d.exception is not None and d.exception.type == "KeyboardInterrupt"
    assert "it was interrupted: KeyboardInterrupt at " in d.likely, d.likely
    assert "SIG_IGN" in d.hint and "record_exception" not in d.hint, d.hint
    bare = _run(exits, ("KeyboardInterrupt",), "fork")
    assert bare.exception is None and "generic failure code" in bare.likely


def exits_with(code: object) -> None:
    sys.exit(code)


def thread_fails_then_returns() -> None:
    def load() -> None:
        load_shard(7)

    t = threading.Thread(target=load, name="shard-thread")
    t.start()
    t.join()


def atexit_fails() -> None:
    import atexit

    atexit.register(load_shard, 7)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("method", "ending"),
    [("fork", "sys.exit(3)"), ("spawn", "sys.exit(3)"), ("fork", "sys.exit(msg)"),
     ("spawn", "sys.exit(msg)"), ("fork", "thread"), ("spawn", "thread"), ("spawn", "atexit")],
)
def test_every_ending_of_a_wrapped_helper_carries_its_cause(
    records: Path, tmp_path: Path, method: str, ending: str
) -> None:
    """The watchdog's line and torchrun's root cause name how a wrapped helper ended, not
    only its exit code; and the advice to wrap it, which it is, is not given."""
    target, args, code = {
        "sys.exit(3)": (exits_with, (3,), 3),
        "sys.exit(msg)": (exits_with, ("fatal: bad shard 7",), 1),
        "thread": (thread_fails_then_returns, (), 0),
        # Fork children of multiprocessing leave by os._exit: atexit callbacks run only in
        # spawn (and forkserver) children and in subprocesses.
        "atexit": (atexit_fails, (), 0),
    }[ending]
    error_file = tmp_path / "error.json"
    seen: list[FailureEvent] = []
    done = threading.Event()

    def keep(event: FailureEvent) -> None:
        seen.append(event)
        done.set()

    p = mp.get_context(method).Process(
        target=hk.record_exception(target), args=args, name="loader"
    )
    with hk.DisarmableWatchdog(
        actions=[write_torchelastic_error_file(str(error_file)), keep]
    ) as wd:
        p.start()
        wd.watch(p)
        assert done.wait(60)
    p.join(30)
    assert p.exitcode == code
    pid = p.pid
    p.close()
    d = seen[0].diagnosis
    line = str(d)
    assert "wrap its entry point" not in line
    assert d.exception is not None, line
    callstack = json.loads(error_file.read_text())["message"]["extraInfo"]["py_callstack"]
    if ending == "sys.exit(3)":
        assert d.cause is hk.Cause.ERROR_EXIT
        assert line.startswith(
            f"loader (pid {pid}) exited with code 3: it called sys.exit(3) at "
            "test_records.py:"
        ), line
        assert "Fix what it reported when it called sys.exit" in line
        assert callstack.endswith("  SystemExit: 3\n"), callstack
    elif ending == "sys.exit(msg)":
        assert line.startswith(
            f"loader (pid {pid}) exited with code 1: it called "
            "sys.exit('fatal: bad shard 7') at test_records.py:"
        ), line
        assert callstack.endswith("  SystemExit: fatal: bad shard 7\n"), callstack
    else:
        where = "thread shard-thread" if ending == "thread" else "atexit callback load_shard"
        assert d.cause is hk.Cause.EARLY_EXIT
        assert d.exception.context == where
        assert line.startswith(
            f"loader (pid {pid}) exited with code 0 while it was expected to run until "
            f"disarmed: it raised ValueError: bad shard 7 in {where} at {RAISED_AT} in "
            "load_shard, then returned;"
        ), line
        assert f"its exception (in {where}), last frames" in callstack, callstack
        assert callstack.endswith("  ValueError: bad shard 7\n"), callstack
    assert callstack.startswith(f"healthkit watchdog: {line}"), callstack


def returns_after_its_thread_did_its_work() -> None:
    t = threading.Thread(target=lambda: None, name="worker-thread")
    t.start()
    t.join()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_wrapped_helper_that_returns_normally_is_a_clean_exit(
    records: Path, method: str
) -> None:
    d = _run(hk.record_exception(returns_after_its_thread_did_its_work), (), method)
    assert d.cause is hk.Cause.CLEAN_EXIT and d.exception is None
    assert not list(records.glob("exception-*"))


def raises_after_its_thread_failed() -> None:
    thread_fails_then_returns()
    raise KeyError("entry point")


@pytest.mark.timeout(60)
def test_the_entry_points_exception_replaces_a_threads(records: Path) -> None:
    d = _run(hk.record_exception(raises_after_its_thread_failed), (), "fork")
    assert d.exception is not None
    assert (d.exception.summary, d.exception.context) == ("KeyError: 'entry point'", "")
    assert "it raised KeyError" in str(d)


@pytest.mark.timeout(60)
def test_a_subprocess_helper_records_with_a_with_block(records: Path) -> None:
    code = (
        "import healthkit\n"
        "def main():\n"
        "    {}['shard']\n"
        "with healthkit.record_exception():\n"
        "    main()\n"
    )
    proc = subprocess.Popen([PYTHON, "-c", code], stderr=subprocess.PIPE, text=True)
    with hk.ProcessWatch(proc, name="loader") as w:
        w.wait(60)
        d = hk.ExitDiagnoser(kmsg_path=None).diagnose(w)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert "KeyError: 'shard'" in err  # its stderr is what it always was
    assert d.exception is not None and d.exception.summary == "KeyError: 'shard'"
    assert d.exception.where == "<string>:3 in main"


@pytest.mark.timeout(60)
def test_the_record_of_an_earlier_process_with_the_same_pid_is_never_used(
    records: Path,
) -> None:
    d = _run(decorated_helper, (7,), "fork")
    assert d.exception is not None and d.pid is not None
    start = d.exception.start_time
    diagnoser = hk.ExitDiagnoser(kmsg_path=None)
    try:
        # The same pid, another start time: a process that reused the pid.
        later = diagnoser.diagnose(hk.ExitStatus(1, "given"), pid=d.pid, start_time=start + 1)
        assert later.exception is None and "it raised" not in str(later)
        # No start time: the pid alone names no process for sure.
        assert diagnoser.diagnose(1, pid=d.pid).exception is None
        # The very process: found.
        same = diagnoser.diagnose(1, pid=d.pid, start_time=start)
        assert same.exception is not None
    finally:
        diagnoser.close()
    assert read_record(d.pid, start + 1) is None
    assert (records / record_name(d.pid, start)).exists()


@pytest.mark.timeout(60)
def test_a_record_is_capped_and_keeps_where_it_was_raised(records: Path) -> None:
    def deep(n: int) -> None:
        if n == 0:
            raise RuntimeError("x" * 500_000)
        deep(n - 1)

    try:
        deep(300)
    except RuntimeError as e:
        path = write_record(e)
    assert path is not None
    data = Path(path).read_bytes()
    assert len(data) <= 64 * 1024
    text = data.decode()
    assert "bytes of the traceback left out" in text
    assert text.rstrip().endswith("x" * 100)  # the end, where it was raised, is kept
    stat_ = hk.lowlevel.read_proc_stat(os.getpid())
    assert stat_ is not None
    rec = read_record(os.getpid(), stat_.start_time)
    assert rec is not None and len(rec.message) == 4000
    assert len(rec.summary) == len("RuntimeError: ") + 300
    assert rec.where.endswith(" in deep")
    os.unlink(path)


@pytest.mark.timeout(120)
def test_the_watchdog_line_and_error_file_carry_the_exception(
    records: Path, tmp_path: Path
) -> None:
    error_file = tmp_path / "error.json"
    seen: list[FailureEvent] = []
    done = threading.Event()

    def keep(event: FailureEvent) -> None:
        seen.append(event)
        done.set()

    p = mp.get_context("spawn").Process(target=decorated_helper, args=(7,), name="loader")
    with hk.DisarmableWatchdog(
        actions=[write_torchelastic_error_file(str(error_file)), keep]
    ) as wd:
        p.start()
        wd.watch(p)
        assert done.wait(60)
    p.join(30)
    pid = p.pid
    p.close()
    d = seen[0].diagnosis
    assert d.exception is not None
    callstack = json.loads(error_file.read_text())["message"]["extraInfo"]["py_callstack"]
    assert callstack.startswith(
        f"healthkit watchdog: loader (pid {pid}) exited with code 1: it raised ValueError: "
        f"bad shard 7 at {RAISED_AT} in load_shard"
    )
    call_line = inspect.unwrap(decorated_helper).__code__.co_firstlineno + 2
    assert re.search(
        r"  its exception, last frames \(full traceback in the record above\):\n"
        rf'    File ".*test_records.py", line {call_line}, '
        r"in decorated_helper\n"
        r"      load_shard\(n\)\n"
        rf'    File ".*test_records.py", line {RAISED_AT.split(":")[1]}, in load_shard\n'
        r'      raise ValueError\(f"bad shard \{n\}"\)\n'
        r"  ValueError: bad shard 7\n$",
        callstack,
    ), callstack


def stuck_in_feature_store(ready: object) -> None:
    ready.set()  # type: ignore[attr-defined]
    time.sleep(120)


@pytest.mark.timeout(120)
def test_stacks_of_a_running_jobs_helpers_on_demand(records: Path) -> None:
    """`healthkit stacks <rank pid>`: the rank's helpers that opted in (here through
    record_exception) print where they are; one that did not is named and left alive."""
    ctx = mp.get_context("spawn")
    ready = [ctx.Event(), ctx.Event()]
    opted = ctx.Process(target=hk.record_exception(stuck_in_feature_store), args=(ready[0],))
    plain = ctx.Process(target=stuck_in_feature_store, args=(ready[1],))
    for p in (opted, plain):
        p.start()
    try:
        assert all(e.wait(60) for e in ready)
        # Wait for the opt-in file (written before the target runs, so already there).
        assert opted.pid is not None and plain.pid is not None
        stacks = hk.dump_helper_stacks([opted.pid, plain.pid], timeout=10)
        assert stacks[plain.pid] is None
        assert stacks[opted.pid] is not None
        assert "in stuck_in_feature_store" in stacks[opted.pid]  # type: ignore[operator]
        out = subprocess.run(
            [PYTHON, "-m", "healthkit", "stacks", str(os.getpid()), "--timeout", "10"],
            capture_output=True, text=True, timeout=60, cwd=HERE,
        )
        assert out.returncode == 0, out.stderr
        assert re.search(rf"=== pid {opted.pid} \(\S+\):\n.*in stuck_in_feature_store",
                         out.stdout, re.S), out.stdout
        assert f"=== pid {plain.pid} (" in out.stdout
        assert "not opted in to stack dumps" in out.stdout
        assert plain.is_alive() and opted.is_alive()  # nobody was killed by the request
    finally:
        for p in (opted, plain):
            p.kill()
            p.join(30)
            p.close()
    # A SIGKILLed helper cannot withdraw its opt-in; it is never listed as a live one.
    assert _stacks.opted_in(str(records)) == []


def test_record_exception_rejects_what_is_not_a_function() -> None:
    with pytest.raises(hk.InvalidArgumentTypeError) as e:
        hk.record_exception(42)  # type: ignore[call-overload]
    assert e.value.argument == "func"
    with pytest.raises(hk.InvalidArgumentTypeError) as e:
        hk.record_exception(stacks="yes")  # type: ignore[call-overload]
    assert e.value.argument == "stacks"


def calls_itself(ready: object, depth: int) -> None:
    if depth:
        wrapped_again(ready, depth - 1)  # a nested wrapped call keeps the outer opt-in
        ready.set()  # type: ignore[attr-defined]
        time.sleep(120)


@hk.record_exception
def wrapped_again(ready: object, depth: int) -> None:
    calls_itself(ready, depth)


@pytest.mark.timeout(60)
def test_a_wrapped_function_called_again_or_nested_keeps_its_stacks(records: Path) -> None:
    ctx = mp.get_context("fork")
    ready = ctx.Event()

    def twice_then_nested() -> None:
        wrapped_again(ready, 0)  # opts in and withdraws
        wrapped_again(ready, 1)  # opts in again; the nested call leaves it in place

    p = ctx.Process(target=twice_then_nested)
    p.start()
    try:
        assert ready.wait(30) and p.pid is not None
        stacks = hk.dump_helper_stacks([p.pid], below=False, timeout=10)
        assert stacks[p.pid] is not None and "in calls_itself" in stacks[p.pid]  # type: ignore[operator]
    finally:
        p.kill()
        p.join(30)
        p.close()


OWNER_JOINS = """
import multiprocessing as mp, os, signal, sys, time
import healthkit as hk

@hk.record_exception
def loader():
    time.sleep(0.5)
    raise ValueError("bad shard 7")

if __name__ == "__main__":
    p = mp.get_context("fork").Process(target=loader, name="loader")
    p.start()
    wd = hk.DisarmableWatchdog([p], mode="sidecar").arm()
    # Hold the sidecar still while the owner reaps the helper: it then cannot read the
    # zombie and learns the exit status from the owner, without the helper's watch.
    os.kill(wd.sidecar_pid, signal.SIGSTOP)
    p.join()
    os.kill(wd.sidecar_pid, signal.SIGCONT)
    time.sleep(60)
    print("NOT STOPPED", flush=True)
"""


@pytest.mark.timeout(120)
def test_the_sidecar_names_the_exception_of_a_helper_its_owner_reaped(records: Path) -> None:
    proc = subprocess.run([PYTHON, "-c", OWNER_JOINS], capture_output=True, text=True,
                          timeout=90)
    assert proc.returncode == -15, proc.stderr  # stopped by the sidecar
    assert "NOT STOPPED" not in proc.stdout
    assert re.search(
        r"healthkit watchdog \(sidecar\): loader \(pid \d+\) exited with code 1: it raised "
        r"ValueError: bad shard 7 at <string>:8 in loader \[exception record ",
        proc.stderr,
    ), proc.stderr


OWNER_SIDECAR = """
import multiprocessing as mp, sys, threading, time
import healthkit as hk

def load():
    raise ValueError("bad shard 7")

@hk.record_exception
def loader(ending):
    if ending == "exit":
        sys.exit("fatal: bad shard 7")
    t = threading.Thread(target=load, name="shard-thread")
    t.start()
    t.join()

if __name__ == "__main__":
    p = mp.get_context(sys.argv[1]).Process(target=loader, args=(sys.argv[2],), name="loader")
    wd = hk.DisarmableWatchdog(mode="sidecar").arm()
    p.start()
    wd.watch(p)
    time.sleep(60)
    print("NOT STOPPED", flush=True)
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("method", "ending"), [("fork", "thread"), ("spawn", "exit")])
def test_the_sidecar_carries_every_ending(
    records: Path, tmp_path: Path, method: str, ending: str
) -> None:
    error_file = tmp_path / "error.json"
    env = {**os.environ, "TORCHELASTIC_ERROR_FILE": str(error_file)}
    script = tmp_path / "owner.py"  # a file: spawn children import their target from it
    script.write_text(OWNER_SIDECAR)
    proc = subprocess.run([PYTHON, str(script), method, ending], capture_output=True,
                          text=True, timeout=90, env=env)
    assert proc.returncode == -15, proc.stderr  # stopped by the sidecar
    likely = (
        r"exited with code 0 while it was expected to run until disarmed: it raised "
        r"ValueError: bad shard 7 in thread shard-thread at owner.py:6 in load, then returned"
        if ending == "thread"
        else r"exited with code 1: it called sys.exit\('fatal: bad shard 7'\) at owner.py:11"
    )
    assert re.search(
        r"healthkit watchdog \(sidecar\): loader \(pid \d+\) " + likely, proc.stderr
    ), proc.stderr
    assert "wrap its entry point" not in proc.stderr
    callstack = json.loads(error_file.read_text())["message"]["extraInfo"]["py_callstack"]
    assert re.search(likely, callstack), callstack
