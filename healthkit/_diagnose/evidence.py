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
from typing import Any

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


def _check_version(instance: object, attribute: Any, value: Any) -> None:
    from healthkit._errors import InvalidArgumentError, InvalidArgumentTypeError

    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentTypeError(
            f"version must be 1 or 2 (the cgroup hierarchy's version), got {value!r}", "version"
        )
    if value not in (1, 2):
        raise InvalidArgumentError(
            f"version must be 1 (memory.oom_control) or 2 (memory.events), got {value}",
            "version",
        )


def _check_dir(instance: object, attribute: Any, value: Any) -> None:
    from healthkit._errors import InvalidArgumentTypeError

    if not isinstance(value, str) or "\0" in value or (attribute.name == "path" and not value):
        raise InvalidArgumentTypeError(
            f"{attribute.name} must be a directory path (a str), got {value!r}", attribute.name
        )


@attrs.frozen
class MemoryCgroup:
    """One memory cgroup directory, v1 or v2, with the counters OOM attribution needs.

    Found by :func:`find_memory_cgroup`, or built by hand for
    ``ExitDiagnoser(cgroup=...)`` when the helpers run in another cgroup than their owner:
    ``MemoryCgroup(2, "/sys/fs/cgroup/job/helpers")`` (v2: the directory holding
    ``memory.events``) or ``MemoryCgroup(1, "/sys/fs/cgroup/memory/job/helpers")`` (v1:
    holding ``memory.oom_control``).
    """

    version: int = attrs.field(validator=_check_version)
    path: str = attrs.field(validator=_check_dir)
    #: The hierarchy's mount point (``/sys/fs/cgroup/memory`` on v1), when known: the
    #: cgroup is then named as the kernel names it (``/kubepods/pod1``), not by its path.
    root: str = attrs.field(default="", eq=False, validator=_check_dir)

    @property
    def name(self) -> str:
        """``/kubepods/pod1``, as ``/proc/<pid>/cgroup`` and the kernel log write it; the
        directory path when the mount point is not known."""
        if not self.root:
            return self.path
        rel = os.path.relpath(self.path, self.root)
        return "/" if rel == "." else "/" + rel

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

    def stat(self) -> dict[str, int]:
        """``memory.stat`` as numbers (empty when unreadable)."""
        text = _read_text(os.path.join(self.path, "memory.stat"))
        out: dict[str, int] = {}
        for line in (text or "").splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1].isdigit():
                out[parts[0]] = int(parts[1])
        return out

    def effective_limit_bytes(self) -> int | None:
        """The tightest limit on this cgroup, its parents' included (``None``: unlimited).

        v1 states it (``hierarchical_memory_limit`` in ``memory.stat``); on v2 each
        ancestor's ``memory.max`` is read up to the root, which has none.
        """
        if self.version == 1:
            value = self.stat().get("hierarchical_memory_limit")
            if value is not None:
                return value if value < _UNLIMITED else None
            return self.limit_bytes()
        limits = []
        directory = self.path
        while os.path.exists(os.path.join(directory, "memory.max")):
            limit = _read_int(os.path.join(directory, "memory.max"))
            if limit is not None:
                limits.append(limit)
            parent = os.path.dirname(directory)
            if parent == directory:
                break
            directory = parent
        return min(limits) if limits else None

    def limit_reached(self) -> int | None:
        """v2: how many times usage reached the limit (``memory.events`` ``max``)."""
        if self.version == 1:
            return None
        return _read_keyed(os.path.join(self.path, "memory.events"), "max")


def find_memory_cgroup(
    pid: int | str = "self", *, proc_root: str = "/proc", cgroup_root: str = "/sys/fs/cgroup"
) -> MemoryCgroup | None:
    """Locate the memory cgroup of ``pid`` from ``<proc_root>/<pid>/cgroup``.

    A v1 ``memory`` controller wins over the v2 unified line (hybrid hosts, like many
    container runtimes, list both). Inside a cgroup namespace the listed path may not exist
    under ``cgroup_root``; then the nearest existing ancestor that has the counter is used.
    ``None`` when it cannot be located (no memory controller, or a cgroup outside ours).
    """
    from healthkit._errors import check_pid, path_arg

    if pid != "self":
        check_pid(pid)
    proc_root = path_arg(proc_root, "proc_root")
    cgroup_root = path_arg(cgroup_root, "cgroup_root")
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
                return MemoryCgroup(version, directory, base)
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
    #: The record's time stamp: microseconds since boot (the kernel's printk clock).
    usec: int = 0


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
_OOM_SUMMARY = re.compile(
    r"^oom-kill:constraint=(CONSTRAINT_[A-Z_]+),.*,task=(.*),pid=(\d+),uid=\d+$"
)
_OOM_KILLED = re.compile(
    r"^(?:(?:Memory cgroup out of memory|Out of memory(?: \([a-z_]+\))?): )?"
    r"Killed process (\d+) \((.*)\) total-vm:"
)
# The parts of the OOM report that say whose memory it was. Read only from records the
# kernel wrote (facility 0), and only as numbers; a process name never completes them.
_KILL_RSS = re.compile(r" anon-rss:(\d+)kB, file-rss:(\d+)kB, shmem-rss:(\d+)kB")
_MEMCG_FIELD = re.compile(r",(oom_memcg|task_memcg)=([^,]*)")
_MEMCG_USAGE = re.compile(r"^memory: usage (\d+)kB, limit (\d+)kB, failcnt \d+$")
_MEMCG_STATS = re.compile(r"^Memory cgroup stats for (/[^:]*):")
_MEMCG_STAT_LINE = re.compile(r"^([a-z_]+) (\d+)$")
_MEMCG_STAT_KEYS = ("total_rss", "total_cache", "rss", "cache", "anon", "file")


def oom_killed_pid(record: KernelRecord) -> int | None:
    """The pid an OOM-killer record says was killed, or ``None`` for any other record
    (including one that user space wrote into the log, or that merely names a process
    called ``oom pid=N``)."""
    if record.facility != 0:
        return None
    message = record.message.rstrip()
    m = _OOM_SUMMARY.match(message)
    if m:
        return int(m.group(3))
    m = _OOM_KILLED.match(message)
    return int(m.group(1)) if m else None


@attrs.frozen
class OomKill:
    """One OOM kill as the kernel reported it: the victim, when, and whose memory ran out."""

    pid: int
    comm: str
    #: When the kernel logged it: microseconds since boot.
    usec: int
    #: The kill record's text ("... Killed process <pid> (<comm>) total-vm:..."), or the
    #: summary's when no kill record was seen.
    message: str
    constraint: str | None = None  # CONSTRAINT_MEMCG: a cgroup limit; CONSTRAINT_NONE: global
    oom_memcg: str | None = None  # the cgroup whose limit was hit
    task_memcg: str | None = None  # the victim's cgroup
    #: The victim's own resident memory at the kill (anon, file, shmem), in bytes.
    anon_rss: int | None = None
    file_rss: int | None = None
    shmem_rss: int | None = None
    #: The limited cgroup at the kill: usage and limit, and how much of it was RSS and
    #: page cache (hierarchical figures where the kernel prints them).
    cgroup_usage: int | None = None
    cgroup_limit: int | None = None
    cgroup_rss: int | None = None
    cgroup_cache: int | None = None


class OomReports:
    """Assembles :class:`OomKill` values from a stream of kernel records.

    The kernel writes one OOM report as many records: the limited cgroup's ``memory: usage
    ..., limit ...`` and its ``memory.stat`` lines, the ``oom-kill:`` summary (constraint,
    cgroups, victim) and the ``Killed process`` line (the victim's RSS). Only records with
    facility 0 (written by the kernel itself) are used.
    """

    def __init__(self) -> None:
        self.kills: list[OomKill] = []
        self._memcg: dict[str, int] = {}
        self._in_stats = False

    def feed(self, rec: KernelRecord) -> None:
        if rec.facility != 0:
            return
        for message in rec.message.rstrip().split("\\x0a"):  # one record with newlines
            self._feed(rec, message.rstrip())

    def _feed(self, rec: KernelRecord, message: str) -> None:
        m = _MEMCG_USAGE.match(message)
        if m:  # the start of a memory cgroup's part of a report
            self._memcg = {"usage": int(m.group(1)) * 1024, "limit": int(m.group(2)) * 1024}
            self._in_stats = False
            return
        if _MEMCG_STATS.match(message):
            self._in_stats = "stats" not in self._memcg
            self._memcg["stats"] = 1
            return
        if self._in_stats:
            m = _MEMCG_STAT_LINE.match(message)
            if m:
                if m.group(1) in _MEMCG_STAT_KEYS:
                    self._memcg[m.group(1)] = int(m.group(2))
                return
            self._in_stats = False
        m = _OOM_SUMMARY.match(message)
        if m:
            fields = dict(_MEMCG_FIELD.findall(message.partition(",task=")[0]))
            memcg = self._memcg if m.group(1) == "CONSTRAINT_MEMCG" else {}
            self._memcg = {}
            self.kills.append(
                OomKill(
                    pid=int(m.group(3)),
                    comm=m.group(2),
                    usec=rec.usec,
                    message=message,
                    constraint=m.group(1),
                    oom_memcg=fields.get("oom_memcg") or None,
                    task_memcg=fields.get("task_memcg") or None,
                    cgroup_usage=memcg.get("usage"),
                    cgroup_limit=memcg.get("limit"),
                    cgroup_rss=memcg.get("total_rss", memcg.get("rss", memcg.get("anon"))),
                    cgroup_cache=memcg.get(
                        "total_cache", memcg.get("cache", memcg.get("file"))
                    ),
                )
            )
            return
        m = _OOM_KILLED.match(message)
        if m:
            pid = int(m.group(1))
            # Only after the name: a name cannot then pose as the sizes.
            rss = _KILL_RSS.match(" " + message.rpartition(") total-vm:")[2].partition(", ")[2])
            anon, file, shmem = (
                (int(rss.group(1)) * 1024, int(rss.group(2)) * 1024, int(rss.group(3)) * 1024)
                if rss else (None, None, None)
            )
            last = self.kills[-1] if self.kills else None
            if last is not None and last.pid == pid and last.message.startswith("oom-kill:"):
                self.kills[-1] = attrs.evolve(
                    last, message=message, anon_rss=anon, file_rss=file, shmem_rss=shmem
                )
            else:  # older kernels print no summary
                self.kills.append(
                    OomKill(pid, m.group(2), rec.usec, message,
                            anon_rss=anon, file_rss=file, shmem_rss=shmem)
                )

    def for_pid(self, pid: int) -> list[OomKill]:
        return [k for k in self.kills if k.pid == pid]


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
        self._reports = OomReports()
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
        for rec in records:
            self._reports.feed(rec)

    def oom_kills(self, pid: int) -> list[OomKill] | None:
        """OOM kills of ``pid`` logged since construction (with ``from_start``: since the
        oldest buffered record), oldest first; ``None`` if the log is not readable."""
        with self._lock:
            if self._fd is None:
                return None
            self._read_new()
            return self._reports.for_pid(pid)

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
        usec = int(fields[2]) if len(fields) > 2 else 0
    except (IndexError, ValueError):
        return None
    return KernelRecord(seq, message.decode("utf-8", "replace"), prefix >> 3, usec)


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
