"""Watching never changes what multiprocessing or subprocess report, even while the user
joins the same process from other threads (a sample; scripts/soak runs 1,000 per kind)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "scripts"))

from exit_codes import check


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["fork", "spawn", "forkserver", "popen", "popen-pid"])
def test_exit_codes_seen_by_the_user_and_the_watchdog_are_the_real_ones(kind: str) -> None:
    scale = int(os.environ.get("HEALTHKIT_MATRIX_RUNS", "3"))  # 1 per extra Python version
    runs = (4 if kind == "spawn" else 8) if scale >= 3 else 2
    result = check(kind, runs)
    assert result["wrong"] == {}, result
