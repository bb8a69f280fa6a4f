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


def _core_imports() -> dict[str, set[str]]:
    """Each core module -> the core modules it imports (``test_layers._imports``: at any
    level, lazily included, ``if TYPE_CHECKING:`` blocks excluded: they never run)."""
    from test_layers import ROOT, _imports

    root = ROOT / "healthkit"
    graph: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        if "__pycache__" in path.parts:
            continue
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]  # a package by its own name
        name = ".".join(parts)
        deps = {t for _, t in _imports(path) if not t[:1].isupper() and t != "__version__"}
        graph[name] = deps - {name}
    return graph


def test_the_core_has_no_import_circle() -> None:
    graph = _core_imports()
    # The graph is real: it sees the subpackages' modules and their imports.
    assert "_watch.stopsignals" in graph["_watchdog.core"]
    assert "_os.proc" in graph["_diagnose.diagnosis"]
    assert "_watchdog.sidecar_host" in graph["_watchdog.core"]
    assert "_watchdog.sidecar_link" in graph["_watchdog.sidecar_host"]
    assert "_watchdog.protocol" in graph["_watchdog.sidecar_process"]
    modules = [m for m in graph if m != "__init__"]
    for start in modules:
        seen: set[str] = set()
        todo = [d for d in graph[start] if d != "__init__"]
        while todo:
            mod = todo.pop()
            assert mod != start, f"import circle through {start}"
            if mod not in seen:
                seen.add(mod)
                todo.extend(d for d in graph.get(mod, ()) if d != "__init__")


def test_the_documented_public_names_are_exactly_each_namespaces_all() -> None:
    import re
    from pathlib import Path

    import healthkit
    import healthkit.actions
    import healthkit.lowlevel

    index = (Path(__file__).resolve().parents[2] / "docs" / "index.md").read_text()
    section = index[index.index("## Public names") : index.index("## Pages")]
    for module in (healthkit, healthkit.actions, healthkit.lowlevel):
        name = re.escape(module.__name__)
        bullet = re.search(rf"- `{name}`[^:]*:(.*?)(?=\n- `|\Z)", section, re.S)
        assert bullet is not None, module.__name__
        documented = set(re.findall(r"`(\w+)`", bullet.group(1)))
        documented.discard(module.__name__.rpartition(".")[2])
        assert documented == set(module.__all__), module.__name__
        assert list(module.__all__) == sorted(module.__all__)
        assert all(hasattr(module, name) for name in module.__all__)
