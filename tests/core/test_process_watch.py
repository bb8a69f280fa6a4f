"""ProcessWatch on real processes ending in real ways, for every kind of handle.

Each test starts its own processes, ends them by pid (or pidfd) and reaps them; the autouse
leak check in tests/conftest.py proves nothing (process, zombie, thread, fd) outlives it.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import attrs
import helpers
import pytest
from helpers import (
    PYTHON,
    fork_behaviour,
    grandchild,
    python_argv,
    reaped,
    watch_as_user,
)

from healthkit import (
    Cause,
    ExitDiagnoser,
    ExitStatus,
    InvalidArgumentError,
    NoSuchProcessError,
    ProcessNotStartedError,
    ProcessWatch,
    WatchClosedError,
)
from healthkit._os.proc import read_proc_stat
from healthkit._watch.process import UNKNOWN_NOT_PERMITTED

KINDS = ["fork", "spawn", "forkserver", "popen", "pid-of-fork", "pid-of-popen"]
MP_KINDS = ("fork", "spawn", "forkserver")


@attrs.frozen
class Case:
    """One way to end: what the child does (or what we send it), and the expected diagnosis."""

    behaviour: str
    send: signal.Signals | None
    exit_code: int
    signal: signal.Signals | None
    cause: Cause
    words: tuple[str, ...]


CASES = {
    "exit-0": Case("exit_0", None, 0, None, Cause.CLEAN_EXIT, ("exited cleanly", "exit code 0")),
    "exit-3": Case("exit_3", None, 3, None, Cause.ERROR_EXIT, ("exited with code 3", "stderr")),
    "raises": Case(
        "raise",
        None,
        1,
        None,
        Cause.ERROR_EXIT,
        ("exited with code 1", "uncaught Python exception"),
    ),
    "sigkill": Case(
        "sleep",
        signal.SIGKILL,
        -9,
        signal.SIGKILL,
        Cause.SIGKILL_UNCONFIRMED,
        ("was killed by SIGKILL", "possibly the OOM killer, unconfirmed", "raise the memory limit"),
    ),
    "sigsegv": Case(
        "segfault",
        None,
        -11,
        signal.SIGSEGV,
        Cause.NATIVE_CRASH,
        ("was killed by SIGSEGV", "native code", "faulthandler"),
    ),
    "sigabrt": Case(
        "abort",
        None,
        -6,
        signal.SIGABRT,
        Cause.NATIVE_CRASH,
        ("was killed by SIGABRT", "native code", "faulthandler"),
    ),
    "sigbus": Case(
        "bus_error",
        None,
        -7,
        signal.SIGBUS,
        Cause.BUS_ERROR,
        ("was killed by SIGBUS", "/dev/shm", "Raise /dev/shm"),
    ),
    "sigterm": Case(
        "sleep",
        signal.SIGTERM,
        -15,
        signal.SIGTERM,
        Cause.TERMINATED,
        ("was killed by SIGTERM", "asked it to stop"),
    ),
}


@pytest.fixture
def diagnoser(tmp_path: Path) -> ExitDiagnoser:
    """A diagnoser with no OOM evidence at all (no cgroup file, no kernel log): hermetic."""
    return ExitDiagnoser(proc_root=str(tmp_path), kmsg_path=None)


@attrs.define
class Started:
    kind: str
    pid: int
    name: str
    watch: ProcessWatch
    process: mp.process.BaseProcess | None = None
    popen: subprocess.Popen[bytes] | None = None


@contextlib.contextmanager
def started(kind: str, behaviour: str, **watch_kwargs: bool) -> Iterator[Started]:
    """Start ``behaviour`` as ``kind`` of process, watched; end and reap it afterwards."""
    process: mp.process.BaseProcess | None = None
    popen: subprocess.Popen[bytes] | None = None
    watch: ProcessWatch | None = None
    pid: int | None = None
    try:
        if kind in MP_KINDS:
            ctx = mp.get_context(kind)
            gate = ctx.Event()
            process = ctx.Process(
                target=helpers.gated, args=(gate, behaviour), name=f"worker-{behaviour}"
            )
            process.start()
            assert process.pid is not None
            watch = ProcessWatch(process, **watch_kwargs)
            gate.set()  # only now may it end: the watch is built on a live process
            pid, name = process.pid, process.name
        elif kind == "popen":
            popen = subprocess.Popen(python_argv(behaviour))
            watch = ProcessWatch(popen, **watch_kwargs)
            pid, name = popen.pid, os.path.basename(PYTHON)
        elif kind == "pid-of-fork":
            pid = fork_behaviour(behaviour)
            watch = ProcessWatch(pid, **watch_kwargs)
            name = f"pid {pid}"
        elif kind == "pid-of-popen":
            popen = subprocess.Popen(python_argv(behaviour))
            pid = popen.pid
            watch = ProcessWatch(pid, **watch_kwargs)
            name = f"pid {pid}"
        else:
            raise AssertionError(kind)
        yield Started(kind, pid, name, watch, process, popen)
    finally:
        # End whatever still runs, through the watch (pidfd: never a recycled pid).
        if watch is not None and not watch.closed and watch.poll() is None:
            watch.kill()
            watch.wait(30)
        if watch is not None:
            watch.close()
        if process is not None:
            if process.is_alive():  # the watch was never built
                process.kill()
            process.join(30)
            process.close()
        if popen is not None:
            if popen.poll() is None:
                popen.kill()
            popen.wait(30)
        if kind == "pid-of-fork" and pid is not None and not reaped(pid):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


# --------------------------------------------------------------------------- the matrix


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case_id", list(CASES))
def test_watch_reports_and_diagnoses_how_the_process_ended(
    kind: str, case_id: str, diagnoser: ExitDiagnoser
) -> None:
    case = CASES[case_id]
    with started(kind, case.behaviour) as s:
        if case.send is not None:
            os.kill(s.pid, case.send)  # still ours to signal: nobody has reaped it yet
        status = s.watch.wait(timeout=30)
        assert status is not None, "the watch did not see the process end"
        assert status.returncode == case.exit_code
        assert status.signal == case.signal
        assert status.exit_code == (case.exit_code if case.exit_code >= 0 else None)

        if kind == "forkserver":
            # Not our child (the forkserver is its parent): no waitid; the Process object
            # learns the code from the forkserver, and the watch asks it.
            assert s.watch.is_child is False
            assert status.source == "multiprocessing"
        else:
            assert s.watch.is_child is True
            assert status.source == "waitid"

        # The watch never reaps: the zombie stays for its owner, whose own answer is the
        # same code (a watch by bare pid used to make Popen.wait() report 0 here).
        if kind != "forkserver":
            assert not reaped(s.pid), "the watch reaped a process it does not own"
        if s.process is not None:
            s.process.join(30)
            assert s.process.exitcode == case.exit_code
        if s.popen is not None:
            assert s.popen.wait(30) == case.exit_code
        if kind == "pid-of-fork":
            _, raw = os.waitpid(s.pid, 0)
            assert os.waitstatus_to_exitcode(raw) == case.exit_code

        d = diagnoser.diagnose(s.watch)
        assert d.name == s.name
        assert d.pid == s.pid
        assert d.exit_code == case.exit_code
        assert d.signal == case.signal
        assert d.cause is case.cause
        assert d.observed_at == status.observed_at
        line = str(d)
        assert "\n" not in line
        assert line.startswith(d.who)
        for word in case.words:
            assert word in line, f"{word!r} missing from: {line}"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["fork", "spawn"])
@pytest.mark.parametrize("case_id", ["exit-3", "sigkill", "sigsegv"])
def test_sentinel_fallback_without_pidfd_reports_the_same_exit(
    kind: str, case_id: str, diagnoser: ExitDiagnoser
) -> None:
    case = CASES[case_id]
    with started(kind, case.behaviour, use_pidfd=False) as s:
        assert s.process is not None
        assert s.watch.fileno() == s.process.sentinel
        if case.send is not None:
            os.kill(s.pid, case.send)
        status = s.watch.wait(timeout=30)
        assert status is not None
        # The sentinel closes before the child is a zombie; the status must still be the
        # real one (read by a blocking join, not guessed).
        assert status.returncode == case.exit_code
        assert status.source == "multiprocessing"
        assert s.process.exitcode == case.exit_code
        d = diagnoser.diagnose(s.watch)
        assert (d.exit_code, d.signal, d.cause) == (case.exit_code, case.signal, case.cause)


def test_watch_of_a_process_already_joined_knows_its_status_at_once() -> None:
    p = mp.get_context("fork").Process(target=helpers.exit_3)
    p.start()
    p.join(30)
    with ProcessWatch(p) as w:
        assert w.status is not None and w.status.returncode == 3
        assert w.status.source == "owner"
        assert w.poll() is w.status
        assert w.wait(0) is w.status
        assert w.is_alive() is False
    p.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("start_method", ["fork", "spawn", "forkserver"])
def test_a_watch_leaves_multiprocessing_bookkeeping_to_its_owner(start_method: str) -> None:
    """A watch that saw the exit has not reaped, polled or joined the child: the Process is
    still in multiprocessing's child list with its exit unknown to it, exactly as without
    the watch, until the owner's own ``join()``."""
    import multiprocessing.process

    p = mp.get_context(start_method).Process(target=helpers.exit_3)
    p.start()
    with ProcessWatch(p) as w:
        assert w.wait(30) is not None and w.status is not None
        assert w.status.returncode == 3
        if start_method != "forkserver":  # a forkserver child is the forkserver's to reap
            assert not reaped(p.pid)
            assert p._popen is not None and p._popen.returncode is None  # type: ignore[attr-defined]
    assert p in multiprocessing.process._children
    p.join(30)
    assert p.exitcode == 3
    assert p not in multiprocessing.process._children
    p.close()


@pytest.mark.timeout(30)
def test_poll_and_timed_wait_return_none_while_the_process_runs() -> None:
    with started("popen", "sleep") as s:
        assert s.watch.poll() is None
        assert s.watch.is_alive()
        t0 = time.monotonic()
        assert s.watch.wait(timeout=0.2) is None
        assert time.monotonic() - t0 >= 0.19
        assert s.watch.status is None
        assert "running" in repr(s.watch)


@pytest.mark.timeout(30)
def test_kill_and_terminate_go_through_the_pidfd() -> None:
    with started("popen", "sleep") as s:
        s.watch.terminate()
        status = s.watch.wait(30)
        assert status is not None and status.signal == signal.SIGTERM
        s.watch.kill()  # after the end: a no-op, not an error
    with started("pid-of-fork", "sleep") as s:
        s.watch.kill()
        status = s.watch.wait(30)
        assert status is not None and status.signal == signal.SIGKILL


@pytest.mark.timeout(30)
def test_sample_rss_remembers_the_peak_while_alive() -> None:
    code = "b = b'x' * (64 << 20); print('ready', flush=True); import time; time.sleep(600)"
    with subprocess.Popen([PYTHON, "-c", code], stdout=subprocess.PIPE) as p:
        with ProcessWatch(p) as w:
            assert p.stdout is not None and p.stdout.readline() == b"ready\n"
            rss = w.sample_rss()
            assert rss is not None and rss >= 64 << 20  # VmHWM: the peak, in bytes
            assert w.peak_rss_bytes == rss
            w.kill()
            w.wait(30)
            assert w.sample_rss() == rss  # dead: nothing new is read, the peak stays


# --------------------------------------------------------------------------- non-children


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_non_child_exit_status_is_read_from_its_zombie_proc_stat(
    sig: signal.Signals, diagnoser: ExitDiagnoser
) -> None:
    with grandchild(["sleep", "600"], mode="delay") as g:
        with ProcessWatch(g.pid) as w:
            assert w.is_child is False
            w.send_signal(sig)
            status = w.wait(timeout=30)
            assert status is not None
            assert status.returncode == -sig
            assert status.signal is sig
            assert status.source == f"/proc/{g.pid}/stat"
            assert "/stat" in status.source
            d = diagnoser.diagnose(w)
            assert (d.pid, d.exit_code, d.signal) == (g.pid, -sig, sig)
            assert d.cause is (
                Cause.SIGKILL_UNCONFIRMED if sig is signal.SIGKILL else Cause.TERMINATED
            )
            assert sig.name in str(d)
        # We read the status; its parent still reaps it (we never can).
        assert g.let_parent_reap() == f"reaped {-sig}"


@pytest.mark.timeout(60)
def test_non_child_exit_code_is_read_from_its_zombie_proc_stat() -> None:
    with grandchild(["sh", "-c", "exit 7"], mode="delay") as g:
        # It may already be a zombie: pidfd_open works on zombies, and it is still it.
        with ProcessWatch(g.pid) as w:
            status = w.wait(timeout=30)
            assert status is not None
            assert status.returncode == 7 and status.exit_code == 7
            assert status.source == f"/proc/{g.pid}/stat"
        assert g.let_parent_reap() == "reaped 7"


@pytest.mark.timeout(60)
def test_non_child_reaped_at_once_by_its_parent_has_an_unknown_status(
    diagnoser: ExitDiagnoser,
) -> None:
    with grandchild(["sleep", "600"], mode="immediate") as g:
        with ProcessWatch(g.pid) as w:
            w.kill()
            assert g.let_parent_reap() == "reaped -9"  # gone before we look
            status = w.wait(timeout=30)
            assert status is not None, "the death itself must still be seen"
            assert status.returncode is None
            assert status.signal is None and status.exit_code is None
            assert status.source.startswith("unknown")
            d = diagnoser.diagnose(w)
            assert d.cause is Cause.UNKNOWN
            assert (d.pid, d.exit_code, d.signal) == (g.pid, None, None)
            assert "unknown status" in str(d)
            assert "not this process's child" in str(d)


NOBODY = 65534


@pytest.mark.timeout(60)
def test_another_users_zombie_is_unknown_not_a_clean_exit(needs_root: None) -> None:
    # The kernel prints exit code 0 in /proc/<pid>/stat to callers that may not ptrace-read
    # the process: a SIGKILLed zombie of root's looks like "exit 0" to an unprivileged user.
    with grandchild(["sleep", "600"], mode="delay") as g:  # root's process
        with ProcessWatch(g.pid) as w:
            w.kill()
            assert w.wait(30) is not None  # it is a zombie now, kept by its parent
            rc, source, is_child = watch_as_user(NOBODY, g.pid)
            assert is_child is False
            assert rc is None, f"read {rc} from a zombie whose exit code is hidden from us"
            assert source == UNKNOWN_NOT_PERMITTED
            d = ExitDiagnoser(kmsg_path=None).diagnose(ExitStatus(rc, source), pid=g.pid)
            assert d.cause is Cause.UNKNOWN
            assert "belongs to another user" in str(d)
        assert g.let_parent_reap() == "reaped -9"


@pytest.mark.timeout(60)
def test_a_zombie_of_the_same_user_is_read_without_privileges(needs_root: None) -> None:
    with grandchild(["sleep", "600"], mode="delay", user=NOBODY) as g:
        with ProcessWatch(g.pid) as w:
            w.kill()
            assert w.wait(30) is not None
            assert watch_as_user(NOBODY, g.pid) == (-9, f"/proc/{g.pid}/stat", False)
        assert g.let_parent_reap() == "reaped -9"


@pytest.fixture
def needs_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: to run processes as another user and to drop to it")


# --------------------------------------------------------------------------- PID reuse


def _take_pid(pid: int, attempts: int = 200) -> subprocess.Popen[bytes] | None:
    """Start ``sleep`` with exactly ``pid`` (root: /proc/sys/kernel/ns_last_pid), or None."""
    for _ in range(attempts):
        try:
            with open("/proc/sys/kernel/ns_last_pid", "w") as f:
                f.write(str(pid - 1))
        except OSError:
            return None
        p = subprocess.Popen(["sleep", "600"])
        if p.pid == pid:
            return p
        p.kill()
        p.wait()
    return None


@pytest.mark.timeout(60)
def test_watch_stays_exited_and_harmless_when_its_pid_is_reused_by_a_child() -> None:
    first = subprocess.Popen(["sleep", "600"])
    newcomer: subprocess.Popen[bytes] | None = None
    with ProcessWatch(first) as w:
        try:
            first.kill()
            status = w.wait(30)
            assert status is not None and status.returncode == -9
            newcomer = _take_pid(first.pid)
            if newcomer is None:
                # Without the exact pid, still: new processes do not revive the watch.
                newcomer = subprocess.Popen(["sleep", "600"])
            assert newcomer.poll() is None
            assert w.poll() is status and not w.is_alive()
            w.kill()  # must not reach the newcomer, whatever its pid
            assert newcomer.poll() is None
            with ProcessWatch(newcomer) as fresh:
                assert fresh.poll() is None
        finally:
            if newcomer is not None:
                newcomer.kill()
                newcomer.wait()


@pytest.mark.timeout(60)
def test_watch_of_a_non_child_is_not_fooled_when_its_pid_names_another_process() -> None:
    if os.geteuid() != 0 or not os.access("/proc/sys/kernel/ns_last_pid", os.W_OK):
        pytest.skip("forcing a pid to be reused needs root (writes /proc/sys/kernel/ns_last_pid)")
    with grandchild(["sleep", "600"], mode="immediate") as g:
        w = ProcessWatch(g.pid)
        newcomer: subprocess.Popen[bytes] | None = None
        try:
            w.kill()
            assert g.let_parent_reap() == "reaped -9"
            newcomer = _take_pid(g.pid)
            if newcomer is None:
                pytest.skip(f"could not get pid {g.pid} again (other processes took it)")
            # The same number now names a live process. The watch's pidfd still names the
            # dead one: it is readable, its signals go nowhere, and the newcomer's
            # /proc/<pid>/stat (another start time) is not taken for the dead one's zombie.
            w.kill()
            assert newcomer.poll() is None, "the watch signalled a recycled pid"
            status = w.wait(timeout=10)
            assert status is not None and status.returncode is None
            assert status.source.startswith("unknown")
            with ProcessWatch(g.pid) as fresh:  # a new watch names the newcomer
                assert fresh.poll() is None
                assert fresh.is_child is True
        finally:
            w.close()
            if newcomer is not None:
                newcomer.kill()
                newcomer.wait()


def _fake_stat(real: str, *, state: str, start_time: int, exit_status: int) -> str:
    head, _, tail = real.rpartition(")")
    fields = tail.split()
    fields[0] = state
    fields[19] = str(start_time)
    fields[49] = str(exit_status)
    return f"{head}) {' '.join(fields)}\n"


@pytest.mark.timeout(60)
def test_zombie_stat_is_trusted_only_with_the_start_time_seen_at_construction(
    tmp_path: Path,
) -> None:
    with grandchild(["sleep", "600"], mode="delay") as g:
        real = Path(f"/proc/{g.pid}/stat").read_text()
        start_time = int(real.rpartition(")")[2].split()[19])
        roots = {}
        for label in ("same", "other"):
            root = tmp_path / label
            (root / str(g.pid)).mkdir(parents=True)
            (root / str(g.pid) / "stat").write_text(real)
            roots[label] = root
        same = ProcessWatch(g.pid, proc_root=str(roots["same"]))
        other = ProcessWatch(g.pid, proc_root=str(roots["other"]))
        try:
            # The zombie the watches will find: a raw wait status of 0x0900 is "exit 9".
            (roots["same"] / str(g.pid) / "stat").write_text(
                _fake_stat(real, state="Z", start_time=start_time, exit_status=9 << 8)
            )
            (roots["other"] / str(g.pid) / "stat").write_text(
                _fake_stat(real, state="Z", start_time=start_time + 1, exit_status=9 << 8)
            )
            same.kill()
            s1, s2 = same.wait(30), other.wait(30)
            assert s1 is not None and s1.returncode == 9
            assert s1.source == f"{roots['same']}/{g.pid}/stat"
            assert s2 is not None and s2.returncode is None, "another process's stat was trusted"
        finally:
            same.close()
            other.close()
        assert g.let_parent_reap() == "reaped -9"


def test_read_proc_stat_parses_a_comm_with_spaces_and_parentheses(tmp_path: Path) -> None:
    fields = ["Z", "1", "1"] + ["0"] * 16 + ["123456"] + ["0"] * 29 + ["35584"]
    (tmp_path / "77").mkdir()
    (tmp_path / "77" / "stat").write_text(f"77 (my (odd) name) {' '.join(fields)}\n")
    st = read_proc_stat(77, str(tmp_path))
    assert st is not None
    assert (st.pid, st.comm, st.state, st.ppid) == (77, "my (odd) name", "Z", 1)
    assert st.start_time == 123456
    assert st.exit_status == 35584 and os.waitstatus_to_exitcode(35584) == 139
    assert read_proc_stat(78, str(tmp_path)) is None
    me = read_proc_stat(os.getpid())
    assert me is not None and me.state in "RS" and me.ppid == os.getppid()


# --------------------------------------------------------------------------- errors


def _a_free_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid  # reaped: names no process (unless the kernel already reused it)


def test_watching_a_pid_that_does_not_exist_raises_no_such_process() -> None:
    for pid in (_a_free_pid(), 0, -5):
        if pid > 0 and os.path.exists(f"/proc/{pid}"):
            continue  # reused in between: not a pid that does not exist
        with pytest.raises(NoSuchProcessError) as info:
            ProcessWatch(pid)
        assert isinstance(info.value, ProcessLookupError)
        assert str(pid) in str(info.value)


def test_watching_a_process_not_started_raises_process_not_started() -> None:
    p = mp.get_context("spawn").Process(target=helpers.exit_0, name="never-started")
    with pytest.raises(ProcessNotStartedError, match=r"never-started.*start") as info:
        ProcessWatch(p)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("target", ["1234", 12.0, True, None, object()])
def test_watching_something_else_raises_type_error(target: object) -> None:
    with pytest.raises(TypeError, match=r"Process, a subprocess\.Popen or a pid"):
        ProcessWatch(target)  # type: ignore[arg-type]


def test_watching_a_popen_without_pidfd_is_refused_clearly() -> None:
    p = subprocess.Popen(["true"])
    try:
        with pytest.raises(NotImplementedError, match="pidfd"):
            ProcessWatch(p, use_pidfd=False)
    finally:
        p.wait()


@pytest.mark.timeout(30)
def test_a_closed_watch_raises_watch_closed_but_keeps_its_status() -> None:
    with started("popen", "exit_3") as s:
        w = s.watch
        status = w.wait(30)
        w.close()
        w.close()  # idempotent
        assert w.closed
        for call in (w.fileno, w.wait, w.poll, w.is_alive, w.kill):
            with pytest.raises(WatchClosedError) as info:
                call()
            assert isinstance(info.value, ValueError)
        assert w.status is status  # what was collected stays readable
    with started("popen", "sleep") as s:
        s.watch.kill()
        s.watch.wait(30)
        s.watch.close()
        with pytest.raises(WatchClosedError):
            s.watch.wait(1)


@pytest.mark.parametrize("timeout", [-1, -0.001, float("nan"), float("inf"), "x", True])
def test_wait_rejects_a_bad_timeout(timeout: object) -> None:
    with started("popen", "sleep") as s:
        with pytest.raises(InvalidArgumentError) as info:
            s.watch.wait(timeout)  # type: ignore[arg-type]
        assert isinstance(info.value, ValueError)


def test_python_child_helpers_are_importable_in_a_fresh_interpreter() -> None:
    # Guards the harness itself: a broken helpers import would look like "exit code 1".
    out = subprocess.run(
        [PYTHON, "-c", f"import sys; sys.path.insert(0, {helpers.HERE!r}); import helpers"],
        capture_output=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert sys.path[0] == helpers.HERE or helpers.HERE in sys.path


@pytest.mark.timeout(30)
def test_a_child_watched_by_pid_and_reaped_by_its_popen_is_unknown_and_says_so(
    diagnoser: ExitDiagnoser,
) -> None:
    """Popen.wait() keeps its real code (the watch never reaps), and the watch, which has no
    owner object to ask, says who took the status and what to watch instead."""
    popen = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(7)"])
    with ProcessWatch(popen.pid) as watch:
        os.waitid(os.P_PID, popen.pid, os.WEXITED | os.WNOWAIT)  # a zombie now, not reaped
        assert popen.wait(10) == 7
        status = watch.wait(10)
        assert status is not None and status.returncode is None
        d = diagnoser.diagnose(watch)
    assert d.cause is Cause.UNKNOWN
    assert "something else reaped it" in str(d) and "Watch the Popen or Process" in str(d)
