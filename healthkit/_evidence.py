"""Readers for the evidence behind a diagnosis: memory cgroup OOM counters, the kernel log,
/dev/shm. Every reader takes its root path so tests can point it at a tree of real file
formats; none of them raises on a missing or unreadable file (evidence is best effort)."""

from __future__ import annotations

import errno
import os
import re
import threading
from collections.abc import Iterator

import attrs

__all__ = ["KernelLog", "MemoryCgroup", "ShmUsage", "find_memory_cgroup", "format_bytes"]

_UNLIMITED = 1 << 62


def format_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    if text == "max":
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return None if value >= _UNLIMITED else value


def _read_keyed(path: str, key: str) -> int | None:
    """Read ``key N`` from a flat-keyed cgroup file (memory.events, memory.oom_control)."""
    try:
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 2 and parts[0] == key:
                    return int(parts[1])
    except (OSError, ValueError):
        return None
    return None


@attrs.frozen
class MemoryCgroup:
    """One memory cgroup directory, v1 or v2, with the counters OOM attribution needs."""

    version: int
    path: str

    @property
    def counter_file(self) -> str:
        return "memory.oom_control" if self.version == 1 else "memory.events"

    def oom_kills(self) -> int | None:
        """The cgroup's ``oom_kill`` counter (v1: needs Linux >= 4.13)."""
        return _read_keyed(os.path.join(self.path, self.counter_file), "oom_kill")

    def peak_bytes(self) -> int | None:
        name = "memory.max_usage_in_bytes" if self.version == 1 else "memory.peak"
        return _read_int(os.path.join(self.path, name))

    def limit_bytes(self) -> int | None:
        name = "memory.limit_in_bytes" if self.version == 1 else "memory.max"
        return _read_int(os.path.join(self.path, name))


def find_memory_cgroup(
    pid: int | str = "self", *, proc_root: str = "/proc", cgroup_root: str = "/sys/fs/cgroup"
) -> MemoryCgroup | None:
    """Locate the memory cgroup of ``pid`` from ``<proc_root>/<pid>/cgroup``.

    A v1 ``memory`` controller wins over the v2 unified line (hybrid hosts, like many
    container runtimes, list both). Inside a cgroup namespace the listed path may not exist
    under ``cgroup_root``; then the nearest existing ancestor that has the counter is used.
    """
    try:
        with open(f"{proc_root}/{pid}/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    v1_path = v2_path = None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if "memory" in controllers.split(","):
            v1_path = path
        elif parts[0] == "0" and controllers == "":
            v2_path = path
    candidates: list[tuple[int, str, str]] = []
    if v1_path is not None:
        candidates.append((1, os.path.join(cgroup_root, "memory"), v1_path))
    if v2_path is not None and os.path.exists(os.path.join(cgroup_root, "cgroup.controllers")):
        candidates.append((2, cgroup_root, v2_path))
    for version, base, rel in candidates:
        counter = "memory.oom_control" if version == 1 else "memory.events"
        rel = rel.strip("/")
        if ".." in rel.split("/"):
            # A cgroup outside our cgroup namespace ("/../sibling", seen when asking about
            # another process): it is not under our mount at all, and walking ".." would
            # escape cgroup_root. It cannot be located from here.
            continue
        while True:
            directory = os.path.join(base, rel) if rel else base
            if os.path.exists(os.path.join(directory, counter)):
                return MemoryCgroup(version, directory)
            if not rel:
                break
            rel = os.path.dirname(rel)
    return None


@attrs.frozen
class KernelRecord:
    seq: int
    message: str


class KernelLog:
    """The kernel ring buffer as exposed by ``/dev/kmsg`` (one record per read).

    A regular file with the same ``pri,seq,usec,flags;message`` lines is read the same way,
    which is how tests feed it fixtures.
    """

    def __init__(self, path: str = "/dev/kmsg") -> None:
        self.path = path

    def records(self) -> Iterator[KernelRecord] | None:
        """All records currently buffered, or ``None`` when the log is not readable.

        Read eagerly (the ring buffer is small) so the fd is closed before this returns,
        whether or not the caller consumes the iterator.
        """
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            return None
        return iter(self._read_all(fd))

    def _read_all(self, fd: int) -> list[KernelRecord]:
        try:
            records, rest = _drain(fd, b"")
        finally:
            os.close(fd)
        last = _parse_kmsg(rest)
        return records + ([last] if last is not None else [])

    def last_seq(self) -> int | None:
        records = self.records()
        if records is None:
            return None
        last = -1
        for rec in records:
            last = rec.seq
        return last

    def oom_kill_lines(self, pid: int, after_seq: int) -> list[str] | None:
        """Kernel lines after ``after_seq`` saying the OOM killer killed ``pid``."""
        records = self.records()
        if records is None:
            return None
        pattern = re.compile(rf"(Killed process {pid}\b|[ ,]pid={pid}[ ,]|[ ,]pid={pid}$)")
        return [
            rec.message
            for rec in records
            if rec.seq > after_seq
            and pattern.search(rec.message)
            and ("oom" in rec.message.lower() or "Killed process" in rec.message)
        ]


class KernelLogFollower:
    """Follows the kernel log from the moment it is built, keeping only OOM records.

    Why not re-read the log at diagnosis time: ``/dev/kmsg`` returns one record per
    ``read()``, so reading a few thousand records costs a few thousand system calls (and
    GIL hand-offs) exactly when a helper has just died and the action should run. An fd
    opened and positioned at the end up front makes each later read cover only what is new.
    ``from_start=True`` keeps what is already buffered too (to explain past exits).
    """

    def __init__(self, path: str = "/dev/kmsg", *, from_start: bool = False) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._pending = b""
        self._oom: list[KernelRecord] = []
        self._fd: int | None
        try:
            self._fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            self._fd = None
            return
        if not from_start:
            try:
                os.lseek(self._fd, 0, os.SEEK_END)
            except OSError:
                os.close(self._fd)
                self._fd = None

    @property
    def readable(self) -> bool:
        return self._fd is not None

    def _read_new(self) -> None:
        if self._fd is None:
            return
        records, self._pending = _drain(self._fd, self._pending)
        self._oom.extend(rec for rec in records if _OOM_WORDS.search(rec.message))

    def oom_kill_lines(self, pid: int) -> list[str] | None:
        """Lines since construction saying the OOM killer killed ``pid``; ``None`` if the
        log is not readable."""
        with self._lock:
            if self._fd is None:
                return None
            self._read_new()
            pattern = re.compile(rf"(Killed process {pid}\b|[ ,]pid={pid}[ ,]|[ ,]pid={pid}$)")
            return [rec.message for rec in self._oom if pattern.search(rec.message)]

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


_OOM_WORDS = re.compile(r"Killed process|oom", re.IGNORECASE)


def _drain(fd: int, pending: bytes) -> tuple[list[KernelRecord], bytes]:
    """Read what ``fd`` has now: ``/dev/kmsg`` gives one record per read and EAGAIN at the
    end; a regular file (fixtures) gives lines and then EOF. Returns the complete records
    and the unfinished tail."""
    out: list[KernelRecord] = []
    while True:
        try:
            chunk = os.read(fd, 8192)
        except OSError as e:
            if e.errno == errno.EPIPE:  # records overwritten while reading: go on
                continue
            break  # EAGAIN: nothing more for now
        if not chunk:
            break
        pending += chunk
        *lines, pending = pending.split(b"\n")
        out.extend(rec for rec in map(_parse_kmsg, lines) if rec is not None)
    return out, pending


def _parse_kmsg(line: bytes) -> KernelRecord | None:
    if not line or line.startswith(b" "):  # continuation lines carry key=value metadata
        return None
    head, sep, message = line.partition(b";")
    if not sep:
        return None
    fields = head.split(b",")
    try:
        seq = int(fields[1])
    except (IndexError, ValueError):
        return None
    return KernelRecord(seq, message.decode("utf-8", "replace"))


@attrs.frozen
class ShmUsage:
    total_bytes: int
    free_bytes: int


def shm_usage(path: str = "/dev/shm") -> ShmUsage | None:
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return ShmUsage(st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize)
