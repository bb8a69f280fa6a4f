"""DisarmableWatchdog: it fires on every abnormal exit while armed and never otherwise."""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import comm_of, kmsg_report

import healthkit as hk

OWNER = str(Path(__file__).parent.parent / "scripts" / "owner.py")
START_METHODS = ["fork", "spawn", "forkserver"]


def serve_forever() -> None:
    time.sleep(600)


def return_early() -> None:
    time.sleep(0.2)


def exit_3() -> None:
    sys.exit(3)


def _status(rc: int | None) -> hk.ExitStatus | None:
    return None if rc is None else hk.ExitStatus(rc, "fabricated")




# --------------------------------------------------------------------------- in-process
class Recorder:
    def __init__(self) -> None:
        self.events: list[hk.actions.FailureEvent] = []
        self.fired = threading.Event()

    def __call__(self, event: hk.actions.FailureEvent) -> None:
        self.events.append(event)
        self.fired.set()


def _start(ctx_name: str, target: object, name: str = "helper") -> mp.process.BaseProcess:
    p = mp.get_context(ctx_name).Process(target=target, name=name, daemon=True)  # type: ignore[attr-defined]
    p.start()
    return p


def _stop(*procs: mp.process.BaseProcess) -> None:
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join(10)
        p.close()  # release the sentinel now, not whenever the object is collected


@pytest.mark.parametrize("start_method", START_METHODS)
def test_sigkill_while_armed_fires_once_with_the_diagnosis(start_method: str) -> None:
    rec = Recorder()
    p = _start(start_method, serve_forever, "sampler-server")
    wd = hk.DisarmableWatchdog([p], actions=[rec]).arm()
    try:
        os.kill(p.pid, signal.SIGKILL)
        assert rec.fired.wait(10)
        time.sleep(0.1)
        assert len(rec.events) == 1
        d = rec.events[0].diagnosis
        assert (d.name, d.pid, d.exit_code, d.signal) == (
            "sampler-server",
            p.pid,
            -9,
            signal.SIGKILL,
        )
        assert d.cause in (hk.Cause.SIGKILL_UNCONFIRMED, hk.Cause.OOM_KILLED)
        assert wd.fired == d
    finally:
        wd.disarm()
        _stop(p)


@pytest.mark.timeout(60)
def test_actions_start_before_the_evidence_is_read_and_the_log_still_has_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Act first, explain right after. The kernel's OOM record for the helper is written
    only *inside* the first action (after the death was seen): the log line and `fired`
    still confirm the OOM kill, so the evidence was read after that action began; the first
    action itself saw the brief diagnosis (who and how, nothing read)."""
    kmsg_dir = Path(__file__).parent / "fixtures" / "kmsg"
    kmsg = tmp_path / "kmsg"
    kmsg.write_text((kmsg_dir / "before.txt").read_text())
    p = _start("fork", serve_forever, "sampler-server")
    comm = comm_of(p.pid)
    seen: list[tuple[hk.Diagnosis, hk.Diagnosis | None]] = []

    def first(event: hk.actions.FailureEvent) -> None:
        seen.append((event.brief, wd.fired))
        record = kmsg_report("after-oom-kill-4242.txt", p.pid, comm=comm)
        with open(kmsg, "a") as f:
            f.write(record)  # the kernel's record arrives only now

    rec = Recorder()
    diagnoser = hk.ExitDiagnoser(kmsg_path=str(kmsg))
    wd = hk.DisarmableWatchdog(
        [p], actions=[first, hk.actions.log_diagnosis(), rec], diagnoser=diagnoser
    ).arm()
    try:
        with caplog.at_level(logging.ERROR, logger="healthkit"):
            os.kill(p.pid, signal.SIGKILL)
            assert rec.fired.wait(20)
        brief, fired_then = seen[0]
        assert (brief.name, brief.pid, brief.signal) == ("sampler-server", p.pid, signal.SIGKILL)
        assert brief.cause is hk.Cause.SIGKILL_UNCONFIRMED and brief.evidence == ()
        assert fired_then == brief
        full = rec.events[0].diagnosis
        assert full.cause is hk.Cause.OOM_KILLED, full
        assert wd.fired == full
        assert "OOM killer (confirmed)" in caplog.text and f"Killed process {p.pid}" in caplog.text
    finally:
        wd.disarm()
        diagnoser.close()
        _stop(p)


@pytest.mark.timeout(60)
def test_an_event_with_a_diagnosis_given_is_not_deferred() -> None:
    """The non-deferred twin: a FailureEvent built from a Diagnosis (as an application or
    the sidecar builds it) has brief == diagnosis, and a deferred one needs its brief."""
    d = hk.ExitDiagnoser(kmsg_path=None).diagnose(-9, name="sampler-server", pid=4242)
    event = hk.actions.FailureEvent(d, "wd")
    assert event.brief is d and event.diagnosis is d
    with pytest.raises(TypeError, match="brief="):
        hk.actions.FailureEvent(lambda: d, "wd")


@pytest.mark.parametrize("start_method", START_METHODS)
def test_error_exit_while_armed_fires(start_method: str) -> None:
    rec = Recorder()
    p = _start(start_method, exit_3)
    with hk.DisarmableWatchdog([p], actions=[rec]):
        assert rec.fired.wait(30)
    assert rec.events[0].diagnosis.exit_code == 3
    assert rec.events[0].diagnosis.cause is hk.Cause.ERROR_EXIT
    _stop(p)


def test_alive_helper_never_fires() -> None:
    rec = Recorder()
    p = _start("fork", serve_forever)
    with hk.DisarmableWatchdog([p], actions=[rec]) as wd:
        assert not rec.fired.wait(0.5)
        assert wd.armed and wd.fired is None
    _stop(p)
    assert rec.events == []


@pytest.mark.parametrize("start_method", START_METHODS)
def test_exit_after_disarm_never_fires(start_method: str) -> None:
    rec = Recorder()
    p = _start(start_method, serve_forever)
    wd = hk.DisarmableWatchdog([p], actions=[rec]).arm()
    wd.disarm()
    p.terminate()  # what multiprocessing does to daemon children at exit
    p.join(10)
    assert not rec.fired.wait(0.3)
    assert not wd.armed


def test_clean_exit_of_a_process_allowed_to_finish_does_not_fire() -> None:
    rec = Recorder()
    p = _start("fork", return_early)
    wd = hk.DisarmableWatchdog(actions=[rec])
    wd.watch(p, on_clean_exit="ignore")
    with wd:
        p.join(10)
        assert not rec.fired.wait(0.3)
    assert p.exitcode == 0


def test_early_clean_exit_of_a_process_meant_to_run_until_disarmed_fires_by_default() -> None:
    rec = Recorder()
    p = _start("fork", return_early, "gl-server")
    with hk.DisarmableWatchdog([p], actions=[rec]):
        assert rec.fired.wait(10)
    d = rec.events[0].diagnosis
    assert d.exit_code == 0
    assert "expected to run until disarmed" in str(d)
    _stop(p)


def test_early_clean_exit_under_warn_policy_logs_and_does_not_fire(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rec = Recorder()
    p = _start("fork", return_early, "gl-server")
    with caplog.at_level(logging.WARNING, logger="healthkit"):
        with hk.DisarmableWatchdog([p], actions=[rec], on_clean_exit="warn"):
            p.join(10)
            deadline = time.monotonic() + 10
            while "declared to run until disarmed" not in caplog.text:
                assert time.monotonic() < deadline, "no warning logged"
                time.sleep(0.01)
    assert rec.events == []
    assert "gl-server" in caplog.text


def test_only_the_first_failure_fires() -> None:
    rec = Recorder()
    procs = [_start("fork", serve_forever, f"w{i}") for i in range(3)]
    with hk.DisarmableWatchdog(procs, actions=[rec]):
        for p in procs:
            os.kill(p.pid, signal.SIGKILL)
        assert rec.fired.wait(10)
        for p in procs:
            p.join(10)
        time.sleep(0.2)
    assert len(rec.events) == 1
    _stop(*procs)


def test_arm_twice_starts_one_thread_and_watching_twice_is_harmless() -> None:
    p = _start("fork", serve_forever)
    wd = hk.DisarmableWatchdog(actions=[Recorder()])
    w1 = wd.watch(p)
    w2 = wd.watch(p)
    assert w1 is w2 and len(wd.watches) == 1
    before = threading.active_count()
    wd.arm()
    wd.arm()
    assert threading.active_count() == before + 1
    wd.disarm()
    wd.disarm()  # idempotent too
    _stop(p)


@pytest.mark.parametrize("mode", ["thread", "sidecar"])
def test_an_armed_watchdog_without_references_keeps_watching(mode: str) -> None:
    import gc

    from healthkit._watchdog import core as _watchdog

    p = _start("fork", serve_forever, "helper")
    if mode == "thread":
        rec = Recorder()
        hk.DisarmableWatchdog([p], actions=[rec]).arm()  # no reference kept
    else:
        hk.DisarmableWatchdog([p], mode="sidecar").arm()
    gc.collect()
    try:
        (wd,) = list(_watchdog._ARMED)
        assert wd.armed
        if mode == "thread":
            p.kill()
            assert rec.fired.wait(10)
    finally:
        for wd in list(_watchdog._ARMED):
            wd.disarm()
        _stop(p)


def test_an_action_that_raises_does_not_stop_the_next_one() -> None:
    rec = Recorder()

    def broken(event: hk.actions.FailureEvent) -> None:
        raise OSError("disk full")

    p = _start("fork", serve_forever)
    with hk.DisarmableWatchdog([p], actions=[broken, rec]):
        p.kill()
        assert rec.fired.wait(10)
    _stop(p)


def test_raise_in_main_thread_interrupts_a_blocking_call() -> None:
    p = _start("fork", serve_forever, "feature-server")
    a, b = __import__("socket").socketpair()
    wd = hk.DisarmableWatchdog([p], actions=[hk.actions.raise_in_main_thread()]).arm()
    threading.Timer(0.2, p.kill).start()
    try:
        with pytest.raises(hk.ProcessDiedError) as info:
            a.recv(1)  # blocks until the signal interrupts it
        assert info.value.diagnosis.name == "feature-server"
        assert info.value.diagnosis.signal is signal.SIGKILL
    finally:
        wd.disarm()
        a.close()
        b.close()
        _stop(p)
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL  # handler restored


def test_raise_in_main_thread_refuses_to_arm_off_the_main_thread() -> None:
    p = _start("fork", serve_forever)
    wd = hk.DisarmableWatchdog([p], actions=[hk.actions.raise_in_main_thread()])
    errors: list[BaseException] = []

    def arm() -> None:
        try:
            wd.arm()
        except hk.UsageError as e:
            errors.append(e)

    t = threading.Thread(target=arm)
    t.start()
    t.join()
    assert errors and "main thread" in str(errors[0])
    wd.disarm()
    _stop(p)


def test_forked_child_inherits_an_inert_watchdog() -> None:
    p = _start("fork", serve_forever)
    rec = Recorder()
    wd = hk.DisarmableWatchdog([p], actions=[rec]).arm()
    pid = os.fork()
    if pid == 0:  # child: the inherited watchdog must not act, even when armed again
        code = 0
        try:
            code |= 1 if wd.armed else 0
            wd.arm()
            code |= 2 if wd.armed else 0
            code |= 4 if any("healthkit" in t.name for t in threading.enumerate()) else 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert wd.armed
    wd.disarm()
    _stop(p)


def test_bad_arguments_are_rejected_with_clear_errors() -> None:
    with pytest.raises(hk.InvalidArgumentError, match="mode"):
        hk.DisarmableWatchdog(mode="poll")  # type: ignore[arg-type]
    with pytest.raises(hk.InvalidArgumentError, match="on_clean_exit"):
        hk.DisarmableWatchdog(on_clean_exit="maybe")  # type: ignore[arg-type]
    with pytest.raises(hk.InvalidArgumentError, match="on_clean_exit"):
        hk.DisarmableWatchdog().watch(os.getpid(), on_clean_exit="never")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sidecar"):
        hk.DisarmableWatchdog(mode="sidecar", actions=[print])  # type: ignore[arg-type]
    with pytest.raises(hk.InvalidArgumentError):
        hk.DisarmableWatchdog(kill_after=-1)
    with pytest.raises(hk.ProcessNotStartedError):
        hk.DisarmableWatchdog([mp.get_context("fork").Process(target=serve_forever)])


@pytest.mark.parametrize(
    ("make", "argument"),
    [
        (lambda: hk.DisarmableWatchdog(mode="poll"), "mode"),  # type: ignore[arg-type]
        (lambda: hk.DisarmableWatchdog(mode="sidecar", actions=[print]), "actions"),
        (lambda: hk.DisarmableWatchdog(diagnoser="x"), "diagnoser"),  # type: ignore[arg-type]
        (lambda: hk.DisarmableWatchdog(actions=[1]), "actions"),  # type: ignore[list-item]
        (lambda: hk.DisarmableWatchdog(actions=print), "actions"),  # type: ignore[arg-type]
        (lambda: hk.DisarmableWatchdog(actions="log"), "actions"),  # type: ignore[arg-type]
        (lambda: hk.DisarmableWatchdog(stop_grace=-1), "stop_grace"),
        (lambda: hk.actions.raise_in_main_thread(signal.SIGKILL), "signum"),
        (lambda: hk.actions.raise_in_main_thread(signal.SIGSTOP), "signum"),
        (lambda: hk.actions.raise_in_main_thread(signal.SIGTERM), "signum"),
        (lambda: hk.actions.raise_in_main_thread(999), "signum"),
        (lambda: hk.actions.raise_in_main_thread("SIGUSR1"), "signum"),  # type: ignore[arg-type]
    ],
)
def test_every_argument_is_checked_at_construction_not_at_the_first_death(
    make: Any, argument: str
) -> None:
    """A wrong diagnoser or action used to be accepted and kill the watcher thread at the first
    death, leaving the owner unprotected; now the call that takes it refuses it."""
    with pytest.raises(hk.InvalidArgumentError) as info:
        make()
    assert info.value.argument == argument
    assert argument in str(info.value)


def test_a_watcher_that_breaks_says_so_and_shows_it_is_no_longer_armed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Any failure of the watcher itself ends in an ERROR line and ``armed`` False, never in
    a watchdog that says it is armed and watches nothing. Broken for real: the watch set's
    epoll fd is replaced under the watcher (``dup2`` of a pipe onto it, as a library that
    reuses a "free" fd number would)."""
    p = _start("fork", serve_forever)
    recorder = Recorder()
    wd = hk.DisarmableWatchdog([p], actions=[recorder]).arm()
    try:
        assert wd._set is not None
        epoll_fd = wd._set.fileno()
        with caplog.at_level(logging.ERROR, logger="healthkit"):
            r, w = os.pipe()
            os.dup2(r, epoll_fd)  # epoll_wait() on a pipe: EINVAL, the watcher's wait fails
            os.close(r)
            os.close(w)  # ...and the pipe is readable (EOF): nothing blocks
            wd._set.wake()
            deadline = time.monotonic() + 10
            while wd.armed and time.monotonic() < deadline:
                time.sleep(0.01)
        assert not wd.armed
        assert wd.error is not None
        assert "the watcher failed and stopped watching" in caplog.text
        # Its twin: a new watchdog on the same helper watches and fires as usual.
        with hk.DisarmableWatchdog([p], actions=[recorder]):
            p.kill()
            assert recorder.fired.wait(10)
    finally:
        wd.disarm()
        _stop(p)


@pytest.mark.parametrize("mode", ["thread", "sidecar"])
def test_a_helper_that_healthkit_stop_ends_is_never_reported(mode: str) -> None:
    """healthkit.stop() and the watchdog know each other: the SIGTERM and the SIGKILL of the
    ladder are healthkit's own, not a failure (a SIGTERM handler stopping a helper that
    ignores SIGTERM used to read "possibly the OOM killer"). Its twin fires: the same helper
    SIGKILLed by someone else."""
    proc, _ = run_owner("stop-with-healthkit", "--mode", mode)
    assert proc.returncode == 0, proc.stderr
    assert "SURVIVED" in proc.stdout
    assert "ERROR" not in proc.stderr and "OOM" not in proc.stderr, proc.stderr
    proc, _ = run_owner("kill-helper", "--mode", mode, timeout=60)
    assert proc.returncode != 0 and "killed by SIGKILL" in proc.stderr, proc.stderr


# --------------------------------------------------------------------------- whole processes
def run_owner(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> tuple[
    subprocess.CompletedProcess[str], list[int]
]:
    proc = subprocess.run(
        [sys.executable, OWNER, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    pids = _ready_pids(proc.stdout)
    _reap_strays(pids)
    return proc, pids


def _ready_pids(stdout: str) -> list[int]:
    for line in stdout.splitlines():
        if line.startswith("READY"):
            return [int(x) for x in line.split()[1:] if x != "0"]
    return []


def _reap_strays(pids: list[int]) -> list[int]:
    """Kill what the owner left behind after 5 s (healthkit.stop: by pidfd, never a recycled
    pid; the owner's helpers are not our children); return the pids that had to be killed."""
    report = hk.stop(pids, request=lambda: None, grace=5, kill_after=0, kill_timeout=10)
    return [*report.terminated, *report.killed, *report.survivors]


@pytest.mark.parametrize("mode", ["thread", "sidecar"])
@pytest.mark.parametrize("start_method", START_METHODS)
def test_normal_interpreter_exit_with_daemon_children_is_silent(
    mode: str, start_method: str
) -> None:
    for _ in range(3):
        proc, _ = run_owner("clean-exit", "--mode", mode, "--start-method", start_method)
        assert proc.returncode == 0, proc.stderr
        assert proc.stderr == ""


@pytest.mark.timeout(300)
def test_normal_interpreter_exit_is_silent_many_times() -> None:
    for _ in range(20):
        proc, _ = run_owner("clean-exit")
        assert (proc.returncode, proc.stderr) == (0, "")


@pytest.mark.parametrize("mode", ["thread", "sidecar"])
def test_log_to_stderr_after_arming_does_not_reorder_the_disarm(mode: str) -> None:
    for _ in range(5):
        proc, _ = run_owner("clean-exit", "--log-to-stderr", "--mode", mode)
        assert proc.returncode == 0, proc.stderr
        assert "calling terminate() for daemon helper-0" in proc.stderr
        assert "healthkit" not in proc.stderr


@pytest.mark.parametrize("mode", ["thread", "sidecar"])
def test_helper_killed_ends_the_owner_with_the_diagnosis_and_error_file(
    mode: str, tmp_path: Path
) -> None:
    err = tmp_path / "error.json"
    proc, pids = run_owner(
        "kill-helper", "--mode", mode, env={"TORCHELASTIC_ERROR_FILE": str(err)}
    )
    assert "NOT REACHED" not in proc.stdout
    helper = pids[0]
    line = f"helper-0 (pid {helper}) was killed by SIGKILL"
    assert line in proc.stderr
    if mode == "thread":
        assert proc.returncode == 1
    else:
        assert proc.returncode == -signal.SIGTERM  # the sidecar stops the owner
    payload = json.loads(err.read_text())
    assert line in payload["message"]["message"]
    assert line in payload["message"]["extraInfo"]["py_callstack"]
    assert payload["message"]["extraInfo"]["timestamp"].isdigit()


@pytest.mark.parametrize("mode", ["thread", "sidecar"])
def test_an_exit_that_follows_a_helper_death_still_reports_it(mode: str) -> None:
    # Disarming at shutdown must not swallow a death that happened before the shutdown.
    for _ in range(3):
        proc, pids = run_owner("exit-right-after-death", "--mode", mode)
        # Whichever runs first, the watcher or the exit, the death is reported once.
        assert proc.stderr.count("was killed by SIGKILL") == 1
        assert f"helper-0 (pid {pids[0]}) was killed by SIGKILL" in proc.stderr
        assert proc.returncode == (1 if mode == "thread" else -signal.SIGTERM)


def test_the_other_helpers_are_not_orphaned_when_the_watchdog_exits() -> None:
    proc, pids = run_owner("kill-helper", "--helpers", "3")
    assert proc.returncode == 1
    assert _reap_strays(pids) == []


def test_disarm_then_kill_survives() -> None:
    proc, _ = run_owner("disarm-then-kill")
    assert proc.returncode == 0, proc.stderr
    assert "SURVIVED" in proc.stdout and proc.stderr == ""


def test_early_exit_0_fails_the_owner_by_default() -> None:
    proc, _ = run_owner("early-exit-0", "--helpers", "1")
    assert proc.returncode == 1
    assert "exited with code 0 while it was expected to run until disarmed" in proc.stderr


def test_early_exit_0_under_warn_policy_keeps_the_owner_running() -> None:
    proc, _ = run_owner("early-exit-0", "--helpers", "1", "--policy", "warn")
    assert proc.returncode == 0
    assert "SURVIVED" in proc.stdout
    assert "although it was declared to run until disarmed" in proc.stderr


def _start_owner(*args: str) -> tuple[subprocess.Popen[str], list[int]]:
    owner = subprocess.Popen(
        [sys.executable, OWNER, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert owner.stdout is not None
    pids = [int(x) for x in owner.stdout.readline().split()[1:] if x != "0"]
    return owner, pids


def _finish(owner: subprocess.Popen[str], pids: list[int]) -> tuple[str, list[int]]:
    """Wait for the owner, clean up what it left, then read its stderr.

    Orphans of an owner that died abruptly keep its pipes open, so they go first.
    """
    owner.wait(60)
    strays = _reap_strays(pids)
    _, stderr = owner.communicate(timeout=30)
    return stderr, strays


@pytest.mark.parametrize("mode", ["thread", "sidecar"])
def test_keyboard_interrupt_in_the_owner_is_not_a_helper_failure(mode: str) -> None:
    owner, pids = _start_owner("sleep", "--mode", mode)
    owner.send_signal(signal.SIGINT)
    stderr, strays = _finish(owner, pids)
    assert "KeyboardInterrupt" in stderr
    assert "healthkit" not in stderr
    assert strays == []  # multiprocessing's exit hook stopped the helpers


@pytest.mark.parametrize("mode", ["thread", "sidecar"])
def test_sigterm_of_the_owner_by_a_launcher_is_not_a_helper_failure(mode: str) -> None:
    # With a handler that exits (a common pattern), teardown runs through the disarm hook.
    owner, pids = _start_owner("sleep", "--mode", mode, "--sigterm-exits")
    owner.send_signal(signal.SIGTERM)
    stderr, strays = _finish(owner, pids)
    assert owner.returncode == 143
    assert "healthkit" not in stderr
    assert strays == []
    # Without a handler the owner dies at once: nothing of ours runs, nothing is printed
    # (its daemon helpers are orphaned, as SIGTERM does to any process; cleaned up here).
    owner, pids = _start_owner("sleep", "--mode", mode)
    owner.send_signal(signal.SIGTERM)
    stderr, _ = _finish(owner, pids)
    assert owner.returncode == -signal.SIGTERM
    assert "healthkit" not in stderr


# --------------------------------------------------------------------------- the GIL case
@pytest.mark.timeout(120)
def test_thread_mode_cannot_fire_while_the_owner_holds_the_gil() -> None:
    owner, pids = _start_owner("kill-helper", "--gil-held-sleep", "8")
    try:
        # The helper is dead at once, but the owner's thread cannot run for 8 s.
        time.sleep(3)
        assert owner.poll() is None
    finally:
        stderr, _ = _finish(owner, pids)
    assert owner.returncode == 1
    assert "killed by SIGKILL" in stderr


@pytest.mark.timeout(120)
def test_sidecar_fires_while_the_owner_holds_the_gil(tmp_path: Path) -> None:
    err = tmp_path / "error.json"
    start = time.monotonic()
    proc, _pids = run_owner(
        "kill-helper",
        "--mode",
        "sidecar",
        "--gil-held-sleep",
        "60",
        env={"TORCHELASTIC_ERROR_FILE": str(err)},
        timeout=90,
    )
    assert time.monotonic() - start < 45  # far less than the 60 s GIL-held call
    assert proc.returncode == -signal.SIGTERM
    assert "GIL RELEASED" not in proc.stdout
    assert "healthkit sidecar" in proc.stderr and "killed by SIGKILL" in proc.stderr
    assert "stopping the owner" in proc.stderr
    assert "killed by SIGKILL" in json.loads(err.read_text())["message"]["message"]


def test_sidecar_exits_by_itself_when_its_owner_dies() -> None:
    owner, pids = _start_owner("sleep", "--mode", "sidecar")
    sidecar = pids[-1]
    with hk.ProcessWatch(sidecar) as w:
        owner.kill()
        owner.wait(30)
        assert w.wait(20) is not None
    _finish(owner, pids)


def test_sidecar_disarmed_over_its_pipe_exits_cleanly() -> None:
    proc, _pids = run_owner("disarm-then-kill", "--mode", "sidecar")
    assert proc.returncode == 0, proc.stderr
    assert "SURVIVED" in proc.stdout and proc.stderr == ""


# --------------------------------------------------------------------------- the sidecar itself
def test_a_sidecar_that_is_killed_is_reported_and_a_thread_takes_over(tmp_path: Path) -> None:
    err = tmp_path / "error.json"
    proc, pids = run_owner(
        "kill-sidecar-then-helper", "--mode", "sidecar",
        env={"TORCHELASTIC_ERROR_FILE": str(err)},
    )  # fmt: skip
    assert "SIDECAR GONE" in proc.stdout
    assert "NOT REACHED" not in proc.stdout
    assert "healthkit sidecar" in proc.stderr and "was killed by SIGKILL" in proc.stderr
    assert "Watching from a thread in this process from now on" in proc.stderr
    # The helper's death afterwards is caught by the thread that took over.
    assert f"helper-0 (pid {pids[0]}) was killed by SIGKILL" in proc.stderr
    assert proc.returncode == 1
    assert "helper-0" in json.loads(err.read_text())["message"]["message"]


def test_a_sidecar_survives_sighup_and_still_protects_the_owner(tmp_path: Path) -> None:
    proc, pids = run_owner("hup-sidecar-then-helper", "--mode", "sidecar")
    assert "SIDECAR ALIVE" in proc.stdout
    assert "NOT REACHED" not in proc.stdout
    assert f"helper-0 (pid {pids[0]}) was killed by SIGKILL" in proc.stderr
    assert proc.returncode == -signal.SIGTERM  # the sidecar stopped the owner


@pytest.mark.parametrize("mode", ["thread", "sidecar"])
def test_a_helper_death_while_non_daemon_threads_are_joined_at_exit_is_reported(
    mode: str,
) -> None:
    proc, pids = run_owner("helper-dies-during-thread-join", "--mode", mode)
    assert "NOT REACHED" not in proc.stdout
    assert f"helper-0 (pid {pids[0]}) was killed by SIGKILL" in proc.stderr
    assert proc.returncode == (1 if mode == "thread" else -signal.SIGTERM)


def test_the_sidecar_runs_isolated_from_the_working_directory(tmp_path: Path) -> None:
    """A module in the cwd or on PYTHONPATH that shadows the stdlib never runs in the
    sidecar (it runs as the owner's user, often root). The owner itself does import it
    (it is the owner's own path); the shadow records who imported it, then hands over the
    real module so the owner still works."""
    marker = tmp_path / "imported-by"
    (tmp_path / "selectors.py").write_text(
        "import importlib, os, sys\n"
        f"open({str(marker)!r}, 'a').write(f'{{os.getpid()}}\\n')\n"
        "here = os.path.dirname(os.path.abspath(__file__))\n"
        "sys.path[:] = [p for p in sys.path if os.path.abspath(p or '.') != here]\n"
        "del sys.modules['selectors']\n"
        "sys.modules['selectors'] = importlib.import_module('selectors')\n"
    )
    proc = subprocess.run(
        [sys.executable, OWNER, "clean-exit", "--mode", "sidecar"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    pids = _ready_pids(proc.stdout)
    _reap_strays(pids)
    assert proc.returncode == 0, proc.stderr
    sidecar = pids[-1]
    importers = {int(x) for x in marker.read_text().split()}
    assert importers, "the shadow module never ran: the test proves nothing"
    assert sidecar not in importers


# --------------------------------------------------------------------------- raise_in_main_thread
def test_raise_in_main_thread_passes_the_applications_own_signals_through() -> None:
    got: list[int] = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: got.append(signum))
    p = _start("fork", serve_forever)
    wd = hk.DisarmableWatchdog([p], actions=[hk.actions.raise_in_main_thread()]).arm()
    try:
        signal.raise_signal(signal.SIGUSR1)  # the application's own use of SIGUSR1
        assert got == [signal.SIGUSR1]
        os.kill(p.pid, signal.SIGKILL)
        with pytest.raises(hk.ProcessDiedError, match="was killed by SIGKILL"):
            time.sleep(10)
        assert got == [signal.SIGUSR1]  # ours did not reach the application's handler
    finally:
        wd.disarm()
        _stop(p)
        signal.signal(signal.SIGUSR1, previous)


# --------------------------------------------------------------------------- the whole helper tree
@pytest.mark.parametrize("mode", ["thread", "sidecar"])
def test_a_fired_watchdog_leaves_nothing_of_the_rank_behind(mode: str) -> None:
    """Unwatched helpers and their children (DataLoader workers stuck in a call) go too:
    with the rank gone they would be reparented to init and live on."""
    proc, _ = run_owner("kill-helper-with-tree", "--mode", mode, "--helpers", "1")
    assert "TREE ALIVE" not in proc.stdout and proc.returncode != 0, proc.stderr
    tree = [int(x) for x in proc.stdout.split("TREE ", 1)[1].split()[:2]]
    left = _reap_strays(tree)  # waits 5 s for them to end by themselves
    assert left == [], f"still running after the rank died: {left}"


def test_a_disarmed_watchdog_leaves_the_helper_tree_alone() -> None:
    proc, _ = run_owner("disarm-then-kill-with-tree", "--helpers", "1")
    assert "TREE ALIVE" in proc.stdout, proc.stdout + proc.stderr
    assert proc.returncode == 0, proc.stderr


# --------------------------------------------------------------------------- logging
@pytest.mark.parametrize("mode", ["thread", "sidecar"])
def test_the_diagnosis_goes_to_the_applications_log_file_in_thread_and_sidecar_mode(
    mode: str, tmp_path: Path
) -> None:
    """The owner logs to app.log (a FileHandler, its own format): the sidecar writes its
    lines there too, through the handler it was given at arm(), not to raw stderr."""
    app_log = tmp_path / "app.log"
    proc, pids = run_owner("kill-helper", "--mode", mode, "--log-file", str(app_log))
    text = app_log.read_text()
    name = "healthkit watchdog (sidecar)" if mode == "sidecar" else "healthkit watchdog"
    assert (
        f"APP ERROR healthkit: {name}: helper-0 (pid {pids[0]}) was killed by SIGKILL" in text
    ), text
    assert "healthkit" not in proc.stderr, proc.stderr  # nothing in any other format
    if mode == "sidecar":
        assert "APP ERROR healthkit: stopping the owner (pid " in text, text
        assert proc.returncode == -signal.SIGTERM
    else:
        assert proc.returncode == 1


@pytest.mark.parametrize("mode", ["thread", "sidecar"])
def test_a_healthkit_logger_set_above_error_prints_nothing_but_the_watchdog_still_acts(
    mode: str,
) -> None:
    """No handler configured: the fallback print honours the logger's level (in the sidecar
    as in the owner), and the job is still failed."""
    proc, _pids = run_owner("kill-helper", "--mode", mode, "--log-level", "CRITICAL")
    assert "healthkit" not in proc.stderr and "SIGKILL" not in proc.stderr, proc.stderr
    assert proc.returncode == (-signal.SIGTERM if mode == "sidecar" else 1)


@pytest.mark.parametrize("mode", ["thread", "sidecar"])
def test_a_disabled_healthkit_logger_still_gives_the_error_line(mode: str) -> None:
    """``disabled`` is what dictConfig sets on every logger that exists when it runs: it
    silences healthkit below ERROR, not the line that says why the job is ending."""
    proc, pids = run_owner("kill-helper", "--mode", mode, "--log-disabled")
    assert f"ERROR {'healthkit sidecar: ' if mode == 'sidecar' else ''}healthkit watchdog" \
        in proc.stderr, proc.stderr
    assert f"helper-0 (pid {pids[0]}) was killed by SIGKILL" in proc.stderr, proc.stderr
    assert "WARNING" not in proc.stderr, proc.stderr
    assert proc.returncode == (-signal.SIGTERM if mode == "sidecar" else 1)


@pytest.mark.parametrize("mode", ["thread", "sidecar"])
def test_dictconfig_after_import_keeps_the_error_line_in_the_apps_log(
    mode: str, tmp_path: Path
) -> None:
    """``logging.config.dictConfig`` with its default ``disable_existing_loggers=True``,
    after ``import healthkit``: the diagnosis still reaches the application's file."""
    app_log = tmp_path / "app.log"
    proc, pids = run_owner("kill-helper", "--mode", mode, "--log-dictconfig", str(app_log))
    text = app_log.read_text()
    assert "APP ERROR healthkit: " in text and (
        f"helper-0 (pid {pids[0]}) was killed by SIGKILL" in text
    ), (text, proc.stderr)
    assert proc.returncode == (-signal.SIGTERM if mode == "sidecar" else 1)


@pytest.mark.parametrize("mode", ["thread", "sidecar"])
def test_a_json_log_file_gets_only_json_lines_with_the_diagnosis(
    mode: str, tmp_path: Path
) -> None:
    """A formatter class of the application's own (JSON) cannot run in the sidecar: its
    lines are relayed to the owner, which writes them in its format; nothing in plain text
    lands in that file."""
    app_log = tmp_path / "app.jsonl"
    proc, pids = run_owner("kill-helper", "--mode", mode, "--log-json", str(app_log))
    lines = [json.loads(x) for x in app_log.read_text().splitlines()]  # each one is JSON
    died = [x for x in lines if f"helper-0 (pid {pids[0]}) was killed by SIGKILL" in x["message"]]
    assert len(died) == 1 and died[0]["level"] == "ERROR", lines
    assert died[0]["logger"] == "healthkit"
    assert proc.returncode == (-signal.SIGTERM if mode == "sidecar" else 1)


def test_a_queue_handler_gets_each_sidecar_line_once() -> None:
    """A QueueHandler is relayed to the owner; the sidecar's own stderr line is only for
    what the owner does not take: each line shows once."""
    proc, pids = run_owner("kill-helper", "--mode", "sidecar", "--log-queue")
    out = proc.stdout + proc.stderr
    died = f"helper-0 (pid {pids[0]}) was killed by SIGKILL"
    assert out.count(died) == 1, out
    assert f"QUEUED ERROR healthkit: healthkit watchdog (sidecar): {died}" in proc.stdout
    assert out.count("stopping the owner (pid ") == 1, out
    assert proc.returncode == -signal.SIGTERM


@pytest.mark.parametrize("mode", ["thread", "sidecar"])
def test_with_no_logging_configured_the_line_is_printed_with_its_level_sidecar_too(
    mode: str,
) -> None:
    """The twin of the silenced logger: unconfigured, the diagnosis is still printed."""
    proc, pids = run_owner("kill-helper", "--mode", mode)
    who = "healthkit sidecar: healthkit watchdog (sidecar)" if mode == "sidecar" else (
        "healthkit watchdog"
    )
    line = f"ERROR {who}: helper-0 (pid {pids[0]}) was killed by SIGKILL"
    assert line in proc.stderr, proc.stderr


def test_the_owner_hands_the_sidecars_lines_to_a_handler_the_sidecar_cannot_share() -> None:
    """A handler of the application's own (not a file or stream handler) cannot be opened by
    the sidecar: the owner, while it can run, passes the sidecar's lines to it before the
    sidecar stops it."""
    proc, pids = run_owner("kill-helper", "--mode", "sidecar", "--log-custom")
    assert (
        f"CUSTOM ERROR healthkit: healthkit watchdog (sidecar): helper-0 (pid {pids[0]}) was "
        "killed by SIGKILL" in proc.stdout
    ), (proc.stdout, proc.stderr)
    assert "CUSTOM ERROR healthkit: stopping the owner (pid " in proc.stdout, proc.stdout
    assert proc.returncode == -signal.SIGTERM


@pytest.mark.timeout(120)
def test_a_sidecar_with_a_custom_handler_still_stops_an_owner_holding_the_gil() -> None:
    """The twin: the owner's GIL is held, so it cannot hand anything over; the sidecar does
    not wait for it beyond its short bound, writes its own line to stderr and stops it."""
    start = time.monotonic()
    proc, pids = run_owner(
        "kill-helper", "--mode", "sidecar", "--log-custom", "--gil-held-sleep", "60", timeout=90
    )
    assert time.monotonic() - start < 45
    assert proc.returncode == -signal.SIGTERM
    assert "CUSTOM ERROR" not in proc.stdout, proc.stdout
    assert f"helper-0 (pid {pids[0]}) was killed by SIGKILL" in proc.stderr, proc.stderr


OWNER_WITH_DIAGNOSER = r"""
import multiprocessing as mp, os, signal, sys, time
import healthkit as hk
from healthkit.lowlevel import MemoryCgroup

def hold_memory(ready):
    block = bytearray(64 << 20)  # resident: written below
    for i in range(0, len(block), 4096):
        block[i] = 1
    ready.set()
    time.sleep(600)

if __name__ == "__main__":
    cgroup_dir, mode = sys.argv[1], sys.argv[2]
    # The helpers' own cgroup (a v2 directory, its files in the kernel's format) and no
    # kernel log: the documented set-up for helpers in another cgroup than their owner.
    diagnoser = hk.ExitDiagnoser(cgroup=MemoryCgroup(2, cgroup_dir), kmsg_path=None)
    ctx = mp.get_context("fork")
    ready = ctx.Event()
    p = ctx.Process(target=hold_memory, args=(ready,), name="sampler")
    p.start()
    wd = hk.DisarmableWatchdog([p], mode=mode, diagnoser=diagnoser, rss_sample_interval=0.02)
    wd.arm()
    ready.wait(30)
    time.sleep(0.3)  # sampled a few times while it holds its memory
    # The kernel counts an OOM kill in the helpers' cgroup and kills the helper.
    with open(os.path.join(cgroup_dir, "memory.events"), "w") as f:
        f.write("low 0\nhigh 0\nmax 7\noom 1\noom_kill 1\n")
    os.kill(p.pid, signal.SIGKILL)
    time.sleep(60)
    print("NOT STOPPED", flush=True)
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["thread", "sidecar"])
def test_both_modes_use_the_users_diagnoser_and_rss_sampling(tmp_path: Path, mode: str) -> None:
    """The sidecar builds the owner's diagnoser again (its cgroup, no kernel log, the OOM
    counter's baseline) and samples peak RSS as the owner's thread does: the line confirms
    the OOM kill from that cgroup's counter and gives the helper's sampled peak."""
    cgroup = tmp_path / "helpers"
    cgroup.mkdir()
    (cgroup / "memory.events").write_text("low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n")
    (cgroup / "memory.max").write_text("max\n")
    script = tmp_path / "owner.py"
    script.write_text(OWNER_WITH_DIAGNOSER)
    proc = subprocess.run(
        [sys.executable, str(script), str(cgroup), mode], capture_output=True, text=True,
        timeout=100,
    )
    assert "NOT STOPPED" not in proc.stdout
    assert proc.returncode == (-signal.SIGTERM if mode == "sidecar" else 1), proc.stderr
    line = next(
        (x for x in proc.stderr.splitlines() if "sampler (pid" in x and "SIGKILL" in x), ""
    )
    assert "the kernel's OOM killer (confirmed)" in line, proc.stderr
    assert f"cgroup {cgroup} (v2): oom_kill 0 -> 1 during this run (memory.events)" in line
    peak = re.search(r"its peak RSS ([\d.]+) MiB \(sampled VmHWM\)", line)
    assert peak is not None and float(peak.group(1)) >= 64, line
    if mode == "sidecar":
        assert "(sidecar)" in line


class _MyDiagnoser(hk.ExitDiagnoser):
    pass


def test_a_sidecar_refuses_a_diagnoser_subclass_it_cannot_run() -> None:
    d = _MyDiagnoser(kmsg_path=None)
    try:
        with pytest.raises(hk.InvalidArgumentError, match="subclass") as info:
            hk.DisarmableWatchdog(mode="sidecar", diagnoser=d)
        assert info.value.argument == "diagnoser"
        hk.DisarmableWatchdog(mode="thread", diagnoser=d)  # its code runs here: accepted
    finally:
        d.close()


class _CountingDict(dict):  # type: ignore[type-arg]
    """The watchdog's record table, counting how often something walks it."""

    walks = 0

    def values(self):  # type: ignore[no-untyped-def]
        type(self).walks += 1
        return super().values()


def test_watch_finds_a_duplicate_by_pid_without_walking_the_records() -> None:
    """Set-up stays O(1) per watch (benchmarks/bench_setup.py measures it): watch() looks a
    pid up instead of scanning every record; a second watch of the same pid still returns
    the first one."""
    procs = [subprocess.Popen(["sleep", "600"]) for _ in range(3)]
    wd = hk.DisarmableWatchdog(actions=[lambda event: None])
    try:
        wd._records = _CountingDict()
        _CountingDict.walks = 0
        watches = [wd.watch(p) for p in procs]
        assert wd.watch(procs[1]) is watches[1]  # the duplicate, found by its pid
        assert wd.watch(procs[1].pid) is watches[1]
        assert _CountingDict.walks == 0
        assert len(wd.watches) == 3
    finally:
        wd.disarm()
        for p in procs:
            p.kill()
            p.wait()
