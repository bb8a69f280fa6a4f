"""healthkit's helper programs (the sidecar and its link process) run in their owner's process
group, so a Ctrl-C or a launcher's group SIGTERM reaches them too, also while their
interpreter starts. A graph-learn job's Ctrl-C once printed the link process's
KeyboardInterrupt traceback (healthkit's import path) into the job's output. Started with the
stop signals blocked, each takes them with its own handler once it has one."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

BARRAGE = """
    import os, signal, time

    def barrage(pids, seconds):
        # SIGINT, SIGTERM and SIGHUP, again and again, from the moment the process exists
        sent, t0 = 0, time.monotonic()
        while time.monotonic() - t0 < seconds:
            for pid in pids():
                for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                    try:
                        os.kill(pid, sig)
                        sent += 1
                    except ProcessLookupError:
                        pass
            time.sleep(0.001)
        return sent
"""


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(BARRAGE) + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=100,
    )


@pytest.mark.timeout(120)
def test_the_link_process_outlives_stop_signals_from_its_first_moment_and_prints_nothing() -> None:
    """Its start-up included: it ignores a group stop (its sidecar ends it), and exits 0 at
    the end of its requests."""
    proc = _run("""
        import socket
        from healthkit import _jobnotice
        from healthkit._watchdog.link_process import LinkProcess

        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()  # nothing listens there: the link never reaches a store, which is fine
        job = _jobnotice.JobScope(addr="127.0.0.1", port=port, run_id="t", restart=0, rank=0,
                                  node_rank=0, local_rank=0, host="h")
        link = LinkProcess(job)
        sent = barrage(lambda: [link.proc.pid], 2.0)
        alive = link.proc.poll() is None
        link.finish(30)
        print("LINK", alive, link.proc.returncode, sent)
    """)
    assert proc.stdout.startswith("LINK "), (proc.stdout, proc.stderr)
    _, alive, rc, sent = proc.stdout.split()
    assert int(sent) > 100, proc.stdout  # the barrage began while it started
    assert (alive, rc) == ("True", "0"), (proc.stdout, proc.stderr)
    assert "KeyboardInterrupt" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.timeout(120)
def test_the_sidecar_takes_stop_signals_from_its_first_moment_with_its_own_handler() -> None:
    """A watchdog armed in sidecar mode while every new child of the owner gets SIGINT,
    SIGTERM and SIGHUP from the moment it exists: the sidecar starts, prints no traceback,
    and still acts (the twin): the helper's SIGKILL after the barrage ends the owner with
    the diagnosis (``stop_grace=0``: the barrage's stops excuse nothing)."""
    proc = _run("""
        import subprocess, sys, threading
        import healthkit

        def children():
            out = set()
            for tid in os.listdir("/proc/self/task"):
                with open(f"/proc/self/task/{tid}/children") as f:
                    out |= {int(p) for p in f.read().split()}
            return out

        helper = subprocess.Popen(["sleep", "60"])
        before = children()
        wd = healthkit.DisarmableWatchdog([helper.pid], mode="sidecar", stop_grace=0.0)
        result = {}
        t = threading.Thread(target=lambda: result.update(sent=barrage(
            lambda: children() - before, 2.0)))
        t.start()
        wd.arm()
        t.join()
        print("SIDECAR", bool(children() - before), result["sent"], flush=True)
        helper.kill()
        time.sleep(30)  # the sidecar ends this process
        print("NOT ENDED", flush=True)
    """)
    assert proc.stdout.startswith("SIDECAR "), (proc.stdout, proc.stderr)
    _, alive, sent = proc.stdout.split()[:3]
    assert int(sent) > 100 and alive == "True", (proc.stdout, proc.stderr)
    assert "KeyboardInterrupt" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert "NOT ENDED" not in proc.stdout and proc.returncode != 0, (proc.stdout, proc.stderr)
    assert "was killed by SIGKILL" in proc.stderr, proc.stderr
