"""What healthkit's sibling distributions share with the core, and nothing else imports.

``healthkit_glt``, ``healthkit_graphlearn`` and ``healthkit_torch`` refuse bad input with the
core's errors (:class:`healthkit.InvalidArgumentError` naming the argument, the same message
shapes) through these validators, make the names they export report their public module
through :func:`publish`, and read ``/proc`` through the core's readers
(:func:`sysv_shm_segments`: healthkit_glt's channel segment), and register their interpreter
exit steps in the core's one exit sequence (:func:`at_exit`, :mod:`healthkit._runtime`), so
that their order against the core's steps and multiprocessing's teardown is written down in
one place. This module is not public
API: the four distributions are released together under one version
(``healthkit/_version.py``), so it changes with them, and ``tests/core/test_layers.py``
checks that only they import it. What an application or an
extender composes is in :mod:`healthkit.lowlevel`.
"""

from __future__ import annotations

from collections.abc import Iterable

from healthkit._errors import (
    check_bool,
    check_bound,
    check_callable,
    check_choice,
    check_exit_code,
    check_int,
    check_seconds,
    check_timeout,
)
from healthkit._os.proc import sysv_shm_segments
from healthkit._runtime import at_exit

__all__ = [
    "at_exit",
    "check_bool",
    "check_bound",
    "check_callable",
    "check_choice",
    "check_exit_code",
    "check_int",
    "check_seconds",
    "check_timeout",
    "publish",
    "sysv_shm_segments",
]


def publish(public_module: str, objects: Iterable[object]) -> None:
    """Make each class and function of ``objects`` defined in a private module of
    ``public_module``'s package (``healthkit_glt._producer``) report ``public_module``
    (``healthkit_glt``) as its module: in reprs, tracebacks, recorded outputs and pickles,
    users see the name they import. Classes nested in a published class follow it. An
    object from elsewhere (the core's names re-exported by an integration) keeps its own."""
    private = public_module.partition(".")[0] + "._"
    seen: set[int] = set()
    todo = list(objects)
    while todo:
        obj = todo.pop()
        if id(obj) in seen or not (isinstance(obj, type) or hasattr(obj, "__code__")):
            continue
        seen.add(id(obj))
        if not getattr(obj, "__module__", "").startswith(private):
            continue
        obj.__module__ = public_module
        if isinstance(obj, type):
            todo += [
                v
                for v in vars(obj).values()
                if isinstance(v, type) and v.__qualname__.startswith(obj.__qualname__ + ".")
            ]
