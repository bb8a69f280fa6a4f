"""healthkit integration for torch's DataLoader: a worker that dies (OOM-killed, crashed,
exited) is named at once, with its cause, its evidence and the loader's knobs, in the
``RuntimeError`` that ``next()`` raises instead of torch's "killed by signal: Killed".

One line to adopt: ``loader = healthkit_torch.watch(DataLoader(...))`` (or
``healthkit_torch.DataLoader``, a drop-in subclass, or ``with healthkit_torch.watching_all():``
for loaders made inside other libraries). Importing this imports torch (``import healthkit``
does not).
"""

try:
    import torch.utils.data as _torch_data  # noqa: F401
except ImportError as _e:  # pragma: no cover - exercised by scripts/dists.sh's empty venv
    raise ImportError(
        "healthkit_torch needs torch: install the torch build your project uses "
        "(pip install torch), then import healthkit_torch again"
    ) from _e

from healthkit._shared import publish
from healthkit_torch._loader import DataLoader, DataLoaderWorkerError, watch, watching_all
from healthkit_torch._version import __version__ as __version__

__all__ = ["DataLoader", "DataLoaderWorkerError", "watch", "watching_all"]

# Each exported object reports the module users import (healthkit_torch.DataLoaderWorkerError,
# not healthkit_torch._loader.DataLoaderWorkerError): in reprs, tracebacks and pickles.
publish(__name__, (globals()[_name] for _name in __all__))
