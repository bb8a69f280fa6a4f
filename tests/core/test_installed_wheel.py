"""The core tier run by ``scripts/dists.sh test`` exercises the installed wheel, not the source.

scripts/dists.sh sets HEALTHKIT_TEST_INSTALLED_WHEEL to the version it built; elsewhere (an
editable install in a developer's venv) these checks do not apply and are skipped.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import healthkit

EXPECTED = os.environ.get("HEALTHKIT_TEST_INSTALLED_WHEEL")
SOURCE_TREE = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    not EXPECTED, reason="only under scripts/dists.sh test (the installed-wheel run)"
)


def test_healthkit_is_imported_from_site_packages_not_the_source_tree() -> None:
    where = Path(healthkit.__file__).resolve()
    assert where.is_relative_to(Path(sysconfig.get_paths()["purelib"]).resolve()), where
    assert not where.is_relative_to(SOURCE_TREE / "healthkit"), where
    assert str(SOURCE_TREE) not in {str(Path(p or ".").resolve()) for p in sys.path}


def test_the_installed_distribution_owns_the_imported_files() -> None:
    dist = importlib.metadata.distribution("pipeline-healthkit")
    assert dist.version == EXPECTED == healthkit.__version__
    files = {str(dist.locate_file(f).resolve()) for f in dist.files or []}
    assert str(Path(healthkit.__file__).resolve()) in files
    # A regular install, not an editable one (which would ship a path hook or a .pth instead).
    assert not any(str(f).endswith(".pth") for f in dist.files or [])


def test_child_interpreters_import_the_same_copy() -> None:
    # What test_cli's `python -m healthkit` children and spawned helpers see from this cwd.
    out = subprocess.run(
        [sys.executable, "-c", "import healthkit; print(healthkit.__file__)"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout.strip()
    assert Path(out).resolve() == Path(healthkit.__file__).resolve()
