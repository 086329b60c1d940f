#!/usr/bin/env bash
# A local PostgreSQL server for the read store's PostgreSQL backend (tests, CI, benchmarks).
#
#   scripts/postgres.sh start    initdb on first start, start, wait until it accepts connections
#   scripts/postgres.sh stop     fast shutdown, wait for exit
#   scripts/postgres.sh status   print the URL if this cluster is running, exit 1 otherwise
#   scripts/postgres.sh url      print the URL (running or not)
#   scripts/postgres.sh logs     last lines of the server log
#
# Environment: LEDGER_STATE (default ./.state; the cluster lives in $LEDGER_STATE/postgres), LEDGER_PG_PORT
# (default 5433, so a system PostgreSQL on 5432 is left alone). The server listens on 127.0.0.1 only, with
# its unix socket inside the state folder, and trusts loopback connections: it is a throwaway development
# server, not a place for real data. Start and stop are idempotent and serialised with a lock.
#
# PostgreSQL refuses to run as root; run as root (CI, the development machines), initdb and pg_ctl run as the
# `postgres` user (Debian's package creates it) and the cluster folder is handed to that user.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
STATE=${LEDGER_STATE:-$ROOT/.state}
mkdir -p "$STATE"
PGDIR=$STATE/postgres
if [ "$(id -u)" = 0 ] && id postgres >/dev/null 2>&1 && ! runuser -u postgres -- test -x "$STATE" 2>/dev/null; then
  # The server runs as `postgres` and must reach its folder: under a state folder closed to other users (a
  # checkout in /root), the cluster lives in /tmp instead, one per state folder.
  PGDIR=/tmp/ledger-postgres-$(printf %s "$STATE" | cksum | cut -d' ' -f1)
fi
DATA=$PGDIR/data
SOCKETS=$PGDIR/run
PORT=${LEDGER_PG_PORT:-5433}

die() { echo "postgres.sh: $*" >&2; exit 1; }

# The newest server binaries: Debian keeps them in /usr/lib/postgresql/<major>/bin (not on PATH); other
# systems put pg_ctl on PATH.
bindir() {
  local d
  d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
  if [ -n "$d" ] && [ -x "$d/pg_ctl" ]; then echo "$d"; return 0; fi
  command -v pg_ctl >/dev/null 2>&1 && { dirname "$(readlink -f "$(command -v pg_ctl)")"; return 0; }
  die "PostgreSQL server binaries not found (no pg_ctl in /usr/lib/postgresql/*/bin or on PATH). Install them, e.g. apt-get install -y postgresql"
}

as_owner() {  # run a server binary as the cluster's owner
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

# The running server's port (line 4 of postmaster.pid), else the configured one.
url() {
  local port; port=$(sed -n 4p "$DATA/postmaster.pid" 2>/dev/null || true)
  echo "postgresql://postgres@127.0.0.1:${port:-$PORT}/postgres"
}

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

running() { [ -f "$DATA/PG_VERSION" ] && as_owner "$BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1; }

prepare() {  # the cluster folder, owned by whoever runs the server
  mkdir -p "$PGDIR"
  # A unix socket path is limited to 107 bytes; fail here rather than in the server log.
  [ ${#SOCKETS} -le 90 ] || die "socket folder $SOCKETS is too long for a unix socket; set LEDGER_STATE to a shorter path"
  mkdir -p "$SOCKETS"
  if [ "$(id -u)" = 0 ]; then
    id postgres >/dev/null 2>&1 || die "running as root needs a 'postgres' user to run the server (apt-get install -y postgresql creates it)"
    [ -d "$DATA" ] || install -d -m 700 "$DATA"
    chown -R postgres:postgres "$PGDIR"
    runuser -u postgres -- test -w "$DATA" \
      || die "the postgres user cannot reach $DATA (a parent folder is not searchable by others); set LEDGER_STATE elsewhere"
  else
    [ -d "$DATA" ] || install -d -m 700 "$DATA"
  fi
}

start() {
  BIN=$(bindir)
  mkdir -p "$PGDIR"
  exec 9>"$PGDIR/lock"
  flock -w 120 9 || die "another postgres.sh holds $PGDIR/lock"
  if running; then
    echo "postgres.sh: already running at $(url)"
    return 0
  fi
  port_busy "$PORT" && die "port $PORT is in use by another process; set LEDGER_PG_PORT to another port or stop that process"
  prepare
  local t0; t0=$(date +%s%N)
  if [ ! -f "$DATA/PG_VERSION" ]; then
    # C locale: text sorts bytewise, as in SQLite, whatever the machine's locale.
    as_owner "$BIN/initdb" -D "$DATA" -U postgres --auth=trust --encoding=UTF8 --no-locale \
      >"$PGDIR/initdb.log" 2>&1 || { cat "$PGDIR/initdb.log" >&2; die "initdb failed"; }
    cat >>"$DATA/postgresql.conf" <<EOF

# scripts/postgres.sh: loopback only (port and socket folder are given at each start).
listen_addresses = '127.0.0.1'
max_connections = 200
EOF
  fi
  # setsid: the server outlives this shell and ignores its Ctrl-C; 9>&-: it must not inherit the lock.
  as_owner setsid -w "$BIN/pg_ctl" -D "$DATA" -l "$PGDIR/server.log" -o "-p $PORT -k '$SOCKETS'" -w -t 60 start \
    >/dev/null 9>&- \
    || { tail -n 30 "$PGDIR/server.log" >&2 || true; die "the server did not start (log: $PGDIR/server.log)"; }
  local ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  echo "postgres.sh: PostgreSQL $(cat "$DATA/PG_VERSION") ready at $(url) in ${ms} ms"
}

stop() {
  [ -f "$DATA/PG_VERSION" ] || { echo "postgres.sh: not running"; return 0; }
  BIN=$(bindir)
  exec 9>"$PGDIR/lock"
  flock -w 120 9 || die "another postgres.sh holds $PGDIR/lock"
  if running; then
    as_owner "$BIN/pg_ctl" -D "$DATA" -m fast -w -t 60 stop >/dev/null 9>&- || die "the server did not stop (log: $PGDIR/server.log)"
    echo "postgres.sh: stopped"
  else
    echo "postgres.sh: not running"
  fi
}

status() {
  BIN=$(bindir)
  running || { echo "postgres.sh: not running"; return 1; }
  url
}

logs() { tail -n "${LINES:-40}" "$PGDIR/server.log" 2>/dev/null || true; }

cmd=${1:-}; shift || true
case $cmd in
  start) start ;;
  stop) stop ;;
  status) status ;;
  url) url ;;
  logs) logs ;;
  *) die "usage: postgres.sh start|stop|status|url|logs" ;;
esac
