"""ExitDiagnoser: causes, the one-line message, and OOM attribution from real evidence files."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
from helpers import PYTHON

from healthkit import Cause, Diagnosis, ExitDiagnoser, ExitStatus, ProcessWatch
from healthkit._evidence import KernelLog, MemoryCgroup, find_memory_cgroup

KMSG = Path(__file__).parent / "fixtures" / "kmsg"


@pytest.fixture
def hermetic(tmp_path: Path) -> ExitDiagnoser:
    """No cgroup, no kernel log: only the exit status speaks."""
    return ExitDiagnoser(proc_root=str(tmp_path), kmsg_path=None)


@contextlib.contextmanager
def sigkilled(name: str = "sampler") -> Iterator[ProcessWatch]:
    """A real child, SIGKILLed (not by the OOM killer) and collected by its watch."""
    p = subprocess.Popen(["sleep", "600"])
    with ProcessWatch(p, name=name) as w:
        try:
            w.kill()
            status = w.wait(30)
            assert status is not None and status.signal is signal.SIGKILL
            yield w
        finally:
            if p.returncode is None:
                p.kill()
                p.wait(30)


# --------------------------------------------------------------------------- cause table

# (returncode, cause, signal, words that str() must contain)
TABLE = [
    (0, Cause.CLEAN_EXIT, None, ["exited cleanly"]),
    (1, Cause.ERROR_EXIT, None, ["exited with code 1", "uncaught Python exception"]),
    (3, Cause.ERROR_EXIT, None, ["exited with code 3", "reported an error", "stderr"]),
    (-9, Cause.SIGKILL_UNCONFIRMED, signal.SIGKILL, ["SIGKILL", "unconfirmed", "memory limit"]),
    (137, Cause.SIGKILL_UNCONFIRMED, signal.SIGKILL, ["code 137", "128+9", "SIGKILL"]),
    (-11, Cause.NATIVE_CRASH, signal.SIGSEGV, ["SIGSEGV", "segmentation fault", "faulthandler"]),
    (139, Cause.NATIVE_CRASH, signal.SIGSEGV, ["code 139", "128+11", "SIGSEGV"]),
    (-6, Cause.NATIVE_CRASH, signal.SIGABRT, ["SIGABRT", "C++", "faulthandler"]),
    (134, Cause.NATIVE_CRASH, signal.SIGABRT, ["128+6", "SIGABRT"]),
    (-8, Cause.NATIVE_CRASH, signal.SIGFPE, ["SIGFPE", "division by zero"]),
    (-4, Cause.NATIVE_CRASH, signal.SIGILL, ["SIGILL", "another CPU"]),
    (-7, Cause.BUS_ERROR, signal.SIGBUS, ["SIGBUS", "/dev/shm", "--shm-size"]),
    (135, Cause.BUS_ERROR, signal.SIGBUS, ["128+7", "SIGBUS"]),
    (-15, Cause.TERMINATED, signal.SIGTERM, ["SIGTERM", "asked it to stop"]),
    (143, Cause.TERMINATED, signal.SIGTERM, ["128+15", "SIGTERM"]),
    (-2, Cause.TERMINATED, signal.SIGINT, ["SIGINT"]),
    (-1, Cause.TERMINATED, signal.SIGHUP, ["SIGHUP"]),
    (-13, Cause.UNKNOWN, signal.SIGPIPE, ["SIGPIPE", "closed pipe"]),
    (-int(signal.SIGRTMIN) - 1, Cause.UNKNOWN, None, [f"signal {int(signal.SIGRTMIN) + 1}"]),
    (128, Cause.ERROR_EXIT, None, ["exited with code 128"]),
    (255, Cause.ERROR_EXIT, None, ["exited with code 255"]),
]


@pytest.mark.parametrize(("rc", "cause", "sig", "words"), TABLE, ids=[str(t[0]) for t in TABLE])
def test_each_exit_code_maps_to_its_cause(
    hermetic: ExitDiagnoser,
    rc: int,
    cause: Cause,
    sig: signal.Signals | None,
    words: list[str],
) -> None:
    status = ExitStatus(rc, "fabricated", observed_at=123.0, observed_at_wall=1.7e9)
    d = hermetic.diagnose(status, name="sampler-3", pid=4242)
    assert d.cause is cause
    assert d.signal == sig
    assert d.exit_code == rc  # the raw code, even for 128+N
    assert (d.name, d.pid) == ("sampler-3", 4242)
    assert (d.observed_at, d.observed_at_wall) == (123.0, 1.7e9)
    assert d.abnormal is (cause is not Cause.CLEAN_EXIT)
    line = str(d)
    assert line.startswith("sampler-3 (pid 4242) ")
    assert "\n" not in line
    for word in words:
        assert word in line, f"{word!r} not in {line!r}"
    assert hermetic.diagnose(rc).cause is cause  # a bare return code works too


def test_core_dump_is_named_in_the_evidence(hermetic: ExitDiagnoser) -> None:
    d = hermetic.diagnose(ExitStatus(-11, "waitid", core_dumped=True))
    assert "core dumped" in d.evidence and "core dumped" in str(d)


def test_nothing_to_diagnose_yet_is_still_running(hermetic: ExitDiagnoser) -> None:
    d = hermetic.diagnose(None, name="server")
    assert d.cause is Cause.STILL_RUNNING and not d.abnormal
    assert d.exit_code is None and d.signal is None
    assert str(d) == "server is still running"
    assert abs(d.observed_at - time.monotonic()) < 60


def test_an_unknown_status_says_why_it_is_unknown(hermetic: ExitDiagnoser) -> None:
    d = hermetic.diagnose(ExitStatus(None, "unknown: not our child"), pid=99)
    assert d.cause is Cause.UNKNOWN
    assert "unknown status" in str(d) and "Watch it from its parent" in str(d)
    assert "source: unknown: not our child" in d.evidence


def test_diagnosis_is_a_frozen_value(hermetic: ExitDiagnoser) -> None:
    d = hermetic.diagnose(3)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        d.cause = Cause.CLEAN_EXIT  # type: ignore[misc]
    assert attrs.evolve(d, name="x").name == "x"
    assert isinstance(d, Diagnosis)


@pytest.mark.parametrize("subject", ["137", 1.0, True, object()])
def test_diagnosing_something_else_raises_type_error(
    hermetic: ExitDiagnoser, subject: object
) -> None:
    with pytest.raises(TypeError):
        hermetic.diagnose(subject)  # type: ignore[arg-type]


@pytest.mark.timeout(30)
def test_a_live_process_is_still_running(hermetic: ExitDiagnoser) -> None:
    p = subprocess.Popen(["sleep", "600"])
    with ProcessWatch(p, name="server") as w:
        d = hermetic.diagnose(w)
        assert d.cause is Cause.STILL_RUNNING
        assert (d.name, d.pid) == ("server", p.pid)
        w.kill()
        w.wait(30)
        assert hermetic.diagnose(w).cause is Cause.SIGKILL_UNCONFIRMED
    # A closed watch is diagnosed from the status it collected.
    assert hermetic.diagnose(w).cause is Cause.SIGKILL_UNCONFIRMED


@pytest.mark.timeout(30)
def test_shell_reports_its_childs_signal_as_128_plus_n(hermetic: ExitDiagnoser) -> None:
    # A real shell whose own child is SIGKILLed exits 137 (a launcher script, a `sh -c`).
    p = subprocess.Popen(["sh", "-c", 'sh -c "kill -KILL \\$\\$"; exit $?'])
    with ProcessWatch(p, name="launcher") as w:
        status = w.wait(30)
        assert status is not None and status.returncode == 137 and status.signal is None
        d = hermetic.diagnose(w)
        assert d.exit_code == 137
        assert d.signal is signal.SIGKILL
        assert d.cause is Cause.SIGKILL_UNCONFIRMED
        assert f"launcher (pid {p.pid}) exited with code 137, the shell convention 128+9" in str(d)


@pytest.mark.timeout(30)
def test_peak_rss_sampled_while_alive_is_evidence(hermetic: ExitDiagnoser) -> None:
    code = "b = b'x' * (48 << 20); print('ready', flush=True); import time; time.sleep(600)"
    with subprocess.Popen([PYTHON, "-c", code], stdout=subprocess.PIPE) as p:
        with ProcessWatch(p, name="sampler") as w:
            assert p.stdout is not None and p.stdout.readline() == b"ready\n"
            assert (w.sample_rss() or 0) >= 48 << 20
            w.kill()
            w.wait(30)
            d = hermetic.diagnose(w)
    assert d.cause is Cause.SIGKILL_UNCONFIRMED
    assert any(e.startswith("its peak RSS ") and "MiB" in e for e in d.evidence)


# --------------------------------------------------------------------------- OOM: cgroups


def _diagnoser_on(tree: Path, kmsg: Path | None = None) -> ExitDiagnoser:
    return ExitDiagnoser(
        proc_root=str(tree / "proc"),
        cgroup_root=str(tree / "sys/fs/cgroup"),
        kmsg_path=str(kmsg) if kmsg is not None else None,
    )


def _set_counter(cg: MemoryCgroup, value: int) -> None:
    path = Path(cg.path) / cg.counter_file
    text = path.read_text()
    head, _, tail = text.partition("oom_kill ")
    path.write_text(head + f"oom_kill {value}\n" + tail.partition("\n")[2])


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("tree_name", "version", "before", "peak_words"),
    [
        ("cgroup-v1", 1, 2, "cgroup memory peak 4.0 GiB of limit 4.0 GiB"),
        ("cgroup-v2", 2, 1, "cgroup memory peak 8.0 GiB of limit 8.0 GiB"),
    ],
)
def test_a_rising_oom_kill_counter_confirms_exactly_one_sigkill(
    fixture_tree: Path, tree_name: str, version: int, before: int, peak_words: str
) -> None:
    tree = fixture_tree / tree_name
    diagnoser = _diagnoser_on(tree)  # the baseline is read here, at construction
    cg = diagnoser.cgroup
    assert cg is not None and cg.version == version and cg.oom_kills() == before
    counter = "memory.oom_control" if version == 1 else "memory.events"

    _set_counter(cg, before + 1)  # the kernel counted one OOM kill during the run

    with sigkilled("sampler-0") as first:
        d = diagnoser.diagnose(first)
    assert d.cause is Cause.OOM_KILLED
    assert (d.name, d.pid, d.exit_code, d.signal) == (
        "sampler-0",
        first.pid,
        -9,
        signal.SIGKILL,
    )
    assert f"cgroup v{version} {counter} oom_kill {before} -> {before + 1} during this run" in (
        d.evidence
    )
    assert peak_words in d.evidence
    line = str(d)
    assert "was killed by SIGKILL: the kernel's OOM killer (confirmed)" in line
    assert "raise the memory limit" in line and "fewer DataLoader/sampling workers" in line

    # A second SIGKILL (the launcher tearing the next rank down) is not blamed on that one kill.
    with sigkilled("sampler-1") as second:
        d2 = diagnoser.diagnose(second)
    assert d2.cause is Cause.SIGKILL_UNCONFIRMED
    assert d2.signal is signal.SIGKILL
    assert not any("oom_kill" in e for e in d2.evidence)
    assert "possibly the OOM killer, unconfirmed" in str(d2)

    _set_counter(cg, before + 3)  # two more kills: the next two SIGKILLs are explained
    with sigkilled() as third, sigkilled() as fourth, sigkilled() as fifth:
        causes = [diagnoser.diagnose(w).cause for w in (third, fourth, fifth)]
    assert causes == [Cause.OOM_KILLED, Cause.OOM_KILLED, Cause.SIGKILL_UNCONFIRMED]


@pytest.mark.timeout(30)
def test_other_exits_never_use_up_an_oom_kill(fixture_tree: Path) -> None:
    diagnoser = _diagnoser_on(fixture_tree / "cgroup-v2")
    assert diagnoser.cgroup is not None
    _set_counter(diagnoser.cgroup, 2)
    for rc in (0, 3, -11, -15, -7):
        assert diagnoser.diagnose(rc).cause is not Cause.OOM_KILLED
    with sigkilled() as w:
        assert diagnoser.diagnose(w).cause is Cause.OOM_KILLED


@pytest.mark.timeout(30)
def test_sigkill_without_any_evidence_says_what_was_missing(tmp_path: Path) -> None:
    diagnoser = ExitDiagnoser(proc_root=str(tmp_path), kmsg_path=str(tmp_path / "no-kmsg"))
    with sigkilled() as w:
        d = diagnoser.diagnose(w)
    assert d.cause is Cause.SIGKILL_UNCONFIRMED
    assert "kernel log not readable" in d.evidence
    assert "no memory cgroup counter readable" in d.evidence


# --------------------------------------------------------------------------- OOM: kernel log


def _append(path: Path, fixture: str, pid: int) -> None:
    path.write_text(path.read_text() + (KMSG / fixture).read_text().replace("4242", str(pid)))


@pytest.mark.timeout(30)
def test_kernel_log_record_after_the_baseline_confirms_the_oom_kill(tmp_path: Path) -> None:
    kmsg = tmp_path / "kmsg"
    p = subprocess.Popen(["sleep", "600"])
    try:
        with ProcessWatch(p, name="sampler") as w:
            # The log already names this pid in an OOM kill from before the run (the pid
            # of an earlier process): it must not count.
            kmsg.write_text((KMSG / "before.txt").read_text().replace("4242", str(p.pid)))
            diagnoser = ExitDiagnoser(proc_root=str(tmp_path), kmsg_path=str(kmsg))
            w.kill()
            w.wait(30)
            assert diagnoser.diagnose(w).cause is Cause.SIGKILL_UNCONFIRMED

            _append(kmsg, "after-oom-kill-4242.txt", p.pid)
            d = diagnoser.diagnose(w)
    finally:
        p.wait(30)
    assert d.cause is Cause.OOM_KILLED
    assert d.evidence[0] == (
        f"kernel log: Memory cgroup out of memory: Killed process {p.pid} (python3) "
        "total-vm:528584kB, anon-rss:66560kB, file-rss:6616kB, shmem-rss:0kB, UID:0 "
        "pgtables:188kB oom_score_adj:0"
    )[:212]


@pytest.mark.timeout(30)
def test_kernel_log_confirmation_does_not_use_up_a_cgroup_count(fixture_tree: Path) -> None:
    # The kernel log names A (its OOM kill counted in a cgroup we do not watch); then our
    # cgroup counts one kill, and B is SIGKILLed: that count is B's, still unexplained.
    tree = fixture_tree / "cgroup-v1"
    kmsg = fixture_tree / "kmsg" / "live.txt"
    kmsg.write_text((KMSG / "before.txt").read_text())
    diagnoser = _diagnoser_on(tree, kmsg)
    assert diagnoser.cgroup is not None
    with sigkilled("A") as a:
        _append(kmsg, "after-oom-kill-4242.txt", a.pid)
        da = diagnoser.diagnose(a)
    assert da.cause is Cause.OOM_KILLED
    assert da.evidence[0].startswith("kernel log: ")
    assert not any("oom_kill 2 ->" in e for e in da.evidence)

    _set_counter(diagnoser.cgroup, 3)
    with sigkilled("B") as b:
        db = diagnoser.diagnose(b)
    assert db.cause is Cause.OOM_KILLED, str(db)
    assert "cgroup v1 memory.oom_control oom_kill 2 -> 3 during this run" in db.evidence


def test_history_mode_explains_an_exit_from_before_it_was_built(fixture_tree: Path) -> None:
    # `healthkit explain -9 --pid 4242`: the kill happened before the diagnoser existed.
    tree = fixture_tree / "cgroup-v1"
    kmsg = fixture_tree / "kmsg" / "before.txt"  # holds an OOM kill of pid 4242
    live = _diagnoser_on(tree, kmsg)
    assert live.diagnose(-9, pid=4242).cause is Cause.SIGKILL_UNCONFIRMED  # not this run

    past = ExitDiagnoser(
        proc_root=str(tree / "proc"),
        cgroup_root=str(tree / "sys/fs/cgroup"),
        kmsg_path=str(kmsg),
        history=True,
    )
    d = past.diagnose(-9, pid=4242, name="worker")
    assert d.cause is Cause.OOM_KILLED
    assert d.evidence[0].startswith("kernel log: Memory cgroup out of memory: Killed process 4242")
    assert past.diagnose(-9, pid=4243).cause is Cause.SIGKILL_UNCONFIRMED

    # Without a kernel record, the cgroup's lifetime count is shown but confirms nothing.
    blind = ExitDiagnoser(
        proc_root=str(tree / "proc"),
        cgroup_root=str(tree / "sys/fs/cgroup"),
        kmsg_path=None,
        history=True,
    )
    d = blind.diagnose(-9, pid=4242)
    assert d.cause is Cause.SIGKILL_UNCONFIRMED
    assert (
        "cgroup v1 memory.oom_control oom_kill 2 since the cgroup was created "
        "(not necessarily this process)"
    ) in d.evidence


# --------------------------------------------------------------------------- this machine


def test_default_diagnoser_reads_this_machines_cgroup() -> None:
    diagnoser = ExitDiagnoser()
    if diagnoser.cgroup is None:
        pytest.skip("no memory cgroup with an oom_kill counter is readable here")
    with open("/proc/self/cgroup") as f:
        has_v1_memory = any(
            "memory" in line.split(":", 2)[1].split(",") for line in f if line.count(":") >= 2
        )
    assert diagnoser.cgroup.version == (1 if has_v1_memory else 2)
    assert isinstance(diagnoser.cgroup.oom_kills(), int)
    assert diagnoser.diagnose(0).cause is Cause.CLEAN_EXIT


def _child_memory_cgroup() -> MemoryCgroup:
    """Make a v1 child memory cgroup limited to 64 MiB under ours, or skip with the reason."""
    if os.geteuid() != 0:
        pytest.skip("a real OOM kill needs root to create a memory cgroup")
    parent = find_memory_cgroup()
    if parent is None:
        pytest.skip("no memory cgroup found from /proc/self/cgroup")
    if parent.version != 1:
        pytest.skip(
            "cgroup v2: a child cgroup with its own memory.max needs the memory controller "
            "delegated (subtree_control) to a parent without processes; not set up here"
        )
    path = os.path.join(parent.path, f"healthkit-test-oom-{os.getpid()}")
    try:
        os.mkdir(path)
    except OSError as e:
        pytest.skip(f"cannot create a child memory cgroup under {parent.path}: {e}")
    try:
        for name in ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes"):
            if os.path.exists(os.path.join(path, name)):
                with open(os.path.join(path, name), "w") as f:
                    f.write(str(64 << 20))
    except OSError as e:
        os.rmdir(path)
        pytest.skip(f"cannot set a memory limit on {path}: {e}")
    return MemoryCgroup(1, path)


def _in_nested_pid_namespace() -> bool:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("NSpid:"):
                return len(line.split()) > 2
    return False


def _remove_cgroup(path: str) -> None:
    deadline = time.monotonic() + 10
    while True:
        try:
            os.rmdir(path)
            return
        except OSError as e:  # EBUSY while the kernel still tears a dead task down
            if e.errno != errno.EBUSY or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


@pytest.mark.timeout(120)
def test_a_real_oom_kill_is_confirmed_by_the_kernel_log_and_the_cgroup_counter(
    tmp_path: Path,
) -> None:
    if KernelLog().last_seq() is None:
        pytest.skip("/dev/kmsg is not readable here: the kernel log cannot confirm an OOM kill")
    if _in_nested_pid_namespace():
        pytest.skip("in a nested pid namespace the kernel log names pids from another one")
    cg = _child_memory_cgroup()
    try:
        # Built before the run: kernel log only / cgroup counter only.
        by_kmsg = ExitDiagnoser(proc_root=str(tmp_path), cgroup_root=str(tmp_path))
        assert by_kmsg.cgroup is None and by_kmsg.kernel_log is not None
        by_counter = ExitDiagnoser(cgroup=cg, kmsg_path=None)
        assert by_counter.cgroup == cg and cg.oom_kills() == 0

        code = (
            "import sys; sys.stdin.readline(); b = b'\\x01' * (500 << 20); "
            "print('survived', flush=True)"
        )
        with subprocess.Popen(
            [PYTHON, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        ) as p, ProcessWatch(p, name="allocator") as w:
            try:
                with open(os.path.join(cg.path, "cgroup.procs"), "w") as f:
                    f.write(str(p.pid))  # moved in before it allocates
                assert p.stdin is not None
                p.stdin.write(b"go\n")
                p.stdin.flush()
                status = w.wait(timeout=90)
                assert status is not None
                assert status.returncode == -9, "the 500 MiB allocation was not OOM-killed"
                d_kmsg = by_kmsg.diagnose(w)
                d_counter = by_counter.diagnose(w)
            finally:
                if p.poll() is None:
                    p.kill()
        assert p.returncode == -9

        assert (d_kmsg.name, d_kmsg.pid, d_kmsg.exit_code, d_kmsg.signal) == (
            "allocator",
            p.pid,
            -9,
            signal.SIGKILL,
        )
        assert d_kmsg.cause is Cause.OOM_KILLED, str(d_kmsg)
        assert any(
            e.startswith("kernel log: ") and f"Killed process {p.pid} " in e
            for e in d_kmsg.evidence
        ), d_kmsg.evidence
        assert "OOM killer (confirmed)" in str(d_kmsg)

        assert d_counter.cause is Cause.OOM_KILLED, str(d_counter)
        assert "cgroup v1 memory.oom_control oom_kill 0 -> 1 during this run" in (
            d_counter.evidence
        )
        assert "cgroup memory peak 64.0 MiB of limit 64.0 MiB" in d_counter.evidence
    finally:
        _remove_cgroup(cg.path)
