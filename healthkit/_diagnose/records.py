"""A helper's own exception, carried to whoever diagnoses its death.

Without this, a helper that dies of a Python exception is "exited with code 1" to its owner:
the traceback is in the helper's stderr, interleaved with the rest of the job's output, and
torchrun's summary names no cause. :func:`record_exception` wraps a helper's entry point (a
decorator or a ``with`` block, the helper-side counterpart of torchelastic's ``@record``) and,
when an exception escapes it, writes the exception's type, message and traceback to an
*exception record*. :class:`~healthkit.ExitDiagnoser` looks the record up when it diagnoses
that process's death, so both watchdog modes (the watcher thread and the sidecar) and every
other user of the diagnoser carry it into the one-line diagnosis and the torchelastic error
file.

Where: one private directory per user, :func:`~healthkit._os.userdir.record_dir`
(``$HEALTHKIT_RECORD_DIR``, else ``<tempdir>/healthkit-<euid>``). Owner and helper compute the
same directory from the same environment, so nothing has to be passed down: fork, spawn and
forkserver children and subprocesses all inherit it (a forkserver started before the owner set
the variable writes to the default one, which the reader looks in too). The directory is
created mode 0700 and used only if it belongs to this user and nobody else can write to it;
paths are resolved by :mod:`healthkit._os.safefile`.

Which process: a record is named after the pid *and the process's start time* (from
``/proc/<pid>/stat``), so a later process that reuses the pid never matches an old record.
The start time counts clock ticks (10 ms): a pid reused within one tick has the same one.
Where the kernel numbers processes for good (pidfs, Linux 6.9+), the record also carries
that number (:func:`~healthkit._os.proc.pidfd_identity`) and a reader that knows the process's
own (a :class:`~healthkit.ProcessWatch` pins it) takes no record with another.

Every ending that has a Python cause is recorded, because each one reads "exited with code
N" without it: an exception out of the entry point, ``sys.exit(3)`` or ``sys.exit("fatal:
...")`` (the message would otherwise be only in stderr), and, once the entry point ran, an
exception that ends one of the process's other threads or an ``atexit`` callback (both leave
the exit code as it was: a helper whose loader thread died "returned early" with no cause).
The entry point's own ending replaces a record of either; of those, the first one is kept
(the first exception is the cause; later ones are most often its consequences).
``sys.exit(0)`` and ``sys.exit()`` are not recorded: a clean ending is not a failure to
explain. A ``KeyboardInterrupt`` out of the entry point is (its exit code 1 reads like any
error without it), and a diagnosis names it as an interrupt, not an error.

Size: a record is at most 64 KiB; a longer traceback keeps its first and last parts (the
innermost frames, where the error was raised, are at the end).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import re
import sys
import threading
import time
import traceback
import types
from collections.abc import Callable
from typing import Any, Generic, ParamSpec, TypeVar, overload

import attrs

from healthkit._diagnose.stacks import enable_private_stack_dumps, withdraw_stack_dumps
from healthkit._os.proc import read_peak_rss, read_proc_stat, self_identity
from healthkit._os.safefile import UnsafePathError, open_directory, read_private, write_atomic
from healthkit._os.userdir import RECORD_DIR_ENV, default_record_dir, record_dir

__all__ = ["HelperException", "find_record", "read_record", "record_exception", "write_record"]

logger = logging.getLogger("healthkit")

_HEADER = b"healthkit-exception-record "
_MAX_RECORD_BYTES = 64 << 10
_MAX_MESSAGE_CHARS = 4000
_HEAD_KEEP = 4 << 10  # of an over-long traceback, keep this much of its start
_LAST_FRAMES = 3
_MAX_AGE_S = 7 * 24 * 3600  # records older than this are removed when a new one is written
_PRUNE_SCAN = 256  # at most this many directory entries are looked at per prune

P = ParamSpec("P")
R = TypeVar("R")


def record_name(pid: int, start_time: int) -> str:
    return f"exception-{pid}-{start_time}.txt"


@attrs.frozen
class HelperException:
    """The exception a helper raised out of its entry point, as its record tells it."""

    #: The exception's class: ``ValueError``, or ``package.module.Name`` for others.
    type: str
    message: str
    #: The innermost frames, outermost first, as the traceback prints them.
    frames: tuple[str, ...]
    #: The record file, which holds the full traceback.
    path: str
    pid: int
    start_time: int
    #: Where it was raised: ``file.py:12 in function`` (the innermost frame), or ``""``.
    where: str = ""
    #: The helper's peak RSS (``VmHWM``) when it raised, if it could be read.
    peak_rss_bytes: int | None = None
    #: Where in the process it ended: ``""`` for its entry point, ``"thread NAME"`` for
    #: another thread, ``"atexit callback NAME"`` for an ``atexit`` callback.
    context: str = ""

    @property
    def exit_call(self) -> str | None:
        """``sys.exit(3)`` or ``sys.exit('fatal: ...')`` when the record is a ``SystemExit``
        out of the entry point, else ``None``."""
        if self.type != "SystemExit" or self.context:
            return None
        code = self.message
        shown = code if re.fullmatch(r"-?\d+", code) else repr(_first_line(code, 300))
        return f"sys.exit({shown})"

    @property
    def described(self) -> str:
        """How it ended, as a diagnosis tells it: ``raised ValueError: x``, ``called
        sys.exit(3)``, ``raised ValueError: x in thread loader``."""
        call = self.exit_call
        if call is not None:
            return f"called {call}"
        return f"raised {self.summary}" + (f" in {self.context}" if self.context else "")

    @property
    def summary(self) -> str:
        """``Type: message`` on one line, as a traceback's last line reads."""
        first = _first_line(self.message, 300)
        return f"{self.type}: {first}" if first else self.type


def _first_line(text: str, limit: int) -> str:
    first = text.strip().splitlines()[0] if text.strip() else ""
    return first[: limit - 3] + "..." if len(first) > limit else first


# ---------------------------------------------------------------------------- writing
def _type_name(exc: BaseException) -> str:
    cls = type(exc)
    if cls.__module__ in ("builtins", "__main__"):
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


def _safe_str(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:
        return f"<str() of the {type(exc).__name__} failed>"


def _cap_traceback(text: str, limit: int) -> str:
    raw = text.encode("utf-8", "replace")
    if len(raw) <= limit:
        return text
    head = raw[:_HEAD_KEEP].decode("utf-8", "ignore")
    tail = raw[-(limit - _HEAD_KEEP - 100):].decode("utf-8", "ignore")
    cut = len(raw) - len(head.encode()) - len(tail.encode())
    return f"{head}\n[... {cut} bytes of the traceback left out ...]\n{tail}"


def _format(exc: BaseException, pid: int, start_time: int, context: str = "") -> bytes:
    try:
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    except Exception:
        text = f"{_type_name(exc)}: {_safe_str(exc)}\n"
    frames = []
    where = ""
    ours = os.path.abspath(__file__)
    stack = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename != ours]
    for frame in stack[-_LAST_FRAMES:]:
        where = f"{os.path.basename(frame.filename)}:{frame.lineno} in {frame.name}"
        line = f'File "{frame.filename}", line {frame.lineno}, in {frame.name}'
        if frame.line:
            line += f"\n    {frame.line.strip()}"
        frames.append(line)
    meta = {
        "version": 1,
        "pid": pid,
        "start_time": start_time,
        "time": time.time(),
        "type": _type_name(exc),
        "message": _safe_str(exc)[:_MAX_MESSAGE_CHARS],
        "frames": frames,
        "where": where,
        "peak_rss_bytes": read_peak_rss(pid),
        "context": context,
        "identity": self_identity(),
    }
    head = _HEADER + json.dumps(meta).encode() + b"\n"
    body = _cap_traceback(text, _MAX_RECORD_BYTES - len(head)).encode("utf-8", "replace")
    return head + body


# The pid whose record this interpreter wrote, and whether it came from the entry point:
# another thread's or an atexit callback's exception never replaces the entry point's, nor
# a first one of its own kind. A fork child starts with a pid of its own, so with no record.
_written: tuple[int, bool] | None = None
_written_lock = threading.Lock()


def write_record(
    exc: BaseException, directory: str | None = None, *, context: str = ""
) -> str | None:
    """Record ``exc`` as this process's exception; returns the record's path, or ``None``
    (with a warning) if it could not be written. Never raises: it runs while the process
    is dying of ``exc``, which must stay the error the process reports.

    ``context`` names where it ended when not in the entry point (``"thread NAME"``,
    ``"atexit callback NAME"``): such a record is written only if this process wrote none
    yet, and the entry point's own ending replaces it."""
    global _written
    directory = directory or record_dir()
    try:
        pid = os.getpid()
        with _written_lock:
            if context and _written is not None and _written[0] == pid:
                return None
            _written = (pid, not context)
        stat = read_proc_stat(pid)
        if stat is None:
            return None
        name = record_name(pid, stat.start_time)
        data = _format(exc, pid, stat.start_time, context)
        dir_fd = open_directory(directory, create=True, private=True)
        try:
            write_atomic(dir_fd, name, data, mode=0o600, shown=os.path.join(directory, name))
            _prune_old(dir_fd)
        finally:
            os.close(dir_fd)
        return os.path.join(directory, name)
    except (UnsafePathError, OSError) as e:
        logger.warning(
            "the exception record of pid %d was not written (%s): its owner's diagnosis "
            "will not name the exception. Set %s to a private directory of this user's",
            os.getpid(), e, RECORD_DIR_ENV,
        )
    except Exception:
        logger.warning("the exception record was not written", exc_info=True)
    return None


def _prune_old(dir_fd: int) -> None:
    """Remove exception records older than a week (a job's records are read within seconds;
    the rest only fill the directory)."""
    now = time.time()
    with contextlib.suppress(OSError), os.scandir(dir_fd) as entries:
        for i, entry in enumerate(entries):
            if i >= _PRUNE_SCAN:
                break
            if not (entry.name.startswith("exception-") and entry.name.endswith(".txt")):
                continue
            with contextlib.suppress(OSError):
                st = entry.stat(follow_symlinks=False)
                if now - st.st_mtime > _MAX_AGE_S:
                    os.unlink(entry.name, dir_fd=dir_fd)


# ---------------------------------------------------------------------------- reading
def find_record(pid: int, start_time: int, directory: str | None = None, *,
                identity: int | None = None) -> HelperException | None:
    """:func:`read_record` in ``directory`` (default :func:`record_dir`), then in
    :func:`default_record_dir`: the helper may not have inherited the variable."""
    first = directory or record_dir()
    for place in dict.fromkeys((first, default_record_dir())):
        found = read_record(pid, start_time, place, identity=identity)
        if found is not None:
            return found
    return None


def read_record(pid: int, start_time: int, directory: str | None = None, *,
                identity: int | None = None) -> HelperException | None:
    """The exception record of the process ``(pid, start_time)``, or ``None`` if it wrote
    none (or the directory or file fails a safety check, or is malformed). With
    ``identity`` (the process's :func:`~healthkit._os.proc.pidfd_identity`), a record that
    carries another is an earlier process's that reused the pid within one clock tick."""
    directory = directory or record_dir()
    name = record_name(pid, start_time)
    try:
        dir_fd = open_directory(directory, private=True)
    except (UnsafePathError, OSError):
        return None
    try:
        data = read_private(dir_fd, name, _MAX_RECORD_BYTES + 1024)
    finally:
        os.close(dir_fd)
    if data is None or not data.startswith(_HEADER):
        return None
    line = data[len(_HEADER):].partition(b"\n")[0]
    try:
        meta = json.loads(line)
        if meta["pid"] != pid or meta["start_time"] != start_time:
            return None
        written_by = meta.get("identity")
        if identity is not None and isinstance(written_by, int) and written_by != identity:
            return None
        peak = meta.get("peak_rss_bytes")
        return HelperException(
            type=str(meta["type"]),
            message=str(meta["message"]),
            frames=tuple(str(f) for f in meta["frames"]),
            path=os.path.join(directory, name),
            pid=pid,
            start_time=start_time,
            where=str(meta.get("where", "")),
            peak_rss_bytes=peak if isinstance(peak, int) and peak >= 0 else None,
            context=str(meta.get("context", "")),
        )
    except (ValueError, KeyError, TypeError):
        logger.warning("the exception record %s is malformed: ignored",
                       os.path.join(directory, name))
        return None


# ---------------------------------------------------------------------------- the wrapper
def _worth_recording(exc: BaseException | None) -> bool:
    """An exception, a ``sys.exit`` that fails (a non-zero code or a message), or a
    ``KeyboardInterrupt``. A clean ``sys.exit()`` is not a failure to explain. An interrupt
    is a stop, but its exit code 1 reads like any error without the record: reported when
    the owner was not stopped with it (an interactive kernel's interrupt reaches its
    helpers too; an owner that survived the stop), it is named as an interrupt."""
    if isinstance(exc, SystemExit):
        return exc.code is not None and exc.code is not False and exc.code != 0
    return isinstance(exc, (Exception, KeyboardInterrupt))


_hooks_installed = False


def _install_hooks() -> None:
    """Record the exception that ends another thread or an ``atexit`` callback of this
    process. Installed once, the first time an entry point is wrapped, and left in place:
    ``atexit`` callbacks run after the entry point returned. Each hook hands on to the one
    it replaced, so what the process prints is unchanged."""
    global _hooks_installed
    if _hooks_installed:
        return
    _hooks_installed = True
    before_thread = threading.excepthook
    before_unraisable = sys.unraisablehook

    def thread_hook(args: threading.ExceptHookArgs) -> None:
        try:
            if isinstance(args.exc_value, Exception):
                name = args.thread.name if args.thread is not None else "?"
                write_record(args.exc_value, context=f"thread {name}")
        finally:
            before_thread(args)

    def unraisable_hook(unraisable: Any) -> None:
        try:
            message = unraisable.err_msg or ""
            if isinstance(unraisable.exc_value, Exception) and message.startswith(
                "Exception ignored in atexit callback"
            ):
                func = unraisable.object
                name = getattr(func, "__qualname__", None) if func is not None else None
                if name is None:  # 3.13 names the callback in the message instead
                    found = re.search(r"<function (\S+)", message)
                    name = found.group(1) if found else "?"
                write_record(unraisable.exc_value, context=f"atexit callback {name}")
        finally:
            before_unraisable(unraisable)

    threading.excepthook = thread_hook
    sys.unraisablehook = unraisable_hook


class _Recorder:
    """One use of :func:`record_exception` as a ``with`` block."""

    def __init__(self, stacks: bool) -> None:
        self._stacks = stacks
        self._stack_file: str | None = None

    def __enter__(self) -> _Recorder:
        _install_hooks()
        if self._stacks:
            self._stack_file = enable_private_stack_dumps(record_dir())
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> None:
        try:
            if _worth_recording(exc):
                assert exc is not None
                write_record(exc)
        finally:
            if self._stack_file is not None:
                withdraw_stack_dumps(self._stack_file)
                self._stack_file = None

    def __call__(self, func: Callable[P, R]) -> _Recorded[P, R]:
        return _Recorded(func, stacks=self._stacks)


class _Recorded(Generic[P, R]):
    """A function wrapped by :func:`record_exception`. A class rather than a closure so that
    it pickles (the ``spawn`` and ``forkserver`` start methods pickle a Process's target):
    by name when it is the module-level name of a decorated function, otherwise by the
    function it wraps."""

    def __init__(self, func: Callable[P, R], *, stacks: bool = True) -> None:
        if not callable(func):
            from healthkit._errors import InvalidArgumentTypeError

            raise InvalidArgumentTypeError(
                f"func: record_exception wraps a function, got {func!r} "
                f"({type(func).__name__})",
                "func",
            )
        functools.update_wrapper(self, func)
        self.__wrapped__ = func
        self._stacks = stacks

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        with _Recorder(self._stacks):
            return self.__wrapped__(*args, **kwargs)

    def __get__(self, instance: object, owner: type | None = None) -> Any:
        if instance is None:
            return self
        return types.MethodType(self, instance)

    def __reduce__(self) -> str | tuple[Any, ...]:
        obj: Any = sys.modules.get(getattr(self, "__module__", ""), None)
        for part in getattr(self, "__qualname__", "").split("."):
            obj = getattr(obj, part, None)
        if obj is self:
            return str(self.__qualname__)
        return (_rebuild, (self.__wrapped__, self._stacks))

    def __repr__(self) -> str:
        return f"record_exception({self.__wrapped__!r})"


def _rebuild(func: Callable[..., Any], stacks: bool) -> _Recorded[..., Any]:
    return _Recorded(func, stacks=stacks)


@overload
def record_exception(func: Callable[P, R], /, *, stacks: bool = True) -> _Recorded[P, R]: ...
@overload
def record_exception(func: None = None, /, *, stacks: bool = True) -> _Recorder: ...
def record_exception(
    func: Callable[P, R] | None = None, /, *, stacks: bool = True
) -> _Recorded[P, R] | _Recorder:
    """Carry a helper's exception to its owner's diagnosis (torchelastic's ``@record``, for
    helpers). Use it on the helper's entry point::

        @healthkit.record_exception
        def serve(queue): ...

        ctx.Process(target=serve, args=(queue,)).start()

    or around the body of a helper script (``with healthkit.record_exception(): main()``).
    An ``Exception`` that escapes, or a failing ``sys.exit`` (``sys.exit(3)``,
    ``sys.exit("fatal: ...")``), is written to this process's exception record (see
    :mod:`healthkit._diagnose.records`) and then propagates unchanged: the process still prints its
    traceback and exits with the same code. From then on an exception that ends another of
    its threads or an ``atexit`` callback is recorded too (unless a record was written
    already). ``sys.exit(0)`` is not recorded; a ``KeyboardInterrupt`` is, and is named as
    an interrupt.

    ``stacks=True`` also opts the helper in to on-demand stack dumps while the entry point
    runs (``healthkit stacks PID``; :func:`healthkit.dump_helper_stacks`), unless SIGUSR2
    already has a handler in it.
    """
    if not isinstance(stacks, bool):
        from healthkit._errors import InvalidArgumentTypeError

        raise InvalidArgumentTypeError(f"stacks must be True or False, got {stacks!r}",
                                       "stacks")
    if func is None:
        return _Recorder(stacks)
    return _Recorded(func, stacks=stacks)
