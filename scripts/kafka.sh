#!/usr/bin/env bash
# A real Apache Kafka broker in KRaft mode on loopback, from jars resolved by broker/pom.xml.
#
#   scripts/kafka.sh fetch              resolve the broker jars into broker/lib (cached)
#   scripts/kafka.sh start [--nodes 3] [--secure]
#                                       format storage on first start, start, wait until it serves requests;
#                                       --secure: SASL_SSL (SCRAM-SHA-512) and mTLS client listeners, TLS between
#                                       nodes, ACLs enforced (docs/security.md); credentials under $LEDGER_STATE/kafka/secure
#   scripts/kafka.sh stop               stop every node this script started (by pid), wait for exit
#   scripts/kafka.sh status             print the bootstrap servers if running, exit 1 otherwise
#   scripts/kafka.sh logs               last lines of each node's log
#
#   scripts/kafka.sh env USER           (secure) the KAFKA_* settings of a principal, as `export` lines
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

write_config() {  # $1 = node id, $2 = node count, $3 = plain|secure
  local id=$1 n=$2 mode=$3 voters="" i rf=1 isr=1
  for i in $(seq 1 "$n"); do voters="$voters${voters:+,}$i@127.0.0.1:$((PORT + 1000 + i - 1))"; done
  if [ "$n" -ge 3 ]; then rf=3; isr=2; fi
  mkdir -p "$KDIR/node$id/data"
  { if [ "$mode" = secure ]; then secure_listeners "$id"; else plain_listeners "$id"; fi
    cat <<EOF
process.roles=broker,controller
node.id=$id
controller.quorum.voters=$voters
controller.listener.names=CONTROLLER
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
  } >"$KDIR/node$id/server.properties"
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

plain_listeners() {  # $1 = node id
  cat <<EOF
listeners=PLAINTEXT://127.0.0.1:$((PORT + $1 - 1)),CONTROLLER://127.0.0.1:$((PORT + 1000 + $1 - 1))
advertised.listeners=PLAINTEXT://127.0.0.1:$((PORT + $1 - 1))
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
EOF
}

# --- the secured broker (docs/security.md) -------------------------------------------------------------------
# Listeners of node i:  CLIENT     SASL_SSL, SCRAM-SHA-512            PORT+i-1       (the bootstrap servers)
#                       MTLS       SSL, client certificate required   PORT+3000+i-1  (principal: the cert's CN)
#                       INTERNAL   SSL, client certificate required   PORT+2000+i-1  (between brokers)
#                       CONTROLLER SSL, client certificate required   PORT+1000+i-1  (the KRaft quorum)
# Nodes authenticate to each other by certificate (CN=ledger-broker, a super user): SCRAM credentials live in
# the cluster metadata, which the quorum's own connections cannot wait for. Every principal also has a client
# certificate with its name as CN, so one set of ACLs serves SCRAM and mTLS clients alike.
SEC=$KDIR/secure
SECURE_USERS=${KAFKA_SECURE_USERS:-admin worker app-a app-b reader auditor}
BROKER_PRINCIPAL=ledger-broker

secure_listeners() {  # $1 = node id
  local id=$1 pw; pw=$(cat "$SEC/store.password")
  cat <<EOF
listeners=CLIENT://127.0.0.1:$((PORT + id - 1)),MTLS://127.0.0.1:$((PORT + 3000 + id - 1)),INTERNAL://127.0.0.1:$((PORT + 2000 + id - 1)),CONTROLLER://127.0.0.1:$((PORT + 1000 + id - 1))
advertised.listeners=CLIENT://127.0.0.1:$((PORT + id - 1)),MTLS://127.0.0.1:$((PORT + 3000 + id - 1)),INTERNAL://127.0.0.1:$((PORT + 2000 + id - 1))
listener.security.protocol.map=CLIENT:SASL_SSL,MTLS:SSL,INTERNAL:SSL,CONTROLLER:SSL
inter.broker.listener.name=INTERNAL
sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.client.sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.client.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
ssl.keystore.type=PKCS12
ssl.keystore.location=$SEC/broker.p12
ssl.keystore.password=$pw
ssl.key.password=$pw
ssl.truststore.type=PKCS12
ssl.truststore.location=$SEC/truststore.p12
ssl.truststore.password=$pw
ssl.client.auth=required
listener.name.client.ssl.client.auth=none
ssl.endpoint.identification.algorithm=https
ssl.principal.mapping.rules=RULE:^CN=([^,]+)\$/\$1/,DEFAULT
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=false
super.users=User:$BROKER_PRINCIPAL;User:admin
EOF
}

need_tls_tools() {
  command -v openssl >/dev/null 2>&1 || die "openssl is required for --secure (apt-get install -y openssl)"
  command -v keytool >/dev/null 2>&1 || die "keytool is required for --secure (it comes with the JDK: apt-get install -y openjdk-17-jdk-headless)"
}

# A key and a certificate signed by the local CA: $1 = file stem, $2 = CN, $3 = extensions.
issue_cert() {
  openssl req -new -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.csr" -subj "/CN=$2" 2>/dev/null &&
  openssl x509 -req -in "$1.csr" -CA "$SEC/ca.pem" -CAkey "$SEC/ca.key" -set_serial "0x$(openssl rand -hex 16)" \
    -days 3650 -out "$1.pem" -extfile <(printf '%s\n' "$3") 2>/dev/null &&
  rm -f "$1.csr" && chmod 600 "$1.key"
}

# Once per state folder: a CA, the brokers' keystore and truststore, and per principal a SCRAM password and a
# client certificate. Nothing leaves the state folder; a new folder gets new secrets.
make_secrets() {
  [ -f "$SEC/.complete" ] && return 0
  need_tls_tools
  rm -rf "$SEC"; mkdir -p "$SEC/users"; chmod 700 "$SEC"
  openssl rand -hex 16 >"$SEC/store.password"
  local pw; pw=$(cat "$SEC/store.password")
  openssl req -x509 -newkey rsa:2048 -nodes -keyout "$SEC/ca.key" -out "$SEC/ca.pem" -days 3650 \
    -subj "/CN=ledger-local-ca" -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null || die "openssl could not make the CA"
  issue_cert "$SEC/broker" "$BROKER_PRINCIPAL" "subjectAltName=IP:127.0.0.1,DNS:localhost
extendedKeyUsage=serverAuth,clientAuth" || die "openssl could not issue the broker certificate"
  openssl pkcs12 -export -in "$SEC/broker.pem" -inkey "$SEC/broker.key" -certfile "$SEC/ca.pem" -name broker \
    -out "$SEC/broker.p12" -passout "pass:$pw" || die "openssl could not write the broker keystore"
  keytool -importcert -noprompt -alias ledger-ca -file "$SEC/ca.pem" -keystore "$SEC/truststore.p12" \
    -storetype PKCS12 -storepass "$pw" >/dev/null 2>&1 || die "keytool could not write the truststore"
  local u
  for u in $SECURE_USERS; do
    openssl rand -hex 24 >"$SEC/users/$u.password"
    issue_cert "$SEC/users/$u" "$u" "extendedKeyUsage=clientAuth" || die "openssl could not issue $u's certificate"
  done
  chmod 600 "$SEC"/users/*.password "$SEC/store.password" "$SEC/ca.key"
  touch "$SEC/.complete"
}

scram_args() {  # kafka-storage format arguments: every principal's SCRAM credential
  SCRAM_ARGS=()
  local u
  for u in $SECURE_USERS; do
    SCRAM_ARGS+=(--add-scram "SCRAM-SHA-512=[name=$u,password=$(cat "$SEC/users/$u.password")]")
  done
}

mode_configured() { cat "$KDIR/mode" 2>/dev/null || echo plain; }

mtls_bootstrap_of() {  # $1 = node count
  local s="" i
  for i in $(seq 1 "$1"); do s="$s${s:+,}127.0.0.1:$((PORT + 3000 + i - 1))"; done
  echo "$s"
}

# `kafka.sh env USER [--mtls]`: what a process needs to connect as USER, as export lines (streams/config.py).
user_env() {
  [ "$(mode_configured)" = secure ] || die "$KDIR is not a --secure broker"
  local u=${1:-} how=${2:-scram} n; n=$(nodes_configured)
  { [ -n "$u" ] && [ -f "$SEC/users/$u.password" ]; } || die "no principal '$u' (have: $SECURE_USERS)"
  if [ "$how" = --mtls ]; then
    cat <<EOF
export KAFKA_BOOTSTRAP=$(mtls_bootstrap_of "$n")
export KAFKA_SECURITY_PROTOCOL=SSL
export KAFKA_SSL_CA_LOCATION=$SEC/ca.pem
export KAFKA_SSL_CERTIFICATE_LOCATION=$SEC/users/$u.pem
export KAFKA_SSL_KEY_LOCATION=$SEC/users/$u.key
EOF
  else
    cat <<EOF
export KAFKA_BOOTSTRAP=$(bootstrap_of "$n")
export KAFKA_SECURITY_PROTOCOL=SASL_SSL
export KAFKA_SASL_MECHANISM=SCRAM-SHA-512
export KAFKA_SASL_USERNAME=$u
export KAFKA_SASL_PASSWORD=$(cat "$SEC/users/$u.password")
export KAFKA_SSL_CA_LOCATION=$SEC/ca.pem
EOF
  fi
}

# The JVM command line for one node; the caller appends the main class and its arguments.
java_argv() {  # $1 = node id
  JAVA_ARGV=(java -Xms128m "-Xmx$HEAP" -XX:+UseG1GC -Djava.awt.headless=true
    "-Dlog4j2.configurationFile=$KDIR/node$1/log4j2.properties" -cp "$LIB/*")
}

start() {
  local n=1 mode=plain
  while [ $# -gt 0 ]; do
    case $1 in
      --nodes) n=$2; shift 2 ;;
      --secure) mode=secure; shift ;;
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
  if [ "$have" != 0 ] && [ "$(mode_configured)" != "$mode" ]; then
    die "$KDIR holds a $(mode_configured) cluster; stop it and remove $KDIR to start a $mode one"
  fi
  local all_up=1 i
  for i in $(seq 1 "$n"); do node_alive "$i" || all_up=0; done
  if [ "$all_up" = 1 ]; then
    echo "kafka.sh: already running at $(bootstrap_of "$n")"
    return 0
  fi

  for i in $(seq 1 "$n"); do
    if ! node_alive "$i"; then
      for p in $((PORT + i - 1)) $((PORT + 1000 + i - 1)) $([ "$mode" = secure ] && echo $((PORT + 2000 + i - 1)) $((PORT + 3000 + i - 1))); do
        port_busy "$p" && die "port $p is in use by another process; set KAFKA_PORT to another base port or stop that process"
      done
    fi
  done

  local t0; t0=$(date +%s%N)
  if [ ! -f "$KDIR/cluster.id" ]; then
    # base64url of 16 random bytes, the form Kafka's own random-uuid command prints; like Kafka's Uuid, never
    # starting with '-' (one id in 64 did, and kafka-storage then read it as an option: "expected one argument").
    python3 -c '
import base64, uuid
while True:
    cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    if not cid.startswith("-"):
        print(cid)
        break' >"$KDIR/cluster.id"
  fi
  local cid; cid=$(cat "$KDIR/cluster.id")
  SCRAM_ARGS=()
  if [ "$mode" = secure ]; then make_secrets; scram_args; fi
  for i in $(seq 1 "$n"); do
    write_config "$i" "$n" "$mode"
    if [ ! -f "$KDIR/node$i/data/meta.properties" ]; then
      java_argv "$i"
      # SCRAM credentials go into the cluster's first metadata: they exist before any client connects.
      "${JAVA_ARGV[@]}" kafka.tools.StorageTool format -t "$cid" -c "$KDIR/node$i/server.properties" \
        ${SCRAM_ARGS[@]+"${SCRAM_ARGS[@]}"} \
        >"$KDIR/node$i/format.log" 2>&1 || { cat "$KDIR/node$i/format.log" >&2; die "formatting node $i storage failed"; }
    fi
  done
  echo "$n" >"$KDIR/nodes"
  echo "$mode" >"$KDIR/mode"

  # The nodes this call starts: a failure stops only them. Restarting one node of a running cluster, a node
  # that is slow to start must not take the healthy ones down with it.
  local started=()
  for i in $(seq 1 "$n"); do
    node_alive "$i" && continue
    started+=("$i")
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
        stop_started "$i" ${started[@]+"${started[@]}"}; exit 1
      fi
      if [ "$(date +%s)" -ge "$deadline" ]; then
        echo "kafka.sh: node $i not ready after ${READY_TIMEOUT_S}s (KAFKA_READY_TIMEOUT_S); last log lines:" >&2
        tail -n 30 "$KDIR/node$i/server.log" >&2 || true
        stop_started "$i" ${started[@]+"${started[@]}"}; exit 1
      fi
      sleep 0.2
    done
  done
  local ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  echo "kafka.sh: Kafka $(kafka_version) ready at $(bootstrap_of "$n") in ${ms} ms (cluster id $cid)"
  if [ "$mode" = secure ]; then
    echo "kafka.sh: secured: SASL_SSL (SCRAM-SHA-512) at $(bootstrap_of "$n"), mTLS at $(mtls_bootstrap_of "$n");" \
      "principals: $SECURE_USERS. Connect as one: eval \"\$(scripts/kafka.sh env USER)\""
  fi
}

kafka_version() { ls "$LIB" | sed -n 's/^kafka-clients-\(.*\)\.jar$/\1/p'; }

# After a failed start: stop the nodes this call started, say which and which are left running.
stop_started() {  # $1 = the node that failed, then the nodes this call started
  local failed=$1; shift
  local left="" i
  for i in $(seq 1 "$(nodes_configured)"); do
    case " $* " in *" $i "*) ;; *) node_alive "$i" && left="$left $i" ;; esac
  done
  echo "kafka.sh: start failed at node $failed; stopping the node(s) this call started:$(printf ' %s' "$@")" \
    "${left:+(left running:$left)}" >&2
  [ $# -eq 0 ] || stop_nodes "$@"
}

stop_nodes() {  # [node ids] (default: every node)
  local i pid ids=("$@")
  [ ${#ids[@]} -gt 0 ] || ids=(1 2 3)
  for i in "${ids[@]}"; do
    [ -f "$KDIR/node$i/pid" ] || continue
    pid=$(cat "$KDIR/node$i/pid")
    if kill -0 "$pid" 2>/dev/null; then kill -TERM "$pid" 2>/dev/null || true; fi
  done
  for i in "${ids[@]}"; do
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
  env) user_env "$@" ;;
  *) die "usage: kafka.sh fetch|start [--nodes 3] [--secure]|stop|status|logs|env USER [--mtls]" ;;
esac
