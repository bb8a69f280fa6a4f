"""Run GL-owning processes for the tests and leave nothing behind.

GL never runs in the pytest process: glog writes into the current directory, a client call
against a dead server holds the GIL for minutes, and the server is forked. Each helper here
starts its process in a scratch directory, reads its ``READY`` line with a deadline, and on
the way out kills by pid whatever the process left running (its server and sidecar are not
our children once it dies, so they are watched through pidfds).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from linereader import LineReader

import healthkit as hk
from healthkit.lowlevel import descendants as descendants

HERE = Path(__file__).resolve().parent
OWNER = HERE / "scripts" / "gl_owner.py"
EXAMPLE = HERE.parents[1] / "examples" / "graphlearn_negative_sampler.py"
SKIP_RC = 77  # gl_owner.py exits with this when GL is not installed


SERVER_COMM = "gl-sampler-srv"  # the launcher names its server thread so (PR_SET_NAME)
SIDECAR_MARK = "healthkit._watchdog.sidecar_process"


def open_watch(pid: int, mark: str) -> hk.ProcessWatch | None:
    """A pidfd watch on ``pid`` if it still is the process we mean (its comm or command line
    contains ``mark``): a pid read from a line may already name someone else's process."""
    try:
        w = hk.ProcessWatch(pid)
    except hk.NoSuchProcessError:
        return None
    try:  # the pidfd pins the process now; check it is ours
        with open(f"/proc/{pid}/comm", "rb") as f:
            ident = f.read().decode(errors="replace")
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            ident += f.read().decode(errors="replace")
    except OSError:
        ident = ""
    if mark not in ident:
        w.close()
        return None
    return w


def reap(watches: dict[int, hk.ProcessWatch], wait: float = 10.0) -> list[int]:
    """Wait up to ``wait`` s for each watched process to end; kill (and list) those that do
    not. Closes every watch."""
    strays = []
    deadline = time.monotonic() + wait
    for pid, w in watches.items():
        with w:
            if w.wait(max(0.0, deadline - time.monotonic())) is None:
                strays.append(pid)
                w.kill()
                w.wait(10)
    watches.clear()
    return strays


class Owner:
    """``gl_owner.py SCENARIO ...`` in ``workdir``; stderr goes to a file (glog is chatty and a
    full pipe would block the owner)."""

    def __init__(self, workdir: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.workdir = workdir
        self.stderr_path = workdir / f"owner-{time.monotonic_ns()}.stderr"
        with open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, str(OWNER), *args],
                cwd=workdir,
                stdout=subprocess.PIPE,
                stderr=err,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            )
        self.out = LineReader(self.proc.stdout)
        self.server = 0
        self.sidecar = 0
        self.watches: dict[int, hk.ProcessWatch] = {}

    def wait_ready(self, timeout: float = 90.0) -> None:
        m = self.out.until(r"^READY server=(\d+) sidecar=(\d+)", timeout)
        if m is None:
            rc, stdout, stderr = self.finish(30)
            if rc == SKIP_RC:
                pytest.skip(f"Alibaba graph-learn not available: {stderr[-500:]}")
            pytest.fail(f"owner never got ready (rc={rc})\n{stdout}\n{stderr[-4000:]}")
        self.server, self.sidecar = int(m.group(1)), int(m.group(2))
        for pid, mark in ((self.server, SERVER_COMM), (self.sidecar, SIDECAR_MARK)):
            w = open_watch(pid, mark) if pid else None
            if w is not None:
                self.watches[pid] = w

    def finish(self, timeout: float = 90.0) -> tuple[int, str, str]:
        """Wait for the owner; on timeout kill it and its descendants. Then reap its server and
        sidecar (they must be gone: a live one is reported as a stray by the caller)."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            for pid in [*descendants(self.proc.pid), self.proc.pid]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self.proc.wait()
        self.strays = reap(self.watches)
        stdout = self.out.rest()
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        return self.proc.returncode, stdout, self.stderr_path.read_text(errors="replace")

    def result(self, stdout: str, tag: str = "RESULT") -> dict[str, Any]:
        for line in stdout.splitlines():
            if line.startswith(tag + " "):
                return dict(json.loads(line[len(tag) + 1 :]))
        raise AssertionError(f"no {tag} line in:\n{stdout}")


def run_owner(workdir: Path, *args: str, timeout: float = 90.0, **kw: Any) -> tuple[int, str, str]:
    """Run a scenario that ends by itself; skip when GL is missing; fail on strays."""
    owner = Owner(workdir, *args, **kw)
    if args[0] not in ("startup-death", "ready-timeout", "startup-exception"):
        owner.wait_ready(timeout)
    rc, out, err = owner.finish(timeout)
    if rc == SKIP_RC:
        pytest.skip(f"Alibaba graph-learn not available: {err[-500:]}")
    assert owner.strays == [], f"left running: {owner.strays}"
    return rc, out, err


_HEALTHKIT_CODE = re.compile(r"/healthkit(_[a-z]+)?/")


def without_startup_interrupts(text: str) -> str:
    """``text`` without the traceback of each KeyboardInterrupt that ran no healthkit code:
    a Ctrl-C that lands while a Python process starts (its site hooks, an editable install's
    finder, whose file name says ``pipeline_healthkit``) prints one, as for any program. A
    KeyboardInterrupt raised through a healthkit module is kept."""
    out: list[str] = []
    block: list[str] | None = None
    for line in text.splitlines():
        if line.lstrip().startswith("Traceback (most recent call last):"):
            if block:
                out += block
            block = [line]
        elif block is not None:
            block.append(line)
            if line.strip() == "KeyboardInterrupt":
                if any(_HEALTHKIT_CODE.search(b) for b in block):
                    out += block
                block = None
            elif not line.startswith((" ", "\t")):  # another exception, or the traceback ended
                out += block
                block = None
        else:
            out.append(line)
    return "\n".join(out + (block or []))


def alarms(stderr: str) -> list[str]:
    """healthkit lines that are not the launcher's INFO notes: errors, warnings, the sidecar;
    a Ctrl-C's traceback in a process that was starting up is not one
    (:func:`without_startup_interrupts`)."""
    return [
        line
        for line in without_startup_interrupts(stderr).splitlines()
        if "healthkit" in line and not line.startswith("INFO healthkit.graphlearn:")
    ]


def pid_gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True
