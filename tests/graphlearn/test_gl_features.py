"""Which graph-learn build is in use, detected: the numpy bound comes from the build's own
distribution metadata, and tzrec's extra settings are applied where the build has them.

Every case runs in a fresh interpreter (GL cannot be unloaded, and a wrong numpy would crash
it). TorchEasyRec's own ``graphlearn`` wheel is not on a package index, so its case is built
from the real GL code of ``graphscope-client`` exposed as top-level ``graphlearn`` with the
dist-info such a wheel has (``Name: graphlearn``, no numpy upper bound). A numpy 2 is faked by
its dist-info version only: with a real numpy 2 this GL build segfaults, which is the crash the
check prevents, and the test proves the check decides before anything is imported.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.graphlearn

INTEGRATION = Path(__file__).resolve().parents[2] / "integrations" / "graphlearn"
CORE = Path(__file__).resolve().parents[2]


def _site() -> Path:
    spec = importlib.util.find_spec("graphscope")  # locates, does not import
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("graphscope-client (which ships Alibaba GL on cp311) is not installed")
    return Path(next(iter(spec.submodule_search_locations))).parent


def _attrs_dir() -> Path:
    import attrs

    return Path(attrs.__file__).resolve().parents[1]


def _fake_site(tmp_path: Path, *, numpy_version: str, tzrec_wheel: bool) -> Path:
    """A site dir with the real GL, vineyard and numpy, numpy's dist-info claiming
    ``numpy_version``; GL either as graphscope-client ships it or as a top-level
    ``graphlearn`` distribution (tzrec's wheel layout)."""
    site = _site()
    fake = tmp_path / "site"
    fake.mkdir()
    for name in ["numpy", "numpy.libs", "vineyard", "graphscope_client.libs"]:
        if (site / name).exists():
            (fake / name).symlink_to(site / name)
    numpy_info = next(site.glob("numpy-*.dist-info"))
    info = fake / f"numpy-{numpy_version}.dist-info"
    info.mkdir()
    meta = (numpy_info / "METADATA").read_text()
    meta = "\n".join(
        f"Version: {numpy_version}" if ln.startswith("Version:") else ln for ln in meta.splitlines()
    )
    (info / "METADATA").write_text(meta + "\n")
    (info / "RECORD").write_text("numpy/__init__.py,,\n")
    (info / "top_level.txt").write_text("numpy\n")
    vineyard_info = next(site.glob("vineyard-*.dist-info"))
    (fake / vineyard_info.name).symlink_to(vineyard_info)
    gl_dir = site / "graphscope" / "learning" / "graphlearn"
    if tzrec_wheel:
        (fake / "graphlearn").symlink_to(gl_dir)
        dist = fake / "graphlearn-1.3.8.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text(
            "Metadata-Version: 2.1\nName: graphlearn\nVersion: 1.3.8\n"
            "Requires-Dist: numpy\nRequires-Dist: protobuf\n"
        )
        (dist / "RECORD").write_text("graphlearn/__init__.py,,\n")
        (dist / "top_level.txt").write_text("graphlearn\n")
    else:
        (fake / "graphscope").symlink_to(site / "graphscope")
        gs_info = next(site.glob("graphscope_client-*.dist-info"))
        (fake / gs_info.name).symlink_to(gs_info)
    return fake


def _run(tmp_path: Path, fake: Path, code: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "__VINEYARD_INTERNAL_REGISTRY"}
    env["PYTHONPATH"] = os.pathsep.join([str(fake), str(INTEGRATION), str(CORE), str(_attrs_dir())])
    return subprocess.run(
        [sys.executable, "-S", "-c", code],  # -S: only the site dir built above
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


IMPORT = (
    "import healthkit_graphlearn as hkgl\n"
    "try:\n"
    "    gl = hkgl.import_graphlearn()\n"
    "except hkgl.GraphLearnImportError as e:\n"
    "    print('RAISED', e)\n"
    "else:\n"
    "    b = hkgl.graphlearn_build(gl)\n"
    "    print('IMPORTED', b.distribution, b.version, sorted(b.missing))\n"
)


def test_graphscope_build_with_numpy_2_is_refused_from_its_own_metadata(tmp_path: Path) -> None:
    r = _run(tmp_path, _fake_site(tmp_path, numpy_version="2.1.0", tzrec_wheel=False), IMPORT)
    assert r.returncode == 0, f"rc={r.returncode} (-11 = SIGSEGV)\n{r.stderr[-2000:]}"
    assert "RAISED numpy 2.1.0 is installed" in r.stdout, r.stdout + r.stderr[-2000:]
    assert "graphscope-client 0.29.0, which requires numpy<2.0.0" in r.stdout


def test_graphscope_build_with_numpy_1_imports_and_lacks_tzrecs_two_settings(
    tmp_path: Path,
) -> None:
    r = _run(tmp_path, _fake_site(tmp_path, numpy_version="1.26.4", tzrec_wheel=False), IMPORT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (
        "IMPORTED graphscope-client 0.29.0 "
        "['set_load_graph_thread_num', 'set_use_string_hash_id']" in r.stdout
    ), r.stdout + r.stderr[-2000:]


def test_a_build_declaring_no_numpy_bound_is_imported_with_numpy_2(tmp_path: Path) -> None:
    # tzrec's wheel layout: top-level `graphlearn`, its own dist-info, no numpy upper bound.
    r = _run(tmp_path, _fake_site(tmp_path, numpy_version="2.1.0", tzrec_wheel=True), IMPORT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "IMPORTED graphlearn 1.3.8" in r.stdout, r.stdout + r.stderr[-2000:]


def test_tzrec_settings_are_applied_where_present_skipped_or_refused_where_absent(
    tmp_path: Path,
) -> None:
    code = (
        "import logging, sys, types\n"
        "logging.basicConfig(stream=sys.stdout, level=logging.INFO,\n"
        "                    format='%(levelname)s %(message)s')\n"
        "import healthkit_graphlearn as hkgl\n"
        "gl = hkgl.import_graphlearn()\n"
        "print('APPLIED', hkgl.set_load_graph_thread_num(2, gl),\n"
        "      hkgl.set_load_graph_thread_num(3))\n"
        "try:\n"
        "    hkgl.set_use_string_hash_id(gl)\n"
        "except hkgl.GraphLearnFeatureError as e:\n"
        "    print('REFUSED', isinstance(e, NotImplementedError), e)\n"
        "calls = []\n"
        "tz = types.ModuleType('graphlearn')  # a module with tzrec's settings, recording calls\n"
        "tz.__file__ = gl.__file__\n"
        "tz.set_load_graph_thread_num = lambda n: calls.append(('threads', n))\n"
        "tz.set_use_string_hash_id = lambda v: calls.append(('hash', v))\n"
        "print('TZ', hkgl.set_load_graph_thread_num(4, tz),\n"
        "      hkgl.set_use_string_hash_id(tz), calls)\n"
        "try:\n"
        "    hkgl.shorten_client_retries(2, gl=tz)\n"
        "except hkgl.GraphLearnFeatureError as e:\n"
        "    print('NO RETRIES', e)\n"
    )
    r = _run(tmp_path, _fake_site(tmp_path, numpy_version="1.26.4", tzrec_wheel=False), code)
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout
    assert "APPLIED False False" in out, out
    assert out.count("has no set_load_graph_thread_num") == 1, out  # said once, not per call
    assert "REFUSED True " in out and "cannot read string node ids" in out, out
    assert "TZ True None [('threads', 4), ('hash', 1)]" in out, out
    assert "NO RETRIES" in out and "set_retry_times" in out, out


def test_bad_arguments_are_refused_with_the_argument_named() -> None:
    import healthkit_graphlearn as hkgl

    with pytest.raises(ValueError, match="num must be an int >= 1"):
        hkgl.set_load_graph_thread_num(0)
    with pytest.raises(TypeError, match="num must be an int"):
        hkgl.set_load_graph_thread_num(True)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("requires", "numpy_version", "broken"),
    [
        (["numpy<2.0.0"], "1.26.4", []),
        (["numpy<2.0.0"], "2.1.0", ["<2.0.0"]),
        (["numpy<2.0.0"], "2.0.0rc1", ["<2.0.0"]),  # a pre-release of 2.0.0 is not < 2.0.0
        (["numpy~=1.20"], "1.26.4", []),
        (["numpy~=1.20"], "2.1.0", ["~=1.20"]),  # compatible release: 1.x from 1.20 on
        (["numpy (>=1.20,<2)"], "2.1.0", ["<2"]),
        (["numpy<2; python_version < '3'"], "2.1.0", []),  # another Python's bound
        (["numpy<2; extra == 'old'"], "2.1.0", []),  # an extra's bound
        (["numpy", "protobuf<4"], "2.1.0", []),  # tzrec's wheel: no bound
        (["numpy<2"], "not-a-version", ["<2"]),
    ],
)
def test_the_numpy_bound_is_read_as_pep_440_says(
    tmp_path: Path, requires: list[str], numpy_version: str, broken: list[str]
) -> None:
    import importlib.metadata

    from healthkit_graphlearn._tzrec.gl_import import _numpy_violations

    info = tmp_path / "gl_build-1.0.dist-info"
    info.mkdir()
    lines = "".join(f"Requires-Dist: {r}\n" for r in requires)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: gl-build\nVersion: 1.0\n{lines}")
    dist = importlib.metadata.PathDistribution(info)
    assert _numpy_violations(dist, numpy_version) == broken
