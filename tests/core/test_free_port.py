"""The tests' port picker: a port no ``bind(0)`` or ``connect()`` can take before its user
binds it (torch RPC opens a score of ``bind(0)`` listeners per process; one of them once took
a sampling worker's rendezvous port, and its client never came up)."""

from __future__ import annotations

import socket

from testutil import ephemeral_ports, free_port


def test_a_picked_port_is_below_the_ephemeral_range_and_free() -> None:
    low, high = ephemeral_ports()
    assert 1024 <= low < high <= 65535
    ports = {free_port() for _ in range(20)}
    assert all(10000 <= p < low for p in ports), sorted(ports)
    assert len(ports) > 1  # random picks, not one port for every caller
    for host in ("127.0.0.1", "0.0.0.0"):
        port = free_port(host)
        with socket.socket() as s:
            s.bind((host, port))  # free: its user can bind it


def test_the_kernel_hands_out_only_ephemeral_ports_for_bind_0() -> None:
    """The twin that makes the rule worth having: what torch's listeners get is in the
    range, so it never meets a port picked below it."""
    low, high = ephemeral_ports()
    socks = [socket.socket() for _ in range(50)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
            assert low <= s.getsockname()[1] <= high
    finally:
        for s in socks:
            s.close()
