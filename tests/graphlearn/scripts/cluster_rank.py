"""One rank of a fake multi-node job on localhost: real gloo, fabricated torchrun variables.

usage: cluster_rank.py EXCHANGE HOST_TEMPLATE   ({node} in the template: GROUP_RANK + 1)
Prints ``SPEC <json>`` with this rank's cluster spec and client task indexes.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta

import healthkit_graphlearn as hkgl
import torch.distributed as dist

exchange, host_template = sys.argv[1], sys.argv[2]
env = hkgl.DistEnv.from_environ()
# Rank 0's store waits for the others from its own start; under a loaded suite four torch
# imports side by side have left two ranks outside a 60 s window (seen once in a full run).
dist.init_process_group("gloo", timeout=timedelta(seconds=150))
spec = hkgl.get_cluster_spec(
    2,
    host=host_template.format(node=env.group_rank + 1),
    exchange=exchange,  # type: ignore[arg-type]
)
tasks = [hkgl.client_task_index(i, num_client_per_rank=2) for i in range(2)]
print("SPEC " + json.dumps({"rank": env.rank, "spec": spec, "tasks": tasks}), flush=True)
# Everyone has its answer. Skip the teardown: with torch 2.3, destroy_process_group() on a
# rank whose store host (rank 0) already exited can block for the store timeout.
dist.barrier()
os._exit(0)
