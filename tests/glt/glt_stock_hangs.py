"""The stock graphlearn-torch (GLT) hangs that healthkit_glt exists to end, reproduced, and
``run_script``, which runs them (and ``glt_scenarios``' fault scripts) in a throwaway process
group: a hang blocks inside C++, where no Python-level timeout reaches it, so only a group
SIGKILL at a deadline ends it.

Runnable as a script for measurements and for reproducing the hangs by hand::

    H=".venv-glt/bin/python tests/glt/glt_stock_hangs.py"
    $H bench 5                               # start-up, epoch and shutdown times, checksums
    $H run hang-init 45 [KILL_AFTER] [RANK]  # SIGKILL a worker during init (default 0.5 s, 0)
    $H run hang-epoch 45 [TIMEOUT_MS] [SLOW] # SIGKILL worker 1 after batch 1 (0 = stock recv)
    $H run hold-batches 45                   # nothing dies; the consumer keeps CPU batches
    $H run shutdown-after-death 45           # what stock shutdown() does after a death
    $H recv-timeout                          # ShmChannel.recv(timeout_ms) on an empty channel

``run SCENARIO TIMEOUT`` runs the scenario in its own session; if it is still running at
TIMEOUT seconds every process of the group dumps its stacks (SIGUSR1, faulthandler via a
``sitecustomize``), then the group is SIGKILLed and its leaked SysV segment removed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from glt_fixtures import (
    build_dataset,
    build_loader,
    init_single_process_context,
    run_epochs,
    set_spawn,
)
from glt_procs import (
    cmdline,
    pids_in_group,
    read_stacks,
    remove_orphan_sysv_shm,
    sigusr1_stack_dumps,
    spawned_worker_pids,
    sysv_shm_created_by,
)

from healthkit.lowlevel import children, read_proc_stat


@dataclass
class Run:
    returncode: int | None  # None: still running at the deadline (hung), then killed
    elapsed_s: float
    output: str
    results: list[dict[str, Any]]
    stacks: str  # SIGUSR1 dumps of every process of the group when it hung
    leaked_segments: list[int]  # SysV segments of the group still there once it was gone
    survivors: list[int]  # group members alive after the script ended on its own

    @property
    def result(self) -> dict[str, Any]:
        assert self.results, f"no RESULT line; output:\n{self.output[-4000:]}"
        return self.results[-1]


def run_script(
    script: str,
    args: Sequence[str],
    timeout: float,
    extra_env: dict[str, str] | None = None,
    prefix: Sequence[str] | None = None,
    hang_after_kill: float | None = None,
) -> Run:
    """Run ``script args`` in a new session; at ``timeout`` dump every stack of the group
    (SIGUSR1), SIGKILL the group we created, wait for it, then remove (and report) the SysV
    segments its processes left behind. ``prefix``: a command that execs its arguments
    (e.g. ``unshare --net ...``), run in the session's place. ``hang_after_kill``: the deadline
    comes this many seconds after the script says it killed a worker (a line containing
    ``KILL_MARK``), if that is earlier: a hang is watched for a set time after the fault
    whatever the start-up took, instead of a timeout padded for a slow start-up."""
    with sigusr1_stack_dumps() as (env, stacks), tempfile.TemporaryFile(mode="w+") as out:
        env.update(extra_env or {})
        t0 = time.monotonic()
        proc = subprocess.Popen(
            [*(prefix or ()), sys.executable, script, *args], stdout=out,
            stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )  # fmt: skip
        pgid = proc.pid
        rc = _wait_until(proc, out.fileno(), t0 + timeout, hang_after_kill)
        elapsed = time.monotonic() - t0
        members = pids_in_group(pgid)
        survivors: list[int] = []
        if rc is not None:  # ended on its own: does anything of it outlive it? (bounded)
            settle = time.monotonic() + 5
            while pids_in_group(pgid) and time.monotonic() < settle:
                time.sleep(0.02)
            survivors = pids_in_group(pgid)
        cmdlines = {p: cmdline(p) for p in members}
        if rc is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGUSR1)
            time.sleep(2.0)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 10
        while pids_in_group(pgid) and time.monotonic() < deadline:
            time.sleep(0.02)
        creators = [proc.pid, *members]
        leaked: list[int] = []
        shm_deadline = time.monotonic() + 5
        while True:
            left = sysv_shm_created_by(creators)
            leaked = sorted(set(leaked) | set(left))
            remove_orphan_sysv_shm(creators)
            if not sysv_shm_created_by(creators) or time.monotonic() > shm_deadline:
                break
            time.sleep(0.05)
        out.seek(0)
        text = out.read()
        results = [json.loads(line[7:]) for line in text.splitlines() if line.startswith("RESULT ")]
        return Run(rc, elapsed, text, results, read_stacks(stacks, cmdlines), leaked,
                   survivors)  # fmt: skip


KILL_MARK = "SIGKILLed sampling worker"


def _wait_until(
    proc: subprocess.Popen[bytes], out_fd: int, deadline: float, hang_after_kill: float | None
) -> int | None:
    """The script's exit code, or None if it still runs at the deadline (see ``run_script``)."""
    if hang_after_kill is None:
        try:
            return proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return None
    # Its own open file description: reading through ``out`` would move the offset the
    # script writes at.
    reader = os.open(f"/proc/self/fd/{out_fd}", os.O_RDONLY)
    seen = b""
    try:
        while True:
            try:
                return proc.wait(timeout=max(0.0, min(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                if time.monotonic() >= deadline:
                    return None
            if KILL_MARK.encode() not in seen:
                while chunk := os.read(reader, 65536):
                    seen += chunk
                if KILL_MARK.encode() in seen:
                    deadline = min(deadline, time.monotonic() + hang_after_kill)
    finally:
        os.close(reader)


def _say(msg: str) -> None:
    print(f"[driver {time.monotonic():.3f}] {msg}", flush=True)


def _scenario_hang_init(kill_after: float = 0.5, victim: int = 0) -> None:
    """Stock GLT: SIGKILL sampling worker ``victim`` (spawn order) ``kill_after`` seconds after
    both workers exist, while the producer waits in its init barrier."""
    import threading

    set_spawn()
    init_single_process_context()
    dataset = build_dataset()

    def killer() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            pids = spawned_worker_pids()
            if len(pids) == 2:
                time.sleep(kill_after)  # let it get into interpreter / torch start-up
                os.kill(pids[victim], signal.SIGKILL)
                _say(f"{KILL_MARK} {victim} (pid {pids[victim]}) during init")
                return
            time.sleep(0.005)

    threading.Thread(target=killer, name="harness-killer", daemon=True).start()
    _say("building DistNeighborLoader (stock); expected to hang in producer init")
    loader = build_loader(dataset)
    _say("UNEXPECTED: loader built")
    loader.shutdown()


def _scenario_hang_epoch(recv_timeout_ms: int = 0, pre_kill_sleep: float = 0.0) -> None:
    """Stock GLT: SIGKILL sampling worker 1 after the first batch of an epoch arrives.

    ``pre_kill_sleep``: a slow consumer (seconds) before the kill, so the workers are parked in
    ``ShmChannel.send`` with ring slots already claimed. ``recv_timeout_ms > 0``: keep reading
    with ``ShmChannel.recv(timeout_ms=...)`` instead of the loader's unbounded ``recv()``.
    """
    from graphlearn_torch.channel import QueueTimeoutError

    set_spawn()
    init_single_process_context()
    dataset = build_dataset()
    loader = build_loader(dataset)
    workers = loader._mp_producer._workers
    _say(f"loader ready; worker pids {[w.pid for w in workers]}")
    it = iter(loader)
    first = next(it)
    del first
    time.sleep(pre_kill_sleep)
    os.kill(workers[1].pid, signal.SIGKILL)
    _say(f"{KILL_MARK} 1 (pid {workers[1].pid}) after batch 1")
    n = 1
    if recv_timeout_ms <= 0:
        _say("continuing the epoch with the loader; expected to hang in ShmChannel.recv()")
        for _ in it:
            n += 1
    else:
        _say(f"continuing with channel.recv(timeout_ms={recv_timeout_ms})")
        while n < loader._num_expected:
            try:
                msg = loader._channel.recv(timeout_ms=recv_timeout_ms)
            except QueueTimeoutError as e:
                _say(f"recv timed out after {n} batches: {e!r} (the timeout worked)")
                loader.shutdown()
                sys.exit(3)
            loader._collate_fn(msg)
            del msg
            n += 1
    _say(f"UNEXPECTED: epoch finished with {n} batches")
    loader.shutdown()


def _scenario_hold_batches() -> None:
    """Stock GLT, nothing dies: keep every CPU batch alive (they view the shm ring)."""
    set_spawn()
    init_single_process_context()
    loader = build_loader(build_dataset())
    kept = []
    for batch in loader:
        kept.append(batch)
        _say(f"holding {len(kept)} batches")
    _say(f"UNEXPECTED: epoch finished holding {len(kept)} batches")
    loader.shutdown()


def _zombie_children() -> list[int]:
    return [
        p
        for p in children(os.getpid())
        if (st := read_proc_stat(p)) is not None and st.state == "Z"
    ]


def _scenario_shutdown_after_death() -> None:
    """Stock GLT: a worker dies mid-epoch; what does ``loader.shutdown()`` do and cost?"""
    set_spawn()
    init_single_process_context()
    loader = build_loader(build_dataset())
    producer = loader._mp_producer
    workers = producer._workers
    it = iter(loader)
    del it
    batch = next(loader)
    del batch
    time.sleep(0.5)  # let the survivor park in send() with the ring full
    os.kill(workers[1].pid, signal.SIGKILL)
    workers[1].join(5)
    _say(f"worker 1 exitcode {workers[1].exitcode}; calling loader.shutdown()")
    t = time.monotonic()
    loader.shutdown()
    _say(
        f"shutdown took {time.monotonic() - t:.2f}s; exitcodes right after: "
        f"{[w.exitcode for w in workers]}; children (any state) {children(os.getpid())}; "
        f"zombie children {_zombie_children()}"
    )
    time.sleep(0.5)
    _say(f"after 0.5s: zombie children {_zombie_children()}")


def _scenario_recv_timeout() -> None:
    """What ``ShmChannel.recv(timeout_ms=...)`` does on an empty channel."""
    from graphlearn_torch.channel import QueueTimeoutError, ShmChannel

    ch = ShmChannel(capacity=2, shm_size="1MB")
    for ms in (1, 100, 500):
        t = time.monotonic()
        try:
            ch.recv(timeout_ms=ms)
        except QueueTimeoutError as e:
            _say(
                f"recv(timeout_ms={ms}) raised {type(e).__module__}.{type(e).__qualname__} "
                f"after {1000 * (time.monotonic() - t):.1f} ms: {e!r}; mro="
                f"{[c.__name__ for c in type(e).__mro__]}"
            )


def _bench(epochs: int = 5) -> None:
    r = run_epochs(num_epochs=epochs)
    print(
        f"startup_s={r.startup_s:.3f} epoch_s={[round(x, 3) for x in r.epoch_s]} "
        f"shutdown_s={r.shutdown_s:.3f} batches={r.num_batches} "
        f"every_seed_once={r.every_seed_once}"
    )
    print("checksums", r.checksums)


SCENARIOS = {
    "hang-init": lambda a: _scenario_hang_init(
        *(f(x) for f, x in zip((float, int), a, strict=False))
    ),
    "hang-epoch": lambda a: _scenario_hang_epoch(
        *(f(x) for f, x in zip((int, float), a, strict=False))
    ),
    "hold-batches": lambda a: _scenario_hold_batches(),
    "shutdown-after-death": lambda a: _scenario_shutdown_after_death(),
    "recv-timeout": lambda a: _scenario_recv_timeout(),
}


def main(argv: Sequence[str]) -> int:
    cmd, args = (argv[0], list(argv[1:])) if argv else ("bench", [])
    if cmd == "bench":
        _bench(int(args[0]) if args else 5)
    elif cmd in SCENARIOS:
        SCENARIOS[cmd](args)
    elif cmd == "run" and args and args[0] in SCENARIOS:
        timeout = float(args[1]) if len(args) > 1 else 45.0
        r = run_script(os.path.abspath(__file__), [args[0], *args[2:]], timeout)
        print(f"== {args[0]}: rc={r.returncode} elapsed={r.elapsed_s:.1f}s")
        print(r.output)
        print(r.stacks)
    else:
        print(f"usage: bench [epochs] | run SCENARIO [timeout] [args] | {list(SCENARIOS)}")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
