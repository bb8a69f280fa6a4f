"""The core must stay importable without torch, graphlearn-torch or graph-learn."""

import subprocess
import sys


def test_import_healthkit_does_not_import_heavy_dependencies() -> None:
    code = (
        "import sys, healthkit\n"
        "heavy = [m for m in ('torch', 'graphlearn_torch', 'graphlearn', 'numpy') "
        "if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == ""
