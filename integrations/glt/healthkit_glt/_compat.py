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

This is also the one module that touches GLT's internals (and the two torch privates GLT's
own worker loop uses): the ring layout, the channel's ``_queue`` swap, the server slot
(``_dist_server``) and ``_set_server_context``, the loader's private flags
(:func:`init_loader_state`), ``_set_worker_ranks``, ``_set_ntypes_and_etypes``,
``_collate_fn``, ``_get_seeds_indexes``, the private attributes of GLT's producer that
:class:`healthkit_glt.DistSamplingProducer` shares with it (its ``_workers``,
``_task_queues`` and ``_shutdown``, which GLT's ``produce_all`` reads), and the producer
pools of GLT's ``DistServer`` that :class:`healthkit_glt.DistServer` extends.
:func:`self_check` runs at import: a build that lacks one of them fails the import with what
is missing, and so does a build not in :data:`KNOWN_BUILDS`, naming its version (the checks
find a name, not what it means): accept one with ``$HEALTHKIT_GLT_ACCEPT_BUILD`` set to its
version after running tests/glt on it (docs/glt.md, "Supported versions").
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib.metadata
import logging
import os
import pickle
from typing import Any

from packaging.version import InvalidVersion, Version

from healthkit import UsageError
from healthkit._shared import sysv_shm_segments
from healthkit_glt._stack import stack_error

# The first graphlearn-torch import of the package (__init__ imports this module first): a
# missing or broken stack fails here with what to install, not with GLT's own error.
try:
    from graphlearn_torch.channel import ChannelBase, ShmChannel
except Exception as e:  # ImportError, or GLT's RuntimeError on a torch it was not built for
    raise stack_error(e) from e

__all__ = [
    "ACCEPT_BUILD_ENV",
    "KNOWN_BUILDS",
    "RingSegment",
    "collate",
    "glt_build",
    "glt_version",
    "init_loader_state",
    "install_server",
    "seeds_indexes",
    "self_check",
    "set_loader_partitions",
    "set_rpc_timeout",
    "set_server_context",
    "set_worker_ranks",
    "set_worker_signal_handlers",
]

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


# ---------------------------------------------------------------------- server slot
def set_server_context(
    num_servers: int, server_rank: int, group_name: str | None, num_clients: int
) -> None:
    """GLT's private ``_set_server_context`` (what its ``init_server`` calls first): the
    server's ``DistServer.__init__`` reads the context it sets."""
    from graphlearn_torch.distributed.dist_context import _set_server_context

    _set_server_context(num_servers, server_rank, group_name, num_clients)


def install_server(server: Any) -> None:
    """Put ``server`` in the module global that GLT's ``get_server()`` and
    ``wait_and_shutdown_server()`` read (GLT's ``init_server`` has no parameter for it)."""
    from graphlearn_torch.distributed import dist_server

    dist_server._dist_server = server


# ---------------------------------------------------------------------- loader state
#: The ``SamplingConfig`` fields ``DistLoader.__init__`` copies onto the loader.
_CONFIG_FIELDS = (
    "sampling_type", "num_neighbors", "batch_size", "shuffle", "drop_last", "with_edge",
    "with_weight", "collect_features", "edge_dir",
)  # fmt: skip


def init_loader_state(
    loader: Any,
    *,
    data: Any,
    input_data: Any,
    config: Any,
    to_device: Any,
    worker_options: Any,
    remote: bool,
) -> None:
    """The state GLT's ``DistLoader.__init__`` sets before it starts a producer, for a
    multiprocessing (``remote=False``) or server-client loader: what its ``__iter__``,
    ``__next__``, ``_collate_fn`` and ``__del__`` read.

    Why here: GLT's ``DistLoader`` takes no producer class, so the loader does its own
    ``__init__`` branch (see :mod:`healthkit_glt._loader`) and must leave the same private
    flags behind; :func:`self_check` checks that GLT's ``__init__`` still sets them.
    """
    from graphlearn_torch.utils import get_available_device

    loader.data = data
    loader.input_data = input_data
    for name in _CONFIG_FIELDS:
        setattr(loader, name, getattr(config, name))
    loader.sampling_config = config
    loader.to_device = get_available_device(to_device)
    loader.worker_options = worker_options
    loader._is_collocated_worker = False
    loader._is_mp_worker = not remote
    loader._is_remote_worker = remote
    loader._num_recv = 0
    loader._epoch = 0
    loader._with_channel = True


def set_loader_partitions(
    loader: Any, num_partitions: int, partition_idx: int, ntypes: Any, etypes: Any
) -> None:
    """The dataset's partitioning and types on the loader, as ``DistLoader.__init__`` sets them."""
    loader.num_data_partitions = num_partitions
    loader.data_partition_idx = partition_idx
    loader._set_ntypes_and_etypes(ntypes, etypes)


def set_worker_ranks(worker_options: Any, ctx: Any) -> None:
    """``MpDistSamplingWorkerOptions._set_worker_ranks``: the workers' RPC ranks from the
    current distributed context (GLT's loader calls it before building the producer)."""
    worker_options._set_worker_ranks(ctx)


def collate(loader: Any, msg: Any) -> Any:
    """GLT's ``DistLoader._collate_fn``: a sampled message as the batch the loader yields."""
    return loader._collate_fn(msg)


def seeds_indexes(producer: Any) -> list[Any]:
    """``DistMpSamplingProducer._get_seeds_indexes``: each worker's unshuffled seed indexes."""
    indexes: list[Any] = producer._get_seeds_indexes()
    return indexes


# ---------------------------------------------------------------------- torch privates
def set_rpc_timeout(seconds: float) -> None:
    """torch's ``rpc._set_rpc_timeout``, the only setter of the default RPC timeout."""
    from torch.distributed import rpc

    rpc._set_rpc_timeout(seconds)  # type: ignore[attr-defined,unused-ignore]


def set_worker_signal_handlers() -> None:
    """torch's DataLoader worker handlers, as GLT's worker loop installs them."""
    from torch._C import _set_worker_signal_handlers

    _set_worker_signal_handlers()


# ---------------------------------------------------------------------- self-check
#: Set to the exact version of a build not in :data:`KNOWN_BUILDS` to import healthkit_glt
#: on it anyway (after running tests/glt on it): a version, not a yes, so that the next
#: upgrade is refused again until it is checked too.
ACCEPT_BUILD_ENV = "HEALTHKIT_GLT_ACCEPT_BUILD"

#: The builds this module was checked against (tests/glt runs on both).
KNOWN_BUILDS = {
    "0.2.4": "PyPI release, torch 2.3",
    "0.2.4+git26fe3d4": "upstream main built from source, torch 2.8",
}

#: The private flags of GLT's loader that :func:`init_loader_state` and the loader set.
_LOADER_FLAGS = (
    "_is_collocated_worker", "_is_mp_worker", "_is_remote_worker", "_num_recv", "_epoch",
    "_with_channel", "_shutdowned", "_channel", "_mp_producer", "_input_len", "_input_type",
    "_num_expected", "_server_rank_list", "_producer_id_list",
)  # fmt: skip
#: The private attributes of GLT's producer that our subclass fills and GLT's own
#: ``produce_all`` reads (the workers, their command queues, the shut-down flag).
_PRODUCER_STATE = ("_workers", "_task_queues", "_shutdown", "_get_seeds_indexes")
#: The producer pools of GLT's ``DistServer`` that :class:`healthkit_glt.DistServer` fills.
_SERVER_POOLS = (
    "_lock", "_worker_key2producer_id", "_cur_producer_idx", "_producer_pool",
    "_msg_buffer_pool", "_epoch",
)  # fmt: skip
_DIST = "graphlearn_torch.distributed"

#: Every GLT (and torch) private this package uses: (module, object or None, name). With
#: an object, ``name`` is an attribute of it, or a name its ``__init__`` assigns (the
#: instance attributes GLT sets there: the loader's flags, the server's producer pools).
REQUIRED: tuple[tuple[str, str | None, str], ...] = (
    ("graphlearn_torch.channel", "ShmChannel", "_queue"),
    (f"{_DIST}.dist_server", None, "_dist_server"),
    (f"{_DIST}.dist_context", None, "_set_server_context"),
    (_DIST, "MpDistSamplingWorkerOptions", "_set_worker_ranks"),
    (_DIST, "DistLoader", "_set_ntypes_and_etypes"),
    (_DIST, "DistLoader", "_collate_fn"),
    *((_DIST, "DistLoader", flag) for flag in _LOADER_FLAGS),
    *((_DIST, "DistMpSamplingProducer", name) for name in _PRODUCER_STATE),
    *((_DIST, "DistServer", pool) for pool in _SERVER_POOLS),
    ("torch.distributed.rpc", None, "_set_rpc_timeout"),
    ("torch._C", None, "_set_worker_signal_handlers"),
)


def _has(module: str, owner: str | None, name: str) -> bool:
    try:
        mod = importlib.import_module(module)
    except ImportError:
        return False
    if owner is None:
        return hasattr(mod, name)
    obj = getattr(mod, owner, None)
    if obj is None:
        return False
    if hasattr(obj, name):
        return True
    init = getattr(obj, "__init__", None)
    code = getattr(init, "__code__", None)
    return code is not None and name in code.co_names


def self_check(
    version: str | None = None,
    required: tuple[tuple[str, str | None, str], ...] = REQUIRED,
) -> None:
    """Check that the installed graphlearn-torch is a build this module knows, with every
    internal it touches.

    Raises ImportError naming the build and what it lacks, or naming a build not in
    :data:`KNOWN_BUILDS` (the look-ups below find a name, not what it means: an unknown
    build may have them all and still lay its ring out or use its flags differently),
    unless ``$HEALTHKIT_GLT_ACCEPT_BUILD`` names that very version: then a warning says it
    runs untested. Cheap: attribute look-ups on modules already imported.
    """
    version = glt_version() if version is None else version
    tested = "; ".join(f"{v} ({what})" for v, what in KNOWN_BUILDS.items())
    missing = [
        f"{module}.{owner}.{name}" if owner else f"{module}.{name}"
        for module, owner, name in required
        if not _has(module, owner, name)
    ]
    if missing:
        raise ImportError(
            f"healthkit_glt: graphlearn-torch {version} lacks {', '.join(missing)}, which "
            "healthkit_glt adapts (healthkit_glt/_compat.py); install a tested build "
            f"({tested}; docs/glt.md, 'Supported versions'), or port _compat.py to this one"
        )
    if version in KNOWN_BUILDS:
        return
    if os.environ.get(ACCEPT_BUILD_ENV, "").strip() == version:
        logger.warning(
            "healthkit_glt: graphlearn-torch %s is not a build healthkit_glt was tested with "
            "(%s); accepted by $%s. The internals it adapts are present; the ring reader "
            "still checks the ring layout at init()", version, tested, ACCEPT_BUILD_ENV,
        )  # fmt: skip
        return
    raise ImportError(
        f"healthkit_glt: graphlearn-torch {version} is not a build healthkit_glt knows "
        f"(tested: {tested}). healthkit_glt adapts GLT internals that change between builds "
        "(the channel's ring, the loader's private flags, the server slot: "
        "healthkit_glt/_compat.py), so an unknown build is refused rather than guessed at. "
        f"Install a tested build (docs/glt.md, 'Supported versions'), or run tests/glt on "
        f"this one and set {ACCEPT_BUILD_ENV}={version} to accept it"
    )

self_check()
