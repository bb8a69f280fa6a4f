"""Fixtures of the DataLoader tier (the leak check is tests/conftest.py's)."""

from __future__ import annotations

import multiprocessing.forkserver
import multiprocessing.resource_tracker
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
for _path in (os.path.dirname(HERE), HERE):  # tests/ (api_table), tests/dataloader
    if _path not in sys.path:
        sys.path.insert(0, _path)  # `import dl_helpers`, also inside spawn/forkserver workers
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (HERE, os.environ.get("PYTHONPATH", "")) if p
)


@pytest.fixture(scope="session", autouse=True)
def process_singletons() -> None:
    """What lives as long as the interpreter, made before the first leak snapshot: the
    forkserver, the resource tracker, the shared-memory heap, and healthkit_torch's one
    diagnoser per process (it keeps the kernel log open)."""
    multiprocessing.forkserver.ensure_running()
    multiprocessing.resource_tracker.ensure_running()
    multiprocessing.get_context("spawn").RawArray("b", 1 << 20)
    from healthkit_torch import _loader

    _loader._diagnoser()
