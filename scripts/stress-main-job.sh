#!/usr/bin/env bash
# Stress check (not run in CI): launch the 2-process main job N times (default 50) and count
# the launches that exit non-zero. Each launch writes its output under $OUT_DIR/run-K.log.
#   bash scripts/stress-main-job.sh [N]
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-venv.sh >/dev/null || { echo "set-up failed"; exit 1; }
runs=${1:-50}
out_dir=${OUT_DIR:-$(mktemp -d)}
failures=0
for k in $(seq 1 "$runs"); do
  if ! .venv/bin/torchrun --standalone --nproc_per_node 2 examples/train_digits.py \
      --output-dir "$out_dir/outputs-$k" >"$out_dir/run-$k.log" 2>&1; then
    failures=$((failures + 1))
    echo "run $k failed: see $out_dir/run-$k.log"
  fi
done
echo "STRESS non-zero exits: $failures of $runs (logs in $out_dir)"
[ "$failures" -eq 0 ]
