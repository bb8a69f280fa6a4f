"""Fixtures of the core tier (no torch). The leak check itself lives in tests/conftest.py."""

from __future__ import annotations

import multiprocessing.forkserver
import multiprocessing.resource_tracker
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)  # `from helpers import ...`, also inside spawn/forkserver children

FIXTURES = Path(HERE) / "fixtures"


@pytest.fixture(scope="session", autouse=True)
def multiprocessing_singletons() -> Iterator[None]:
    """Start the forkserver and the resource tracker before any leak snapshot is taken.

    Both are per-interpreter singletons that keep a process and a pipe fd for the whole
    session; started lazily inside a test, the leak check would count their fd as leaked.
    """
    multiprocessing.forkserver.ensure_running()
    multiprocessing.resource_tracker.ensure_running()
    yield


@pytest.fixture
def fixture_tree(tmp_path: Path) -> Iterator[Path]:
    """A private, writable copy of tests/core/fixtures (tests rewrite counter files)."""
    dst = tmp_path / "fixtures"
    shutil.copytree(FIXTURES, dst)
    yield dst


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    """A process that sleeps until the test ends it (a real pid to watch, stop or refuse)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(30)
