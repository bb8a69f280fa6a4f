"""The plumbing under the primitives, for users who compose their own.

Stable, but not what most code needs: what an extender composes a watchdog, a launcher or an
integration from. The firing rule (``decide``, ``decide_stall``, ``stop_like``), the stop
episodes it reads (``current_episode``, ``note_stop``, ``note_stop_survived``) and, for code
that waits on its helpers itself, the rule asked about one ending (``EndingClassifier``);
the job-wide failure notice for failures that are not watched deaths; leases
(``LeaseServer``, ``Lease``: one TCP connection per client/server pair that tells each side
that the other process ended, or that its machine was lost, for peers only an RPC layer
links); ``/proc`` readers; prctl helpers (``die_with_parent``, ``set_thread_name``); stack
dumps and their opt-in; the memory cgroup an ``ExitDiagnoser`` reads its OOM counter from
(``MemoryCgroup``, ``find_memory_cgroup``); environment-variable readers for bounds
(``env_seconds``); and the log flush to call before ``os._exit``. The argument validators
healthkit's own integrations share are not here: they are internal (``healthkit._shared``).
"""

from healthkit._actions import flush_logging
from healthkit._decide import Decision, OnCleanExit, Verdict, decide, decide_stall, stop_like
from healthkit._diagnose.evidence import MemoryCgroup, find_memory_cgroup
from healthkit._diagnose.stacks import dump_stacks, enable_quiet_stack_dumps, enable_stack_dumps
from healthkit._ending import EndingClassifier
from healthkit._errors import MAX_TIMEOUT_S
from healthkit._jobnotice import publish_job_failure
from healthkit._os.bounds import ENV_SECONDS_MIN, EnvValueWarning, env_seconds, read_env_seconds
from healthkit._os.orphan import die_with_parent, set_thread_name
from healthkit._os.proc import ProcStat, children, descendants, read_proc_stat
from healthkit._watch.lease import Lease, LeaseServer
from healthkit._watch.stopsignals import STOP_SIGNALS, StopEpisode, current_episode, note_stop
from healthkit._watchdog import note_stop_survived

__all__ = [
    "Decision",
    "ENV_SECONDS_MIN",
    "EndingClassifier",
    "EnvValueWarning",
    "Lease",
    "LeaseServer",
    "MAX_TIMEOUT_S",
    "MemoryCgroup",
    "OnCleanExit",
    "ProcStat",
    "STOP_SIGNALS",
    "StopEpisode",
    "Verdict",
    "children",
    "current_episode",
    "decide",
    "decide_stall",
    "descendants",
    "die_with_parent",
    "dump_stacks",
    "enable_quiet_stack_dumps",
    "enable_stack_dumps",
    "env_seconds",
    "find_memory_cgroup",
    "flush_logging",
    "note_stop",
    "note_stop_survived",
    "publish_job_failure",
    "read_env_seconds",
    "read_proc_stat",
    "set_thread_name",
    "stop_like",
]
