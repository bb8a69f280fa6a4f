"""Process-wide state after fork: a forked child of an armed owner must not speak for it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# The owner arms a watchdog on helper H, then forks a child that calls healthkit.stop([H]):
# the child's stop is not the owner's, so H's SIGTERM is a failure for the owner's watchdog
# (nobody stopped the owner, and the owner did not stop H). Announced to the owner's sidecar
# through the child's inherited copy of the link, it was taken as the owner's own stop.
OWNER = textwrap.dedent(
    """
    import multiprocessing as mp, os, sys, time
    import healthkit as hk

    def sleeper():
        time.sleep(60)

    if __name__ == "__main__":
        ctx = mp.get_context("fork")
        h = ctx.Process(target=sleeper, name="helper", daemon=True)
        h.start()
        wd = hk.DisarmableWatchdog([h], mode=sys.argv[1]).arm()
        child = os.fork()
        if child == 0:
            hk.stop([h.pid], kill_after=1.0)  # the child's own stop of the owner's helper
            os._exit(0)
        os.waitpid(child, 0)
        time.sleep(8)  # the watchdog ends this process before this returns
        wd.disarm()
        print("NOT FIRED", flush=True)
    """
)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["thread", "sidecar"])
def test_a_forked_childs_stop_is_not_announced_as_the_owners(mode: str, tmp_path: Path) -> None:
    script = tmp_path / "owner.py"
    script.write_text(OWNER)
    err = tmp_path / "error.json"
    proc = subprocess.run(
        [sys.executable, str(script), mode], capture_output=True, text=True, timeout=50,
        env={**os.environ, "TORCHELASTIC_ERROR_FILE": str(err)},
    )  # fmt: skip
    assert "NOT FIRED" not in proc.stdout, proc.stdout + proc.stderr
    assert proc.returncode != 0
    report = json.loads(err.read_text())["message"]["extraInfo"]["py_callstack"]
    assert "was killed by SIGTERM" in report, report
