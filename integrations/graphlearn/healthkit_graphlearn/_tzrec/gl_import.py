"""Find and import a real Alibaba graph-learn (GL) as the top-level module ``graphlearn``.

Why this is not just ``import graphlearn``:

* On CPython 3.11 the only installable GL ships *inside* ``graphscope-client`` (0.29.0) at
  ``graphscope/learning/graphlearn``, yet GL's own modules import themselves as top-level
  ``graphlearn`` (``from graphlearn import pywrap_graphlearn``), and so does tzrec. We expose it
  under that name with a directory that contains nothing but a symlink
  ``graphlearn -> <site-packages>/graphscope/learning/graphlearn``, appended to ``sys.path``.
  (Importing ``graphscope`` itself is avoided: its ``__init__`` pulls in many undeclared deps.)
* That build links vineyard, whose static initialiser ``dlopen``s the library named by
  ``__VINEYARD_INTERNAL_REGISTRY`` and calls ``abort()`` when it cannot: ``import graphlearn``
  then kills the whole process with SIGABRT, which no ``try``/``except`` can catch. So the env var
  must be set *before* the import, and when we cannot set it we raise ImportError instead.
* The PyPI project named ``graphlearn`` is an unrelated package; an importable top-level
  ``graphlearn`` is only trusted when it looks like Alibaba's (it has ``pywrap_graphlearn`` and,
  once imported, ``Graph`` and ``set_tracker_mode``).
* A GL build may crash (SIGSEGV, not catchable either) with a numpy its wheel was not built
  for: graphscope-client 0.29's GL does with numpy 2. Each build says which numpy it supports
  in its own distribution metadata (graphscope-client declares ``numpy<2.0.0``; TorchEasyRec's
  ``graphlearn`` 1.3.8 build runs on numpy 2), so the bound is read from there and checked
  before the import, never assumed: a build that declares no bound is imported as it is.

Nothing here imports GL at module import time: call :func:`import_graphlearn` when GL is needed.
Forked children inherit ``sys.path`` and the environment; ``multiprocessing`` spawn children get
the parent's ``sys.path`` too, so one call in the parent is enough for both.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import os
import stat
import sys
import tempfile
import threading
from pathlib import Path
from types import ModuleType

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

__all__ = [
    "VINEYARD_REGISTRY_ENV",
    "GraphLearnImportError",
    "graphlearn_distribution",
    "import_graphlearn",
]

VINEYARD_REGISTRY_ENV = "__VINEYARD_INTERNAL_REGISTRY"
_REGISTRY_LIB = "libvineyard_internal_registry.so"
_INSTALL_HINT = (
    "install Alibaba graph-learn as healthkit documents it: "
    "TorchEasyRec's `graphlearn` wheel, or "
    "`pip install --no-deps graphscope-client==0.29.0 vineyard` and `pip install 'numpy<2'` "
    "(on Python <= 3.9 the `graph-learn` wheel also works). "
    "Never install the PyPI package named `graphlearn`: it is an unrelated project."
)

_lock = threading.Lock()


class GraphLearnImportError(ImportError):
    """Alibaba graph-learn is not available (or not safely importable) in this environment."""


def import_graphlearn() -> ModuleType:
    """Return Alibaba GL's ``graphlearn`` module, importing it safely on first use.

    Order: an already imported ``graphlearn`` (validated); an importable top-level
    ``graphlearn`` that is Alibaba's; else the copy inside ``graphscope-client``, exposed as
    top-level ``graphlearn`` through a symlink directory under the temp dir.

    Raises:
        GraphLearnImportError: GL is missing, the ``graphlearn`` found is not Alibaba's, or it
            cannot be imported without aborting the process (vineyard registry not found,
            a numpy outside the range the GL build's own metadata declares). The message names
            what to install or change.
    """
    with _lock:
        mod = sys.modules.get("graphlearn")
        if mod is not None:
            _check_is_alibaba(mod)
            return mod

        pkg_dir = _top_level_graphlearn_dir()
        if pkg_dir is None or not _looks_like_alibaba(pkg_dir):
            bundled = _graphscope_bundled_dir()
            if bundled is None:
                if pkg_dir is not None:
                    raise GraphLearnImportError(
                        f"the `graphlearn` importable here ({pkg_dir}) is not Alibaba "
                        "graph-learn (no pywrap_graphlearn extension): it is probably the "
                        "unrelated PyPI package `graphlearn`; uninstall it, then " + _INSTALL_HINT
                    )
                raise GraphLearnImportError("Alibaba graph-learn was not found: " + _INSTALL_HINT)
            shim = _ensure_symlink_dir(bundled)
            # Prepend only when an unrelated top-level `graphlearn` would otherwise win.
            if pkg_dir is not None:
                sys.path.insert(0, shim)
            elif shim not in sys.path:
                sys.path.append(shim)
            importlib.invalidate_caches()
            pkg_dir = bundled

        _check_numpy(pkg_dir)
        _ensure_vineyard_registry(pkg_dir)
        try:
            mod = importlib.import_module("graphlearn")
        except ImportError as e:
            raise GraphLearnImportError(
                f"importing Alibaba graph-learn from {pkg_dir} failed: {e}. " + _INSTALL_HINT
            ) from e
        _check_is_alibaba(mod)
        return mod


def _top_level_graphlearn_dir() -> Path | None:
    """Where a top-level ``graphlearn`` package would be imported from (not importing it)."""
    try:
        spec = importlib.util.find_spec("graphlearn")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _looks_like_alibaba(pkg_dir: Path) -> bool:
    return (
        any(pkg_dir.glob("pywrap_graphlearn*.so")) and (pkg_dir / "python" / "graph.py").is_file()
    )


def _graphscope_bundled_dir() -> Path | None:
    """``<site-packages>/graphscope/learning/graphlearn`` without importing ``graphscope``."""
    try:
        spec = importlib.util.find_spec("graphscope")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        cand = Path(root) / "learning" / "graphlearn"
        if _looks_like_alibaba(cand):
            return cand.resolve()
    return None


def _cache_root() -> Path:
    return Path(tempfile.gettempdir()) / f"healthkit-graphlearn-{os.getuid()}"


def _ensure_private_dir(path: Path) -> None:
    """Create ``path`` (mode 0700) or accept it only if it is ours and not writable by others:
    a directory on ``sys.path`` under a world-writable temp dir must not be plantable."""
    try:
        path.mkdir(mode=0o700, exist_ok=True)
    except FileExistsError:
        pass
    st = path.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise GraphLearnImportError(
            f"refusing to use {path} for the graphlearn import shim: it is not a directory owned "
            "by this user and closed to others; remove it or set TMPDIR elsewhere"
        )


def _ensure_symlink_dir(target: Path) -> str:
    """Return a directory whose only entry is ``graphlearn -> target``.

    One subdirectory per target (keyed by a hash of its path), so several venvs on one machine do
    not fight over a single link; the link is replaced atomically so concurrent processes (e.g.
    DataLoader workers importing at the same time) never observe a missing or half-made link.
    """
    root = _cache_root()
    _ensure_private_dir(root)
    sub = root / hashlib.sha256(str(target).encode()).hexdigest()[:16]
    _ensure_private_dir(sub)
    link = sub / "graphlearn"
    try:
        if os.readlink(link) == str(target):
            return str(sub)
    except OSError:
        pass
    tmp = sub / f".graphlearn.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        os.symlink(target, tmp)
        os.replace(tmp, link)
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
    return str(sub)


def _needs_vineyard(pkg_dir: Path) -> bool:
    """The graphscope-client build links vineyard (its wheel bundles libvineyard_* next to GL)."""
    real = pkg_dir.resolve()
    libs = real.parents[2] / "graphscope_client.libs" if len(real.parents) > 2 else None
    if libs is not None and libs.is_dir() and any(libs.glob("libvineyard*")):
        return True
    return "graphscope" in real.parts


def _ensure_vineyard_registry(pkg_dir: Path) -> None:
    current = os.environ.get(VINEYARD_REGISTRY_ENV)
    if current and Path(current).is_file():
        return
    found = _find_vineyard_registry()
    if found is not None:
        os.environ[VINEYARD_REGISTRY_ENV] = str(found)
        return
    if _needs_vineyard(pkg_dir):
        why = (
            f"{VINEYARD_REGISTRY_ENV}={current!r} does not name an existing file"
            if current
            else "the `vineyard` package (which provides it) is not installed"
        )
        raise GraphLearnImportError(
            f"Alibaba graph-learn at {pkg_dir} links vineyard and would abort the process "
            f"(SIGABRT) on import without {_REGISTRY_LIB}: {why}. Install it with "
            "`pip install --no-deps vineyard`, or point "
            f"{VINEYARD_REGISTRY_ENV} at an existing {_REGISTRY_LIB}."
        )


def _find_vineyard_registry() -> Path | None:
    try:
        spec = importlib.util.find_spec("vineyard")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        cand = Path(root) / _REGISTRY_LIB
        if cand.is_file():
            return cand
    return None


def graphlearn_distribution(pkg_dir: Path) -> importlib.metadata.Distribution | None:
    """The installed distribution that ships the GL package at ``pkg_dir``, if any.

    ``graphscope-client`` for the copy at ``graphscope/learning/graphlearn``; TorchEasyRec's
    ``graphlearn`` (or ``graph-learn``) for a top-level one. ``None`` for a source tree on
    ``sys.path``. Matched by the files each candidate records, not by name alone: the PyPI
    project called ``graphlearn`` is unrelated.
    """
    real = pkg_dir.resolve()
    # The path as imported names the distribution (a top-level `graphlearn` symlinked into
    # another tree is that other tree's file but this distribution's package); the resolved
    # path covers the import shim, whose link points into graphscope-client.
    tops = [_top_level_name(pkg_dir), _top_level_name(real)]
    try:
        table = importlib.metadata.packages_distributions()
    except Exception:  # a broken dist-info somewhere must not break the import
        return None
    names = [n for top in tops for n in table.get(top, [])]
    for name in dict.fromkeys(names):
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        for f in dist.files or ():
            if f.name == "__init__.py" and Path(str(dist.locate_file(f))).resolve().parent == real:
                return dist
    return None


def _top_level_name(path: Path) -> str:
    parts = path.parts
    for i in range(len(parts) - 2):
        if parts[i : i + 3] == ("graphscope", "learning", "graphlearn"):
            return "graphscope"
    return path.name


def _numpy_requirements(dist: importlib.metadata.Distribution) -> list[Requirement]:
    """The ``numpy`` requirements of ``dist`` that apply to this interpreter.

    Markers are evaluated here (a bound for another platform or Python does not apply), and a
    requirement of an extra is left out: only what every install of the build pulls in counts.
    An entry ``packaging`` cannot parse is skipped (it bounds nothing we could check)."""
    out: list[Requirement] = []
    for line in dist.requires or ():
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if canonicalize_name(req.name) != "numpy":
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        out.append(req)
    return out


def _numpy_violations(dist: importlib.metadata.Distribution, numpy_version: str) -> list[str]:
    """The numpy specifiers ``dist`` declares that ``numpy_version`` does not satisfy (PEP 440:
    ``~=1.20`` is ``>=1.20,==1.*``; a pre-release of 2.0.0 is not ``<2.0.0``)."""
    try:
        have: Version | None = Version(numpy_version)
    except InvalidVersion:
        have = None  # cannot be compared: every declared bound counts as broken
    return [
        str(spec)
        for req in _numpy_requirements(dist)
        for spec in req.specifier
        if have is None or not spec.contains(have, prereleases=True)
    ]


def _check_numpy(pkg_dir: Path) -> None:
    """Refuse a numpy outside the range the GL build's own metadata declares."""
    try:
        version = importlib.metadata.version("numpy")
    except importlib.metadata.PackageNotFoundError:
        raise GraphLearnImportError(
            "Alibaba graph-learn needs numpy, which is not installed: " + _INSTALL_HINT
        ) from None
    dist = graphlearn_distribution(pkg_dir)
    if dist is None:
        return  # nothing declared (a source tree): import it as it is
    broken = _numpy_violations(dist, version)
    if broken:
        name = dist.metadata["Name"]
        raise GraphLearnImportError(
            f"numpy {version} is installed, but the Alibaba graph-learn at {pkg_dir} comes from "
            f"{name} {dist.version}, which requires numpy{','.join(broken)}; importing it would "
            f"crash the process (SIGSEGV): `pip install 'numpy{','.join(broken)}'`, or use a "
            "graph-learn build made for this numpy (TorchEasyRec's `graphlearn` wheel supports "
            "numpy 2)"
        )


def _check_is_alibaba(mod: ModuleType) -> None:
    if not (hasattr(mod, "Graph") and hasattr(mod, "set_tracker_mode")):
        where = getattr(mod, "__file__", None) or "?"
        raise GraphLearnImportError(
            f"the imported `graphlearn` ({where}) is not Alibaba graph-learn (no Graph / "
            "set_tracker_mode): it is probably the unrelated PyPI package `graphlearn`; "
            "uninstall it, then " + _INSTALL_HINT
        )


import healthkit_graphlearn as _package  # noqa: E402

_package._publish(__name__)
