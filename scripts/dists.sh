#!/usr/bin/env bash
# The three distributions as a user gets them (scripts/test runs both commands).
#
#   scripts/dists.sh build
#       sdist + wheel of pipeline-healthkit, pipeline-healthkit-glt and
#       pipeline-healthkit-graphlearn into build/dist (each wheel is built from its sdist, so a
#       file missing from an sdist breaks the build), `twine check --strict`, then
#       scripts/check_dists.py (names, version, license, classifiers, dependencies).
#   scripts/dists.sh test VERSION [--floor] [PYTEST ARGS...]
#       a fresh venv on Python VERSION (3.10 ... 3.13) with the built core and graph-learn
#       integration wheels installed (not editable) plus the torch-free test requirements;
#       `--floor` installs the lowest versions the core wheel declares (attrs>=X gets
#       attrs==X). Then `healthkit --version`, `python -m healthkit doctor` and `explain`, an
#       import check of healthkit_graphlearn, and tests/core run from outside the source tree
#       against the installed package (tests/core/test_installed_wheel.py proves which copy
#       was imported); HEALTHKIT_INSTALLED_TESTS="test_a.py test_b.py" runs only those files.
#   scripts/dists.sh python VERSION
#       print the interpreter used for VERSION; exit 3 when this machine has none.
#
# Interpreters are looked up as `pythonVERSION` on PATH, then in pyenv's
# $PYENV_ROOT/versions/VERSION.*; HEALTHKIT_PYTHON_3_12=/path/to/python (for example) overrides.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=$ROOT/build/dist
TOOLS=$ROOT/.venv-release
VERSION=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' healthkit/_version.py)
PROJECTS=(. integrations/glt integrations/graphlearn)

find_python() {  # find_python 3.12 -> path of a working interpreter of that minor version
  local want=$1 var="HEALTHKIT_PYTHON_${1//./_}" cand
  local cands=("${!var:-}" "$(command -v "python$want" || true)")
  cands+=("${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$want".*/bin/python"$want")
  for cand in "${cands[@]}"; do
    [[ -n $cand && -x $cand ]] || continue
    # A pyenv shim of a version that is not selected exists but fails: run it to be sure.
    if [[ $("$cand" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) == "$want" ]]
    then echo "$cand"; return 0; fi
  done
  return 3
}

build() {
  scripts/envs.sh release
  rm -rf "$OUT" && mkdir -p "$OUT"
  local log=$ROOT/build/dists-build.log p
  : > "$log"
  for p in "${PROJECTS[@]}"; do
    # Without isolation: the pinned setuptools in .venv-release is the backend (fast, no
    # download); build still checks it satisfies the project's [build-system] requires.
    if ! "$TOOLS/bin/python" -m build --no-isolation --outdir "$OUT" "$p" >>"$log" 2>&1; then
      cat "$log"; echo "building $p failed" >&2; return 1
    fi
  done
  ls -l "$OUT" | tail -n +2
  "$TOOLS/bin/twine" --no-color check --strict "$OUT"/*
  "$TOOLS/bin/python" scripts/check_dists.py "$OUT" "$VERSION"
}

floor_requirements() {  # the lowest version of each `name>=X` in a wheel's Requires-Dist
  "$TOOLS/bin/python" - "$1" <<'EOF'
import sys, zipfile
from packaging.requirements import Requirement
with zipfile.ZipFile(sys.argv[1]) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    lines = z.read(meta).decode().splitlines()
for line in lines:
    if line.startswith("Requires-Dist: "):
        req = Requirement(line.split(": ", 1)[1])
        if req.marker is None:
            lows = [s.version for s in req.specifier if s.operator == ">="]
            if lows:
                print(f"{req.name}=={lows[0]}")
EOF
}

test_on() {  # test_on VERSION [--floor] [PYTEST ARGS...]
  local v=$1; shift
  local floor=0
  if [[ ${1:-} == --floor ]]; then floor=1; shift; fi
  local py
  if ! py=$(find_python "$v"); then
    echo "MISSING: no Python $v on this machine (looked for python$v on PATH and in" \
      "${PYENV_ROOT:-$HOME/.pyenv}/versions/$v.*; set HEALTHKIT_PYTHON_${v//./_})" >&2
    return 3
  fi
  local wheel; wheel=$(ls "$OUT"/pipeline_healthkit-"$VERSION"-py3-none-any.whl 2>/dev/null) || {
    echo "no core wheel in $OUT: run scripts/dists.sh build first" >&2; return 1; }
  local venv=$ROOT/build/venv-py$v run=$ROOT/build/run-py$v
  rm -rf "$venv" "$run" && mkdir -p "$run"
  echo "Python $v: $py ($("$py" -V 2>&1))"
  "$py" -m venv "$venv"
  local pins=()
  if [[ $floor == 1 ]]; then
    mapfile -t pins < <(floor_requirements "$wheel")
    echo "lowest declared versions: ${pins[*]}"
  else
    pins=(attrs==26.1.0)
  fi
  # The venv's own pip, as a user of that Python has it. The graph-learn integration's wheel
  # comes along (its one dependency is the core; graph-learn itself is the user's to bring);
  # the graphlearn-torch one would pull in torch and graphlearn-torch (cp311 wheels, GBs).
  local gl_wheel=$OUT/pipeline_healthkit_graphlearn-$VERSION-py3-none-any.whl
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "$wheel" "$gl_wheel" \
    "${pins[@]}" -r requirements/core-tests.txt
  "$venv/bin/python" -m pip check
  # From a directory outside the source tree: `python -m` puts the working directory first on
  # sys.path, so in the repository root it would import ./healthkit instead of the wheel.
  cd "$run"
  local got; got=$("$venv/bin/healthkit" --version)
  echo "healthkit --version: $got"
  [[ $got == "healthkit $VERSION" ]] || { echo "expected 'healthkit $VERSION'" >&2; return 1; }
  "$venv/bin/python" -m healthkit doctor
  "$venv/bin/python" -m healthkit explain 137 --name sampler-server
  # The integration imports without graph-learn, torch or numpy, and says what to install.
  "$venv/bin/python" - "$VERSION" <<'EOF'
import sys
import healthkit_graphlearn as hg
assert hg.__version__ == sys.argv[1], hg.__version__
assert "site-packages" in hg.__file__, hg.__file__
hg.DistEnv, hg.get_cluster_spec  # the lazily loaded names resolve
heavy = [m for m in ("graphlearn", "torch", "numpy") if m in sys.modules]
assert not heavy, heavy
try:
    hg.import_graphlearn()
except hg.GraphLearnImportError as e:
    print(f"healthkit_graphlearn {hg.__version__}: without graph-learn: {str(e)[:60]}...")
EOF
  # One run per cell of the stop/exit-code matrices on each version (the main tier runs 3).
  # HEALTHKIT_INSTALLED_TESTS: test files of tests/core to run (default: all of tests/core)
  local targets=() t
  for t in ${HEALTHKIT_INSTALLED_TESTS:-}; do targets+=("$ROOT/tests/core/$t"); done
  [[ ${#targets[@]} -gt 0 ]] || targets=("$ROOT/tests/core")
  HEALTHKIT_MATRIX_RUNS=${HEALTHKIT_MATRIX_RUNS:-1} \
  HEALTHKIT_TEST_INSTALLED_WHEEL=$VERSION "$venv/bin/python" -m pytest -c "$ROOT/pyproject.toml" \
    --rootdir "$ROOT" -p no:cacheprovider "${targets[@]}" "$@"
}

case "${1:-}" in
  build) build ;;
  test) shift; [[ $# -ge 1 ]] || { echo "usage: $0 test VERSION [--floor] [PYTEST ARGS]" >&2; exit 2; }
        test_on "$@" ;;
  python) find_python "${2:?usage: $0 python VERSION}" ;;
  *) echo "usage: $0 build | test VERSION [--floor] [PYTEST ARGS] | python VERSION" >&2; exit 2 ;;
esac
