"""Small helpers shared by every test tier (tests/ is on ``sys.path`` under pytest; modules
also imported by scripts and benchmarks put it there themselves). Process listings come from
the core itself: ``healthkit.lowlevel.children`` and ``descendants``."""

from __future__ import annotations

import re
import socket
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the checkout


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago (the usual bind-to-0 race applies)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def portable_paths(text: str) -> str:
    """``text`` (a stack dump, a log, a saved result) with this machine's paths made generic:
    the checkout's own files relative to it, installed packages under ``<site-packages>/`` and
    the standard library under ``<stdlib>/``, so a saved result names no machine's layout."""
    text = re.sub(r"[^\s\"']*/site-packages/", "<site-packages>/", text)
    text = text.replace(sysconfig.get_paths()["stdlib"] + "/", "<stdlib>/")
    return text.replace(f"{ROOT}/", "")
