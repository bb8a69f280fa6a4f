"""healthkit_glt's ``DistLinkNeighborLoader`` and ``DistSubGraphLoader`` on real GLT: the same
batches as stock GLT's loaders, the same guarantees as the neighbor loader (they share its
machinery, ``healthkit_glt._loader.HealthkitLoader``).

Each case runs in its own process group (``glt_loader_kinds``): stock GLT's hang blocks
inside C++ there, which only a group SIGKILL ends. The neighbor loader's own cases, and the
fault paths every loader shares through the producer (init failures, sampling errors,
stalls), are in test_healthkit_glt.py.
"""

from __future__ import annotations

import os
import sys

import pytest

pytest.importorskip("graphlearn_torch")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import glt_loader_kinds as kinds

pytestmark = pytest.mark.glt

SUBPROCESS_TIMEOUT_S = 240


def _no_tracebacks(output: str) -> list[str]:
    bad = ("Traceback", "Exception ignored", "Error", "error")
    lines = [line for line in output.splitlines() if not line.startswith("RESULT ")]
    return [line for line in lines if any(b in line for b in bad)]


@pytest.mark.timeout(SUBPROCESS_TIMEOUT_S)
def test_link_and_subgraph_epochs_match_stock_glt_and_end_clean_by_shutdown_or_exit() -> None:
    """Non-firing twins: a clean epoch of each loader gives stock GLT's batches (same seed);
    the link loader's ``shutdown()`` stops its workers with STOP (exit 0), bounded and
    idempotent, and releases the ring; the subgraph loader, never shut down, is ended by the
    interpreter's exit without a traceback, a survivor or a segment left."""
    run = kinds.run("clean", timeout=180)
    assert run.returncode == 0, run.output
    by_kind = {r["kind"]: r for r in run.results}
    assert sorted(by_kind) == sorted(kinds.KINDS), run.output
    for kind, r in by_kind.items():
        assert r["batches"] == -(-kinds.NUM_SEEDS // 64), (kind, r)
        assert r["same_as_stock"] is True, (kind, r)
        assert r["second_epoch_same_batches"] is False, (kind, r)  # reshuffled
        assert r["stall_timeout"] == 60.0, (kind, r)  # producer arguments reach the producer
    link = by_kind["link"]
    assert link["worker_exit_codes"] == [0] * kinds.NUM_WORKERS  # STOP, not SIGTERM
    assert link["failure"] == "None"
    assert link["segments_left"] == []
    assert link["shutdown_s"] < link["bound_s"] and link["again_s"] < 0.1
    assert link["iter_after_shutdown"] == "UsageError"
    assert len(by_kind["subgraph"]["worker_pids"]) == kinds.NUM_WORKERS
    assert _no_tracebacks(run.output) == [], run.output
    assert run.survivors == [] and run.leaked_segments == []


@pytest.mark.timeout(SUBPROCESS_TIMEOUT_S)
@pytest.mark.parametrize("kind", kinds.KINDS)
def test_worker_sigkilled_mid_epoch_stock_glt_hangs_healthkit_glt_fails_in_seconds(
    kind: str,
) -> None:
    # Stock: watched for 6 s after the kill (longer than healthkit_glt's bound below), then
    # killed.
    stock = kinds.run("sigkill", [kind, "stock"], timeout=90.0, hang_after_kill=6.0)
    assert stock.returncode is None, stock.output  # hung in ShmChannel.recv
    assert kinds.stock.KILL_MARK in stock.output, stock.output
    assert 'shm_channel.py", line 66 in recv' in stock.stacks, stock.stacks

    run = kinds.run("sigkill", [kind, "hk"], timeout=120)
    r = run.result
    assert run.returncode == 0, run.output
    assert r["outcome"] == "raised" and r["type"] == "SamplingWorkerDiedError", r
    assert r["after_kill_s"] < 5.0
    assert (r["rank"], r["signal"]) == (kinds.VICTIM, "SIGKILL")
    waited = f"died while the loader waited for batch {r['batches'] + 1};"
    assert f"sampling worker {kinds.VICTIM} {waited}" in r["message"], r["message"]
    assert r["same_error_on_reuse"] is True
    assert r["children_left"] == []
    assert run.survivors == [] and run.leaked_segments == []


def test_each_loader_is_glts_own_class_with_healthkit_glts_machinery_under_it() -> None:
    """GLT's own ``__init__`` builds each loader's sampler input and config, and its
    ``super().__init__`` lands in the one shared ``HealthkitLoader`` (not a copy per loader)."""
    import graphlearn_torch.distributed as gd
    import healthkit_glt as hg
    from healthkit_glt._loader import HealthkitLoader

    for name in ("DistNeighborLoader", "DistLinkNeighborLoader", "DistSubGraphLoader"):
        ours, theirs = getattr(hg, name), getattr(gd, name)
        assert ours.__mro__[1:] == (theirs, HealthkitLoader, gd.DistLoader, object), name
        assert ours.__module__ == "healthkit_glt"
        assert "shutdown" not in vars(ours) and "__next__" not in vars(ours), name
