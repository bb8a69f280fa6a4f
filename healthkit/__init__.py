"""healthkit: notice a dead helper process in milliseconds, fail the job in seconds, say why.

The public names live here; the modules behind them are private.
"""

from healthkit._actions import (
    Action,
    FailureEvent,
    call,
    default_actions,
    exit_process,
    log_diagnosis,
    raise_in_main_thread,
    write_torchelastic_error_file,
)
from healthkit._barrier import (
    BarrierBrokenError,
    BarrierTimeoutError,
    BoundedBarrier,
    PartyReport,
)
from healthkit._bounds import EnvBound, EnvValueWarning, env_seconds, init_bound_from_env
from healthkit._diagnosis import Cause, Diagnosis, ExitDiagnoser
from healthkit._errors import (
    HealthkitError,
    InvalidEnvValueError,
    InvalidTimeoutError,
    NoSuchProcessError,
    ProcessDiedError,
    ProcessNotStartedError,
    WatchClosedError,
)
from healthkit._orphan import die_with_parent, set_thread_name
from healthkit._stacks import dump_stack, dump_stacks, enable_stack_dumps
from healthkit._version import __version__ as __version__
from healthkit._watch import ExitStatus, ProcessWatch, WatchSet
from healthkit._watchdog import DisarmableWatchdog, Verdict, decide

__all__ = [
    "BarrierBrokenError",
    "BarrierTimeoutError",
    "BoundedBarrier",
    "EnvBound",
    "EnvValueWarning",
    "PartyReport",
    "die_with_parent",
    "dump_stack",
    "dump_stacks",
    "enable_stack_dumps",
    "env_seconds",
    "init_bound_from_env",
    "Action",
    "DisarmableWatchdog",
    "FailureEvent",
    "Verdict",
    "call",
    "decide",
    "default_actions",
    "exit_process",
    "log_diagnosis",
    "raise_in_main_thread",
    "set_thread_name",
    "write_torchelastic_error_file",
    "Cause",
    "Diagnosis",
    "ExitDiagnoser",
    "ExitStatus",
    "HealthkitError",
    "InvalidEnvValueError",
    "InvalidTimeoutError",
    "NoSuchProcessError",
    "ProcessDiedError",
    "ProcessNotStartedError",
    "ProcessWatch",
    "WatchClosedError",
    "WatchSet",
]
