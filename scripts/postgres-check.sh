#!/usr/bin/env bash
# What the PostgreSQL tests need (tests/examples/test_tune_digits.py starts a real server with
# tests/postgres.py): PostgreSQL's initdb and pg_ctl, on PATH or in /usr/lib/postgresql/<v>/bin,
# and, under root, the user postgres to run the server as (initdb refuses root). Where the server
# is missing and this runs as root with apt-get, Debian's postgresql is installed; where it still
# cannot be had, this says what is missing and exits 1. scripts/test.sh runs it before the tests.
#   bash scripts/postgres-check.sh
set -uo pipefail
find_initdb() {
  command -v initdb || ls /usr/lib/postgresql/*/bin/initdb 2>/dev/null | sort -V | tail -n 1
}
if [ -z "$(find_initdb)" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "PostgreSQL's server is not installed: installing Debian's postgresql"
  log=$(mktemp)
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql; } >"$log" 2>&1; then
    cat "$log"
    echo "apt-get install postgresql failed (its output is above)"
  fi
  rm -f "$log"
fi
initdb=$(find_initdb)
if [ -z "$initdb" ]; then
  echo "PostgreSQL's initdb was not found (on PATH or in /usr/lib/postgresql/<version>/bin): the tests that start a"
  echo "PostgreSQL server will fail. Install the server (Debian: apt-get install postgresql) and run again."
  exit 1
fi
if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then
  echo "Running as root, the PostgreSQL server must run as the user postgres (initdb refuses root), which does"
  echo "not exist here. Create it (useradd --system postgres) or install Debian's postgresql, which does."
  exit 1
fi
echo "PostgreSQL: $("$initdb" --version) ($initdb)"
