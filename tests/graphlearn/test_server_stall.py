"""A live GL sampler server that leaves a client call unanswered for ``stall_timeout`` fails
the rank with the server's state and stacks (tzrec's negative sampler, clients in DataLoader
workers); answers held back by less than the timeout, a stopped server nobody calls, and a
graceful stop of the rank under way never do. A real GL server, stalled by a real SIGSTOP
(tests/graphlearn/scripts/gl_owner.py ``stall`` and ``stall-stop``)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest
from gl_procs import Owner, alarms

pytestmark = [pytest.mark.graphlearn, pytest.mark.timeout(120)]

T = 1.0  # the stall_timeout of these runs
# "it did not hang": the promise is about T; the report then reads /proc and runs py-spy,
# and the sidecar stops the rank, on a loaded machine.
FIRE_BOUND = T + 10.0


def _py_spy_dir() -> str | None:
    """Where py-spy is, if installed anywhere this tree's tools are (never required)."""
    found = shutil.which("py-spy")
    if found:
        return os.path.dirname(found)
    root = Path(__file__).resolve().parents[2]
    for d in (Path(sys.executable).parent, root / ".venv" / "bin"):
        if (d / "py-spy").exists():
            return str(d)
    return None


def test_an_unanswered_call_fails_the_rank_with_the_servers_state_and_stacks_and_slow_or_idle_never_does(  # noqa: E501
    tmp_path: Path,
) -> None:
    spy = _py_spy_dir()
    env = {"PATH": f"{spy}:{os.environ.get('PATH', '')}"} if spy else None
    owner = Owner(tmp_path, "stall", "--workers", "2", "--stall-timeout", str(T), env=env)
    owner.wait_ready(120)
    rc, out, err = owner.finish(90)
    ended = time.monotonic()
    assert owner.strays == [], f"left running: {owner.strays}"
    # Slow answers (held back 0.4 T, for 3 T) and 2 T of a stopped server nobody called
    # did not fire: the rank got to its last read.
    m_idle = re.search(r"^IDLE (\d+) batches", out, re.M)
    assert m_idle and int(m_idle.group(1)) >= 3, (out, err[-3000:])
    m_wait = re.search(r"^WAITING ([\d.]+)", out, re.M)
    assert m_wait, (out, err[-3000:])
    # Then a call nobody answers: the sidecar stopped the rank (SIGTERM) with the report.
    assert rc == -signal.SIGTERM, (rc, out, err[-3000:])
    assert ended - float(m_wait.group(1)) <= FIRE_BOUND
    workers = out.split("WORKERS ")[1].split("\n")[0].split()
    m = re.search(
        rf"graphlearn sampler server 0 at 127\.0\.0\.1:\d+ \(pid {owner.server}\) stalled: a "
        rf"call made for pid {owner.proc.pid} by pid (\d+) unanswered for [\d.]+ s: it is alive "
        r"and blocked: state T .*\(wchan do_signal_stop\) \[thread \d+ \(gl-sampler-srv\): "
        r"state T",
        err,
    )
    assert m and m.group(1) in workers, err[-4000:]
    assert "NOT FIRED" not in out
    if spy:  # a stopped process writes no stack itself: py-spy reads its Python frames
        assert f"py-spy dump --nonblocking --pid {owner.server}:" in err, err[-4000:]
        assert "_serve (healthkit_graphlearn/_server.py" in err, err[-4000:]
    else:
        assert "no Python stacks: it is stopped" in err, err[-4000:]


def test_a_graceful_stop_of_the_rank_under_way_never_fires_on_an_unanswered_call(
    tmp_path: Path,
) -> None:
    owner = Owner(tmp_path, "stall-stop", "--workers", "1", "--stall-timeout", str(T))
    owner.wait_ready(120)
    rc, out, err = owner.finish(90)
    assert owner.strays == [], f"left running: {owner.strays}"
    assert rc == 0, (out, err[-3000:])
    assert owner.result(out)["stops"] == [signal.SIGTERM]
    assert "stalled: a call" not in err
    # Said once, at WARNING, with when it would be reported (past the stop's grace).
    deferred = [ln for ln in alarms(err) if "being stopped" in ln]
    assert len(deferred) == 1 and "still stalled" in deferred[0], err[-3000:]
