#!/usr/bin/env bash
# Create (or refresh) the project's virtual environments from the pinned requirements.
#   .venv      core + torch tiers (torch CPU build)
#   .venv-glt  graphlearn-torch + graph-learn tiers (torch 2.3.0, compiled extensions)
#   .venv-release  build + twine for scripts/dists.sh (built on demand: `envs.sh release`)
#   .venv-glt28  graphlearn-torch built from source (upstream 26fe3d4, as GiGL runs it) on
#              torch 2.8.0: the glt tier. Needs ../shared/wheels/torch-2.8 (prebuilt wheels)
#              or ../shared/src (the GLT snapshot, built here: ~40 min on 2 cores); with
#              neither, it is skipped with a message and scripts/test skips its tier.
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
    .venv/bin/pip install -q --no-deps -e . -e integrations/glt -e integrations/graphlearn -e integrations/torch
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
    $pip install -q --no-deps -e . -e integrations/glt -e integrations/graphlearn -e integrations/torch
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

GLT28_WHEELS=$ROOT/../shared/wheels/torch-2.8
GLT28_SRC=$ROOT/../shared/src/graphlearn-for-pytorch-26fe3d4.tar.gz
GLT28_LOCAL=git26fe3d4  # upstream never bumped 0.2.4; this local label tells the build apart

glt28_wheels() {  # glt28_wheels OUTDIR: build GLT, torch-scatter, torch-sparse for the venv's torch
  local out=$1 pip=.venv-glt28/bin/pip work
  work=$(mktemp -d)
  echo "[envs] building graphlearn-torch from $GLT28_SRC (WITH_CUDA=OFF; needs cmake)"
  tar -xzf "$GLT28_SRC" -C "$work"
  local tree; tree=$(find "$work" -maxdepth 2 -name setup.py -printf '%h\n' | head -n1)
  (cd "$tree" && WITH_CUDA=OFF "$ROOT/.venv-glt28/bin/python" setup.py -q bdist_wheel >/dev/null)
  local whl; whl=$(ls "$tree"/dist/graphlearn_torch-*.whl)
  # Same local label as the prebuilt wheel, so both routes install the same name.
  cp "$whl" "$out/$(basename "$whl" | sed "s/^graphlearn_torch-\([0-9.]*\)-/graphlearn_torch-\1+$GLT28_LOCAL-/")"
  echo "[envs] compiling torch-scatter and torch-sparse against torch 2.8 (~35 min)"
  # --no-cache-dir: pip's wheel cache is keyed by the source, not by the torch it was built
  # against, so a cached torch-2.3 build would be reused here (and ours there). The wheels
  # stay in OUTDIR instead, so a rebuild of the venv does not compile them again.
  FORCE_ONLY_CPU=1 $pip wheel -q --no-cache-dir --no-deps --no-build-isolation -w "$out" \
    torch-scatter==2.1.2 torch-sparse==0.6.18
  rm -rf "$work"
}

glt28_env() {
  if [[ ! -d $GLT28_WHEELS && ! -f $GLT28_SRC ]]; then
    echo "[envs] skipping .venv-glt28: neither $GLT28_WHEELS (prebuilt wheels) nor $GLT28_SRC" \
         "(the GLT source snapshot) exists; the GLT-from-source/torch 2.8 tier will not run" >&2
    return 0
  fi
  local from=wheels; [[ -d $GLT28_WHEELS ]] || from=source
  local stamp; stamp=$(stamp_of requirements/glt28.txt <(echo "$from"))
  if make_venv .venv-glt28 "$stamp"; then
    echo "[envs] building .venv-glt28 (graphlearn-torch from source on torch 2.8; from $from)"
    local pip=.venv-glt28/bin/pip dir=$GLT28_WHEELS
    $pip install -q setuptools==70.3.0 -r requirements/glt28.txt
    if [[ $from == source ]]; then
      dir=$ROOT/.wheels-glt28  # kept across venv rebuilds (git-ignored)
      if ! ls "$dir"/graphlearn_torch-*+"$GLT28_LOCAL"-*.whl "$dir"/torch_sparse-*.whl \
           >/dev/null 2>&1; then
        mkdir -p "$dir"
        glt28_wheels "$dir"
      fi
    fi
    # By file path: `graphlearn-torch==0.2.4` could resolve to PyPI's torch-2.3 build.
    $pip install -q --no-deps "$dir"/graphlearn_torch-*+"$GLT28_LOCAL"-*.whl \
      "$dir"/torch_scatter-2.1.2-*.whl "$dir"/torch_sparse-0.6.18-*.whl
    $pip install -q --no-deps -e . -e integrations/glt -e integrations/graphlearn -e integrations/torch
    echo "$stamp" > .venv-glt28/.stamp
  fi
}

case "${1:-all}" in
  core) core_env ;;
  glt) glt_env ;;
  release) release_env ;;
  glt28) glt28_env ;;
  all) core_env; glt_env; glt28_env ;;
  *) echo "usage: $0 [core|glt|glt28|release|all]" >&2; exit 2 ;;
esac
