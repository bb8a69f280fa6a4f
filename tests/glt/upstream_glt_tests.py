"""Run graphlearn-torch's own distributed loader tests with healthkit_glt's loaders swapped in.

GLT's ``test/python/test_dist_{neighbor,link,subgraph}_loader.py`` (from the upstream source
snapshot the 2.8 stack is built from, ``../shared/src/graphlearn-for-pytorch-26fe3d4.tar.gz``)
are extracted into ``build/upstream-glt-tests/`` and run there with pytest, after two
changes written into the copies:

- healthkit_glt swapped in: each test module starts by replacing GLT's
  ``DistNeighborLoader``, ``DistLinkNeighborLoader``, ``DistSubGraphLoader`` and
  ``init_server`` in ``graphlearn_torch.distributed`` by healthkit_glt's, so the tests'
  trainers, clients and servers (spawned processes that import the module again) build ours
  (GLT's ``wait_and_shutdown_server`` stays: healthkit_glt's is GLT's, and calls it by that
  name; ``--stock``: nothing swapped, the baseline);
- CPU instead of CUDA (this machine has no GPU): ``torch.device('cuda', i)`` and
  ``'cuda:N'`` become the CPU device, ``ZERO_COPY`` graphs ``CPU`` ones, features
  ``with_gpu=False``, and ``pin_memory=False``. Nothing else of the tests changes: the
  graphs, the loaders' arguments and every check are upstream's.

Upstream's tests run their checks in spawned processes and never look at their exit codes;
the ``conftest.py`` written beside them fails a test whose processes did not all exit 0,
and kills what is left when a test times out. ``parameterized`` (upstream's test dependency,
not installed here) is replaced by a stand-in for the one form they use,
``parameterized.expand([...])``.

Not part of the suite (each case starts four to six processes that import torch: minutes
per file on two cores). Run by hand, one stack at a time::

    .venv-glt/bin/python tests/glt/upstream_glt_tests.py link subgraph [--stock] [-- -k mp]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOT = "graphlearn-for-pytorch-26fe3d4"
# ../shared/src beside the checkout (or beside the folder of a worktree's checkout)
TARBALL = Path(
    os.environ.get("HEALTHKIT_GLT_SRC")
    or next(
        (p for d in (ROOT.parent, ROOT.parent.parent)
         if (p := d / "shared" / "src" / f"{SNAPSHOT}.tar.gz").exists()),
        ROOT.parent / "shared" / "src" / f"{SNAPSHOT}.tar.gz",
    )
)  # fmt: skip
FILES = {
    "neighbor": "test_dist_neighbor_loader.py",
    "link": "test_dist_link_loader.py",
    "subgraph": "test_dist_subgraph_loader.py",
}
HELPERS = ("dist_test_utils.py",)

#: CUDA to CPU, as (pattern, replacement): the only edits to upstream's code.
CPU = (
    (r"torch\.device\('cuda', [^)]*\)", "torch.device('cpu')"),
    (r"device='cuda:\d'", "device='cpu'"),
    (r"'ZERO_COPY', device=0\)", "'CPU')"),
    (r"device_group_list, device=0\)", "device_group_list, device=0, with_gpu=False)"),
    (r"pin_memory=True", "pin_memory=False"),
)

SWAP = '''\
# --- added by healthkit's tests/glt/upstream_glt_tests.py: healthkit_glt swapped in ---
import graphlearn_torch.distributed as _glt_distributed
import healthkit_glt as _healthkit_glt

for _name in ("DistNeighborLoader", "DistLinkNeighborLoader", "DistSubGraphLoader",
              "init_server"):
    setattr(_glt_distributed, _name, getattr(_healthkit_glt, _name))
# --- end of the addition ---
'''

CONFTEST = '''\
"""Written by healthkit's tests/glt/upstream_glt_tests.py (see there)."""

import signal
from multiprocessing.process import BaseProcess

import pytest


@pytest.fixture(autouse=True)
def every_process_exits_0(monkeypatch):
    """Upstream's tests check their batches in spawned processes and join them without
    looking at how they ended: a failed check or a hang there would pass. Here every process
    a test starts must exit 0, and whatever is left at the end is killed."""
    started = []
    real_start = BaseProcess.start

    def start(self):
        real_start(self)
        started.append(self)

    monkeypatch.setattr(BaseProcess, "start", start)
    yield
    left = [p for p in started if p.exitcode is None]
    for p in left:
        p.kill()
        p.join(10)
    codes = {f"{p.name} (pid {p.pid})": p.exitcode for p in started}
    assert not left and all(c == 0 for c in codes.values()), codes
'''

PARAMETERIZED = '''\
"""Stand-in for the ``parameterized`` package (written by healthkit's
tests/glt/upstream_glt_tests.py): ``parameterized.expand(cases)`` adds one test method per
case to the class being defined, named ``<method>_<index>``, as the package does."""

import sys


class parameterized:
    @staticmethod
    def expand(cases):
        namespace = sys._getframe(1).f_locals

        def decorate(fn):
            for i, case in enumerate(cases):
                args = case if isinstance(case, tuple) else (case,)

                def method(self, _args=args, _fn=fn):
                    return _fn(self, *_args)

                method.__name__ = f"{fn.__name__}_{i}"
                namespace[method.__name__] = method
            return None

        return decorate
'''


def prepare(target: Path, kinds: list[str], *, swap: bool) -> list[Path]:
    """Extract and adapt the test files of ``kinds`` (and their helpers) into ``target``."""
    target.mkdir(parents=True, exist_ok=True)
    wanted = [FILES[k] for k in kinds]
    with tarfile.open(TARBALL) as tar:
        for name in (*HELPERS, *wanted):
            member = tar.extractfile(f"{SNAPSHOT}/test/python/{name}")
            assert member is not None, name
            text = member.read().decode()
            for pattern, replacement in CPU:
                text = re.sub(pattern, replacement, text)
            if swap and name in wanted:
                text = SWAP + text
            (target / name).write_text(text)
    (target / "conftest.py").write_text(CONFTEST)
    (target / "parameterized.py").write_text(PARAMETERIZED)
    (target / "pytest.ini").write_text("[pytest]\ntimeout = 300\n")
    return [target / name for name in wanted]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kinds", nargs="*", choices=sorted(FILES), default=sorted(FILES))
    parser.add_argument("--stock", action="store_true", help="GLT's own loaders (baseline)")
    own, _, extra = (argv, None, []) if "--" not in argv else (
        argv[: argv.index("--")], None, argv[argv.index("--") + 1 :]
    )  # fmt: skip
    args = parser.parse_args(own)
    if not TARBALL.exists():
        print(f"no GLT source snapshot at {TARBALL} (set HEALTHKIT_GLT_SRC)", file=sys.stderr)
        return 2
    target = ROOT / "build" / "upstream-glt-tests" / ("stock" if args.stock else "swapped")
    files = prepare(target, args.kinds, swap=not args.stock)
    env = dict(os.environ)
    paths = [str(ROOT), *(str(ROOT / "integrations" / d) for d in ("glt", "graphlearn", "torch"))]
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", *map(str, files),
           *extra]  # fmt: skip
    print("$", " ".join(cmd), f"(in {target})", flush=True)
    return subprocess.call(cmd, cwd=target, env=env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
