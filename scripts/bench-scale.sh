#!/usr/bin/env bash
# `make bench-scale`: `make bench`'s throughput runs with 1, 2 and 4 worker processes (SCALE_WORKERS) sharing
# the partitions, on a 3-node cluster (RF 3, min ISR 2) started here in its own state folder and ports
# ($SCALE_STATE, default .state/scale; $SCALE_PORT, default 29292), never the shared broker, and stopped at the
# end. Extra arguments go to benchmarks/engine_bench.py (e.g. --count 10000). docs/engine.md, "Scale-out".
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export LEDGER_STATE=${SCALE_STATE:-$ROOT/.state/scale} KAFKA_PORT=${SCALE_PORT:-29292}
"$ROOT/scripts/kafka.sh" start --nodes 3
trap '"$ROOT/scripts/kafka.sh" stop' EXIT
KAFKA_BOOTSTRAP=$("$ROOT/scripts/kafka.sh" status) "$ROOT/.venv/bin/python" "$ROOT/benchmarks/engine_bench.py" \
  --scale "${SCALE_WORKERS:-1,2,4}" "$@"
