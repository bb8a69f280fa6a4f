"""A process that owns helper processes under a DisarmableWatchdog, driven by the tests.

Prints one line "READY <helper pids> <sidecar pid or 0>" once armed, then plays a scenario.
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import healthkit as hk


def serve_forever() -> None:
    time.sleep(600)


def return_early() -> None:
    time.sleep(0.3)


def exit_3() -> None:
    time.sleep(0.3)
    sys.exit(3)


def parent_of_a_stuck_grandchild(pid_out: Any) -> None:
    """An unwatched helper whose own child blocks in a call (a DataLoader worker's shape)."""
    grandchild = subprocess.Popen(["sleep", "600"])
    pid_out.value = grandchild.pid
    grandchild.wait()


def exit_3_when_told(go: Any) -> None:
    """exit_3, its 0.3 s counted from the owner's word: what the owner does first (a stop,
    a masking thread) precedes the death however long arm() took on a loaded machine."""
    go.wait(60)
    exit_3()


def exit_3_in_own_group_when_told(go: Any) -> None:
    os.setpgrp()  # a helper in another process group: a group signal cannot reach it
    exit_3_when_told(go)


def survive(seconds: float = 2.0) -> None:
    time.sleep(seconds)
    print("SURVIVED", flush=True)


# The one decision table, played against either mode: scenario -> (helper target,
# on_clean_exit, what the owner does once armed). tests/core/test_decision_table.py
# holds the expected outcome of each.
TABLE = {
    "allowed-exit0-joined": (return_early, "ignore", "join"),
    "allowed-exit0-before-watch": (return_early, "ignore", "join-before-watch"),
    "until-exit0": (return_early, "fail", "join"),
    "until-exit0-warn": (return_early, "warn", "join"),
    "exit3-joined": (exit_3_when_told, "ignore", "join"),
    "sigkill-joined": (serve_forever, "ignore", "kill-join"),
    "sigchld-ignored-allowed-exit0": (return_early, "ignore", "sigchld-ignored"),
    "sigchld-ignored-until-exit0": (return_early, "fail", "sigchld-ignored"),
    # Stop episodes: the owner is asked to stop, handles it and carries on.
    "survived-sigint-then-exit3": (exit_3_when_told, "ignore", "handled-sigint"),
    "survived-sighup-then-exit3": (exit_3_when_told, "ignore", "handled-sighup"),
    "other-group-during-stop-exit3": (exit_3_in_own_group_when_told, "ignore", "handled-sigint"),
    "stop-long-ago-then-exit3": (exit_3_when_told, "ignore", "sighup-long-ago"),
    "exit-within-stop-grace": (exit_3_when_told, "ignore", "handled-sigint-then-exit"),
    # A stop signal taken by a thread whose handler has not written its byte yet (on a loaded
    # machine the handler can be preempted for milliseconds): libc's sleep() as the C-level
    # SIGINT handler holds that moment for 2 s (sleep(SIGINT)), the signal blocked meanwhile:
    # deferred at first, then, blocked past HANDLER_CONFIRM_S with no other trace, a mask.
    "handler-running-then-exit3": (exit_3_when_told, "ignore", "slow-c-handler"),
    # ...and its twin: a thread that blocks the stop signals for good (as libzmq's I/O
    # threads do), started after arm(): no stop is under way, the death fires at once.
    "blocking-thread-then-exit3": (exit_3_when_told, "ignore", "blocking-thread"),
    # A thread that blocks every signal for a moment, as CPython's subprocess does around its
    # vfork(), is not taking a stop: the death fires at once (a mistaken deferral would
    # outlast the owner's 2 s with the default 30 s grace).
    "masking-thread-then-exit3": (exit_3_when_told, "ignore", "masking-thread"),
}


class PrintHandler(logging.Handler):
    """A handler of the application's own (not a file or stream handler): prints to stdout."""

    def emit(self, record: logging.LogRecord) -> None:
        print(f"CUSTOM {record.levelname} {record.name}: {record.getMessage()}", flush=True)


class JsonFormatter(logging.Formatter):
    """An application's structured log format: one JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        import json

        return json.dumps(
            {"level": record.levelname, "logger": record.name, "message": record.getMessage()}
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("scenario")
    ap.add_argument("--mode", default="thread")
    ap.add_argument("--start-method", default="fork")
    ap.add_argument("--helpers", type=int, default=2)
    ap.add_argument("--log-to-stderr", action="store_true")
    ap.add_argument("--gil-held-sleep", type=float, default=0.0)
    ap.add_argument("--policy", default="fail")
    ap.add_argument("--sigterm-exits", action="store_true")
    ap.add_argument("--stop-grace", type=float, default=30.0)
    ap.add_argument("--death", default="SIGKILL", help="exit-right-after-death: the signal")
    ap.add_argument("--log-file", help="the application's logging: a FileHandler on the root")
    ap.add_argument("--log-level", help="set on the healthkit logger (e.g. CRITICAL)")
    ap.add_argument("--log-disabled", action="store_true", help="healthkit logger disabled")
    ap.add_argument("--log-custom", action="store_true", help="a handler no process can share")
    ap.add_argument("--log-json", help="a FileHandler on the root with a JSON formatter class")
    ap.add_argument("--log-dictconfig", help="dictConfig after import: a root file handler")
    ap.add_argument("--log-queue", action="store_true",
                    help="a QueueHandler on the root, its listener printing to stdout, late")
    args = ap.parse_args()

    if args.log_json:
        handler = logging.FileHandler(args.log_json)
        handler.setFormatter(JsonFormatter())
        logging.getLogger().addHandler(handler)
        logging.getLogger().setLevel(logging.INFO)
    if args.log_dictconfig:
        from logging import config as logging_config

        logging_config.dictConfig({  # disable_existing_loggers: True, the default
            "version": 1,
            "formatters": {"app": {"format": "APP %(levelname)s %(name)s: %(message)s"}},
            "handlers": {"file": {"class": "logging.FileHandler", "formatter": "app",
                                  "filename": args.log_dictconfig}},
            "root": {"level": "INFO", "handlers": ["file"]},
        })
    if args.log_queue:
        import queue
        from logging import handlers as logging_handlers

        q: queue.Queue[logging.LogRecord] = queue.Queue()
        class SlowStdout(logging.StreamHandler):  # type: ignore[type-arg]
            """A listener that writes late, as one behind a busy thread does: a line
            handed to the queue is not yet written."""

            def emit(self, record: logging.LogRecord) -> None:
                time.sleep(0.1)
                super().emit(record)

        out = SlowStdout(sys.stdout)
        out.setFormatter(logging.Formatter("QUEUED %(levelname)s %(name)s: %(message)s"))
        listener = logging_handlers.QueueListener(q, out)
        listener.start()
        logging.getLogger().addHandler(logging_handlers.QueueHandler(q))
        logging.getLogger().setLevel(logging.INFO)

    if args.log_file:
        logging.basicConfig(
            filename=args.log_file,
            level=logging.INFO,
            format="APP %(levelname)s %(name)s: %(message)s",
        )
    if args.log_custom:
        logging.getLogger().addHandler(PrintHandler())
    if args.log_level:
        logging.getLogger("healthkit").setLevel(args.log_level)
    if args.log_disabled:
        logging.getLogger("healthkit").disabled = True

    ctx = mp.get_context(args.start_method)
    if args.scenario in TABLE:
        table_scenario(args, ctx)
        return
    early = ("early-exit-0", "exit-right-after-clean-exit")
    target = return_early if args.scenario in early else serve_forever
    helpers = [
        ctx.Process(target=target, name=f"helper-{i}", daemon=True) for i in range(args.helpers)
    ]
    for p in helpers:
        p.start()
    if args.sigterm_exits:
        # Installed after the helpers start, so that they keep the default action: a forked
        # helper that inherits a Python handler can lose multiprocessing's SIGTERM at exit
        # (CPython drops signals that arrive between fork() and its after-fork clean-up, and
        # one that arrives just before a sleep's system call waits for the sleep), and the
        # owner's exit then waits in join() for a 600 s sleep (1 run in about 150 under load).
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    wd = hk.DisarmableWatchdog(helpers, mode=args.mode, on_clean_exit=args.policy)
    wd.arm()
    wd.arm()  # idempotent
    if args.log_to_stderr:
        mp.log_to_stderr(20)  # INFO; re-registers multiprocessing's exit hook after arming
    sidecar = wd.sidecar_pid or 0
    print("READY", " ".join(str(p.pid) for p in helpers), sidecar, flush=True)

    if args.scenario in ("kill-helper-with-tree", "disarm-then-kill-with-tree"):
        pid_out = ctx.Value("i", 0)
        child = ctx.Process(target=parent_of_a_stuck_grandchild, args=(pid_out,), daemon=False)
        child.start()
        while not pid_out.value:
            time.sleep(0.01)
        print("TREE", child.pid, pid_out.value, flush=True)
        if args.scenario.startswith("disarm"):
            wd.disarm()
        os.kill(helpers[0].pid, signal.SIGKILL)
        time.sleep(1.0)
        # Only reached when nothing fired: the tree must be untouched.
        alive = [p for p in (child.pid, pid_out.value) if os.path.exists(f"/proc/{p}")]
        print("TREE ALIVE" if len(alive) == 2 else f"TREE BROKEN {alive}", flush=True)
        hk.stop([child, pid_out.value], kill_after=5)
        return
    if args.scenario == "helper-dies-during-thread-join":
        # main() returns at once; a non-daemon thread still runs, and the helper dies while
        # the interpreter joins that thread at exit.
        def late_work() -> None:
            time.sleep(0.3)
            os.kill(helpers[0].pid, signal.SIGKILL)
            time.sleep(3)
            print("NOT REACHED", flush=True)

        threading.Thread(target=late_work, name="late-work").start()
        return
    if args.scenario in ("kill-sidecar-then-helper", "hup-sidecar-then-helper"):
        sig = signal.SIGKILL if args.scenario.startswith("kill") else signal.SIGHUP
        os.kill(sidecar, sig)
        time.sleep(1.0)
        try:
            os.kill(sidecar, 0)
            print("SIDECAR ALIVE", flush=True)
        except ProcessLookupError:
            print("SIDECAR GONE", flush=True)
        os.kill(helpers[0].pid, signal.SIGKILL)
        time.sleep(10)
        print("NOT REACHED", flush=True)
        return
    if args.scenario == "stop-with-healthkit":
        # A helper that ignores SIGTERM, ended by healthkit.stop(): SIGTERM, then SIGKILL.
        os.kill(helpers[0].pid, signal.SIGSTOP)  # stopped: it cannot even run a handler
        hk.stop([helpers[0]], kill_after=0.3, kill_timeout=5)
        survive(1.0)
        return
    if args.scenario == "clean-exit":
        time.sleep(0.05)
        return
    if args.scenario == "kill-helper":
        os.kill(helpers[0].pid, signal.SIGKILL)
    elif args.scenario == "disarm-then-kill":
        wd.disarm()
        os.kill(helpers[0].pid, signal.SIGKILL)
        helpers[0].join()
        time.sleep(0.3)
        print("SURVIVED", flush=True)
        return
    elif args.scenario == "exit-right-after-death":
        # The main thread learns of the death itself (as a client call that raises would)
        # and leaves at once, keeping the GIL as long as it can so that the exit usually
        # starts before the watcher thread runs.
        sys.setswitchinterval(100)
        os.kill(helpers[0].pid, signal.Signals[args.death])
        siginfo = ctypes.create_string_buffer(128)
        P_PID, WEXITED, WNOWAIT = 1, 4, 0x01000000
        ctypes.PyDLL(None).waitid(P_PID, helpers[0].pid, siginfo, WEXITED | WNOWAIT)
        print("MAIN THREAD DONE", flush=True)
        return
    elif args.scenario == "exit-right-after-clean-exit":
        # The same, for a helper that finishes by itself (exit 0).
        sys.setswitchinterval(100)
        siginfo = ctypes.create_string_buffer(128)
        P_PID, WEXITED, WNOWAIT = 1, 4, 0x01000000
        ctypes.PyDLL(None).waitid(P_PID, helpers[0].pid, siginfo, WEXITED | WNOWAIT)
        print("MAIN THREAD DONE", flush=True)
        return
    elif args.scenario == "early-exit-0":
        time.sleep(2)
        print("SURVIVED", flush=True)
        return
    if args.gil_held_sleep:
        # libc sleep() through PyDLL keeps the GIL for its whole duration, like a native
        # client call blocked against a dead server.
        ctypes.PyDLL(None).sleep(int(args.gil_held_sleep))
        print("GIL RELEASED", flush=True)
    # Short sleeps, as a real main thread runs Python code between its waits: a signal that
    # arrives after the interpreter's last check and before the sleep's system call is taken
    # by CPython's C handler, and the Python handler runs only when the sleep returns (one
    # 60 s sleep made a SIGTERM sent right after READY wait 60 s, about 1 run in 80).
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(0.05)
    print("NOT REACHED", flush=True)


def table_scenario(args: argparse.Namespace, ctx: mp.context.BaseContext) -> None:
    target, on_clean_exit, action = TABLE[args.scenario]
    if action == "sigchld-ignored":
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps children at once
    if action.startswith("handled-"):
        signal.signal(signal.SIGINT, lambda *_: print("HANDLED", flush=True))
    signal.signal(signal.SIGHUP, lambda *_: print("HANDLED", flush=True))  # a log reopen
    if action == "sighup-long-ago":
        hk.DisarmableWatchdog().arm().disarm()  # healthkit notices stop signals from here on
        os.kill(os.getpid(), signal.SIGHUP)
        time.sleep(args.stop_grace + 0.5)  # the episode is over before the helper starts
    masking = threading.Event()
    if action == "masking-thread":  # a thread healthkit sees first with its usual mask

        def masking_thread() -> None:
            masking.wait()
            signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
            time.sleep(60)

        threading.Thread(target=masking_thread, name="masking", daemon=True).start()
    go = ctx.Event()  # type: ignore[attr-defined]
    helper_args = (go,) if target in (exit_3_when_told, exit_3_in_own_group_when_told) else ()
    helper = ctx.Process(  # type: ignore[attr-defined]
        target=target, args=helper_args, name="helper-0", daemon=True
    )
    helper.start()
    if action == "join-before-watch":
        helper.join()
    wd = hk.DisarmableWatchdog(mode=args.mode, stop_grace=args.stop_grace)
    wd.watch(helper, on_clean_exit=on_clean_exit)
    wd.arm()
    print("READY", helper.pid, wd.sidecar_pid or 0, flush=True)
    if action not in ("handled-sigint", "handled-sighup", "handled-sigint-then-exit",
                      "slow-c-handler", "masking-thread", "blocking-thread"):  # fmt: skip
        go.set()  # these set it once what must come first has happened
    if action in ("handled-sigint", "handled-sighup", "handled-sigint-then-exit"):
        # This process alone is asked to stop (a notebook's interrupt, a log reopen), and
        # carries on; its helper fails right after (0.3 s after the stop).
        os.kill(os.getpid(), signal.SIGINT if "sigint" in action else signal.SIGHUP)
        go.set()
        if action == "handled-sigint-then-exit":
            helper.join()
            time.sleep(0.3)  # the death is seen, and excused: this process is stopping
            print("SURVIVED", flush=True)  # ...and it does end within the grace (armed: the
            return  # exit hook judges the death again, knowing this process is exiting)
        survive(args.stop_grace + 3.0)
        wd.disarm()
        return
    if action == "slow-c-handler":
        libc = ctypes.CDLL(None)
        libc.signal.restype = ctypes.c_void_p
        libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
        libc.signal(signal.SIGINT, ctypes.cast(libc.sleep, ctypes.c_void_p))
        # Sent from another thread, the signal is taken by the main thread while it sleeps
        # below without the GIL, as torchrun's SIGINT would be.
        def interrupt() -> None:
            os.kill(os.getpid(), signal.SIGINT)
            go.set()  # the helper dies 0.3 s into the 2 s handler

        threading.Timer(0.05, interrupt).start()
        survive(args.stop_grace + 3.0)
        wd.disarm()
        return
    if action == "masking-thread":
        masking.set()  # before the helper's exit (0.3 s after go)
        go.set()
        survive()
        wd.disarm()
        return
    if action == "blocking-thread":
        blocked = threading.Event()

        def io_thread() -> None:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP})
            blocked.set()
            time.sleep(60)

        threading.Thread(target=io_thread, name="io", daemon=True).start()
        blocked.wait(5)
        go.set()
        survive()
        wd.disarm()
        return
    if action == "join":
        helper.join()  # the owner reaps first, routinely
    elif action == "kill-join":
        os.kill(helper.pid, signal.SIGKILL)
        helper.join()
    survive()
    wd.disarm()


if __name__ == "__main__":
    main()
