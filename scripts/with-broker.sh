#!/usr/bin/env bash
# Runs a command against a Kafka broker: KAFKA_BOOTSTRAP if set, else the local one, started here if it
# is not running and stopped again afterwards (a broker that was already running is left running).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
started=0
if [ -z "${KAFKA_BOOTSTRAP:-}" ]; then
  if ! "$ROOT/scripts/kafka.sh" status >/dev/null 2>&1; then
    "$ROOT/scripts/kafka.sh" start || exit 1
    started=1
  fi
  export KAFKA_BOOTSTRAP=$("$ROOT/scripts/kafka.sh" status)
fi
"$@"
rc=$?
[ "$started" = 1 ] && "$ROOT/scripts/kafka.sh" stop >/dev/null
exit $rc
