"""GLT's ``ShmChannel`` ring in shared memory: its C++ layout, a read-only view of it, and the
life of its SysV segment.

The layout is ``ShmQueueMeta`` (``graphlearn_torch/include/shm_queue.h``), as 0.2.4 and
26fe3d4 both write it. It is never assumed: GLT stores its own offsets in the header (where
the block table and the data start), and :meth:`RingView.attach` checks them, and every
semaphore's value, before anything reads the ring; any other layout raises
:class:`RingLayoutError` (the receiver then falls back to a helper thread, and ``tests/glt``
asserts which receiver each build gets).

:class:`RingSegment` swaps the channel's private ``_queue`` so the segment is marked for
removal as soon as every party has attached (why: its docstring).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import pickle
from collections.abc import Callable
from typing import Any

from graphlearn_torch.channel import ChannelBase, ShmChannel

from healthkit import HealthkitError, UsageError
from healthkit._shared import sysv_shm_segments
from healthkit_glt._adapter.build import Required

__all__ = [
    "REQUIRED",
    "RingLayoutError",
    "RingSegment",
    "RingView",
    "channel_shmid",
    "mark_for_removal",
]

logger = logging.getLogger("healthkit.glt")

#: The GLT privates this module touches (see :data:`healthkit_glt._adapter.REQUIRED`).
REQUIRED: tuple[Required, ...] = (("graphlearn_torch.channel", "ShmChannel", "_queue"),)

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


class RingLayoutError(HealthkitError, RuntimeError):
    """The channel's shared-memory ring is not GLT 0.2.4's layout (or not a ShmChannel):
    ``receiver="ring"`` cannot be used with it; use ``"auto"`` or ``"thread"``. A
    ``HealthkitError`` (and a ``RuntimeError``, as before)."""


@functools.cache
def sem_value_word_works() -> bool:
    """Whether a semaphore's value can be read as its first 32-bit word (glibc's 64-bit
    ``sem_t``), checked once per process against ``sem_getvalue`` on a real semaphore.

    :class:`RingView` reads the value that way because a receiver checks it once per batch
    on cold caches, where a foreign-function call costs measurably more than a memory read.
    """
    sem = (ctypes.c_uint32 * (SEM_SIZE // 4))()
    addr = ctypes.addressof(sem)
    if libc.sem_init(addr, 1, 0) != 0:
        return False
    try:
        for expected in (0, 1, 2):
            if expected:
                libc.sem_post(addr)
            if not _sem_word(addr) == _sem_getvalue(addr) == expected:
                return False
        return True
    finally:
        libc.sem_destroy(addr)


class RingView:
    """A read-only mapping of a ``ShmChannel``'s ring, its layout checked.

    One consumer per ring (GLT's design): nobody else takes a posted read semaphore, so
    "posted" stays true until the consumer's ``recv()`` takes it, and the read block id
    changes only in that ``recv()``. The segment is attached read-only: a bug here can
    misread the ring, never corrupt it.
    """

    #: Whether the next block to read is written (its read semaphore posted), so
    #: ``recv()`` returns at once. Three memory reads: called once per batch, and once per
    #: millisecond while the ring is empty, on cold caches.
    next_block_written: Callable[[], bool]

    def __init__(self, addr: int, blocks: int) -> None:
        self.blocks = blocks
        self._addr: int | None = addr
        table = (ctypes.c_char * (HEADER_SIZE + BLOCK_SIZE * blocks)).from_address(addr)
        self._header = memoryview(table).cast("B").cast("Q")
        self._words = memoryview(table).cast("B").cast("I")
        read_sems = [(HEADER_SIZE + BLOCK_SIZE * i + READ_SEM) // 4 for i in range(blocks)]

        def next_block_written(
            header: memoryview = self._header, words: memoryview = self._words,
            sems: list[int] = read_sems, n: int = blocks,
        ) -> bool:  # fmt: skip
            r = header[READ_BLOCK_ID]
            return header[WRITE_BLOCK_ID] > r and words[sems[r % n]] > 0

        self.next_block_written = next_block_written

    @classmethod
    def open(cls, channel: ChannelBase) -> RingView:
        """``channel``'s ring; RingLayoutError if it is not a ``ShmChannel`` of this layout."""
        shmid = channel_shmid(channel) if isinstance(channel, ShmChannel) else None
        if shmid is None:
            raise RingLayoutError(f"{type(channel).__name__} is not a GLT ShmChannel")
        return cls.attach(shmid)

    @classmethod
    def attach(cls, shmid: int) -> RingView:
        """The ring in SysV segment ``shmid``; RingLayoutError if it is not this layout."""
        if not sem_value_word_works():
            raise RingLayoutError(
                "this C library's sem_t does not hold its value in its first 32-bit word"
            )
        addr = libc.shmat(shmid, None, SHM_RDONLY)
        if addr is None or addr == ctypes.c_void_p(-1).value:
            err = ctypes.get_errno()
            raise RingLayoutError(f"cannot attach channel segment {shmid}: {os.strerror(err)}")
        try:
            blocks = _check_layout(addr)
        except RingLayoutError:
            libc.shmdt(addr)
            raise
        return cls(addr, blocks)

    def claimed(self) -> int:
        """How many blocks writers have claimed that the consumer has not read yet."""
        return int(self._header[WRITE_BLOCK_ID] - self._header[READ_BLOCK_ID])

    def close(self) -> None:
        """Unmap the ring (once); :attr:`next_block_written` raises ValueError afterwards."""
        addr, self._addr = self._addr, None
        if addr is None:
            return
        self._header.release()
        self._words.release()
        libc.shmdt(addr)


def _check_layout(addr: int) -> int:
    """The number of blocks of the ring at ``addr``, after checking that its header is GLT
    0.2.4's layout: the offsets GLT wrote match ours, and every semaphore reads 0 or 1, in
    its first word too."""
    head = (ctypes.c_size_t * 4).from_address(addr)
    blocks = head[MAX_BLOCK_NUM]
    expected = (HEADER_SIZE, HEADER_SIZE + BLOCK_SIZE * blocks)
    found = (head[BLOCK_META_OFFSET], head[DATA_BUF_OFFSET])
    if blocks < 1 or found != expected:
        raise RingLayoutError(
            "the channel's ring header is not graphlearn-torch 0.2.4's layout "
            f"({blocks} blocks, block table and data at {found}, expected {expected})"
        )
    for i in range(blocks):
        for sem in (WRITE_SEM, READ_SEM):
            sem_addr = addr + HEADER_SIZE + BLOCK_SIZE * i + sem
            # Read between two sem_getvalue() calls: a writer may post in between.
            before, word, after = (
                _sem_getvalue(sem_addr),
                _sem_word(sem_addr),
                _sem_getvalue(sem_addr),
            )
            if not {before, after} <= {0, 1} or word not in (before, after):
                raise RingLayoutError(
                    f"the channel's ring block {i} has a semaphore reading {before} "
                    f"(first word {word}); not graphlearn-torch 0.2.4's layout"
                )
    return int(blocks)


def _sem_getvalue(addr: int) -> int:
    value = ctypes.c_int()
    libc.sem_getvalue(addr, ctypes.byref(value))
    return value.value


def _sem_word(addr: int) -> int:
    return ctypes.c_uint32.from_address(addr).value


def mark_for_removal(channel: ChannelBase) -> tuple[int | None, bool]:
    """Mark ``channel``'s segment for removal (``IPC_RMID``): the kernel frees it with its
    last mapping. ``(shmid, marked)``; for a channel whose C++ queue can never be dropped
    (a receive thread stuck in it), so GLT's deleter, which would remove it, never runs."""
    shmid = channel_shmid(channel)
    return shmid, shmid is not None and libc.shmctl(shmid, IPC_RMID, None) == 0


def channel_shmid(channel: ChannelBase) -> int | None:
    """The SysV shared-memory id of a GLT ``ShmChannel`` (None for other channels)."""
    q = getattr(channel, "_queue", None)
    try:
        return int(q.__getstate__()) if q is not None else None
    except Exception:
        return None


def _segment(shmid: int) -> dict[str, str] | None:
    """The segment's row (None: it is gone, or the file cannot be read)."""
    try:
        return next((r for r in sysv_shm_segments() if int(r["shmid"]) == shmid), None)
    except (OSError, ValueError, KeyError):
        return None


def _nattch(shmid: int) -> int | None:
    """How many mappings the segment has (None: it is gone)."""
    row = _segment(shmid)
    return None if row is None else int(row["nattch"])


class _ReleasedQueue:
    """Stands in for a ``ShmChannel``'s queue once the producer released its segment."""

    def __init__(self, shmid: int) -> None:
        self._shmid = shmid

    def __getattr__(self, name: str) -> Any:
        raise UsageError(
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
    row = _segment(shmid)
    return None if row is None else bool(int(row["perms"], 8) & 0o1000)
