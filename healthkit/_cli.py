"""The ``healthkit`` command: demo, doctor, explain."""

from __future__ import annotations

import argparse
import sys

from healthkit._errors import HealthkitError, check_bound, check_pid
from healthkit._version import __version__


def _positive_seconds(text: str) -> float:
    try:
        return check_bound(float(text), "--hang-timeout")
    except (ValueError, HealthkitError) as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _return_code(text: str) -> int:
    from healthkit._diagnosis import check_returncode

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    try:
        return check_returncode(value, "exit status")
    except HealthkitError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _pid(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    try:
        return check_pid(value, "--pid")
    except HealthkitError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


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
    from healthkit._demo import SCENARIOS

    demo.add_argument("--scenario", choices=SCENARIOS, default="server-oom")
    demo.add_argument("--hang-timeout", type=_positive_seconds, default=20.0,
                      help="how long to let the job without healthkit hang (default 20 s)")
    doctor = sub.add_parser("doctor", help="what this machine supports and what healthkit uses")
    doctor.add_argument("--proc-root", default="/proc", help=argparse.SUPPRESS)
    doctor.add_argument("--cgroup-root", default="/sys/fs/cgroup", help=argparse.SUPPRESS)
    doctor.add_argument("--kmsg", default="/dev/kmsg", help=argparse.SUPPRESS)
    doctor.add_argument("--shm", default="/dev/shm", help=argparse.SUPPRESS)
    explain = sub.add_parser("explain", help="the diagnosis for an exit code seen in a log")
    explain.add_argument("exit_code", type=_return_code,
                         help="e.g. -9, 137, 139, -7, 1 (0..255, or -N for signal N)")
    explain.add_argument("--pid", type=_pid, help="the pid, to look for kernel OOM records")
    explain.add_argument("--name", help="the process's name, for the message")
    args = parser.parse_args(argv)

    if args.command == "demo":
        from healthkit._demo import run

        run(args.scenario, args.hang_timeout)
        return 0
    if args.command == "doctor":
        from healthkit._doctor import report

        return report(sys.stdout, proc_root=args.proc_root, cgroup_root=args.cgroup_root,
                      kmsg_path=args.kmsg, shm_path=args.shm)
    from healthkit._diagnosis import ExitDiagnoser

    diagnoser = ExitDiagnoser(history=True)
    print(diagnoser.diagnose(args.exit_code, pid=args.pid, name=args.name))
    return 0
