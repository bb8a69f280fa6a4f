"""Fixtures shared by the glt tier's in-process tests (the leak check is tests/conftest.py's)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="module", autouse=True)
def multiprocessing_singletons() -> None:
    """Create the stdlib's per-interpreter multiprocessing singletons before the per-test leak
    snapshot: the resource tracker (conftest already exempts its process, not its pipe fd) and
    the shared-memory heap arena behind ``mp.Value`` (GLT's producer makes one; a small arena
    and its two fds, the file and mmap's dup of it, live as long as the interpreter)."""
    import multiprocessing as mp
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    value = mp.get_context("spawn").Value("I", lock=True)
    del value
    # Grow the heap's arena once, here: producers allocate small shared objects (counters,
    # barrier flags); when a later allocation does not fit the first 4 KiB arena, a new
    # arena (a deleted /dev/shm file + mmap: 2 fds for the life of the interpreter) would
    # appear inside a test and look like that test's leak.
    big = mp.get_context("spawn").RawArray("b", 1 << 20)
    del big


@pytest.fixture
def stop_resource_sharer() -> Iterator[None]:
    """Stop multiprocessing's fd-passing server thread after the test.

    Spawning a worker with a tensor in shared memory (torch's default ``file_descriptor``
    strategy) passes fds through ``multiprocessing.resource_sharer``, whose listener thread
    (``_serve``) and socket live until the interpreter exits. It is stdlib, not GLT, and it is
    restarted on demand, so stopping it once the workers have their fds is safe.
    """
    yield
    from multiprocessing import resource_sharer

    resource_sharer.stop(timeout=5)
