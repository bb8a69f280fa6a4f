"""ExitDiagnoser and Diagnosis: turn "a process exited" into "what happened, why, what to do"."""

from __future__ import annotations

import enum
import signal
import threading
import time
from typing import Protocol

import attrs

from healthkit._errors import InvalidArgumentError, InvalidArgumentTypeError, check_pid
from healthkit._evidence import (
    KernelLog,
    KernelLogFollower,
    MemoryCgroup,
    find_memory_cgroup,
    format_bytes,
    shm_usage,
)
from healthkit._stacks import signalled_by_us
from healthkit._watch import (
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
        if self.likely:
            line += f": {self.likely}"
        if self.evidence:
            line += f" [{'; '.join(self.evidence)}]"
        if self.hint:
            line += f". {self.hint}"
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
    ) -> None:
        """``cgroup`` names the memory cgroup whose OOM counter to watch; by default the
        one this process is in (from ``<proc_root>/self/cgroup`` under ``cgroup_root``).
        Give it when the watched processes live in another cgroup: on cgroup v1 the
        ``oom_kill`` counter counts only kills *in that very cgroup*, not in its children.
        ``kmsg_path=None`` disables the kernel-log evidence.

        ``history=True`` explains exits that happened *before* the diagnoser was built (an
        exit code read from a log): every kernel-log record still buffered may confirm an
        OOM kill of the pid, and the cgroup's lifetime ``oom_kill`` count is shown as
        evidence but confirms nothing (it may be about any process, at any time)."""
        self._lock = threading.Lock()
        self._shm_path = shm_path
        self.cgroup: MemoryCgroup | None = (
            cgroup
            if cgroup is not None
            else find_memory_cgroup(proc_root=proc_root, cgroup_root=cgroup_root)
        )
        self.history = history
        self._oom_baseline = self.cgroup.oom_kills() if self.cgroup and not history else None
        self._oom_explained = 0
        self.kernel_log = KernelLog(kmsg_path) if kmsg_path else None
        self._kmsg = (
            KernelLogFollower(kmsg_path, from_start=history) if kmsg_path else None
        )

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
    ) -> Diagnosis:
        """Diagnose a watch, an :class:`ExitStatus`, or a bare return code.

        ``None`` (or a watch whose process still runs) gives ``Cause.STILL_RUNNING``. For a
        watch, ``name``/``pid``/peak RSS default to the watch's own.

        ``evidence=False`` reads nothing (no kernel log, cgroup, ``/dev/shm`` or stack-dump
        records): the brief diagnosis a watchdog acts on at once, from the exit status
        alone. A SIGKILL is then ``SIGKILL_UNCONFIRMED`` until the full diagnosis.
        """
        status: ExitStatus | None
        if isinstance(subject, ProcessWatch):
            status = subject.poll() if not subject.closed else subject.status
            name = name or subject.name
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
                "Read that process's own log or stderr for the error it reported",
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
            return self._sigkill(make, how, pid, peak_rss_bytes, found)
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
            shm = shm_usage(self._shm_path) if evidence else None
            if shm is not None:
                found.append(
                    f"{self._shm_path}: {format_bytes(shm.free_bytes)} free of "
                    f"{format_bytes(shm.total_bytes)}"
                )
            return make(
                Cause.BUS_ERROR,
                f"{how} SIGBUS",
                "a bus error, most often shared memory (/dev/shm) exhausted by tensors passed "
                "between processes",
                "Raise /dev/shm (docker --shm-size, Kubernetes emptyDir medium: Memory) or "
                "move less data through shared memory (fewer workers or smaller batches)",
                tuple(found),
                sig,
            )
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

    def _sigkill(
        self,
        make: _Make,
        how: str,
        pid: int | None,
        peak_rss_bytes: int | None,
        evidence: list[str],
    ) -> Diagnosis:
        confirmed = False
        if self._kmsg is not None and pid is not None:
            lines = self._kmsg.oom_kill_lines(pid)
            if lines:
                confirmed = True
                evidence.append(f"kernel log: {lines[-1].strip()[:200]}")
        cg = self.cgroup
        if cg is not None:
            now = cg.oom_kills()
            if now is not None and self._oom_baseline is not None:
                with self._lock:
                    delta = now - self._oom_baseline - self._oom_explained
                    # A kill counted by the cgroup explains one SIGKILL. A kill confirmed
                    # only by the kernel log, with no unexplained count left, used none of
                    # the counter and must not use up a later kill's count.
                    if delta > 0:
                        self._oom_explained += 1
                if delta > 0:
                    confirmed = True
                    evidence.append(
                        f"cgroup v{cg.version} {cg.counter_file} oom_kill "
                        f"{self._oom_baseline} -> {now} during this run"
                    )
            elif self.history and now:
                evidence.append(
                    f"cgroup v{cg.version} {cg.counter_file} oom_kill {now} since the cgroup "
                    "was created (not necessarily this process)"
                )
            peak, limit = cg.peak_bytes(), cg.limit_bytes()
            if peak is not None:
                evidence.append(
                    f"cgroup memory peak {format_bytes(peak)}"
                    + (f" of limit {format_bytes(limit)}" if limit is not None else "")
                )
        if peak_rss_bytes is not None:
            evidence.append(f"its peak RSS {format_bytes(peak_rss_bytes)}")
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
