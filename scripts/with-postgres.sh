#!/usr/bin/env bash
# Runs a command with a PostgreSQL server for the read store's tests and benchmarks, exported as
# LEDGER_TEST_PG_URL: the given one if set, else the local one of scripts/postgres.sh, started here if it is
# not running and stopped again afterwards (a server that was already running is left running).
# A machine without PostgreSQL still runs the command, without the variable (the tests skip their PostgreSQL
# cases), except under CI, which must test both backends.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
started=0
if [ -z "${LEDGER_TEST_PG_URL:-}" ]; then
  if "$ROOT/scripts/postgres.sh" status >/dev/null 2>&1; then
    export LEDGER_TEST_PG_URL=$("$ROOT/scripts/postgres.sh" status)
  elif "$ROOT/scripts/postgres.sh" start; then
    started=1
    export LEDGER_TEST_PG_URL=$("$ROOT/scripts/postgres.sh" status)
  elif [ -n "${CI:-}" ]; then
    exit 1
  else
    echo "with-postgres.sh: no PostgreSQL server; running without it (its test cases are skipped)" >&2
  fi
fi
"$@"
rc=$?
[ "$started" = 1 ] && "$ROOT/scripts/postgres.sh" stop >/dev/null
exit $rc
