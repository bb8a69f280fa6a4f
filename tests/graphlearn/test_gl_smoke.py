"""A real GL sampler server and client on localhost: the ground the graphlearn integration
stands on. GL runs in a subprocess (glog files, native threads, GIL-holding retries stay out of
the pytest process); the subprocess forks the server the way tzrec does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from gl_procs import descendants

pytestmark = pytest.mark.graphlearn

HERE = Path(__file__).resolve().parent
SKIP_RC = 77  # the subprocess exits with this when GL is not installed

_SMOKE = f"""
import json, os, sys
sys.path.insert(0, {str(HERE)!r})
from healthkit_graphlearn._tzrec.gl_import import GraphLearnImportError
try:
    from healthkit_graphlearn._tzrec.gl_import import import_graphlearn
    import_graphlearn()
except GraphLearnImportError as e:
    print(e, file=sys.stderr)
    sys.exit({SKIP_RC})
import gl_harness
print("RESULT " + json.dumps(gl_harness.run_smoke(os.getcwd())), flush=True)
"""


def _pid_gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def test_negative_sampling_against_real_server_returns_valid_ids_and_tears_down(
    tmp_path: Path,
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _SMOKE],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=100)
    except subprocess.TimeoutExpired:
        # Kill exactly what we started: the subprocess and its descendants, by pid.
        for pid in [*descendants(proc.pid), proc.pid]:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        out, err = proc.communicate()
        pytest.fail(f"GL smoke run hung for 100 s\nstdout:\n{out}\nstderr:\n{err[-3000:]}")
    if proc.returncode == SKIP_RC:
        pytest.skip(f"Alibaba graph-learn not available: {err.strip()[-500:]}")
    assert proc.returncode == 0, f"rc={proc.returncode}\nstdout:\n{out}\nstderr:\n{err[-3000:]}"

    line = next(ln for ln in out.splitlines() if ln.startswith("RESULT "))
    res = json.loads(line[len("RESULT ") :])
    ids = res["ids"]
    assert len(ids) == 4 and all(len(row) == 2 for row in ids)  # shape (batch, expand_factor)
    assert all(0 <= i < 100 for row in ids for i in row)
    # The client's close() let the server's close() return: a clean exit 0, not a SIGTERM.
    assert res["server_exitcode"] == 0, res
    assert _pid_gone(res["server_pid"]), f"server {res['server_pid']} outlived its owner"
