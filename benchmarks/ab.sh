#!/usr/bin/env bash
# A/B of one benchmark: REV against HEAD, back to back on the same machine and broker.
#
#   benchmarks/ab.sh REV [BENCH [ARGS...]]
#
# BENCH is a script of benchmarks/ without .py (default client_bench, with --count 30000). Both commits are
# checked out into temporary git worktrees (HEAD's too, so edits in the working tree are not measured) and
# run with this tree's .venv, PYTHONPATH pointing at the worktree: each run's client and worker come from its
# own commit. Each benchmark makes its topics under its own random prefix. AB_ROUNDS=2 runs REV, HEAD, HEAD,
# REV (absolute figures move a lot between runs on a shared machine: only a ratio of figures taken together
# means much). AB_SAME_SCRIPT=1 runs HEAD's benchmark script against both commits' code (a commit without
# the script gets HEAD's anyway). Prints each run's figure and the ratio HEAD/REV (for a time per command,
# REV/HEAD: above 1 is always HEAD better). AB_HEAD=REV2 measures REV2 in HEAD's place (one change alone).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY="$ROOT/.venv/bin/python"
REV=${1:?usage: benchmarks/ab.sh REV [BENCH [ARGS...]]}
shift
BENCH=${1:-client_bench}
[ $# -gt 0 ] && shift
ARGS=("$@")

# The figure each benchmark prints, and whether more is better.
case "$BENCH" in
  client_bench) [ ${#ARGS[@]} -gt 0 ] || ARGS=(--count 30000)
                PATTERN='([0-9.]+) results/s end to end'; HIGHER=1 ;;
  engine_bench) [ ${#ARGS[@]} -gt 0 ] || ARGS=(--count 8000 --latency 300:0 --seconds 10)
                PATTERN='one record per command: +([0-9.]+) commands/s'; HIGHER=1 ;;
  # HEAD's script against both trees' code: scripts before it printed only a time per decided command, and a
  # decided command is not the same amount of work in every commit (the steps per transfer change).
  engine_core_bench) PATTERN='per client transfer: +([0-9.]+) µs'; HIGHER=0; AB_SAME_SCRIPT=${AB_SAME_SCRIPT:-1} ;;
  core_bench) PATTERN='two-leg transfers: +([0-9,]+) decisions/s'; HIGHER=1 ;;
  *) PATTERN=${AB_PATTERN:?"set AB_PATTERN to a regex whose group 1 is $BENCH's figure"}; HIGHER=${AB_HIGHER:-1} ;;
esac

if [ -z "${KAFKA_BOOTSTRAP:-}" ] && [[ "$BENCH" != *core_bench ]]; then
  KAFKA_BOOTSTRAP=$("$ROOT/scripts/kafka.sh" status) || { echo "no broker: scripts/kafka.sh start" >&2; exit 1; }
  export KAFKA_BOOTSTRAP
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/ledger-ab-XXXXXX")
cleanup() {
  for tree in "$WORK"/rev "$WORK"/head; do
    [ -d "$tree" ] && git -C "$ROOT" worktree remove --force "$tree" >/dev/null 2>&1 || true
  done
  rm -rf "$WORK"
}
trap cleanup EXIT
trap "exit 130" INT TERM  # so that EXIT runs cleanup when the run is stopped
git -C "$ROOT" worktree add --detach "$WORK/rev" "$REV" >/dev/null 2>&1
git -C "$ROOT" worktree add --detach "$WORK/head" "${AB_HEAD:-HEAD}" >/dev/null 2>&1
REV_ID=$(git -C "$WORK/rev" rev-parse --short HEAD)
HEAD_ID=$(git -C "$WORK/head" rev-parse --short HEAD)
if [ -n "${AB_SAME_SCRIPT:-}" ] || [ ! -f "$WORK/rev/benchmarks/$BENCH.py" ]; then
  # An older commit without this benchmark runs HEAD's script against its own code (it may not fit).
  echo "running HEAD's benchmarks/$BENCH.py against both commits' code" >&2
  for tree in "$WORK/rev" "$WORK/head"; do git -C "$ROOT" show "HEAD:benchmarks/$BENCH.py" > "$tree/benchmarks/$BENCH.py"; done
fi

# Each tree's compiled modules (schemas/cdecode.py: the decoders, the replay loader's common case) are built
# into the tree, as `make install` builds them in a checkout: without them a tree runs its Python fallbacks,
# which is not what a machine with a compiler runs. AB_NATIVE=0 skips the build (both run in Python).
if [ "${AB_NATIVE:-1}" = 1 ]; then
  for tree in "$WORK/rev" "$WORK/head"; do
    if [ -f "$tree/schemas/cdecode.py" ]; then
      (cd "$tree" && PYTHONPATH="$tree" "$PY" -m schemas.cdecode build >"$WORK/build.log" 2>&1) \
        || { echo "the compiled modules of $tree were not built (see below); it runs in Python" >&2; tail -5 "$WORK/build.log" >&2; }
    fi
  done
fi

run() {  # tree label -> the figure on stdout; the run's output in $WORK/label.log
  local tree=$1 label=$2
  echo "== $label: $BENCH ${ARGS[*]} (load average $(cut -d' ' -f1 /proc/loadavg))" >&2
  (cd "$tree" && PYTHONPATH="$tree" "$PY" "benchmarks/$BENCH.py" "${ARGS[@]}") 2>"$WORK/$label.err" | tee "$WORK/$label.log" >&2 \
    || { tail -20 "$WORK/$label.err" >&2; exit 1; }
  grep -oP "$PATTERN" "$WORK/$label.log" | head -1 | sed -E "s#$PATTERN#\\1#" | tr -d ,
}

A=(); B=()
order=(rev head)
[ "${AB_ROUNDS:-1}" -ge 2 ] && order=(rev head head rev)
for side in "${order[@]}"; do
  if [ "$side" = rev ]; then A+=("$(run "$WORK/rev" "rev-$REV_ID-${#A[@]}")"); else B+=("$(run "$WORK/head" "head-$HEAD_ID-${#B[@]}")"); fi
done

"$PY" - "$BENCH" "$REV_ID" "$HEAD_ID" "$HIGHER" "${A[*]}" "${B[*]}" <<'EOF'
import sys
bench, rev, head, higher, a, b = sys.argv[1:]
a, b = [float(x) for x in a.split()], [float(x) for x in b.split()]
ma, mb = sum(a) / len(a), sum(b) / len(b)
ratio = mb / ma if higher == "1" else ma / mb
print(f"{bench}: {rev} {' '.join(f'{x:g}' for x in a)} | HEAD {head} {' '.join(f'{x:g}' for x in b)} | "
      f"HEAD is {ratio:.2f}x {rev}" + ("" if higher == "1" else " (time per command, inverted)"))
EOF
