"""healthkit integration for graphlearn-torch: a sampling producer that fails fast instead of
hanging, with GiGL's pluggable sampler factory and worker loop, on one machine
(multiprocessing sampling) and in server-client mode (:func:`init_server` and
``RemoteDistSamplingWorkerOptions``), under GLT's neighbor, link and subgraph loaders.

Importing this imports torch and graphlearn-torch (``import healthkit`` does not).
"""

from healthkit import BarrierBrokenError, BarrierTimeoutError
from healthkit._shared import publish
from healthkit_glt._adapter.build import glt_build, glt_version
from healthkit_glt._config import (
    CONNECTION_TIMEOUT_ENV,
    DEFAULT_INIT_TIMEOUT_MULTIPLIER,
    DEFAULT_RPC_INIT_TIMEOUT_S,
    RPC_INIT_TIMEOUT_ENV,
    STEADY_STATE_RPC_TIMEOUT_ENV,
    TimeoutPlan,
    resolve_timeouts,
)
from healthkit_glt._loader import DistLinkNeighborLoader, DistNeighborLoader, DistSubGraphLoader
from healthkit_glt._producer import (
    DistSamplingProducer,
    SamplingError,
    SamplingStalledError,
    SamplingStoppedError,
    SamplingWorkerDiedError,
)
from healthkit_glt._receive import Receiver, RingLayoutError, open_receiver
from healthkit_glt._remote_errors import (
    RemoteSamplingError,
    SamplingServerLostError,
    ServerFailure,
    ServerHello,
)
from healthkit_glt._server import DistServer, init_server, wait_and_shutdown_server
from healthkit_glt._version import __version__ as __version__
from healthkit_glt._worker import (
    SamplerFactory,
    SamplingWorkerContext,
    SerializedSendChannel,
    WorkerLoop,
    create_dist_sampler,
    default_worker_loop,
    init_sampling_worker,
    narrow_rpc_timeout,
    pass_init_barrier,
    report_sampling_error,
    run_task_loop,
    start_sampler,
    teardown_sampling_worker,
)

__all__ = [
    "CONNECTION_TIMEOUT_ENV",
    "DEFAULT_INIT_TIMEOUT_MULTIPLIER",
    "DEFAULT_RPC_INIT_TIMEOUT_S",
    "RPC_INIT_TIMEOUT_ENV",
    "STEADY_STATE_RPC_TIMEOUT_ENV",
    "BarrierBrokenError",
    "BarrierTimeoutError",
    "DistLinkNeighborLoader",
    "DistNeighborLoader",
    "DistSamplingProducer",
    "DistServer",
    "DistSubGraphLoader",
    "Receiver",
    "RemoteSamplingError",
    "RingLayoutError",
    "SamplerFactory",
    "SamplingError",
    "SamplingServerLostError",
    "SamplingStalledError",
    "SamplingStoppedError",
    "SamplingWorkerContext",
    "SamplingWorkerDiedError",
    "SerializedSendChannel",
    "ServerFailure",
    "ServerHello",
    "TimeoutPlan",
    "WorkerLoop",
    "create_dist_sampler",
    "default_worker_loop",
    "glt_build",
    "glt_version",
    "init_sampling_worker",
    "init_server",
    "narrow_rpc_timeout",
    "open_receiver",
    "pass_init_barrier",
    "report_sampling_error",
    "resolve_timeouts",
    "run_task_loop",
    "start_sampler",
    "teardown_sampling_worker",
    "wait_and_shutdown_server",
]

# Each exported object reports the module users import (healthkit_glt.SamplingWorkerDiedError,
# not healthkit_glt._producer.SamplingWorkerDiedError): in reprs, tracebacks and pickles. The
# core's names re-exported here keep their own module (healthkit).
publish(__name__, (globals()[_name] for _name in __all__))
