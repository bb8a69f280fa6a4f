"""A real Jupyter kernel (ipykernel, driven through jupyter_client as a notebook server
drives it). "Interrupt kernel" sends SIGINT to the kernel's whole process group; the kernel
handles it and carries on. That stop is an episode: a helper that fails afterwards is
reported, whether the interrupt also ended it or not."""

from __future__ import annotations

import os
import queue
import signal
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

jupyter_client = pytest.importorskip("jupyter_client")

SETUP = """
import multiprocessing as mp, os, signal, sys, time
import healthkit

def helper(ignore_interrupt):
    if ignore_interrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the interrupt is not for it
    def fail(*_):
        raise ValueError("bad shard 7")
    signal.signal(signal.SIGUSR1, fail)
    time.sleep(600)

def record(event):
    with open({report!r}, "w") as f:
        f.write(str(event.diagnosis))

p = mp.get_context("fork").Process(target=helper, args=({ignore},), name="sampler", daemon=True)
p.start()
wd = healthkit.DisarmableWatchdog([p], actions=[healthkit.actions.log_diagnosis(), record],
                                  stop_grace={grace})
wd.arm()
print("HELPER", p.pid)
"""


class Kernel:
    def __init__(self) -> None:
        import zmq

        self.context = zmq.Context()  # our own, terminated at close (the shared one lingers)
        self.km = jupyter_client.KernelManager(kernel_name="python3", context=self.context)
        self.km.start_kernel(env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)

    def run(self, code: str, timeout: float = 30) -> tuple[str, list[dict[str, Any]]]:
        """Execute a cell; its stdout and its error replies."""
        return self.wait(self.start(code), timeout)

    def wait(self, msg_id: str, timeout: float = 30) -> tuple[str, list[dict[str, Any]]]:
        """Wait for a cell to end; its stdout and its error replies."""
        out, errors = [], []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                msg = self.kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                break
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                out.append(content["text"])
            elif kind == "error":
                errors.append(content)
            elif kind == "status" and content["execution_state"] == "idle":
                break
        return "".join(out), errors

    def start(self, code: str) -> str:
        return str(self.kc.execute(textwrap.dedent(code)))

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)
        self.context.term()


@pytest.fixture(autouse=True, scope="module")
def _client_event_loop() -> Iterator[None]:
    """jupyter_client runs its calls on an event loop it makes once per thread and keeps;
    made inside a test it would look like that test's leak. Made here, closed at the end."""
    from jupyter_core.utils import ensure_event_loop

    loop = ensure_event_loop()
    yield
    loop.close()


@pytest.fixture
def kernel() -> Iterator[Kernel]:
    k = Kernel()
    try:
        yield k
    finally:
        k.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("ignore_interrupt", [True, False], ids=["helper-raises", "helper-ends"])
def test_an_interrupted_kernel_reports_a_helper_that_fails_afterwards(
    kernel: Kernel, tmp_path: Path, ignore_interrupt: bool
) -> None:
    report = tmp_path / "report.txt"
    out, errors = kernel.run(SETUP.format(report=str(report), ignore=ignore_interrupt, grace=2))
    assert not errors, errors
    helper_pid = int(out.split("HELPER")[1].split()[0])
    try:
        long_cell = kernel.start("import time; time.sleep(30)")  # a long cell...
        time.sleep(1.0)
        interrupted = time.monotonic()
        kernel.km.interrupt_kernel()  # ...interrupted once, as the notebook's button does
        _, errors = kernel.wait(long_cell)
        assert [e["ename"] for e in errors] == ["KeyboardInterrupt"]
        out, errors = kernel.run("print('still here')")
        assert "still here" in out, (out, errors, kernel.km.is_alive())  # it survived its stop
        if ignore_interrupt:
            os.kill(helper_pid, signal.SIGUSR1)  # then the helper fails: it raises
        deadline = time.monotonic() + 30
        while not report.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert report.exists(), "the helper's failure was never reported"
        text = report.read_text()
        assert "sampler" in text and "exited with code 1" in text, text
        assert "still running after the stop's grace" in text, text
        assert time.monotonic() - interrupted >= 2.0  # not before the stop's grace ended
    finally:
        try:
            os.kill(helper_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
