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
             "docs/barrier.md", "docs/troubleshooting.md", "docs/logging.md",
             "docs/architecture.md", "docs/progress.md"]


def examples(path: Path) -> list[tuple[str, str, list[str]]]:
    """Each ```python block, with the lines of the ```output blocks that follow it (before
    the next example): what the docs say it prints."""
    text = path.read_text()
    blocks = re.findall(r"^```(python|output)\n(.*?)^```", text, flags=re.S | re.M)
    out: list[tuple[str, str, list[str]]] = []
    for kind, body in blocks:
        if kind == "python":
            out.append((f"{path.relative_to(ROOT)}#{len(out)}", body, []))
        elif out:
            out[-1][2].extend(line for line in body.splitlines() if line.strip())
    return out


def claimed(line: str) -> re.Pattern[str]:
    """A printed line as the docs show it, numbers aside (pids, sizes and times vary)."""
    return re.compile(re.sub(r"\d+(?:\\\.\d+)?", r"\\d+(?:\\.\\d+)?", re.escape(line)))


CASES = [case for doc in CORE_DOCS for case in examples(ROOT / doc)]


def test_the_core_docs_have_examples() -> None:
    assert len(CASES) >= 6
    assert any(prints for _, _, prints in CASES)  # some claim an output, and it is checked


def test_a_claimed_output_is_matched_numbers_aside() -> None:
    pattern = claimed("x (pid 4242) took 0.5s")
    assert pattern.search("x (pid 17) took 12.25s")
    assert not pattern.search("x (pid 17) took")


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("where", "code", "prints"), CASES, ids=[c[0] for c in CASES])
def test_doc_example_runs(where: str, code: str, prints: list[str], tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    # Examples elide bodies with "...", which is valid Python; run them as a script so the
    # __main__ guard and spawn-based multiprocessing behave as for a user.
    script.write_text(code)
    # Helpers' exception records (healthkit.record_exception) go to this test's directory.
    env = {**os.environ, "HEALTHKIT_RECORD_DIR": str(tmp_path / "records")}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=100, cwd=tmp_path, env=env)
    assert proc.returncode == 0, f"{where} failed:\n{proc.stdout}\n{proc.stderr}"
    for line in prints:
        assert claimed(line).search(proc.stdout + proc.stderr), (
            f"{where} does not print what its docs show:\n{line}\n--- it printed:\n"
            f"{proc.stdout}{proc.stderr}"
        )


ALL_DOCS = sorted({*CORE_DOCS, "docs/glt.md", "docs/graphlearn.md"})


@pytest.mark.parametrize("where", ALL_DOCS)
def test_quoted_diagnoses_read_as_the_code_writes_them(where: str) -> None:
    """Output quoted in the docs that the code no longer writes: the evidence line
    "cgroup memory peak" (gone: a lifetime peak with page cache read as the helper's), and
    an exit code 1 line without the advice to wrap the entry point in record_exception."""
    text = (ROOT / where).read_text()
    assert "cgroup memory peak" not in text
    for line in text.splitlines():
        if "many programs' own error paths. Read that process's own log" in line:
            assert "or wrap its entry point in healthkit.record_exception" in line, line
