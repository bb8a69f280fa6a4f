"""Hostile input from another local user, each finding of the security review as a test:
the torchelastic error file, forged OOM evidence, and stack-dump signals that could kill.

The second user is ``nobody``, reached with ``setuid`` in a forked child; these tests need
root for that and skip (saying so) where they run without it.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import json
import logging
import os
import re
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from healthkit import Cause, ExitDiagnoser, ProcessWatch
from healthkit._diagnose.evidence import KernelLog, KernelRecord, oom_killed_pid
from healthkit._diagnose.stacks import enable_stack_dumps, stack_file
from healthkit.actions import FailureEvent
from healthkit.actions import write_torchelastic_error_file as ErrorFileAction
from healthkit.lowlevel import dump_stacks

pytestmark = pytest.mark.security

NOBODY = 65534
needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root to act as a second user (nobody) via setuid"
)


def as_nobody(fn: Callable[[], None], expect: int = 0) -> None:
    """Run ``fn`` in a forked child that dropped root for ``nobody``; fail unless it ends
    with ``expect`` (a return code, ``-N`` for signal N). Import what ``fn`` needs first:
    nobody may not be able to read this environment's files."""
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        code = 1
        try:
            os.setgroups([])
            os.setresgid(NOBODY, NOBODY, NOBODY)
            os.setresuid(NOBODY, NOBODY, NOBODY)
            fn()
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == expect, "the step run as nobody failed"


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory every user can write to, with the sticky bit, like /tmp."""
    d = Path(tempfile.mkdtemp(prefix="healthkit-sec-", dir="/tmp"))
    d.chmod(0o1777)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _event() -> FailureEvent:
    diagnoser = ExitDiagnoser(kmsg_path=None, cgroup_root="/nonexistent")
    return FailureEvent(diagnoser.diagnose(-9, name="sampler-server", pid=4242), "test")


def _written(path: Path) -> dict[str, object]:
    data = json.loads(path.read_text())
    assert "sampler-server (pid 4242) was killed by SIGKILL" in data["message"]["message"]
    return data


def _temps(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if ".tmp" in p.name)


# ----------------------------------------------------------------------------- error file
def test_error_file_is_written_atomically_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "error.json"
    ErrorFileAction(str(target))(_event())
    _written(target)
    assert stat.S_ISREG(target.lstat().st_mode)
    assert _temps(tmp_path) == []


@needs_root
def test_error_file_refuses_to_replace_a_device_node(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    node = tmp_path / "error.json"  # a copy of /dev/null: the review saw it become a file
    os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    with caplog.at_level(logging.WARNING, logger="healthkit"):
        ErrorFileAction(str(node))(_event())
    st = node.lstat()
    assert stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(1, 3)
    assert "is not a regular file (a character device)" in caplog.text
    assert _temps(tmp_path) == []


def test_error_file_refuses_a_directory_and_leaves_no_temp(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    target = tmp_path / "error.json"
    target.mkdir()
    with caplog.at_level(logging.WARNING, logger="healthkit"):
        ErrorFileAction(str(target))(_event())
    assert target.is_dir() and list(target.iterdir()) == []
    assert "(a directory)" in caplog.text
    assert _temps(tmp_path) == []


@needs_root
def test_error_file_temp_is_never_opened_through_a_planted_symlink(shared_dir: Path) -> None:
    victim = shared_dir / "victim"
    victim.write_text("root's data")
    victim.chmod(0o600)
    target = shared_dir / "error.json"
    predictable = [f"error.json.healthkit-{os.getpid()}.tmp",  # the old temp name
                   f".error.json.healthkit-{os.getpid()}.tmp"]

    def plant() -> None:
        for name in predictable:
            os.symlink(victim, shared_dir / name)

    as_nobody(plant)
    ErrorFileAction(str(target))(_event())
    assert victim.read_text() == "root's data"
    st = target.lstat()
    assert stat.S_ISREG(st.st_mode) and st.st_uid == 0
    _written(target)
    # Only nobody's two planted links remain: no temp file of ours.
    assert _temps(shared_dir) == sorted(predictable)
    assert all((shared_dir / n).is_symlink() for n in predictable)


@needs_root
def test_error_file_refuses_a_symlink_planted_by_another_user(
    shared_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    victim = shared_dir / "victim"
    victim.write_text("root's data")
    target = shared_dir / "error.json"
    as_nobody(lambda: os.symlink(victim, target))
    with caplog.at_level(logging.WARNING, logger="healthkit"):
        ErrorFileAction(str(target))(_event())
    assert victim.read_text() == "root's data"
    assert target.is_symlink() and target.lstat().st_uid == NOBODY  # left as it was
    assert f"is a symlink owned by uid {NOBODY}" in caplog.text
    assert _temps(shared_dir) == []


def test_error_file_follows_a_symlink_of_our_own(tmp_path: Path) -> None:
    real = tmp_path / "real" / "error.json"
    real.parent.mkdir()
    link = tmp_path / "error.json"
    link.symlink_to(real)
    ErrorFileAction(str(link))(_event())
    assert link.is_symlink()
    _written(real)
    assert _temps(real.parent) == [] and _temps(tmp_path) == []


@needs_root
@pytest.mark.parametrize("sticky", [False, True])
def test_error_file_in_a_directory_anyone_may_write(
    shared_dir: Path, sticky: bool, caplog: pytest.LogCaptureFixture
) -> None:
    shared_dir.chmod(0o1777 if sticky else 0o777)
    target = shared_dir / "error.json"
    with caplog.at_level(logging.WARNING, logger="healthkit"):
        ErrorFileAction(str(target))(_event())
    if sticky:  # like /tmp: others cannot rename or delete our file
        _written(target)
    else:
        assert not target.exists()
        assert "writable by every user and has no sticky bit" in caplog.text
    assert _temps(shared_dir) == []


def test_error_file_refusal_never_stops_the_next_actions(tmp_path: Path) -> None:
    """The refusal is logged by the action itself; the exit after it must still happen."""
    target = tmp_path / "error.json"
    target.mkdir()
    script = textwrap.dedent("""
        import healthkit
        from healthkit import ExitDiagnoser
        from healthkit.actions import FailureEvent
        d = ExitDiagnoser(kmsg_path=None).diagnose(-9, name="helper", pid=4242)
        for action in healthkit.actions.default_actions(7):
            action(FailureEvent(d, "wd"))
        print("not reached")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "TORCHELASTIC_ERROR_FILE": str(target)})
    assert proc.returncode == 7, proc.stderr
    assert "not reached" not in proc.stdout
    assert "not writing the torchelastic error file" in proc.stderr


# ----------------------------------------------------------------------------- OOM evidence
REAL_SUMMARY = ("oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,"
                "oom_memcg=/a,task_memcg=/a,task={comm},pid={pid},uid=0")
REAL_KILL = ("Memory cgroup out of memory: Killed process {pid} ({comm}) total-vm:528584kB, "
             "anon-rss:66560kB, file-rss:6616kB, shmem-rss:0kB, UID:0 pgtables:188kB "
             "oom_score_adj:0")


@pytest.mark.parametrize(
    ("message", "facility", "expected"),
    [
        (REAL_SUMMARY.format(comm="python3", pid=4242), 0, 4242),
        (REAL_KILL.format(comm="python3", pid=4242), 0, 4242),
        ("Out of memory: Killed process 7777 (python3) total-vm:8528584kB, anon-rss:1kB", 0,
         7777),
        ("Killed process 7777 (python3) total-vm:8528584kB, anon-rss:1kB", 0, 7777),
        # The name is chosen by the process: it must not move the victim's pid.
        (REAL_SUMMARY.format(comm="x,pid=4242", pid=5555), 0, 5555),
        (REAL_KILL.format(comm="oom pid=4242", pid=5555), 0, 5555),
        # A kernel record that starts with a process's name (a segfault report).
        ("oom pid=4242 [5555]: segfault at 0 ip 00007f sp 00007ffd error 4 in libc.so.6", 0,
         None),
        ("Killed process [5555]: segfault at 0 ip 00007f sp 00007ffd error 4", 0, None),
        ("oom_reaper: reaped process 4242 (python3), now anon-rss:0kB", 0, None),
        # The very same text written into /dev/kmsg from user space (facility LOG_USER).
        (REAL_SUMMARY.format(comm="python3", pid=4242), 1, None),
        (REAL_KILL.format(comm="python3", pid=4242), 1, None),
    ],
)
def test_oom_records_are_read_by_structure(
    message: str, facility: int, expected: int | None
) -> None:
    assert oom_killed_pid(KernelRecord(1, message, facility)) == expected


def _kmsg_seq() -> int:
    last = KernelLog().last_seq()
    if last is None:
        pytest.skip("/dev/kmsg is not readable here: no kernel record can be forged or read")
    return last


def _records_after(seq: int) -> list[KernelRecord]:
    records = KernelLog().records()
    assert records is not None
    return [r for r in records if r.seq > seq]


def _name_and_segfault(name: bytes) -> None:  # pragma: no cover - runs in the child
    faulthandler.disable()
    signal.signal(signal.SIGSEGV, signal.SIG_DFL)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(15, name, 0, 0, 0)  # PR_SET_NAME
    ctypes.string_at(0)


def _sigkill_by_hand() -> tuple[subprocess.Popen[bytes], ProcessWatch]:
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    return victim, ProcessWatch(victim)


@needs_root
def test_a_process_named_like_an_oom_record_cannot_confirm_an_oom_kill(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The review's repro: nobody names a process ``oom pid=<victim>`` and makes it
    segfault; the kernel logs that name; a SIGKILL sent by hand to the victim must stay
    unconfirmed, both live and in ``healthkit explain -9 --pid``."""
    seq = _kmsg_seq()
    # No cgroup counter: only the kernel log can (wrongly) confirm here.
    diagnoser = ExitDiagnoser(cgroup_root=str(tmp_path))
    victim, watch = _sigkill_by_hand()
    try:
        name = f"oom pid={victim.pid} ".encode()
        if len(name) > 15:
            pytest.skip(f"pid {victim.pid} is too long to fit a 15-byte process name")
        as_nobody(lambda: _name_and_segfault(name), expect=-signal.SIGSEGV)
        forged = [r for r in _records_after(seq)
                  if r.message.startswith(name.decode()) and "segfault" in r.message]
        if not forged:
            pytest.skip("the kernel did not log the segfault (rate limit or "
                        "debug.exception-trace=0): the forged record could not be made")
        # The record is real and is what the old free-text match accepted.
        assert forged[0].facility == 0
        assert re.search(rf"[ ,]pid={victim.pid}[ ,]", forged[0].message)
        victim.send_signal(signal.SIGKILL)
        victim.wait(30)
        d = diagnoser.diagnose(watch)
    finally:
        with contextlib.suppress(ProcessLookupError):
            victim.kill()
        victim.wait(30)
        watch.close()
        diagnoser.close()
    assert d.cause is Cause.SIGKILL_UNCONFIRMED, str(d)
    assert "confirmed" not in d.likely.replace("unconfirmed", "")
    from healthkit._tools.cli import main

    assert main(["explain", "-9", "--pid", str(victim.pid)]) == 0
    out = capsys.readouterr().out
    assert "possibly the OOM killer, unconfirmed" in out and "(confirmed)" not in out


@needs_root
def test_an_oom_record_written_from_user_space_does_not_confirm(tmp_path: Path) -> None:
    """Root may write any text into /dev/kmsg; the kernel marks it LOG_USER, which is how a
    real OOM-killer record is told apart."""
    seq = _kmsg_seq()
    diagnoser = ExitDiagnoser(cgroup_root=str(tmp_path))
    victim, watch = _sigkill_by_hand()
    try:
        try:
            with open("/dev/kmsg", "w") as kmsg:
                kmsg.write("<3>" + REAL_SUMMARY.format(comm="python3", pid=victim.pid) + "\n")
                kmsg.flush()
                kmsg.write("<3>" + REAL_KILL.format(comm="python3", pid=victim.pid) + "\n")
        except OSError as e:
            pytest.skip(f"cannot write to /dev/kmsg here ({e.strerror})")
        written = [r for r in _records_after(seq) if f"pid={victim.pid},uid=0" in r.message
                   or f"Killed process {victim.pid} " in r.message]
        assert len(written) == 2 and all(r.facility == 1 for r in written), written
        victim.send_signal(signal.SIGKILL)
        victim.wait(30)
        d = diagnoser.diagnose(watch)
    finally:
        with contextlib.suppress(ProcessLookupError):
            victim.kill()
        victim.wait(30)
        watch.close()
        diagnoser.close()
    assert d.cause is Cause.SIGKILL_UNCONFIRMED, str(d)


def test_the_same_record_from_the_kernel_confirms(tmp_path: Path) -> None:
    """The non-firing twin's twin: the genuine record (facility 0) still confirms."""
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("6,1,0,-;Linux version 6\n")
    diagnoser = ExitDiagnoser(cgroup_root=str(tmp_path), kmsg_path=str(kmsg))
    victim, watch = _sigkill_by_hand()
    # Past the clock tick it started in, as a real OOM victim is by the time it is killed (a
    # record within that tick may be an earlier process's with the same pid).
    time.sleep(0.03)
    now = time.monotonic_ns() // 1000  # the kernel log's clock: after the victim started
    try:
        with kmsg.open("a") as f:
            f.write(f"6,2,{now},-;{REAL_SUMMARY.format(comm='python3', pid=victim.pid)}\n")
            f.write(f"14,3,{now + 1},-;{REAL_KILL.format(comm='python3', pid=victim.pid + 1)}\n")
        victim.send_signal(signal.SIGKILL)
        victim.wait(30)
        d = diagnoser.diagnose(watch)
    finally:
        victim.wait(30)
        watch.close()
        diagnoser.close()
    assert d.cause is Cause.OOM_KILLED, str(d)
    assert d.evidence[0].startswith("kernel log: oom-kill:constraint=CONSTRAINT_MEMCG")


# ----------------------------------------------------------------------------- stack dumps
def _sleeper(extra: str = "") -> subprocess.Popen[str]:
    code = "import sys, time\n" + textwrap.dedent(extra) + "\nprint('ready', flush=True)\n" \
           "time.sleep(600)\n"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _stop(proc: subprocess.Popen[str]) -> int:
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    rc = proc.wait(30)
    assert proc.stdout is not None
    proc.stdout.close()
    return rc


def _start_time(pid: int) -> int:
    from healthkit._os.proc import read_proc_stat

    stat_ = read_proc_stat(pid)
    assert stat_ is not None
    return stat_.start_time


@pytest.mark.parametrize("header", ["old-format", "other-start-time", "other-pid"])
def test_dump_request_never_signals_a_process_that_did_not_opt_in(
    tmp_path: Path, header: str
) -> None:
    """After pid reuse the file names a process that never opted in: SIGUSR2's default
    action would kill it. The file's pid and start time must match the live process."""
    proc = _sleeper()
    try:
        path = stack_file(str(tmp_path), proc.pid)
        if header == "old-format":
            Path(path).write_text("")  # what an older release left: no identity at all
        elif header == "other-start-time":
            Path(path).write_text(f"healthkit-stack-dump pid={proc.pid} "
                                  f"start_time={_start_time(proc.pid) - 1} signal=12\n")
        else:
            Path(path).write_text(f"healthkit-stack-dump pid={proc.pid + 1} "
                                  f"start_time={_start_time(proc.pid)} signal=12\n")
        assert dump_stacks(str(tmp_path), [proc.pid], timeout=0.5) == {proc.pid: None}
        time.sleep(0.2)
        assert proc.poll() is None, "the dump request killed a process that never opted in"
    finally:
        assert _stop(proc) == -signal.SIGKILL


def test_dump_request_reaches_a_process_that_opted_in(tmp_path: Path) -> None:
    proc = _sleeper(f"""
        from healthkit._diagnose.stacks import enable_stack_dumps
        enable_stack_dumps({str(tmp_path)!r})
        def where_it_waits():
            time.sleep(600)
        import threading
        threading.Thread(target=where_it_waits, daemon=True).start()
    """)
    try:
        dump = dump_stacks(str(tmp_path), [proc.pid], timeout=10)[proc.pid]
        assert dump is not None and "where_it_waits" in dump
        assert proc.poll() is None
    finally:
        _stop(proc)


def test_opt_in_is_withdrawn_before_interpreter_finalization(tmp_path: Path) -> None:
    """A worker past its atexit hooks no longer handles the signal: it must be neither
    signalled by a dump request nor killed by a late signal."""
    script = textwrap.dedent(f"""
        import atexit, os, sys, time
        def late():  # registered first, so it runs after healthkit's own hook
            print("exiting", flush=True)
            sys.stdin.readline()
        atexit.register(late)
        from healthkit._diagnose.stacks import enable_stack_dumps
        enable_stack_dumps({str(tmp_path)!r})
        print("ready", flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        assert proc.stdout.readline().strip() == "ready"
        assert proc.stdout.readline().strip() == "exiting"
        assert not os.path.exists(stack_file(str(tmp_path), proc.pid))
        assert dump_stacks(str(tmp_path), [proc.pid], timeout=0.5) == {proc.pid: None}
        os.kill(proc.pid, signal.SIGUSR2)  # even sent by hand, it is now ignored
        time.sleep(0.2)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.wait(30) == 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait(30)
        proc.stdin.close()
        proc.stdout.close()


def test_a_missing_stack_directory_does_not_end_the_worker(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    gone = tmp_path / "gone"
    with caplog.at_level(logging.WARNING, logger="healthkit"):
        assert enable_stack_dumps(str(gone)) is None
    assert "stack dumps not enabled" in caplog.text
    assert dump_stacks(str(gone), [os.getpid()], timeout=0.1) == {os.getpid(): None}


def _barrier_worker(barrier: object) -> None:  # pragma: no cover - runs in the child
    barrier.enable_stack_dumps()  # type: ignore[attr-defined]
    sys.exit(5)  # got past it: a distinct code, not a crash's


def test_a_barrier_worker_starts_although_the_stack_directory_vanished() -> None:
    import multiprocessing

    from healthkit import BoundedBarrier

    ctx = multiprocessing.get_context("spawn")
    barrier = BoundedBarrier(1, timeout=5, ctx=ctx)
    try:
        shutil.rmtree(barrier._stack_dir)
        worker = ctx.Process(target=_barrier_worker, args=(barrier,))
        worker.start()
        worker.join(60)
        assert worker.exitcode == 5
    finally:
        barrier.close()


def test_when_our_own_dump_signal_ends_a_process_the_diagnosis_says_so(tmp_path: Path) -> None:
    """The process passed every check but lost its handler as the signal arrived (modelled
    by a handler that restores the default action and re-raises): real SIGUSR2 death."""
    proc = _sleeper("""
        import os, signal
        def gone(signum, frame):
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        signal.signal(signal.SIGUSR2, gone)
    """)
    watch = ProcessWatch(proc)
    try:
        Path(stack_file(str(tmp_path), proc.pid)).write_text(
            f"healthkit-stack-dump pid={proc.pid} start_time={_start_time(proc.pid)} signal=12\n"
        )
        dump_stacks(str(tmp_path), [proc.pid], timeout=0.5)
        assert watch.wait(30) is not None
        d = ExitDiagnoser(kmsg_path=None).diagnose(watch)
    finally:
        _stop(proc)
        watch.close()
    assert d.signal is signal.SIGUSR2
    assert "healthkit's own stack-dump request (SIGUSR2) ended it" in str(d)


def test_a_sigusr2_we_did_not_send_is_not_blamed_on_us() -> None:
    proc = _sleeper()
    watch = ProcessWatch(proc)
    try:
        proc.send_signal(signal.SIGUSR2)
        assert watch.wait(30) is not None
        d = ExitDiagnoser(kmsg_path=None).diagnose(watch)
    finally:
        _stop(proc)
        watch.close()
    assert d.signal is signal.SIGUSR2
    assert "stack-dump request" not in str(d)
    assert "a signal with no common cause" in str(d)


@needs_root
def test_error_file_refuses_a_directory_owned_by_another_user(
    shared_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A directory nobody owns (say, a symlinked path component they planted) lets them
    replace the file after we wrote it: nothing is written there."""
    theirs = shared_dir / "theirs"
    as_nobody(lambda: theirs.mkdir(mode=0o755))
    target = theirs / "error.json"
    with caplog.at_level(logging.WARNING, logger="healthkit"):
        ErrorFileAction(str(target))(_event())
    assert not target.exists() and list(theirs.iterdir()) == []
    assert f"is owned by uid {NOBODY}" in caplog.text


# ------------------------------------------- planted parent directories, FIFOs, hard links
@pytest.fixture
def root_only() -> Iterator[Path]:
    """A directory only root may write to, with nothing in it (what a planted symlink aims
    at: root writing there is the attack)."""
    d = Path(tempfile.mkdtemp(prefix="healthkit-root-only-"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@needs_root
@pytest.mark.parametrize("parent", ["sticky, planted", "open to all, swapped"])
def test_error_file_never_follows_a_parent_directory_replaced_by_another_users_symlink(
    shared_dir: Path, root_only: Path, parent: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The review's repro: TORCHELASTIC_ERROR_FILE under a directory another user replaced by
    a symlink to a root-only directory (in a sticky /tmp with protected_symlinks off, or in a
    0777 directory). Nothing is written through it."""
    job = shared_dir / "job"
    if parent == "open to all, swapped":
        shared_dir.chmod(0o777)
        job.mkdir()  # root's own directory, which nobody may rename away (no sticky bit)

        def swap() -> None:
            os.rename(job, shared_dir / "moved")
            os.symlink(root_only, job)

        as_nobody(swap)
    else:
        as_nobody(lambda: os.symlink(root_only, job))
    with caplog.at_level(logging.WARNING, logger="healthkit"):
        ErrorFileAction(str(job / "error.json"))(_event())
    assert list(root_only.iterdir()) == []
    assert f"{str(job)!r} is a symlink owned by uid {NOBODY}" in caplog.text
    assert "not followed" in caplog.text


@needs_root
@pytest.mark.timeout(30)
@pytest.mark.parametrize("where", ["the target", "a parent"])
def test_error_file_never_opens_a_fifo_another_user_planted(
    shared_dir: Path, where: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A FIFO opened for writing blocks until someone reads it (and then feeds them the
    diagnosis): it is refused without being opened, and the test's timeout would catch a
    block."""
    fifo = shared_dir / ("error.json" if where == "the target" else "job")
    as_nobody(lambda: os.mkfifo(fifo, 0o666))
    target = fifo if where == "the target" else fifo / "error.json"
    with caplog.at_level(logging.WARNING, logger="healthkit"):
        ErrorFileAction(str(target))(_event())
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    expected = ("exists and is not a regular file (a FIFO)" if where == "the target"
                else f"{str(fifo)!r} is a FIFO, not a directory")
    assert expected in caplog.text
    assert _temps(shared_dir) == []


@needs_root
def test_error_file_replaces_a_planted_hard_link_and_never_writes_through_it(
    shared_dir: Path, root_only: Path
) -> None:
    """Another user links a file of root's (one they may read and write, as
    protected_hardlinks demands) under the error file's name: the write replaces the name,
    the linked file keeps its content."""
    root_only.chmod(0o711)
    victim = root_only / "config"
    victim.write_text("root's data")
    victim.chmod(0o666)
    target = shared_dir / "error.json"
    as_nobody(lambda: os.link(victim, target))
    assert target.stat().st_ino == victim.stat().st_ino
    ErrorFileAction(str(target))(_event())
    assert victim.read_text() == "root's data"
    st = target.lstat()
    assert st.st_ino != victim.stat().st_ino and st.st_nlink == 1 and st.st_uid == 0
    _written(target)
    assert _temps(shared_dir) == []


@needs_root
@pytest.mark.parametrize("planted", ["their directory", "their symlink"])
def test_exception_records_are_not_written_where_another_user_planted_the_directory(
    shared_dir: Path, root_only: Path, planted: str, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The per-user record directory is predictable (<tmp>/healthkit-<uid>): another user
    may make it first. Records (tracebacks may hold secrets) then go nowhere, with a
    warning, and the helper's own exception is what it raises, as always."""
    from healthkit._diagnose.records import write_record
    from healthkit._os.userdir import RECORD_DIR_ENV

    records = shared_dir / "healthkit-0"
    if planted == "their directory":
        as_nobody(lambda: records.mkdir(mode=0o777))
    else:
        as_nobody(lambda: os.symlink(root_only, records))
    monkeypatch.setenv(RECORD_DIR_ENV, str(records))
    try:
        raise ValueError("token=secret")
    except ValueError as e:
        with caplog.at_level(logging.WARNING, logger="healthkit"):
            assert write_record(e) is None
    assert "was not written" in caplog.text and RECORD_DIR_ENV in caplog.text
    assert list(root_only.iterdir()) == []
    if planted == "their directory":
        assert list(records.iterdir()) == []
