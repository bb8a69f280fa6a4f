"""py-spy in a stall report, for real: a helper stuck in a C call (libc ``sleep()`` through
``ctypes.PyDLL``, the GIL held) is reported with py-spy's native frames when py-spy is on
``PATH``, and with no word about py-spy (no error either) when it is not."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from progress_helpers import HERE

pytestmark = pytest.mark.timeout(60)

T = 0.5
ROOT = Path(HERE).parents[1]


def _py_spy() -> str | None:
    """py-spy as installed from requirements/dev.txt (this venv's bin, or PATH)."""
    for d in (Path(sys.executable).parent, ROOT / ".venv" / "bin"):
        if (d / "py-spy").exists():
            return str(d / "py-spy")
    return shutil.which("py-spy")


def _path_without_py_spy() -> str:
    kept = [d for d in os.environ.get("PATH", "").split(os.pathsep)
            if d and not os.path.exists(os.path.join(d, "py-spy"))]  # fmt: skip
    return os.pathsep.join(kept)


def _stuck_owner(tmp_path: Path, path: str) -> tuple[int, str, str]:
    proc = subprocess.run(
        [sys.executable, os.path.join(HERE, "progress_helpers.py"), "gil", "fork", "thread",
         str(T), str(tmp_path)],
        capture_output=True, text=True, timeout=45, check=False,
        env={**os.environ, "PATH": path,
             "HEALTHKIT_RECORD_DIR": str(tmp_path / "records")},
    )  # fmt: skip
    return proc.returncode, proc.stdout, proc.stderr


def test_a_helper_stuck_in_a_c_call_is_reported_with_py_spys_native_frames(
    tmp_path: Path,
) -> None:
    spy = _py_spy()
    if spy is None:
        pytest.skip("py-spy is not installed (requirements/dev.txt pins it)")
    path = os.pathsep.join([os.path.dirname(spy), _path_without_py_spy()])
    rc, out, err = _stuck_owner(tmp_path, path)
    report = f"stdout:\n{out}\nstderr:\n{err}"
    assert rc == 1 and "stalled: no progress" in err, report
    assert "py-spy dump --native --pid " in err, report
    native = err.split("py-spy dump --native --pid ", 1)[1]
    # libc's sleep under libffi under ctypes: frames no Python stack dump can show.
    assert "sleep (libc" in native and "ffi_call" in native, report
    assert "stuck_in_c_holding_the_gil" in native, report  # and the Python frame above them
    assert "Python stacks of sampler 0" in err, report  # the helper's own dump stays


def test_without_py_spy_the_report_stands_and_says_nothing_of_it(tmp_path: Path) -> None:
    path = _path_without_py_spy()
    env_path_spy = shutil.which("py-spy", path=path)
    assert env_path_spy is None, env_path_spy
    rc, out, err = _stuck_owner(tmp_path, path)
    report = f"stdout:\n{out}\nstderr:\n{err}"
    assert rc == 1 and "stalled: no progress" in err, report
    assert "Python stacks of sampler 0" in err and "stuck_in_c_holding_the_gil" in err, report
    assert "py-spy" not in err.lower(), report
