"""``healthkit demo --scenario dataloader-oom`` end to end: stock torch's error names no
cause; healthkit_torch's names the OOM kill, confirmed with the worker's memory and the limit
(when this machine lets the demo make a memory cgroup and read the kernel log)."""

from __future__ import annotations

import io
import os

import pytest

from healthkit._tools.demo import run


@pytest.mark.timeout(240)
def test_the_dataloader_oom_demo_tells_the_two_stories() -> None:
    out = io.StringIO()
    results = run("dataloader-oom", 20.0, out)
    stock = results["without healthkit"].root_cause or ""
    watched = results["with healthkit_torch"].root_cause or ""
    assert stock.startswith("RuntimeError: DataLoader worker (pid"), out.getvalue()
    assert "OOM" not in stock and "DataLoaderWorkerError" not in stock
    assert watched.startswith("DataLoaderWorkerError: DataLoader worker 1 (pid "), out.getvalue()
    assert "was killed by SIGKILL" in watched and "num_workers=2" in watched
    if os.geteuid() == 0 and os.access("/dev/kmsg", os.R_OK):
        assert "the kernel's OOM killer (confirmed)" in watched, watched
        assert "its memory at the kill " in watched and "256.0 MiB limit" in watched, watched
    assert "Summary" in out.getvalue()
