"""Evidence readers on fixture trees with the real file formats, and on this machine's files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from healthkit._diagnose.evidence import (
    KernelLog,
    MemoryCgroup,
    find_memory_cgroup,
    format_bytes,
    shm_usage,
)


def _find(tree: Path) -> MemoryCgroup | None:
    return find_memory_cgroup(proc_root=str(tree / "proc"), cgroup_root=str(tree / "sys/fs/cgroup"))


# --------------------------------------------------------------------------- cgroups


def test_cgroup_v1_is_found_from_the_memory_line_of_proc_self_cgroup(fixture_tree: Path) -> None:
    tree = fixture_tree / "cgroup-v1"
    cg = _find(tree)
    assert cg == MemoryCgroup(
        1, str(tree / "sys/fs/cgroup/memory/kubepods/burstable/pod8f2c/ctr-5e1a")
    )
    assert cg.counter_file == "memory.oom_control"
    assert cg.oom_kills() == 2  # this cgroup's, not its parent's (7)
    assert cg.peak_bytes() == 4265607168  # memory.max_usage_in_bytes
    assert cg.limit_bytes() == 4294967296  # memory.limit_in_bytes


def test_cgroup_v2_is_found_from_the_unified_line(fixture_tree: Path) -> None:
    tree = fixture_tree / "cgroup-v2"
    cg = _find(tree)
    assert cg == MemoryCgroup(2, str(tree / "sys/fs/cgroup/system.slice/train.service"))
    assert cg.counter_file == "memory.events"
    assert cg.oom_kills() == 1
    assert cg.peak_bytes() == 8589672448  # memory.peak
    assert cg.limit_bytes() == 8589934592  # memory.max


def test_cgroup_v2_needs_a_unified_hierarchy_mounted_at_the_root(fixture_tree: Path) -> None:
    tree = fixture_tree / "cgroup-v2"
    (tree / "sys/fs/cgroup/cgroup.controllers").unlink()
    assert _find(tree) is None


def test_unlimited_means_no_limit(fixture_tree: Path) -> None:
    v2 = MemoryCgroup(2, str(fixture_tree / "cgroup-v2/sys/fs/cgroup/system.slice"))
    assert v2.limit_bytes() is None  # "max"
    assert v2.oom_kills() == 4
    v1 = MemoryCgroup(1, str(fixture_tree / "cgroup-v1/sys/fs/cgroup/memory"))
    assert v1.limit_bytes() is None  # 9223372036854771712: the v1 "no limit" value
    assert v1.peak_bytes() is None  # no such file: best effort, no error


def test_v1_memory_controller_wins_on_a_hybrid_host(fixture_tree: Path) -> None:
    # cgroup-v1/proc/self/cgroup also lists "0::/system.slice/containerd.service"; give the
    # tree a unified root too: the v1 memory line must still win.
    tree = fixture_tree / "cgroup-v1"
    (tree / "sys/fs/cgroup/cgroup.controllers").write_text("memory pids\n")
    cg = _find(tree)
    assert cg is not None and cg.version == 1


def test_v1_namespace_falls_back_to_the_nearest_existing_ancestor(fixture_tree: Path) -> None:
    # A container without a cgroup namespace: /proc/self/cgroup names the host path
    # (/docker/<id>), /sys/fs/cgroup/memory is the container's own cgroup.
    tree = fixture_tree / "cgroup-v1-namespace"
    cg = _find(tree)
    assert cg == MemoryCgroup(1, str(tree / "sys/fs/cgroup/memory"))
    assert cg.oom_kills() == 3


def test_v2_namespace_falls_back_to_the_nearest_existing_ancestor(fixture_tree: Path) -> None:
    tree = fixture_tree / "cgroup-v2-namespace"
    cg = _find(tree)
    # .../cri-containerd-9a8b.scope is not visible; its parent is, and it wins over the
    # grandparent, which has a counter too.
    assert cg == MemoryCgroup(
        2, str(tree / "sys/fs/cgroup/kubepods.slice/kubepods-pod77.slice")
    )
    assert cg.oom_kills() == 2


def test_v2_namespace_root_listed_as_slash_is_the_mount_root(fixture_tree: Path) -> None:
    tree = fixture_tree / "cgroup-v2-outside"
    (tree / "proc/self/cgroup").write_text("0::/\n")
    cg = _find(tree)
    assert cg == MemoryCgroup(2, str(tree / "sys/fs/cgroup"))


def test_a_cgroup_outside_our_namespace_is_not_located(fixture_tree: Path) -> None:
    # "/../../system.slice/other.service": the process is outside our cgroup namespace.
    # Walking ".." would escape cgroup_root (to a directory that happens to have a counter)
    # or land on our own root cgroup: both would be someone else's evidence.
    tree = fixture_tree / "cgroup-v2-outside"
    assert _find(tree) is None


def test_no_readable_proc_cgroup_means_no_cgroup(tmp_path: Path) -> None:
    assert find_memory_cgroup(proc_root=str(tmp_path), cgroup_root=str(tmp_path)) is None
    (tmp_path / "self").mkdir()
    (tmp_path / "self/cgroup").write_text("garbage without colons\n")
    assert find_memory_cgroup(proc_root=str(tmp_path), cgroup_root=str(tmp_path)) is None


def test_find_memory_cgroup_of_another_pid(fixture_tree: Path) -> None:
    tree = fixture_tree / "cgroup-v2"
    (tree / "proc/4242").mkdir()
    (tree / "proc/4242/cgroup").write_text("0::/system.slice\n")
    cg = find_memory_cgroup(
        4242, proc_root=str(tree / "proc"), cgroup_root=str(tree / "sys/fs/cgroup")
    )
    assert cg == MemoryCgroup(2, str(tree / "sys/fs/cgroup/system.slice"))


def test_this_machines_memory_cgroup_is_found_and_its_counter_is_an_int() -> None:
    with open("/proc/self/cgroup") as f:
        lines = f.read().splitlines()
    v1 = any("memory" in line.split(":", 2)[1].split(",") for line in lines if line.count(":") >= 2)
    cg = find_memory_cgroup()
    if cg is None:
        pytest.skip(f"no memory cgroup counter readable here (/proc/self/cgroup: {lines})")
    assert cg.version == (1 if v1 else 2)
    assert cg.path.startswith("/sys/fs/cgroup")
    assert isinstance(cg.oom_kills(), int), f"{cg.path}/{cg.counter_file} has no oom_kill"
    peak = cg.peak_bytes()
    assert peak is None or peak > 0


# --------------------------------------------------------------------------- kernel log

KMSG = Path(__file__).parent / "fixtures" / "kmsg"


def _kmsg(tmp_path: Path, *parts: str, pid: int | None = None) -> Path:
    text = "".join((KMSG / p).read_text() for p in parts)
    if pid is not None:
        text = text.replace("4242", str(pid))
    out = tmp_path / "kmsg"
    out.write_text(text)
    return out


def test_kernel_log_records_skip_continuation_lines(tmp_path: Path) -> None:
    log = KernelLog(str(_kmsg(tmp_path, "before.txt")))
    records = list(log.records() or [])
    assert [r.seq for r in records[:4]] == [0, 1, 2, 3]
    assert not any(r.message.startswith(("SUBSYSTEM=", "DEVICE=")) for r in records)
    assert records[2].message.startswith("ACPI: PCI Root Bridge")
    assert log.last_seq() == 321


def test_only_oom_records_after_the_baseline_count(tmp_path: Path) -> None:
    path = _kmsg(tmp_path, "before.txt")
    log = KernelLog(str(path))
    baseline = log.last_seq()
    assert baseline == 321
    # before.txt holds an OOM kill of pid 4242 from an earlier run: not after the baseline
    assert log.oom_kill_lines(4242, baseline) == []
    assert len(log.oom_kill_lines(4242, -1) or []) == 2

    path.write_text(path.read_text() + (KMSG / "after-oom-kill-42420.txt").read_text())
    assert log.oom_kill_lines(4242, baseline) == []  # 42420 is not 4242
    assert len(log.oom_kill_lines(42420, baseline) or []) == 2

    path.write_text(path.read_text() + (KMSG / "after-oom-kill-4242.txt").read_text())
    lines = log.oom_kill_lines(4242, baseline)
    assert lines is not None and len(lines) == 2
    assert lines[0].startswith("oom-kill:constraint=CONSTRAINT_MEMCG") and "pid=4242," in lines[0]
    assert lines[1].startswith("Memory cgroup out of memory: Killed process 4242 (python3)")


def test_global_oom_killer_records_are_recognised(tmp_path: Path) -> None:
    log = KernelLog(str(_kmsg(tmp_path, "before.txt", "after-global-oom-kill-7777.txt")))
    lines = log.oom_kill_lines(7777, 321)
    assert lines is not None
    assert [line.split(":")[0] for line in lines] == ["oom-kill", "Out of memory"]
    # "oom_reaper: reaped process 7777" is about the same kill, not a second record
    assert not any(line.startswith("oom_reaper") for line in lines)


def test_an_unreadable_kernel_log_gives_none(tmp_path: Path) -> None:
    log = KernelLog(str(tmp_path / "missing"))
    assert log.records() is None
    assert log.last_seq() is None
    assert log.oom_kill_lines(1, 0) is None


def test_records_left_unconsumed_do_not_leak_the_fd(tmp_path: Path) -> None:
    log = KernelLog(str(_kmsg(tmp_path, "before.txt")))
    before = set(os.listdir("/proc/self/fd"))
    records = log.records()  # never iterated
    assert records is not None
    assert set(os.listdir("/proc/self/fd")) == before
    del records


def test_this_machines_dev_kmsg_is_read_when_permitted() -> None:
    log = KernelLog()
    seq = log.last_seq()
    if seq is None:
        pytest.skip("/dev/kmsg is not readable here (needs root or CAP_SYSLOG)")
    assert seq >= 0
    assert log.oom_kill_lines(os.getpid(), seq) == []


# --------------------------------------------------------------------------- /dev/shm


def test_shm_usage_reads_the_filesystem_and_tolerates_a_missing_one(tmp_path: Path) -> None:
    shm = shm_usage("/dev/shm")
    if shm is None:
        pytest.skip("/dev/shm does not exist here")
    assert shm.total_bytes > 0 and 0 <= shm.free_bytes <= shm.total_bytes
    assert shm_usage(str(tmp_path / "missing")) is None


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (64 << 20, "64.0 MiB"),
        (3 << 40, "3072.0 GiB"),
    ],
)
def test_format_bytes(n: int, text: str) -> None:
    assert format_bytes(n) == text
