#!/usr/bin/env bash
# Runs a command with a PostgreSQL server for the read store's tests and benchmarks, exported as
# LEDGER_TEST_PG_URL: the given one if set, else the local one of scripts/postgres.sh, started here if it is
# not running and stopped again afterwards (a server that was already running is left running).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
started=0
if [ -z "${LEDGER_TEST_PG_URL:-}" ]; then
  if ! "$ROOT/scripts/postgres.sh" status >/dev/null 2>&1; then
    "$ROOT/scripts/postgres.sh" start || exit 1
    started=1
  fi
  export LEDGER_TEST_PG_URL=$("$ROOT/scripts/postgres.sh" status)
fi
"$@"
rc=$?
[ "$started" = 1 ] && "$ROOT/scripts/postgres.sh" stop >/dev/null
exit $rc
