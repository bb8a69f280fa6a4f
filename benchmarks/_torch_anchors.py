"""The torch baselines of the latency section, run in a process of their own.

torch is imported here and not in the benchmark process, so the helpers the benchmark forks
for the other methods stay as small as before (a forked process's exit, part of every
latency, grows with its parent's address space). The benchmark starts this script once,
then asks for one trial at a time over stdin, interleaved with the other methods' trials;
each answer is one JSON line on the original stdout (fd 1 is pointed at /dev/null so the
children cannot write into the protocol).

A trial, as the benchmark sees it:

1. it writes ``dataloader`` or ``torchelastic``;
2. this process starts the children and answers ``{"pids": [...]}``, then waits the way the
   anchor does (``next(it)`` in a loop / ``PContext.wait(timeout, period=0.1)``);
3. the benchmark SIGKILLs one of those pids, having read CLOCK_MONOTONIC just before;
4. this process answers ``{"t1_ns": ..., ...}`` with CLOCK_MONOTONIC when the anchor
   reported the failure, then cleans up and answers ``{"left": [...]}`` (pids still alive).
"""

from __future__ import annotations

import faulthandler
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from typing import Any, TextIO

GIVE_UP_S = 30.0  # an anchor that has not reported the death by then: a failed trial
ITEM_SLEEP_S = 0.01  # the dataset's __getitem__ sleeps this long
CHILD = "import time; time.sleep(3600)"


class SlowDataset:
    """A map-style dataset whose ``__getitem__`` sleeps a little, like one doing I/O."""

    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, i: int) -> int:
        time.sleep(ITEM_SLEEP_S)
        return i


def plain(batch: list[int]) -> list[int]:
    """The batch as a list: no tensor crosses from a worker, so no worker opens the
    file-descriptor-passing listener (a directory under /tmp) that a SIGKILL would leave
    behind; the DataLoader's failure detection does not depend on the payload."""
    return batch


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rpartition(b")")[2].split()[0]
    except OSError:
        return False
    return state not in (b"Z", b"X")


def dataloader_trial(out: TextIO) -> None:
    import torch.utils.data

    loader: Any = torch.utils.data.DataLoader(
        SlowDataset(),  # type: ignore[arg-type]
        num_workers=2,
        batch_size=1,
        collate_fn=plain,
    )
    it: Any = iter(loader)
    next(it)  # both workers are up
    workers = list(it._workers)
    _send(out, {"pids": [w.pid for w in workers]})
    result: dict[str, Any] = {"t1_ns": None}
    deadline = time.monotonic() + GIVE_UP_S
    try:
        while time.monotonic() < deadline:
            next(it)
    except Exception as e:  # RuntimeError from the SIGCHLD handler, or a torn transfer
        result = {"t1_ns": time.monotonic_ns(), "error": f"{type(e).__name__}: {e}"[:300]}
    _send(out, result)
    it._shutdown_workers()
    for w in workers:
        if w.is_alive():
            w.kill()
        w.join(10)
    _send(out, {"left": [w.pid for w in workers if _alive(w.pid)]})


def torchelastic_trial(out: TextIO) -> None:
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, start_processes

    log_dir = tempfile.mkdtemp(prefix="healthkit-bench-torchelastic-")
    pc: Any = None
    pids: list[int] = []
    try:
        pc = start_processes(
            name="bench",
            entrypoint=sys.executable,
            args={0: ("-c", CHILD)},
            envs={0: {}},
            logs_specs=DefaultLogsSpecs(log_dir=log_dir),
        )
        pids = list(pc.pids().values())
        _send(out, {"pids": pids})
        # LocalElasticAgent polls its workers every monitor_interval = 0.1 s
        r = pc.wait(timeout=GIVE_UP_S, period=0.1)
        t1 = time.monotonic_ns()
        if r is not None and r.is_failed():
            failure = next(iter(r.failures.values()))
            _send(out, {"t1_ns": t1, "exitcode": failure.exitcode})
        else:
            _send(out, {"t1_ns": None})
    finally:
        if pc is not None:
            pc.close()
        shutil.rmtree(log_dir, ignore_errors=True)
    _send(out, {"left": [p for p in pids if _alive(p)]})


def _send(out: TextIO, msg: dict[str, Any]) -> None:
    out.write(json.dumps(msg) + "\n")
    out.flush()


def main() -> int:
    out = os.fdopen(os.dup(1), "w", buffering=1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # stacks, if a trial hangs
    import torch  # noqa: F401  (the import is the slow part: before "ready")

    _send(out, {"ready": True})
    trials = {"dataloader": dataloader_trial, "torchelastic": torchelastic_trial}
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "quit":
            break
        trials[cmd](out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
