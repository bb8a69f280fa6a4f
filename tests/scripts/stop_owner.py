"""An owner of watched helpers that is stopped the way launchers stop jobs.

Prints "READY <helper pids> <sidecar pid or 0>" once armed, then waits to be stopped:

- ``--stop term``: a SIGTERM handler (as training scripts install to checkpoint on
  preemption) runs ``--cleanup`` seconds of cleanup, then exits 0;
- ``--stop int``: the default SIGINT handler raises KeyboardInterrupt in the main thread,
  which cleans up for ``--cleanup`` seconds, then exits 0.

A watchdog that fires ends it with exit code 1 (thread mode) or SIGTERM (sidecar) and
writes $TORCHELASTIC_ERROR_FILE; a healthy stop exits 0 and writes nothing.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import signal
import sys
import time

import healthkit as hk


def serve_forever() -> None:
    time.sleep(600)


def cleanup(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:  # a checkpoint: CPU and I/O, the watcher keeps running
        time.sleep(0.01)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", default="thread")
    ap.add_argument("--start-method", default="fork")
    ap.add_argument("--stop", choices=["term", "int"], default="term")
    ap.add_argument("--cleanup", type=float, default=0.0)
    ap.add_argument("--helpers", type=int, default=2)
    args = ap.parse_args()

    if args.stop == "term":

        def on_term(signum: int, frame: object) -> None:
            cleanup(args.cleanup)
            sys.exit(0)

        signal.signal(signal.SIGTERM, on_term)
    ctx = mp.get_context(args.start_method)
    helpers = [
        ctx.Process(target=serve_forever, name=f"helper-{i}", daemon=True)
        for i in range(args.helpers)
    ]
    for p in helpers:
        p.start()
    wd = hk.DisarmableWatchdog(helpers, mode=args.mode).arm()
    print("READY", " ".join(str(p.pid) for p in helpers), wd.sidecar_pid or 0, flush=True)
    try:
        time.sleep(120)
    except KeyboardInterrupt:
        cleanup(args.cleanup)
        sys.exit(0)
    print("NOT STOPPED", flush=True)


if __name__ == "__main__":
    main()
