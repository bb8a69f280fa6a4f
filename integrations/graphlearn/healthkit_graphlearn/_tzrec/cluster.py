"""GL cluster specs for a torchrun job: one sampler server per node, every rank a client.

Equivalent to tzrec's ``_bootstrap``/``_get_cluster_spec`` (tzrec/datasets/sampler.py), so a
tzrec-like project can drop its own copy:

* each node's LOCAL_RANK 0 picks ``host:port`` for its server;
* the addresses are exchanged with one collective, ordered by ``GROUP_RANK`` (the server's
  ``task_index`` is its index in that list);
* ``client_count = WORLD_SIZE x clients per rank``, client ``task_index = clients per rank x
  RANK + client id``.

What differs, on purpose: bad environment values raise errors naming the variable; a node that
contributed no address is an error here (tzrec would hand GL ``0.0.0.0:0``); the no-dist path
refuses a multi-process environment instead of returning an address only local rank 0 knows;
and besides tzrec's IPv4 ``all_reduce`` there is an ``all_gather`` exchange that carries any
host string. Neither path imports torch unless ``torch.distributed`` is already in use.
"""

from __future__ import annotations

import errno
import ipaddress
import random
import socket
import sys
from typing import Any, Literal

from healthkit import InvalidArgumentError, InvalidArgumentTypeError, UsageError
from healthkit._shared import check_choice, check_int
from healthkit_graphlearn._tzrec.env import DistEnv, check_index

__all__ = [
    "Exchange",
    "client_task_index",
    "exchange_server_addresses",
    "free_port",
    "get_cluster_spec",
    "server_address",
]

Exchange = Literal["all_reduce", "all_gather"]


def _ephemeral_low() -> int:
    """The start of the kernel's range for ``bind(0)`` and ``connect()`` (default 32768)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` a moment ago, taken below the kernel's ephemeral range.

    The server binds it seconds later. A port from ``bind(0)`` lies in the ephemeral range,
    where every ``connect()`` takes its local port and torch's RPC agents open listeners of
    their own with ``bind(0)``: one of the job's own sockets can take it in between. Below the
    range only another explicit pick can collide: random, and checked by a bind here (the
    server then still fails to start if someone takes it first, and the launcher raises with
    its diagnosis). Falls back to ``bind(0)`` when the range starts too low to pick below it.

    Raises:
        InvalidArgumentTypeError: ``host`` is not a non-empty str.
        InvalidArgumentError: ``host`` does not resolve, or is no address of this machine.
    """
    if not isinstance(host, str) or not host:
        raise InvalidArgumentTypeError(f"host must be a host name or address, got {host!r}", "host")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        socket.getaddrinfo(host, None, family, socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise InvalidArgumentError(
            f"host {host!r} does not resolve ({e.strerror}): give this machine's address or "
            "host name (the server listens there)",
            "host",
        ) from None
    low = _ephemeral_low()
    rng = random.SystemRandom()
    for _ in range(100):
        port = rng.randrange(10000, low) if low > 11000 else 0  # no room below: the kernel's
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError as e:
                if e.errno == errno.EADDRNOTAVAIL:
                    raise InvalidArgumentError(
                        f"host {host!r} is not an address of this machine: the server "
                        "listens on this node, so give one of its addresses",
                        "host",
                    ) from None
                continue  # in use: another pick
            return int(s.getsockname()[1])
    raise OSError(f"no free TCP port on {host} below {low} after 100 tries")


def server_address(host: str | None = None, port: int | None = None) -> str:
    """``host:port`` for this node's server. ``host`` defaults to what tzrec uses,
    ``gethostbyname(gethostname())``; ``port`` to a free one."""
    if host is not None and (not isinstance(host, str) or not host):
        raise InvalidArgumentTypeError(f"host must be a host name or None, got {host!r}", "host")
    if host is None:
        host = socket.gethostbyname(socket.gethostname())
    if port is None:
        port = free_port(host)
    else:
        check_int(port, "port", minimum=1, maximum=65535)
    return f"{host}:{port}"


def _initialized_dist(group: Any) -> Any:
    """``torch.distributed`` if a process group is up, else None; never imports torch."""
    dist = sys.modules.get("torch.distributed")  # nobody imported it: nobody initialised it
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist
    if group is not None:
        raise InvalidArgumentError(
            "group= was given but torch.distributed is not initialized: call "
            "torch.distributed.init_process_group() first, or pass group=None",
            "group",
        )
    return None


def exchange_server_addresses(
    address: str | None,
    *,
    env: DistEnv | None = None,
    exchange: Exchange = "all_reduce",
    group: Any = None,
) -> str:
    """Every node's server address, comma-separated in ``GROUP_RANK`` order (GL's ``server``).

    A collective when torch.distributed is initialized: every rank of ``group`` (default: the
    world) must call it. Ranks with ``LOCAL_RANK == 0`` pass their node's address, the others
    ``None``.

    ``exchange="all_reduce"`` is tzrec's: an int32 ``[nodes, 5]`` tensor (IPv4 octets + port),
    MAX-reduced, on the GPU when the backend is NCCL. It carries IPv4 addresses only and
    needs ``WORLD_SIZE`` to be a multiple of ``LOCAL_WORLD_SIZE``. ``exchange="all_gather"``
    uses ``all_gather_object``: any host name, any node sizes (with NCCL, call
    ``torch.cuda.set_device`` first, as torch requires for object collectives).

    Without torch.distributed (a single process) it returns ``address`` itself.
    """
    check_choice(exchange, ("all_reduce", "all_gather"), "exchange")
    env = _check_env(env)
    if address is not None and not isinstance(address, str):
        raise InvalidArgumentTypeError(
            f"address must be 'host:port' or None, got {address!r}", "address"
        )
    if (env.local_rank == 0) != (address is not None):
        raise InvalidArgumentError(
            f"LOCAL_RANK={env.local_rank}: "
            + (
                "local rank 0 runs the node's server and must pass its address"
                if env.local_rank == 0
                else "only local rank 0 passes an address; pass None on the other ranks"
            ),
            "address",
        )
    dist = _initialized_dist(group)
    if dist is None:
        if env.world_size > 1 or address is None:
            raise UsageError(
                f"WORLD_SIZE={env.world_size}, LOCAL_RANK={env.local_rank} but torch.distributed "
                "is not initialized, so the server addresses cannot be shared: call "
                "torch.distributed.init_process_group() first, or build the cluster spec "
                "yourself and pass it to every rank"
            )
        return address
    if exchange == "all_gather":
        return _all_gather(dist, address, env, group)
    return _all_reduce(dist, address, env, group)


def _ipv4_row(address: str) -> list[int]:
    host, _, port = address.rpartition(":")
    try:
        octets = [int(x) for x in ipaddress.IPv4Address(host).packed]
    except ValueError:
        raise InvalidArgumentError(
            f"exchange='all_reduce' carries IPv4 addresses only (as tzrec's does), got "
            f"{address!r}: pass an IPv4 host, or use exchange='all_gather' on every rank",
            "address",
        ) from None
    return [*octets, int(port)]


def _all_reduce(dist: Any, address: str | None, env: DistEnv, group: Any) -> str:
    import torch

    if env.world_size % env.local_world_size:
        raise InvalidArgumentError(
            f"exchange='all_reduce' needs WORLD_SIZE ({env.world_size}) to be a multiple of "
            f"LOCAL_WORLD_SIZE ({env.local_world_size}); use exchange='all_gather' for nodes "
            "of different sizes",
            "exchange",
        )
    nodes = env.group_size
    if env.group_rank >= nodes:
        raise InvalidArgumentError(
            f"GROUP_RANK={env.group_rank} must be < the number of nodes ({nodes}): check "
            "the launcher's GROUP_RANK, WORLD_SIZE and LOCAL_WORLD_SIZE",
            "GROUP_RANK",
        )
    table = torch.zeros([nodes, 5], dtype=torch.int32)
    if address is not None:
        table[env.group_rank] = torch.tensor(_ipv4_row(address), dtype=torch.int32)
    if dist.get_backend(group) == dist.Backend.NCCL:
        table = table.cuda()
    dist.all_reduce(table, op=dist.ReduceOp.MAX, group=group)
    rows = table.cpu().tolist()
    missing = [i for i, row in enumerate(rows) if row[4] == 0]
    if missing:
        raise UsageError(
            f"no server address from node(s) {missing}: their LOCAL_RANK 0 passed none "
            "(every node needs one rank with LOCAL_RANK=0 calling this)"
        )
    return ",".join(".".join(str(x) for x in row[:4]) + f":{row[4]}" for row in rows)


def _all_gather(dist: Any, address: str | None, env: DistEnv, group: Any) -> str:
    size = dist.get_world_size(group)
    gathered: list[Any] = [None] * size
    dist.all_gather_object(gathered, (env.group_rank, address), group=group)
    by_node: dict[int, str] = {}
    for node, addr in gathered:
        if addr is None:
            continue
        if by_node.setdefault(node, addr) != addr:
            raise UsageError(
                f"two ranks claim to run the server of node GROUP_RANK={node} "
                f"({by_node[node]} and {addr}): check LOCAL_RANK/GROUP_RANK"
            )
    missing = sorted(set(range(max(by_node, default=-1) + 1)) - set(by_node))
    if missing or not by_node:
        raise UsageError(
            f"no server address from node(s) {missing or [0]}: their LOCAL_RANK 0 passed none "
            "(every node needs one rank with LOCAL_RANK=0 calling this)"
        )
    return ",".join(by_node[i] for i in range(len(by_node)))


def get_cluster_spec(
    num_client_per_rank: int = 1,
    *,
    host: str | None = None,
    port: int | None = None,
    exchange: Exchange = "all_reduce",
    group: Any = None,
    env: DistEnv | None = None,
) -> dict[str, int | str]:
    """tzrec's ``_get_cluster_spec``: ``{"server": "h:p,...", "client_count": N}``.

    A collective under torch.distributed (every rank calls it). ``num_client_per_rank`` is the
    number of GL clients each rank opens: its DataLoader ``num_workers``, or 1 for a client in
    the main process.
    """
    check_int(num_client_per_rank, "num_client_per_rank", minimum=1)
    if host is not None and not isinstance(host, str):
        raise InvalidArgumentTypeError(f"host must be a str or None, got {host!r}", "host")
    if port is not None:
        check_int(port, "port", minimum=1, maximum=65535)
    check_choice(exchange, ("all_reduce", "all_gather"), "exchange")
    env = _check_env(env)
    address = server_address(host, port) if env.local_rank == 0 else None
    servers = exchange_server_addresses(address, env=env, exchange=exchange, group=group)
    return {"server": servers, "client_count": env.world_size * num_client_per_rank}


def client_task_index(
    client_id: int = -1,
    *,
    num_client_per_rank: int = 1,
    client_id_bias: int = 0,
    env: DistEnv | None = None,
) -> int:
    """The GL client ``task_index`` of this process, as tzrec's ``BaseSampler.init`` computes it.

    ``client_id < 0`` means: the DataLoader worker id, or 0 in the main process. The result
    must stay below ``client_count``: GL fails with a bare ``IndexError`` otherwise.
    """
    check_int(num_client_per_rank, "num_client_per_rank", minimum=1)
    check_index(client_id_bias, "client_id_bias")
    check_int(client_id, "client_id")
    env = _check_env(env)
    if client_id < 0:
        client_id = _worker_id()
    client_id += client_id_bias
    if client_id >= num_client_per_rank:
        raise InvalidArgumentError(
            f"client id {client_id} (worker id + client_id_bias {client_id_bias}) must be < "
            f"num_client_per_rank={num_client_per_rank}, or the task index lands on another "
            "rank's client (or past client_count, where GL fails with IndexError): raise "
            "num_client_per_rank to at least the DataLoader's num_workers + client_id_bias",
            "num_client_per_rank",
        )
    return num_client_per_rank * env.rank + client_id


def _check_env(env: object) -> DistEnv:
    """``env`` given, or this process's from the environment."""
    if env is None:
        return DistEnv.from_environ()
    if not isinstance(env, DistEnv):
        raise InvalidArgumentTypeError(
            f"env must be a healthkit_graphlearn.DistEnv or None, got {env!r}", "env"
        )
    return env


def _worker_id() -> int:
    data = sys.modules.get("torch.utils.data")
    if data is None:
        return 0  # torch's DataLoader never ran here, so this is no DataLoader worker
    info = data.get_worker_info()
    return 0 if info is None else int(info.id)


import healthkit_graphlearn as _package  # noqa: E402

_package._publish(__name__)
