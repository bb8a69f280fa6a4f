"""The ``healthkit`` command: demo, doctor, explain, stacks."""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
from collections.abc import Callable

from healthkit._errors import HealthkitError, check_bound, check_pid
from healthkit._version import __version__


def _seconds(flag: str) -> Callable[[str], float]:
    """An argparse type: a positive number of seconds, errors naming ``flag``."""

    def parse(text: str) -> float:
        try:
            return check_bound(float(text), flag)
        except (ValueError, HealthkitError) as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return parse


# torch's DataLoader reports (torch/csrc/DataLoader.cpp, torch/utils/data/dataloader.py): the
# SIGCHLD handler's "is killed by signal: <strsignal>" and "exited unexpectedly with exit code
# N", both with the worker's pid.
_TORCH_KILLED = re.compile(r"DataLoader worker \(pid (\d+)\) is killed by signal: ([^.]+)")
_TORCH_EXITED = re.compile(
    r"DataLoader worker \(pid (\d+)\) exited unexpectedly with exit code (-?\d+)"
)
_TORCH_UNKNOWN = re.compile(r"DataLoader worker \(pid\(s\) ([\d, ]+)\) exited unexpectedly")


def _torch_line(text: str) -> tuple[int, int] | None:
    """(return code, pid) from a torch DataLoader worker line, ``None`` if it is not one."""
    m = _TORCH_KILLED.search(text)
    if m is not None:
        by_text = {signal.strsignal(s): s for s in signal.Signals}
        sig = by_text.get(m.group(2).strip())
        if sig is None:
            raise argparse.ArgumentTypeError(
                f"torch's line names a signal this machine does not know: {m.group(2)!r}; "
                "pass the exit code instead (-N for signal N) with --pid"
            )
        return -int(sig), int(m.group(1))
    m = _TORCH_EXITED.search(text)
    if m is not None:
        return int(m.group(2)), int(m.group(1))
    m = _TORCH_UNKNOWN.search(text)
    if m is not None:
        raise argparse.ArgumentTypeError(
            "this torch line comes from its 5 s status check, which does not keep the "
            f"exit status; look for the worker's exit code in the log (pid(s) {m.group(1)}), "
            "or run `healthkit explain CODE --pid PID`"
        )
    return None


def _return_code(text: str) -> tuple[int, int | None]:
    """An exit status, or torch's DataLoader line (then with the worker's pid)."""
    from healthkit._diagnose.diagnosis import check_returncode

    line = _torch_line(text) if "DataLoader worker" in text else None
    try:
        value, pid = line if line is not None else (int(text), None)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid int value: {text!r} (give an exit code, or torch's whole "
            "\"DataLoader worker (pid N) is killed by signal: ...\" line)"
        ) from None
    try:
        return check_returncode(value, "exit status"), pid
    except HealthkitError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _pid(flag: str) -> Callable[[str], int]:
    """An argparse type: a pid, errors naming ``flag``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
        try:
            return check_pid(value, flag)
        except HealthkitError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return parse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="healthkit",
        description="Notice a dead helper process in milliseconds, fail the job in seconds, "
        "say why.",
    )
    parser.add_argument("--version", action="version", version=f"healthkit {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run a real job whose helper dies, without and with "
                          "healthkit")
    from healthkit._tools.demo import SCENARIOS

    demo.add_argument("--scenario", choices=SCENARIOS, default="server-oom")
    demo.add_argument("--hang-timeout", type=_seconds("--hang-timeout"), default=20.0,
                      help="how long to let the job without healthkit hang (default 20 s)")
    doctor = sub.add_parser("doctor", help="what this machine supports and what healthkit uses")
    doctor.add_argument("--proc-root", default="/proc", help=argparse.SUPPRESS)
    doctor.add_argument("--cgroup-root", default="/sys/fs/cgroup", help=argparse.SUPPRESS)
    doctor.add_argument("--kmsg", default="/dev/kmsg", help=argparse.SUPPRESS)
    doctor.add_argument("--shm", default="/dev/shm", help=argparse.SUPPRESS)
    doctor.add_argument("--strict", action="store_true",
                        help="exit 1 on a warning too (default: only when something healthkit "
                        "needs is missing)")
    explain = sub.add_parser("explain", help="the diagnosis for an exit code seen in a log")
    explain.add_argument("exit_code", type=_return_code, metavar="CODE_OR_LINE",
                         help="e.g. -9, 137, 139, -7, 1 (0..255, or -N for signal N), or "
                         "torch's line \"DataLoader worker (pid N) is killed by signal: "
                         "Killed.\" (then the pid is read as --pid)")
    explain.add_argument("--pid", type=_pid("--pid"),
                         help="the pid, to read this machine's evidence (kernel OOM records)")
    explain.add_argument("--name", help="the process's name, for the message")
    stacks = sub.add_parser(
        "stacks",
        help="print the Python stacks of running helpers (those that opted in, e.g. with "
        "healthkit.record_exception)",
        description="Ask running processes for their Python stacks. Give a rank's pid to "
        "ask it and every process below it (its helpers); give none to ask every live "
        "process of this user that opted in. A process that did not opt in is never "
        "signalled (the signal would kill it). A pid given is always reported; of the "
        "processes below it, those that did not opt in are listed up to 10, then counted "
        "(so `stacks 1`, torchrun's agent as a container's first process, shows the job's "
        "helpers, not the machine).",
    )
    stacks.add_argument("pids", nargs="*", type=_pid("PID"), metavar="PID",
                        help="processes to ask, with their descendants")
    stacks.add_argument("--no-descendants", action="store_true",
                        help="ask only the pids given, not the processes below them")
    stacks.add_argument("--timeout", type=_seconds("--timeout"), default=2.0,
                        help="how long to wait for the answers (default 2 s)")
    stacks.add_argument("--dir", default=None,
                        help="the opt-in directory (default: $HEALTHKIT_RECORD_DIR, else "
                        "<tmp>/healthkit-<uid>)")
    args = parser.parse_args(argv)

    if args.command == "demo":
        from healthkit._tools.demo import run

        run(args.scenario, args.hang_timeout)
        return 0
    if args.command == "doctor":
        from healthkit._tools.doctor import report

        return report(sys.stdout, proc_root=args.proc_root, cgroup_root=args.cgroup_root,
                      kmsg_path=args.kmsg, shm_path=args.shm, strict=args.strict)
    if args.command == "stacks":
        if args.dir is not None and not os.path.isdir(args.dir):
            stacks.error(f"--dir {args.dir}: no such directory (the opt-in directory is "
                         "$HEALTHKIT_RECORD_DIR, else <tmp>/healthkit-<uid>)")
        return _print_stacks(args.pids or None, not args.no_descendants, args.dir,
                             args.timeout)
    from healthkit._diagnose.diagnosis import ExitDiagnoser

    code, line_pid = args.exit_code
    pid = args.pid if args.pid is not None else line_pid
    name = args.name or ("DataLoader worker" if line_pid is not None else None)
    # Without a pid, the code may come from another machine's log: this machine's cgroup,
    # kernel log and /dev/shm say nothing about it. A torch line names the worker's pid:
    # pasted here, it is read as this machine's.
    diagnoser = ExitDiagnoser(history=True, local_evidence=pid is not None)
    try:
        print(diagnoser.diagnose(code, pid=pid, name=name))
    finally:
        diagnoser.close()
    return 0


#: Of the processes below a pid given, at most this many that did not opt in are listed one
#: by one; the rest are counted (below pid 1 that would be the whole machine).
_LISTED_BELOW = 10


def _where(pid: int) -> str:
    """Each thread's state and blocked call from /proc, and whether the dump reached the
    process without interrupting it (a dumper thread) or on one of its own threads."""
    import signal

    from healthkit._diagnose.stacks import DUMPER_COMM
    from healthkit._os.proc import read_task_wait, read_threads
    from healthkit._progress import _describe_threads

    tasks = [t for t in read_task_wait(pid) or [] if t.comm != DUMPER_COMM]
    lines = [f"  {line}" for line in _describe_threads(tasks)]
    main = (read_threads(pid) or {}).get(pid)
    if main is not None and not (main[1] >> (signal.SIGUSR2 - 1)) & 1:
        lines.append(
            "  (answered on one of its own threads: a C call in sleep(), poll() or select() "
            "there may have returned early; healthkit.Heartbeat.attach() in the helper makes "
            "dumps quiet)"
        )
    return "".join(f"{line}\n" for line in lines)


def _print_stacks(pids: list[int] | None, descendants: bool, directory: str | None,
                  timeout: float) -> int:
    """Print each process's stacks; exit 1 when none answered (nothing to show)."""
    from healthkit._diagnose.stacks import dump_helper_stacks, is_opted_in
    from healthkit._os.proc import read_proc_stat
    from healthkit._os.userdir import record_dir

    directory = directory or record_dir()
    given = [p for p in dict.fromkeys(pids or ()) if p != os.getpid()]
    missing = [p for p in given if read_proc_stat(p) is None]
    for pid in missing:
        print(f"=== pid {pid}: no such process")
    if pids is not None and len(missing) == len(given):
        return 1
    alive = None if pids is None else [p for p in given if p not in missing]
    stacks = dump_helper_stacks(alive, below=descendants, directory=directory,
                                timeout=timeout)
    if not stacks:
        print(f"no running process has opted in to stack dumps in {directory}")
        return 1
    quiet_below: list[str] = []
    for pid, text in stacks.items():
        stat = read_proc_stat(pid)
        who = f"pid {pid}" + (f" ({stat.comm})" if stat is not None else " (gone)")
        if text is not None:
            print(f"=== {who}:\n{_where(pid)}{text.rstrip()}")
        elif is_opted_in(directory, pid):
            print(f"=== {who}: opted in, but did not answer within {timeout:g} s")
        elif pids is not None and pid not in given:
            quiet_below.append(who)  # below a pid given: listed after, up to a bound
        else:
            print(f"=== {who}: not opted in to stack dumps (healthkit.record_exception or "
                  "healthkit.lowlevel.enable_stack_dumps)")
    for who in quiet_below[:_LISTED_BELOW]:
        print(f"=== {who}: not opted in to stack dumps (healthkit.record_exception or "
              "healthkit.lowlevel.enable_stack_dumps)")
    if len(quiet_below) > _LISTED_BELOW:
        print(f"=== and {len(quiet_below) - _LISTED_BELOW} more processes below "
              f"{', '.join(map(str, given))} that did not opt in to stack dumps")
    return 0 if any(stacks.values()) else 1
