"""What a watchdog does when a watched process dies: small composable action objects.

Each action receives one :class:`FailureEvent`. The watchdog runs its actions in order,
once, and an action that raises does not stop the ones after it (the exit must happen even
if the log handler is broken).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import attrs

from healthkit import _jobnotice
from healthkit._diagnose.diagnosis import Cause, Diagnosis
from healthkit._errors import (
    InvalidArgumentError,
    InvalidArgumentTypeError,
    ProcessDiedError,
    UsageError,
    check_bool,
    check_exit_code,
    check_int,
    check_path,
    check_pid,
    check_str,
)
from healthkit._os.safefile import UnsafePathError, write_file
from healthkit._watch.stopsignals import STOP_SIGNALS, witness_pid

__all__ = [
    "Action",
    "FailureEvent",
    "default_actions",
    "exit_process",
    "interactive_shell",
    "log_diagnosis",
    "raise_in_cell",
    "raise_in_main_thread",
    "write_torchelastic_error_file",
]

logger = logging.getLogger("healthkit")

TORCHELASTIC_ERROR_FILE = "TORCHELASTIC_ERROR_FILE"
_NOTICE_FLUSH_S = 5.0


class FailureEvent:
    """Everything an action needs: the diagnosis and where it was seen.

    A watchdog starts its actions as soon as it sees a death. :attr:`brief` (who died and
    how: the exit code or signal) is known then; :attr:`diagnosis` adds the evidence (the
    kernel log, the cgroup's OOM counter, peak RSS) the first time an action reads it, once.
    An action that does not read it (a callback recording the time, a signal to the main
    thread) runs without waiting for that I/O, which with a CPU-busy main thread costs a
    GIL hand-off per file read.
    """

    def __init__(
        self,
        diagnosis: Diagnosis | Callable[[], Diagnosis],
        watchdog_name: str,
        owner_pid: int | None = None,
        *,
        brief: Diagnosis | None = None,
    ) -> None:
        """``diagnosis`` is the diagnosis, or a function that works it out (then ``brief``
        is required: the diagnosis to fall back on if that function fails)."""
        if not (isinstance(diagnosis, Diagnosis) or callable(diagnosis)):
            raise InvalidArgumentTypeError(
                f"diagnosis must be a healthkit.Diagnosis or a function returning one, got "
                f"{diagnosis!r}",
                "diagnosis",
            )
        if brief is not None and not isinstance(brief, Diagnosis):
            raise InvalidArgumentTypeError(
                f"brief must be a healthkit.Diagnosis or None, got {brief!r}", "brief"
            )
        check_str(watchdog_name, "watchdog_name")
        if owner_pid is not None:
            check_pid(owner_pid, "owner_pid")
        if callable(diagnosis):
            if brief is None:
                raise InvalidArgumentTypeError(
                    "a FailureEvent with a deferred diagnosis needs brief= (the diagnosis to "
                    "fall back on if working it out fails)",
                    "brief",
                )
            self._explain: Callable[[], Diagnosis] | None = diagnosis
            self._diagnosis: Diagnosis | None = None
            self.brief = brief
        else:
            self._explain = None
            self._diagnosis = diagnosis
            self.brief = brief if brief is not None else diagnosis
        self.watchdog_name = watchdog_name
        self.owner_pid = owner_pid if owner_pid is not None else os.getpid()
        self._lock = threading.Lock()

    @property
    def diagnosis(self) -> Diagnosis:
        """The full diagnosis, with evidence (worked out on the first read)."""
        if self._diagnosis is None:
            with self._lock:
                if self._diagnosis is None:
                    assert self._explain is not None
                    try:
                        self._diagnosis = self._explain()
                    except Exception:
                        logger.exception("gathering the evidence failed; using the brief")
                        self._diagnosis = self.brief
        return self._diagnosis

    @property
    def message(self) -> str:
        return f"{self.watchdog_name}: {self.diagnosis}"

    def __repr__(self) -> str:
        return f"FailureEvent({self.brief!r}, {self.watchdog_name!r}, {self.owner_pid})"


class Action(Protocol):
    """One step run when a watched process dies."""

    def __call__(self, event: FailureEvent) -> None: ...


def flush_logging(log: logging.Logger | None = None) -> None:
    """Flush every handler a record from ``log`` may reach, then stdout/stderr.

    ``os._exit`` skips all buffered output; a diagnosis lost in a buffer is the one thing
    this library exists to print.
    """
    if log is not None and not isinstance(log, logging.Logger):
        raise InvalidArgumentTypeError(
            f"log must be a logging.Logger or None, got {log!r}", "log"
        )
    current: logging.Logger | None = log or logging.getLogger()
    seen: set[int] = set()
    while current is not None:
        for handler in current.handlers:
            if id(handler) not in seen:
                seen.add(id(handler))
                try:
                    handler.flush()
                except Exception:
                    pass
        current = current.parent if current.propagate else None
    root = logging.getLogger()
    for handler in root.handlers:
        if id(handler) not in seen:
            try:
                handler.flush()
            except Exception:
                pass
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except Exception:
            pass


@attrs.frozen
class log_diagnosis:
    """Log the diagnosis (default: ERROR on the ``healthkit`` logger) and flush everything."""

    logger: logging.Logger = attrs.field(default=logger)
    level: int = attrs.field(default=logging.ERROR)

    @logger.validator
    def _check_logger(self, attribute: object, value: object) -> None:
        if not isinstance(value, logging.Logger):
            raise InvalidArgumentTypeError(
                f"logger must be a logging.Logger, got {value!r}", "logger"
            )

    @level.validator
    def _check_level(self, attribute: object, value: object) -> None:
        check_int(value, "level", minimum=0)

    def __call__(self, event: FailureEvent) -> None:
        emit(self.logger, self.level, event.message)
        flush_logging(self.logger)


def emit(log: logging.Logger, level: int, message: str) -> None:
    """Log ``message`` through the application's configuration; with none configured, print
    it to stderr with its level name (logging's last-resort handler would print it bare).
    Both honour the logger's level: a logger set above ``level`` prints nothing.

    ``disabled`` silences it below ERROR only. ``logging.config.dictConfig`` sets it, by
    default (``disable_existing_loggers=True``), on every logger that exists when it runs,
    which is ``healthkit`` as soon as it is imported: the line saying why the job is about to
    end must not vanish as a side effect of configuring logging. Set the level to silence it.
    """
    if log.disabled:
        if level < logging.ERROR or log.getEffectiveLevel() > level:
            return
        if log.hasHandlers():
            record = log.makeRecord(log.name, level, "(healthkit)", 0, "%s", (message,), None)
            log.callHandlers(record)  # what log.handle() does, less the disabled check
        else:
            print(f"{logging.getLevelName(level)} {message}", file=sys.stderr)
        return
    if not log.isEnabledFor(level):
        return
    if log.hasHandlers():
        log.log(level, "%s", message)
    else:
        print(f"{logging.getLevelName(level)} {message}", file=sys.stderr)


def error_file_payload(event: FailureEvent) -> dict[str, object]:
    """The JSON torch.distributed.elastic reads from ``TORCHELASTIC_ERROR_FILE``.

    torchrun prints ``extraInfo.py_callstack`` as the ``traceback`` of the root cause in its
    failure summary, so the diagnosis goes there too.
    """
    d = event.diagnosis
    # A stalled helper's stacks go last, after the fields they explain.
    head = f"{event.watchdog_name}: {attrs.evolve(d, stacks=None)}" if d.stacks else event.message
    text = (
        f"{head}\n"
        f"  cause: {d.cause.value}; exit code: {d.exit_code}; "
        f"signal: {d.signal.name if d.signal else None}\n"
        + "".join(f"  evidence: {e}\n" for e in d.evidence)
        + (f"  hint: {d.hint}\n" if d.hint else "")
    )
    if d.exception is not None:
        # The helper's own exception, as the end of a Python traceback reads.
        ctx = f" (in {d.exception.context})" if d.exception.context else ""
        text += f"  its exception{ctx}, last frames (full traceback in the record above):\n"
        for frame in d.exception.frames:
            first, *source = frame.splitlines() or [""]
            text += f"    {first.strip()}\n" + "".join(f"      {s.strip()}\n" for s in source)
        text += f"  {d.exception.summary}\n"
    if d.stacks:
        text += d.stacks.rstrip("\n") + "\n"
    label = "stalled helper" if d.cause is Cause.STALLED else ProcessDiedError.__name__
    return {
        "message": {
            "message": f"{label}: {head}",
            "extraInfo": {"py_callstack": text, "timestamp": str(int(time.time()))},
        }
    }


@attrs.frozen
class write_torchelastic_error_file:
    """Write the torchelastic error file when ``TORCHELASTIC_ERROR_FILE`` is set.

    Written atomically (temp file + rename) so torchrun never reads half a file. ``path``
    overrides the environment variable. The path comes from the environment and this often
    runs as root, so it is resolved by :mod:`healthkit._os.safefile`, one directory at a time
    without following a symlink another user could have planted at any component, and the
    write refuses (logs a warning, writes nothing) rather than replace something it must not:
    a target that exists and is not a regular file (a FIFO, a device node, a directory) or is
    another user's, a symlink owned by another user (one owned by us or root is followed), or
    a directory owned by another user or that others can write to without the sticky bit.
    """

    path: str | None = attrs.field(default=None)

    @path.validator
    def _check_path(self, attribute: object, value: object) -> None:
        check_path(value, "path", allow_none=True)

    def __call__(self, event: FailureEvent) -> None:
        path = self.path or os.environ.get(TORCHELASTIC_ERROR_FILE)
        if not path:
            return
        data = json.dumps(error_file_payload(event)).encode()
        try:
            write_file(path, data, mode=0o644)
        except UnsafePathError as e:
            logger.warning(
                "not writing the torchelastic error file %r: %s. Point %s at a directory of "
                "this user's (torchrun's own default is one)",
                path, e, TORCHELASTIC_ERROR_FILE,
            )


@attrs.frozen
class exit_process:
    """End this process now with ``os._exit(code)`` so the launcher tears the job down.

    ``os._exit`` on purpose: a normal exit would run atexit hooks and join threads that
    may be blocked on the dead helper, which is the hang being escaped. Skipping atexit
    also skips multiprocessing's termination of daemon children, which would then be
    orphaned; so first send SIGTERM to every process below this one (multiprocessing
    children, ``Popen`` helpers, DataLoader workers and their own children, each pinned by
    a pidfd), without waiting for them: they may be stuck too. ``code`` must be in 1..255
    (:class:`InvalidArgumentError` otherwise): the OS keeps 8 bits, so 256 would read as a
    success.
    """

    code: int = attrs.field(default=1)
    terminate_children: bool = attrs.field(default=True)

    @terminate_children.validator
    def _check_terminate_children(self, attribute: object, value: object) -> None:
        check_bool(value, "terminate_children")

    @code.validator
    def _check_code(self, attribute: object, value: object) -> None:
        check_exit_code(value, "code")

    def __call__(self, event: FailureEvent) -> None:
        if self.terminate_children:
            terminate_helper_tree()
        flush_logging()
        # A job-wide notice still on its way to the launcher's store (bounded: the local
        # teardown matters more than a late notice).
        _jobnotice.flush(_NOTICE_FLUSH_S)
        os._exit(self.code)


def terminate_helper_tree() -> None:
    """SIGTERM every process below this one, through pidfds; never blocks."""
    from healthkit._watch.stop import watch_tree

    witness = witness_pid()  # ends by itself with this process
    try:
        watches = watch_tree(os.getpid(), exclude=[witness] if witness is not None else [])
    except Exception:
        return
    for watch in watches:
        try:
            watch.terminate()
        except Exception:
            pass
        watch.close()


def _check_signum(signum: object) -> int:
    """A signal ``raise_in_main_thread`` can use: catchable, and not one that means "stop"."""
    if isinstance(signum, bool) or not isinstance(signum, int):
        raise InvalidArgumentTypeError(
            f"signum must be a signal number (an int such as signal.SIGUSR1), got {signum!r}",
            "signum",
        )
    try:
        sig = signal.Signals(signum)
    except ValueError:
        raise InvalidArgumentError(
            f"signum {signum} is not a signal on this system; use signal.SIGUSR1 or SIGUSR2",
            "signum",
        ) from None
    if sig in (signal.SIGKILL, signal.SIGSTOP):
        raise InvalidArgumentError(
            f"signum {sig.name} cannot be caught, so no handler can raise; use signal.SIGUSR1 "
            "or SIGUSR2",
            "signum",
        )
    if sig in STOP_SIGNALS:
        raise InvalidArgumentError(
            f"signum {sig.name} means 'stop' to launchers and to healthkit's stop detection "
            "(sending it would read as this process being stopped); use signal.SIGUSR1 or "
            "SIGUSR2",
            "signum",
        )
    return int(sig)


class raise_in_main_thread:
    """Raise :class:`ProcessDiedError` in the main thread, for users who want an exception.

    The watcher sends ``signum`` to the main thread with ``pthread_kill``; a real signal
    (unlike ``_thread.interrupt_main``) interrupts a blocking system call such as a
    ``recv()``, so the main thread wakes up and the handler raises there. The handler is
    installed when the watchdog is armed (which must then happen in the main thread) and
    the previous handler is restored on disarm. While armed, the signal still reaches the
    application: a ``signum`` that healthkit did not send goes to the handler that was
    installed before (or gets its default action).
    """

    def __init__(self, signum: int = signal.SIGUSR1) -> None:
        self.signum = _check_signum(signum)
        self._event: FailureEvent | None = None
        self._previous: signal.Handlers | Callable[..., object] | int | None = None
        self._installed = False

    def prepare(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            raise UsageError(
                "raise_in_main_thread needs the watchdog to be armed from the main thread "
                "(signal handlers can only be installed there): arm it there, or use "
                "exit_process"
            )
        if not self._installed:
            self._previous = signal.signal(self.signum, self._handler)
            self._installed = True

    def release(self) -> None:
        if self._installed and threading.current_thread() is threading.main_thread():
            signal.signal(self.signum, self._previous)
            self._installed = False

    def _handler(self, signum: int, frame: object) -> None:
        event = self._event
        if event is None:
            self._chain(signum, frame)  # not ours: the application's own use of the signal
            return
        self._event = None
        raise ProcessDiedError(event.message, event.diagnosis)

    def _chain(self, signum: int, frame: object) -> None:
        previous = self._previous
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            # What the signal would have done without us (SIGUSR1's default: terminate).
            signal.signal(signum, signal.SIG_DFL)
            try:
                signal.raise_signal(signum)
            finally:
                signal.signal(signum, self._handler)

    def __call__(self, event: FailureEvent) -> None:
        self._event = event
        signal.pthread_kill(threading.main_thread().ident or 0, self.signum)

    def __repr__(self) -> str:
        return f"raise_in_main_thread(signum={self.signum})"


def interactive_shell() -> Any | None:
    """The running IPython shell (a Jupyter kernel's or a terminal's), or ``None``.

    Never imports IPython: a process that has not imported it runs no shell, so ``import
    healthkit`` stays light and a plain script is never taken for a notebook.
    """
    ipython = sys.modules.get("IPython")
    get_ipython = getattr(ipython, "get_ipython", None)
    if get_ipython is None:
        return None
    try:
        return get_ipython()
    except Exception:
        return None


# The failure a kernel was idle for, raised by the next cell before its own code runs.
_pending_cell_failure: list[FailureEvent] = []


def raise_pending_failure() -> None:
    """Raise the failure no cell was running for (called by the next cell's first line)."""
    if _pending_cell_failure:
        event = _pending_cell_failure.pop()
        raise ProcessDiedError(event.message, event.diagnosis)


class raise_in_cell(raise_in_main_thread):
    """:class:`raise_in_main_thread` for an interactive shell: the cell that is running gets
    :class:`ProcessDiedError`, and the kernel (with all its state) lives on.

    Raised only inside a cell: between cells the main thread runs the kernel's own event
    loop, which an exception would end. A death while no cell runs is kept and raised by the
    next cell before any of its code runs.
    """

    _CALL = "__import__('healthkit._actions', fromlist=['_']).raise_pending_failure()\n"

    def __init__(self, shell: Any, signum: int = signal.SIGUSR1) -> None:
        if not hasattr(shell, "events") or not hasattr(shell, "input_transformers_post"):
            raise InvalidArgumentTypeError(
                f"shell must be the running IPython shell (IPython.get_ipython()), got {shell!r}",
                "shell",
            )
        super().__init__(signum)
        self._shell = shell
        self._in_cell = False
        self._hooked = False

    def prepare(self) -> None:
        super().prepare()
        if not self._hooked:
            self._shell.events.register("pre_run_cell", self._cell_starts)
            self._shell.events.register("post_run_cell", self._cell_ends)
            self._shell.input_transformers_post.append(self._raise_first)
            self._hooked = True
        self._in_cell = True  # arm() runs in the main thread: inside a cell

    def release(self) -> None:
        super().release()
        if self._hooked:
            self._shell.events.unregister("pre_run_cell", self._cell_starts)
            self._shell.events.unregister("post_run_cell", self._cell_ends)
            if self._raise_first in self._shell.input_transformers_post:
                self._shell.input_transformers_post.remove(self._raise_first)
            self._hooked = False

    def _cell_starts(self, *_: object) -> None:
        self._in_cell = True

    def _cell_ends(self, *_: object) -> None:
        self._in_cell = False

    def _raise_first(self, lines: list[str]) -> list[str]:
        return [self._CALL, *lines] if _pending_cell_failure else lines

    def _handler(self, signum: int, frame: object) -> None:
        event = self._event
        if event is not None and not self._in_cell:
            self._event = None  # the cell ended meanwhile: the next one raises it
            _pending_cell_failure[:] = [event]
            return
        super()._handler(signum, frame)

    def __call__(self, event: FailureEvent) -> None:
        if self._in_cell:
            super().__call__(event)
        else:
            _pending_cell_failure[:] = [event]

    def __repr__(self) -> str:
        return f"raise_in_cell(signum={self.signum})"


def default_actions(exit_code: int = 1) -> list[Action]:
    """Log and flush, write the torchelastic error file if asked, then ``os._exit``."""
    check_exit_code(exit_code)
    return [log_diagnosis(), write_torchelastic_error_file(), exit_process(exit_code)]
