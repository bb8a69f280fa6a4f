"""The adapter: every touch of graphlearn-torch's internals, and every bit of knowledge of
which GLT build is installed, in this subpackage and nowhere else in healthkit_glt.

==================  ========================================================================
``build``           the installed build (``glt_version``, ``glt_build``), the builds known
                    (``KNOWN_BUILDS``), the import-time :func:`self_check`, and the error
                    that says which stack to install when graphlearn-torch fails to import
``ring``            ``ShmChannel``'s C++ ring (``ShmQueueMeta``): its layout, a read-only
                    :class:`~healthkit_glt._adapter.ring.RingView` of it (checked, or
                    ``RingLayoutError``), and its SysV segment's life (the ``_queue`` swap)
``loader_state``    the private state GLT's ``DistLoader`` keeps on a loader
``producer``        the producer state healthkit_glt's subclass shares with GLT's, and the
                    torch privates GLT's worker loop uses
``server``          GLT's server slot and context, and its ``DistServer``'s producer pools
==================  ========================================================================

The rest of healthkit_glt (its own logic) imports GLT's public names only, and these
modules' functions; ``tests/glt`` checks both that the own-logic modules touch no GLT
private and that :data:`REQUIRED` names every private the adapter modules touch.

Importing this package imports graphlearn-torch (``healthkit_glt/__init__`` imports it
first): a missing or broken stack fails here with what to install, not with GLT's own error;
then :func:`self_check` runs: a build that lacks one of :data:`REQUIRED` fails the import
with what is missing, and so does a build not in :data:`KNOWN_BUILDS`, naming its version
(the checks find a name, not what it means): accept one with ``$HEALTHKIT_GLT_ACCEPT_BUILD``
set to its version after running tests/glt on it (docs/glt.md, "Supported versions").
"""

from __future__ import annotations

from healthkit_glt._adapter import build
from healthkit_glt._adapter.build import ACCEPT_BUILD_ENV, KNOWN_BUILDS, Required

try:
    import graphlearn_torch.channel  # noqa: F401  (the package's first GLT import)
except Exception as e:  # ImportError, or GLT's RuntimeError on a torch it was not built for
    raise build.stack_error(e) from e

from healthkit_glt._adapter import loader_state, producer, ring, server

__all__ = [
    "ACCEPT_BUILD_ENV",
    "KNOWN_BUILDS",
    "REQUIRED",
    "self_check",
]

#: Every GLT (and torch) private the adapter touches: (module, object or None, name), as
#: :data:`healthkit_glt._adapter.build.Required` says.
REQUIRED: tuple[Required, ...] = (
    *ring.REQUIRED,
    *loader_state.REQUIRED,
    *producer.REQUIRED,
    *server.REQUIRED,
)


def self_check(version: str | None = None, required: tuple[Required, ...] = REQUIRED) -> None:
    """:func:`healthkit_glt._adapter.build.self_check` over :data:`REQUIRED`."""
    build.self_check(required, version)


self_check()
