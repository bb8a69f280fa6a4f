"""``healthkit demo --scenario dataloader-oom``: a DataLoader worker OOM-killed, the error a
training loop gets from stock torch, and the one it gets with ``healthkit_torch``.

The training loop runs in a process of its own (``python -m healthkit._tools.demo_dataloader``),
once with a stock ``DataLoader`` and once with ``healthkit_torch.watch``. Worker 1 moves
itself into a memory cgroup limited to 256 MiB when this machine lets the demo make one, and
allocates until the kernel's OOM killer ends it; elsewhere it SIGKILLs itself, which is what
the OOM killer sends (and the healthkit run then says "unconfirmed", truthfully). torch and
healthkit_torch are imported only in that process: ``import healthkit`` stays torch-free.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

ALLOCATE_AT = 40  # the item whose fetch makes worker 1 allocate


def _worker_dies(cgroup_dir: str | None) -> None:
    if cgroup_dir is None:
        os.kill(os.getpid(), signal.SIGKILL)
        return
    with open(os.path.join(cgroup_dir, "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))
    cache = []
    while True:  # a per-worker cache that grows: the classic DataLoader OOM
        block = bytearray(16 * 1024 * 1024)
        for j in range(0, len(block), 4096):
            block[j] = 1
        cache.append(block)


def _train(guarded: bool, cgroup_dir: str | None) -> int:
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Samples(Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return 10_000

        def __getitem__(self, i: int) -> Any:
            if i == ALLOCATE_AT:
                info = torch.utils.data.get_worker_info()
                if info is not None and info.id == 1:
                    _worker_dies(cgroup_dir)
            time.sleep(0.002)
            return torch.zeros(64)

    # Batch 5 (items 40-47) goes to worker 1: torch hands batches to its workers in turn.
    loader = DataLoader(Samples(), batch_size=8, num_workers=2, multiprocessing_context="fork")
    if guarded:
        import healthkit_torch  # type: ignore[import-not-found,unused-ignore]

        loader = healthkit_torch.watch(loader)
    try:
        for _ in loader:
            time.sleep(0.01)  # the training step
    except RuntimeError as e:
        print(f"ERROR {type(e).__name__}: {e}", flush=True)
        return 1
    return 0


def run_one(guarded: bool, cgroup_dir: str | None, timeout: float) -> tuple[float, str]:
    """Run the training loop; return its wall time and the error line it printed."""
    env = dict(os.environ)
    env.setdefault("PYTHONWARNINGS", "ignore")
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "healthkit._tools.demo_dataloader", "hk" if guarded else "stock",
         cgroup_dir or "-"],
        capture_output=True, text=True, timeout=timeout, env=env,
    )
    took = time.monotonic() - start
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("ERROR ")]
    return took, lines[0][6:] if lines else (proc.stderr.strip().splitlines() or ["(none)"])[-1]


def main(argv: list[str]) -> int:
    guarded = argv[0] == "hk"
    cgroup_dir = None if argv[1] == "-" else argv[1]
    return _train(guarded, cgroup_dir)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
