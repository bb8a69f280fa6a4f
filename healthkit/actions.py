"""What a :class:`~healthkit.DisarmableWatchdog` does when a watched process dies.

An action is any callable that takes one :class:`FailureEvent`: a plain function works. The
watchdog runs its actions in order, once; an action that raises does not stop the ones after
it. ``prepare()``/``release()`` methods, if an action has them, run at ``arm()``/``disarm()``.
"""

from healthkit._actions import (
    Action,
    FailureEvent,
    default_actions,
    exit_process,
    log_diagnosis,
    raise_in_cell,
    raise_in_main_thread,
    write_torchelastic_error_file,
)

__all__ = [
    "Action",
    "FailureEvent",
    "default_actions",
    "exit_process",
    "log_diagnosis",
    "raise_in_cell",
    "raise_in_main_thread",
    "write_torchelastic_error_file",
]
