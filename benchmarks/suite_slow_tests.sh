#!/usr/bin/env bash
# The test suite's hang-watching tests, before and after b305295 ("hangs watched for a set time
# after the fault"): the same five tests from the commit before it and from this checkout, run
# one after the other in each round, on .venv-glt (graphlearn-torch 0.2.4, torch 2.3). Run it
# on a quiet machine; it prints each test's call time and pass/fail, per side and round.
#   benchmarks/suite_slow_tests.sh [ROUNDS]      (default 1; needs scripts/envs.sh glt)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-1}
py=$PWD/.venv-glt/bin/python
[[ -x $py ]] || { echo "no .venv-glt: run scripts/envs.sh glt first" >&2; exit 2; }
base=$(git rev-parse b305295^)
before=$PWD/build/suite-baseline-${base:0:7}
if [[ ! -d $before ]]; then  # the baseline's tree, unpacked (no worktree left behind in .git)
  mkdir -p "$before"
  git archive "$base" | tar -x -C "$before"
fi
tests=(
  "tests/glt/test_healthkit_glt.py::test_worker_sigkilled_during_init_stock_glt_hangs_healthkit_glt_fails_in_seconds"
  "tests/glt/test_healthkit_glt.py::test_worker_hanging_during_init_fails_at_the_bound_with_the_hanging_stack"
  "tests/glt/test_healthkit_glt.py::test_worker_sigkilled_mid_epoch_stock_glt_hangs_healthkit_glt_fails_in_seconds"
  "tests/glt/test_healthkit_glt.py::test_a_steady_state_stall_with_every_worker_alive_logs_their_stacks_once"
  "tests/graphlearn/test_die_with_rank.py::test_without_it_a_stuck_worker_outlives_its_rank"
)
side() {  # side LABEL TREE: the five tests, that tree's code first on the path
  local label=$1 tree=$2
  (cd "$tree" && PYTHONPATH="$tree:$tree/integrations/glt:$tree/integrations/graphlearn" \
    "$py" -m pytest -p no:cacheprovider -q --durations=0 --durations-min=0 "${tests[@]}" 2>&1) |
    grep -E '^[0-9.]+s call|passed|failed' | sed "s|^|$label |"
}
echo "# $(date -u +%FT%TZ) before=${base:0:7} after=$(git rev-parse --short HEAD) rounds=$rounds"
for ((r = 1; r <= rounds; r++)); do
  side "round $r before" "$before"
  side "round $r after " "$PWD"
done
