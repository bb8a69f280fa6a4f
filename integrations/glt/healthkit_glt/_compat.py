"""Everything that depends on which graphlearn-torch build is installed, in one place.

Two builds are supported and tested (docs/glt.md, "Supported versions"): the PyPI release
0.2.4 (torch 2.3) and upstream's main branch built from source at 26fe3d4 (what GiGL runs,
torch 2.8), whose version still reads 0.2.4 and is told apart by the local label
``+git26fe3d4`` that our build recipe gives its wheel. What differs between them and matters
here:

- the Python side: 26fe3d4 sets ``DistLoader._shutdowned`` first (upstream #154); our loader
  sets it first itself, so both behave the same;
- the C++ ring of ``ShmChannel`` (``shm_queue.h``): the ring reader never trusts a version
  number for it. ``RingReceiver.open`` (:mod:`healthkit_glt._receive`) checks the offsets
  GLT wrote into the header and every semaphore against the layout below; any other layout
  gets the helper-thread receiver (a warning says so), and ``tests/glt`` asserts which
  receiver each build gets.

And the channel's SysV segment, whose life only GLT's C++ destructor ends
(:class:`RingSegment`).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.metadata
import logging
import os
from typing import Any

from graphlearn_torch.channel import ChannelBase, ShmChannel

__all__ = ["RingSegment", "glt_build", "glt_version"]

logger = logging.getLogger("healthkit_glt")

libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
libc.shmdt.argtypes = [ctypes.c_void_p]
libc.sem_getvalue.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
libc.shmctl.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
libc.sem_init.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint]
libc.sem_post.argtypes = [ctypes.c_void_p]
libc.sem_destroy.argtypes = [ctypes.c_void_p]

IPC_RMID = 0
SHM_RDONLY = 0o10000
SEM_SIZE = 32  # sizeof(sem_t), glibc on 64-bit Linux

# ShmQueueMeta, as 0.2.4 and 26fe3d4 both write it: 8 size_t fields, then alloc_lock_ and
# release_lock_ (sem_t each).
MAX_BLOCK_NUM, BLOCK_META_OFFSET, DATA_BUF_OFFSET = 0, 2, 3  # size_t indexes
WRITE_BLOCK_ID, READ_BLOCK_ID = 4, 5  # size_t indexes
HEADER_SIZE = 8 * 8 + 2 * SEM_SIZE
# BlockMeta: begin, data, end (size_t), write and read (sem_t), release (bool), padded to 8.
WRITE_SEM, READ_SEM = 3 * 8, 3 * 8 + SEM_SIZE
BLOCK_SIZE = 3 * 8 + 2 * SEM_SIZE + 8


def glt_version() -> str:
    """The installed graphlearn-torch's version, with its local label (``0.2.4+git26fe3d4``)."""
    try:
        return importlib.metadata.version("graphlearn-torch")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def glt_build() -> str:
    """``"release <v>"`` or ``"source <label>"``: which of the supported builds this is."""
    version = glt_version()
    public, _, local = version.partition("+")
    return f"source {local} (version {public})" if local else f"release {public}"


def channel_shmid(channel: ChannelBase) -> int | None:
    """The SysV shared-memory id of a GLT ``ShmChannel`` (None for other channels)."""
    q = getattr(channel, "_queue", None)
    try:
        return int(q.__getstate__()) if q is not None else None
    except Exception:
        return None


def _nattch(shmid: int) -> int | None:
    """How many mappings the segment has (None: it is gone)."""
    try:
        with open("/proc/sysvipc/shm") as f:
            header = f.readline().split()
            col_id, col_n = header.index("shmid"), header.index("nattch")
            for line in f:
                fields = line.split()
                if int(fields[col_id]) == shmid:
                    return int(fields[col_n])
    except (OSError, ValueError):
        return None
    return None


class _ReleasedQueue:
    """Stands in for a ``ShmChannel``'s queue once the producer released its segment."""

    def __init__(self, shmid: int) -> None:
        self._shmid = shmid

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(
            f"this ShmChannel's shared memory (SysV segment {self._shmid}) was released when "
            "its sampling producer shut down; build a new loader"
        )


class RingSegment:
    """The SysV segment of a GLT ``ShmChannel``, from the producer's ``init()`` to its end.

    Why: GLT removes the segment only in the channel creator's C++ destructor, so a
    SIGKILLed trainer leaves it in the kernel for good (``ipcs -m``), and a shut-down loader
    keeps it until the loader object is collected. Here:

    - :meth:`adopt` attaches it once more, read-only (a *keeper* mapping), and marks it for
      removal (``IPC_RMID``) before the workers start: Linux still lets the workers attach
      a marked segment, and frees it when its last mapping goes, whoever dies how;
    - :meth:`release` (the producer's teardown) drops the channel's queue, so GLT's
      destructor detaches the creator's mapping now, then drops the keeper: the segment is
      freed at once. The keeper is what makes that safe: GLT's destructor calls
      ``shmctl(IPC_RMID)`` after its own detach and aborts the process (a C++ ``Check``)
      if the segment is already gone, so the keeper stays attached until GLT's mapping is
      gone. When a batch still views the ring (batches are zero-copy on CPU), GLT's
      destructor waits for that batch; the keeper then stays for the life of the process
      and the kernel frees the segment at exit.
    """

    def __init__(self, shmid: int, keeper: int) -> None:
        self.shmid = shmid
        self._keeper: int | None = keeper

    @classmethod
    def adopt(cls, channel: ChannelBase) -> RingSegment | None:
        shmid = channel_shmid(channel) if isinstance(channel, ShmChannel) else None
        if shmid is None:
            return None
        addr = libc.shmat(shmid, None, SHM_RDONLY)
        if addr is None or addr == ctypes.c_void_p(-1).value:
            logger.debug("cannot attach channel segment %s: %s", shmid,
                         os.strerror(ctypes.get_errno()))  # fmt: skip
            return None
        if libc.shmctl(shmid, IPC_RMID, None) != 0:
            libc.shmdt(addr)
            return None
        return cls(shmid, addr)

    def release(self, channel: ChannelBase) -> bool:
        """Release the segment (see the class docstring); True if it is gone now."""
        if self._keeper is None:
            return _nattch(self.shmid) is None
        if channel_shmid(channel) == self.shmid:
            with contextlib.suppress(AttributeError, TypeError):
                channel._queue = _ReleasedQueue(self.shmid)  # GLT's destructor runs here
        if _nattch(self.shmid) == 1:  # only the keeper: GLT's mapping is gone
            libc.shmdt(self._keeper)
            self._keeper = None
            return True
        logger.debug(
            "channel segment %s is still mapped (a batch views it); it is freed when the last "
            "view is gone, at the latest when this process exits", self.shmid,
        )  # fmt: skip
        return False
