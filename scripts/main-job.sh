#!/usr/bin/env bash
# The main job: set up .venv (pinned torch, see constraints.txt), then train the digits example.
# Progress and metrics are printed; a checkpoint and a plot are left under outputs/digits.
#   bash scripts/main-job.sh [--epochs N --batch-size B --lr LR --output-dir DIR --seed S]
#   NPROC=2 bash scripts/main-job.sh     # the same run on 2 cooperating processes (torchrun)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-venv.sh
NPROC=${NPROC:-1}
if [ "$NPROC" -gt 1 ]; then
  # --standalone picks a free port; torchrun sets OMP_NUM_THREADS=1 unless it is set already.
  exec .venv/bin/torchrun --standalone --nproc_per_node "$NPROC" examples/train_digits.py "$@"
fi
exec .venv/bin/python examples/train_digits.py "$@"
