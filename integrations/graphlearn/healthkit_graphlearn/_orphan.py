"""Small process helpers for the server process (the die-with-parent guarantee itself is
``healthkit.die_with_parent``)."""

from __future__ import annotations

import ctypes
import os

__all__ = ["set_thread_name"]

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15


def _prctl(option: int, arg: int | bytes) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, arg, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl({option}) failed: {os.strerror(err)}")


def set_thread_name(name: str) -> None:
    """Set this thread's kernel name (``comm``, 15 bytes), shown by ps/top; best effort."""
    try:
        _prctl(_PR_SET_NAME, name.encode()[:15])
    except OSError:
        pass
