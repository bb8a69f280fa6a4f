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
    hosts = ("_host.py", "_thread_host.py", "_sidecar_host.py")
    branches = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in (ROOT / "healthkit").rglob("*.py")
        if p.name not in hosts
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if branch.search(line)
    ]
    assert not branches, branches
    sidecar_import = re.compile(r"^\s*(from|import)\s+healthkit\._watchdog\._sidecar_process", re.M)
    importers = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "healthkit").rglob("*.py")
        if p.name != "_protocol.py" and sidecar_import.search(p.read_text())
    ]
    assert not importers, importers
    assert "from healthkit._watchdog._sidecar_process import main" in (
        ROOT / "healthkit" / "_watchdog" / "_protocol.py"
    ).read_text()
