"""healthkit for Alibaba graph-learn (GL): the tzrec-style negative-sampler server, watched.

``launch_sampler_server`` starts the node's GL server in a process this rank owns, waits until
it serves, and arms a DisarmableWatchdog on it: when the server dies the rank fails in seconds
with a diagnosis, instead of every client retrying for ~17 minutes until a collective timeout.
``wait=False`` launches it in the background, as tzrec does, with its readiness still
bounded. The cluster-spec helpers replace tzrec's ``_get_cluster_spec``;
``shorten_client_retries`` bounds the GIL-holding client retries; ``die_with_rank`` makes a
DataLoader worker that holds a GL client die with its rank. ``graphlearn_build`` and the
``set_*`` wrappers let one code base run on graph-learn builds with and without
TorchEasyRec's extra settings.

The names below are loaded on first use (PEP 562), so ``import healthkit_graphlearn`` imports
neither GL, torch, numpy nor even healthkit itself: GL is imported by ``import_graphlearn()``
when first needed, torch only when ``torch.distributed`` is already in use.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any

from healthkit_graphlearn._version import __version__ as __version__

if TYPE_CHECKING:
    from healthkit_graphlearn._client import ClientRetryBudget, shorten_client_retries
    from healthkit_graphlearn._server import (
        DEFAULT_READY_TIMEOUT,
        READY_TIMEOUT_ENV,
        LaunchContextError,
        SamplerServer,
        SamplerServerError,
        SamplerServerStartupError,
        SamplerServerTimeoutError,
        launch_sampler_server,
        server_call,
    )
    from healthkit_graphlearn._tzrec.cluster import (
        Exchange,
        client_task_index,
        exchange_server_addresses,
        free_port,
        get_cluster_spec,
        server_address,
    )
    from healthkit_graphlearn._tzrec.env import DistEnv
    from healthkit_graphlearn._tzrec.features import (
        TZREC_GL_CALLS,
        GraphLearnBuild,
        GraphLearnFeatureError,
        graphlearn_build,
        set_load_graph_thread_num,
        set_use_string_hash_id,
    )
    from healthkit_graphlearn._tzrec.gl_import import GraphLearnImportError, import_graphlearn
    from healthkit_graphlearn._worker import die_with_rank


_EXPORTS = {
    "ClientRetryBudget": "_client",
    "shorten_client_retries": "_client",
    "Exchange": "_tzrec.cluster",
    "client_task_index": "_tzrec.cluster",
    "exchange_server_addresses": "_tzrec.cluster",
    "free_port": "_tzrec.cluster",
    "get_cluster_spec": "_tzrec.cluster",
    "server_address": "_tzrec.cluster",
    "DistEnv": "_tzrec.env",
    "TZREC_GL_CALLS": "_tzrec.features",
    "GraphLearnBuild": "_tzrec.features",
    "GraphLearnFeatureError": "_tzrec.features",
    "graphlearn_build": "_tzrec.features",
    "set_load_graph_thread_num": "_tzrec.features",
    "set_use_string_hash_id": "_tzrec.features",
    "die_with_rank": "_worker",
    "GraphLearnImportError": "_tzrec.gl_import",
    "import_graphlearn": "_tzrec.gl_import",
    "DEFAULT_READY_TIMEOUT": "_server",
    "READY_TIMEOUT_ENV": "_server",
    "LaunchContextError": "_server",
    "SamplerServer": "_server",
    "SamplerServerError": "_server",
    "SamplerServerStartupError": "_server",
    "SamplerServerTimeoutError": "_server",
    "launch_sampler_server": "_server",
    "server_call": "_server",
}

__all__ = [
    "ClientRetryBudget",
    "DEFAULT_READY_TIMEOUT",
    "DistEnv",
    "Exchange",
    "GraphLearnBuild",
    "GraphLearnFeatureError",
    "GraphLearnImportError",
    "LaunchContextError",
    "READY_TIMEOUT_ENV",
    "SamplerServer",
    "SamplerServerError",
    "SamplerServerStartupError",
    "SamplerServerTimeoutError",
    "TZREC_GL_CALLS",
    "client_task_index",
    "die_with_rank",
    "exchange_server_addresses",
    "free_port",
    "get_cluster_spec",
    "graphlearn_build",
    "import_graphlearn",
    "launch_sampler_server",
    "server_address",
    "server_call",
    "set_load_graph_thread_num",
    "set_use_string_hash_id",
    "shorten_client_retries",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'healthkit_graphlearn' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"healthkit_graphlearn.{module}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def _publish(module: str) -> None:
    """Make the exported classes and functions of ``module`` (a private module, imported
    lazily) report this package as their module (``healthkit_graphlearn.SamplerServer``):
    in reprs, tracebacks and pickles. Each private module calls it once it is defined, so
    this holds however the module came to be imported."""
    try:  # here, not at the top: importing this package imports no healthkit
        from healthkit._shared import publish
    except ImportError:  # healthkit missing: import_graphlearn() still works, and says why
        return

    namespace = vars(sys.modules[module])
    publish(
        __name__,
        (
            namespace[name]
            for name, owner in _EXPORTS.items()
            if f"healthkit_graphlearn.{owner}" == module and name in namespace
        ),
    )


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
