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
#       `--floor` installs the lowest versions those two wheels declare (attrs>=X gets
#       attrs==X). Then `healthkit --version`, `python -m healthkit doctor` and `explain`, an
#       import check of healthkit_graphlearn, and tests/core run from outside the source tree
#       against the installed package (tests/core/test_installed_wheel.py proves which copy
#       was imported); HEALTHKIT_INSTALLED_TESTS="test_a.py test_b.py" runs only those files.
#       On 3.11, the integrations' Python, `stacks` below runs first.
#   scripts/dists.sh stacks
#       the integration wheels as docs/glt.md ("Supported versions") says they install, on
#       Python 3.11: (1) into an empty venv they resolve to the core, attrs and packaging only
#       (no torch, no graphlearn-torch), and `import healthkit_glt` raises ImportError naming
#       the stacks to install first; (2) on each tested stack this machine has (.venv-glt:
#       torch 2.3 + PyPI graphlearn-torch 0.2.4; .venv-glt28: torch 2.8 + graphlearn-torch
#       from source, when built), seen by a fresh venv through a .pth file, the
#       `pipeline-healthkit-glt[torch23]` extra resolves without installing anything of the
#       stack on torch 2.3 and fails to resolve on torch 2.8, and the wheels installed there
#       (not editable) run examples/glt_loader.py: two epochs, and a worker SIGKILLed
#       mid-epoch that ends the loader with its diagnosis; without torch_sparse, and with
#       PyPI's graphlearn-torch on torch 2.8, `import healthkit_glt` says what to install.
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
PROJECTS=(. integrations/glt integrations/graphlearn integrations/torch)

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

floor_requirements() {  # the lowest version of each `name>=X` in the wheels' Requires-Dist
  "$TOOLS/bin/python" - "$@" <<'EOF'
import sys, zipfile
from packaging.requirements import Requirement
lines = []
for wheel in sys.argv[1:]:
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines += z.read(meta).decode().splitlines()
for line in lines:
    if line.startswith("Requires-Dist: "):
        req = Requirement(line.split(": ", 1)[1])
        if req.marker is None and not req.name.startswith("pipeline-healthkit"):
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
  # Its own process: `set -e` does not apply to a function called before `||`.
  if [[ $v == 3.11 ]]; then "$ROOT/scripts/dists.sh" stacks || return 1; fi
  local venv=$ROOT/build/venv-py$v run=$ROOT/build/run-py$v
  rm -rf "$venv" "$run" && mkdir -p "$run"
  echo "Python $v: $py ($("$py" -V 2>&1))"
  "$py" -m venv "$venv"
  local gl_wheel=$OUT/pipeline_healthkit_graphlearn-$VERSION-py3-none-any.whl
  local pins=()
  if [[ $floor == 1 ]]; then
    mapfile -t pins < <(floor_requirements "$wheel" "$gl_wheel")
    echo "lowest declared versions: ${pins[*]}"
  else
    pins=(attrs==26.1.0)
  fi
  # The venv's own pip, as a user of that Python has it. The graph-learn integration's wheel
  # comes along (its one dependency is the core; graph-learn itself is the user's to bring);
  # the graphlearn-torch one is `stacks`' (above, on 3.11).
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

stacks() {
  local py
  if ! py=$(find_python 3.11); then
    echo "MISSING: no Python 3.11 on this machine: the integration wheels were not installed" >&2
    return 3
  fi
  local core=$OUT/pipeline_healthkit-$VERSION-py3-none-any.whl
  local glt=$OUT/pipeline_healthkit_glt-$VERSION-py3-none-any.whl
  local gl=$OUT/pipeline_healthkit_graphlearn-$VERSION-py3-none-any.whl
  local tw=$OUT/pipeline_healthkit_torch-$VERSION-py3-none-any.whl
  [[ -f $core && -f $glt && -f $gl && -f $tw ]] || {
    echo "no wheels of $VERSION in $OUT: run scripts/dists.sh build first" >&2; return 1; }
  local work=$ROOT/build/stacks
  rm -rf "$work" && mkdir -p "$work/run"
  local pipq=(-m pip install -q --disable-pip-version-check)

  echo "stacks: the integration wheels into an empty venv, and the checkout into another"
  "$py" -m venv "$work/empty"
  "$work/empty/bin/python" "${pipq[@]}" "$core" "$glt" "$gl" "$tw"
  "$work/empty/bin/python" -m pip check
  "$py" -m venv "$work/checkout"  # README.md's commands, as written, in the repository root
  "$work/checkout/bin/pip" install -q . integrations/graphlearn
  "$work/checkout/bin/pip" install -q . integrations/glt
  "$work/checkout/bin/pip" install -q . integrations/torch
  "$work/checkout/bin/python" -m pip check
  rm -rf build/lib build/bdist.* integrations/*/build  # setuptools' in-tree leftovers
  local venv
  for venv in "$work/empty" "$work/checkout"; do
    (cd "$work/run" && "$venv/bin/python" - <<'EOF'
import importlib.metadata as md
installed = sorted(d.metadata["Name"].lower() for d in md.distributions())
stack = [n for n in installed if n in ("torch", "graphlearn-torch", "numpy", "torch-geometric")]
assert not stack, f"the glt wheel pulled in {stack}"
try:
    import healthkit_glt  # noqa: F401
except ImportError as e:
    msg = str(e)
    for want in ("torch is not installed", "-py3-none-any.whl[torch23]", "torch-sparse",
                 "built from source"):
        assert want in msg, (want, msg)
    print(f"  installed {installed}; import healthkit_glt: ImportError: {msg[:90]}...")
else:
    raise AssertionError("healthkit_glt imported without torch and graphlearn-torch")
import healthkit_graphlearn, sysconfig
assert healthkit_graphlearn.__file__.startswith(sysconfig.get_paths()["purelib"])
try:
    import healthkit_torch  # noqa: F401
except ImportError as e:
    assert "healthkit_torch needs torch" in str(e), e
    print(f"  import healthkit_torch: ImportError: {str(e)[:70]}...")
else:
    raise AssertionError("healthkit_torch imported without torch")
EOF
    ) || return 1
  done

  # On a Python without PyPI's stack (graphlearn-torch 0.2.4 has cp311 wheels only) the extra
  # asks for nothing, instead of pip's bare "No matching distribution"; the import then says
  # which Python the extra needs (tests/core/test_glt_install_route.py checks the message).
  local py312
  if py312=$(find_python 3.12); then
    "$py312" -m venv "$work/py312"
    "$work/py312/bin/python" "${pipq[@]}" --find-links "$OUT" --dry-run \
      --report "$work/report312.json" "$core" "$glt[torch23]"
    "$work/py312/bin/python" - "$work/report312.json" <<'EOF' || return 1
import json, sys
names = sorted(i["metadata"]["name"].lower() for i in json.load(open(sys.argv[1]))["install"])
assert "graphlearn-torch" not in names and "torch" not in names, names
print(f"  [torch23] on Python 3.12 asks for no stack; it would install {names}")
EOF
  else
    echo "stacks: Python 3.12: SKIPPED, not found (the [torch23] extra elsewhere than 3.11)"
  fi

  local tested=0
  for venv in .venv-glt .venv-glt28; do
    if [[ ! -x $venv/bin/python ]]; then
      echo "stacks: $venv: SKIPPED, not built (scripts/envs.sh ${venv#.venv-})"; continue
    fi
    local site torch env out rc
    site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    torch=$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("torch"))')
    echo "stacks: the wheels on $venv's stack (torch $torch)"
    env=$work/on${venv#.venv}
    "$py" -m venv "$env"
    # The stack's packages, seen (not copied): the new venv's own site-packages comes first.
    echo "$site" > "$("$env/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/stack.pth"
    local extra="$glt[torch23]"  # as README.md writes it
    if [[ $torch == 2.3.* ]]; then
      "$env/bin/python" "${pipq[@]}" --no-index --dry-run --report "$work/report.json" \
        "$core" "$extra"
      "$env/bin/python" - "$work/report.json" <<'EOF' || return 1
import json, sys
names = sorted(i["metadata"]["name"].lower() for i in json.load(open(sys.argv[1]))["install"])
assert set(names) <= {"pipeline-healthkit", "pipeline-healthkit-glt"}, names
print(f"  [torch23] resolves on this stack; it would install only {names}")
EOF
    elif "$env/bin/python" "${pipq[@]}" --no-index --dry-run "$core" "$extra" \
         >"$work/extra.log" 2>&1; then
      echo "the [torch23] extra resolved on torch $torch" >&2; return 1
    else
      echo "  [torch23] does not resolve on torch $torch (it pins torch==2.3.0)"
    fi
    # Not editable, next to (not over) the stack venv's own editable copies.
    "$env/bin/python" "${pipq[@]}" --no-index --no-deps --ignore-installed "$core" "$glt" "$gl" \
      "$tw"
    (cd "$work/run" && timeout 300 "$env/bin/python" -c '
import os, signal, sysconfig, torch, healthkit_torch
from torch.utils.data import DataLoader
assert healthkit_torch.__file__.startswith(sysconfig.get_paths()["purelib"])
it = iter(healthkit_torch.watch(DataLoader(list(range(64)), batch_size=4, num_workers=2)))
next(it)
os.kill(it._workers[1].pid, signal.SIGKILL)
try:
    for _ in it: pass
except healthkit_torch.DataLoaderWorkerError as e:
    print("  healthkit_torch on torch", torch.__version__ + ":", str(e)[:70], "...")
else:
    raise AssertionError("no DataLoaderWorkerError")
') || return 1
    # graphlearn-torch's undeclared torch_sparse missing: the import says what to build.
    (cd "$work/run" && "$env/bin/python" -c '
import sys
sys.modules["torch_sparse"] = None  # as if not installed: importing it raises
try:
    import healthkit_glt
except ImportError as e:
    assert "torch_sparse, which it does not declare" in str(e), e
    print("  without torch_sparse: ImportError:", str(e)[14:100], "...")
else:
    raise AssertionError("imported without torch_sparse")
') || return 1
    if [[ $torch != 2.3.* && -x .venv-glt/bin/python ]]; then
      # PyPI's graphlearn-torch wheel on this torch (it is built for 2.3): said, not crashed.
      local pypi; pypi=$(.venv-glt/bin/python -c \
        'import sysconfig; print(sysconfig.get_paths()["purelib"])')
      mkdir -p "$work/pypi-glt"
      ln -s "$pypi/graphlearn_torch" "$pypi"/graphlearn_torch-0.2.4.dist-info "$work/pypi-glt/"
      (cd "$work/run" && PYTHONPATH=$work/pypi-glt "$env/bin/python" -c '
try:
    import healthkit_glt
except ImportError as e:
    assert "graphlearn-torch 0.2.4 from PyPI is built against torch 2.3.0" in str(e), e
    assert "[torch23]" in str(e) and "built from source" in str(e), e
    print("  with PyPI graphlearn-torch 0.2.4: ImportError:", str(e)[41:120], "...")
else:
    raise AssertionError("PyPI graphlearn-torch 0.2.4 imported on torch 2.8")
') || return 1
    fi
    (cd "$work/run" && "$env/bin/python" -c '
import sysconfig, healthkit, healthkit_glt
for m in (healthkit, healthkit_glt):
    assert m.__file__.startswith(sysconfig.get_paths()["purelib"]), m.__file__
print("  imported", healthkit_glt.__file__, "on", healthkit_glt.glt_build())
') || return 1
    out=$(cd "$work/run" && timeout 300 "$env/bin/python" "$ROOT/examples/glt_loader.py" 2>&1) \
      || { echo "$out" | tail -n 30; echo "examples/glt_loader.py failed" >&2; return 1; }
    grep -q "^epoch 1: " <<<"$out" || { echo "$out" | tail -n 30; return 1; }
    echo "  examples/glt_loader.py: $(grep '^epoch' <<<"$out" | tr '\n' ' ')"
    rc=0
    out=$(cd "$work/run" && timeout 300 "$env/bin/python" "$ROOT/examples/glt_loader.py" \
      --kill 2>&1) || rc=$?
    if [[ $rc != 1 ]] || ! grep -q "training stopped: " <<<"$out"; then
      echo "$out" | tail -n 30
      echo "examples/glt_loader.py --kill: rc=$rc, expected 1 and 'training stopped'" >&2
      return 1
    fi
    echo "  examples/glt_loader.py --kill: $(grep -m1 -o 'training stopped: .\{0,70\}' <<<"$out")"
    tested=$((tested + 1))
  done
  [[ $tested -gt 0 ]] || echo "stacks: NO STACK TESTED (no .venv-glt or .venv-glt28)" >&2
  rm -rf "$work"
}

case "${1:-}" in
  build) build ;;
  test) shift; [[ $# -ge 1 ]] || { echo "usage: $0 test VERSION [--floor] [PYTEST ARGS]" >&2; exit 2; }
        test_on "$@" ;;
  stacks) stacks ;;
  python) find_python "${2:?usage: $0 python VERSION}" ;;
  *) echo "usage: $0 build | test VERSION [--floor] [PYTEST ARGS] | stacks | python VERSION" >&2; exit 2 ;;
esac
