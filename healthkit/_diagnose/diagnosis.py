"""ExitDiagnoser and Diagnosis: turn "a process exited" into "what happened, why, what to do"."""

from __future__ import annotations

import enum
import os
import signal
import threading
import time
from typing import Any, Protocol

import attrs

from healthkit._diagnose.evidence import (
    KernelLog,
    KernelLogFollower,
    MemoryCgroup,
    OomKill,
    find_memory_cgroup,
    format_bytes,
    shm_usage,
)
from healthkit._diagnose.records import HelperException, find_record
from healthkit._diagnose.stacks import signalled_by_us
from healthkit._errors import (
    InvalidArgumentError,
    InvalidArgumentTypeError,
    check_bool,
    check_path,
    check_pid,
    path_arg,
)
from healthkit._os.proc import read_proc_stat
from healthkit._os.userdir import record_dir
from healthkit._watch.process import (
    UNKNOWN_NOT_PERMITTED,
    UNKNOWN_REAPED_ELSEWHERE,
    UNKNOWN_SIGCHLD_IGNORED,
    ExitStatus,
    ProcessWatch,
)

__all__ = ["Cause", "Diagnosis", "ExitDiagnoser"]

_NATIVE_CRASH = {
    signal.SIGSEGV: "a segmentation fault (SIGSEGV)",
    signal.SIGABRT: "an abort (SIGABRT), often a failed C++ assertion or uncaught C++ exception",
    signal.SIGFPE: "a floating-point exception (SIGFPE), e.g. an integer division by zero",
    signal.SIGILL: "an illegal instruction (SIGILL), often a binary built for another CPU",
    signal.SIGSYS: "a bad system call (SIGSYS), often a seccomp filter",
    signal.SIGTRAP: "a trap (SIGTRAP)",
    signal.SIGQUIT: "SIGQUIT",
}
_ASKED_TO_STOP = {
    signal.SIGTERM: "SIGTERM",
    signal.SIGINT: "SIGINT (Ctrl-C)",
    signal.SIGHUP: "SIGHUP (its terminal or session went away)",
}


def check_returncode(value: int, what: str = "exit code") -> int:
    """A return code as ``multiprocessing``/``subprocess`` report it: an exit status 0..255,
    or ``-N`` for death by signal N (1..64)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentTypeError(f"{what} must be an int, got {value!r}", what)
    if not -64 <= value <= 255:
        raise InvalidArgumentError(
            f"{value} is not a possible {what}: exit statuses are 0..255 "
            "(a shell shows death by signal N as 128+N) and a death by signal N is -N "
            "with N in 1..64",
            what,
        )
    return value


class Cause(enum.Enum):
    """The likely cause category of an exit."""

    CLEAN_EXIT = "clean exit"
    EARLY_EXIT = "returned early"  # exit 0 of a process declared to run until disarmed
    ERROR_EXIT = "error exit"
    OOM_KILLED = "killed by the OOM killer"
    SIGKILL_UNCONFIRMED = "killed by SIGKILL (OOM unconfirmed)"
    NATIVE_CRASH = "native crash"
    BUS_ERROR = "bus error (shared memory)"
    TERMINATED = "terminated or interrupted"
    STILL_RUNNING = "still running"
    STALLED = "stalled"  # alive, but no progress while progress was expected
    UNKNOWN = "unknown"


@attrs.frozen
class Diagnosis:
    """A structured account of how one process ended, and one line a person can act on.

    ``exit_code`` follows ``multiprocessing``'s ``exitcode``: ``-N`` means killed by signal
    N. An exit code of 128+N (a shell reporting that *its* child died of signal N) keeps the
    raw code here and sets ``signal`` to N.
    """

    name: str
    pid: int | None
    exit_code: int | None
    signal: signal.Signals | None
    cause: Cause
    what: str
    likely: str
    evidence: tuple[str, ...]
    hint: str
    observed_at: float
    observed_at_wall: float
    #: The Python exception the process raised out of its entry point, when it recorded
    #: one (:func:`healthkit.record_exception`): type, message, last frames, and the record
    #: file holding the full traceback.
    exception: HelperException | None = None
    #: Where the failure happened when it was not in this process's tree: another rank of
    #: the job (``node 1 rank 3 (host-b)``), as told by the job-wide notice.
    elsewhere: str | None = None
    #: Where a stalled process is stuck: its threads' Python stacks (and native frames when
    #: py-spy is installed), as text; printed after the line.
    stacks: str | None = None

    @property
    def abnormal(self) -> bool:
        """True for every ending except a clean exit and a process still running."""
        return self.cause not in (Cause.CLEAN_EXIT, Cause.STILL_RUNNING)

    @property
    def who(self) -> str:
        if self.pid is None or self.name == f"pid {self.pid}":
            return self.name
        return f"{self.name} (pid {self.pid})"

    def __str__(self) -> str:
        line = f"{self.who} {self.what}"
        if self.elsewhere:
            line = f"stopped because {self.elsewhere}: {line}"
        if self.likely:
            line += f": {self.likely}"
        if self.evidence:
            line += f" [{'; '.join(self.evidence)}]"
        if self.hint:
            line += f". {self.hint}"
        if self.stacks:
            line += "\n" + self.stacks.rstrip("\n")
        return line


# Why an exit status is unknown, by ``ExitStatus.source``: (likely cause, what to change).
_UNKNOWN_STATUS: dict[str, tuple[str, str]] = {
    UNKNOWN_REAPED_ELSEWHERE: (
        "it is this process's child, and something else reaped it (Popen.wait(), os.waitpid) "
        "before its exit status could be read",
        "Watch the Popen or Process object instead of its pid: healthkit then takes the code "
        "from it",
    ),
    UNKNOWN_SIGCHLD_IGNORED: (
        "SIGCHLD is set to SIG_IGN in this process, so the kernel reaped it at once and "
        "discarded its exit status (multiprocessing and subprocess cannot read it either)",
        "Restore the default SIGCHLD disposition (signal.signal(signal.SIGCHLD, "
        "signal.SIG_DFL)) to get exit codes",
    ),
    UNKNOWN_NOT_PERMITTED: (
        "it is not this process's child and belongs to another user; the kernel shows its "
        "exit status only to its parent, its user or a process with CAP_SYS_PTRACE",
        "Watch it from its parent process, or as the same user, to get the exit code",
    ),
    "": (
        "it is not this process's child and its parent reaped it before its exit status "
        "could be read",
        "Watch it from its parent process to get the exit code",
    ),
}


# Kernel printk time stamps (sched_clock) and process start times (boot time) come from
# clocks that agree on a machine that never suspends, to about a millisecond (printk ran
# 1.1-1.2 ms ahead on the machine the tests run on): allow a few.
_CLOCK_SKEW_US = 5_000
# A kernel record stamped this long after the death was observed is not about it.
_AFTER_DEATH_SLACK_US = 5_000_000


class ExitDiagnoser:
    """Explains exits, with OOM evidence taken relative to a baseline read at construction.

    Construct it when the run starts (before helpers can die): a rising cgroup ``oom_kill``
    counter then means "an OOM kill happened during this run". Each confirmed OOM kill in
    the counter explains at most one SIGKILL, so the second rank torn down by the launcher
    is not blamed on the same kill.
    """

    def __init__(
        self,
        *,
        proc_root: str = "/proc",
        cgroup_root: str = "/sys/fs/cgroup",
        kmsg_path: str | None = "/dev/kmsg",
        shm_path: str = "/dev/shm",
        cgroup: MemoryCgroup | None = None,
        history: bool = False,
        records: str | None = None,
        local_evidence: bool = True,
    ) -> None:
        """``cgroup`` names the memory cgroup whose OOM counter to watch; by default the
        one this process is in (from ``<proc_root>/self/cgroup`` under ``cgroup_root``).
        Give it when the watched processes live in another cgroup: on cgroup v1 the
        ``oom_kill`` counter counts only kills *in that very cgroup*, not in its children.
        ``kmsg_path=None`` disables the kernel-log evidence.

        ``history=True`` explains exits that happened *before* the diagnoser was built (an
        exit code read from a log): kernel-log records still buffered are read too, and the
        cgroup's lifetime ``oom_kill`` count is shown as evidence but confirms nothing (it
        may be about any process, at any time).

        ``records`` is the directory of the helpers' exception records (default:
        :func:`healthkit.record_dir`, the one :func:`healthkit.record_exception` writes to).

        ``local_evidence=False`` reads nothing of this machine (no kernel log, cgroup,
        ``/dev/shm`` or records): for an exit code copied from another machine's log.
        """
        proc_root = path_arg(proc_root, "proc_root")
        cgroup_root = path_arg(cgroup_root, "cgroup_root")
        shm_path = path_arg(shm_path, "shm_path")
        kmsg_path = check_path(kmsg_path, "kmsg_path", allow_none=True)
        if kmsg_path is not None and kmsg_path != "/dev/kmsg" and not os.path.exists(kmsg_path):
            # The default may be missing (a container without /dev/kmsg) and is then named
            # in the evidence; a path given by hand that does not exist is a typo.
            raise InvalidArgumentError(
                f"kmsg_path {kmsg_path!r} does not exist: give the kernel log's path "
                "(/dev/kmsg), a file of its records, or None for no kernel-log evidence",
                "kmsg_path",
            )
        records = check_path(records, "records", allow_none=True)
        if cgroup is not None and not isinstance(cgroup, MemoryCgroup):
            raise InvalidArgumentTypeError(
                f"cgroup must be a healthkit.lowlevel.MemoryCgroup (or None), got "
                f"{cgroup!r}",
                "cgroup",
            )
        check_bool(history, "history")
        check_bool(local_evidence, "local_evidence")
        self._lock = threading.Lock()
        self._shm_path = shm_path
        self._proc_root = proc_root
        self.local_evidence = local_evidence
        if not local_evidence:
            cgroup, kmsg_path = None, None
        self.cgroup: MemoryCgroup | None = (
            cgroup
            if cgroup is not None or not local_evidence
            else find_memory_cgroup(proc_root=proc_root, cgroup_root=cgroup_root)
        )
        self.history = history
        self.records: str | None = (records or record_dir()) if local_evidence else None
        self._oom_baseline = self.cgroup.oom_kills() if self.cgroup and not history else None
        self._oom_explained = 0
        self.kernel_log = KernelLog(kmsg_path) if kmsg_path else None
        self._kmsg = (
            KernelLogFollower(kmsg_path, from_start=history) if kmsg_path else None
        )

    def _settings(self) -> dict[str, Any]:
        """What the sidecar needs to build this diagnoser again in its own process (JSON):
        every setting, the cgroup as resolved here, and the OOM counter's baseline, so that
        "during this run" means the same run there."""
        cg = self.cgroup
        with self._lock:
            explained = self._oom_explained
        return {
            "proc_root": self._proc_root,
            "kmsg_path": self.kernel_log.path if self.kernel_log is not None else None,
            "shm_path": self._shm_path,
            "cgroup": None if cg is None else {"version": cg.version, "path": cg.path,
                                               "root": cg.root},
            "history": self.history,
            "records": self.records,
            "local_evidence": self.local_evidence,
            "oom_baseline": self._oom_baseline,
            "oom_explained": explained,
        }

    @classmethod
    def _from_settings(cls, settings: dict[str, Any]) -> ExitDiagnoser:
        """The diagnoser :meth:`_settings` describes (in the sidecar)."""
        cg = settings["cgroup"]
        diagnoser = cls(
            proc_root=settings["proc_root"],
            kmsg_path=settings["kmsg_path"],
            shm_path=settings["shm_path"],
            cgroup=MemoryCgroup(int(cg["version"]), cg["path"], cg["root"]) if cg else None,
            history=bool(settings["history"]),
            records=settings["records"],
            local_evidence=bool(settings["local_evidence"]),
        )
        if cg is None:
            diagnoser.cgroup = None  # none was found or used there: do not look for one here
        diagnoser._oom_baseline = settings["oom_baseline"]
        diagnoser._oom_explained = int(settings["oom_explained"])
        return diagnoser

    def close(self) -> None:
        """Release the kernel-log fd. Idempotent; also done when the object is collected."""
        if self._kmsg is not None:
            self._kmsg.close()

    def diagnose(
        self,
        subject: ProcessWatch | ExitStatus | int | None,
        *,
        name: str | None = None,
        pid: int | None = None,
        peak_rss_bytes: int | None = None,
        evidence: bool = True,
        start_time: int | None = None,
    ) -> Diagnosis:
        """Diagnose a watch, an :class:`ExitStatus`, or a bare return code.

        ``None`` (or a watch whose process still runs) gives ``Cause.STILL_RUNNING``. For a
        watch, ``name``/``pid``/``start_time``/peak RSS default to the watch's own.
        ``start_time`` (``/proc/<pid>/stat`` field 22, clock ticks since boot) identifies the
        process behind ``pid``: without it, no kernel-log record and no exception record can
        be told apart from those of an earlier process with the same pid, so none is used.

        ``evidence=False`` reads nothing (no kernel log, cgroup, ``/dev/shm``, exception or
        stack-dump records): the brief diagnosis a watchdog acts on at once, from the exit
        status alone. A SIGKILL is then ``SIGKILL_UNCONFIRMED`` until the full diagnosis.
        """
        status: ExitStatus | None
        identity: int | None = None
        if isinstance(subject, ProcessWatch):
            status = subject.poll() if not subject.closed else subject.status
            name = name or subject.name
            if pid is None or pid == subject.pid:
                if start_time is None or start_time == subject.start_time:
                    identity = subject._identity
                start_time = start_time if start_time is not None else subject.start_time
            pid = pid if pid is not None else subject.pid
            peak_rss_bytes = peak_rss_bytes or subject.peak_rss_bytes
        elif isinstance(subject, int) and not isinstance(subject, bool):
            status = ExitStatus(check_returncode(subject), "given")
        elif isinstance(subject, ExitStatus) or subject is None:
            status = subject
        else:
            raise InvalidArgumentTypeError(
                "diagnose() takes a ProcessWatch, an ExitStatus, a return code (int) or None, "
                f"got {type(subject).__name__}",
                "subject",
            )
        if pid is not None:
            check_pid(pid)
        if name is not None and not isinstance(name, str):
            raise InvalidArgumentTypeError(
                f"name must be a str (the process's name in the line) or None, got {name!r}",
                "name",
            )
        if start_time is not None:
            if isinstance(start_time, bool) or not isinstance(start_time, int):
                raise InvalidArgumentTypeError(
                    "start_time must be a process start time in clock ticks since boot (an "
                    f"int, /proc/<pid>/stat field 22), got {start_time!r}",
                    "start_time",
                )
            if start_time < 0:
                raise InvalidArgumentError(
                    f"start_time must be >= 0 (clock ticks since boot), got {start_time}",
                    "start_time",
                )
        diagnosis = self._diagnose(status, name, pid, start_time, peak_rss_bytes, evidence)
        if evidence and diagnosis.abnormal and pid is not None and start_time is not None:
            found = (
                find_record(pid, start_time, self.records, identity=identity)
                if self.records
                else None
            )
            if found is not None:
                diagnosis = _with_exception(diagnosis, found)
        return diagnosis

    def _diagnose(
        self,
        status: ExitStatus | None,
        name: str | None,
        pid: int | None,
        start_time: int | None,
        peak_rss_bytes: int | None,
        evidence: bool,
    ) -> Diagnosis:
        name = name or (f"pid {pid}" if pid is not None else "process")
        observed = (time.monotonic(), time.time()) if status is None else (
            status.observed_at,
            status.observed_at_wall,
        )

        def make(
            cause: Cause,
            what: str,
            likely: str = "",
            hint: str = "",
            evidence: tuple[str, ...] = (),
            sig: signal.Signals | None = None,
        ) -> Diagnosis:
            return Diagnosis(
                name=name,
                pid=pid,
                exit_code=None if status is None else status.returncode,
                signal=sig,
                cause=cause,
                what=what,
                likely=likely,
                evidence=evidence,
                hint=hint,
                observed_at=observed[0],
                observed_at_wall=observed[1],
            )

        if status is None:
            return make(Cause.STILL_RUNNING, "is still running")
        rc = status.returncode
        if rc is None:
            likely, hint = _UNKNOWN_STATUS.get(status.source, _UNKNOWN_STATUS[""])
            return make(
                Cause.UNKNOWN,
                "exited with an unknown status",
                likely,
                hint,
                evidence=(f"source: {status.source}",),
            )
        if rc == 0:
            return make(Cause.CLEAN_EXIT, "exited cleanly (exit code 0)")
        found: list[str] = []
        sig: signal.Signals | None = None
        how = ""
        if rc < 0:
            sig = status.signal
            how = "was killed by"
        elif 128 < rc <= 128 + 64:
            try:
                sig = signal.Signals(rc - 128)
            except ValueError:
                sig = None
            if sig is not None:
                how = f"exited with code {rc}, the shell convention 128+{rc - 128} for death by"
        if sig is None:
            if rc < 0:
                return make(Cause.UNKNOWN, f"was killed by signal {-rc}", sig=None)
            likely = (
                "1 is the generic failure code: an uncaught Python exception gives it (then "
                "its traceback is in that process's stderr), and so do sys.exit(1) and many "
                "programs' own error paths"
                if rc == 1
                else "the process reported an error"
            )
            return make(
                Cause.ERROR_EXIT,
                f"exited with code {rc}",
                likely,
                "Read that process's own log or stderr for the error it reported, or wrap "
                "its entry point in healthkit.record_exception to have it named here",
            )
        if status.core_dumped:
            found.append("core dumped")
        if sig == signal.SIGKILL and not evidence:
            return make(
                Cause.SIGKILL_UNCONFIRMED,
                f"{how} SIGKILL",
                "not yet explained: the OOM evidence is read after the first actions run",
                sig=signal.SIGKILL,
            )
        if sig == signal.SIGKILL:
            return self._sigkill(
                make, how, pid, start_time, observed[0], peak_rss_bytes, found
            )
        if evidence and signalled_by_us(pid, sig):
            return make(
                Cause.UNKNOWN,
                f"{how} {sig.name}",
                f"healthkit's own stack-dump request ({sig.name}) ended it: the process "
                "no longer handled that signal when it arrived (most often it was already "
                "exiting)",
                "Look at what it was doing before that (its log); the stack-dump request "
                "only ended a process that was already stuck or leaving",
                tuple(found),
                sig,
            )
        if sig in _NATIVE_CRASH:
            return make(
                Cause.NATIVE_CRASH,
                f"{how} {sig.name}",
                f"a crash in native code: {_NATIVE_CRASH[sig]}",
                "Enable faulthandler in that process (PYTHONFAULTHANDLER=1 or "
                "faulthandler.enable()) to print the crashing stack, and check that native "
                "extensions match the installed torch/numpy versions",
                tuple(found),
                sig,
            )
        if sig == signal.SIGBUS:
            return self._sigbus(make, how, found, evidence)
        if sig in _ASKED_TO_STOP:
            return make(
                Cause.TERMINATED,
                f"{how} {_ASKED_TO_STOP[sig]}",
                "something asked it to stop: a launcher tearing the job down, a scheduler "
                "preempting it, or a person",
                "If nobody meant to stop it, look for who sent the signal (launcher or "
                "scheduler logs)",
                tuple(found),
                sig,
            )
        return make(
            Cause.UNKNOWN,
            f"{how} {sig.name}",
            "a signal with no common cause in data pipelines"
            + ("; SIGPIPE means it wrote to a closed pipe or socket" if sig == signal.SIGPIPE
               else ""),
            "Find out which process sends it that signal",
            tuple(found),
            sig,
        )

    def _sigbus(self, make: _Make, how: str, found: list[str], evidence: bool) -> Diagnosis:
        shm = shm_usage(self._shm_path) if evidence and self.local_evidence else None
        fix_shm = (
            "Raise /dev/shm (docker --shm-size, Kubernetes emptyDir medium: Memory) or "
            "move less data through shared memory (fewer workers or smaller batches)"
        )
        if shm is not None:
            found.append(
                f"{self._shm_path}: {format_bytes(shm.free_bytes)} free of "
                f"{format_bytes(shm.total_bytes)} now (statvfs)"
            )
        if shm is not None and shm.total_bytes and shm.free_bytes >= shm.total_bytes // 10:
            # Room now does not prove there was room then (a dead helper's segments may
            # have been freed), so both stay on the table, the other causes named.
            return make(
                Cause.BUS_ERROR,
                f"{how} SIGBUS",
                f"a bus error; {self._shm_path} has room now, so either it was full only "
                "at that moment (freed since) or the cause is another: a memory-mapped file "
                "truncated under it, a hardware memory error, or a misaligned access",
                "Raise /dev/shm if its use peaks with the load (docker --shm-size, Kubernetes "
                "emptyDir medium: Memory) or move less data through shared memory; if it "
                "never fills, look for a file mapped with mmap that something truncates, and "
                "for memory errors in the kernel log (dmesg)",
                tuple(found),
                signal.SIGBUS,
            )
        return make(
            Cause.BUS_ERROR,
            f"{how} SIGBUS",
            "a bus error, most often shared memory (/dev/shm) exhausted by tensors passed "
            "between processes",
            fix_shm,
            tuple(found),
            signal.SIGBUS,
        )

    def _sigkill(
        self,
        make: _Make,
        how: str,
        pid: int | None,
        start_time: int | None,
        observed: float,
        peak_rss_bytes: int | None,
        evidence: list[str],
    ) -> Diagnosis:
        confirmed = False
        kill: OomKill | None = None
        if self._kmsg is not None and pid is not None:
            kills = self._kmsg.oom_kills(pid) or []
            comm = self._comm(pid, start_time) if kills else None
            ours = [k for k in kills if _is_this_process(k, start_time, comm, observed)]
            if ours:
                kill = ours[-1]
                confirmed = True
                evidence.append(f"kernel log: {kill.message.strip()[:200]}")
                evidence.extend(_kill_figures(kill))
            elif kills:
                evidence.append(_not_this_process(kills[-1], start_time, comm))
        cg = self.cgroup
        if cg is not None:
            now = cg.oom_kills()
            where = f"cgroup {cg.name} (v{cg.version})"
            counted = False
            if now is not None and self._oom_baseline is not None:
                with self._lock:
                    delta = now - self._oom_baseline - self._oom_explained
                    # A kill counted by the cgroup explains one SIGKILL. A kill confirmed
                    # only by the kernel log, with no unexplained count left, used none of
                    # the counter and must not use up a later kill's count.
                    if delta > 0:
                        self._oom_explained += 1
                if delta > 0:
                    confirmed = counted = True
                    evidence.append(
                        f"{where}: oom_kill {self._oom_baseline} -> {now} during this run "
                        f"({cg.counter_file})"
                    )
            elif self.history and now:
                evidence.append(
                    f"{where}: oom_kill {now} since the cgroup was created "
                    f"({cg.counter_file}; not necessarily this process)"
                )
            if kill is None or kill.cgroup_limit is None or counted:
                figures = _cgroup_figures(cg)
                if figures is not None:
                    evidence.append(figures)
        if peak_rss_bytes is not None:
            evidence.append(f"its peak RSS {format_bytes(peak_rss_bytes)} (sampled VmHWM)")
        fix = (
            "Lower its memory use (fewer DataLoader/sampling workers, smaller batches or "
            "buffers) or raise the memory limit"
        )
        if confirmed:
            return make(
                Cause.OOM_KILLED,
                f"{how} SIGKILL",
                "the kernel's OOM killer (confirmed)",
                fix,
                tuple(evidence),
                signal.SIGKILL,
            )
        if not self.local_evidence:
            return make(
                Cause.SIGKILL_UNCONFIRMED,
                f"{how} SIGKILL",
                "possibly the OOM killer, unconfirmed (from the exit code alone: no evidence "
                "of this machine was read)",
                "If nobody killed it by hand, suspect memory: " + fix[0].lower() + fix[1:]
                + ". On the machine where it ran, `healthkit explain CODE --pid PID` looks "
                "for its kernel OOM record",
                tuple(evidence),
                signal.SIGKILL,
            )
        if self._kmsg is None or not self._kmsg.readable:
            evidence.append("kernel log not readable")
        if cg is None:
            evidence.append("no memory cgroup counter readable")
        return make(
            Cause.SIGKILL_UNCONFIRMED,
            f"{how} SIGKILL",
            "possibly the OOM killer, unconfirmed (no OOM record for it)",
            "If nobody killed it by hand, suspect memory: " + fix[0].lower() + fix[1:],
            tuple(evidence),
            signal.SIGKILL,
        )

    def _comm(self, pid: int, start_time: int | None) -> str | None:
        """The dead process's command name while it is still a zombie (then the pid is
        still its own, proven by the start time), else ``None``."""
        if start_time is None:
            return None
        stat = read_proc_stat(pid, self._proc_root)
        if stat is None or stat.start_time != start_time:
            return None
        return stat.comm


def _start_usec(start_time: int) -> int:
    return start_time * 1_000_000 // os.sysconf("SC_CLK_TCK")


def _when(kill: OomKill, start_time: int) -> str:
    """When a kernel record was stamped relative to the start of the process that started
    at ``start_time``: ``"before"``, ``"after"``, or ``"same tick"``. A start time counts
    whole clock ticks (10 ms), rounded down: the process started somewhere in that tick,
    so a record stamped within it may be about an earlier process with the same pid (a
    pid reused within a few ms of an OOM kill) as well as about this one."""
    start = _start_usec(start_time)
    if kill.usec < start - _CLOCK_SKEW_US:
        return "before"
    if kill.usec < start + 1_000_000 // os.sysconf("SC_CLK_TCK") + _CLOCK_SKEW_US:
        return "same tick"
    return "after"


def _is_this_process(
    kill: OomKill, start_time: int | None, comm: str | None, observed: float
) -> bool:
    """Whether a kernel OOM record is about the process that started at ``start_time``:
    logged surely after it started (an earlier record is about an earlier owner of the
    pid; one within its start's clock tick may be), not long after its death was seen, and
    naming its command when that is known."""
    if start_time is None:
        return False
    if _when(kill, start_time) != "after":
        return False
    if kill.usec > observed * 1_000_000 + _AFTER_DEATH_SLACK_US:
        return False
    return comm is None or kill.comm[:15] == comm[:15]


def _not_this_process(kill: OomKill, start_time: int | None, comm: str | None) -> str:
    at = f"{kill.usec / 1e6:.1f} s after boot"
    head = f"kernel log: an OOM kill of pid {kill.pid} ({kill.comm}) at {at}"
    if start_time is None:
        return head + ", not taken as this process's: its start time is unknown here"
    started = _start_usec(start_time) / 1e6
    when = _when(kill, start_time)
    if when == "before":
        return head + f", before this process started ({started:.1f} s): an earlier " \
            "process with the same pid"
    if when == "same tick":
        return head + f", within the clock tick this process started in ({started:.1f} s): " \
            "it may be an earlier process with the same pid, so it confirms nothing"
    if comm is not None and kill.comm[:15] != comm[:15]:
        return head + f", but this process is {comm!r}: another process with the same pid"
    return head + ", after this death was seen: another process with the same pid"


def _kill_figures(kill: OomKill) -> list[str]:
    """The kernel report's own figures: the victim's RSS and the cgroup whose limit it hit."""
    lines = []
    if kill.anon_rss is not None and kill.file_rss is not None and kill.shmem_rss is not None:
        lines.append(
            f"its memory at the kill {format_bytes(kill.anon_rss + kill.file_rss + kill.shmem_rss)}"
            f" resident: {format_bytes(kill.anon_rss)} anon, {format_bytes(kill.file_rss)} "
            f"file, {format_bytes(kill.shmem_rss)} shmem (kernel log)"
        )
    if kill.constraint == "CONSTRAINT_MEMCG" and kill.oom_memcg:
        line = f"the limit hit: memory cgroup {kill.oom_memcg}"
        if kill.cgroup_usage is not None and kill.cgroup_limit is not None:
            line += (
                f" at {format_bytes(kill.cgroup_usage)} of its "
                f"{format_bytes(kill.cgroup_limit)} limit"
            )
            if kill.cgroup_rss is not None:
                line += f", {format_bytes(kill.cgroup_rss)} of it RSS"
                if kill.cgroup_cache is not None:
                    line += f" and {format_bytes(kill.cgroup_cache)} page cache"
        lines.append(line + " (kernel log)")
    elif kill.constraint == "CONSTRAINT_NONE":
        lines.append(
            "no cgroup limit was hit: the whole machine ran out of memory (kernel log, "
            "CONSTRAINT_NONE)"
        )
    elif kill.constraint:
        lines.append(f"the OOM was constrained by {kill.constraint} (kernel log)")
    return lines


def _cgroup_figures(cg: MemoryCgroup) -> str | None:
    """The cgroup's own figures, labelled as the cgroup's: its limit, and memory that
    excludes page cache where the files tell it apart. Left out (``None``) when the cgroup
    has no limit: its lifetime peak (page cache included) would then read as the helper's."""
    limit = cg.effective_limit_bytes()
    if limit is None:
        return None
    where = f"cgroup {cg.name} (v{cg.version})"
    stat = cg.stat()
    if cg.version == 1:
        rss, cache = stat.get("total_rss"), stat.get("total_cache")
        line = f"{where}: limit {format_bytes(limit)}"
        if rss is not None and cache is not None:
            line += (
                f"; after its death the cgroup holds {format_bytes(rss)} RSS and "
                f"{format_bytes(cache)} page cache (memory.stat)"
            )
        else:
            line += " (memory.stat)"
        return line
    line = f"{where}: limit {format_bytes(limit)}"
    peak = cg.peak_bytes()
    if peak is not None:
        line += f", peak use {format_bytes(peak)} (memory.peak, page cache included)"
    reached = cg.limit_reached()
    if reached:
        line += f"; use reached the limit {reached} times (memory.events max)"
    anon, file = stat.get("anon"), stat.get("file")
    if anon is not None and file is not None:
        line += (
            f"; after its death the cgroup holds {format_bytes(anon)} anon and "
            f"{format_bytes(file)} page cache (memory.stat)"
        )
    return line


def _with_exception(diagnosis: Diagnosis, exc: HelperException) -> Diagnosis:
    """Carry the helper's own exception: the cause of an error exit; evidence otherwise."""
    where = f" at {exc.where}" if exc.where else ""
    record = f"exception record {exc.path} (the full traceback)"
    extra: tuple[str, ...] = ()
    if exc.peak_rss_bytes is not None and exc.type == "MemoryError":
        extra = (
            f"its peak RSS {format_bytes(exc.peak_rss_bytes)} when it raised (VmHWM, "
            "exception record)",
        )
    if exc.type == "KeyboardInterrupt" and not exc.context:
        if diagnosis.cause in (Cause.ERROR_EXIT, Cause.UNKNOWN) and diagnosis.signal is None:
            return attrs.evolve(
                diagnosis,
                exception=exc,
                likely=f"it was interrupted: KeyboardInterrupt{where}. {INTERRUPT_LIKELY}",
                evidence=(record, *diagnosis.evidence),
                hint=INTERRUPT_HINT,
            )
    if exc.exit_call is not None:
        hint = (
            "Fix what it reported when it called sys.exit (its message, also in that "
            "process's stderr); where it called it is in the exception record"
        )
    else:
        hint = (
            "Fix the cause of that exception; its full traceback is in the exception record "
            "and in that process's stderr"
        )
    if diagnosis.cause in (Cause.ERROR_EXIT, Cause.UNKNOWN) and diagnosis.signal is None:
        return attrs.evolve(
            diagnosis,
            exception=exc,
            likely=f"it {exc.described}{where}",
            evidence=(record, *extra, *diagnosis.evidence),
            hint=hint,
        )
    if diagnosis.cause is Cause.EARLY_EXIT:
        # Exit 0 with an exception in another thread or an atexit callback: that exception
        # is most likely why it stopped doing its work.
        return attrs.evolve(
            diagnosis,
            exception=exc,
            likely=f"it {exc.described}{where}, then returned; so whoever depends on it "
            "will wait forever",
            evidence=(record, *extra, *diagnosis.evidence),
            hint=hint,
        )
    return attrs.evolve(
        diagnosis,
        exception=exc,
        evidence=(
            *diagnosis.evidence,
            f"it had {exc.described}{where} before it ended ({record})",
            *extra,
        ),
    )


#: Why a helper gets its owner's interrupt, and what to do about it.
INTERRUPT_LIKELY = (
    "A SIGINT reached it: Ctrl-C in a terminal and a notebook's \"Interrupt kernel\" signal "
    "the whole process group, helpers included"
)
INTERRUPT_HINT = (
    "To keep a helper running when its owner is interrupted, ignore SIGINT in it "
    "(signal.signal(signal.SIGINT, signal.SIG_IGN) first thing in its target) or start it "
    "in a session of its own"
)


def interrupted_wording(diagnosis: Diagnosis, ago: float) -> Diagnosis:
    """A death seen ``ago`` seconds after an interrupt (SIGINT) reached the owner's process
    group, in an interactive shell (which an interrupt never stops): it may be its share of
    that interrupt. An exit code 1 with no record may be either, and says so; a record
    (:func:`healthkit.record_exception`) tells which."""
    seen = f"a SIGINT reached this process group {max(0.0, ago):.2f}s before it ended"
    if (
        diagnosis.cause is Cause.ERROR_EXIT
        and diagnosis.exception is None
        and diagnosis.exit_code == 1
    ):
        return attrs.evolve(
            diagnosis,
            likely=f"{diagnosis.likely}; and {seen}: a KeyboardInterrupt ends a Python helper "
            "with code 1 too (Ctrl-C in a terminal and a notebook's \"Interrupt kernel\" "
            "signal the whole process group, helpers included)",
            hint=f"If it was the interrupt: {INTERRUPT_HINT[0].lower()}{INTERRUPT_HINT[1:]}. "
            "Otherwise read that process's stderr for its error, or wrap its entry point in "
            "healthkit.record_exception to have it named here",
        )
    return attrs.evolve(diagnosis, evidence=(*diagnosis.evidence, seen))


def with_exception_record(
    diagnosis: Diagnosis,
    diagnoser: ExitDiagnoser,
    start_time: int | None,
    identity: int | None = None,
) -> Diagnosis:
    """``diagnosis`` with its process's exception record, if it wrote one: for a diagnosis
    made abnormal after :meth:`ExitDiagnoser.diagnose` (an exit 0 that "returned early"),
    which looks up records for abnormal exits only."""
    if diagnosis.exception is not None or diagnosis.pid is None or start_time is None:
        return diagnosis
    if not diagnoser.records:
        return diagnosis
    found = find_record(diagnosis.pid, start_time, diagnoser.records, identity=identity)
    return _with_exception(diagnosis, found) if found is not None else diagnosis


class _Make(Protocol):
    """The signature of ``diagnose``'s local ``make`` helper."""

    def __call__(
        self,
        cause: Cause,
        what: str,
        likely: str = "",
        hint: str = "",
        evidence: tuple[str, ...] = (),
        sig: signal.Signals | None = None,
    ) -> Diagnosis: ...


def returned_early(diagnosis: Diagnosis) -> Diagnosis:
    """Reword an exit 0 of a process that was declared to run until disarmed.

    Its own cause, counted as abnormal: an action that filters on ``abnormal`` must not
    skip it, and the error file must not call it a clean exit.
    """
    return attrs.evolve(
        diagnosis,
        cause=Cause.EARLY_EXIT,
        what="exited with code 0 while it was expected to run until disarmed",
        likely="it returned early, so whoever depends on it will wait forever",
        hint="Check its log for why it stopped; if finishing is normal for it, watch it "
        'with on_clean_exit="ignore"',
    )
