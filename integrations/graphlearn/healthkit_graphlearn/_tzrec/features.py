"""Which graph-learn build is in use, and the settings that only some builds have.

Why: TorchEasyRec calls ``gl.set_use_string_hash_id`` and ``gl.set_load_graph_thread_num``,
which its own ``graphlearn`` wheel (1.3.8) has and the GL inside ``graphscope-client`` 0.29
does not (an ``AttributeError`` there). Code written for one build must run on the other, so
the difference is detected on the module in use, never assumed from a version:

* ``set_load_graph_thread_num`` only changes how fast the server loads its tables: where it
  is missing, :func:`set_load_graph_thread_num` skips it and says so once in the log;
* ``set_use_string_hash_id`` changes what node ids mean (string ids hashed to int64): where
  it is missing, :func:`set_use_string_hash_id` raises :class:`GraphLearnFeatureError`,
  since silently sampling with the wrong ids is worse than stopping.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from types import ModuleType

import attrs

from healthkit import InvalidArgumentTypeError, UnsupportedError
from healthkit._shared import check_int
from healthkit_graphlearn._tzrec.gl_import import graphlearn_distribution, import_graphlearn

__all__ = [
    "TZREC_GL_CALLS",
    "GraphLearnBuild",
    "GraphLearnFeatureError",
    "graphlearn_build",
    "set_load_graph_thread_num",
    "set_use_string_hash_id",
]

logger = logging.getLogger("healthkit.graphlearn")

#: The module-level GL functions TorchEasyRec's sampler and this integration call.
TZREC_GL_CALLS = (
    "set_tracker_mode",
    "set_field_delimiter",
    "set_use_string_hash_id",
    "set_load_graph_thread_num",
    "set_retry_times",
    "set_timeout",
)

_skipped_lock = threading.Lock()
_skipped: set[str] = set()


class GraphLearnFeatureError(UnsupportedError):
    """The graph-learn build in use lacks a function the caller needs; the message names
    the function and the build."""


@attrs.frozen
class GraphLearnBuild:
    """What was detected about a ``graphlearn`` module."""

    path: str  # the package directory
    distribution: str | None  # e.g. "graphscope-client", "graphlearn"; None: not installed
    version: str | None
    missing: frozenset[str]  # of TZREC_GL_CALLS

    def has(self, name: str) -> bool:
        """Whether the module has the function ``name`` (any name, not only the known)."""
        return name not in self.missing

    def describe(self) -> str:
        where = f"{self.distribution} {self.version}" if self.distribution else "not installed"
        return f"graph-learn at {self.path} ({where})"


def graphlearn_build(gl: ModuleType | None = None) -> GraphLearnBuild:
    """Describe ``gl`` (default: the ``graphlearn`` in use, imported by
    :func:`~healthkit_graphlearn.import_graphlearn` if needed)."""
    _check_gl(gl)
    gl = import_graphlearn() if gl is None else gl
    path = Path(os.path.abspath(getattr(gl, "__file__", None) or ".")).parent
    dist = graphlearn_distribution(path)
    missing = frozenset(n for n in TZREC_GL_CALLS if not callable(getattr(gl, n, None)))
    return GraphLearnBuild(
        str(path),
        dist.metadata["Name"] if dist is not None else None,
        dist.version if dist is not None else None,
        missing,
    )


def _check_gl(gl: object) -> None:
    if gl is not None and not isinstance(gl, ModuleType):
        raise InvalidArgumentTypeError(
            f"gl must be the graphlearn module or None, got {gl!r}", "gl"
        )


def set_load_graph_thread_num(num: int, gl: ModuleType | None = None) -> bool:
    """``gl.set_load_graph_thread_num(num)`` where the build has it; returns whether it did.

    Call it before launching the server (the forked server inherits the setting). A build
    without it loads with its own thread count; that is logged once at INFO.
    """
    check_int(num, "num", minimum=1)
    _check_gl(gl)
    gl = import_graphlearn() if gl is None else gl
    fn = getattr(gl, "set_load_graph_thread_num", None)
    if callable(fn):
        fn(num)
        return True
    with _skipped_lock:
        first = "set_load_graph_thread_num" not in _skipped
        _skipped.add("set_load_graph_thread_num")
    if first:
        logger.info(
            "%s has no set_load_graph_thread_num: the server loads with its default "
            "thread count (only loading speed differs)",
            graphlearn_build(gl).describe(),
        )
    return False


def set_use_string_hash_id(gl: ModuleType | None = None) -> None:
    """``gl.set_use_string_hash_id(1)``: node ids are strings, hashed by GL.

    Raises:
        GraphLearnFeatureError: the build has no such setting; its ids would be read as
            int64 and sampling would silently return wrong nodes.
    """
    _check_gl(gl)
    gl = import_graphlearn() if gl is None else gl
    fn = getattr(gl, "set_use_string_hash_id", None)
    if not callable(fn):
        raise GraphLearnFeatureError(
            f"{graphlearn_build(gl).describe()} has no set_use_string_hash_id, so it cannot "
            "read string node ids: use TorchEasyRec's graphlearn wheel (1.3.8 has it), or "
            "give the node tables int64 ids"
        )
    fn(1)


import healthkit_graphlearn as _package  # noqa: E402

_package._publish(__name__)
