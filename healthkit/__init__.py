"""healthkit: notice a dead helper process in milliseconds, fail the job in seconds, say why.

The public names live here; the modules behind them are private.
"""

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
from healthkit._watch import ExitStatus, ProcessWatch, WatchSet

__version__ = "0.1.0"

__all__ = [
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
