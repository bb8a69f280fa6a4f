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
    """Each core module -> the core modules it imports (at any level, lazily included,
    ``if TYPE_CHECKING:`` blocks excluded: they never run)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "healthkit"
    graph: dict[str, set[str]] = {}
    # The flat modules and the subpackages' (``_watchdog.core``; a package by its own name).
    paths = [*root.glob("*.py"), *root.glob("_watchdog/*.py")]
    for path in paths:
        tree = ast.parse(path.read_text())
        skipped: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
                skipped.update(id(n) for n in ast.walk(node))
        deps: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in skipped or not isinstance(node, ast.ImportFrom) or not node.module:
                continue
            if node.module == "healthkit":
                deps.update(alias.name for alias in node.names)
            elif node.module.startswith("healthkit."):
                deps.add(node.module.removeprefix("healthkit."))
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        name = ".".join(parts)
        graph[name] = deps - {name}
    return graph


def test_the_core_has_no_import_circle() -> None:
    graph = _core_imports()
    # The graph is real: it sees the subpackage's modules and their imports.
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
