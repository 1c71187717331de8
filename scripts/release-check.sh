#!/usr/bin/env bash
# The release path, as users get the package (scripts/test.sh runs it after the tests, so CI does):
#  1. build the sdist and, from it, the wheel (python -m build), and check them
#     (scripts/check_dist.py: the version, every package folder, no tests);
#  2. create a clean virtual environment outside the repository and install the wheel there (not
#     editable) at the lowest versions of torch, accelerate and tqdm that pyproject.toml declares
#     (constraints-lower.txt; tests/unit/test_release.py keeps the two equal);
#  3. from a directory outside the repository, run the main job (examples/train_digits.py) and
#     the smoke test (scripts/release_smoke.py) on the installed copy;
#  4. the lower-bounds tier: LOWER_BOUNDS_TESTS in that environment, from the repository root
#     (so the tests import the source tree: the same modules as the wheel, checked in step 1).
# Everything is written under a temporary directory, removed (in the background) when all passed,
# kept on a failure.
#   bash scripts/release-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."

# The lower-bounds tier (pytest arguments, run from the repository root): every single-process
# test (tests/unit, tests/integration, tests/compat; see tests/conftest.py) but three files that
# test no behaviour of the package at its lowest versions: the trackers (they need the trackers
# extra), the start-up benchmark (slow, and about this machine) and the docs gate (a repository
# tool, mkdocs).
LOWER_BOUNDS_TESTS=(-m "not distributed and not examples" --ignore tests/integration/test_trackers.py
  --ignore tests/integration/test_benchmarks_front.py --ignore tests/integration/test_docs_gate.py)
# What the main job and those tests import beside the package. Not timm: it needs torchvision,
# which does not import beside torch 2.13, so the tests that need timm (or transformers) skip.
WHEEL_EXTRAS="plots"
LOWER_BOUNDS_PACKAGES=("pytest>=8" "pytest-timeout>=2.2" "torchmetrics>=1.0" "scikit-learn>=1.3")

bash scripts/setup-venv.sh # python -m build comes with the dev extra
repo=$PWD
work=$(mktemp -d "${TMPDIR:-/tmp}/release-check.XXXXXX")
times=()
lap_start=$SECONDS
lap() { # records how long the step that just ended took
  times+=("$1 $((SECONDS - lap_start)) s")
  lap_start=$SECONDS
}
pip_install() { # pip's warnings about this machine's unreachable extra indexes are left out
  "$work/venv/bin/python" -m pip install -q "$@" 2>&1 | { grep -v "is ignored" || true; }
  return "${PIPESTATUS[0]}"
}
run_outside() { # log name, command: runs in $work/run; the output goes to the log, shown if it fails
  local log="$work/$1.log"
  shift
  (cd "$work/run" && "$@") >"$log" 2>&1 || {
    cat "$log"
    echo "failed: $*"
    return 1
  }
}
on_exit() {
  local status=$?
  [ $status -eq 0 ] || echo "release check FAILED (exit code $status); its files are kept in $work"
}
trap on_exit EXIT

echo "== release: build"
.venv/bin/python -m build --outdir "$work/dist" . >"$work/build.log" 2>&1 || {
  cat "$work/build.log"
  exit 1
}
.venv/bin/python scripts/check_dist.py "$work/dist"
wheel=$(ls "$work"/dist/*.whl)
lap build

echo "== release: clean virtual environment, the wheel at the lower bounds"
.venv/bin/python -m venv "$work/venv"
lap venv
pip_install -c constraints-lower.txt "$wheel[$WHEEL_EXTRAS]" "${LOWER_BOUNDS_PACKAGES[@]}"
"$work/venv/bin/python" -I -c "import accelerate, torch, tqdm, pytorch_accelerated as pa
print(f'installed: pytorch_accelerated {pa.__version__} ({pa.__file__}), torch {torch.__version__}, '
      f'accelerate {accelerate.__version__}, tqdm {tqdm.__version__}')"
lap install

echo "== release: the main job and the smoke test, on the installed wheel"
mkdir "$work/run"
run_outside main-job "$work/venv/bin/python" -I "$repo/examples/train_digits.py" --output-dir digits
grep -E "^(Starting training run|FINAL)" "$work/main-job.log"
for file in digits_mlp.pt training_curves.png runs/digits/metrics.csv; do
  [ -s "$work/run/digits/$file" ] || {
    echo "the main job left no digits/$file"
    exit 1
  }
done
lap "main job"
run_outside smoke "$work/venv/bin/python" -I "$repo/scripts/release_smoke.py" smoke
grep "^SMOKE OK" "$work/smoke.log"
lap smoke

echo "== release: the lower-bounds tier (${LOWER_BOUNDS_TESTS[*]})"
rc=0
PATH="$work/venv/bin:$PATH" "$work/venv/bin/python" -m pytest -p no:cacheprovider -q "${LOWER_BOUNDS_TESTS[@]}" || rc=$?
if [ $rc -eq 5 ]; then
  echo "pytest collected no tests: that is a failure here"
fi
[ $rc -eq 0 ] || exit 1
lap "lower-bounds tests"

echo "RELEASE OK in $SECONDS s: $(printf '%s, ' "${times[@]}" | sed 's/, $//')"
# Removing the environment (1.6 GB) took 2 minutes on a busy disk: it goes on in the background.
rm -rf "$work" >/dev/null 2>&1 &
