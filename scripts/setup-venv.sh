#!/usr/bin/env bash
# Creates (or reuses) .venv with the package, its extras and the pinned torch build.
# Idempotent: a second run only checks that everything is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.installed-$(cat pyproject.toml constraints.txt | sha1sum | cut -c1-12)
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v "is ignored" || true
  .venv/bin/python -m pip install -q -c constraints.txt -e ".[dev]" 2>&1 | grep -v "is ignored" || true
  .venv/bin/python -c "import torch, torchvision, accelerate, pytorch_accelerated" 
  rm -f .venv/.installed-*
  touch "$stamp"
fi
