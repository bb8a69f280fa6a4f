"""The ``healthkit`` command: the demo's scenarios end to end, doctor and explain."""

from __future__ import annotations

import importlib.metadata
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import healthkit
from healthkit._diagnose.evidence import find_memory_cgroup
from healthkit._tools.cli import main
from healthkit._tools.doctor import checks, report


def run_cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "healthkit", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def _can_limit_memory() -> bool:
    cg = find_memory_cgroup()
    return cg is not None and os.access(cg.path, os.W_OK)


@pytest.mark.timeout(240)
def test_demo_server_oom_hangs_without_and_fails_fast_with_the_diagnosis() -> None:
    proc = run_cli("demo", "--hang-timeout", "4")
    out = proc.stdout
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert "\033[" not in out and "\r" not in out  # not a TTY: plain lines only
    without, with_ = out.split("[2/2] with healthkit")
    assert "STILL HUNG after 4 s" in without
    assert "root cause" not in without
    assert re.search(r"JOB FAILED \d+ ms after the helper died \(rank 0 exited with code 1", with_)
    cause = (
        r"the kernel's OOM killer \(confirmed\) \[kernel log: Memory cgroup out of memory: "
        r"Killed process \d+"
        if _can_limit_memory()
        else r"possibly the OOM killer, unconfirmed"
    )
    assert re.search(
        r"healthkit watchdog: sampler-server \(pid \d+\) was killed by SIGKILL: " + cause, with_
    ), with_
    assert "without healthkit:   still hung after 4 s; the log names no cause" in out
    assert re.search(r"with healthkit:      failed \d+\.\d\d s after the helper died", out)


@pytest.mark.timeout(240)
def test_demo_worker_crash_at_init_names_the_segfault() -> None:
    proc = run_cli("demo", "--scenario", "worker-crash-at-init", "--hang-timeout", "4")
    assert proc.returncode == 0, proc.stderr
    without, with_ = proc.stdout.split("[2/2] with healthkit")
    assert "STILL HUNG after 4 s: the producer waits at its init barrier" in without
    assert "dead sampling workers (rank -> exitcode): {1: -11}" in with_
    assert re.search(
        r"- sampling worker 1 \(pid \d+\) was killed by SIGSEGV: a crash in native code", with_
    )


@pytest.mark.timeout(240)
def test_demo_worker_hang_at_init_shows_where_it_hangs() -> None:
    proc = run_cli("demo", "--scenario", "worker-hang-at-init", "--hang-timeout", "4")
    assert proc.returncode == 0, proc.stderr
    without, with_ = proc.stdout.split("[2/2] with healthkit")
    assert "STILL HUNG after 4 s" in without
    assert re.search(r"sampling init barrier timed out after 6\.\d\ds \(bound 6s\)", with_)
    assert re.search(r'File ".*_tools/demo.py", line \d+ in connect_to_feature_store', with_)
    assert "raise $SAMPLING_RPC_INIT_TIMEOUT_SECONDS (this bound is 3 x it)" in with_


def test_demo_rejects_a_bad_hang_timeout() -> None:
    proc = run_cli("demo", "--hang-timeout", "-3")
    assert proc.returncode == 2
    assert "--hang-timeout must be > 0 seconds, got -3.0" in proc.stderr


# --------------------------------------------------------------------------- version
def test_version_is_the_single_source_and_the_installed_metadata() -> None:
    proc = run_cli("--version", timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"healthkit {healthkit.__version__}\n"
    # Editable or wheel, the installed metadata was built from the same _version.py.
    assert importlib.metadata.version("pipeline-healthkit") == healthkit.__version__


# --------------------------------------------------------------------------- doctor
def test_doctor_on_this_machine() -> None:
    proc = run_cli("doctor", timeout=60)
    assert proc.returncode == 0
    lines = proc.stdout.splitlines()
    assert re.match(r"\[  ok   \] pidfd\s+pidfd_open works", lines[0])
    cg = find_memory_cgroup()
    if cg is not None:
        assert any(
            re.search(rf"memory cgroup\s+v{cg.version} at {re.escape(cg.path)}", ln) for ln in lines
        )
    assert any(re.search(r"\] /dev/shm\s+.* free of ", ln) for ln in lines)
    # The core needs no torch: doctor reports its version, or that it is absent.
    try:
        torch_line = re.escape(importlib.metadata.version("torch"))
    except importlib.metadata.PackageNotFoundError:
        torch_line = "not installed"
    assert any(re.search(rf"\[ info  \] torch\s+{torch_line}$", ln) for ln in lines)


def test_doctor_on_fixture_trees(fixture_tree: Path, tmp_path: Path) -> None:
    v2 = fixture_tree / "cgroup-v2"
    out = io.StringIO()
    assert report(out, proc_root=str(v2 / "proc"), cgroup_root=str(v2 / "sys/fs/cgroup"),
                  kmsg_path=str(tmp_path / "no-kmsg"), shm_path=str(tmp_path)) == 0
    text = out.getvalue()
    assert re.search(
        r"\[  ok   \] memory cgroup\s+v2 at .*train.service: memory.events oom_kill", text
    )
    assert re.search(r"\[ warn  \] kernel log\s+.*no-kmsg not readable", text)
    # No cgroup at all: a warning, not a failure.
    empty = tmp_path / "empty"
    (empty / "proc/self").mkdir(parents=True)
    (empty / "proc/self/cgroup").write_text("")
    results = {c.topic: c for c in checks(proc_root=str(empty / "proc"),
                                          cgroup_root=str(empty), kmsg_path="/nonexistent")}
    assert results["memory cgroup"].verdict == "warn"
    assert "no memory cgroup found" in results["memory cgroup"].detail


# --------------------------------------------------------------------------- explain
@pytest.mark.parametrize(
    ("code", "pattern"),
    [
        ("-9", r"^worker was killed by SIGKILL: possibly the OOM killer, unconfirmed \(from the "
               r"exit code alone: no evidence of this machine was read\)\. If nobody killed "
               r"it by hand, suspect memory: .*`healthkit explain CODE --pid PID` looks for its "
               r"kernel OOM record$"),
        ("137", r"^worker exited with code 137, the shell convention 128\+9 for death "
                r"by SIGKILL"),
        ("139", r"exited with code 139, the shell convention 128\+11 for death by SIGSEGV: a "
                r"crash in native code"),
        ("-7", r"was killed by SIGBUS: a bus error, most often shared memory \(/dev/shm\)"),
        ("1", r"exited with code 1: 1 is the generic failure code: an uncaught Python "
               r"exception gives it \(then its traceback is in that process's stderr\), and so "
               r"do sys\.exit\(1\)"),
        ("0", r"exited cleanly \(exit code 0\)$"),
        ("-15", r"was killed by SIGTERM: something asked it to stop"),
    ],
)
def test_explain_exit_codes_seen_in_logs(code: str, pattern: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """A code copied from a log, maybe another machine's: nothing of this machine (its
    cgroup, kernel log, /dev/shm) is added as evidence."""
    assert main(["explain", code, "--name", "worker"]) == 0
    out = capsys.readouterr().out.strip()
    assert re.search(pattern, out), out
    assert "[" not in out and "cgroup" not in out and "/dev/shm:" not in out


def test_explain_with_a_pid_reads_this_machines_evidence(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The non-firing twin: with --pid the exit happened here, and this machine's
    evidence is read (for SIGBUS, /dev/shm as it is now, labelled so)."""
    assert main(["explain", "-7", "--pid", "4242", "--name", "worker"]) == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith("worker (pid 4242) was killed by SIGBUS: a bus error")
    assert re.search(r"\[/dev/shm: \d+\.\d \w+ free of \d+\.\d \w+ now \(statvfs\)\]", out), out


def test_explain_rejects_what_is_not_an_exit_code() -> None:
    proc = run_cli("explain", "nine", timeout=60)
    assert proc.returncode == 2
    assert "invalid int value: 'nine'" in proc.stderr


# --------------------------------------------------------------------------- stacks
def test_stacks_of_a_pid_that_does_not_exist_says_so() -> None:
    proc = run_cli("stacks", "4000000", timeout=60)
    assert proc.returncode == 1
    assert proc.stdout.strip() == "=== pid 4000000: no such process", proc.stdout
    assert "opted in" not in proc.stdout


def test_stacks_with_a_missing_directory_is_an_error(tmp_path: Path) -> None:
    proc = run_cli("stacks", "--dir", str(tmp_path / "nonexistent"), timeout=60)
    assert proc.returncode == 2
    assert f"--dir {tmp_path / 'nonexistent'}: no such directory" in proc.stderr
    empty = run_cli("stacks", "--dir", str(tmp_path), timeout=60)  # the twin: it exists
    assert empty.returncode == 1
    assert "no running process has opted in to stack dumps in" in empty.stdout


def test_stacks_below_pid_1_lists_what_opted_in_and_counts_the_rest(tmp_path: Path) -> None:
    """`stacks 1` (torchrun's agent as a container's first process): the helpers that
    opted in, and a count of the rest, not a line for every process on the machine."""
    import time

    ready = tmp_path / "ready"
    code = (
        "import healthkit, pathlib, sys, time\n"
        "healthkit.lowlevel.enable_stack_dumps(sys.argv[1])\n"
        "pathlib.Path(sys.argv[2]).write_text('x')\n"
        "time.sleep(60)\n"
    )
    helper = subprocess.Popen([sys.executable, "-c", code, str(tmp_path), str(ready)])
    # More than the 10 listed by name, whatever else this machine runs at the moment.
    quiet_ones = [subprocess.Popen(["sleep", "60"]) for _ in range(12)]
    try:
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        proc = run_cli("stacks", "1", "--dir", str(tmp_path), "--timeout", "10", timeout=90)
    finally:
        for p in (helper, *quiet_ones):
            p.kill()
            p.wait()
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert any(ln.startswith(f"=== pid {helper.pid} (python") for ln in lines), proc.stdout
    assert "time.sleep" in proc.stdout or "<module>" in proc.stdout
    quiet = [ln for ln in lines if ln.endswith("not opted in to stack dumps (healthkit."
                                               "record_exception or healthkit.lowlevel."
                                               "enable_stack_dumps)")]
    assert len(quiet) <= 11, len(quiet)  # pid 1 itself, and at most 10 below it
    assert re.search(r"^=== and \d+ more processes below 1 that did not opt in", proc.stdout,
                     re.M), proc.stdout


def test_doctor_exit_status_warnings_and_strict(fixture_tree: Path, tmp_path: Path) -> None:
    """Warnings (no kernel log as non-root, ...) mean less evidence: exit 0 and a summary;
    --strict makes them exit 1 for a pre-flight script that wants everything."""
    v2 = fixture_tree / "cgroup-v2"
    roots = {"proc_root": str(v2 / "proc"), "cgroup_root": str(v2 / "sys/fs/cgroup"),
             "kmsg_path": str(tmp_path / "no-kmsg"), "shm_path": str(tmp_path)}
    out = io.StringIO()
    assert report(out, **roots) == 0
    assert re.search(r"^\d+ warnings? \(.*kernel log.*\): the core works", out.getvalue(), re.M)
    strict = io.StringIO()
    assert report(strict, strict=True, **roots) == 1
    assert "(exit 1: --strict)" in strict.getvalue()


def test_doctor_says_when_an_installed_integration_cannot_import(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The GLT distribution installed without a GLT stack: doctor names the import error
    instead of a bare version; an integration that imports is said to."""
    from healthkit._tools import doctor as _doctor

    broken = tmp_path / "healthkit_glt"
    broken.mkdir()
    (broken / "__init__.py").write_text(
        "raise ImportError('healthkit_glt needs torch and graphlearn-torch')\n"
    )
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.setattr(_doctor.importlib.metadata, "version", lambda dist: "0.1.0")
    results = {c.topic: c for c in checks(kmsg_path="/nonexistent")}
    glt = results["pipeline-healthkit-glt"]
    assert glt.verdict == "warn"
    assert glt.detail == (
        "0.1.0 installed, but import healthkit_glt fails: ImportError: healthkit_glt needs "
        "torch and graphlearn-torch"
    )
    assert _doctor._import_failure("healthkit") is None  # the twin: one that imports


@pytest.mark.timeout(240)
def test_demo_helper_stall_hangs_without_and_fails_with_the_stuck_helpers_stack() -> None:
    proc = run_cli("demo", "--scenario", "helper-stall", "--hang-timeout", "4")
    assert proc.returncode == 0, proc.stderr
    without, with_ = proc.stdout.split("[2/2] with healthkit")
    assert "STILL HUNG after 4 s" in without
    assert "root cause" not in without
    assert re.search(r"JOB FAILED \d+ ms after the helper stalled \(rank 0 exited with code 1",
                     with_), with_
    assert re.search(
        r"sampler-server \(pid \d+\) stalled: no progress for 2\.\d s while rank 0 waited for "
        r"a batch: it is alive and blocked: state S in futex", with_
    ), with_
    assert re.search(r'File ".*_tools/demo.py", line \d+ in refresh_neighbour_cache', with_), with_
    assert re.search(r'File ".*_tools/demo.py", line \d+ in _stalling_server', with_), with_
    assert "without healthkit:   still hung after 4 s; the log names no cause" in proc.stdout
    assert re.search(r"with healthkit:      failed \d+\.\d\d s after the helper stalled",
                     proc.stdout)


@pytest.mark.parametrize(
    ("line", "pattern"),
    [
        ("RuntimeError: DataLoader worker (pid 4242) is killed by signal: Killed. ",
         r"^DataLoader worker \(pid 4242\) was killed by SIGKILL: possibly the OOM killer, "
         r"unconfirmed \(no OOM record for it\)"),
        ("DataLoader worker (pid 4242) is killed by signal: Bus error. It is possible that "
         "dataloader's workers are out of shared memory.",
         r"^DataLoader worker \(pid 4242\) was killed by SIGBUS: .*\[/dev/shm: \d"),
        ("DataLoader worker (pid 4242) is killed by signal: Segmentation fault. ",
         r"^DataLoader worker \(pid 4242\) was killed by SIGSEGV: a crash in native code"),
        ("DataLoader worker (pid 4242) exited unexpectedly with exit code 3. Details are lost "
         "due to multiprocessing.",
         r"^DataLoader worker \(pid 4242\) exited with code 3"),
    ],
)
def test_explain_reads_torchs_dataloader_line_as_this_machines_worker(
    line: str, pattern: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """torch's own line, pasted whole: its signal (by the C library's name for it) or exit
    code, and its pid read as --pid, so this machine's evidence is looked at."""
    assert main(["explain", line]) == 0
    out = capsys.readouterr().out.strip()
    assert re.search(pattern, out), out


def test_explain_says_what_torchs_5s_check_line_lacks() -> None:
    """The twin that does not pass: torch's status-check line keeps no exit status."""
    proc = run_cli("explain", "DataLoader worker (pid(s) 4242) exited unexpectedly", timeout=60)
    assert proc.returncode == 2
    assert "does not keep the exit status" in proc.stderr and "4242" in proc.stderr
