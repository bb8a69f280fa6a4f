"""A custom sampling producer in the style of GiGL's graph store, made fail-fast with
healthkit's pieces: a shared backend (a pool of worker processes serving several
channels), and a fetch loop per channel that polls ``recv(timeout_ms=100)`` until the
backend raises the channel's epoch-done flag.

Without healthkit, such a fetch loop waits forever when a backend worker dies: the epoch
is never done, and ``recv()`` only ever times out (or, when the dead worker had claimed the
next ring block, blocks in C++ for good). Here each piece removes one way to hang:

- ``healthkit.BoundedBarrier`` at bring-up: a worker that dies while loading its shard
  fails the start within milliseconds, one that hangs fails it at the bound, with its stack;
- ``healthkit.ExitDiagnoser``, built before the first worker starts: a dead worker is
  explained (signal, exit code, OOM evidence from before the death);
- ``healthkit_glt.open_receiver``: the fetch loop's receive waits on the channel *and* on
  every worker's exit (a ``healthkit.WatchSet`` of pidfds), and never enters a ring block a
  dead worker claimed; ``receive(timeout)`` is the ``recv(timeout_ms=100)`` of the loop;
- ``healthkit_glt.SerializedSendChannel``: workers sharing a channel send one at a time
  (GLT's ``ShmChannel`` can stall for good with concurrent writers);
- ``healthkit.lowlevel.die_with_parent``: workers die with the process that owns them;
- ``healthkit.stop``: the end, STOP then SIGTERM then SIGKILL, one bounded deadline.

No GiGL import: the backend below stands for any producer of that shape.

    .venv-glt/bin/python examples/glt_custom_producer.py          # 2 channels x 2 epochs
    .venv-glt/bin/python examples/glt_custom_producer.py --kill   # SIGKILL a worker mid-epoch
    .venv-glt/bin/python examples/glt_custom_producer.py --hang   # a worker stuck at bring-up
    .venv-glt/bin/python examples/glt_custom_producer.py --hang=60  # the same, a 60 s bound

(``.venv-glt28/bin/python`` runs it on graphlearn-torch built from source with torch 2.8.)
"""

from __future__ import annotations

import gc
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from typing import Any

import healthkit_glt
import torch
from graphlearn_torch.channel import QueueTimeoutError, ShmChannel

import healthkit
from healthkit.lowlevel import die_with_parent

logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

NUM_WORKERS = 2
NUM_CHANNELS = 2
BATCHES_PER_EPOCH = 20
# Bring-up takes about 2 s here, over 10 s on a loaded machine: a bound of several times the
# slowest healthy bring-up. The --hang demo uses a shorter one, so that it ends sooner (25 s:
# its workers must have started, which took over 15 s on a loaded 2-core machine; when the
# stack shows start-up rather than ``load_shard_forever``, give ``--hang=SECONDS`` more).
BRING_UP_BOUND_S = 60.0
HANG_DEMO_BOUND_S = 25.0


# --------------------------------------------------------------------------- the backend
def backend_worker(rank: int, parent: int, barrier: healthkit.BoundedBarrier, tasks: Any,
                   channels: list[Any], sent: list[Any], hang: bool) -> None:  # fmt: skip
    """One worker of the shared backend: load its shard, meet the others, then serve any
    channel's tasks until told to stop (``None``)."""
    die_with_parent(parent)
    # The ~285,000 objects torch and GLT import are never garbage: freeze them, so that no
    # collection walks them, the interpreter's last ones at exit included. Without it a
    # worker told to stop spent seconds in those (about 2 s each on a loaded 2-core machine)
    # and outlived the stop's 5 s grace, to be SIGTERMed in the middle of its exit.
    gc.freeze()
    barrier.enable_stack_dumps()
    shard = torch.randn(10_000, 16)  # stands for loading this worker's part of the graph
    if hang and rank == 1:
        load_shard_forever()
    try:
        barrier.worker_wait(rank)
    except healthkit.BarrierBrokenError:
        return  # the owner gave up (a peer died, or the bound passed): leave quietly
    while (task := tasks.get()) is not None:
        channel, epoch, batch = task
        rows = torch.randint(0, len(shard), (64,))
        channels[channel].send({"x": shard[rows], "epoch": torch.tensor([epoch]),
                                "batch": torch.tensor([batch])})  # fmt: skip
        with sent[channel].get_lock():  # the channel's epoch-done flag, as a count
            sent[channel].value += 1


def load_shard_forever() -> None:
    while True:  # a stuck bring-up: the barrier's error shows this frame
        time.sleep(3600)


class Backend:
    """The shared backend: ``NUM_WORKERS`` processes serving ``NUM_CHANNELS`` channels."""

    def __init__(self, *, hang: bool = False, bound: float | None = None) -> None:
        ctx = multiprocessing.get_context("spawn")
        # Before any worker exists: the OOM evidence (cgroup counter, kernel log) of a
        # worker's death is then read against a baseline from before it.
        self.diagnoser = healthkit.ExitDiagnoser()
        self.channels = [ShmChannel(4, "8MB") for _ in range(NUM_CHANNELS)]
        send_locks = [ctx.Lock() for _ in range(NUM_CHANNELS)]
        self.sent = [ctx.Value("i", 0) for _ in range(NUM_CHANNELS)]
        self.tasks = ctx.Queue()
        barrier = healthkit.BoundedBarrier(
            NUM_WORKERS, timeout=bound or (HANG_DEMO_BOUND_S if hang else BRING_UP_BOUND_S),
            ctx=ctx,
            name="backend bring-up",
            worker_label="backend worker",
        )  # fmt: skip
        serialized = [healthkit_glt.SerializedSendChannel(c, lock)
                      for c, lock in zip(self.channels, send_locks, strict=True)]  # fmt: skip
        self.workers = [
            ctx.Process(target=backend_worker, name=f"backend worker {rank}", args=(
                rank, os.getpid(), barrier, self.tasks, serialized, self.sent, hang))
            for rank in range(NUM_WORKERS)
        ]  # fmt: skip
        for w in self.workers:
            w.start()
        try:
            barrier.wait(self.workers, on_failure=lambda _: self.stop(failed=True),
                         diagnoser=self.diagnoser)  # fmt: skip
        finally:
            barrier.close()
        # One receiver per channel, each watching every worker of the shared backend.
        self.receivers = [healthkit_glt.open_receiver(c, self.workers) for c in self.channels]

    def start_epoch(self, epoch: int) -> None:
        for channel in range(NUM_CHANNELS):
            self.sent[channel].value = 0
        for batch in range(BATCHES_PER_EPOCH):
            for channel in range(NUM_CHANNELS):
                self.tasks.put((channel, epoch, batch))

    def epoch_done(self, channel: int) -> bool:
        return self.sent[channel].value == BATCHES_PER_EPOCH

    def stop(self, *, failed: bool = False) -> None:
        """Bounded: STOP (``None`` tasks) and 15 s (a worker's RPC shutdown took over 5 s on
        a loaded 2-core machine), then SIGTERM and 5 s, then SIGKILL and 5 s. After a
        failure, SIGTERM at once: the survivors may be parked in a send that nobody will
        receive, where they never read STOP. Idempotent."""
        if getattr(self, "stopped", False):
            return
        self.stopped = True
        for receiver in getattr(self, "receivers", []):
            receiver.close()  # a fetch loop still waiting on another thread returns now
        healthkit.stop(
            self.workers, request=None if failed else lambda: [self.tasks.put(None)
                                                               for _ in self.workers],
            grace=0.0 if failed else 15.0, kill_after=5.0, kill_timeout=5.0,
            name="backend workers",
        )  # fmt: skip
        self.tasks.cancel_join_thread()
        self.diagnoser.close()


def fetch_epoch(backend: Backend, channel: int, on_batch: Any = None) -> int:
    """GiGL's fetch loop: poll ``recv(timeout_ms=100)`` until the epoch-done flag is up and
    the channel is drained. A dead worker ends it within milliseconds, explained."""
    receiver, received = backend.receivers[channel], 0
    while True:
        try:
            msg, ended = receiver.receive(timeout=0.1)
        except QueueTimeoutError:
            if backend.epoch_done(channel) and backend.channels[channel].empty():
                return received
            continue
        if ended:  # a worker of the backend is gone: this epoch cannot complete
            rank = receiver.ranks[id(ended[0])]
            diagnosis = backend.diagnoser.diagnose(ended[0], name=f"backend worker {rank}")
            raise healthkit.ProcessDiedError(
                f"backend worker {rank} died while channel {channel} waited for batch "
                f"{received + 1}: {diagnosis}", diagnosis)  # fmt: skip
        received += 1
        del msg  # a view of the ring: release the slot before the next receive
        if on_batch is not None:
            on_batch(channel, received)


# --------------------------------------------------------------------------- the consumers
def main() -> int:
    started = time.monotonic()
    try:
        hang = [a.partition("=")[2] for a in sys.argv if a.partition("=")[0] == "--hang"]
        backend = Backend(hang=bool(hang), bound=float(hang[0]) if hang and hang[0] else None)
    except healthkit.BarrierBrokenError as e:
        print(f"backend failed to start after {time.monotonic() - started:.1f}s: {e}",
              file=sys.stderr)  # fmt: skip
        return 1
    failures: list[tuple[float, BaseException]] = []
    killed: list[float] = []

    def kill_a_worker(channel: int, received: int) -> None:
        if "--kill" in sys.argv and channel == 0 and received == 3 and not killed:
            os.kill(backend.workers[1].pid, signal.SIGKILL)  # as the OOM killer would
            killed.append(time.monotonic())

    def consume(channel: int, epoch: int) -> None:  # one trainer's loader
        try:
            n = fetch_epoch(backend, channel, kill_a_worker if epoch == 1 else None)
            print(f"epoch {epoch}, channel {channel}: {n} batches")
        except BaseException as e:
            failures.append((time.monotonic(), e))
            backend.stop(failed=True)  # ends the other channel's wait too

    try:
        for epoch in range(2):
            backend.start_epoch(epoch)
            threads = [threading.Thread(target=consume, args=(c, epoch))
                       for c in range(NUM_CHANNELS)]  # fmt: skip
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            if failures:  # the death itself first, not the other channel's shutdown
                at, first = min(failures, key=lambda f: (
                    not isinstance(f[1], healthkit.ProcessDiedError), f[0]))  # fmt: skip
                after = f" {at - killed[0]:.3f}s after the kill" if killed else ""
                print(f"training stopped{after}: {first}", file=sys.stderr)
                return 1
    finally:
        backend.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
