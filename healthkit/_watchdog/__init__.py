"""The watchdog layer: :class:`DisarmableWatchdog` and the two hosts its judgement runs in.

==========================  ====================================================================
module                      what it holds
==========================  ====================================================================
``core``                    ``DisarmableWatchdog``: the watched records, ``arm()``/``disarm()``,
                            the watcher thread's loop, the actions, the exit and fork hooks;
                            ``mode=`` picks the host once (``HOSTS``)
``host``                    ``Host``: what a host does with a death, a stop survived, progress,
                            another rank's failure, shutdown and its own loss
``thread_host``             ``mode="thread"``: judge in the watcher thread, run the owner's
                            actions; the stop-signal and job witnesses beside the owner
``sidecar_host``            ``mode="sidecar"``: a sidecar judges; the owner tells it what it
                            learns; a thread host takes over if it dies
``protocol``                every message and channel between an owner and its sidecar, and
                            the command line that starts the sidecar
``sidecar_link``            the owner's end of a sidecar (``SidecarLink``)
``sidecar_process``         the sidecar process itself (its ``main``)
``link_process``            the sidecar's own link to the job's store, a process of its own
``logging_transfer``        the owner's log handlers carried into the sidecar, and the relay
                            of its lines back to the owner
==========================  ====================================================================
"""

from healthkit._watchdog.core import DEFAULT_STOP_GRACE_S, DisarmableWatchdog, note_stop_survived
from healthkit._watchdog.sidecar_link import SidecarError

__all__ = ["DEFAULT_STOP_GRACE_S", "DisarmableWatchdog", "SidecarError", "note_stop_survived"]
