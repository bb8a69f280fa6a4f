"""ExitDiagnoser: causes, the one-line message, and OOM attribution from real evidence files."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
from helpers import PYTHON, kmsg_report
from testutil import kernel_log_unusable, memory_cgroup_or_skip, remove_cgroup

from healthkit import Cause, Diagnosis, ExitDiagnoser, ExitStatus, ProcessWatch
from healthkit._diagnose.evidence import MemoryCgroup

KMSG = Path(__file__).parent / "fixtures" / "kmsg"


@pytest.fixture
def hermetic(tmp_path: Path) -> ExitDiagnoser:
    """No cgroup, no kernel log: only the exit status speaks."""
    return ExitDiagnoser(proc_root=str(tmp_path), kmsg_path=None)


def run_a_while() -> None:
    """Let a process run past the clock tick it started in (and the kernel log's clock skew)
    before it dies, as a real OOM victim does while it fills its memory: a kernel record
    stamped within that tick may be an earlier process's with the same pid, and confirms
    nothing."""
    time.sleep(0.03)


@contextlib.contextmanager
def sigkilled(name: str = "sampler") -> Iterator[ProcessWatch]:
    """A real child, SIGKILLed (not by the OOM killer) and collected by its watch."""
    p = subprocess.Popen(["sleep", "600"])
    with ProcessWatch(p, name=name) as w:
        try:
            run_a_while()
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


@contextlib.contextmanager
def small_tmpfs(tmp_path: Path, used_kib: int) -> Iterator[Path]:
    """A real 1 MiB tmpfs (a /dev/shm of our own) with ``used_kib`` of it written, or skip."""
    mnt = tmp_path / "shm"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True
    ).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root and mount permission)")
    try:
        if used_kib:
            (mnt / "segment").write_bytes(b"\1" * used_kib * 1024)
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("used_kib", [1000, 0])
def test_sigbus_says_whether_shared_memory_has_room_now(tmp_path: Path, used_kib: int) -> None:
    """Nearly full: "most often /dev/shm exhausted", with how much is left. With room: it
    says so and names the other causes, instead of a hint the evidence contradicts."""
    with small_tmpfs(tmp_path, used_kib) as shm:
        d = ExitDiagnoser(proc_root=str(tmp_path), kmsg_path=None, shm_path=str(shm)).diagnose(
            -7, name="worker", pid=4242
        )
    assert d.cause is Cause.BUS_ERROR
    if used_kib:
        assert d.likely.startswith("a bus error, most often shared memory (/dev/shm) exhausted")
        assert d.evidence == (f"{shm}: 24.0 KiB free of 1.0 MiB now (statvfs)",)
        assert d.hint.startswith("Raise /dev/shm (docker --shm-size")
    else:
        assert d.likely.startswith(f"a bus error; {shm} has room now, so either it was full "
                                   "only at that moment (freed since) or the cause is another")
        assert "a memory-mapped file truncated under it" in d.likely
        assert d.evidence == (f"{shm}: 1.0 MiB free of 1.0 MiB now (statvfs)",)


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
    ("tree_name", "version", "before", "name", "figures"),
    [
        ("cgroup-v1", 1, 2, "/kubepods/burstable/pod8f2c/ctr-5e1a",
         "limit 4.0 GiB; after its death the cgroup holds 2.0 MiB RSS and 874.0 MiB page "
         "cache (memory.stat)"),
        ("cgroup-v2", 2, 1, "/system.slice/train.service",
         "limit 8.0 GiB, peak use 8.0 GiB (memory.peak, page cache included); after its "
         "death the cgroup holds 1.5 GiB anon and 512.0 MiB page cache (memory.stat)"),
    ],
)
def test_a_rising_oom_kill_counter_confirms_exactly_one_sigkill(
    fixture_tree: Path, tree_name: str, version: int, before: int, name: str, figures: str
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
    # Every line says whose figures it gives: the cgroup's, by name, with its source file.
    assert (
        f"cgroup {name} (v{version}): oom_kill {before} -> {before + 1} during this run "
        f"({counter})"
    ) in d.evidence
    assert f"cgroup {name} (v{version}): {figures}" in d.evidence
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
    # A kernel log that cannot be opened: the path exists (a missing one is refused at the
    # call) but is a socket, which open() refuses (ENXIO), even for root.
    kmsg = tmp_path / "kmsg.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(kmsg))
    diagnoser = ExitDiagnoser(proc_root=str(tmp_path), kmsg_path=str(kmsg))
    with sigkilled() as w:
        d = diagnoser.diagnose(w)
    diagnoser.close()
    assert d.cause is Cause.SIGKILL_UNCONFIRMED
    assert "kernel log not readable" in d.evidence
    assert "no memory cgroup counter readable" in d.evidence


# --------------------------------------------------------------------------- OOM: kernel log


def _now_usec() -> int:
    return time.monotonic_ns() // 1000


def _stamped(text: str, usec: int) -> str:
    """Kernel-log records re-stamped at ``usec`` (their order kept)."""
    out = []
    for i, line in enumerate(text.splitlines()):
        if line and not line.startswith(" "):
            pri, seq, _, rest = line.split(",", 3)
            line = f"{pri},{seq},{usec + i},{rest}"
        out.append(line)
    return "\n".join(out) + "\n"


def _append(path: Path, fixture: str, pid: int) -> None:
    """Append a fixture's OOM report about ``pid``, logged now."""
    path.write_text(path.read_text() + kmsg_report(fixture, pid))


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
            run_a_while()
            w.kill()
            w.wait(30)
            assert diagnoser.diagnose(w).cause is Cause.SIGKILL_UNCONFIRMED

            _append(kmsg, "after-oom-kill-4242.txt", p.pid)
            d = diagnoser.diagnose(w)
            diagnoser.close()
    finally:
        p.wait(30)
    assert d.cause is Cause.OOM_KILLED
    assert d.evidence[0] == (
        f"kernel log: Memory cgroup out of memory: Killed process {p.pid} (python3) "
        "total-vm:528584kB, anon-rss:66560kB, file-rss:6616kB, shmem-rss:0kB, UID:0 "
        "pgtables:188kB oom_score_adj:0"
    )[:212]
    # The kernel's own figures, each naming whose they are and where they come from.
    assert d.evidence[1] == (
        "its memory at the kill 71.5 MiB resident: 65.0 MiB anon, 6.5 MiB file, 0 B shmem "
        "(kernel log)"
    )
    assert d.evidence[2] == (
        "the limit hit: memory cgroup /kubepods/burstable/pod8f2c/ctr-5e1a at 64.0 MiB of "
        "its 64.0 MiB limit, 63.8 MiB of it RSS (kernel log)"
    )


@pytest.mark.timeout(30)
def test_an_oom_record_of_an_earlier_process_with_the_same_pid_never_confirms(
    tmp_path: Path,
) -> None:
    """A recycled pid: the kernel log holds an OOM kill of this pid logged before this
    process started (while the diagnoser ran: a long job). A SIGKILL sent by hand to the
    new owner of the pid stays unconfirmed, and the evidence says why; the same record
    stamped after the start confirms."""
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("6,1,0,-;Linux version 6\n")
    diagnoser = ExitDiagnoser(proc_root=str(tmp_path), kmsg_path=str(kmsg))
    p = subprocess.Popen(["sleep", "600"])
    try:
        with ProcessWatch(p, name="sampler") as w:
            assert w.start_time is not None
            started_usec = w.start_time * 1_000_000 // os.sysconf("SC_CLK_TCK")
            text = (KMSG / "after-oom-kill-4242.txt").read_text().replace("4242", str(p.pid))
            kmsg.write_text(kmsg.read_text() + _stamped(text, started_usec - 2_000_000))
            w.kill()
            w.wait(30)
            d = diagnoser.diagnose(w)
            assert d.cause is Cause.SIGKILL_UNCONFIRMED, str(d)
            assert "(confirmed)" not in str(d)
            assert any(
                e.startswith(f"kernel log: an OOM kill of pid {p.pid} (python3) at ")
                and "before this process started" in e
                and "an earlier process with the same pid" in e
                for e in d.evidence
            ), d.evidence
            # The twin: the same report logged after it started is its own.
            kmsg.write_text(kmsg.read_text() + _stamped(text, started_usec + 50_000))
            assert diagnoser.diagnose(w).cause is Cause.OOM_KILLED
            # Without a start time (a bare exit code and pid), no record is taken as its.
            bare = diagnoser.diagnose(-9, pid=p.pid)
            assert bare.cause is Cause.SIGKILL_UNCONFIRMED
            assert any("its start time is unknown here" in e for e in bare.evidence)
    finally:
        p.wait(30)
        diagnoser.close()


@pytest.mark.timeout(30)
def test_an_oom_record_naming_another_command_is_not_this_process(tmp_path: Path) -> None:
    """While the dead process is a zombie its command name is known: a record stamped after
    its start but naming another command (the pid was reused in between) does not count."""
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("6,1,0,-;Linux version 6\n")
    diagnoser = ExitDiagnoser(cgroup_root=str(tmp_path), kmsg_path=str(kmsg))
    p = subprocess.Popen(["sleep", "600"])  # comm "sleep"; the fixture names "python3"
    try:
        with ProcessWatch(p, name="sampler") as w:
            run_a_while()
            w.kill()
            w.wait(30)  # a zombie until p.wait(): /proc/<pid>/stat names it
            _append(kmsg, "after-oom-kill-4242.txt", p.pid)
            d = diagnoser.diagnose(w)
            assert d.cause is Cause.SIGKILL_UNCONFIRMED, str(d)
            assert any("but this process is 'sleep'" in e for e in d.evidence), d.evidence
            renamed = (KMSG / "after-oom-kill-4242.txt").read_text().replace("python3", "sleep")
            kmsg.write_text(
                kmsg.read_text() + _stamped(renamed.replace("4242", str(p.pid)), _now_usec())
            )
            assert diagnoser.diagnose(w).cause is Cause.OOM_KILLED
    finally:
        p.wait(30)
        diagnoser.close()


@pytest.mark.timeout(30)
def test_the_kernel_report_of_a_real_v1_oom_kill_gives_whose_memory_it_was(
    tmp_path: Path,
) -> None:
    """Records as this machine's kernel wrote them for a real cgroup v1 OOM kill (captured,
    pid and cgroup renamed): the victim's RSS and the limited cgroup's RSS, page cache and
    limit at the kill."""
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("6,1,0,-;Linux version 6\n")
    diagnoser = ExitDiagnoser(proc_root=str(tmp_path), cgroup_root=str(tmp_path),
                              kmsg_path=str(kmsg))
    p = subprocess.Popen(["sleep", "600"])
    try:
        with ProcessWatch(p, name="sampler") as w:
            run_a_while()
            w.kill()
            w.wait(30)
            _append(kmsg, "oom-kill-cgroup-v1-full.txt", p.pid)
            d = diagnoser.diagnose(w)
    finally:
        p.wait(30)
        diagnoser.close()
    assert d.cause is Cause.OOM_KILLED, str(d)
    assert d.evidence[1:] == (
        "its memory at the kill 74.2 MiB resident: 67.8 MiB anon, 6.5 MiB file, 0 B shmem "
        "(kernel log)",
        "the limit hit: memory cgroup /kubepods/burstable/pod8f2c/ctr-5e1a/sampler at 64.0 "
        "MiB of its 64.0 MiB limit, 63.8 MiB of it RSS and 0 B page cache (kernel log)",
    )


@pytest.mark.timeout(30)
def test_a_global_oom_says_no_cgroup_limit_was_hit(tmp_path: Path) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("6,1,0,-;Linux version 6\n")
    diagnoser = ExitDiagnoser(proc_root=str(tmp_path), cgroup_root=str(tmp_path),
                              kmsg_path=str(kmsg))
    with sigkilled() as w:
        text = (KMSG / "after-global-oom-kill-7777.txt").read_text().replace("7777", str(w.pid))
        kmsg.write_text(kmsg.read_text() + _stamped(text, _now_usec()))
        d = diagnoser.diagnose(w)
    diagnoser.close()
    assert d.cause is Cause.OOM_KILLED
    assert "no cgroup limit was hit: the whole machine ran out of memory (kernel log, " \
        "CONSTRAINT_NONE)" in d.evidence
    assert "its memory at the kill 7.6 GiB resident: 7.6 GiB anon, 6.5 MiB file, 0 B shmem " \
        "(kernel log)" in d.evidence


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
    diagnoser.close()
    assert db.cause is Cause.OOM_KILLED, str(db)
    assert (
        "cgroup /kubepods/burstable/pod8f2c/ctr-5e1a (v1): oom_kill 2 -> 3 during this run "
        "(memory.oom_control)"
    ) in db.evidence


def _kmsg_logged_before_now(src: Path, dst: Path) -> float:
    """A copy of a kmsg fixture whose time stamps all lie in this machine's past: a record
    stamped after now is one logged after the death was seen, which names another process
    (a machine booted 20 minutes ago has not reached the fixture's 1472.5 s). The stamps are
    scaled, keeping their order. Returns the scale."""
    lines = src.read_text().splitlines(keepends=True)
    stamps = [int(line.split(";", 1)[0].split(",")[2]) for line in lines if ";" in line]
    limit = (time.monotonic() - 30) * 1e6
    scale = min(1.0, limit / max(stamps))
    assert scale > 0.01, "this machine booted too recently for the fixture"
    out = []
    for line in lines:
        if ";" in line and not line.startswith(" "):
            head, rest = line.split(";", 1)
            fields = head.split(",")
            fields[2] = str(int(int(fields[2]) * scale))
            line = ",".join(fields) + ";" + rest
        out.append(line)
    dst.write_text("".join(out))
    return scale


def test_history_mode_shows_past_records_but_confirms_only_a_known_process(
    fixture_tree: Path, tmp_path: Path
) -> None:
    # `healthkit explain -9 --pid 4242`: the kill happened before the diagnoser existed.
    tree = fixture_tree / "cgroup-v1"
    kmsg = tmp_path / "before.txt"  # holds an OOM kill of pid 4242 at 1472.5 s (scaled)
    scale = _kmsg_logged_before_now(fixture_tree / "kmsg" / "before.txt", kmsg)
    at = int(1472543212 * scale) / 1e6  # the OOM-killer line's stamp, in seconds
    live = _diagnoser_on(tree, kmsg)
    assert live.diagnose(-9, pid=4242).cause is Cause.SIGKILL_UNCONFIRMED  # not this run
    live.close()

    past = ExitDiagnoser(
        proc_root=str(tree / "proc"),
        cgroup_root=str(tree / "sys/fs/cgroup"),
        kmsg_path=str(kmsg),
        history=True,
    )
    # A pid from a log names no process for sure (it may have been reused since): the
    # record is shown, and confirms nothing.
    d = past.diagnose(-9, pid=4242, name="worker")
    assert d.cause is Cause.SIGKILL_UNCONFIRMED
    kill_line = next(e for e in d.evidence if e.startswith("kernel log: an OOM kill of pid 4242"))
    assert kill_line.startswith("kernel log: an OOM kill of pid 4242 (python3) at ")
    assert kill_line.endswith(
        " s after boot, not taken as this process's: its start time is unknown here"
    )
    assert abs(float(kill_line.split(" at ")[1].split(" s ")[0]) - at) < 0.2
    # With the process's start time (ticks since boot) before the record, it is its kill.
    ticks = os.sysconf("SC_CLK_TCK")
    d = past.diagnose(-9, pid=4242, name="worker", start_time=int(at * 0.95 * ticks))
    assert d.cause is Cause.OOM_KILLED
    assert d.evidence[0].startswith("kernel log: Memory cgroup out of memory: Killed process 4242")
    # Started after the record: an earlier process's kill.
    assert past.diagnose(-9, pid=4242, start_time=int((at + 30) * ticks)).cause is (
        Cause.SIGKILL_UNCONFIRMED
    )
    assert past.diagnose(-9, pid=4242, start_time=int(at * 1.02 * ticks)).cause is (
        Cause.SIGKILL_UNCONFIRMED
    )
    assert past.diagnose(-9, pid=4243).cause is Cause.SIGKILL_UNCONFIRMED
    past.close()

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
        "cgroup /kubepods/burstable/pod8f2c/ctr-5e1a (v1): oom_kill 2 since the cgroup was "
        "created (memory.oom_control; not necessarily this process)"
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


@pytest.mark.timeout(30)
def test_this_machines_cgroup_figures_are_labelled_or_left_out() -> None:
    """On this machine's real cgroup: with no limit on it or its parents, its figures (a
    container's lifetime peak, page cache included) are left out rather than read as the
    helper's; with a limit, they are shown labelled as the cgroup's, with the limit."""
    diagnoser = ExitDiagnoser(kmsg_path=None)
    cg = diagnoser.cgroup
    if cg is None:
        pytest.skip("no memory cgroup with an oom_kill counter is readable here")
    with sigkilled() as w:
        d = diagnoser.diagnose(w)
    limit = cg.effective_limit_bytes()
    figures = [e for e in d.evidence if e.startswith(f"cgroup {cg.name} (v{cg.version}): limit")]
    if limit is None:
        assert figures == [], d.evidence
    else:
        assert len(figures) == 1 and "(memory.stat)" in figures[0], d.evidence
    assert not any("peak" in e and "page cache" not in e for e in d.evidence), d.evidence


@pytest.mark.timeout(120)
def test_a_real_oom_kill_is_confirmed_by_the_kernel_log_and_the_cgroup_counter(
    tmp_path: Path,
) -> None:
    if (why := kernel_log_unusable()) is not None:
        pytest.skip(why)
    cg = MemoryCgroup(1, memory_cgroup_or_skip(64 << 20, "oom"))
    # Built before the run: kernel log only / cgroup counter only.
    by_kmsg = ExitDiagnoser(proc_root=str(tmp_path), cgroup_root=str(tmp_path))
    by_counter = ExitDiagnoser(cgroup=cg, kmsg_path=None)
    try:
        assert by_kmsg.cgroup is None and by_kmsg.kernel_log is not None
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
        assert (
            f"cgroup {cg.path} (v1): oom_kill 0 -> 1 during this run (memory.oom_control)"
        ) in d_counter.evidence
        # The cgroup's own figures: its limit, and what it holds after the kill (not a
        # lifetime peak with page cache, which would read as the helper's).
        assert any(
            e.startswith(f"cgroup {cg.path} (v1): limit 64.0 MiB; after its death the "
                         "cgroup holds ")
            for e in d_counter.evidence
        ), d_counter.evidence
        # From the kernel's report: the helper's own RSS, and the limit it hit.
        assert any(e.startswith("its memory at the kill ") for e in d_kmsg.evidence)
        assert any(
            e.startswith("the limit hit: memory cgroup /")
            and f"/{os.path.basename(cg.path)} at 64.0 MiB of its 64.0 MiB limit, " in e
            and e.endswith(" of it RSS and 0 B page cache (kernel log)")
            for e in d_kmsg.evidence
        ), d_kmsg.evidence
    finally:
        remove_cgroup(cg.path)
        for diagnoser in (by_kmsg, by_counter):
            diagnoser.close()
