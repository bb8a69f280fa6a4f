"""healthkit: notice a dead helper process in milliseconds, fail the job in seconds, say why.

The four pieces (:class:`ProcessWatch`/:class:`WatchSet`, :class:`ExitDiagnoser`,
:class:`DisarmableWatchdog`, :class:`BoundedBarrier`), the progress watch for helpers that
live but stall (:class:`ProgressWatch`/:class:`Heartbeat`), the one way to stop processes
(:func:`stop`), the helper side (:func:`record_exception`, :func:`dump_helper_stacks`), their
value types and their errors live here. Watchdog actions are in
:mod:`healthkit.actions`; the plumbing under them in :mod:`healthkit.lowlevel`. The modules
whose names start with an underscore are private.
"""

import sys as _sys

from healthkit import actions, lowlevel
from healthkit._barrier import (
    BarrierBrokenError,
    BarrierTimeoutError,
    BoundedBarrier,
    PartyReport,
)
from healthkit._diagnose.diagnosis import Cause, Diagnosis, ExitDiagnoser
from healthkit._diagnose.records import HelperException, record_exception
from healthkit._diagnose.stacks import dump_helper_stacks
from healthkit._errors import (
    HealthkitError,
    InterpreterShutdownError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    NoSuchProcessError,
    ProcessDiedError,
    ProcessNotStartedError,
    UnsupportedError,
    UsageError,
    WatchClosedError,
)
from healthkit._os.userdir import record_dir
from healthkit._progress import Heartbeat, ProgressWatch
from healthkit._shared import publish as _publish
from healthkit._version import __version__ as __version__
from healthkit._watch.process import ExitStatus, ProcessWatch, WatchSet
from healthkit._watch.stop import StopReport, stop
from healthkit._watchdog import DisarmableWatchdog, SidecarError

__all__ = [
    "BarrierBrokenError",
    "BarrierTimeoutError",
    "BoundedBarrier",
    "Cause",
    "Diagnosis",
    "DisarmableWatchdog",
    "ExitDiagnoser",
    "ExitStatus",
    "HealthkitError",
    "Heartbeat",
    "HelperException",
    "InterpreterShutdownError",
    "InvalidArgumentError",
    "InvalidArgumentTypeError",
    "NoSuchProcessError",
    "PartyReport",
    "ProcessDiedError",
    "ProcessNotStartedError",
    "ProcessWatch",
    "ProgressWatch",
    "SidecarError",
    "StopReport",
    "UnsupportedError",
    "UsageError",
    "WatchClosedError",
    "WatchSet",
    "actions",
    "dump_helper_stacks",
    "lowlevel",
    "record_dir",
    "record_exception",
    "stop",
]

# Each exported object reports the module users import (healthkit.ProcessWatch, not
# healthkit._watch.process.ProcessWatch): in reprs, tracebacks, recorded outputs and pickles.
for _module in (actions, lowlevel, _sys.modules[__name__]):
    _publish(_module.__name__, (getattr(_module, _name) for _name in _module.__all__))
del _module

