"""What ``import healthkit_glt`` needs installed first, said when graphlearn-torch fails to import.

torch and graphlearn-torch are not dependencies of ``pipeline-healthkit-glt``: the two tested
stacks (torch 2.3.0 with PyPI's graphlearn-torch 0.2.4 wheel; torch 2.8.0 with graphlearn-torch
built from source, as GiGL runs it) cannot be written as one version range, and every range
that admits torch 2.8 resolves on a fresh machine to PyPI's 0.2.4 wheel on torch 2.8, which
does not import there (integrations/glt/pyproject.toml). So the user installs a stack first,
and when it is missing or broken this module turns graphlearn-torch's own error (a missing
module, an undefined C++ symbol, "Cannot access accelerator device") into one that says which
stack to install and how (docs/glt.md, "Supported versions").
"""

from __future__ import annotations

import importlib.metadata
import sys

from packaging.version import InvalidVersion, Version

from healthkit_glt._version import __version__

__all__ = ["INSTALL_HINT", "stack_error"]

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
