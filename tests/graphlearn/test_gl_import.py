"""import_graphlearn(): finds Alibaba GL, and fails with a catchable ImportError (never SIGABRT)
when it cannot be imported safely. Every case runs in a fresh interpreter."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.graphlearn

INTEGRATION = Path(__file__).resolve().parents[2] / "integrations" / "graphlearn"


def _run(code: str, cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args, "-c", code],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _site_packages_with_graphscope() -> Path:
    spec = importlib.util.find_spec("graphscope")  # locates, does not import
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("graphscope-client (which ships Alibaba GL on cp311) is not installed")
    return Path(next(iter(spec.submodule_search_locations))).parent


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.submodule_search_locations, name
    return Path(next(iter(spec.submodule_search_locations)))


def test_importing_the_package_imports_neither_healthkit_torch_numpy_nor_graphlearn() -> None:
    """As its docstring promises: the names load on first use, and only then what they need
    (the first one makes its module report the package's name: the healthkit it then needs)."""
    code = (
        "import sys, healthkit_graphlearn\n"
        "heavy = {'healthkit', 'torch', 'numpy', 'graphlearn'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
        "assert healthkit_graphlearn.DistEnv.__module__ == 'healthkit_graphlearn'\n"
        "print('OK')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr[-2000:]


def test_importing_the_integration_does_not_import_graphlearn_until_asked(tmp_path: Path) -> None:
    _site_packages_with_graphscope()
    code = (
        "import sys, healthkit_graphlearn, healthkit_graphlearn._tzrec.gl_import as m\n"
        "assert 'graphlearn' not in sys.modules\n"
        "gl = m.import_graphlearn()\n"
        "assert gl is m.import_graphlearn() and hasattr(gl, 'Graph')\n"
        "print('OK', gl.__name__)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "__VINEYARD_INTERNAL_REGISTRY"}
    r = _run(code, tmp_path, env)
    assert r.returncode == 0 and "OK graphlearn" in r.stdout, r.stderr[-2000:]


def test_missing_vineyard_registry_raises_import_error_instead_of_aborting(tmp_path: Path) -> None:
    site = _site_packages_with_graphscope()
    # A site dir holding GL's wheel and numpy but no vineyard: GL would abort() on import.
    fake = tmp_path / "site"
    fake.mkdir()
    names = ["graphscope", "graphscope_client.libs", "numpy", "numpy.libs"]
    names += [p.name for p in site.glob("numpy-*.dist-info")]
    for name in names:
        if (site / name).exists():
            (fake / name).symlink_to(site / name)
    (fake / "packaging").symlink_to(_package_dir("packaging"))  # the integration's dependency
    code = (
        "from healthkit_graphlearn._tzrec.gl_import import (\n"
        "    import_graphlearn, GraphLearnImportError)\n"
        "try:\n"
        "    import_graphlearn()\n"
        "except GraphLearnImportError as e:\n"
        "    print('RAISED', e)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "__VINEYARD_INTERNAL_REGISTRY"}
    env["PYTHONPATH"] = os.pathsep.join([str(fake), str(INTEGRATION)])
    r = _run(code, tmp_path, env, "-S")  # -S: no site-packages, so vineyard is really absent
    assert r.returncode == 0, f"rc={r.returncode} (134 = SIGABRT)\n{r.stderr[-2000:]}"
    assert "RAISED" in r.stdout and "vineyard" in r.stdout, r.stdout

    env["__VINEYARD_INTERNAL_REGISTRY"] = str(tmp_path / "nonexistent.so")
    r = _run(code, tmp_path, env, "-S")
    assert r.returncode == 0, f"rc={r.returncode} (134 = SIGABRT)\n{r.stderr[-2000:]}"
    assert "does not name an existing file" in r.stdout, r.stdout


def test_unrelated_graphlearn_package_is_refused_or_bypassed(tmp_path: Path) -> None:
    _site_packages_with_graphscope()
    (tmp_path / "graphlearn").mkdir()
    (tmp_path / "graphlearn" / "__init__.py").write_text("UNRELATED = True\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    bypass = (
        "from healthkit_graphlearn._tzrec.gl_import import import_graphlearn\n"
        "gl = import_graphlearn()\n"
        "print('OK', hasattr(gl, 'Graph'), hasattr(gl, 'UNRELATED'))\n"
    )
    r = _run(bypass, tmp_path, env)
    assert r.returncode == 0 and "OK True False" in r.stdout, r.stderr[-2000:]

    refuse = (
        "import graphlearn  # the unrelated one is already imported: cannot be bypassed\n"
        "from healthkit_graphlearn._tzrec.gl_import import import_graphlearn\n"
        "try:\n"
        "    import_graphlearn()\n"
        "except ImportError as e:\n"
        "    print('RAISED', e)\n"
    )
    r = _run(refuse, tmp_path, env)
    assert r.returncode == 0 and "RAISED" in r.stdout and "unrelated" in r.stdout, r.stdout
