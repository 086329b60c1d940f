#!/usr/bin/env bash
# `make run`: the broker (unless KAFKA_BOOTSTRAP is set), the topics, a worker, and demo traffic.
# Ctrl-C stops everything this script started. One `make run` at a time per state folder.
# Clients sign their commands and act within the demo policy, the dashboard needs its token (printed below;
# connectors/demo_access.py writes both into $STATE/access, `source $STATE/access/demo.env` lets the CLI in).
# LEDGER_OPEN=1: no client keys and no tokens, as in development.
#
# SECURE=1 (`make run SECURE=1`): the same on a secured local broker (scripts/kafka.sh start --secure, state in
# .state/secure, ports from 9192), with the ACL model applied, each process as its own principal: topics and
# ACLs as admin, the worker as worker, the demo traffic as app-a, the read API as auditor (it serves every
# client's results). docs/security.md.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SECURE=${SECURE:-0}
if [ "$SECURE" = 1 ]; then
  export LEDGER_STATE=${LEDGER_STATE:-$ROOT/.state/secure} KAFKA_PORT=${KAFKA_PORT:-9192}
  unset KAFKA_BOOTSTRAP  # the secured broker is always the local one
fi
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

# principal_env NAME: that principal's Kafka settings as NAME=VALUE words for `env` (SECURE=1), else none;
# left in PRINCIPAL_ENV. `env` execs the command, so $! of a background one is the process itself.
principal_env() {
  PRINCIPAL_ENV=()
  [ "$SECURE" = 1 ] || return 0
  local line
  while IFS= read -r line; do PRINCIPAL_ENV+=("${line#export }"); done < <("$ROOT/scripts/kafka.sh" env "$1")
}

if [ -z "${KAFKA_BOOTSTRAP:-}" ]; then
  if ! "$ROOT/scripts/kafka.sh" status >/dev/null 2>&1; then
    "$ROOT/scripts/kafka.sh" start $([ "$SECURE" = 1 ] && echo --secure) || exit 1
    started_broker=1
  fi
  [ "$SECURE" = 1 ] || export KAFKA_BOOTSTRAP=$("$ROOT/scripts/kafka.sh" status)
fi
principal_env admin
env "${PRINCIPAL_ENV[@]}" "$BIN/ledger" topics create || exit 1
if [ "$SECURE" = 1 ]; then
  # loadgen sends as client id "loadgen": app-a's own results topic is that client's.
  env "${PRINCIPAL_ENV[@]}" "$BIN/ledger" acl apply --producer app-a:loadgen --producer app-b | tail -n 1
fi

principal_env worker
ACCESS=$STATE/access LOGIN="" LOADGEN_KEY=""
if [ "${LEDGER_OPEN:-0}" != 1 ]; then
  token=$("$BIN/python" -m connectors.demo_access "$ACCESS") || exit 1
  export LEDGER_CLIENTS=$ACCESS/clients.toml LEDGER_API_TOKENS=$ACCESS/tokens.toml
  LOGIN="?token=$token" LOADGEN_KEY=$ACCESS/loadgen.key
fi
LEDGER_METRICS_PORT=${LEDGER_METRICS_PORT:-9108} LEDGER_DATA_DIR=$STATE/worker-1 env "${PRINCIPAL_ENV[@]}" "$BIN/ledger" worker >"$STATE/worker-1.log" 2>&1 &
pids+=($!)
echo "run.sh: worker started (log: $STATE/worker-1.log)"
principal_env auditor
# The dashboard's latency and lag per partition come from the worker's /metrics.
LEDGER_WORKER_METRICS=${LEDGER_WORKER_METRICS:-127.0.0.1:${LEDGER_METRICS_PORT:-9108}} \
  env "${PRINCIPAL_ENV[@]}" "$BIN/ledger" api --db "$STATE/read.db" --port "${LEDGER_API_PORT:-8080}" >"$STATE/api.log" 2>&1 &
pids+=($!)
echo "run.sh: dashboard at http://127.0.0.1:${LEDGER_API_PORT:-8080}/$LOGIN  (API docs /docs, metrics /metrics)"
[ -n "$LOGIN" ] && echo "run.sh: clients sign (policy: $ACCESS/clients.toml); for the CLI: source $ACCESS/demo.env"
principal_env app-a
env "${PRINCIPAL_ENV[@]}" LEDGER_CLIENT_KEY_FILE=$LOADGEN_KEY "$BIN/ledger" loadgen --rate "${LEDGER_DEMO_RATE:-50}" &
pids+=($!)
echo "run.sh: demo traffic at ${LEDGER_DEMO_RATE:-50} commands/s; Ctrl-C to stop"
wait -n "${pids[@]}"
echo "run.sh: a process exited; see $STATE/worker-1.log and $STATE/api.log" >&2
