#!/usr/bin/env bash
# A real Apache Kafka broker in KRaft mode on loopback, from jars resolved by broker/pom.xml.
#
#   scripts/kafka.sh fetch              resolve the broker jars into broker/lib (cached)
#   scripts/kafka.sh start [--nodes 3]  format storage on first start, start, wait until it serves requests
#   scripts/kafka.sh stop               stop every node this script started (by pid), wait for exit
#   scripts/kafka.sh status             print the bootstrap servers if running, exit 1 otherwise
#   scripts/kafka.sh logs               last lines of each node's log
#
# Environment: LEDGER_STATE (default ./.state), KAFKA_PORT (first broker port, default 9092),
# KAFKA_HEAP (default 768m per node). Start and stop are idempotent and serialised with a lock,
# so two `make run` at once cannot format or start the same data folder twice.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
STATE=${LEDGER_STATE:-$ROOT/.state}
KDIR=$STATE/kafka
LIB=$ROOT/broker/lib
PORT=${KAFKA_PORT:-9092}
HEAP=${KAFKA_HEAP:-768m}
READY_TIMEOUT_S=${KAFKA_READY_TIMEOUT_S:-90}

die() { echo "kafka.sh: $*" >&2; exit 1; }

need_java() {
  command -v java >/dev/null 2>&1 || die "Java 17+ is required (no 'java' on PATH). Install a JDK 17+, e.g. apt-get install -y openjdk-17-jdk-headless"
  local v
  v=$(java -version 2>&1 | awk -F'"' '/version/ {print $2}' | cut -d. -f1)
  [ "${v:-0}" -ge 17 ] 2>/dev/null || die "Java 17+ is required, found version '${v:-unknown}'"
}

fetch() {
  if [ -f "$LIB/.complete" ] && [ "$LIB/.complete" -nt "$ROOT/broker/pom.xml" ]; then return 0; fi
  command -v mvn >/dev/null 2>&1 || die "Maven is required to fetch the broker jars (no 'mvn' on PATH). Install it, e.g. apt-get install -y maven"
  echo "kafka.sh: resolving the Kafka broker jars from Maven Central (cached in ~/.m2 and broker/lib)"
  rm -rf "$LIB"
  mvn -q -B -f "$ROOT/broker/pom.xml" dependency:copy-dependencies || die "mvn could not resolve the broker jars (see output above)"
  touch "$LIB/.complete"
}

nodes_configured() { cat "$KDIR/nodes" 2>/dev/null || echo 0; }

node_alive() {  # $1 = node id
  local pidf=$KDIR/node$1/pid
  [ -f "$pidf" ] && kill -0 "$(cat "$pidf")" 2>/dev/null
}

bootstrap_of() {  # $1 = node count
  local s="" i
  for i in $(seq 1 "$1"); do s="$s${s:+,}127.0.0.1:$((PORT + i - 1))"; done
  echo "$s"
}

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

write_config() {  # $1 = node id, $2 = node count
  local id=$1 n=$2 voters="" i rf=1 isr=1
  for i in $(seq 1 "$n"); do voters="$voters${voters:+,}$i@127.0.0.1:$((PORT + 1000 + i - 1))"; done
  if [ "$n" -ge 3 ]; then rf=3; isr=2; fi
  mkdir -p "$KDIR/node$id/data"
  cat >"$KDIR/node$id/server.properties" <<EOF
process.roles=broker,controller
node.id=$id
controller.quorum.voters=$voters
listeners=PLAINTEXT://127.0.0.1:$((PORT + id - 1)),CONTROLLER://127.0.0.1:$((PORT + 1000 + id - 1))
advertised.listeners=PLAINTEXT://127.0.0.1:$((PORT + id - 1))
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs=$KDIR/node$id/data
num.partitions=8
default.replication.factor=$rf
min.insync.replicas=$isr
offsets.topic.replication.factor=$rf
offsets.topic.num.partitions=8
transaction.state.log.replication.factor=$rf
transaction.state.log.min.isr=$isr
share.coordinator.state.topic.replication.factor=$rf
share.coordinator.state.topic.min.isr=$isr
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=true
log.retention.hours=-1
log.segment.bytes=67108864
EOF
  cat >"$KDIR/node$id/log4j2.properties" <<EOF
status = error
appender.file.type = File
appender.file.name = file
appender.file.fileName = $KDIR/node$id/server.log
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
logger.kafka.name = kafka
logger.kafka.level = INFO
logger.state.name = state.change.logger
logger.state.level = WARN
logger.request.name = kafka.request.logger
logger.request.level = WARN
EOF
}

# The JVM command line for one node; the caller appends the main class and its arguments.
java_argv() {  # $1 = node id
  JAVA_ARGV=(java -Xms128m "-Xmx$HEAP" -XX:+UseG1GC -Djava.awt.headless=true
    "-Dlog4j2.configurationFile=$KDIR/node$1/log4j2.properties" -cp "$LIB/*")
}

start() {
  local n=1
  while [ $# -gt 0 ]; do
    case $1 in
      --nodes) n=$2; shift 2 ;;
      *) die "unknown option $1" ;;
    esac
  done
  [ "$n" = 1 ] || [ "$n" = 3 ] || die "--nodes must be 1 or 3"
  need_java
  fetch
  mkdir -p "$KDIR"
  exec 9>"$KDIR/lock"
  flock -w 120 9 || die "another kafka.sh holds $KDIR/lock"

  local have; have=$(nodes_configured)
  if [ "$have" != 0 ] && [ "$have" != "$n" ]; then
    die "$KDIR holds a $have-node cluster; stop it and remove $KDIR to start a $n-node one"
  fi
  local all_up=1 i
  for i in $(seq 1 "$n"); do node_alive "$i" || all_up=0; done
  if [ "$all_up" = 1 ]; then
    echo "kafka.sh: already running at $(bootstrap_of "$n")"
    return 0
  fi

  for i in $(seq 1 "$n"); do
    if ! node_alive "$i"; then
      for p in $((PORT + i - 1)) $((PORT + 1000 + i - 1)); do
        port_busy "$p" && die "port $p is in use by another process; set KAFKA_PORT to another base port or stop that process"
      done
    fi
  done

  local t0; t0=$(date +%s%N)
  if [ ! -f "$KDIR/cluster.id" ]; then
    # base64url of 16 random bytes, the form Kafka's own random-uuid command prints.
    python3 -c 'import base64,uuid;print(base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("="))' >"$KDIR/cluster.id"
  fi
  local cid; cid=$(cat "$KDIR/cluster.id")
  for i in $(seq 1 "$n"); do
    write_config "$i" "$n"
    if [ ! -f "$KDIR/node$i/data/meta.properties" ]; then
      java_argv "$i"
      "${JAVA_ARGV[@]}" kafka.tools.StorageTool format -t "$cid" -c "$KDIR/node$i/server.properties" \
        >"$KDIR/node$i/format.log" 2>&1 || { cat "$KDIR/node$i/format.log" >&2; die "formatting node $i storage failed"; }
    fi
  done
  echo "$n" >"$KDIR/nodes"

  for i in $(seq 1 "$n"); do
    node_alive "$i" && continue
    : >"$KDIR/node$i/server.log"
    # setsid: the broker outlives the shell that started it and ignores its Ctrl-C; stop() ends it.
    java_argv "$i"
    setsid "${JAVA_ARGV[@]}" kafka.Kafka "$KDIR/node$i/server.properties" \
      >"$KDIR/node$i/stdout.log" 2>&1 </dev/null 9>&- &
    echo $! >"$KDIR/node$i/pid"
  done

  local deadline=$(( $(date +%s) + READY_TIMEOUT_S ))
  for i in $(seq 1 "$n"); do
    until grep -q "Kafka Server started" "$KDIR/node$i/server.log" 2>/dev/null && port_busy $((PORT + i - 1)); do
      if ! node_alive "$i"; then
        echo "kafka.sh: node $i exited during start; last log lines:" >&2
        tail -n 30 "$KDIR/node$i/server.log" "$KDIR/node$i/stdout.log" >&2 || true
        stop_nodes; exit 1
      fi
      if [ "$(date +%s)" -ge "$deadline" ]; then
        echo "kafka.sh: node $i not ready after ${READY_TIMEOUT_S}s; last log lines:" >&2
        tail -n 30 "$KDIR/node$i/server.log" >&2 || true
        stop_nodes; exit 1
      fi
      sleep 0.2
    done
  done
  local ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  echo "kafka.sh: Kafka $(kafka_version) ready at $(bootstrap_of "$n") in ${ms} ms (cluster id $cid)"
}

kafka_version() { ls "$LIB" | sed -n 's/^kafka-clients-\(.*\)\.jar$/\1/p'; }

stop_nodes() {
  local i pid
  for i in 1 2 3; do
    [ -f "$KDIR/node$i/pid" ] || continue
    pid=$(cat "$KDIR/node$i/pid")
    if kill -0 "$pid" 2>/dev/null; then kill -TERM "$pid" 2>/dev/null || true; fi
  done
  for i in 1 2 3; do
    [ -f "$KDIR/node$i/pid" ] || continue
    pid=$(cat "$KDIR/node$i/pid")
    for _ in $(seq 1 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
    rm -f "$KDIR/node$i/pid"
  done
}

stop() {
  [ -d "$KDIR" ] || { echo "kafka.sh: not running"; return 0; }
  exec 9>"$KDIR/lock"
  flock -w 120 9 || die "another kafka.sh holds $KDIR/lock"
  stop_nodes
  echo "kafka.sh: stopped"
}

status() {
  local n; n=$(nodes_configured)
  [ "$n" != 0 ] || { echo "kafka.sh: not running"; return 1; }
  local i
  for i in $(seq 1 "$n"); do node_alive "$i" || { echo "kafka.sh: node $i not running"; return 1; }; done
  bootstrap_of "$n"
}

logs() {
  local i
  for i in 1 2 3; do [ -f "$KDIR/node$i/server.log" ] && tail -n "${LINES:-40}" "$KDIR/node$i/server.log"; done
  return 0
}

cmd=${1:-}; shift || true
case $cmd in
  fetch) fetch ;;
  start) start "$@" ;;
  stop) stop ;;
  status) status ;;
  logs) logs ;;
  *) die "usage: kafka.sh fetch|start [--nodes 3]|stop|status|logs" ;;
esac
