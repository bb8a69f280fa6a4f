"""The owner's logging, carried into the sidecar: which of its handlers another process can
write through (files by path, streams by descriptor, with their level and format), and a relay
of the sidecar's records back to the owner for the handlers it cannot share (a queue, syslog,
a custom formatter)."""

from __future__ import annotations

import contextlib
import logging
import logging.handlers
import os
import socket
import sys
import time
from typing import Any

from healthkit._watchdog.protocol import Flush, Log, encode

__all__ = ["SIDECAR_FORMAT", "apply_logging_plan", "drain_queue", "logging_plan", "RelayHandler"]


logger = logging.getLogger("healthkit")


SIDECAR_FORMAT = "%(asctime)s %(levelname)s healthkit sidecar: %(message)s"
_STYLES = {logging.PercentStyle: "%", logging.StrFormatStyle: "{", logging.StringTemplateStyle: "$"}


def logging_plan(
    log: logging.Logger,
) -> tuple[dict[str, Any], list[int], list[logging.Handler]]:
    """How the sidecar logs as ``log`` would in the owner: its effective level, whether it is
    disabled, and the handlers a record from it reaches that another process can write
    through (file handlers by path, stream handlers by file descriptor), each with its
    level and format. Also the descriptors the sidecar must inherit, and the other handlers
    (a queue, syslog, a stream with no descriptor, pytest's capture): the sidecar sends its
    records to the owner for those (``relay``), and the owner hands them over while it can."""
    handlers: list[dict[str, Any]] = []
    not_carried: list[logging.Handler] = []
    fds: list[int] = []
    current: logging.Logger | None = log
    seen: set[int] = set()
    while current is not None:
        for h in current.handlers:
            if id(h) in seen:
                continue
            seen.add(id(h))
            spec = _handler_spec(h)
            if spec is None:
                not_carried.append(h)
                continue
            handlers.append(spec)
            fd = spec.get("fd")
            if isinstance(fd, int) and fd > 2:
                fds.append(fd)
        current = current.parent if current.propagate else None
    plan = {
        "level": log.getEffectiveLevel(),
        "disabled": log.disabled,
        "handlers": handlers,
        "relay": bool(not_carried),
    }
    return plan, fds, not_carried


def _handler_spec(h: logging.Handler) -> dict[str, Any] | None:
    fmt = h.formatter
    if fmt is not None and type(fmt) is not logging.Formatter:
        # A formatter class of the application's own (JSON, structured): the sidecar cannot
        # run its code (it imports nothing of the application), and writing plain text into
        # that file would break it. Its lines are relayed to the owner, which formats them.
        return None
    spec: dict[str, Any] = {
        "level": h.level,
        "fmt": fmt._fmt if fmt is not None else None,
        "datefmt": fmt.datefmt if fmt is not None else None,
        "style": _STYLES.get(type(fmt._style), "%") if fmt is not None else "%",
    }
    if isinstance(h, logging.FileHandler):
        return {**spec, "path": h.baseFilename, "encoding": h.encoding}
    if type(h) is logging.StreamHandler:  # a subclass may write elsewhere than its stream
        try:
            fd = h.stream.fileno()
        except (AttributeError, OSError, ValueError):
            return None
        return {**spec, "fd": fd}
    return None


def apply_logging_plan(plan: dict[str, Any] | None) -> logging.Handler | None:
    """In the sidecar: the owner's handlers, level and ``disabled`` for ``healthkit``; with
    no handler carried, the sidecar's own line on its stderr (at the owner's level). When
    the plan relays lines to the owner, that stderr line is returned instead of installed:
    it is written only for lines the owner did not take (see :class:`RelayHandler`)."""
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    log = logging.getLogger("healthkit")
    if plan is None:
        plan = {"level": logging.INFO, "disabled": False, "handlers": []}
    built: list[logging.Handler] = []
    for spec in plan["handlers"]:
        try:
            handler: logging.Handler
            if "path" in spec:
                handler = logging.FileHandler(spec["path"], encoding=spec["encoding"], delay=True)
            else:
                stream = os.fdopen(os.dup(spec["fd"]), "w", buffering=1, closefd=True)
                handler = logging.StreamHandler(stream)
        except OSError:
            continue
        if spec["fmt"] is not None or spec["datefmt"] is not None:
            handler.setFormatter(
                logging.Formatter(spec["fmt"], spec["datefmt"], style=spec["style"])
            )
        handler.setLevel(spec["level"])
        built.append(handler)
    fallback: logging.Handler | None = None
    if not built:
        fallback = logging.StreamHandler(sys.stderr)
        fallback.setFormatter(logging.Formatter(SIDECAR_FORMAT))
        if not plan.get("relay"):
            built.append(fallback)
            fallback = None
    for handler in built:
        log.addHandler(handler)
    log.propagate = False
    log.setLevel(plan["level"])
    log.disabled = bool(plan["disabled"])
    return fallback


def drain_queue(handler: logging.Handler, timeout: float = 2.0) -> None:
    """A ``QueueHandler``'s ``flush`` writes nothing: its records are written later by the
    application's ``QueueListener`` thread. "logged" lets the sidecar stop this process, so
    wait (bounded) until that listener has taken every record (``task_done``); a queue that
    does not count its tasks (a multiprocessing queue) is handed over as it is."""
    queue = getattr(handler, "queue", None)
    if not isinstance(handler, logging.handlers.QueueHandler) or queue is None:
        return
    deadline = time.monotonic() + timeout
    while getattr(queue, "unfinished_tasks", 0) and time.monotonic() < deadline:
        time.sleep(0.005)


class RelayHandler(logging.Handler):
    """In the sidecar: send each record to the owner, for its handlers the sidecar cannot
    write through itself.

    With ``fallback`` (the owner has no handler the sidecar writes through), each line is
    also kept until the owner confirms it took it (``logged`` answers a ``flush`` that
    counts the lines sent), and written to ``fallback`` (stderr) only if it never does (its
    GIL held, or gone): a line printed by both would show twice on a QueueHandler's
    console."""

    def __init__(self, sock: socket.socket, fallback: logging.Handler | None) -> None:
        super().__init__()
        self.sock = sock
        self.fallback = fallback
        self.sent = 0
        self.unconfirmed: list[tuple[int, logging.LogRecord]] = []

    def emit(self, record: logging.LogRecord) -> None:
        msg = encode(Log(level=record.levelno, msg=record.getMessage(), created=record.created))
        self.sent += 1
        if self.fallback is not None:
            self.unconfirmed.append((self.sent, record))
            msg += encode(Flush(n=self.sent))
        with contextlib.suppress(OSError):
            self.sock.sendall(msg)

    def confirmed(self, n: object) -> None:
        """The owner handed the first ``n`` lines to its handlers."""
        if isinstance(n, int):
            self.unconfirmed = [(i, r) for i, r in self.unconfirmed if i > n]

    def write_unconfirmed(self) -> None:
        """The owner will not take them: write them to ``fallback`` (stderr)."""
        pending, self.unconfirmed = self.unconfirmed, []
        if self.fallback is not None:
            for _, record in pending:
                if record.levelno >= self.fallback.level:
                    self.fallback.handle(record)
            self.fallback.flush()
