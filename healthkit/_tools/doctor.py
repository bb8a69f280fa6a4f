"""``healthkit doctor``: what this machine supports and what healthkit will use."""

from __future__ import annotations

import faulthandler
import importlib.metadata
import os
import platform
import resource
import subprocess
import sys
from typing import TextIO

import attrs

from healthkit._diagnose.evidence import KernelLog, find_memory_cgroup, format_bytes, shm_usage
from healthkit._watch.process import HAVE_PIDFD

OK, WARN, MISSING, INFO = "ok", "warn", "missing", "info"
_IMPORT_TIMEOUT_S = 120.0  # an integration imports torch: seconds, more on a loaded machine


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
    for dist, what, module in (
        ("torch", "torch", None),
        ("graphlearn-torch", "graphlearn-torch (GLT)", None),
        ("graphscope-client", "graph-learn (inside graphscope-client)", None),
        ("pipeline-healthkit-glt", "pipeline-healthkit-glt", "healthkit_glt"),
        ("pipeline-healthkit-graphlearn", "pipeline-healthkit-graphlearn", "healthkit_graphlearn"),
    ):
        try:
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out.append(Check(INFO, what, "not installed"))
            continue
        failure = _import_failure(module) if module is not None else None
        if failure is None:
            out.append(Check(INFO, what, f"{version}" + (f"; import {module} works"
                                                          if module else "")))
        else:
            out.append(Check(WARN, what, f"{version} installed, but import {module} fails: "
                             f"{failure}"))
    return out


def _import_failure(module: str) -> str | None:
    """Why ``import module`` fails, or ``None``. In a child process: an integration imports
    torch (seconds), and a broken native library can abort the interpreter that imports it."""
    code = f"import {module}"
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=_IMPORT_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return f"it did not finish within {_IMPORT_TIMEOUT_S:g} s"
    if proc.returncode == 0:
        return None
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    last = lines[-1].strip() if lines else f"exit status {proc.returncode}"
    return last[:500]


def report(out: TextIO, *, strict: bool = False, **roots: str) -> int:
    """Print one line per check and a summary. Exit status: 1 when something healthkit
    needs is missing, or (``strict``) on any warning; else 0. A warning means less evidence
    (no kernel log as non-root, a small /dev/shm), not a broken watchdog, so by default it
    does not fail a pre-flight script; ``--strict`` makes it."""
    results = checks(**roots)
    width = max(len(c.topic) for c in results)
    for c in results:
        out.write(f"[{c.verdict:^7}] {c.topic:<{width}}  {c.detail}\n")
    missing = [c.topic for c in results if c.verdict == MISSING]
    warned = [c.topic for c in results if c.verdict == WARN]
    if missing:
        out.write(f"missing: {', '.join(missing)}: healthkit cannot work here (exit 1)\n")
        return 1
    if warned:
        out.write(f"{len(warned)} warning{'s' if len(warned) > 1 else ''} "
                  f"({', '.join(warned)}): the core works; each line says what is "
                  "lacking"
                  + (" (exit 1: --strict)\n" if strict else "\n"))
        return 1 if strict else 0
    out.write("all ok\n")
    return 0
