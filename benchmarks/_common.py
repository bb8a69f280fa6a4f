"""Shared helpers for the benchmarks: statistics, formatting, machine description, process
helpers, and the context a section renders its part of the page in.

Every timestamp is ``time.monotonic_ns()`` (CLOCK_MONOTONIC), which is one clock for every
process on the machine, so a time taken in one process can be subtracted from a time taken
in another.
"""

from __future__ import annotations

import contextlib
import os
import platform
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TESTS_SCRIPTS = ROOT / "tests" / "scripts"
if str(ROOT / "tests") not in sys.path:  # the test suite's shared helpers (free_port)
    sys.path.append(str(ROOT / "tests"))
from testutil import free_port as free_port  # noqa: E402
from testutil import portable_paths as portable_paths  # noqa: E402

SLEEP = "/bin/sleep" if os.path.exists("/bin/sleep") else "sleep"


def tree_cpu_s() -> float:
    """User + system CPU seconds, every thread, of this process and every process below it
    (the sampling workers and whatever they started), from ``/proc/<pid>/stat``."""
    from healthkit.lowlevel import descendants

    total = 0
    for pid in (os.getpid(), *descendants(os.getpid())):
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rpartition(b")")[2].split()
        except OSError:
            continue  # ended between the listing and the read
        total += int(fields[11]) + int(fields[12])  # utime and stime (fields 14 and 15)
    return total / os.sysconf("SC_CLK_TCK")


def now_ns() -> int:
    return time.monotonic_ns()


def summarize(values_s: Sequence[float]) -> dict[str, Any]:
    """p50/p90/p99/max/mean of a list of seconds (numpy's linear-interpolation percentiles)."""
    import numpy as np

    if not values_s:
        return {"n": 0}
    a = np.asarray(values_s, dtype=float)
    return {
        "n": int(a.size),
        "p50": float(np.percentile(a, 50)),
        "p90": float(np.percentile(a, 90)),
        "p99": float(np.percentile(a, 99)),
        "max": float(a.max()),
        "min": float(a.min()),
        "mean": float(a.mean()),
    }


def fmt_s(v: float | None) -> str:
    """Seconds, in the unit that fits, to three significant digits (a CI's ends must not
    round to the same figure)."""
    if v is None:
        return "n/a"
    if v == 0:
        return "0 s"
    for scale, unit in ((1e6, "µs"), (1e3, "ms"), (1.0, "s")):
        x = v * scale
        if unit == "s" or float(f"{x:.3g}") < 1000:
            return f"{x:.0f} {unit}" if x >= 99.95 else f"{x:#.3g} {unit}"
    raise AssertionError("unreachable")


def pct_cell(values: Sequence[float], q: float) -> str:
    """The q-percentile of ``values`` for a table, or a dash when there are too few samples
    to print it (``_protocol.shown``)."""
    import numpy as np
    from _protocol import shown

    if not values or not shown(len(values), q):
        return "-"
    return fmt_s(float(np.percentile(np.asarray(values, dtype=float), q * 100)))


def list_s(values: Sequence[float]) -> str:
    """Every value, sorted: for rows with too few samples for percentiles."""
    return ", ".join(fmt_s(v) for v in sorted(values))


@dataclass(frozen=True)
class Page:
    """Where a section's markdown goes: its image's link, links to other docs, run mode."""

    img: str | None  # link to the section's plot, relative to the page; None: no plot
    link: Callable[[str], str]  # a path relative to the repository -> a link from the page
    quick: bool


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend, imported when a plot is drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Path) -> None:
    """Lay out, write (110 dpi, the size every section's plot is drawn at) and close."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def uniform_poll_model(interval_s: float) -> dict[str, Any]:
    """Latency of a poll with period T when the death falls at a uniformly random phase:
    uniform on (0, T]. Analytical, not measured."""
    return {
        "n": 0,
        "p50": 0.5 * interval_s,
        "p90": 0.9 * interval_s,
        "p99": 0.99 * interval_s,
        "max": interval_s,
        "min": 0.0,
        "mean": 0.5 * interval_s,
        "analytical": True,
    }


def loadavg() -> tuple[float, float, float]:
    return os.getloadavg()


def raise_nofile() -> tuple[int, int]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def _meminfo_total_gib() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) / 1024 / 1024
    except OSError:
        pass
    return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def machine() -> dict[str, Any]:
    mem = _meminfo_total_gib()
    return {
        "cores": os.cpu_count(),
        "cpu": _cpu_model(),
        "memory_gib": round(mem, 1) if mem else None,
        "kernel": platform.release(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "torch": _version("torch"),
        "healthkit": _version("healthkit"),
        "numpy": _version("numpy"),
        "matplotlib": _version("matplotlib"),
        "clock": "CLOCK_MONOTONIC (time.monotonic_ns)",
    }


# ---------------------------------------------------------------------- /proc readers
def thread_cpu_s(thread_ident: int) -> float:
    """CPU time (user+system) of another thread of this process, in ns precision."""
    return time.clock_gettime(time.pthread_getcpuclockid(thread_ident))


def thread_ctxt_switches(native_id: int) -> tuple[int, int]:
    """(voluntary, nonvoluntary) context switches of one thread of this process."""
    vol = nonvol = 0
    with open(f"/proc/self/task/{native_id}/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches:"):
                vol = int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches:"):
                nonvol = int(line.split()[1])
    return vol, nonvol


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def session_pids(sid: int) -> list[int]:
    """Live (non-zombie) processes whose session id is ``sid``."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                raw = f.read().decode("utf-8", "replace")
        except OSError:
            continue
        fields = raw.rpartition(")")[2].split()
        # fields[0] = state (field 3), fields[3] = session (field 6)
        if len(fields) > 3 and int(fields[3]) == sid and fields[0] not in ("Z", "X"):
            out.append(int(name))
    return out


# ---------------------------------------------------------------------- children
def spawn_sleepers(n: int) -> list[subprocess.Popen[bytes]]:
    """``n`` cheap idle children (``sleep``), in this process's session."""
    return [
        subprocess.Popen([SLEEP, "3600"], stdin=subprocess.DEVNULL, close_fds=True)
        for _ in range(n)
    ]


def stop_children(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    """End the benchmark's children with the product's own ladder (SIGTERM, then SIGKILL)."""
    import healthkit

    healthkit.stop(procs, kill_after=10, name="benchmark children")


def sleep_forever() -> None:  # target of fork-started helpers
    time.sleep(3600)


@contextlib.contextmanager
def section(results: dict[str, Any], name: str) -> Iterator[dict[str, Any]]:
    """Time a benchmark section and record the load average before and after."""
    entry: dict[str, Any] = {"load_before": loadavg()}
    t0 = time.monotonic()
    print(f"[bench] {name} ... (load {entry['load_before'][0]:.2f})", flush=True)
    try:
        yield entry
    finally:
        entry["load_after"] = loadavg()
        entry["wall_s"] = time.monotonic() - t0
        results[name] = entry
        print(f"[bench] {name} done in {entry['wall_s']:.1f}s", flush=True)


def kill_session(pid: int) -> None:
    """SIGKILL a process group we created with start_new_session=True."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def python() -> str:
    return sys.executable
