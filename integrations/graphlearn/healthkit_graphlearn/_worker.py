"""DataLoader workers that hold GL clients never outlive their rank.

Why: when the server dies, a GL client call retries the dead connection for ~17 minutes
inside native code that holds the GIL. A DataLoader worker sitting in such a call cannot run
torch's own check that its parent is gone (it runs between batches), so when the rank ends,
by the watchdog or by anything else, the worker stays behind: reparented to init, still
retrying, holding its memory. torchrun does not stop it either: it signals a worker's
process group only while the group's leader (the rank) is alive. Measured here without it
(sidecar mode, 2 workers, server SIGKILLed): in a plain run both workers were alive 60 s
after the kill; under a 1-rank torchrun one of them was, in each of 2 runs.

The kernel has to do it: ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` in the worker, via
:func:`healthkit.lowlevel.die_with_parent`, which also closes the race of a rank that died
before the call. This works whatever the GIL is doing and whoever ends the rank (the sidecar's
SIGTERM, ``os._exit`` in thread mode, torchrun's SIGKILL, the OOM killer).

One kernel detail: the death signal follows the *thread* that forked the worker, which is
the thread that created the DataLoader's iterator (``iter(loader)``; once, with
``persistent_workers=True``). Create it from the main thread, as tzrec does, or the workers
are killed when that thread ends.
"""

from __future__ import annotations

import logging
import os
import signal
import sys

from healthkit import InvalidArgumentTypeError, NoSuchProcessError
from healthkit.lowlevel import die_with_parent

__all__ = ["die_with_rank"]

logger = logging.getLogger("healthkit.graphlearn")

_bound_to: int | None = None  # the rank pid this process is bound to (per process)
_bound_in: int | None = None  # ... and the pid that binding was made in (forks start fresh)


_PID_MAX_LIMIT = 1 << 22  # the kernel's PID_MAX_LIMIT on 64-bit


def die_with_rank(rank_pid: int | None = None) -> bool:
    """In a DataLoader worker: be SIGKILLed by the kernel as soon as the rank dies.

    Call it in the worker before its GL client starts (tzrec: first thing in
    ``BaseSampler.init()``). ``rank_pid``: the pid the worker's parent must have, i.e. the
    rank's ``os.getpid()`` recorded before the DataLoader started (default: the parent as
    read now); a worker whose parent is already gone ends at once. With the ``forkserver``
    start method the parent is the fork server, which ends with the rank: leave it ``None``.
    Outside a DataLoader worker (a client in the rank itself, ``num_workers=0``) it does
    nothing and returns ``False``, unless ``rank_pid`` is given. Repeated calls are free.

    Raises:
        InvalidArgumentTypeError: ``rank_pid`` is not an int.
        NoSuchProcessError: ``rank_pid`` is out of the range of pids.
    """
    global _bound_to, _bound_in
    if rank_pid is not None:
        if isinstance(rank_pid, bool) or not isinstance(rank_pid, int):
            raise InvalidArgumentTypeError(
                f"rank_pid must be an int (the rank's pid), got {rank_pid!r}", "rank_pid"
            )
        if not 1 <= rank_pid <= _PID_MAX_LIMIT:
            raise NoSuchProcessError(
                f"rank_pid must be a positive integer of at most {_PID_MAX_LIMIT} (the "
                f"largest pid Linux hands out; the rank's os.getpid()), got {rank_pid}"
            )
    elif not _in_dataloader_worker():
        return False
    me = os.getpid()
    if _bound_in == me and (rank_pid is None or rank_pid == _bound_to):
        return True
    parent = os.getppid() if rank_pid is None else rank_pid
    if parent == 1:
        # Already reparented to init: the rank that started this worker is gone.
        logger.error("DataLoader worker %d: its rank is gone; ending it", me)
        os.kill(me, signal.SIGKILL)
    die_with_parent(parent, signal.SIGKILL)
    _bound_to, _bound_in = parent, me
    return True


def _in_dataloader_worker() -> bool:
    data = sys.modules.get("torch.utils.data")
    return data is not None and data.get_worker_info() is not None


import healthkit_graphlearn as _package  # noqa: E402

_package._publish(__name__)
