"""One logger tree: ``healthkit`` for the core and ``healthkit.<integration>`` for each
integration (``healthkit.glt``, ``healthkit.graphlearn``), so one ``logging`` setting on
``healthkit`` reaches every line (docs/logging.md lists them)."""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TREES = {
    "healthkit": ROOT / "healthkit",
    "healthkit.glt": ROOT / "integrations" / "glt" / "healthkit_glt",
    "healthkit.graphlearn": ROOT / "integrations" / "graphlearn" / "healthkit_graphlearn",
}


def _logger_names(package: Path) -> dict[str, set[str]]:
    """Every name passed to logging.getLogger(...) in a package's modules, by file."""
    found: dict[str, set[str]] = {}
    for path in sorted(package.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "getLogger"
                and node.args
            ):
                arg = node.args[0]
                name = arg.value if isinstance(arg, ast.Constant) else ast.dump(arg)
                found.setdefault(path.name, set()).add(str(name))
    return found


@pytest.mark.parametrize("expected", list(TREES))
def test_each_package_logs_under_its_own_name_in_the_healthkit_tree(expected: str) -> None:
    names = _logger_names(TREES[expected])
    assert names, f"no logger found in {TREES[expected]}"
    # The core also flushes the root logger's handlers (getLogger() with no name).
    wrong = {f: n - {expected} for f, n in names.items() if n - {expected}}
    assert not wrong, wrong


def test_the_core_modules_log_to_the_healthkit_logger() -> None:
    import healthkit._actions
    from healthkit._watchdog import (
        core,
        link_process,
        logging_transfer,
        sidecar_link,
        sidecar_process,
    )

    modules = (core, link_process, logging_transfer, sidecar_link, sidecar_process)
    for module in (healthkit._actions, *modules):
        assert module.logger is logging.getLogger("healthkit")
    assert logging.getLogger("healthkit.glt").parent is logging.getLogger("healthkit")
