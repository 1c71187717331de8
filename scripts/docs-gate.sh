#!/usr/bin/env bash
# The docs gate: builds the site with `mkdocs build --strict`, which fails on any warning (a
# docstring section griffe cannot read, a broken link, a page missing from nav). The INFO lines are
# left out of the output; every warning is shown. scripts/test.sh runs it; so does the test that
# proves it fails on a malformed docstring (tests/integration/test_docs_gate.py).
#   bash scripts/docs-gate.sh [mkdocs.yml]
set -uo pipefail
config=${1:-mkdocs.yml}
site=$(mktemp -d)
NO_MKDOCS_2_WARNING=1 mkdocs build --strict --config-file "$config" --site-dir "$site" 2>&1 | grep -v '^INFO'
status=${PIPESTATUS[0]}
rm -rf "$site"
[ "$status" -eq 0 ] && echo "docs: built with no warning" || echo "docs: the build failed (exit code $status)"
exit "$status"
