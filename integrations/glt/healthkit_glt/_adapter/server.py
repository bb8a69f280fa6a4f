"""GLT's server slot and the producer pools of its ``DistServer``.

GLT's ``init_server`` builds its own ``DistServer`` and has no parameter for another one, so
:func:`healthkit_glt.init_server` sets the server context and installs its server in GLT's
module global itself (:func:`set_server_context`, :func:`install_server`). And
:class:`healthkit_glt.DistServer` keeps GLT's producer pools filled (:class:`ProducerPools`)
so that the methods it inherits (a stock client's ``create_sampling_producer``,
``fetch_one_sampled_message``...) serve its producers as GLT's own.
"""

from __future__ import annotations

from typing import Any

from healthkit_glt._adapter.build import Required

__all__ = ["REQUIRED", "ProducerPools", "install_server", "set_server_context"]

_DIST = "graphlearn_torch.distributed"

#: The GLT privates this module touches (see :data:`healthkit_glt._adapter.REQUIRED`).
REQUIRED: tuple[Required, ...] = (
    (f"{_DIST}.dist_server", None, "_dist_server"),
    (f"{_DIST}.dist_context", None, "_set_server_context"),
    *(
        (_DIST, "DistServer", pool)
        for pool in (
            "_lock", "_worker_key2producer_id", "_cur_producer_idx", "_producer_pool",
            "_msg_buffer_pool", "_epoch",
        )
    ),
)  # fmt: skip


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


class ProducerPools:
    """The producer pools of a GLT ``DistServer``: producers by id, shared by worker key.

    ``lock`` is GLT's own lock of them; hold it for every call below.
    """

    def __init__(self, server: Any) -> None:
        self._server = server
        self.lock = server._lock

    def shared_id(self, worker_key: Any) -> int | None:
        """The producer that clients of ``worker_key`` share, if any."""
        producer_id: int | None = self._server._worker_key2producer_id.get(worker_key)
        return producer_id

    def new_id(self) -> int:
        """The next producer id (GLT's counter)."""
        producer_id = int(self._server._cur_producer_idx)
        self._server._cur_producer_idx += 1
        return producer_id

    def add(self, worker_key: Any, producer_id: int, producer: Any, buffer: Any) -> None:
        """A started producer and its channel, shared by ``worker_key``, before its first epoch."""
        s = self._server
        s._worker_key2producer_id[worker_key] = producer_id
        s._producer_pool[producer_id] = producer
        s._msg_buffer_pool[producer_id] = buffer
        s._epoch[producer_id] = -1

    def get(self, producer_id: int) -> Any:
        """The producer, or None."""
        return self._server._producer_pool.get(producer_id)

    def ids(self) -> list[int]:
        return list(self._server._producer_pool)

    def new_epoch(self, producer_id: int, epoch: int) -> bool:
        """Record ``epoch`` as started; False if it (or a later one) already was."""
        epochs = self._server._epoch
        if epochs[producer_id] >= epoch:
            return False
        epochs[producer_id] = epoch
        return True

    def unshare(self, producer_id: int) -> None:
        """A new client of the producer's worker key gets a new producer from now on."""
        keys = self._server._worker_key2producer_id
        for key, pid in list(keys.items()):
            if pid == producer_id:
                del keys[key]

    def pop(self, producer_id: int) -> Any:
        """Forget the producer everywhere; it, or None."""
        s = self._server
        s._epoch.pop(producer_id, None)
        s._msg_buffer_pool.pop(producer_id, None)
        self.unshare(producer_id)
        return s._producer_pool.pop(producer_id, None)
