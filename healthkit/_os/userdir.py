"""Where a helper leaves what its owner may need after it is gone: this user's private
directory of exception records (:mod:`healthkit._diagnose.records`) and stack-dump opt-ins
(:mod:`healthkit._diagnose.stacks`).

Owner and helper compute it from the same environment, so nothing is passed down: fork,
spawn and forkserver children and subprocesses inherit it. It is used only when it belongs
to this user and nobody else can write to it (:mod:`healthkit._os.safefile`).
"""

from __future__ import annotations

import os
import tempfile

__all__ = ["RECORD_DIR_ENV", "default_record_dir", "record_dir"]

#: Environment variable naming the directory of exception records and stack-dump opt-ins.
RECORD_DIR_ENV = "HEALTHKIT_RECORD_DIR"


def record_dir() -> str:
    """The directory of this user's exception records and stack-dump opt-ins:
    ``$HEALTHKIT_RECORD_DIR``, else ``healthkit-<euid>`` in the temp directory
    (``$TMPDIR``, usually ``/tmp``)."""
    return os.environ.get(RECORD_DIR_ENV) or default_record_dir()


def default_record_dir() -> str:
    """``healthkit-<euid>`` in the temp directory: where a helper writes when it did not
    inherit ``$HEALTHKIT_RECORD_DIR`` (a forkserver started before the variable was set
    passes its own, older environment to the children it forks)."""
    return os.path.join(tempfile.gettempdir(), f"healthkit-{os.geteuid()}")
