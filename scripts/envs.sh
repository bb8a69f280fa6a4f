#!/usr/bin/env bash
# Create (or refresh) the project's virtual environments from the pinned requirements.
#   .venv      core + torch tiers (torch CPU build)
#   .venv-glt  graphlearn-torch + graph-learn tiers (torch 2.3.0, compiled extensions)
#   .venv-release  build + twine for scripts/dists.sh (built on demand: `envs.sh release`)
# A venv is rebuilt only when its requirement files change (hash stamp), so a warm
# machine pays nothing. pip's cache is kept on purpose: torch-scatter/torch-sparse
# compile for ~20 min the first time on 2 cores and never again.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3

stamp_of() { cat "$@" pyproject.toml integrations/*/pyproject.toml 2>/dev/null | sha256sum | cut -c1-16; }

make_venv() {  # make_venv DIR STAMP
  local dir=$1 stamp=$2
  if [[ -f $dir/.stamp && $(cat "$dir/.stamp") == "$stamp" ]]; then return 1; fi
  rm -rf "$dir"
  "$PYTHON" -m venv "$dir"
  "$dir/bin/python" -m pip install -q --upgrade pip==24.2 wheel==0.44.0
  return 0
}

core_env() {
  local stamp; stamp=$(stamp_of requirements/dev.txt)
  if make_venv .venv "$stamp"; then
    echo "[envs] building .venv (core + torch tiers)"
    .venv/bin/pip install -q -r requirements/dev.txt
    .venv/bin/pip install -q --no-deps -e . -e integrations/glt -e integrations/graphlearn
    echo "$stamp" > .venv/.stamp
  fi
}

glt_env() {
  local stamp; stamp=$(stamp_of requirements/glt.txt requirements/glt-nodeps.txt)
  if make_venv .venv-glt "$stamp"; then
    echo "[envs] building .venv-glt (graphlearn-torch + graph-learn tiers; slow the first time)"
    local links=()
    [[ -d $ROOT/../shared/wheels ]] && links=(--find-links "$ROOT/../shared/wheels")
    local pip=.venv-glt/bin/pip
    # torch first: torch-scatter/torch-sparse build against it without build isolation.
    $pip install -q torch==2.3.0 numpy==1.26.4 setuptools==70.3.0
    FORCE_ONLY_CPU=1 $pip install -q --no-build-isolation "${links[@]}" -r requirements/glt.txt
    $pip install -q --no-deps -r requirements/glt-nodeps.txt
    $pip install -q --no-deps -e . -e integrations/glt -e integrations/graphlearn
    echo "$stamp" > .venv-glt/.stamp
  fi
}

release_env() {  # the tools that build and check the distributions (scripts/dists.sh)
  local stamp; stamp=$(stamp_of requirements/release.txt)
  if make_venv .venv-release "$stamp"; then
    echo "[envs] building .venv-release (build, twine)"
    .venv-release/bin/pip install -q -r requirements/release.txt
    echo "$stamp" > .venv-release/.stamp
  fi
}

case "${1:-all}" in
  core) core_env ;;
  glt) glt_env ;;
  release) release_env ;;
  all) core_env; glt_env ;;
  *) echo "usage: $0 [core|glt|release|all]" >&2; exit 2 ;;
esac
