"""Small helpers shared by every test tier (tests/ is on ``sys.path`` under pytest; modules
also imported by scripts and benchmarks put it there themselves). Process listings come from
the core itself: ``healthkit.lowlevel.children`` and ``descendants``."""

from __future__ import annotations

import contextlib
import os
import random
import re
import socket
import stat
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the checkout


def ephemeral_ports() -> tuple[int, int]:
    """The kernel's range for ``bind(("", 0))`` and ``connect()`` (Linux default 32768-60999)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(v) for v in f.read().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` a moment ago, taken below the kernel's ephemeral range.

    Whoever binds it does so seconds later. A port from ``bind(0)`` is in the ephemeral range,
    where every torch RPC agent opens a score of listeners with ``bind(0)`` (TensorPipe) and
    every ``connect()`` takes its local port: in a server-client scenario's own network
    namespace, one of the job's own listeners took a sampling worker's rendezvous port first
    (EADDRINUSE, the worker died, its client never came up). Below the range only another
    explicit pick can collide: random, and checked by a bind here. Falls back to ``bind(0)``
    when the range starts too low."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    low, _ = ephemeral_ports()
    rng = random.SystemRandom()
    for _ in range(100):
        port = rng.randrange(10000, low) if low > 11000 else 0  # no room below: the kernel's
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue  # in use: another pick
            return int(s.getsockname()[1])
    raise OSError(f"no free TCP port on {host} below {low} after 100 tries")


def portable_paths(text: str) -> str:
    """``text`` (a stack dump, a log, a saved result) with this machine's paths made generic:
    the checkout's own files relative to it, installed packages under ``<site-packages>/`` and
    the standard library under ``<stdlib>/``, so a saved result names no machine's layout."""
    text = re.sub(r"[^\s\"']*/site-packages/", "<site-packages>/", text)
    text = text.replace(sysconfig.get_paths()["stdlib"] + "/", "<stdlib>/")
    return text.replace(f"{ROOT}/", "")


class NoMemoryCgroup(Exception):
    """Why this machine cannot give a test a memory cgroup of its own (the test skips)."""


def memory_cgroup(limit: int, tag: str) -> str:
    """A v1 child memory cgroup under ours limited to ``limit`` bytes (swap included), where
    a test's process can be OOM-killed for real; raises :class:`NoMemoryCgroup` saying why
    not (not root, cgroup v2 without delegation, a read-only hierarchy). Remove it with
    :func:`remove_cgroup`."""
    from healthkit.lowlevel import find_memory_cgroup

    if os.geteuid() != 0:
        raise NoMemoryCgroup("a real OOM kill needs root to create a memory cgroup")
    parent = find_memory_cgroup()
    if parent is None:
        raise NoMemoryCgroup("no memory cgroup found from /proc/self/cgroup")
    if parent.version != 1:
        raise NoMemoryCgroup(
            "cgroup v2: a child cgroup with its own memory.max needs the memory controller "
            "delegated (subtree_control) to a parent without processes; not set up here"
        )
    path = os.path.join(parent.path, f"healthkit-test-{tag}-{os.getpid()}")
    try:
        os.mkdir(path)
        for name in ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes"):
            if os.path.exists(os.path.join(path, name)):
                with open(os.path.join(path, name), "w") as f:
                    f.write(str(limit))
    except OSError as e:
        try:
            os.rmdir(path)
        except OSError:
            pass
        why = f"cannot make a memory cgroup with a limit under {parent.path}: {e}"
        raise NoMemoryCgroup(why) from e
    return path


def memory_cgroup_or_skip(limit: int, tag: str) -> str:
    """:func:`memory_cgroup`, or skip the calling test with the reason."""
    import pytest

    try:
        return memory_cgroup(limit, tag)
    except NoMemoryCgroup as e:
        pytest.skip(str(e))


def kernel_log_unusable() -> str | None:
    """Why the kernel log cannot confirm this machine's OOM kills, or None when it can."""
    try:
        os.close(os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK))
    except OSError as e:
        return f"/dev/kmsg is not readable here ({e}): the kernel log cannot confirm an OOM kill"
    with open("/proc/self/status") as f:
        if any(line.startswith("NSpid:") and len(line.split()) > 2 for line in f):
            return "in a nested pid namespace the kernel log names pids from another one"
    return None


def remove_cgroup(path: str) -> None:
    """Remove a test's child cgroup, waiting (10 s at most) while the kernel still tears a
    killed task in it down (EBUSY)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


# torch's DataLoader, when a receive from its workers raises, opens ten NamedTemporaryFiles to
# tell "too many open files" from the rest (``_try_get_data``). torch's own SIGCHLD handler
# raises from wherever the main thread is; when a worker's death lands right after one of
# those ``open()`` calls returns, inside tempfile's ``_mkstemp_inner``, the fd is open and no
# object owns it: it stays open, and its file (``tmp`` + 8 characters, tempfile's default
# name, which healthkit never uses) stays too. Measured: 1 in 20 to 30 runs of the crash tests
# under load, on torch 2.3 and 2.13. torch's leak, not the test's: closed and removed here.
_TORCH_PROBE = re.compile(re.escape(tempfile.gettempdir()) + r"/tmp[a-z0-9_]{8}")


def close_interrupted_torch_probes(fds: set[int]) -> set[int]:
    """Close (and remove the file of) each of ``fds`` that is such a probe; return them."""
    if "torch.utils.data.dataloader" not in sys.modules:
        return set()
    closed = set()
    for fd in fds:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
            st = os.fstat(fd)
        except OSError:
            continue
        if _TORCH_PROBE.fullmatch(target) and stat.S_ISREG(st.st_mode) and st.st_size == 0:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(target)
            closed.add(fd)
    return closed


def netns_available() -> str | None:
    """None if a private network namespace (its loopback up) can be made here, else why not:
    a lost network is simulated by taking that loopback down."""
    import shutil
    import subprocess

    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "unshare or ip is not installed"
    try:
        r = subprocess.run(["unshare", "--net", "sh", "-c", "ip link set lo up"],
                           capture_output=True, text=True, timeout=30)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    return None if r.returncode == 0 else (r.stderr.strip() or f"exit {r.returncode}")
