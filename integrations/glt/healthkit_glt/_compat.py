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
import functools
import importlib.metadata
import logging
import pickle
from typing import Any

from packaging.version import InvalidVersion, Version

from healthkit_glt._stack import stack_error

# The first graphlearn-torch import of the package (__init__ imports this module first): a
# missing or broken stack fails here with what to install, not with GLT's own error.
try:
    from graphlearn_torch.channel import ChannelBase, ShmChannel
except Exception as e:  # ImportError, or GLT's RuntimeError on a torch it was not built for
    raise stack_error(e) from e

__all__ = ["RingSegment", "glt_build", "glt_version"]

logger = logging.getLogger("healthkit.glt")

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
    try:
        parsed = Version(version)
    except InvalidVersion:  # "unknown": not installed as a distribution
        return f"release {version}"
    if parsed.local:
        return f"source {parsed.local} (version {parsed.public})"
    return f"release {parsed.public}"


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


@functools.cache
def _sem_destroy_leaves_the_semaphore() -> bool:
    """Whether ``sem_destroy`` leaves a process-shared semaphore's memory as it was (glibc
    and musl: it is a no-op), checked once per process on a real semaphore.

    :meth:`RingSegment.adopt` drops the channel's creator queue before any worker exists,
    and GLT's deleter of that queue ``sem_destroy``s every semaphore of the ring, which the
    workers and the consumer then go on using through their own mappings.
    """
    sem = (ctypes.c_uint32 * (SEM_SIZE // 4))()
    addr = ctypes.addressof(sem)
    if libc.sem_init(addr, 1, 1) != 0:
        return False
    before = bytes(sem)
    libc.sem_destroy(addr)
    return bytes(sem) == before


class RingSegment:
    """The SysV segment of a GLT ``ShmChannel``, from the producer's ``init()`` to its end.

    Why: GLT removes the segment only in the deleter of the channel creator's C++ queue,
    which runs when the last holder of that queue is gone: the channel, *and every batch
    still viewing the ring* (CPU batches are zero-copy views). So a SIGKILLed trainer leaves
    the segment in the kernel for good (``ipcs -m``), and a shut-down loader keeps it until
    the loader and its last batch are collected. Here :meth:`adopt`, before the workers
    start, replaces the channel's creator queue by a plain attachment of the same segment
    (what the workers get too) and drops the creator queue: its deleter detaches and marks
    the segment for removal (``IPC_RMID``) at once. Linux still lets the workers attach a
    marked segment, and frees it when its last mapping goes, whoever holds it and however
    it ends: nothing of ours has to outlive the producer, and no later step can be missed.

    Why not keep the creator queue and a mapping of our own instead (the first design): the
    creator's deleter calls ``shmctl(IPC_RMID)`` after its detach and aborts the process (a
    C++ ``Check``) if the segment is already gone, so our mapping had to outlast it; when a
    batch outlived ``shutdown()``, the deleter ran later, on the batch's last reference, and
    nothing dropped our mapping afterwards: the segment stayed attached (nattch 1) for the
    life of the process, one more per failed-and-rebuilt loader.

    :meth:`release` (the producer's teardown) drops the channel's attachment, so the segment
    is freed as soon as no batch views it.
    """

    def __init__(self, shmid: int) -> None:
        self.shmid = shmid

    @classmethod
    def adopt(cls, channel: ChannelBase, *, pinned: bool = False) -> RingSegment | None:
        """Swap ``channel``'s creator queue for an attachment and mark the segment for removal.

        ``pinned``: the channel was pinned (``pin_memory()``, CUDA builds); the new
        attachment is pinned too. None (and the channel untouched, as stock GLT leaves it)
        when the channel is not a ``ShmChannel`` or this C library's ``sem_destroy`` is not
        the no-op the swap needs.
        """
        shmid = channel_shmid(channel) if isinstance(channel, ShmChannel) else None
        if shmid is None:
            return None
        if not _sem_destroy_leaves_the_semaphore():
            logger.warning(
                "this C library's sem_destroy changes a semaphore; the channel's segment "
                "%s is left to graphlearn-torch (it outlives a SIGKILLed trainer)", shmid
            )  # fmt: skip
            return None
        creator = channel._queue
        try:
            attached = pickle.loads(pickle.dumps(creator))  # GLT's own attach by shmid
        except Exception as e:  # pragma: no cover - GLT's pickling is part of its API
            logger.debug("cannot attach channel segment %s: %s", shmid, e)
            return None
        channel._queue = attached
        del creator  # the channel held the only reference: GLT's deleter runs here
        if _nattch(shmid) is None or _removal_pending(shmid) is not True:
            logger.debug("channel segment %s was not marked for removal", shmid)
        if pinned:
            channel.pin_memory()
        return cls(shmid)

    def release(self, channel: ChannelBase) -> bool:
        """Drop the channel's attachment; True if the segment is gone now (False: a batch
        still views it; the kernel frees it with that batch's last reference)."""
        if channel_shmid(channel) == self.shmid:
            with contextlib.suppress(AttributeError, TypeError):
                channel._queue = _ReleasedQueue(self.shmid)  # GLT's deleter detaches here
        gone = _nattch(self.shmid) is None
        if not gone:
            logger.debug(
                "channel segment %s is still mapped (a batch views it); it is freed with the "
                "last view", self.shmid,
            )  # fmt: skip
        return gone


def _removal_pending(shmid: int) -> bool | None:
    """Whether the segment is marked for removal (``SHM_DEST`` in its mode); None: gone."""
    try:
        with open("/proc/sysvipc/shm") as f:
            header = f.readline().split()
            col_id, col_perms = header.index("shmid"), header.index("perms")
            for line in f:
                fields = line.split()
                if int(fields[col_id]) == shmid:
                    return bool(int(fields[col_perms], 8) & 0o1000)
    except (OSError, ValueError):
        return None
    return None
