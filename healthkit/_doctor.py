"""``healthkit doctor``: what this machine supports and what healthkit will use."""

from __future__ import annotations

import faulthandler
import importlib.metadata
import os
import platform
import resource
from typing import TextIO

import attrs

from healthkit._evidence import KernelLog, find_memory_cgroup, format_bytes, shm_usage
from healthkit._watch import HAVE_PIDFD

OK, WARN, MISSING, INFO = "ok", "warn", "missing", "info"


@attrs.frozen
class Check:
    verdict: str
    topic: str
    detail: str


def _pidfd() -> Check:
    if not HAVE_PIDFD:
        return Check(WARN, "pidfd", "not available (Linux < 5.3 or Python < 3.9): only "
                     "multiprocessing.Process can be watched, through its sentinel")
    try:
        fd = os.pidfd_open(os.getpid())
    except OSError as e:
        return Check(WARN, "pidfd", f"pidfd_open fails ({e.strerror}): only "
                     "multiprocessing.Process can be watched, through its sentinel")
    os.close(fd)
    return Check(OK, "pidfd", f"pidfd_open works (kernel {platform.release()}): deaths are "
                 "seen within milliseconds, for children and non-children")


def checks(
    *,
    proc_root: str = "/proc",
    cgroup_root: str = "/sys/fs/cgroup",
    kmsg_path: str = "/dev/kmsg",
    shm_path: str = "/dev/shm",
) -> list[Check]:
    out = [_pidfd()]
    cg = find_memory_cgroup(proc_root=proc_root, cgroup_root=cgroup_root)
    if cg is None:
        out.append(Check(WARN, "memory cgroup", "no memory cgroup found: OOM kills can only be "
                         "confirmed from the kernel log"))
    else:
        kills = cg.oom_kills()
        if kills is None:
            out.append(Check(WARN, "memory cgroup",
                             f"v{cg.version} at {cg.path}, but {cg.counter_file} has no "
                             "oom_kill counter (kernel < 4.13?)"))
        else:
            out.append(Check(OK, "memory cgroup",
                             f"v{cg.version} at {cg.path}: {cg.counter_file} oom_kill = {kills}"))
        peak, limit = cg.peak_bytes(), cg.limit_bytes()
        out.append(Check(
            OK if peak is not None else WARN,
            "memory peak",
            (f"cgroup peak {format_bytes(peak)}" if peak is not None else "peak not readable")
            + (f", limit {format_bytes(limit)}" if limit is not None else ", no limit"),
        ))
    last = KernelLog(kmsg_path).last_seq()
    if last is None:
        out.append(Check(WARN, "kernel log", f"{kmsg_path} not readable: OOM kills are confirmed "
                         "only by the cgroup counter (run as root or lower dmesg_restrict)"))
    elif last < 0:
        out.append(Check(WARN, "kernel log", f"{kmsg_path} holds no kernel log records (read "
                         "up to a bounded size): OOM kills are confirmed only by the cgroup "
                         "counter"))
    else:
        out.append(Check(OK, "kernel log", f"{kmsg_path} readable: an OOM kill naming the pid "
                         "confirms the cause"))
    out.append(Check(OK if faulthandler else MISSING, "faulthandler",
                     "available: stuck workers' stacks can be dumped"))
    shm = shm_usage(shm_path)
    if shm is None:
        out.append(Check(WARN, "/dev/shm", f"{shm_path} not found"))
    else:
        small = shm.total_bytes < 1 << 30
        out.append(Check(
            WARN if small else OK,
            "/dev/shm",
            f"{format_bytes(shm.free_bytes)} free of {format_bytes(shm.total_bytes)}"
            + ("; small: workers passing tensors may die of SIGBUS (raise --shm-size)"
               if small else ""),
        ))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    out.append(Check(
        OK if soft >= 4096 else WARN,
        "open files",
        f"RLIMIT_NOFILE {soft} (hard {hard}); each watch holds one fd"
        + ("; raise it to watch more than a few hundred processes" if soft < 4096 else ""),
    ))
    for dist, what in (
        ("torch", "torch"),
        ("graphlearn-torch", "graphlearn-torch (GLT)"),
        ("graphscope-client", "graph-learn (inside graphscope-client)"),
        ("pipeline-healthkit-glt", "pipeline-healthkit-glt"),
        ("pipeline-healthkit-graphlearn", "pipeline-healthkit-graphlearn"),
    ):
        try:
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out.append(Check(INFO, what, "not installed"))
        else:
            out.append(Check(INFO, what, f"{version}"))
    return out


def report(out: TextIO, **roots: str) -> int:
    """Print one line per check; exit status 0 unless something healthkit needs is missing."""
    results = checks(**roots)
    width = max(len(c.topic) for c in results)
    for c in results:
        out.write(f"[{c.verdict:^7}] {c.topic:<{width}}  {c.detail}\n")
    return 1 if any(c.verdict == MISSING for c in results) else 0
