"""Leases: one TCP connection per (client loader, server) that tells each side when the
other is gone, in server-client mode.

Why a connection of our own next to GLT's RPC: the RPC layer tells nobody that a peer
died. A server whose client died keeps that client's sampling workers running for good,
and a client learns of a dead server only from the RPCs it has in flight (and of a lost
machine only after the RPC timeout, 180 s by default). A plain TCP connection does both:

- a process that ends, however (SIGKILL, OOM, crash, exit), has its sockets closed by its
  kernel, so the peer reads end-of-file within milliseconds;
- a machine or network that is gone stops answering TCP keepalive probes, which both
  kernels send on an idle connection (:func:`set_keepalive`); the connection then fails
  with ``ETIMEDOUT`` ``connection_timeout`` seconds after the peer's last answer to a
  probe, which a live idle peer gives every half of it: between half of
  ``connection_timeout`` and all of it after the loss.

Neither needs the peer's Python to run: a server or client that is alive but busy (its GIL
held for minutes, stopped in a debugger, swapping) keeps its lease, because its kernel
answers the probes. Only an end or a loss ends a lease, never slowness.

The protocol is one line each way: the client sends ``HKGLT1 <token>\\n`` (a random token
it then names in its RPCs), the server answers ``OK <server id>\\n`` with the random id it
gave the client in its hello RPC, so a client that tried several of the server's addresses
never holds a lease on another server that happens to listen on the same port elsewhere.
Nothing else is ever sent; the server closes a connection that does not complete the
handshake within :data:`HANDSHAKE_TIMEOUT_S` or sends anything else.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import secrets
import socket
import threading
import time
from collections.abc import Callable, Sequence

from healthkit import WatchSet
from healthkit._shared import check_bound
from healthkit.lowlevel import env_seconds

__all__ = [
    "CONNECTION_TIMEOUT_ENV",
    "DEFAULT_CONNECTION_TIMEOUT_S",
    "Lease",
    "LeaseServer",
    "new_token",
    "set_keepalive",
]

logger = logging.getLogger("healthkit.glt")

CONNECTION_TIMEOUT_ENV = "HEALTHKIT_GLT_CONNECTION_TIMEOUT_SECONDS"
"""How long a peer's machine or network may stay silent before its lease ends (default 10)."""

DEFAULT_CONNECTION_TIMEOUT_S = 10.0
HANDSHAKE_TIMEOUT_S = 10.0
_MAGIC = b"HKGLT1 "
_TOKEN_HEX = 32
_LINE_MAX = len(_MAGIC) + _TOKEN_HEX + 1


def new_token() -> str:
    return secrets.token_hex(_TOKEN_HEX // 2)


def connection_timeout(value: float | None, *, strict: bool = False) -> float:
    """The argument, else ``$HEALTHKIT_GLT_CONNECTION_TIMEOUT_SECONDS``, else 10 s (at least
    2 s: the keepalive counts in whole seconds)."""
    if value is not None:
        seconds = check_bound(value, "connection_timeout")
    else:
        seconds = env_seconds(CONNECTION_TIMEOUT_ENV, DEFAULT_CONNECTION_TIMEOUT_S, strict=strict)
    return max(2.0, float(seconds))


def keepalive_plan(timeout_s: float) -> tuple[int, int, int]:
    """TCP keepalive's idle time, probe interval and probe count for ``timeout_s``."""
    idle = max(1, int(timeout_s // 2))
    interval = max(1, int(timeout_s // 10))
    count = max(1, int((timeout_s - idle) // interval))
    return idle, interval, count


def set_keepalive(sock: socket.socket, timeout_s: float) -> None:
    """Make the kernel end ``sock`` with ``ETIMEDOUT`` when the peer's machine stays silent
    for about ``timeout_s``: idle half of it, then probes every tenth, until it is used up.
    ``TCP_USER_TIMEOUT`` bounds unacknowledged data the same way (the handshake line)."""
    idle, interval, count = keepalive_plan(timeout_s)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, interval)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, count)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(timeout_s * 1000))


def why_closed(sock: socket.socket, timeout_s: float) -> str | None:
    """Why the peer of ``sock`` (non-blocking) is gone, or None while it is there.

    Reads and drops whatever arrived (nothing should): the connection's only message after
    the handshake is its end.
    """
    try:
        while True:
            data = sock.recv(4096)
            if not data:
                return "its connection was closed (its process ended, or closed it)"
    except BlockingIOError:
        return None
    except OSError as e:
        if e.errno == errno.ETIMEDOUT:
            # The kernel counts the silence from the peer's last answer, and a live idle
            # peer answers a probe every ``idle`` seconds: the loss itself came between
            # ``timeout - idle`` and ``timeout`` seconds before this (5-10 s by default).
            idle = keepalive_plan(timeout_s)[0]
            return (
                f"it stopped answering TCP keepalive probes: nothing came from it for "
                f"{timeout_s:g}s (connection_timeout), so it went silent "
                f"{max(timeout_s - idle, 0):g}-{timeout_s:g}s before this (its machine or "
                "the network is gone)"
            )
        return f"its connection failed: {e.strerror or e}"


class _Conn:
    def __init__(self, sock: socket.socket, peer: str) -> None:
        self.sock = sock
        self.peer = peer
        self.buffer = b""
        self.token: str | None = None
        self.deadline = time.monotonic() + HANDSHAKE_TIMEOUT_S


class LeaseServer:
    """The server's side: a listening socket and one thread that waits, in one
    :class:`healthkit.WatchSet`, on it and on every lease; ``on_end(token, why)`` runs on
    that thread when a lease ends (keep it short: hand long work to another thread)."""

    def __init__(
        self,
        on_end: Callable[[str, str], None],
        *,
        bind_host: str = "",
        timeout_s: float = DEFAULT_CONNECTION_TIMEOUT_S,
    ) -> None:
        self._on_end = on_end
        self.timeout_s = timeout_s
        self.server_id = new_token()
        self._listener = socket.create_server((bind_host, 0), backlog=128)
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self._conns: dict[int, _Conn] = {}  # fd -> connection (handshake or established)
        self._live: dict[str, _Conn] = {}  # token -> established connection
        self._lock = threading.Lock()
        self._closing = False
        self._set = WatchSet()
        self._set.add_fd(self._listener.fileno(), self._accept)
        self._thread = threading.Thread(target=self._run, name="healthkit-glt leases", daemon=True)
        self._thread.start()

    def is_live(self, token: str) -> bool:
        with self._lock:
            return token in self._live

    def peer(self, token: str) -> str | None:
        with self._lock:
            conn = self._live.get(token)
            return conn.peer if conn is not None else None

    def _run(self) -> None:
        while not self._closing:
            pending = [c.deadline for c in self._conns.values() if c.token is None]
            timeout = max(0.0, min(pending) - time.monotonic()) if pending else None
            try:
                self._set.wait(timeout)
            except Exception:  # the set was closed: we are shutting down
                return
            now = time.monotonic()
            for conn in [c for c in self._conns.values() if c.token is None]:
                if now >= conn.deadline:
                    logger.warning("lease connection from %s: no handshake within %gs; closed",
                                   conn.peer, HANDSHAKE_TIMEOUT_S)  # fmt: skip
                    self._drop(conn)

    def _accept(self) -> None:
        while True:
            try:
                sock, addr = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # e.g. EMFILE: leave it queued, say so once per accept
                logger.warning("lease listener cannot accept: %s", e)
                return
            sock.setblocking(False)
            with contextlib.suppress(OSError):
                set_keepalive(sock, self.timeout_s)
            conn = _Conn(sock, f"{addr[0]}:{addr[1]}")
            self._conns[sock.fileno()] = conn
            self._set.add_fd(sock.fileno(), functools.partial(self._readable, conn))

    def _readable(self, conn: _Conn) -> None:
        if conn.token is not None:
            why = why_closed(conn.sock, self.timeout_s)
            if why is not None:
                self._end(conn, why)
            return
        try:
            data = conn.sock.recv(_LINE_MAX)
        except BlockingIOError:
            return
        except OSError:
            self._drop(conn)
            return
        conn.buffer += data
        if not data or len(conn.buffer) > _LINE_MAX:
            self._drop(conn)
            return
        if not conn.buffer.endswith(b"\n"):
            return
        line = conn.buffer[:-1]
        token = line[len(_MAGIC) :].decode("ascii", "replace")
        valid = (
            line.startswith(_MAGIC)
            and len(token) == _TOKEN_HEX
            and all(c in "0123456789abcdef" for c in token)
        )
        with self._lock:
            valid = valid and token not in self._live
            if valid:
                conn.token = token
                self._live[token] = conn
        if not valid:
            logger.warning("lease connection from %s: bad handshake; closed", conn.peer)
            self._drop(conn)
            return
        try:
            conn.sock.send(b"OK " + self.server_id.encode() + b"\n")
        except OSError as e:
            self._end(conn, f"its connection failed: {e.strerror or e}")

    def _drop(self, conn: _Conn) -> None:
        self._conns.pop(conn.sock.fileno(), None)
        self._set.remove_fd(conn.sock.fileno())
        conn.sock.close()

    def _end(self, conn: _Conn, why: str) -> None:
        token = conn.token
        with self._lock:
            if token is not None:
                self._live.pop(token, None)
        self._drop(conn)
        if token is not None:
            try:
                self._on_end(token, why)
            except Exception:
                logger.exception("ending the lease of %s", conn.peer)

    def close(self) -> None:
        """Stop accepting and drop every lease (their clients read end-of-file). Idempotent."""
        if self._closing:
            return
        self._closing = True
        self._set.wake()
        self._thread.join()
        for conn in list(self._conns.values()):
            self._drop(conn)
        with self._lock:
            self._live.clear()
        self._set.remove_fd(self._listener.fileno())
        self._listener.close()
        self._set.close()


class Lease:
    """The client's side of one lease: a connected socket, ``fileno()`` for a WatchSet."""

    def __init__(self, sock: socket.socket, token: str, address: str, timeout_s: float) -> None:
        self.sock = sock
        self.token = token
        self.address = address
        self.timeout_s = timeout_s
        self._why: str | None = None

    @classmethod
    def open(
        cls,
        addresses: Sequence[tuple[str, int]],
        server_id: str,
        *,
        timeout_s: float,
        connect_s: float = 10.0,
    ) -> Lease:
        """Connect to the first of ``addresses`` that answers the handshake with
        ``server_id``. Raises ``ConnectionError`` naming every address tried and why."""
        token = new_token()
        failures = []
        for host, port in addresses:
            sock = None
            try:
                sock = socket.create_connection((host, port), timeout=connect_s)
                set_keepalive(sock, timeout_s)
                sock.sendall(_MAGIC + token.encode() + b"\n")
                answer = b""
                expected = b"OK " + server_id.encode() + b"\n"
                while not answer.endswith(b"\n") and len(answer) < len(expected):
                    chunk = sock.recv(len(expected))
                    if not chunk:
                        break
                    answer += chunk
                if answer != expected:
                    raise ConnectionError(f"another server answered ({answer[:40]!r})")
                sock.setblocking(False)
                return cls(sock, token, f"{host}:{port}", timeout_s)
            except OSError as e:
                failures.append(f"{host}:{port}: {e}")
                if sock is not None:
                    sock.close()
        raise ConnectionError("no lease connection: " + "; ".join(failures))

    def fileno(self) -> int:
        return self.sock.fileno()

    def gone(self) -> str | None:
        """Why the server is gone (kept once known), or None while the lease holds."""
        if self._why is None and self.sock.fileno() >= 0:
            self._why = why_closed(self.sock, self.timeout_s)
        return self._why

    def close(self) -> None:
        self.sock.close()
