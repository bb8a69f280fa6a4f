"""Helpers that stall for real, for the progress-watch tests, and the owner that watches them.

The targets are importable by name (spawn and forkserver pickle them by module and name).
Each attaches to its heartbeat, beats a few times, then gets stuck in one real way: a
deadlock on two locks, a blocking read on a FIFO nobody writes, or a C call that holds the
GIL (libc ``sleep()`` through ``ctypes.PyDLL``). The owner (``python progress_helpers.py
KIND METHOD MODE STALL_TIMEOUT``) starts one, arms a watchdog with the progress watch,
waits for a batch, and prints ``waiting <monotonic>`` before it starts to wait; in thread
mode a first action prints ``fired <monotonic>`` before the default actions log the report
and exit 1; in sidecar mode the sidecar logs the report and stops the owner.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _warm_up(hb: object) -> None:
    hb.attach()  # type: ignore[attr-defined]
    for _ in range(3):
        hb.beat()  # type: ignore[attr-defined]
        time.sleep(0.01)


def stuck_on_two_locks(hb: object) -> None:
    """A real lock-order deadlock: this thread holds a and wants b, another holds b and
    wants a."""
    _warm_up(hb)
    a, b = threading.Lock(), threading.Lock()
    both_hold = threading.Barrier(2)

    def other() -> None:
        with b:
            both_hold.wait()
            with a:
                pass

    threading.Thread(target=other, daemon=True).start()
    with a:
        both_hold.wait()
        with b:
            pass


def stuck_reading_a_fifo(hb: object, path: str) -> None:
    """A blocking read on a FIFO nobody writes (opened read-write so the open returns)."""
    _warm_up(hb)
    fd = os.open(path, os.O_RDWR)
    os.read(fd, 1)


def stuck_in_c_holding_the_gil(hb: object) -> None:
    """libc sleep() through PyDLL: the GIL stays held for the whole call."""
    _warm_up(hb)
    ctypes.PyDLL(None).sleep(60)


def beats_with_gaps(hb: object, gaps: list[float]) -> None:
    """Beat after each gap, then stop beating (sleep until killed)."""
    hb.attach()  # type: ignore[attr-defined]
    for gap in gaps:
        time.sleep(gap)
        hb.beat()  # type: ignore[attr-defined]
    time.sleep(60)


def sleeps_in_libc(hb: object, seconds: int, out: object) -> None:
    """libc sleep() with the GIL released; reports what it returned (the seconds left)."""
    hb.attach()  # type: ignore[attr-defined]
    out.put(("ready", os.getpid()))  # type: ignore[attr-defined]
    left = ctypes.CDLL(None).sleep(seconds)
    out.put(("returned", left))  # type: ignore[attr-defined]


def sleeps_in_libc_plain_opt_in(directory: str, seconds: int, out: object) -> None:
    """The same, opted in to stack dumps the plain way (the handler runs in this thread)."""
    from healthkit import lowlevel

    lowlevel.enable_stack_dumps(directory)
    out.put(("ready", os.getpid()))  # type: ignore[attr-defined]
    left = ctypes.CDLL(None).sleep(seconds)
    out.put(("returned", left))  # type: ignore[attr-defined]


def owner(kind: str, method: str, mode: str, stall_timeout: float, where: str) -> None:
    import logging
    import multiprocessing as mp

    import healthkit
    from healthkit import actions

    logging.basicConfig(level=logging.INFO, format="%(created).3f %(levelname)s %(message)s")
    ctx = mp.get_context(method)
    watch = healthkit.ProgressWatch(stall_timeout, name="sampler 0", who="rank 0")
    if kind == "locks":
        target, args = stuck_on_two_locks, (watch.heartbeat,)
    elif kind == "fifo":
        path = os.path.join(where, "nobody-writes")
        os.mkfifo(path)
        target, args = stuck_reading_a_fifo, (watch.heartbeat, path)  # type: ignore[assignment]
    elif kind in ("slow", "idle"):
        # slow: one beat every stall_timeout / 2; idle: three beats, then none.
        gaps = [stall_timeout / 2] * 40 if kind == "slow" else [0.01] * 3
        target, args = beats_with_gaps, (watch.heartbeat, gaps)  # type: ignore[assignment]
    else:
        target, args = stuck_in_c_holding_the_gil, (watch.heartbeat,)
    helper = ctx.Process(target=target, args=args, name="sampler 0", daemon=True)
    helper.start()

    def fired(event: object) -> None:
        print(f"fired {time.monotonic()}", flush=True)

    chosen = None if mode == "sidecar" else [fired, *actions.default_actions()]
    wd = healthkit.DisarmableWatchdog([helper], mode=mode, actions=chosen)  # type: ignore[arg-type]
    wd.watch_progress(watch)
    wd.arm()
    while watch.beats < 3:
        time.sleep(0.01)
    if kind in ("slow", "idle"):
        if kind == "slow":
            with watch.expecting("a batch"):
                time.sleep(10 * stall_timeout)  # progressing slowly all along
        else:
            time.sleep(4 * stall_timeout)  # nobody waits
        wd.disarm()
        print(f"not fired after {watch.beats} beats", flush=True)
        helper.kill()
        helper.join()
        return
    print(f"waiting {time.monotonic()} {time.time()}", flush=True)
    with watch.expecting("a batch"):
        time.sleep(30)  # the batch never comes
    print("not fired", flush=True)


if __name__ == "__main__":
    sys.path.insert(0, HERE)
    from progress_helpers import owner as _owner  # importable by name for spawn children

    _owner(sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5])


def _usr2_blocked() -> bool:
    import signal

    with open("/proc/thread-self/status") as f:
        for line in f:
            if line.startswith("SigBlk:"):
                return bool((int(line.split()[1], 16) >> (signal.SIGUSR2 - 1)) & 1)
    raise AssertionError("no SigBlk")


def attach_then_fork(hb: object, out: object) -> None:
    """Where SIGUSR2 is blocked after attach(): this thread, and a forked child's thread."""
    hb.attach()  # type: ignore[attr-defined]
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(w, b"1" if _usr2_blocked() else b"0")
        os._exit(0)
    os.waitpid(pid, 0)
    out.put((_usr2_blocked(), os.read(r, 1) == b"1"))  # type: ignore[attr-defined]
