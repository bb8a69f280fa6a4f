"""The privates of GLT's sampling producer and worker loop that healthkit_glt's share.

:class:`healthkit_glt.DistSamplingProducer` subclasses GLT's ``DistMpSamplingProducer`` and
fills the private state GLT's own ``produce_all`` reads (its ``_workers``, ``_task_queues``
and ``_shutdown``: the subclass's own attributes too, so they are used as ``self._workers``
there and listed here for the import-time check); the seeds come from GLT's
``_get_seeds_indexes``. The worker loop (:mod:`healthkit_glt._worker`) does what GLT's
does, with the two torch privates GLT's uses.
"""

from __future__ import annotations

from typing import Any

from healthkit_glt._adapter.build import Required

__all__ = ["REQUIRED", "seeds_indexes", "set_rpc_timeout", "set_worker_signal_handlers"]

_DIST = "graphlearn_torch.distributed"

#: The GLT and torch privates this module touches, and the producer state the subclass
#: shares with GLT's ``produce_all`` (see :data:`healthkit_glt._adapter.REQUIRED`).
REQUIRED: tuple[Required, ...] = (
    *(
        (_DIST, "DistMpSamplingProducer", name)
        for name in ("_workers", "_task_queues", "_shutdown", "_get_seeds_indexes")
    ),
    ("torch.distributed.rpc", None, "_set_rpc_timeout"),
    ("torch._C", None, "_set_worker_signal_handlers"),
)


def seeds_indexes(producer: Any) -> list[Any]:
    """``DistMpSamplingProducer._get_seeds_indexes``: each worker's unshuffled seed indexes."""
    indexes: list[Any] = producer._get_seeds_indexes()
    return indexes


def set_rpc_timeout(seconds: float) -> None:
    """torch's ``rpc._set_rpc_timeout``, the only setter of the default RPC timeout."""
    from torch.distributed import rpc

    rpc._set_rpc_timeout(seconds)  # type: ignore[attr-defined,unused-ignore]


def set_worker_signal_handlers() -> None:
    """torch's DataLoader worker handlers, as GLT's worker loop installs them."""
    from torch._C import _set_worker_signal_handlers

    _set_worker_signal_handlers()
