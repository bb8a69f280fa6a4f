"""launch_sampler_server with a real GL server and real clients (tests/graphlearn/scripts/
gl_owner.py runs each scenario in a scratch directory): it serves, it fails the owning rank
fast with the diagnosis when the server dies, and it never fires on a healthy teardown."""

from __future__ import annotations

import json
import os
import re
import signal
import time
import warnings
from pathlib import Path

import pytest
from gl_procs import Owner, alarms, pid_gone, run_owner

pytestmark = pytest.mark.graphlearn

# "it did not hang" bounds, generous for a loaded 2-core machine; measured figures are in
# docs/graphlearn.md (tens of milliseconds for the firing paths).
FAST_S = 20.0


def _valid_ids(ids: list[int]) -> bool:
    return len(ids) == 16 and all(0 <= i < 100 for i in ids)


def _killed_line(stderr: str, pid: int) -> str:
    m = re.search(
        rf"graphlearn sampler server 0 at 127\.0\.0\.1:\d+ \(pid {pid}\) was killed by SIGKILL",
        stderr,
    )
    assert m, stderr[-3000:]
    return m.group(0)


# --------------------------------------------------------------------------- it serves
def test_negative_sampling_through_the_launcher_with_a_client_in_the_main_process(
    tmp_path: Path,
) -> None:
    owner = Owner(tmp_path, "sample", "--workers", "0")
    owner.wait_ready()
    rc, out, err = owner.finish()
    assert rc == 0, err[-3000:]
    res = owner.result(out)
    assert _valid_ids(res["ids"]) and res["server_alive"]
    assert alarms(err) == [], err[-3000:]
    assert owner.strays == [] and pid_gone(res["server_pid"])


def test_clients_in_two_dataloader_workers_sample_through_the_launcher(tmp_path: Path) -> None:
    owner = Owner(tmp_path, "sample", "--workers", "2")
    owner.wait_ready()
    rc, out, err = owner.finish()
    assert rc == 0, err[-3000:]
    res = owner.result(out)
    assert _valid_ids(res["ids"]) and res["server_alive"]
    assert len(res["client_pids"]) == 2 and owner.proc.pid not in res["client_pids"]
    assert alarms(err) == [], err[-3000:]
    assert owner.strays == []


@pytest.mark.parametrize(
    ("workers", "server_exit"),
    [
        ("0", 0),  # the client closed: GL's orderly shutdown, the server exits 0 by itself
        ("2", -signal.SIGTERM),  # workers never close their clients: stop() SIGTERMs it
    ],
)
def test_stop_disarms_first_so_ending_the_server_is_never_a_crash(
    tmp_path: Path, workers: str, server_exit: int
) -> None:
    rc, out, err = run_owner(tmp_path, "sample-stop", "--workers", workers)
    assert rc == 0, err[-3000:]
    res = json.loads(next(ln for ln in out.splitlines() if ln.startswith("RESULT "))[7:])
    assert res["stop_exitcode"] == server_exit
    assert alarms(err) == [], err[-3000:]


def test_stop_kill_after_is_the_wait_before_sigkill_on_a_launched_server(
    tmp_path: Path,
) -> None:
    """``stop(kill_after=1.0)`` on a real, launched server that cannot act on SIGTERM (it is
    SIGSTOPped; the default would wait 10 s) kills it about 1 s after the SIGTERM. The
    keyword's pre-release name ``timeout=`` is refused before anything is signalled."""
    rc, out, err = run_owner(tmp_path, "stop-kill-after")
    assert rc == 0, err[-3000:]
    res = json.loads(next(ln for ln in out.splitlines() if ln.startswith("RESULT "))[7:])
    assert res["old_name_refused"] and res["alive_after_refusal"]
    assert res["warnings"] == []
    assert res["stop_exitcode"] == -signal.SIGKILL
    assert 1.0 <= res["stop_s"] < 8.0, res["stop_s"]
    assert pid_gone(res["server_pid"])
    # The escalation is logged, and it is the only healthkit warning: the watchdog was
    # disarmed first, so the SIGKILL is not reported as a crash.
    [escalation] = alarms(err)
    assert re.match(
        rf"WARNING healthkit: graphlearn sampler server 0 .*\[{res['server_pid']}\] ignored "
        r"SIGTERM for 1s; sending SIGKILL$",
        escalation,
    ), escalation


def test_a_second_launch_returns_the_running_server_and_says_so(tmp_path: Path) -> None:
    rc, out, err = run_owner(tmp_path, "duplicate")
    assert rc == 0, err[-3000:]
    assert "SAME True" in out
    assert "COUNT 1" in out  # one server process, not two
    started = [ln for ln in err.splitlines() if "started as pid" in ln]
    assert len(started) == 1
    same = "already launched by this process: returning <SamplerServer"
    assert re.search(rf"^INFO healthkit\.graphlearn: .*{same}", err, re.M), err[-3000:]
    # A different cluster is not silently reused: a warning says what was ignored.
    assert re.search(
        r"^WARNING healthkit\.graphlearn: .*'client_count': 9.* are ignored", err, re.M
    )


# --------------------------------------------------------------------------- it fires
@pytest.mark.parametrize("mode", ["sidecar", "thread"])
def test_sigkill_of_the_server_aborts_the_owner_with_the_diagnosis(
    tmp_path: Path, mode: str
) -> None:
    error_file = tmp_path / "error.json"
    owner = Owner(
        tmp_path, "serve", "--mode", mode, env={"TORCHELASTIC_ERROR_FILE": str(error_file)}
    )
    owner.wait_ready()
    killed_at = time.monotonic()
    os.kill(owner.server, signal.SIGKILL)
    rc, _, err = owner.finish()
    elapsed = time.monotonic() - killed_at
    line = _killed_line(err, owner.server)
    # thread mode exits 1; the sidecar stops its owner with SIGTERM
    assert rc == (1 if mode == "thread" else -signal.SIGTERM)
    assert elapsed < FAST_S
    assert line in json.loads(error_file.read_text())["message"]["extraInfo"]["py_callstack"]
    assert owner.strays == []


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["sidecar", "thread"])
def test_interpreter_exit_with_the_server_running_never_fires(tmp_path: Path, mode: str) -> None:
    # The owner returns from main without stopping anything: the watchdog disarms itself,
    # then multiprocessing's exit hook SIGTERMs the daemon server. Several runs, as the
    # ordering is what is being tested.
    for run in range(3):
        workdir = tmp_path / str(run)
        workdir.mkdir()
        rc, _, err = run_owner(workdir, "sample", "--mode", mode)
        assert rc == 0, err[-3000:]
        assert alarms(err) == [], err[-3000:]


@pytest.mark.parametrize(("mode", "rc"), [("thread", 1), ("sidecar", -signal.SIGTERM)])
def test_an_exit_right_after_the_server_died_still_reports_it(
    tmp_path: Path, mode: str, rc: int
) -> None:
    # The main thread leaves (exit code 3) while the watcher has not run yet; interpreter
    # exit must not disarm it silently: the death caused the exit.
    owner = Owner(tmp_path, "exit-after-death", "--mode", mode)
    owner.wait_ready()
    got, _, err = owner.finish()
    assert got == rc, err[-3000:]
    _killed_line(err, owner.server)


# --------------------------------------------------------------------------- the GIL case
@pytest.mark.timeout(180)
def test_sidecar_fails_the_rank_fast_while_its_client_call_holds_the_gil(tmp_path: Path) -> None:
    # GL's default retries: the in-flight call blocks ~17 min holding the GIL.
    owner = Owner(tmp_path, "sample-loop", "--mode", "sidecar")
    owner.wait_ready()
    killed_at = time.monotonic()
    os.kill(owner.server, signal.SIGKILL)
    rc, _, err = owner.finish()
    assert time.monotonic() - killed_at < FAST_S
    assert rc == -signal.SIGTERM
    _killed_line(err, owner.server)
    # the sidecar writes through the owner's stderr handler, in the owner's format
    assert "ERROR healthkit: stopping the owner (pid " in err


@pytest.mark.timeout(180)
def test_thread_mode_fails_fast_once_client_retries_are_shortened(tmp_path: Path) -> None:
    owner = Owner(tmp_path, "sample-loop", "--mode", "thread", "--shorten", "2")
    owner.wait_ready()
    killed_at = time.monotonic()
    os.kill(owner.server, signal.SIGKILL)
    rc, _, err = owner.finish()
    assert time.monotonic() - killed_at < FAST_S  # the call gives up after 2 s
    assert rc == 1
    _killed_line(err, owner.server)


@pytest.mark.timeout(180)
def test_thread_mode_alone_is_stuck_while_the_client_call_holds_the_gil(tmp_path: Path) -> None:
    """Why the sidecar is the default: while GL's client call holds the GIL, the watcher
    thread cannot run for the ~17 min of GL's default retries (the rank is still running 8 s
    after its server's SIGKILL). The kill can also land between two client calls: then the
    watcher may take the GIL, write its line and end the rank (3 runs in 78 here, most of them
    with three busy processes beside it on 2 cores). Such a run did not meet the claim's premise,
    so the test plays it once more and says so in a warning; a thread watchdog that ends the
    rank twice in a row (GL releasing the GIL, say) fails it."""
    for attempt in (1, 2):
        owner = Owner(tmp_path, "sample-loop", "--mode", "thread")
        owner.wait_ready()
        os.kill(owner.server, signal.SIGKILL)
        time.sleep(8)
        still_running = owner.proc.poll() is None
        rc, _, err = owner.finish(timeout=0)  # always: the owner, its server and sidecar reaped
        if still_running:
            assert rc == -signal.SIGKILL
            return
        fired = rc == 1 and re.search(r"\(pid \d+\) was killed by SIGKILL", err)
        assert fired and attempt == 1, f"exit {rc}:\n{err[-4000:]}"
        warnings.warn(
            "the thread watchdog found the GIL between two client calls and ended the rank; "
            "playing the kill once more",
            stacklevel=1,
        )


# --------------------------------------------------------------------------- no orphan
@pytest.mark.parametrize(
    ("mode", "sig"),
    [("sidecar", signal.SIGKILL), ("thread", signal.SIGKILL), ("sidecar", signal.SIGTERM)],
)
def test_the_server_dies_with_its_owner(tmp_path: Path, mode: str, sig: signal.Signals) -> None:
    owner = Owner(tmp_path, "serve", "--mode", mode)
    owner.wait_ready()
    server_watch = owner.watches[owner.server]
    owner.proc.send_signal(sig)
    owner.proc.wait(30)
    died = server_watch.wait(10)  # PR_SET_PDEATHSIG: at once, not at the reap below
    rc, _, err = owner.finish()
    assert rc == -sig
    assert died is not None, "the server outlived its owner"
    assert owner.strays == []
    assert alarms(err) == []


# --------------------------------------------------------------------------- start-up
def test_a_server_dying_during_start_up_raises_a_typed_error_with_its_diagnosis(
    tmp_path: Path,
) -> None:
    # A node file that does not exist: GL aborts (SIGABRT) while loading it.
    rc, out, err = run_owner(tmp_path, "startup-death")
    assert rc == 0, err[-3000:]
    res = json.loads(next(ln for ln in out.splitlines() if ln.startswith("RAISED "))[7:])
    assert res["type"] == "SamplerServerStartupError"
    assert (res["signal"], res["cause"]) == ("SIGABRT", "NATIVE_CRASH")
    assert "died while starting" in res["message"] and "killed by SIGABRT" in res["message"]
    assert res["after_s"] < 60 and res["children"] == []
    assert "Invalid argument:File not exist" in err  # GL's own reason, for the reader


def test_a_server_raising_during_start_up_names_its_exception(tmp_path: Path) -> None:
    """The server's entry point is wrapped in healthkit.record_exception by the launcher: a
    Python exception it raises is the diagnosis, not "exited with code 1"."""
    rc, out, err = run_owner(tmp_path, "startup-exception",
                             env={"HEALTHKIT_RECORD_DIR": str(tmp_path / "records")})
    assert rc == 0, err[-3000:]
    res = json.loads(next(ln for ln in out.splitlines() if ln.startswith("RAISED "))[7:])
    assert res["type"] == "SamplerServerStartupError"
    assert (res["cause"], res["exception"]) == ("ERROR_EXIT", "ValueError: Invalid cluster schema")
    assert "it raised ValueError: Invalid cluster schema at gl_owner.py:" in res["message"]
    assert res["children"] == []


def test_a_server_not_ready_in_time_is_stopped_and_raises(tmp_path: Path) -> None:
    rc, out, err = run_owner(tmp_path, "ready-timeout")
    assert rc == 0, err[-3000:]
    res = json.loads(next(ln for ln in out.splitlines() if ln.startswith("RAISED "))[7:])
    assert res["type"] == "SamplerServerTimeoutError"
    assert "HEALTHKIT_GL_READY_TIMEOUT_SECONDS" in res["message"]
    assert res["after_s"] < 30 and res["children"] == []


# --------------------------------------------------------------------------- wait=False
@pytest.mark.timeout(180)
def test_background_launch_returns_at_once_and_the_server_serves_past_its_deadline(
    tmp_path: Path,
) -> None:
    # Loading takes ~4 s here; the deadline is 8 s and the rank holds until 12 s after the
    # launch: a server that became ready in time keeps serving (the timer was disarmed).
    owner = Owner(tmp_path, "background", "--ready-timeout", "8", "--hold", "12")
    owner.wait_ready()
    launched = owner.result("\n".join(owner.out.lines), "LAUNCHED")
    rc, out, err = owner.finish()
    assert rc == 0, err[-3000:]
    assert launched["after_s"] < 2.0 and launched["ready"] is False
    assert launched["ready_after"] is None
    res = owner.result(out)
    assert res["short_wait"].startswith("SamplerServerTimeoutError: ")
    assert "keeps loading" in res["short_wait"]
    assert 0 < res["ready_after"] < 8 and res["ready"] is True
    assert res["alive_after_hold"] is True and _valid_ids(res["ids"])
    assert "loading" not in res["repr"]
    assert re.search(r"loading in the background, watched by the sidecar watchdog; if "
                     r"graph\.init\(\) has not returned after 8 s it ends itself with SIGALRM", err)
    assert alarms(err) == [], err[-3000:]
    assert owner.strays == []


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("mode", "rc"), [("sidecar", -signal.SIGTERM), ("thread", 1)])
def test_background_launch_a_death_while_loading_fails_the_rank(
    tmp_path: Path, mode: str, rc: int
) -> None:
    owner = Owner(tmp_path, "background-death", "--mode", mode)
    owner.wait_ready()
    got, _, err = owner.finish()
    assert got == rc, err[-3000:]
    assert re.search(
        rf"graphlearn sampler server 0 at 127\.0\.0\.1:\d+ \(pid {owner.server}\) was "
        "killed by SIGABRT",
        err,
    ), err[-3000:]
    assert owner.strays == []


def test_background_launch_wait_ready_raises_the_startup_diagnosis(tmp_path: Path) -> None:
    rc, out, err = run_owner(tmp_path, "background-death", "--arm", "0")
    assert rc == 0, err[-3000:]
    res = json.loads(next(ln for ln in out.splitlines() if ln.startswith("RAISED "))[7:])
    assert res["type"] == "SamplerServerStartupError" and res["signal"] == "SIGABRT"
    assert "died before it was ready to serve" in res["message"]


@pytest.mark.timeout(180)
def test_background_launch_not_ready_by_its_deadline_dies_of_sigalrm_and_fails_the_rank(
    tmp_path: Path,
) -> None:
    error_file = tmp_path / "error.json"
    # Loading takes ~4 s here: 1.5 s ends it first and leaves the owner, on a loaded machine,
    # time to say READY before the watchdog stops it (with 0.3 s it sometimes did not).
    owner = Owner(
        tmp_path,
        "background-deadline",
        "--ready-timeout",
        "1.5",
        env={"TORCHELASTIC_ERROR_FILE": str(error_file)},
    )
    owner.wait_ready()
    rc, _, err = owner.finish()
    assert rc == -signal.SIGTERM, err[-3000:]
    m = re.search(
        rf"graphlearn sampler server 0 at 127\.0\.0\.1:\d+ \(pid {owner.server}\) was "
        "killed by SIGALRM",
        err,
    )
    assert m, err[-3000:]
    assert m.group(0) in json.loads(error_file.read_text())["message"]["extraInfo"]["py_callstack"]
    assert "ends itself with SIGALRM (ready_timeout= or $HEALTHKIT_GL_READY_TIMEOUT_SECONDS)" in err
    assert owner.strays == []
