"""Stock graphlearn-torch works here: one epoch of a 2-worker mp-mode DistNeighborLoader on a
small random graph, in this process, bounded, and nothing is left behind afterwards."""

from __future__ import annotations

import gc
import os
import sys
import time
from collections.abc import Iterator

import pytest

pytest.importorskip("graphlearn_torch")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import glt_fixtures as fx
import glt_procs as procs

pytestmark = pytest.mark.glt

# The loader blocks inside C++ (ShmChannel.recv) where a SIGALRM handler never runs, so the
# pytest-timeout signal method cannot end a hang here: use its thread method as the last
# resort, and our own guard first, which also kills the sampling workers so that a hang does
# not leave orphans behind when the run is aborted.
TEST_TIMEOUT_S = 300
GUARD_S = 270


@pytest.fixture
def spawn_start_method() -> Iterator[None]:
    """GLT needs ``spawn`` as the default start method; restore the previous one afterwards
    (the graphlearn tier that runs in the same session starts its server with fork)."""
    import multiprocessing as mp

    before = mp.get_start_method(allow_none=True)
    fx.set_spawn()
    yield
    mp.set_start_method(before, force=True)


@pytest.mark.timeout(TEST_TIMEOUT_S, method="thread")
def test_one_epoch_with_two_workers_covers_every_seed_and_shuts_down_clean(
    spawn_start_method: None, stop_resource_sharer: None, request: pytest.FixtureRequest
) -> None:
    segments_before = set(procs.sysv_shm_created_by([os.getpid()]))
    worker_pids: list[int] = []

    with procs.hang_guard(request.node.nodeid, GUARD_S, lambda: worker_pids):
        fx.init_single_process_context()
        dataset = fx.build_dataset()
        t0 = time.monotonic()
        loader = fx.build_loader(
            dataset,
            fx.make_worker_options(num_workers=2, channel_capacity=fx.STOCK_SAFE_CHANNEL_CAPACITY),
        )
        startup = time.monotonic() - t0
        worker_pids.extend(w.pid for w in loader._mp_producer._workers)
        try:
            t1 = time.monotonic()
            epoch = fx.consume_epoch(loader)
            elapsed = time.monotonic() - t1
        finally:
            loader.shutdown()
        workers = loader._mp_producer._workers
        # Stock shutdown joins each worker for 5 s at most: on a loaded machine one still
        # exiting stays in multiprocessing's children with its sentinel pipe open (the leak
        # check saw those fds). Its exit code below is what this test checks.
        for w in workers:
            w.join(60)
        del loader, dataset
        gc.collect()  # the ShmChannel's owner removes its SysV segment in its destructor

    assert len(epoch.digests) == -(-fx.NUM_NODES // fx.BATCH_SIZE)
    assert epoch.seeds == list(range(fx.NUM_NODES))
    assert [w.exitcode for w in workers] == [0, 0]
    assert set(procs.sysv_shm_created_by([os.getpid()])) == segments_before
    print(f"start-up {startup:.2f}s, epoch {elapsed:.3f}s")
