"""Readers for the evidence behind a diagnosis: memory cgroup OOM counters, the kernel log,
/dev/shm. Every reader takes its root path so tests can point it at a tree of real file
formats; none of them raises on a missing or unreadable file (evidence is best effort)."""

from __future__ import annotations

import errno
import logging
import os
import re
import threading
from collections.abc import Iterator

import attrs

__all__ = ["KernelLog", "MemoryCgroup", "ShmUsage", "find_memory_cgroup", "format_bytes"]

_UNLIMITED = 1 << 62
logger = logging.getLogger("healthkit")


def format_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


_MAX_FILE_BYTES = 1 << 16  # cgroup and /proc files read here are a few hundred bytes
_warned: set[str] = set()


def _malformed(path: str, detail: str) -> None:
    """Log (once per file) that a kernel file held something we cannot parse."""
    if path not in _warned:
        _warned.add(path)
        logger.warning("%s is malformed (%s): treated as unknown", path, detail)


def _read_text(path: str) -> str | None:
    """The file's text, bounded; bytes that are not UTF-8 make it malformed (``None``)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(_MAX_FILE_BYTES)
    except OSError:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        _malformed(path, f"not UTF-8: {e.reason} at byte {e.start}")
        return None


def _read_int(path: str) -> int | None:
    text = _read_text(path)
    if text is None:
        return None
    text = text.strip()
    if text == "max":
        return None
    try:
        value = int(text)
    except ValueError:
        _malformed(path, f"not an integer: {text[:40]!r}")
        return None
    return None if value >= _UNLIMITED or value < 0 else value


def _read_keyed(path: str, key: str) -> int | None:
    """Read ``key N`` from a flat-keyed cgroup file (memory.events, memory.oom_control)."""
    text = _read_text(path)
    if text is None:
        return None
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == key:
            try:
                value = int(parts[1])
            except ValueError:
                _malformed(path, f"{key} is not an integer: {parts[1][:40]!r}")
                return None
            return value if value >= 0 else None
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
    text = _read_text(f"{proc_root}/{pid}/cgroup")
    if text is None:
        return None
    lines = text.splitlines()
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
    #: syslog facility from the record's prefix: 0 only for records the kernel wrote
    #: itself (the kernel forces LOG_USER or higher on anything written to /dev/kmsg).
    facility: int = 0


# The OOM killer's own records, matched by their fixed structure only. A process name (up
# to 15 bytes, chosen freely by any user) appears in many kernel records, at their start
# (``<comm>[<pid>]: segfault at ...``) or inside them; none of these patterns can be
# completed by such a name:
# - the summary, "oom-kill:constraint=CONSTRAINT_...,...,task=<comm>,pid=<pid>,uid=<uid>":
#   the victim's pid is the *last* pid= field, right before the final uid= field, so a
#   name containing ",pid=N" cannot move it;
# - the kill, "[Memory cgroup o|O]ut of memory: Killed process <pid> (<comm>) ..." and,
#   on older kernels, "Killed process <pid> (<comm>) total-vm:...": the pid comes before
#   the name.
_OOM_SUMMARY = re.compile(r"^oom-kill:constraint=CONSTRAINT_[A-Z_]+,.*,pid=(\d+),uid=\d+$")
_OOM_KILLED = re.compile(
    r"^(?:(?:Memory cgroup out of memory|Out of memory(?: \([a-z_]+\))?): )?"
    r"Killed process (\d+) \(.*\) total-vm:"
)


def oom_killed_pid(record: KernelRecord) -> int | None:
    """The pid an OOM-killer record says was killed, or ``None`` for any other record
    (including one that user space wrote into the log, or that merely names a process
    called ``oom pid=N``)."""
    if record.facility != 0:
        return None
    message = record.message.rstrip()
    m = _OOM_SUMMARY.match(message) or _OOM_KILLED.match(message)
    return int(m.group(1)) if m else None


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
        return [
            rec.message for rec in records if rec.seq > after_seq and oom_killed_pid(rec) == pid
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
        self._oom.extend(rec for rec in records if oom_killed_pid(rec) is not None)

    def oom_kill_lines(self, pid: int) -> list[str] | None:
        """Lines since construction saying the OOM killer killed ``pid``; ``None`` if the
        log is not readable."""
        with self._lock:
            if self._fd is None:
                return None
            self._read_new()
            return [rec.message for rec in self._oom if oom_killed_pid(rec) == pid]

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


# Bounds on one read of the log. The kernel's ring buffer is at most 32 MiB
# (CONFIG_LOG_BUF_SHIFT <= 25) and one record at most about 8 KiB with its metadata, so a
# "log" that gives more (a path such as /dev/zero given by mistake) is cut off, not read
# forever, and a line that never ends is dropped.
_MAX_READ_BYTES = 64 << 20
_MAX_RECORD_BYTES = 64 << 10


def _drain(fd: int, pending: bytes) -> tuple[list[KernelRecord], bytes]:
    """Read what ``fd`` has now: ``/dev/kmsg`` gives one record per read and EAGAIN at the
    end; a regular file (fixtures) gives lines and then EOF. Returns the complete records
    and the unfinished tail. Reads at most ``_MAX_READ_BYTES`` per call."""
    out: list[KernelRecord] = []
    total = 0
    while total < _MAX_READ_BYTES:
        try:
            chunk = os.read(fd, 8192)
        except OSError as e:
            if e.errno == errno.EPIPE:  # records overwritten while reading: go on
                continue
            break  # EAGAIN: nothing more for now
        if not chunk:
            break
        total += len(chunk)
        pending += chunk
        *lines, pending = pending.split(b"\n")
        if len(pending) > _MAX_RECORD_BYTES:
            pending = b""  # not a log record: drop it rather than grow without end
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
        prefix = int(fields[0])
        seq = int(fields[1])
    except (IndexError, ValueError):
        return None
    return KernelRecord(seq, message.decode("utf-8", "replace"), prefix >> 3)


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
