"""Datasets whose workers die in the ways a DataLoader worker really dies (importable by
spawn and forkserver workers: tests/dataloader is on sys.path, see conftest.py)."""

from __future__ import annotations

import ctypes
import mmap
import os
import signal
import sys
import tempfile
import time
from typing import Any

import torch
from torch.utils.data import Dataset

from healthkit import lowlevel


class Slow(Dataset[torch.Tensor]):
    """``n`` items, each taking ``delay`` seconds: a worker is always busy on one."""

    def __init__(self, n: int = 400, delay: float = 0.005) -> None:
        self.n, self.delay = n, delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(self.delay)
        return torch.full((4,), float(i))


def _sigbus() -> None:
    """A stand-in for an exhausted /dev/shm: touching a page of a file mapping whose file was
    truncated under it raises the same SIGBUS in the same way (a page with no backing)."""
    fd, path = tempfile.mkstemp(prefix="hk-sigbus-")
    os.unlink(path)
    os.ftruncate(fd, 2 * mmap.PAGESIZE)
    m = mmap.mmap(fd, 2 * mmap.PAGESIZE)
    os.ftruncate(fd, 0)
    m[mmap.PAGESIZE] = 1  # no page behind it: SIGBUS


def _oom(cgroup: str) -> None:
    """Join the limited memory cgroup and allocate (touched pages) until the kernel kills."""
    with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))
    hoard = []
    while True:
        block = bytearray(16 << 20)
        for j in range(0, len(block), 4096):
            block[j] = 1
        hoard.append(block)


def _await_the_witness(limit: float = 30.0) -> None:
    """Wait until the main process runs healthkit's stop-signal witness: the watchdog's
    ``arm()`` starts it while it sets up the watch of a new iterator (bounded)."""
    parent, deadline = os.getppid(), time.monotonic() + limit
    while time.monotonic() < deadline:
        for pid in lowlevel.children(parent):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if b"import os, select, signal" in f.read():
                        return
            except OSError:
                continue
        time.sleep(0.001)


def _done_event_lock() -> Any:
    """The lock of torch's ``done_event`` in this worker's loop (found in its frame)."""
    frame = sys._getframe()
    while frame is not None and frame.f_code.co_name != "_worker_loop":
        frame = frame.f_back  # type: ignore[assignment]
    assert frame is not None, "not in a DataLoader worker"
    return frame.f_locals["done_event"]._cond._lock


class DiesAt(Slow):
    """Like :class:`Slow`, but the worker that fetches item ``at`` ends as ``how`` says:
    ``exit3``, ``segv`` (a null read in native code), ``bus``, ``raise`` (a Python
    exception: torch re-raises it), ``oom:<cgroup dir>``, ``exit0``, ``kill`` (SIGKILL from
    inside, as the OOM killer would, with no OOM record), ``kill-holding-done-lock`` (the
    same while it holds the lock of torch's done event), ``kill-while-watched-starts`` (the
    same as soon as the main process starts setting up the watch of the iterator)."""

    def __init__(self, at: int, how: str, n: int = 400, delay: float = 0.005) -> None:
        super().__init__(n, delay)
        self.at, self.how = at, how

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == self.at:
            how = self.how
            if how == "exit3":
                os._exit(3)
            if how == "exit0":
                os._exit(0)
            if how == "segv":
                ctypes.string_at(0)
            if how == "bus":
                _sigbus()
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if how == "kill-while-watched-starts":
                _await_the_witness()
                os.kill(os.getpid(), signal.SIGKILL)
            if how == "kill-holding-done-lock":
                _done_event_lock().acquire()  # as its is_set() between batches does
                os.kill(os.getpid(), signal.SIGKILL)
            if how == "raise":
                raise ValueError(f"bad item {i}")
            if how.startswith("oom:"):
                _oom(how[4:])
        return super().__getitem__(i)


class Uneven(torch.utils.data.IterableDataset[torch.Tensor]):
    """An IterableDataset whose replicas run out at different times: worker 1 after 2
    items, worker 0 after 20 (torch stops each replica's worker when it runs out)."""

    def __iter__(self):  # type: ignore[no-untyped-def]
        info = torch.utils.data.get_worker_info()
        n = 2 if info is not None and info.id == 1 else 20
        for i in range(n):
            time.sleep(0.005)
            yield torch.full((2,), float(i))
