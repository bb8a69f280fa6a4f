"""The ``torch23`` route of ``pipeline-healthkit-glt``, where a user meets it before any GLT
runs: the extra's requirements as pip evaluates them on each Python, and what ``import
healthkit_glt`` says on a Python where that stack cannot exist (a real interpreter of that
version, with only the pure-Python dependencies on its path)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
requirements = pytest.importorskip("packaging.requirements")  # not a core dependency
Requirement = requirements.Requirement

ROOT = Path(__file__).resolve().parents[2]


def _extra() -> list[Any]:
    meta = tomllib.loads((ROOT / "integrations/glt/pyproject.toml").read_text())
    return [Requirement(r) for r in meta["project"]["optional-dependencies"]["torch23"]]


@pytest.mark.parametrize("python", ["3.10", "3.11", "3.12", "3.13"])
def test_the_torch23_extra_installs_the_pypi_stack_on_python_3_11_only(python: str) -> None:
    """graphlearn-torch 0.2.4 has cp311 wheels only: elsewhere pip would stop at a bare "No
    matching distribution"; the extra asks for nothing there instead."""
    env = {"python_version": python, "python_full_version": f"{python}.0"}
    wanted = {r.name for r in _extra() if r.marker is None or r.marker.evaluate(env)}
    if python == "3.11":
        assert wanted == {"torch", "graphlearn-torch", "torch_geometric", "numpy"}
        pins = {r.name: str(r.specifier) for r in _extra()}
        assert pins["torch"] == "==2.3.0" and pins["graphlearn-torch"] == "==0.2.4"
    else:
        assert wanted == set()


def _interpreter(version: str) -> str | None:
    """As scripts/dists.sh finds one: on PATH, else in pyenv's versions; one that runs."""
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates = [shutil.which(f"python{version}"),
                  *map(str, sorted(pyenv.glob(f"{version}.*/bin/python{version}")))]
    for found in candidates:
        if found is None:
            continue
        probe = subprocess.run([found, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                               capture_output=True, text=True, timeout=30)
        if probe.returncode == 0 and probe.stdout.strip() == version:
            return found
    return None


@pytest.mark.timeout(120)
def test_import_on_a_python_without_the_pypi_stack_says_which_python_it_needs(
    tmp_path: Path,
) -> None:
    python = _interpreter("3.12")
    if python is None:
        pytest.skip("no Python 3.12 on this machine")
    # Only what the wheels depend on (attrs, packaging: pure Python), and the checkout.
    site = tmp_path / "site"
    site.mkdir()
    purelib = Path(sysconfig.get_paths()["purelib"])
    for name in ("attr", "attrs", "packaging"):
        (site / name).symlink_to(purelib / name)
    path = os.pathsep.join([str(site), str(ROOT), str(ROOT / "integrations/glt")])
    proc = subprocess.run(
        [python, "-s", "-c", "import healthkit_glt"],
        capture_output=True, text=True, timeout=90, cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "PYTHONHOME"} | {"PYTHONPATH": path},
    )
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "ImportError: healthkit_glt needs torch and graphlearn-torch: torch is not installed "
        "(this is Python 3.12: the `torch23` extra installs PyPI's stack on Python 3.11 only"
    ), last
    assert "GiGL's stack" in last and "torch's CUDA build" in last
    assert sys.version_info[:2] == (3, 11)  # the twin, in this tier's own interpreter: below


def test_on_python_3_11_the_message_names_the_extra_without_a_python_caveat() -> None:
    """The twin: on the stack's own Python the message points at the extra, no caveat."""
    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['graphlearn_torch'] = None\n"
        "import importlib.metadata as m\n"
        "real = m.version\n"
        "def version(d):\n"
        "    if d in ('torch', 'graphlearn-torch'):\n"
        "        raise m.PackageNotFoundError(d)\n"
        "    return real(d)\n"
        "m.version = version\n"
        "import healthkit_glt\n"
    )
    path = os.pathsep.join([str(ROOT), str(ROOT / "integrations/glt")])
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=90, env={**os.environ, "PYTHONPATH": path})
    last = proc.stderr.strip().splitlines()[-1]
    assert "torch is not installed; install one of the two tested stacks" in last, last
    assert "this is Python" not in last
