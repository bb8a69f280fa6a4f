"""Every ```python example in the README and the core docs runs as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The integration guides' examples need their own environments; their tiers run them.
CORE_DOCS = ["README.md", "docs/index.md", "docs/process-watch.md", "docs/watchdog.md",
             "docs/barrier.md", "docs/troubleshooting.md"]


def examples(path: Path) -> list[tuple[str, str]]:
    text = path.read_text()
    blocks = re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)
    return [(f"{path.relative_to(ROOT)}#{i}", code) for i, code in enumerate(blocks)]


CASES = [case for doc in CORE_DOCS for case in examples(ROOT / doc)]


def test_the_core_docs_have_examples() -> None:
    assert len(CASES) >= 6


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("where", "code"), CASES, ids=[c[0] for c in CASES])
def test_doc_example_runs(where: str, code: str, tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    # Examples elide bodies with "...", which is valid Python; run them as a script so the
    # __main__ guard and spawn-based multiprocessing behave as for a user.
    script.write_text(code)
    # Helpers' exception records (healthkit.record_exception) go to this test's directory.
    env = {**os.environ, "HEALTHKIT_RECORD_DIR": str(tmp_path / "records")}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=100, cwd=tmp_path, env=env)
    assert proc.returncode == 0, f"{where} failed:\n{proc.stdout}\n{proc.stderr}"
