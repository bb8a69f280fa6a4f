"""Everything that passes between an owner and its sidecar, in one place: the messages (typed,
encoded and decoded only here), the command line that starts the sidecar and its link
process, and the other channels, which carry no messages but are part of the contract.

Channels (mirrored in ``docs/architecture.md``):

=========================  ======================================================================
channel                    what goes over it
=========================  ======================================================================
argv and ``pass_fds``      ``python -I -c BOOTSTRAP <pkg dir> <attrs dir> <sock fd> <peek fd|-1>``
                           (:func:`sidecar_command`): the socketpair end, a copy of the owner's
                           wakeup socket's read end, and the descriptors of the owner's stream
                           log handlers are inherited; the link process gets ``link <sock fd>
                           <job JSON>`` (:func:`link_command`)
JSON lines, owner <->      one :class:`Message` per line over a socketpair (the tables below);
sidecar                    end-of-file means the owner is gone or let the sidecar go
JSON lines, sidecar <->    ``publish`` (sidecar -> link), ``ready`` and ``notice`` (link ->
link process               sidecar) over a socketpair of their own
raw signal bytes           the owner's wakeup socket (``signal.set_wakeup_fd``): one byte per
                           signal number; the sidecar only ever *peeks* (``MSG_PEEK``) at the
                           copy it holds, so a stop the owner has not read yet (its GIL held) is
                           seen and never taken away from it
``/proc``                  the sidecar reads the owner's pending and blocked signals and its
                           threads' state (``/proc/<owner>/status``, ``task/*``), each helper's
                           exit status, start time and process group from its zombie's
                           ``/proc/<pid>/stat``, the owner's progress pages and their bells
                           through ``/proc/<owner>/fd/<fd>``, and the owner's process group's
                           members when the owner died
signals                    the sidecar is in the owner's process group: a group stop reaches it
                           too (recorded, never obeyed); it ends the owner with SIGTERM, then
                           SIGKILL after ``kill_after``
files                      the torchelastic error file named in ``config`` (written by the
                           sidecar when it fires); the owner's log files (by path)
=========================  ======================================================================

Messages, owner -> sidecar:

==================  =========================================================================
:class:`Config`     ``owner_pid``, ``owner_pgrp``, ``name``, ``kill_after``, ``stop_grace``,
                    ``second_look``, ``logging`` (the plan of
                    :func:`healthkit._watchdog.logging_transfer.logging_plan`), ``witness``,
                    ``job``, ``error_file``, ``diagnoser`` (the owner's diagnoser's
                    settings), ``rss_sample_interval``; answered by ``ready``
:class:`Watch`      ``pid``, ``name``, ``start_time``, ``on_clean_exit``, ``pgrp``, ``ended``,
                    ``returncode`` (what the owner already knows); answered by ``watching``
:class:`Status`     ``pid``, ``returncode``, ``source``: how a watched process ended, as the
                    owner learned it
:class:`Stop`       ``signal``, ``at`` (``CLOCK_MONOTONIC`` seconds): a stop signal reached the
                    owner (sent before the owner consumes its byte)
:class:`Survived`   ``at``: the owner said it carries on after its stop
:class:`Stopped`    ``pid``, ``start_time``: :func:`healthkit.stop` is about to end it
:class:`Progress`   ``fd``, ``bell``, ``name``, ``who``, ``stall_timeout``: watch a progress
                    page (opened through ``/proc/<owner>/fd/<fd>``; ``bell``, if not null,
                    the pipe its callers ring, opened the same way); answered by ``watching``
:class:`Expect`     a wait for progress began while no timer was set: look at the pages
:class:`Notice`     ``notice`` (JSON text): another rank's failure notice, heard first by the
                    owner's link to the job's store (the sidecar's may still be coming up)
:class:`Exiting`    the owner's interpreter is shutting down: a witness stays to tell its end
:class:`Disarm`     exit now
:class:`Logged`     ``n``: the answer to ``flush``
:class:`Published`  ``ok``: the answer to ``publish`` (whether the notice is in the store)
==================  =========================================================================

Messages, sidecar -> owner:

==================  =========================================================================
:class:`Ready`      the answer to ``config``
:class:`Watching`   the answer to ``watch`` and ``progress``
:class:`Log`        ``level``, ``msg``, ``created``: one of the sidecar's log records, for the
                    owner's handlers it cannot write through (only when ``logging.relay``)
:class:`Flush`      ``n``: the diagnosis is logged: flush those handlers and answer ``logged``
                    (waited for briefly before the owner is stopped)
:class:`Publish`    ``notice`` (JSON text): publish this failure through the owner's link to
                    the job's store (the sidecar's own is not up yet); answered by
                    ``published`` (waited for briefly before the owner is stopped; if not ok,
                    the sidecar publishes)
==================  =========================================================================

The link process uses :class:`Publish`, :class:`Ready` and :class:`Notice` the same way.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, ClassVar

import attrs

from healthkit._errors import HealthkitError

__all__ = [
    "BOOTSTRAP",
    "MESSAGES",
    "Config",
    "Disarm",
    "Exiting",
    "Expect",
    "Flush",
    "LineReader",
    "Log",
    "Logged",
    "Message",
    "Notice",
    "Progress",
    "ProtocolError",
    "Publish",
    "Published",
    "Ready",
    "Status",
    "Stop",
    "Stopped",
    "Survived",
    "Watch",
    "Watching",
    "decode",
    "encode",
    "link_command",
    "sidecar_command",
]

#: The ``healthkit`` package directory the owner imported (the sidecar imports this very copy).
PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: The sidecar program. Isolated start (``python -I``): import this very healthkit package by
#: path (nothing else from its parent directory), and attrs from the owner's copy only when
#: the isolated path has none.
BOOTSTRAP = """\
import importlib.util, sys
pkg, attrs_dir = sys.argv[1], sys.argv[2]
try:
    import attrs
except ImportError:
    sys.path.append(attrs_dir)
spec = importlib.util.spec_from_file_location(
    "healthkit", pkg + "/__init__.py", submodule_search_locations=[pkg])
module = importlib.util.module_from_spec(spec)
sys.modules["healthkit"] = module
spec.loader.exec_module(module)
from healthkit._watchdog.sidecar_process import main
sys.exit(main(sys.argv[3:]))
"""
#: Interpreter start-up on a loaded 2-core machine: how long the owner waits for an answer.
START_TIMEOUT_S = 30.0
#: How long the sidecar waits for the owner's word on a status it could not read itself.
OWNER_STATUS_WAIT_S = 2.0
#: How long the sidecar waits for the owner to hand its lines to the handlers it could not
#: write through, before it stops the owner (whose GIL may be held: then nobody answers).
OWNER_LOGGED_WAIT_S = 0.5
#: How long the sidecar waits for the owner to publish a failure through the owner's link
#: (its own is still coming up) before it stops the owner (whose GIL may be held).
OWNER_PUBLISH_WAIT_S = 0.5
#: How long the sidecar (and its link process) wait, before they exit, for a notice to reach
#: the job's store (a witness imports torch for it only once the owner has died).
NOTICE_FLUSH_S = 30.0


class ProtocolError(HealthkitError, ValueError):
    """A line between an owner and its sidecar that is not one of the messages below."""


def _attrs_dir() -> str:
    import attrs as attrs_module

    return os.path.dirname(os.path.dirname(os.path.abspath(attrs_module.__file__)))


def sidecar_command(sock_fd: int, peek_fd: int | None) -> list[str]:
    """The sidecar's command line: it inherits ``sock_fd`` (its end of the socketpair) and
    ``peek_fd`` (a copy of the owner's wakeup socket's read end) through ``pass_fds``."""
    return [
        sys.executable, "-I", "-c", BOOTSTRAP, PKG_DIR, _attrs_dir(),
        str(sock_fd), str(peek_fd if peek_fd is not None else -1),
    ]  # fmt: skip


def link_command(sock_fd: int, job: dict[str, Any]) -> list[str]:
    """The link process's command line (started by the sidecar, same program)."""
    return [
        sys.executable, "-I", "-c", BOOTSTRAP, PKG_DIR, _attrs_dir(), "link",
        str(sock_fd), json.dumps(job),
    ]  # fmt: skip


class Message:
    """One line of the protocol; ``op`` names it on the wire."""

    op: ClassVar[str]


@attrs.frozen
class Config(Message):
    op: ClassVar[str] = "config"
    owner_pid: int
    owner_pgrp: int
    name: str
    kill_after: float
    stop_grace: float
    second_look: float
    logging: dict[str, Any] | None = None
    witness: bool = False
    job: dict[str, Any] | None = None
    error_file: str | None = None
    diagnoser: dict[str, Any] | None = None
    rss_sample_interval: float | None = None


@attrs.frozen
class Ready(Message):
    op: ClassVar[str] = "ready"


@attrs.frozen
class Watch(Message):
    op: ClassVar[str] = "watch"
    pid: int
    name: str
    start_time: int | None
    on_clean_exit: str
    pgrp: int | None
    ended: bool
    returncode: int | None


@attrs.frozen
class Watching(Message):
    op: ClassVar[str] = "watching"


@attrs.frozen
class Status(Message):
    op: ClassVar[str] = "status"
    pid: int
    returncode: int | None
    source: str


@attrs.frozen
class Stop(Message):
    op: ClassVar[str] = "stop"
    signal: int
    at: float


@attrs.frozen
class Survived(Message):
    op: ClassVar[str] = "survived"
    at: float


@attrs.frozen
class Stopped(Message):
    op: ClassVar[str] = "stopped"
    pid: int
    start_time: int | None


@attrs.frozen
class Progress(Message):
    op: ClassVar[str] = "progress"
    fd: int
    bell: int | None
    name: str
    who: str
    stall_timeout: float


@attrs.frozen
class Expect(Message):
    op: ClassVar[str] = "expect"


@attrs.frozen
class Notice(Message):
    op: ClassVar[str] = "notice"
    notice: str  # a JobFailure's JSON text


@attrs.frozen
class Exiting(Message):
    op: ClassVar[str] = "exiting"


@attrs.frozen
class Disarm(Message):
    op: ClassVar[str] = "disarm"


@attrs.frozen
class Log(Message):
    op: ClassVar[str] = "log"
    level: int
    msg: str
    created: float


@attrs.frozen
class Flush(Message):
    op: ClassVar[str] = "flush"
    n: int | None = None


@attrs.frozen
class Logged(Message):
    op: ClassVar[str] = "logged"
    n: int | None = None


@attrs.frozen
class Publish(Message):
    op: ClassVar[str] = "publish"
    notice: str  # a JobFailure's JSON text


@attrs.frozen
class Published(Message):
    op: ClassVar[str] = "published"
    ok: bool


#: Every message type, by its ``op``.
MESSAGES: dict[str, type[Message]] = {
    cls.op: cls
    for cls in (
        Config, Ready, Watch, Watching, Status, Stop, Survived, Stopped, Progress, Expect,
        Notice, Exiting, Disarm, Log, Flush, Logged, Publish, Published,
    )
}  # fmt: skip


def encode(message: Message) -> bytes:
    """One line: the message's fields as a JSON object, with ``op``."""
    fields = attrs.asdict(message, recurse=False)  # type: ignore[arg-type]
    return json.dumps({"op": message.op, **fields}).encode() + b"\n"


def decode(line: bytes) -> Message:
    """The message on ``line`` (without its newline); :class:`ProtocolError` if it is none."""
    try:
        obj = json.loads(line)
    except ValueError as e:
        raise ProtocolError(f"not a JSON line: {line[:200]!r}") from e
    if not isinstance(obj, dict):
        raise ProtocolError(f"not a JSON object: {line[:200]!r}")
    cls = MESSAGES.get(obj.pop("op", None))
    if cls is None:
        raise ProtocolError(f"unknown message: {line[:200]!r}")
    try:
        return cls(**obj)
    except TypeError as e:
        raise ProtocolError(f"malformed {cls.op!r} message ({e}): {line[:200]!r}") from e


class LineReader:
    """Splits what a socket gives into messages: bytes in, complete messages out."""

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, chunk: bytes) -> list[Message | ProtocolError]:
        """The messages completed by ``chunk``; a bad line yields its error in its place, for
        the caller to log or refuse (one bad line never hides the good ones after it)."""
        self._buf += chunk
        *lines, self._buf = self._buf.split(b"\n")
        out: list[Message | ProtocolError] = []
        for line in lines:
            if not line:
                continue
            try:
                out.append(decode(line))
            except ProtocolError as e:
                out.append(e)
        return out

    def has_line(self) -> bool:
        return b"\n" in self._buf
