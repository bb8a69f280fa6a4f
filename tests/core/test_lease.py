"""Leases (``healthkit.lowlevel.LeaseServer`` and ``Lease``), with real processes and real
sockets: a peer that ends, however it ends, ends its leases on both sides at once; a peer
that is alive but stopped keeps them (its kernel answers the keepalive probes); a lost
network ends them within ``connection_timeout`` (a private network namespace whose loopback
is taken down, where ``unshare`` is allowed); the handshake refuses what is not a lease
and a server that is not the one named."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from testutil import netns_available

from healthkit._watch import lease as lease_module
from healthkit._watch.lease import CLOSED, keepalive_plan, set_keepalive
from healthkit.lowlevel import Lease, LeaseServer

PEER = Path(__file__).with_name("lease_peer.py")
TIMEOUT_S = 2.0  # connection_timeout everywhere here: the least the keepalive allows


class Ends:
    """A server's ``on_end``: what ended, why and when, on the server's thread."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, float]] = []
        self.event = threading.Event()

    def __call__(self, token: str, why: str) -> None:
        self.seen.append((token, why, time.monotonic()))
        self.event.set()

    def wait(self, timeout: float) -> tuple[str, str, float]:
        assert self.event.wait(timeout), "no lease ended"
        return self.seen[0]


@pytest.fixture
def server() -> Iterator[tuple[LeaseServer, Ends]]:
    ends = Ends()
    with LeaseServer(ends, connection_timeout=TIMEOUT_S, bind_host="127.0.0.1") as s:
        yield s, ends


class Peer:
    """``lease_peer.py`` in its own process: a server of its own and a lease on ours."""

    def __init__(self, server: LeaseServer) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(PEER), str(server.port), server.server_id],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        hello = self.line(60)
        self.port: int = hello["port"]
        self.server_id: str = hello["server_id"]
        self.token: str = hello["token"]

    def line(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        assert ready, f"the peer said nothing within {timeout}s"
        text = self.proc.stdout.readline()
        assert text, f"the peer ended (exit {self.proc.wait(10)})"
        return dict(json.loads(text))

    def tell(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def end(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(30)
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                f.close()


@pytest.fixture
def peer(server: tuple[LeaseServer, Ends]) -> Iterator[Peer]:
    p = Peer(server[0])
    try:
        yield p
    finally:
        p.end()


def _gone_within(lease: Lease, seconds: float) -> tuple[str | None, float]:
    """``lease.gone()`` once it says something, and when, waiting on its fd as a user's
    WatchSet would (bounded)."""
    deadline = time.monotonic() + seconds
    while (why := lease.gone()) is None and time.monotonic() < deadline:
        select.select([lease], [], [], max(0.0, deadline - time.monotonic()))
    return why, time.monotonic()


@pytest.mark.timeout(60)
def test_a_peer_stopped_keeps_both_leases_and_its_sigkill_ends_both_at_once(
    server: tuple[LeaseServer, Ends], peer: Peer
) -> None:
    """The peer holds a lease on our server and we hold one on its server. Stopped
    (SIGSTOP) for over twice the 2 s connection timeout, it keeps both: its kernel answers
    the keepalive probes, and slowness is never a loss. SIGKILLed, its kernel closes its
    sockets: both leases end within a second, each side saying why."""
    s, ends = server
    with Lease.open([("127.0.0.1", peer.port)], peer.server_id,
                    connection_timeout=TIMEOUT_S) as mine:  # fmt: skip
        assert s.is_live(peer.token) and mine.gone() is None
        assert (s.peer(peer.token) or "").startswith("127.0.0.1:"), s.peer(peer.token)
        os.kill(peer.proc.pid, signal.SIGSTOP)
        try:
            time.sleep(2.2 * TIMEOUT_S)  # the keepalive would have ended a lost peer's by now
            assert s.is_live(peer.token) and ends.seen == [], "a stopped peer lost its lease"
            assert mine.gone() is None, "a stopped server lost our lease"
        finally:
            os.kill(peer.proc.pid, signal.SIGCONT)
        time.sleep(0.2)
        assert s.is_live(peer.token) and ends.seen == [] and mine.gone() is None
        peer.proc.kill()
        killed = time.monotonic()
        token, why, at = ends.wait(10)
        assert (token, why) == (peer.token, CLOSED)
        assert at - killed < 1.0, at - killed
        assert not s.is_live(peer.token) and s.peer(peer.token) is None
        why_mine, at_mine = _gone_within(mine, 10)
        assert why_mine == CLOSED
        assert at_mine - killed < 1.0, at_mine - killed
        assert mine.gone() == CLOSED  # kept once known
        assert len(ends.seen) == 1


@pytest.mark.timeout(60)
def test_a_clean_close_and_a_clean_exit_end_the_leases_as_ends_not_losses(
    server: tuple[LeaseServer, Ends], peer: Peer
) -> None:
    """The twin of the kill: a peer that closes its lease, or exits 0, ends it the same way
    (the server cannot tell a close from a death, and either means the client is gone);
    neither is reported as a lost machine. Until then, an idle live peer ends nothing."""
    _, ends = server
    with Lease.open([("127.0.0.1", peer.port)], peer.server_id,
                    connection_timeout=TIMEOUT_S) as mine:  # fmt: skip
        time.sleep(0.3)
        assert ends.seen == [] and mine.gone() is None
        peer.tell("close")
        assert peer.line(30) == {"closed": True}
        token, why, _ = ends.wait(10)
        assert (token, why) == (peer.token, CLOSED)
        assert mine.gone() is None  # its server lives on: only the closed lease ended
        peer.tell("exit")
        assert peer.proc.wait(30) == 0
        why_mine, _ = _gone_within(mine, 10)
        assert why_mine == CLOSED and "keepalive" not in why_mine
    assert len(ends.seen) == 1


@pytest.mark.timeout(30)
def test_closing_the_server_ends_its_clients_leases_without_calling_on_end() -> None:
    ends = Ends()
    s = LeaseServer(ends, connection_timeout=TIMEOUT_S, bind_host="127.0.0.1")
    with Lease.open([("127.0.0.1", s.port)], s.server_id, connection_timeout=TIMEOUT_S) as a:
        assert s.is_live(a.token) and a.gone() is None
        s.close()
        s.close()  # idempotent
        assert _gone_within(a, 10)[0] == CLOSED
    time.sleep(0.1)
    assert ends.seen == []


@pytest.mark.timeout(30)
def test_a_client_takes_no_lease_on_another_server_at_an_address_it_tried() -> None:
    """A client that tries several addresses of its server (another server listens on the
    same port on the client's own machine) goes on to the next when the server id is not
    the one named; with none left, ConnectionError names every address and why."""
    other_ends, ends = Ends(), Ends()
    with (
        LeaseServer(other_ends, connection_timeout=TIMEOUT_S, bind_host="127.0.0.1") as other,
        LeaseServer(ends, connection_timeout=TIMEOUT_S, bind_host="127.0.0.1") as mine,
    ):
        addresses = [("127.0.0.1", other.port), ("127.0.0.1", mine.port)]
        with Lease.open(addresses, mine.server_id, connection_timeout=TIMEOUT_S) as lease:
            assert lease.address == f"127.0.0.1:{mine.port}"
            assert mine.is_live(lease.token) and lease.gone() is None
            # the other server saw a handshake, then the client leave at once
            assert other_ends.wait(10)[1] == CLOSED and not other.is_live(lease.token)
        with pytest.raises(ConnectionError, match="another server answered") as info:
            Lease.open([("127.0.0.1", other.port)], mine.server_id, connection_timeout=TIMEOUT_S)
        assert f"127.0.0.1:{other.port}" in str(info.value)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            closed_port = s.getsockname()[1]  # bound, not listening: refused
            with pytest.raises(ConnectionError, match=f"127.0.0.1:{closed_port}"):
                Lease.open([("127.0.0.1", closed_port)], mine.server_id,
                           connection_timeout=TIMEOUT_S)  # fmt: skip


def _raw(port: int, data: bytes) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    if data:
        s.sendall(data)
    return s


def _closed_by_server(s: socket.socket, within: float) -> bool:
    """End-of-file, or a reset (closed with what we sent still unread), within ``within``."""
    s.settimeout(within)
    try:
        return s.recv(100) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "line",
    [
        b"GET / HTTP/1.0\r\n\r\n",
        b"HKGLT1 " + b"a" * 32 + b"\n",  # the old magic: not this protocol any more
        b"HKLEASE1 " + b"A" * 32 + b"\n",  # a token is lowercase hex
        b"HKLEASE1 " + b"a" * 31 + b"\n",
        b"HKLEASE1 " + b"a" * 200,  # too long, never ends
    ],
    ids=["http", "old-magic", "upper", "short", "long"],
)
def test_a_bad_handshake_is_closed_by_the_server_and_registers_nothing(
    server: tuple[LeaseServer, Ends], line: bytes
) -> None:
    s, ends = server
    with _raw(s.port, line) as c:
        assert _closed_by_server(c, 5)
    assert ends.seen == [] and not s.is_live("a" * 32)
    # the server is still serving
    with Lease.open([("127.0.0.1", s.port)], s.server_id, connection_timeout=TIMEOUT_S) as ok:
        assert s.is_live(ok.token)


@pytest.mark.timeout(60)
def test_a_token_already_live_is_refused_and_the_holder_keeps_its_lease(
    server: tuple[LeaseServer, Ends],
) -> None:
    s, ends = server
    with Lease.open([("127.0.0.1", s.port)], s.server_id, connection_timeout=TIMEOUT_S) as a:
        with _raw(s.port, lease_module.MAGIC + a.token.encode() + b"\n") as c:
            assert _closed_by_server(c, 5)
        assert s.is_live(a.token) and a.gone() is None and ends.seen == []


@pytest.mark.timeout(60)
def test_a_handshake_must_complete_within_its_bound_and_a_slow_one_inside_it_is_taken(
    server: tuple[LeaseServer, Ends], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing sent, or half a line: closed at the handshake bound (1 s here, 10 s by
    default). The twin: the line in two pieces, the second 0.3 s later, is a lease."""
    s, ends = server
    monkeypatch.setattr(lease_module, "HANDSHAKE_TIMEOUT_S", 1.0)
    for data in (b"", b"HKLEASE1 " + b"b" * 10):
        started = time.monotonic()
        with _raw(s.port, data) as c:
            assert _closed_by_server(c, 10)
        assert 0.8 < time.monotonic() - started < 5.0
    token = "c" * 32
    with _raw(s.port, b"HKLEASE1 " + token[:16].encode()) as c:
        time.sleep(0.3)
        c.sendall(token[16:].encode() + b"\n")
        c.settimeout(5)
        assert c.recv(100) == b"OK " + s.server_id.encode() + b"\n"
        time.sleep(1.5)  # past the handshake bound: a lease is not dropped for it
        assert s.is_live(token)
    assert ends.wait(10)[:2] == (token, CLOSED)


@pytest.mark.timeout(30)
def test_the_keepalive_plan_adds_up_to_the_connection_timeout() -> None:
    """A lost machine cannot be made on one machine's loopback; the arithmetic can be
    checked: idle half of the bound, then probes every tenth until it is used up, so the
    kernel ends the connection at the bound after the peer's last answer."""
    for timeout in (2, 2.5, 3, 4, 7, 10, 30, 60, 180, 3600):
        idle, interval, count = keepalive_plan(timeout)
        assert idle == max(1, int(timeout // 2)) and interval >= 1 and count >= 1
        assert timeout - interval < idle + interval * count <= timeout, timeout
    assert keepalive_plan(10) == (5, 1, 5)
    assert keepalive_plan(2) == (1, 1, 1)
    with socket.socket() as s:
        set_keepalive(s, 10.0)
        get = s.getsockopt
        assert get(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert (
            get(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
            get(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
            get(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
        ) == (5, 1, 5)
        assert get(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 10_000


# A server and a client in one process of a private network namespace; its loopback is then
# taken down: no FIN, no RST, only silence, as when a machine or its network is gone.
LOST_NETWORK = """
import json, subprocess, threading, time
from healthkit.lowlevel import Lease, LeaseServer
ended = []
server = LeaseServer(lambda t, why: ended.append((why, time.monotonic())),
                     connection_timeout=TIMEOUT, bind_host="127.0.0.1")
lease = Lease.open([("127.0.0.1", server.port)], server.server_id, connection_timeout=TIMEOUT)
time.sleep(1.5 * TIMEOUT)  # idle and alive: the probes are answered
out = {"idle_alive": lease.gone() is None and not ended}
subprocess.run(["ip", "link", "set", "lo", "down"], check=True)
lost = time.monotonic()
deadline = lost + 4 * TIMEOUT + 5
while (lease.gone() is None or not ended) and time.monotonic() < deadline:
    time.sleep(0.02)
out["client"] = lease.gone()
out["client_after_s"] = time.monotonic() - lost
out["server"] = ended[0][0] if ended else None
out["server_after_s"] = ended[0][1] - lost if ended else None
lease.close()
server.close()
print(json.dumps(out))
"""


@pytest.mark.timeout(60)
def test_a_lost_network_ends_both_sides_within_the_connection_timeout() -> None:
    """The twin of the stopped peer: silence from the peer's kernel too is a loss, told
    by both sides within the bound they state (2 s here: silent 1-2 s before)."""
    if (why := netns_available()) is not None:
        pytest.skip(f"cannot make a private network namespace here: {why}")
    code = LOST_NETWORK.replace("TIMEOUT", repr(TIMEOUT_S))
    r = subprocess.run(
        ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "netns",
         sys.executable, "-c", code],
        capture_output=True, text=True, timeout=50,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-4000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["idle_alive"] is True, out
    expected = (
        f"it stopped answering TCP keepalive probes: nothing came from it for {TIMEOUT_S:g}s "
        f"(connection_timeout), so it went silent {TIMEOUT_S / 2:g}-{TIMEOUT_S:g}s before this"
    )
    for side in ("client", "server"):
        assert out[side] is not None and out[side].startswith(expected), out
        assert out[f"{side}_after_s"] < TIMEOUT_S + 3.0, out  # the bound, and scheduling
