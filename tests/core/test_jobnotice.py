"""The job-wide notice where there is no job: a watchdog outside a launcher, or with the
notice turned off, behaves as on one machine (no witness, no link, one INFO line). The
multi-node behaviour itself is tested with real torchrun agents in
tests/torch/test_multinode.py."""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import time

import attrs
import pytest

import healthkit as hk
from healthkit import _jobnotice, lowlevel


def _sleeper() -> None:
    time.sleep(60)


def _witnesses() -> list[int]:
    """This process's children running the sidecar program (a witness or a sidecar)."""
    out = []
    for pid in lowlevel.children(os.getpid()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
        except OSError:
            continue
        if b"-I" in cmd and any(b"healthkit._watchdog.sidecar_process" in part for part in cmd):
            out.append(pid)
    return out


@pytest.fixture
def fresh_notice(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process-wide link state of its own for the test."""
    monkeypatch.setattr(_jobnotice, "_link", None)
    monkeypatch.setattr(_jobnotice, "_said_unavailable", False)
    monkeypatch.setattr(_jobnotice, "_CONNECT_TIMEOUT_S", 0.5)
    for name in ("MASTER_ADDR", "MASTER_PORT", "HEALTHKIT_JOB_NOTICE"):
        monkeypatch.delenv(name, raising=False)


def _armed_helper(**kwargs: object) -> tuple[hk.DisarmableWatchdog, mp.process.BaseProcess]:
    p = mp.get_context("fork").Process(target=_sleeper, daemon=True)
    p.start()
    return hk.DisarmableWatchdog([p], **kwargs).arm(), p  # type: ignore[arg-type]


def _end(wd: hk.DisarmableWatchdog, p: mp.process.BaseProcess) -> None:
    wd.disarm()
    p.terminate()
    p.join(10)


@pytest.mark.timeout(60)
def test_without_a_launcher_store_nothing_changes_and_it_is_said_once_at_info(
    fresh_notice: None, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.DEBUG, logger="healthkit")
    monkeypatch.setenv("RANK", "0")  # a rank without its launcher's store: said at INFO
    for _ in range(2):
        wd, p = _armed_helper()
        try:
            assert _witnesses() == []
            assert _jobnotice._link is None
        finally:
            _end(wd, p)
    said = [r for r in caplog.records if "no launcher store" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.INFO


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["argument", "environment"])
def test_turned_off_under_a_launcher_no_witness_and_no_link(
    fresh_notice: None, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "1")
    kwargs: dict[str, object] = {}
    if how == "argument":
        kwargs["job_notice"] = False
    else:
        monkeypatch.setenv("HEALTHKIT_JOB_NOTICE", "0")
    wd, p = _armed_helper(**kwargs)
    try:
        assert _witnesses() == []
        assert _jobnotice._link is None
    finally:
        _end(wd, p)


@pytest.mark.timeout(60)
def test_under_a_launcher_a_witness_runs_beside_the_owner_until_disarm(
    fresh_notice: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The must-fire side of the two tests above: with the launcher's variables set, arming
    starts one witness (shared by two watchdogs) and disarming the last one ends it. The store
    is unreachable here (port 1): the link gives up, said at INFO, and nothing else changes."""
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "1")
    wd1, p1 = _armed_helper()
    wd2, p2 = _armed_helper()
    try:
        witnesses = _witnesses()
        assert len(witnesses) == 1, witnesses
        wd1.disarm()
        assert _witnesses() == witnesses  # the other watchdog still uses it
    finally:
        _end(wd1, p1)
        _end(wd2, p2)
    deadline = time.monotonic() + 10
    while _witnesses() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _witnesses() == []
    link = _jobnotice._link
    if link is not None:
        link.join(10)  # it gives up on the unreachable store (no torch: at once)


def test_a_bad_switch_value_is_refused_at_arm(fresh_notice: None,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEALTHKIT_JOB_NOTICE", "sometimes")
    wd = hk.DisarmableWatchdog()
    with pytest.raises(hk.InvalidArgumentError, match="HEALTHKIT_JOB_NOTICE"):
        wd.arm()
    assert not wd.armed


def test_the_notice_of_another_rank_reads_as_where_it_happened() -> None:
    scope = _jobnotice.JobScope(addr="h", port=1, run_id="r", restart=0, rank=3,
                                node_rank=1, local_rank=1, host="node-b")
    d = hk.ExitDiagnoser().diagnose(-9, name="sampler-server", pid=4242, evidence=False)
    raw = _jobnotice.JobFailure.of(d, scope, origin_pid=77).to_bytes()
    told = _jobnotice.JobFailure.from_bytes(raw).diagnosis()
    assert told.elsewhere == "node 1 rank 3 (node-b)"
    assert str(told).startswith("stopped because node 1 rank 3 (node-b): sampler-server "
                                "(pid 4242) was killed by SIGKILL")
    assert told.cause is d.cause and told.exit_code == -9
    big = _jobnotice.JobFailure.of(
        attrs.evolve(d, evidence=tuple("x" * 1900 for _ in range(40))), scope
    )
    assert len(big.to_bytes()) <= _jobnotice.MAX_NOTICE_BYTES
    _jobnotice.JobFailure.from_bytes(big.to_bytes())


@pytest.mark.timeout(60)
def test_a_plain_program_hears_nothing_of_the_job_notice(
    fresh_notice: None, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    caplog.set_level(logging.INFO, logger="healthkit")
    wd, p = _armed_helper()
    try:
        assert _witnesses() == []
    finally:
        _end(wd, p)
    assert [r for r in caplog.records if "launcher store" in r.getMessage()] == []
