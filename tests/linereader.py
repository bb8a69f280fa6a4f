"""Read a child's output with deadlines. ``readline()`` on a pipe blocks until a newline or
EOF, so a job that prints less than expected (or two ranks whose lines interleave) hangs the
test until pytest-timeout; every test that waits for a line reads through this."""

from __future__ import annotations

import os
import re
import selectors
import time
from typing import Any


class LineReader:
    """Read a pipe line by line with a deadline (``readline()`` alone can block forever)."""

    def __init__(self, stream: Any) -> None:
        self._fd = stream.fileno()
        self._buf = b""
        self.lines: list[str] = []
        self.eof = False

    def _read_more(self, deadline: float) -> bool:
        """Read what the pipe has within the deadline; False once it timed out or hit EOF."""
        if self.eof:
            return False
        with selectors.DefaultSelector() as sel:
            sel.register(self._fd, selectors.EVENT_READ)
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not sel.select(remaining):
                return False
        chunk = os.read(self._fd, 65536)
        if not chunk:
            self.eof = True
            chunk = b"\n"
        self._buf += chunk
        *done, self._buf = self._buf.split(b"\n")
        self.lines += [raw.decode(errors="replace") for raw in done]
        return True

    def until(self, pattern: str, timeout: float) -> re.Match[str] | None:
        """The first match in the lines read so far or arriving within ``timeout`` s."""
        found = self.matches(pattern, 1, timeout)
        return found[0] if found else None

    def matches(self, pattern: str, count: int, timeout: float) -> list[re.Match[str]]:
        """Every match (several per line if lines interleave) once there are ``count`` of them,
        or those seen when ``timeout`` s pass or the pipe ends."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        seen = 0
        found: list[re.Match[str]] = []
        while True:
            for line in self.lines[seen:]:
                found += rx.finditer(line)
            seen = len(self.lines)
            if len(found) >= count or not self._read_more(deadline):
                return found

    def rest(self) -> str:
        while self._read_more(time.monotonic() + 30):  # drain to EOF (the process has ended)
            pass
        return "\n".join(self.lines)
