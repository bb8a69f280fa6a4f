"""How the producer receives a batch without ever blocking on a dead sampling worker.

GLT 0.2.4's ``ShmChannel.recv()`` polls (1 ms sleeps) while its ring is empty, then claims
the next block and waits for it in an unbounded ``sem_wait`` that no signal ends. A writer
claims its block when it *starts* a send, so a worker killed mid-send, or while it waits
for ring space, leaves a claimed block that is never written: ``recv()``, with or without
``timeout_ms``, then waits forever.

Two receivers, one interface (:class:`Receiver`):

- :class:`RingReceiver` (GLT's ``ShmChannel``, the default): reads the ring's header in
  shared memory, read-only (the adapter's :class:`~healthkit_glt._adapter.ring.RingView`),
  and calls ``recv()`` only when the next block is already written (its read semaphore is
  posted), so ``recv()`` cannot block. Until then the caller waits in
  ``poll()`` on a WatchSet of the workers' pidfds, 1 ms at a time (GLT's own cadence), so a
  death ends the wait at once. No thread, no hand-off: each check is two memory reads.
  A written block is returned only after one ``poll(0)`` of the same set finds no worker
  ended: once a death is known, no further batch is delivered (the survivors' batches
  already in the ring would otherwise keep coming until it ran empty: in server-client
  mode, with a consumer slower than the sampling, a whole epoch's share of them).
- :class:`ThreadReceiver` (any other channel, or a ring whose layout is not the one the
  adapter checks): a helper thread does the blocking ``recv()`` and hands the message over through a
  pipe, and the caller waits on that pipe and the pidfds (one WatchSet); a message handed
  over is likewise returned only while no worker has ended. It costs a thread
  hand-off per batch, and when a dead worker had claimed a block the thread stays blocked in
  C++ for good; the channel's segment is then marked for removal so it does not outlive the process.

The ring layout (GLT's ``ShmQueueMeta``) is never assumed: :meth:`RingView.open` checks it
and raises :class:`RingLayoutError` for any other, and :func:`open_receiver` then falls back
to :class:`ThreadReceiver` (:mod:`healthkit_glt._adapter.ring`).
"""

from __future__ import annotations

import logging
import math
import os
import select
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from multiprocessing.process import BaseProcess
from typing import Any, Literal, Protocol

from graphlearn_torch.channel import ChannelBase, QueueTimeoutError

from healthkit import InvalidArgumentTypeError, ProcessWatch, UsageError, WatchSet
from healthkit._shared import check_choice, check_int
from healthkit.lowlevel import MAX_TIMEOUT_S
from healthkit_glt._adapter.ring import RingLayoutError, RingView, mark_for_removal

__all__ = [
    "RECEIVER_MODES",
    "ErrorReported",
    "Receiver",
    "ReceiverMode",
    "RingLayoutError",
    "RingReceiver",
    "ThreadReceiver",
    "check_receiver_mode",
    "open_receiver",
]

logger = logging.getLogger("healthkit.glt")

ReceiverMode = Literal["auto", "ring", "thread"]
RECEIVER_MODES: tuple[str, ...] = ("auto", "ring", "thread")

_RING_WAIT_MS = 1  # GLT's own recv() sleeps 1 ms at a time while its ring is empty


class ErrorReported(Exception):
    """A worker reported a sampling error (raised by ``receive()``; the producer turns it
    into :class:`healthkit_glt.SamplingError`)."""

    def __init__(self, rank: int, text: str, summary: str, raised_at: float) -> None:
        super().__init__(rank, text, summary, raised_at)
        self.rank, self.text, self.summary, self.raised_at = rank, text, summary, raised_at


class Receiver(Protocol):
    """What the producer needs from a receiver."""

    watches: list[ProcessWatch]
    ranks: dict[int, int]  # id(watch) -> worker rank

    def receive(self, timeout: float | None = None) -> tuple[Any, list[ProcessWatch]]:
        """``(message, [])``, or ``(None, ended watches)`` once a worker has ended; raises
        GLT's ``QueueTimeoutError`` when ``timeout`` seconds pass with neither."""
        ...

    def stop(self) -> None:
        """Stop reporting (the teardown is about to end the workers)."""
        ...

    def close(self) -> bool:
        """Release fds and memory; False if a receive is stuck in C++ for good."""
        ...


class _WorkerExits:
    """The workers' watches in one :class:`healthkit.WatchSet`, plus a receiver's own fds.

    Receivers wait on the set's epoll fd with a bare ``poll()`` (:attr:`poll`): once per
    batch, and once per millisecond while the ring is empty, so each wake is one call on one
    fd however many workers there are. :meth:`ended` then asks the set what happened.
    """

    def __init__(self, workers: Sequence[BaseProcess], reports: Any = None) -> None:
        self.watches = [
            ProcessWatch(w, name=f"sampling worker {rank}") for rank, w in enumerate(workers)
        ]
        self.ranks = {id(w): rank for rank, w in enumerate(self.watches)}
        self._set = WatchSet(self.watches)
        poller = select.poll()
        poller.register(self._set.fileno(), select.POLLIN)
        self.poll = poller.poll
        # The workers' error reports (a pipe's read end), if the producer has one.
        self._reports = reports
        self._report_ready = False
        if reports is not None:
            self._set.add_fd(reports.fileno(), self._note_report)

    def _note_report(self) -> None:
        self._report_ready = True  # read (and raised) by ended(), after the set's wait

    def add_fd(self, fd: int, on_ready: Callable[[], None] = lambda: None) -> None:
        """Also end the receiver's wait when ``fd`` is readable (``on_ready`` consumes it)."""
        self._set.add_fd(fd, on_ready)

    def ended(self) -> list[ProcessWatch]:
        """The watches whose worker has ended, once :attr:`poll` saw the set readable;
        raises :class:`ErrorReported` first if a worker reported a sampling error."""
        self._report_ready = False
        ended = self._set.wait(0)
        if self._report_ready:
            self.raise_report()
        return ended

    def raise_report(self) -> None:
        """Raise the first pending report as :class:`ErrorReported` (if one is there)."""
        if self._reports is not None and self._reports.poll():
            try:
                rank, text, summary, raised_at = self._reports.recv()
            except (EOFError, OSError):
                return
            raise ErrorReported(rank, text, summary, raised_at)

    def close(self) -> None:
        self._set.close()
        for w in self.watches:
            w.close()


def check_receiver_mode(mode: str, what: str = "receiver") -> None:
    """An :class:`healthkit.InvalidArgumentError` naming the valid modes, for a bad
    ``receiver`` argument."""
    check_choice(mode, RECEIVER_MODES, what)


_NO_REPORT = bytearray(1)  # the flag of a receiver without error reports: never set


def open_receiver(
    channel: ChannelBase,
    workers: Sequence[BaseProcess],
    *,
    mode: ReceiverMode = "auto",
    poll_ms: int = 500,
    reports: Any = None,
    report_flag: Any = None,
) -> Receiver:
    """The receiver for ``channel``: the ring reader when it can be used (``"auto"``).

    ``reports`` (a ``multiprocessing`` connection's read end) and ``report_flag`` (a shared
    byte that the workers set after writing a report) carry sampling errors: the receive
    raises :class:`ErrorReported` instead of waiting for a batch that will never come.
    """
    check_receiver_mode(mode, "mode")
    if not isinstance(channel, ChannelBase):
        raise InvalidArgumentTypeError(
            f"channel must be a GLT channel (graphlearn_torch.channel.ChannelBase), got "
            f"{channel!r}",
            "channel",
        )
    if isinstance(workers, (str, bytes)) or not isinstance(workers, Sequence):
        raise InvalidArgumentTypeError(
            f"workers must be a list of the producer's worker processes, got {workers!r}",
            "workers",
        )
    for w in workers:
        if not isinstance(w, BaseProcess):
            raise InvalidArgumentTypeError(
                f"workers must hold multiprocessing processes, got {w!r}", "workers"
            )
    check_int(poll_ms, "poll_ms", minimum=1, maximum=MAX_TIMEOUT_S * 1000)
    if reports is not None and not callable(getattr(reports, "recv", None)):
        raise InvalidArgumentTypeError(
            f"reports must be the read end of a multiprocessing Pipe or None, got {reports!r}",
            "reports",
        )
    if report_flag is not None:
        try:
            if len(memoryview(report_flag)) < 1:
                raise ValueError
        except (TypeError, ValueError):
            raise InvalidArgumentTypeError(
                f"report_flag must be a shared byte (multiprocessing RawArray('b', 1)) or "
                f"None, got {report_flag!r}",
                "report_flag",
            ) from None
    flag = report_flag if report_flag is not None else _NO_REPORT
    if mode != "thread":
        try:
            return RingReceiver.open(channel, workers, reports, flag)
        except RingLayoutError as e:
            if mode == "ring":
                raise
            logger.warning("%s; receiving through a helper thread instead", e)
    return ThreadReceiver(channel, workers, poll_ms, reports, flag)


class RingReceiver:
    """Receives on the caller's thread, calling ``recv()`` only for a block already written
    (:meth:`healthkit_glt._adapter.ring.RingView.next_block_written`).

    One consumer per ring (GLT's design): nobody else takes a posted read semaphore, so
    "written" stays true until our ``recv()`` takes it.
    """

    def __init__(
        self,
        channel: ChannelBase,
        workers: Sequence[BaseProcess],
        ring: RingView,
        reports: Any = None,
        flag: Any = _NO_REPORT,
    ) -> None:
        self._channel = channel
        self._exits = _WorkerExits(workers, reports)
        self.watches, self.ranks = self._exits.watches, self._exits.ranks
        # close() from another thread writes here, so a waiting receive returns at once.
        self._wake_r, self._wake_w = os.pipe()
        self._exits.add_fd(self._wake_r)  # stays readable: receive() then sees _closed
        self._ring: RingView | None = ring
        # What a receive reads, in one attribute: each lookup is a cache miss after a wait.
        self._hot = (ring.next_block_written, self._exits.poll, channel.recv, flag)
        # Held for a whole receive, so close() from another thread (an atexit shutdown)
        # never detaches the segment under it. Reentrant, for a close() from a signal
        # handler on the receiving thread: that one leaves the detach to the receive.
        self._lock = threading.RLock()
        self._receiving = False
        self._detach_on_return = False
        self._closed = False

    @classmethod
    def open(
        cls,
        channel: ChannelBase,
        workers: Sequence[BaseProcess],
        reports: Any = None,
        flag: Any = _NO_REPORT,
    ) -> RingReceiver:
        """Attach ``channel``'s ring read-only and check its layout; RingLayoutError if not."""
        return cls(channel, workers, RingView.open(channel), reports, flag)

    def receive(self, timeout: float | None = None) -> tuple[Any, list[ProcessWatch]]:
        with self._lock:
            if self._closed:
                raise UsageError("the sampling producer was shut down during a receive")
            self._receiving = True
            try:
                written, poll, recv, flag = self._hot
                deadline = None if timeout is None else time.monotonic() + timeout
                while True:
                    # Each pass is one 1 ms wake, on cold caches: every bytecode here
                    # costs measurable CPU per batch (docs/glt.md, "What it costs"), so
                    # the test is three memory reads and the wait one poll() call. A
                    # reported sampling error (the flag) is raised before any batch: the
                    # poll() below finds its pipe readable at once.
                    if written() and not flag[0]:
                        # A written block is delivered only while no worker has ended
                        # (one poll(0) of the exit set): a death already known stops
                        # delivery at once. Without this check the survivors' batches
                        # kept coming until the ring ran empty, seconds (and a whole
                        # epoch's share of batches) after the death.
                        if not poll(0) or not (ended := self._ended_or_closed()):
                            return recv(), []
                        return None, ended
                    if poll(_RING_WAIT_MS):
                        if ended := self._ended_or_closed():
                            return None, ended
                    elif deadline is not None and time.monotonic() >= deadline:
                        raise QueueTimeoutError()
            finally:
                self._receiving = False
                if self._detach_on_return:
                    self._detach()

    def _ended_or_closed(self) -> list[ProcessWatch]:
        """After the exit set polled readable: the ended workers (raises if the receiver
        was closed, or :class:`ErrorReported` for a reported sampling error)."""
        if self._closed:
            raise UsageError("the sampling producer was shut down during a receive")
        return self._exits.ended()

    def stop(self) -> None:
        pass  # nothing runs between receives

    def close(self) -> bool:
        if not self._closed:
            self._closed = True
            os.write(self._wake_w, b"x")  # a receive waiting on another thread returns
        with self._lock:  # acquired once that receive has returned, or on its own thread
            if self._receiving:  # a signal handler interrupted the receive on this thread
                self._detach_on_return = True
            else:
                self._detach()
        return True

    def _detach(self) -> None:
        """Unmap the ring and close the fds (once; only while no receive reads them)."""
        ring, self._ring = self._ring, None
        if ring is None:
            return
        ring.close()
        self._exits.close()
        os.close(self._wake_r)
        os.close(self._wake_w)


class ThreadReceiver:
    """Receives in a helper thread; the caller waits on the hand-off and the workers' exit
    fds at once.

    One request at a time, like the stock loader: the thread does not prefetch, so the
    number of ring slots a consumer holds is the same as with stock GLT. The caller polls
    the hand-off pipe together with the workers' pidfds.
    """

    def __init__(
        self,
        channel: ChannelBase,
        workers: Sequence[BaseProcess],
        poll_ms: int,
        reports: Any = None,
        flag: Any = _NO_REPORT,
    ) -> None:
        self._channel = channel
        self._poll_ms = poll_ms
        self._flag = flag
        self._exits = _WorkerExits(workers, reports)
        self.watches, self.ranks = self._exits.watches, self._exits.ranks
        self._ready_r, self._ready_w = os.pipe()
        self._exits.add_fd(self._ready_r, self._take_hand_off)
        self._requests = threading.Semaphore(0)
        self._results: deque[tuple[bool, Any]] = deque()
        self._pending = False
        self._stopping = False
        self.thread = threading.Thread(target=self._run, name="healthkit-glt receiver", daemon=True)
        self.thread.start()

    def _take_hand_off(self) -> None:
        os.read(self._ready_r, 64)  # the message itself is in _results

    def _run(self) -> None:
        channel, results, ready_w = self._channel, self._results, self._ready_w
        while True:
            self._requests.acquire()
            if self._stopping:
                return
            while True:
                try:
                    # Bounded, so a stop request is seen while the queue is empty. It cannot
                    # bound the wait on a block a dead writer claimed (module docstring).
                    item: tuple[bool, Any] = (True, channel.recv(timeout_ms=self._poll_ms))
                    break
                except QueueTimeoutError:
                    if self._stopping:
                        return
                except BaseException as e:
                    item = (False, e)
                    break
            results.append(item)
            del item
            if self._stopping:
                return
            try:
                os.write(ready_w, b"x")
            except OSError:
                return  # closed by close(): the producer is gone

    def receive(self, timeout: float | None = None) -> tuple[Any, list[ProcessWatch]]:
        if not self._pending:
            self._pending = True
            self._requests.release()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._flag[0]:
                self._exits.raise_report()
            if self._results:
                # A result already handed over is delivered only while no worker has
                # ended: a death already known stops delivery at once (as the ring reader).
                if self._exits.poll(0) and (ended := self._exits.ended()):
                    return None, ended
                ok, value = self._results.popleft()
                self._pending = False
                if not ok:
                    raise value
                return value, []
            if deadline is None:
                self._exits.poll()  # the hand-off, a worker's death or a report
            else:
                left_ms = math.ceil((deadline - time.monotonic()) * 1000)
                # On timeout the request stays pending: the next receive takes its result.
                if left_ms <= 0 or not self._exits.poll(left_ms):
                    raise QueueTimeoutError()
            if ended := self._exits.ended():
                return None, ended

    def stop(self) -> None:
        self._stopping = True
        self._requests.release()

    def close(self) -> bool:
        """Close the fds; True if the thread ended. A thread waiting on an empty queue sees
        the stop within ``poll_ms``, so it is given two of those and a second. One stuck on
        a block a dead worker claimed keeps the channel attached (and alive) for the life of
        the process, so GLT's destructor, the only place that removes the SysV segment,
        never runs: the segment is marked for removal, so the kernel frees it at our exit."""
        self.thread.join(2 * self._poll_ms / 1000 + 1.0)
        ended = not self.thread.is_alive()
        self._exits.close()
        os.close(self._ready_r)
        self._results.clear()
        if ended:
            os.close(self._ready_w)
            return True
        # The stuck thread keeps the write end; it never writes again (it cannot return
        # from the C++ wait) and the kernel closes it at exit.
        shmid, removed = mark_for_removal(self._channel)
        logger.warning(
            "healthkit-glt receive thread stays blocked on a ring slot a dead worker had "
            "claimed (it cannot be interrupted); channel segment %s %s",
            shmid,
            "marked for removal at exit" if removed else "could not be marked for removal",
        )
        return False
