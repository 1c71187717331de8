#!/usr/bin/env bash
# The whole test suite: set-up, lint, types, docs build, then every test (tests/unit,
# integration, distributed: real 2-process runs, compat, examples), then the release check
# (scripts/release-check.sh: the wheel installed in a clean environment at the lowest declared
# versions, the lower-bounds tier).
# Usage: bash scripts/test.sh [extra pytest args]; with arguments (a selection of tests) only
# that selection runs after the checks, without the release check.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-venv.sh || { echo "set-up failed"; exit 1; }
export PATH="$PWD/.venv/bin:$PATH"
status=0
echo "== ruff"; ruff check pytorch_accelerated tests examples benchmarks scripts || status=1
echo "== ruff format"; ruff format --check --quiet . || status=1
echo "== mypy"; mypy pytorch_accelerated || status=1
echo "== docs"; bash scripts/docs-gate.sh || status=1
echo "== postgresql"; bash scripts/postgres-check.sh || status=1  # for the tests that start a server
echo "== pytest"
python -m pytest --durations=25 "$@"  # the 25 slowest tests: where the suite's time goes
rc=$?
if [ $rc -eq 5 ]; then
  echo "pytest collected no tests: that is a failure here"; rc=1
fi
[ $rc -eq 0 ] || status=1
if [ $# -eq 0 ]; then
  echo "== release"; bash scripts/release-check.sh || status=1
fi
exit $status
