"""Settings shared by every process, read from the environment once.

KAFKA_BOOTSTRAP points everything at a cluster (default: the local broker of scripts/kafka.sh).
How every Kafka client authenticates (SASL, TLS and mTLS, OAUTHBEARER, KAFKA_CONFIG_FILE) is read once by
streams/kafka_security.py and reaches the confluent-kafka clients (kafka_config) and the worker's Faust consumer
(faust_credentials) alike.
LEDGER_CONNECT_TIMEOUT_S bounds how long a client or CLI command waits for the cluster before it gives up
with one line (`error: cannot reach Kafka at HOST:PORT`) instead of retrying for ever.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field, replace

from streams import kafka_security

# librdkafka's own log lines (connection refused, broker down, ...) go through this logger instead of
# straight to stderr, so a process decides how much of them it shows.
KAFKA_LOG = logging.getLogger("ledger.kafka")

TOPIC_NAMES = ("commands", "results", "balances", "history", "dlq", "changelog", "snapshots")
# How a worker takes command records from its Faust stream (streams/batching.py): at most BATCH_MAX per batch;
# once a batch has its first record, waiting at most BATCH_WINDOW_S for more while the worker is BATCH_BEHIND
# records or more behind its partitions' ends, else BATCH_WINDOW_IDLE_S (docs/engine.md, "Latency").
# (benchmarks/faust_ceiling.py takes records with Faust's take_events and BATCH_WINDOW_S.)
BATCH_MAX = int(os.environ.get("LEDGER_BATCH_MAX", "2000"))
BATCH_WINDOW_S = float(os.environ.get("LEDGER_BATCH_WINDOW_S", "0.02"))
BATCH_WINDOW_IDLE_S = float(os.environ.get("LEDGER_BATCH_WINDOW_IDLE_S", "0.002"))
BATCH_BEHIND = int(os.environ.get("LEDGER_BATCH_BEHIND", "100"))

# How long a worker's Kafka clients wait for one broker's answer before they drop that connection and retry,
# by then at the partition's new leader or the group's new coordinator (docs/reliability.md). A broker that
# stops answering without closing its sockets (paused, swapping, partitioned) is fenced by the cluster after
# broker.session.timeout.ms (9 s by default) and its partitions move; a client left waiting on it with the
# libraries' defaults (librdkafka 60 s, aiokafka 40 s) stalls the ledger long past that move.
WORKER_SOCKET_TIMEOUT_MS = 10_000  # librdkafka socket.timeout.ms: the client-side wait for any request
WORKER_ACK_TIMEOUT_MS = 8_000  # librdkafka request.timeout.ms: the broker's wait for the ISR's acks (below the above)
WORKER_DELIVERY_TIMEOUT_MS = 50_000  # librdkafka message.timeout.ms: a send not acked by then fails, named
WORKER_CONSUMER_REQUEST_TIMEOUT_S = 15.0  # aiokafka request_timeout_ms (Faust requires >= the session timeout)

# A reader that reads partitions up to their end and stops (a worker's restore, verify, quiescence, a topic read
# whole) learns that it reached the end from an empty fetch. With librdkafka's default fetch.wait.max.ms the
# broker holds every such fetch 500 ms waiting for records that are not coming: half a second per partition read
# (a worker's restore reads two topics per partition). Asking again after 10 ms costs a few small requests.
BOUNDED_READ_FETCH_WAIT_MS = 10


@dataclass(frozen=True, slots=True)
class Settings:
    bootstrap: str = "127.0.0.1:9092"
    # Every topic name starts with this, so several ledgers (or test runs) share one cluster.
    prefix: str = "ledger."
    # One partition count for every partitioned topic: they are co-partitioned by construction.
    partitions: int = 8
    # Replicas per ledger topic; None: chosen from the cluster at creation (connectors/admin.py,
    # topic_replication: RF 3 with min ISR 2 on 3 or more brokers, else the cluster's default).
    replication: int | None = None
    security: dict[str, str] = field(default_factory=dict)
    # How long a client waits for the cluster to answer at all before giving up (BrokerUnreachable).
    connect_timeout_s: float = 10.0

    def topic(self, name: str) -> str:
        assert name in TOPIC_NAMES, name
        return f"{self.prefix}{name}"

    def kafka_config(self) -> dict[str, str]:
        """confluent-kafka (librdkafka) configuration with the security pass-through."""
        return {"bootstrap.servers": self.bootstrap, "logger": KAFKA_LOG, **self.security}

    def bounded_reader_config(self, group_id: str) -> dict[str, object]:
        """A consumer that reads committed records up to a partition's end, which it sees as an EOF event, and
        stops there: it commits nothing and asks again soon when a fetch finds nothing new."""
        return {**self.kafka_config(), "group.id": group_id, "enable.auto.commit": False,
                "isolation.level": "read_committed", "enable.partition.eof": True,
                "fetch.wait.max.ms": BOUNDED_READ_FETCH_WAIT_MS}

    def client_results_topic(self, client_id: str) -> str:
        """A registered client's own results topic: the workers copy each of its results there, and only
        that client's principal may read it (connectors/acl.py, docs/security.md)."""
        return f"{self.prefix}results.{client_id}"

    def with_prefix(self, prefix: str) -> "Settings":
        return replace(self, prefix=prefix, security=dict(self.security))

    def faust_credentials(self):
        """The same security settings as faust's broker_credentials (aiokafka), None for PLAINTEXT."""
        try:
            return kafka_security.faust_credentials(self.security)
        except kafka_security.SecurityConfigError as exc:
            raise ConfigError(str(exc)) from None


class ConfigError(ValueError):
    """An environment variable whose value the ledger cannot use; the message names it."""


def _number(env: dict[str, str], name: str, default: str, kind: type, minimum: float) -> int | float:
    text = env.get(name) or default
    try:
        value = kind(text)
    except ValueError:
        raise ConfigError(f"{name}={text!r} is not a{'n integer' if kind is int else ' number'}") from None
    if value < minimum:
        raise ConfigError(f"{name}={text!r} must be at least {minimum}")
    return value


def _security_from_env(env: dict[str, str]) -> dict[str, str]:
    try:
        return kafka_security.from_env(env)
    except kafka_security.SecurityConfigError as exc:
        raise ConfigError(str(exc)) from None


def load(env: dict[str, str] | None = None) -> Settings:
    env = dict(os.environ if env is None else env)
    return Settings(
        bootstrap=env.get("KAFKA_BOOTSTRAP") or "127.0.0.1:9092",
        prefix=env.get("LEDGER_TOPIC_PREFIX", "ledger."),
        partitions=_number(env, "LEDGER_PARTITIONS", "8", int, 1),
        replication=_number(env, "LEDGER_REPLICATION", "1", int, 1) if env.get("LEDGER_REPLICATION") else None,
        security=_security_from_env(env),
        connect_timeout_s=_number(env, "LEDGER_CONNECT_TIMEOUT_S", "10", float, 0.1),
    )
