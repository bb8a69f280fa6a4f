"""The layers hold: ``healthkit._shared`` (the validators and ``publish()`` the sibling
distributions share with the core) is imported only by healthkit itself and by
``healthkit_glt``, ``healthkit_graphlearn`` and ``healthkit_torch``; and ``publish()`` makes an
exported name report its public module, nested classes included, leaving others alone."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from healthkit._shared import publish

ROOT = Path(__file__).resolve().parents[2]
#: Where an import of the shared namespace may stand: the core, the three sibling packages,
#: and the tests of the shared validators' error convention.
ALLOWED = (
    "healthkit/",
    "integrations/glt/healthkit_glt/",
    "integrations/graphlearn/healthkit_graphlearn/",
    "integrations/torch/healthkit_torch/",
    "tests/core/test_api_table.py",
    "tests/core/test_layers.py",
)
IMPORT = re.compile(
    r"^\s*(from\s+healthkit\._shared\s+import"
    r"|from\s+healthkit\s+import\s+(\([^)]*\b_shared\b|[^\n(]*\b_shared\b)"
    r"|import\s+healthkit\._shared)",
    re.M,
)


@pytest.mark.timeout(60)
def test_only_the_sibling_packages_import_the_shared_namespace() -> None:
    sources = [
        p
        for top in ("healthkit", "integrations", "tests", "examples", "benchmarks", "scripts")
        for p in (ROOT / top).rglob("*.py")
        if "/build/" not in str(p) and "/.venv" not in str(p)
    ]
    assert len(sources) > 100  # the walk saw the tree
    importers = {str(p.relative_to(ROOT)) for p in sources if IMPORT.search(p.read_text())}
    assert importers, "nothing imports healthkit._shared: the pattern is wrong"
    stray = sorted(p for p in importers if not p.startswith(ALLOWED))
    assert not stray, f"healthkit._shared imported outside the sibling packages: {stray}"
    for package in ("healthkit_glt", "healthkit_graphlearn", "healthkit_torch"):
        assert any(f"/{package}/" in p for p in importers), package


def test_publish_names_the_public_module_nested_classes_too_and_leaves_others() -> None:
    class Outer:
        class Inner:
            pass

    def helper() -> None:
        pass

    for obj in (Outer, Outer.Inner, helper):
        obj.__module__ = "pkg._private"
    foreign = type("Foreign", (), {"__module__": "otherpkg._private"})
    publish("pkg", [Outer, helper, foreign, 5, "text"])
    assert (Outer.__module__, Outer.Inner.__module__, helper.__module__) == ("pkg",) * 3
    assert foreign.__module__ == "otherpkg._private"
    publish("pkg.sub", [Outer])  # already public: left as it is
    assert Outer.__module__ == "pkg"


def test_the_library_never_imports_the_command() -> None:
    """``healthkit._tools`` (the ``healthkit`` command and its demo) sits on top of the
    library: only ``python -m healthkit`` (``__main__``) and the command's own modules
    import it."""
    library = [
        p
        for p in (ROOT / "healthkit").rglob("*.py")
        if "_tools" not in p.parts and p.name != "__main__.py"
    ]
    assert len(library) > 20
    importers = [
        str(p.relative_to(ROOT))
        for p in library
        if re.search(r"healthkit\._tools|_tools\b", p.read_text())
    ]
    assert not importers, importers
    assert "healthkit._tools.cli" in (ROOT / "healthkit" / "__main__.py").read_text()


def test_the_watchdog_layer_map_holds() -> None:
    """docs/architecture.md names every module of ``healthkit/_watchdog/``; thread vs sidecar
    is decided once (``mode=`` picks a host), so no mode branch is left outside the host
    modules; and the sidecar process's module is started by path (the protocol's bootstrap),
    never imported by the owner's side."""
    architecture = (ROOT / "docs" / "architecture.md").read_text()
    layer = sorted((ROOT / "healthkit" / "_watchdog").glob("*.py"))
    assert len(layer) >= 8
    unmapped = [p.name for p in layer if f"`_watchdog/{p.name}`" not in architecture]
    assert not unmapped, f"modules missing from docs/architecture.md's map: {unmapped}"
    branch = re.compile(r"mode ==|mode !=|\._sidecar\b")
    hosts = ("host.py", "thread_host.py", "sidecar_host.py")
    branches = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in (ROOT / "healthkit").rglob("*.py")
        if p.name not in hosts
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if branch.search(line)
    ]
    assert not branches, branches
    sidecar_import = re.compile(r"^\s*(from|import)\s+healthkit\._watchdog\.sidecar_process", re.M)
    importers = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "healthkit").rglob("*.py")
        if p.name != "protocol.py" and sidecar_import.search(p.read_text())
    ]
    assert not importers, importers
    assert "from healthkit._watchdog.sidecar_process import main" in (
        ROOT / "healthkit" / "_watchdog" / "protocol.py"
    ).read_text()


#: The library's layers, lowest first (docs/architecture.md, "The layout"). A module may import
#: its own layer and those below; the errors, the runtime (process-wide state) and the
#: version stand under every layer. Everything else in ``healthkit/`` (the rule, the
#: primitives, the watchdog and its hosts, the public modules, and ``_shared``, which hands
#: the sibling packages validators and readers from every layer) stands on the diagnosis
#: layer, and the command (``_tools``, ``python -m healthkit``) on everything.
LAYERS = {"_os": 0, "_watch": 1, "_diagnose": 2, "_tools": 4, "__main__": 4}
TOP = 3
BASE = {"_errors", "_runtime", "_version"}


def _layer(module: str) -> int:
    """``module``: dotted, below ``healthkit`` (``_os.proc``, ``_judge``, ``lowlevel``)."""
    head = module.split(".")[0]
    return -1 if head in BASE else LAYERS.get(head, TOP)


def _imports(path: Path) -> list[tuple[int, str]]:
    """The healthkit modules ``path`` imports at run time (``TYPE_CHECKING`` blocks left out,
    lazy imports included), each with its line; also read by ``test_import_light``'s
    circle check."""
    import ast

    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip |= {id(n) for b in node.body for n in ast.walk(b)}
    inside = path.is_relative_to(ROOT)
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1]) if inside else ""
    found = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            if base == "healthkit":
                found += [(node.lineno, a.name) for a in node.names]
            elif base.startswith("healthkit."):
                module = base.removeprefix("healthkit.")
                found.append((node.lineno, module))
                package = ROOT.joinpath("healthkit", *module.split("."))
                found += [  # ``from healthkit._watch import stopsignals``: the submodule too
                    (node.lineno, f"{module}.{a.name}")
                    for a in node.names
                    if (package / f"{a.name}.py").is_file()
                ]
        elif isinstance(node, ast.Import):
            found += [
                (node.lineno, a.name.removeprefix("healthkit."))
                for a in node.names
                if a.name.startswith("healthkit.")
            ]
    return found


@pytest.mark.timeout(60)
def test_each_layer_imports_only_its_own_and_those_below() -> None:
    modules = [p for p in (ROOT / "healthkit").rglob("*.py") if "__pycache__" not in p.parts]
    assert {p.parent.name for p in modules} >= {"_os", "_watch", "_diagnose", "_tools"}
    upward = []
    for path in modules:
        own = path.relative_to(ROOT / "healthkit").with_suffix("").parts
        mine = _layer(".".join(own))
        for line, target in _imports(path):
            if target[:1].isupper() or target in ("__version__",):
                continue  # a name from the package itself (``from healthkit import X``)
            if _layer(target) > mine:
                upward.append(f"healthkit/{'/'.join(own)}.py:{line} imports {target}")
    assert not upward, "a layer imports one above it:\n" + "\n".join(upward)


def test_the_layer_check_sees_an_upward_import(tmp_path: Path) -> None:
    """The check above is not vacuous: an upward import in a file it reads is found."""
    probe = ROOT / "healthkit" / "_os" / "proc.py"
    found = _imports(probe)
    assert any(t == "_errors" for _, t in found), found
    bad = tmp_path / "x.py"
    bad.write_text("from healthkit._diagnose.diagnosis import ExitDiagnoser\n")
    ((_, target),) = _imports(bad)
    assert _layer(target) > _layer("_os.proc")
