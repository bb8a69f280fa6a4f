"""An owner of watched helpers that is stopped the way launchers stop jobs.

Prints "READY <helper pids> <sidecar pid or 0>" once armed, then waits to be stopped:

- ``--stop term``: a SIGTERM handler (as training scripts install to checkpoint on
  preemption) runs ``--cleanup`` seconds of cleanup, then exits 0;
- ``--stop int``: the default SIGINT handler raises KeyboardInterrupt in the main thread,
  which cleans up for ``--cleanup`` seconds, then exits 0;
- ``--stop hup``: a SIGHUP handler, as ``term``.

With ``--survive`` the owner handles the signal and carries on instead (a notebook's
interrupt, a training loop that catches KeyboardInterrupt to save and continue, a SIGHUP log
reopen): it prints "HANDLED" and keeps running, and its helpers stay its responsibility.

``--owner`` picks how the owner lives while it is stopped:

- ``plain``: the main thread sleeps;
- ``uninterruptible``: the main thread sits in a killable-only wait (a ``vfork`` whose child
  sleeps in C for ``--blocked`` seconds), as in a read from a slow NFS/FUSE file: a signal to
  the process stays pending until it returns;
- ``asyncio-after-arm``: arms, then runs an asyncio loop that installs its SIGTERM/SIGINT
  handlers with ``loop.add_signal_handler`` (which takes the signal wakeup fd);
- ``asyncio-before-arm``: the loop runs and has installed its handlers before ``arm()``;
- ``asyncio-finished``: an earlier ``asyncio.run()`` used ``add_signal_handler`` and has
  ended (it set the wakeup fd back to -1), then plain handlers;
- ``two-sidecars``: two ``mode="sidecar"`` watchdogs, one helper each;
- ``handler-stops-helper``: the SIGTERM handler stops a helper that ignores SIGTERM with
  ``healthkit.stop()`` (SIGKILL after 0.3 s) before exiting;
- ``own-session``: the helpers start their own sessions (the test then stops each process in
  turn, owner first, as systemd does);
- ``uvloop``: uvloop is imported before ``arm()`` (it binds ``signal.set_wakeup_fd`` at import,
  so healthkit's stand-in never applies to it), armed, then ``uvloop.run`` of a loop (which
  takes the wakeup fd when it starts) that installs its handlers with
  ``loop.add_signal_handler``: delivered stops bypass healthkit's wakeup fd;
- ``uvloop-signal``: ``signal.signal`` handlers, armed, then ``uvloop.run`` of a loop that waits;
- ``sigwait``: the stop signals are blocked in every thread from the start and the main
  thread takes them with ``signal.sigwait`` (no handler runs, nothing stays pending);
- ``storm-alrm``: a 1 kHz SIGALRM with a Python handler while the main thread sits in a
  C call that holds the GIL (``sum`` over a long range): the wakeup socket fills up while the
  stop listener waits for the GIL, and further signal bytes (the stop's too) are dropped;
- ``storm-chld``: a SIGCHLD storm: a SIGCHLD handler (as asyncio's child watchers and
  process pools install; it reaps only its own children) and, over and over, 400 forked
  children that exit one a millisecond while the main thread sits in a C call that holds the
  GIL (``sum`` over a long range): the wakeup socket fills with SIGCHLD bytes while the stop
  listener waits for the GIL. Prints "STORM <monotonic time>" as the children are let go,
  "CALM <time>" when the C call returns, and "STOP-RAN <time>" when the stop's handler runs;
- ``sig-ign``: the stop signal is ignored (``SIG_IGN``): a group stop ends the helpers and the
  owner carries on, so their deaths must be reported (once the stop's grace is over);
- ``gil-held``: once ready, on SIGUSR2, the main thread prints "HOLDING <monotonic time>" and
  sits for ``--blocked`` seconds in a C call that holds the GIL (libc ``sleep`` through
  ``ctypes.PyDLL``): the watcher thread sees a death only when it returns, after a stop that
  came later than the death;
- ``mask-after-arm``: once armed, the main thread blocks SIGINT and SIGTERM for ``--blocked``
  seconds (a critical section, a library that masks), then unblocks them; a stop sent
  meanwhile stays pending until then.

With ``--declare`` (and ``--survive``) the owner says it carries on with
``DisarmableWatchdog.note_stop_survived()`` before it prints "HANDLED"; with
``--declare-on-usr2`` it says so when it gets SIGUSR2 (and prints "DECLARED").

A helper ends on SIGUSR1 the way ``--helper-death`` says (``exit1``: an uncaught exception,
``exit3``: ``sys.exit(3)``), so a test can make it fail with an exit code.

A watchdog that fires ends the owner with exit code 1 (thread mode) or SIGTERM (sidecar) and
writes $TORCHELASTIC_ERROR_FILE; a healthy stop exits 0 and writes nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import multiprocessing as mp
import os
import signal
import sys
import time

import healthkit as hk

STOP_SIGNALS = {"term": signal.SIGTERM, "int": signal.SIGINT, "hup": signal.SIGHUP}


def helper(death: str, own_session: bool, ignore_term: bool) -> None:
    if own_session:
        os.setsid()
    # A sigwait() owner blocked the stop signals before starting it; a helper takes them.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, set(STOP_SIGNALS.values()))
    # A forked helper inherits the owner's handlers; a helper's own disposition is the default
    # (one that survives its stop as the owner does would outlive every teardown).
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    if ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)

    def fail(signum: int, frame: object) -> None:
        if death == "exit1":
            raise ValueError("bad shard 7")  # multiprocessing prints it and exits 1
        sys.exit(3)

    signal.signal(signal.SIGUSR1, fail)
    time.sleep(600)


class ChildStorm:
    """``STORM_CHILDREN`` children that exit one a millisecond once let go (:meth:`go`),
    reaped by a SIGCHLD handler that waits for them only (never for the helpers)."""

    def __init__(self) -> None:
        self.pids: set[int] = set()
        self.release = -1
        signal.signal(signal.SIGCHLD, self.reap)
        self.prepare()

    def reap(self, signum: int, frame: object) -> None:
        for pid in list(self.pids):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                self.pids.discard(pid)

    def prepare(self) -> None:
        """Fork the next storm's children; each waits for the release, then for its turn."""
        r, w = os.pipe()
        stops = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD}
        for i in range(STORM_CHILDREN):
            # Blocked across the fork: a stop must end a child (the default action), never
            # run the owner's handlers in it.
            old = signal.pthread_sigmask(signal.SIG_BLOCK, stops)
            pid = os.fork()
            if pid == 0:
                for sig in stops:
                    signal.signal(sig, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_SETMASK, old)
                os.close(w)
                os.read(r, 1)
                time.sleep(i * 0.001)
                os._exit(0)
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
            self.pids.add(pid)
        os.close(r)
        self.release = w

    def go(self) -> None:
        print("STORM", time.monotonic(), flush=True)
        os.close(self.release)  # every child sees the end of the pipe at once


STORM_CHILDREN = 400


def cleanup(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:  # a checkpoint: CPU and I/O, the watcher keeps running
        time.sleep(0.01)


def block_uninterruptibly(seconds: float) -> None:
    """Sit in a wait only SIGKILL can break, the way a read from a slow network file does:
    ``clone(CLONE_VM | CLONE_VFORK)`` of a child that runs libc ``sleep()`` on its own stack
    (no Python in it). This thread waits for the child killable-only, with no signal blocked,
    so the kernel queues a signal sent to the process on it and leaves it pending; ctypes
    releases the GIL meanwhile, as a file read does."""
    libc = ctypes.CDLL(None, use_errno=True)
    stack = ctypes.create_string_buffer(256 * 1024)
    top = ctypes.c_void_p(ctypes.addressof(stack) + len(stack) - 64)
    clone_vm, clone_vfork = 0x100, 0x4000
    libc.clone.restype = ctypes.c_int
    libc.clone.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    sleep_fn = ctypes.cast(libc.sleep, ctypes.c_void_p)
    pid = libc.clone(sleep_fn, top, clone_vm | clone_vfork | signal.SIGCHLD, int(seconds))
    if pid < 0:
        raise OSError(ctypes.get_errno(), "clone")
    os.waitpid(pid, 0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", default="thread")
    ap.add_argument("--start-method", default="fork")
    ap.add_argument("--stop", choices=list(STOP_SIGNALS), default="term")
    ap.add_argument("--cleanup", type=float, default=0.0)
    ap.add_argument("--helpers", type=int, default=2)
    ap.add_argument("--owner", default="plain")
    ap.add_argument("--survive", action="store_true")
    ap.add_argument("--stop-grace", type=float, default=30.0)
    ap.add_argument("--helper-death", choices=["exit1", "exit3"], default="exit3")
    ap.add_argument("--blocked", type=int, default=3)
    ap.add_argument("--declare", action="store_true")
    ap.add_argument("--declare-on-usr2", action="store_true")
    args = ap.parse_args()
    stop_signal = STOP_SIGNALS[args.stop]
    asyncio_owner = (
        args.owner.startswith("asyncio-") and args.owner != "asyncio-finished"
    ) or args.owner == "uvloop"
    if args.owner.startswith("uvloop"):
        import uvloop  # before arm(): it binds signal.set_wakeup_fd now
    if args.owner == "sigwait":
        signal.pthread_sigmask(signal.SIG_BLOCK, set(STOP_SIGNALS.values()))
    # exits the process (or returns, to carry on), from any of the handlers below
    state = {"helpers": [], "stopping": False}

    def survived() -> None:
        if args.declare:
            hk.DisarmableWatchdog.note_stop_survived()
        print("HANDLED", flush=True)

    if args.declare_on_usr2:

        def declare(signum: int, frame: object) -> None:
            hk.DisarmableWatchdog.note_stop_survived()
            print("DECLARED", flush=True)

        signal.signal(signal.SIGUSR2, declare)

    def on_stop(signum: int = int(stop_signal), frame: object = None) -> None:
        if args.owner == "storm-alrm":  # no SIGALRM left to end it once its handler is gone
            signal.setitimer(signal.ITIMER_REAL, 0)
        if args.owner == "storm-chld":
            print("STOP-RAN", time.monotonic(), flush=True)
        if args.survive:
            survived()
            return
        if args.owner == "handler-stops-helper":
            hk.stop(state["helpers"][:1], kill_after=0.3, kill_timeout=5)
        cleanup(args.cleanup)
        sys.exit(0)

    if args.owner == "sig-ign":
        signal.signal(stop_signal, signal.SIG_IGN)
    elif not asyncio_owner and args.owner != "sigwait" and stop_signal != signal.SIGINT:
        signal.signal(stop_signal, on_stop)
    if args.owner == "asyncio-finished":

        async def uses_signals_then_ends() -> None:
            loop = asyncio.get_running_loop()
            loop.add_signal_handler(signal.SIGUSR2, lambda: None)

        asyncio.run(uses_signals_then_ends())

    ctx = mp.get_context(args.start_method)
    helpers = [
        ctx.Process(
            target=helper,
            args=(args.helper_death, args.owner == "own-session",
                  args.owner == "handler-stops-helper" and i == 0),
            name=f"helper-{i}",
            daemon=True,
        )
        for i in range(args.helpers)
    ]  # fmt: skip
    for p in helpers:
        p.start()
    state["helpers"] = helpers
    if args.owner == "own-session":
        for p in helpers:  # started their sessions before the owner says it is ready
            while os.getpgid(p.pid) == os.getpgrp():
                time.sleep(0.005)

    def arm() -> list[hk.DisarmableWatchdog]:
        if args.owner == "two-sidecars":
            return [
                hk.DisarmableWatchdog([p], mode="sidecar", name=f"watchdog-{i}",
                                      stop_grace=args.stop_grace).arm()
                for i, p in enumerate(helpers)
            ]  # fmt: skip
        return [hk.DisarmableWatchdog(helpers, mode=args.mode, stop_grace=args.stop_grace).arm()]

    def ready(wds: list[hk.DisarmableWatchdog]) -> None:
        sidecars = " ".join(str(wd.sidecar_pid or 0) for wd in wds)
        print("READY", " ".join(str(p.pid) for p in helpers), sidecars, flush=True)

    before_loop: list[hk.DisarmableWatchdog] = []
    if asyncio_owner:

        async def serve() -> None:
            loop = asyncio.get_running_loop()
            stopped = asyncio.Event()

            def on_loop_stop() -> None:
                if args.survive:
                    print("HANDLED", flush=True)
                    return
                stopped.set()

            wds: list[hk.DisarmableWatchdog] = before_loop
            if args.owner == "asyncio-after-arm":
                wds = arm()
            loop.add_signal_handler(signal.SIGUSR2, lambda: None)
            loop.add_signal_handler(stop_signal, on_loop_stop)
            if args.owner == "asyncio-before-arm":
                wds = arm()
            ready(wds)
            try:
                await asyncio.wait_for(stopped.wait(), 120)
            except asyncio.TimeoutError:
                print("NOT STOPPED", flush=True)
                return
            await asyncio.sleep(args.cleanup)
            sys.exit(0)

        if args.owner == "uvloop":
            before_loop = arm()  # the loop then takes the wakeup fd back when it starts
            uvloop.run(serve())
        else:
            asyncio.run(serve())
        return

    armed = arm()
    storm = ChildStorm() if args.owner == "storm-chld" else None
    if args.owner == "gil-held":
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})  # taken by sigwait below
    if args.owner == "mask-after-arm":
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    ready(armed)
    if args.owner == "gil-held":
        signal.sigwait({signal.SIGUSR2})
        print("HOLDING", time.monotonic(), flush=True)
        ctypes.PyDLL(None).sleep(args.blocked)  # the GIL held throughout
        args.owner = "plain"
    if args.owner == "mask-after-arm":
        try:
            time.sleep(args.blocked)  # the critical section
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
        except KeyboardInterrupt:  # the stop sent meanwhile, delivered now
            cleanup(args.cleanup)
            sys.exit(0)
        args.owner = "plain"
    if args.owner == "uvloop-signal":
        if stop_signal == signal.SIGINT:
            signal.signal(signal.SIGINT, on_stop)  # KeyboardInterrupt inside uvloop.run

        async def wait() -> None:
            await asyncio.sleep(120)

        uvloop.run(wait())
        print("NOT STOPPED", flush=True)
        return
    if args.owner == "sigwait":
        while True:
            signal.sigwait({stop_signal})
            if not args.survive:
                on_stop()
            print("HANDLED", flush=True)
    if args.owner == "storm-alrm":
        signal.signal(signal.SIGALRM, lambda signum, frame: None)
        signal.setitimer(signal.ITIMER_REAL, 0.001, 0.001)
        end = time.monotonic() + 120
        while time.monotonic() < end:
            try:
                sum(range(60_000_000))  # one to four seconds in C, holding the GIL
            except KeyboardInterrupt:
                on_stop()
        print("NOT STOPPED", flush=True)
        return
    if storm is not None:
        end = time.monotonic() + 120
        while time.monotonic() < end:
            try:
                storm.go()
                sum(range(40_000_000))  # one to three seconds in C, holding the GIL
                print("CALM", time.monotonic(), flush=True)
                time.sleep(0.5)  # between storms the GIL is free
                storm.prepare()
            except KeyboardInterrupt:
                on_stop()
        print("NOT STOPPED", flush=True)
        return
    end = time.monotonic() + 120
    while time.monotonic() < end:
        try:
            if args.owner == "uninterruptible":
                block_uninterruptibly(args.blocked)
                args.owner = "plain"  # once
            time.sleep(120)
        except KeyboardInterrupt:
            if args.survive:
                survived()
                continue
            cleanup(args.cleanup)
            sys.exit(0)
    print("NOT STOPPED", flush=True)


if __name__ == "__main__":
    main()
