"""Which graphlearn-torch build is installed, whether healthkit_glt knows it, and what to
say when the stack does not import.

Two builds are supported and tested (docs/glt.md, "Supported versions"): the PyPI release
0.2.4 (torch 2.3) and upstream's main branch built from source at 26fe3d4 (what GiGL runs,
torch 2.8), whose version still reads 0.2.4 and is told apart by the local label
``+git26fe3d4`` that our build recipe gives its wheel. :func:`self_check` (run by
:mod:`healthkit_glt._adapter` at import, over every private the adapter touches) refuses any
other build, naming its version, and a build that lacks one of those privates, naming it.

torch and graphlearn-torch are not dependencies of ``pipeline-healthkit-glt``: the two tested
stacks cannot be written as one version range, and every range that admits torch 2.8
resolves on a fresh machine to PyPI's 0.2.4 wheel on torch 2.8, which does not import there
(integrations/glt/pyproject.toml). So the user installs a stack first, and when it is missing
or broken :func:`stack_error` turns graphlearn-torch's own error (a missing module, an
undefined C++ symbol, "Cannot access accelerator device") into one that says which stack to
install and how.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import os
import sys

from packaging.version import InvalidVersion, Version

from healthkit_glt._version import __version__

__all__ = [
    "ACCEPT_BUILD_ENV",
    "INSTALL_HINT",
    "KNOWN_BUILDS",
    "Required",
    "glt_build",
    "glt_version",
    "present",
    "self_check",
    "stack_error",
]

logger = logging.getLogger("healthkit.glt")

#: One GLT (or torch) private the adapter touches: (module, object or None, name). With an
#: object, ``name`` is an attribute of it, or a name its ``__init__`` assigns (the instance
#: attributes GLT sets there: the loader's flags, the server's producer pools).
Required = tuple[str, str | None, str]

INSTALL_HINT = (
    "install one of the two tested stacks first (docs/glt.md, 'Supported versions'): "
    "PyPI's, on Python 3.11, with this distribution's `torch23` extra (torch 2.3.0, "
    "graphlearn-torch 0.2.4, torch_geometric 2.6.1, numpy<2: `pip install "
    f"'pipeline_healthkit_glt-{__version__}-py3-none-any.whl[torch23]'`; torch's CUDA build, "
    "also on a CPU-only machine: PyPI's graphlearn-torch wheel needs it) and then "
    "`FORCE_ONLY_CPU=1 pip install --no-build-isolation torch-scatter==2.1.2 "
    "torch-sparse==0.6.18`; or GiGL's: torch 2.8.0 and graphlearn-torch built from source "
    "(docs/glt.md, 'Building graphlearn-torch from source the way GiGL does')"
)
# graphlearn-torch imports these at import time without declaring them.
_UNDECLARED = {
    "torch_geometric": "`pip install torch_geometric==2.6.1` (torch 2.3) or `==2.7.0` (torch 2.8)",
    "torch_sparse": "`FORCE_ONLY_CPU=1 pip install --no-build-isolation torch-scatter==2.1.2 "
    "torch-sparse==0.6.18`, compiled against the installed torch",
    "torch_scatter": "`FORCE_ONLY_CPU=1 pip install --no-build-isolation torch-scatter==2.1.2`, "
    "compiled against the installed torch",
}
# PyPI's graphlearn-torch wheels are built against this torch; from 2.5 on they do not import
# (without a GPU: upstream fixed `torch.device(0)` after the 0.2.4 release, #151; on torch
# 2.8 its extension does not even load: undefined C++ symbols).
_PYPI_GLT_TORCH = Version("2.3.0")
_FIRST_TORCH_PYPI_GLT_FAILS = Version("2.5")


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _release_on_newer_torch(glt: str, torch: str) -> bool:
    """A PyPI graphlearn-torch release (no local label) on a torch it does not import with."""
    try:
        glt_v, torch_v = Version(glt), Version(torch)
    except InvalidVersion:
        return False
    return glt_v.local is None and torch_v.release >= _FIRST_TORCH_PYPI_GLT_FAILS.release


def _release_on_cpu_torch(glt: str, torch: str) -> bool:
    """A PyPI graphlearn-torch release on torch's CPU build (``2.3.0+cpu``)."""
    try:
        glt_v, torch_v = Version(glt), Version(torch)
    except InvalidVersion:
        return False
    return glt_v.local is None and torch_v.local is not None and "cpu" in torch_v.local


def stack_error(exc: BaseException) -> ImportError:
    """The ImportError to raise instead of ``exc``, graphlearn-torch's failure to import."""
    torch, glt = _version("torch"), _version("graphlearn-torch")
    missing = exc.name if isinstance(exc, ModuleNotFoundError) else None
    if torch is None or missing == "torch":
        what = "torch is not installed"
        if sys.version_info[:2] != (3, 11):
            what += (
                f" (this is Python {sys.version_info[0]}.{sys.version_info[1]}: the `torch23` "
                "extra installs PyPI's stack on Python 3.11 only, where graphlearn-torch 0.2.4 "
                "has wheels, and nothing here; use Python 3.11 for it, or GiGL's stack)"
            )
    elif glt is None or missing == "graphlearn_torch":
        what = f"graphlearn-torch is not installed (torch {torch} is)"
    elif missing is not None and missing.split(".")[0] in _UNDECLARED:
        top = missing.split(".")[0]
        return ImportError(
            f"healthkit_glt: graphlearn-torch {glt} imports {top}, which it does not declare "
            f"and which is not installed: {_UNDECLARED[top]}",
            name=top,
        )
    elif _release_on_cpu_torch(glt, torch):
        what = (
            f"graphlearn-torch {glt} from PyPI needs torch's CUDA build (its extension calls "
            f"c10::cuda), and torch {torch} is the CPU build ({type(exc).__name__}: {exc}); "
            "install torch==2.3.0 from PyPI, whose default build is the CUDA one and runs on "
            "a CPU-only machine too"
        )
    elif _release_on_newer_torch(glt, torch):
        what = (
            f"graphlearn-torch {glt} from PyPI is built against torch {_PYPI_GLT_TORCH} and "
            f"does not import with torch {torch} ({type(exc).__name__}: {exc})"
        )
    else:
        what = (
            f"graphlearn-torch {glt} does not import with torch {torch} "
            f"({type(exc).__name__}: {exc})"
        )
    return ImportError(f"healthkit_glt needs torch and graphlearn-torch: {what}; {INSTALL_HINT}")


def glt_version() -> str:
    """The installed graphlearn-torch's version, with its local label (``0.2.4+git26fe3d4``)."""
    return _version("graphlearn-torch") or "unknown"


def glt_build() -> str:
    """``"release <v>"`` or ``"source <label>"``: which of the supported builds this is."""
    version = glt_version()
    try:
        parsed = Version(version)
    except InvalidVersion:  # "unknown": not installed as a distribution
        return f"release {version}"
    if parsed.local:
        return f"source {parsed.local} (version {parsed.public})"
    return f"release {parsed.public}"


#: Set to the exact version of a build not in :data:`KNOWN_BUILDS` to import healthkit_glt
#: on it anyway (after running tests/glt on it): a version, not a yes, so that the next
#: upgrade is refused again until it is checked too.
ACCEPT_BUILD_ENV = "HEALTHKIT_GLT_ACCEPT_BUILD"

#: The builds the adapter was checked against (tests/glt runs on both).
KNOWN_BUILDS = {
    "0.2.4": "PyPI release, torch 2.3",
    "0.2.4+git26fe3d4": "upstream main built from source, torch 2.8",
}


def present(module: str, owner: str | None, name: str) -> bool:
    """Whether the installed build has this private (see :data:`Required`)."""
    try:
        mod = importlib.import_module(module)
    except ImportError:
        return False
    if owner is None:
        return hasattr(mod, name)
    obj = getattr(mod, owner, None)
    if obj is None:
        return False
    if hasattr(obj, name):
        return True
    init = getattr(obj, "__init__", None)
    code = getattr(init, "__code__", None)
    return code is not None and name in code.co_names


def self_check(required: tuple[Required, ...], version: str | None = None) -> None:
    """Check that the installed graphlearn-torch is a build the adapter knows, with every
    private in ``required``.

    Raises ImportError naming the build and what it lacks, or naming a build not in
    :data:`KNOWN_BUILDS` (the look-ups below find a name, not what it means: an unknown
    build may have them all and still lay its ring out or use its flags differently),
    unless ``$HEALTHKIT_GLT_ACCEPT_BUILD`` names that very version: then a warning says it
    runs untested. Cheap: attribute look-ups on modules already imported.
    """
    version = glt_version() if version is None else version
    tested = "; ".join(f"{v} ({what})" for v, what in KNOWN_BUILDS.items())
    missing = [
        f"{module}.{owner}.{name}" if owner else f"{module}.{name}"
        for module, owner, name in required
        if not present(module, owner, name)
    ]
    if missing:
        raise ImportError(
            f"healthkit_glt: graphlearn-torch {version} lacks {', '.join(missing)}, which "
            "healthkit_glt adapts (healthkit_glt/_adapter/); install a tested build "
            f"({tested}; docs/glt.md, 'Supported versions'), or port _adapter/ to this one"
        )
    if version in KNOWN_BUILDS:
        return
    if os.environ.get(ACCEPT_BUILD_ENV, "").strip() == version:
        logger.warning(
            "healthkit_glt: graphlearn-torch %s is not a build healthkit_glt was tested with "
            "(%s); accepted by $%s. The internals it adapts are present; the ring reader "
            "still checks the ring layout at init()", version, tested, ACCEPT_BUILD_ENV,
        )  # fmt: skip
        return
    raise ImportError(
        f"healthkit_glt: graphlearn-torch {version} is not a build healthkit_glt knows "
        f"(tested: {tested}). healthkit_glt adapts GLT internals that change between builds "
        "(the channel's ring, the loader's private flags, the server slot: "
        "healthkit_glt/_adapter/), so an unknown build is refused rather than guessed at. "
        f"Install a tested build (docs/glt.md, 'Supported versions'), or run tests/glt on "
        f"this one and set {ACCEPT_BUILD_ENV}={version} to accept it"
    )
