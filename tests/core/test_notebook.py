"""A real Jupyter kernel (ipykernel, driven through jupyter_client as a notebook server
drives it). "Interrupt kernel" sends SIGINT to the kernel's whole process group; the kernel
handles it and carries on: an interrupt never stops a kernel, so a helper that fails
afterwards, or that the interrupt ended too, is reported at once."""

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

target = healthkit.record_exception(helper) if {wrapped} else helper
p = mp.get_context("fork").Process(target=target, args=({ignore},), name="sampler", daemon=True)
p.start()
wd = healthkit.DisarmableWatchdog([p], actions=[healthkit.actions.log_diagnosis(), record])
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


# An interrupt never stops a kernel: what it would have deferred (stop_grace, 30 s by
# default) is reported in seconds. A bound that proves "not deferred", not a speed.
TOLD_WITHIN_S = 10.0


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("ignore_interrupt", "wrapped"),
    [(True, False), (False, False), (False, True)],
    ids=["helper-raises-later", "interrupt-ends-helper", "interrupt-ends-wrapped-helper"],
)
def test_an_interrupted_kernel_reports_a_helper_death_at_once(
    kernel: Kernel, tmp_path: Path, ignore_interrupt: bool, wrapped: bool
) -> None:
    """"Interrupt kernel" signals the kernel's whole process group; the kernel carries on.
    A helper that fails afterwards, or that the same interrupt ended (KeyboardInterrupt,
    exit 1), is reported within seconds, not after the stop's grace, and named for what it
    is: an interrupt is not "the generic failure code" of an unwrapped helper."""
    report = tmp_path / "report.txt"
    out, errors = kernel.run(SETUP.format(report=str(report), ignore=ignore_interrupt,
                                          wrapped=wrapped))  # fmt: skip
    assert not errors, errors
    helper_pid = int(out.split("HELPER")[1].split()[0])
    try:
        long_cell = kernel.start("import time; time.sleep(30)")  # a long cell...
        time.sleep(1.0)
        kernel.km.interrupt_kernel()  # ...interrupted once, as the notebook's button does
        failed = time.monotonic()
        _, errors = kernel.wait(long_cell)
        assert [e["ename"] for e in errors] == ["KeyboardInterrupt"]
        out, errors = kernel.run("print('still here')")
        assert "still here" in out, (out, errors, kernel.km.is_alive())  # it survived its stop
        if ignore_interrupt:
            failed = time.monotonic()
            os.kill(helper_pid, signal.SIGUSR1)  # then the helper fails: it raises
        deadline = failed + 30
        while not report.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        told = time.monotonic() - failed
        assert report.exists(), "the helper's failure was never reported"
        assert told < TOLD_WITHIN_S, told
        text = report.read_text()
        assert "sampler" in text and "exited with code 1" in text, text
        assert "being stopped" not in text and "stop's grace" not in text, text
        if wrapped:  # its record says which: an interrupt, and what to change
            assert "it was interrupted: KeyboardInterrupt" in text, text
            assert "wrap its entry point" not in text and "generic failure" not in text, text
            assert "SIG_IGN" in text, text
        else:  # exit 1 without a record: either, said as such
            assert "a SIGINT reached this process group" in text, text
            assert "If it was the interrupt" in text and "SIG_IGN" in text, text
    finally:
        try:
            os.kill(helper_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


DEFAULTS = """
import multiprocessing as mp, os, time
import healthkit

def helper():
    time.sleep(600)

p = mp.get_context("fork").Process(target=helper, name="sampler", daemon=True)
p.start()
wd = healthkit.DisarmableWatchdog([p], mode={mode!r})  # the default actions
wd.arm()
print("HELPER", p.pid)
"""


def _kill_later(pid: int, delay: float) -> None:
    import threading

    threading.Timer(delay, os.kill, (pid, signal.SIGKILL)).start()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["thread", "sidecar"])
def test_default_actions_in_a_kernel_raise_in_the_running_cell_and_the_kernel_lives_on(
    kernel: Kernel, mode: str
) -> None:
    out, errors = kernel.run(DEFAULTS.format(mode=mode))
    assert not errors, errors
    helper_pid = int(out.split("HELPER")[1].split()[0])
    # Said once, at arm(): what the default actions do here instead of ending the kernel.
    assert out.count("armed in an interactive session (ZMQInteractiveShell)") == 1, out
    assert "raises ProcessDiedError in the running cell instead of ending the kernel" in out
    if mode == "sidecar":
        assert "mode='sidecar' would stop the kernel, so a thread watches instead" in out
    assert "wd.sidecar_pid is None" in kernel.run("print('wd.sidecar_pid is', wd.sidecar_pid)")[0]
    _kill_later(helper_pid, 1.0)
    out, errors = kernel.run("import time; time.sleep(30); print('NOT REACHED')", timeout=60)
    assert [e["ename"] for e in errors] == ["ProcessDiedError"], (out, errors)
    assert f"sampler (pid {helper_pid}) was killed by SIGKILL" in errors[0]["evalue"]
    assert "NOT REACHED" not in out
    assert f"ERROR healthkit watchdog: sampler (pid {helper_pid}) was killed by SIGKILL" in out
    out, errors = kernel.run("print('still here', wd.fired is not None)")
    assert not errors and "still here True" in out, (out, errors)
    assert kernel.km.is_alive()


@pytest.mark.timeout(120)
def test_a_death_while_the_kernel_is_idle_is_raised_by_the_next_cell_before_its_code(
    kernel: Kernel,
) -> None:
    out, errors = kernel.run(DEFAULTS.format(mode="thread"))
    assert not errors, errors
    helper_pid = int(out.split("HELPER")[1].split()[0])
    os.kill(helper_pid, signal.SIGKILL)  # no cell is running
    time.sleep(2.0)
    assert kernel.km.is_alive()
    out, errors = kernel.run("print('NOT REACHED')")
    assert [e["ename"] for e in errors] == ["ProcessDiedError"], (out, errors)
    assert "NOT REACHED" not in out
    out, errors = kernel.run("print('still here')")  # raised once, then the kernel carries on
    assert not errors and "still here" in out, (out, errors)


@pytest.mark.timeout(60)
def test_a_plain_script_that_imports_ipython_still_exits_on_a_helper_death(
    tmp_path: Path,
) -> None:
    """The twin: not a kernel (IPython imported, no shell running), the default actions end
    the process with code 1 as in any script, and nothing is said about a session."""
    import subprocess
    import sys

    script = tmp_path / "job.py"
    script.write_text(
        "import IPython, multiprocessing as mp, os, signal, time\n"
        "import healthkit\n"
        "p = mp.get_context('fork').Process(target=time.sleep, args=(600,), name='sampler',"
        " daemon=True)\n"
        "p.start()\n"
        "healthkit.DisarmableWatchdog([p]).arm()\n"
        "os.kill(p.pid, signal.SIGKILL)\n"
        "time.sleep(30)\n"
        "print('NOT REACHED')\n"
    )
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=50)
    assert proc.returncode == 1, proc.stderr
    assert "NOT REACHED" not in proc.stdout
    assert "sampler (pid" in proc.stderr and "was killed by SIGKILL" in proc.stderr
    assert "interactive session" not in proc.stderr


def test_raise_in_cell_refuses_what_is_not_a_shell() -> None:
    import healthkit

    with pytest.raises(healthkit.InvalidArgumentTypeError, match="running IPython shell") as e:
        healthkit.actions.raise_in_cell(None)
    assert e.value.argument == "shell"
    with pytest.raises(healthkit.InvalidArgumentError, match="SIGTERM"):
        healthkit.actions.raise_in_cell(
            type("Shell", (), {"events": 0, "input_transformers_post": []})(), signal.SIGTERM
        )
