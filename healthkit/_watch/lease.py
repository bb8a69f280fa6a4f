"""Leases: one TCP connection per client/server pair that tells each side, within
milliseconds, that the other process ended (however it ended), and within
``connection_timeout`` that its machine or the network is lost; never that it is slow.

Why a connection of its own next to an RPC layer: RPC layers tell nobody that a peer died.
A server whose client died keeps that client's work running for good, and a client learns
of a dead server only from the calls it has in flight (and of a lost machine only after the
call's timeout, minutes by default). A plain TCP connection does both:

- a process that ends, however (SIGKILL, OOM, crash, exit), has its sockets closed by its
  kernel, so the peer reads end-of-file within milliseconds;
- a machine or network that is gone stops answering TCP keepalive probes, which both
  kernels send on an idle connection (:func:`set_keepalive`); the connection then fails
  with ``ETIMEDOUT`` ``connection_timeout`` seconds after the peer's last answer to a
  probe, which a live idle peer gives every half of it: between half of
  ``connection_timeout`` and all of it after the loss.

Neither needs the peer's Python to run: a peer that is alive but busy (its GIL held for
minutes, stopped in a debugger, swapping) keeps its lease, because its kernel answers the
probes. Only an end or a loss ends a lease, never slowness.

The protocol is one line each way: the client sends ``HKLEASE1 <token>\\n`` (a random token
it may then name in its own calls), the server answers ``OK <server id>\\n`` with its random
id, which the client learnt beforehand (from a hello call, a file, a store), so a client
that tried several of the server's addresses never holds a lease on another server that
happens to listen on the same port elsewhere. Nothing else is ever sent; the server closes
a connection that does not complete the handshake within :data:`HANDSHAKE_TIMEOUT_S` or
sends anything else.
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

from healthkit._errors import (
    InvalidArgumentError,
    InvalidArgumentTypeError,
    check_bound,
    check_callable,
    check_timeout,
)
from healthkit._watch.process import WatchSet

__all__ = ["DEFAULT_CONNECTION_TIMEOUT_S", "Lease", "LeaseServer"]

logger = logging.getLogger("healthkit")

DEFAULT_CONNECTION_TIMEOUT_S = 10.0
MIN_CONNECTION_TIMEOUT_S = 2.0  # keepalive counts whole seconds: 1 s idle, then 1 probe
HANDSHAKE_TIMEOUT_S = 10.0
MAGIC = b"HKLEASE1 "
_TOKEN_HEX = 32
_LINE_MAX = len(MAGIC) + _TOKEN_HEX + 1
_HEX = frozenset("0123456789abcdef")


def new_token() -> str:
    """A random lease token or server id: 32 lowercase hex digits."""
    return secrets.token_hex(_TOKEN_HEX // 2)


def _is_token(value: str) -> bool:
    return len(value) == _TOKEN_HEX and set(value) <= _HEX


def check_connection_timeout(value: object, what: str = "connection_timeout") -> float:
    """A finite number of seconds >= 2: the keepalive counts whole seconds, half idle."""
    seconds = check_timeout(value, what, allow_none=False, positive=True)  # type: ignore[arg-type]
    assert seconds is not None
    if seconds < MIN_CONNECTION_TIMEOUT_S:
        raise InvalidArgumentError(
            f"{what} must be >= {MIN_CONNECTION_TIMEOUT_S:g} seconds, got {value!r}: TCP "
            "keepalive counts in whole seconds (idle half of it, then probes); pass 2 or more",
            what,
        )
    return seconds


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


CLOSED = "its connection was closed (its process ended, or closed it)"


def why_closed(sock: socket.socket, timeout_s: float) -> str | None:
    """Why the peer of ``sock`` (non-blocking) is gone, or None while it is there.

    Reads and drops whatever arrived (nothing should): the connection's only message after
    the handshake is its end.
    """
    try:
        while True:
            data = sock.recv(4096)
            if not data:
                return CLOSED
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
    """The server's side of leases: a listening socket (``port``, ``server_id``) and one
    thread that waits, in one :class:`healthkit.WatchSet`, on it and on every lease.

    ``on_end(token, why)`` runs on that thread when a client's lease ends: its process
    ended or it closed the lease (``why`` says the connection was closed; the two look
    the same from here), or its machine or network was lost for ``connection_timeout``
    seconds (``why`` says so, with the bound). Keep it short: hand long work to another
    thread. A client that is alive but busy or stopped keeps its lease. ``bind_host``:
    the interface to listen on (``""``: all). :meth:`close` drops every lease without
    calling ``on_end``; the clients read end-of-file.
    """

    def __init__(
        self,
        on_end: Callable[[str, str], object],
        *,
        connection_timeout: float = DEFAULT_CONNECTION_TIMEOUT_S,
        bind_host: str = "",
    ) -> None:
        check_callable(on_end, "on_end")
        self.connection_timeout = check_connection_timeout(connection_timeout)
        if not isinstance(bind_host, str):
            raise InvalidArgumentTypeError(
                f"bind_host must be an address to bind (str; '' for all), got {bind_host!r}",
                "bind_host",
            )
        self._on_end = on_end
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
        self._thread = threading.Thread(target=self._run, name="healthkit leases", daemon=True)
        self._thread.start()

    def is_live(self, token: str) -> bool:
        """Whether the client that named ``token`` holds its lease now."""
        with self._lock:
            return token in self._live

    def peer(self, token: str) -> str | None:
        """``host:port`` of the client holding lease ``token``, or None."""
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
                set_keepalive(sock, self.connection_timeout)
            conn = _Conn(sock, f"{addr[0]}:{addr[1]}")
            self._conns[sock.fileno()] = conn
            self._set.add_fd(sock.fileno(), functools.partial(self._readable, conn))
            # The wait goes on after a callback: have it return, so that the loop bounds
            # it by this handshake's deadline (otherwise a silent connection stays open).
            self._set.wake()

    def _readable(self, conn: _Conn) -> None:
        if conn.token is not None:
            why = why_closed(conn.sock, self.connection_timeout)
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
        token = line[len(MAGIC) :].decode("ascii", "replace")
        valid = line.startswith(MAGIC) and _is_token(token)
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
        """Stop accepting and drop every lease (their clients read end-of-file), without
        calling ``on_end``. Idempotent."""
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

    def __enter__(self) -> LeaseServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_addresses(addresses: object) -> list[tuple[str, int]]:
    what = "addresses"
    if isinstance(addresses, (str, bytes)) or not isinstance(addresses, Sequence):
        raise InvalidArgumentTypeError(
            f"{what} must be a list of (host, port) pairs, got {addresses!r}", what
        )
    out = []
    for a in addresses:
        ok = isinstance(a, (tuple, list)) and len(a) == 2
        if not (ok and isinstance(a[0], str) and isinstance(a[1], int)
                and not isinstance(a[1], bool)):  # fmt: skip
            raise InvalidArgumentTypeError(
                f"{what} must be a list of (host, port) pairs (str, int), got {a!r} in it", what
            )
        if not 0 < a[1] < 65536:
            raise InvalidArgumentError(f"{what}: port {a[1]} of {a[0]!r} is not in 1..65535", what)
        out.append((a[0], a[1]))
    if not out:
        raise InvalidArgumentError(
            f"{what} is empty: pass the server's (host, port) pairs, its LeaseServer's port on "
            "each address this client may reach it at",
            what,
        )
    return out


class Lease:
    """The client's side of one lease, made by :meth:`open`: a connected socket, with
    ``fileno()`` for a :class:`healthkit.WatchSet` (readable when the lease ends) and
    :meth:`gone`, which says why. ``token`` is the random name the server knows it by."""

    def __init__(
        self, sock: socket.socket, token: str, address: str, connection_timeout: float
    ) -> None:
        self.sock = sock
        self.token = token
        self.address = address
        self.connection_timeout = connection_timeout
        self._why: str | None = None

    @classmethod
    def open(
        cls,
        addresses: Sequence[tuple[str, int]],
        server_id: str,
        *,
        connection_timeout: float = DEFAULT_CONNECTION_TIMEOUT_S,
        connect_timeout: float = 10.0,
    ) -> Lease:
        """Take a lease on the :class:`LeaseServer` whose ``server_id`` is given, at the
        first of ``addresses`` that answers the handshake with that id (each connection
        and handshake bounded by ``connect_timeout``). Raises ``ConnectionError`` naming
        every address tried and why."""
        targets = _check_addresses(addresses)
        if not isinstance(server_id, str):
            raise InvalidArgumentTypeError(
                f"server_id must be a str (the LeaseServer's server_id), got {server_id!r}",
                "server_id",
            )
        if not _is_token(server_id):
            raise InvalidArgumentError(
                f"server_id must be the LeaseServer's server_id (32 lowercase hex digits), "
                f"got {server_id!r}",
                "server_id",
            )
        timeout_s = check_connection_timeout(connection_timeout)
        connect_s = check_bound(connect_timeout, "connect_timeout")
        token = new_token()
        expected = b"OK " + server_id.encode() + b"\n"
        failures = []
        for host, port in targets:
            sock = None
            try:
                sock = socket.create_connection((host, port), timeout=connect_s)
                set_keepalive(sock, timeout_s)
                sock.sendall(MAGIC + token.encode() + b"\n")
                answer = b""
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
            self._why = why_closed(self.sock, self.connection_timeout)
        return self._why

    def close(self) -> None:
        """End the lease: the server's ``on_end`` runs for it. Idempotent."""
        self.sock.close()

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

