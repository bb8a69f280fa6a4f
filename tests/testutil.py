"""Small helpers shared by every test tier (tests/ is on ``sys.path`` under pytest; modules
also imported by scripts and benchmarks put it there themselves). Process listings come from
the core itself: ``healthkit.lowlevel.children`` and ``descendants``."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago (the usual bind-to-0 race applies)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
