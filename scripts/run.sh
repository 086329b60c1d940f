#!/usr/bin/env bash
# `make run`: the broker (unless KAFKA_BOOTSTRAP is set), the topics, a worker, and demo traffic.
# Ctrl-C stops everything this script started. One `make run` at a time per state folder.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
STATE=${LEDGER_STATE:-$ROOT/.state}
BIN=$ROOT/.venv/bin
mkdir -p "$STATE"
exec 8>"$STATE/run.lock"
if ! flock -n 8; then
  echo "run.sh: another 'make run' is using $STATE; stop it first (Ctrl-C in its terminal)" >&2
  exit 1
fi

pids=()
started_broker=0
cleanup() {
  trap - INT TERM EXIT
  echo; echo "run.sh: stopping"
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null; done
  [ "$started_broker" = 1 ] && "$ROOT/scripts/kafka.sh" stop
  exit 0
}
trap cleanup INT TERM EXIT

if [ -z "${KAFKA_BOOTSTRAP:-}" ]; then
  if ! "$ROOT/scripts/kafka.sh" status >/dev/null 2>&1; then
    "$ROOT/scripts/kafka.sh" start || exit 1
    started_broker=1
  fi
  export KAFKA_BOOTSTRAP=$("$ROOT/scripts/kafka.sh" status)
fi
"$BIN/ledger" topics create || exit 1

LEDGER_METRICS_PORT=${LEDGER_METRICS_PORT:-9108} LEDGER_DATA_DIR=$STATE/worker-1 "$BIN/ledger" worker >"$STATE/worker-1.log" 2>&1 &
pids+=($!)
echo "run.sh: worker started (log: $STATE/worker-1.log)"
"$BIN/ledger" api --db "$STATE/read.db" --port "${LEDGER_API_PORT:-8080}" >"$STATE/api.log" 2>&1 &
pids+=($!)
echo "run.sh: dashboard at http://127.0.0.1:${LEDGER_API_PORT:-8080}/  (API docs /docs, metrics /metrics)"
"$BIN/ledger" loadgen --rate "${LEDGER_DEMO_RATE:-50}" &
pids+=($!)
echo "run.sh: demo traffic at ${LEDGER_DEMO_RATE:-50} commands/s; Ctrl-C to stop"
wait -n "${pids[@]}"
echo "run.sh: a process exited; see $STATE/worker-1.log and $STATE/api.log" >&2
