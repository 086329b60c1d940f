"""Settings shared by every process, read from the environment once.

KAFKA_BOOTSTRAP points everything at a cluster (default: the local broker of scripts/kafka.sh).
Security settings pass straight through to the clients: KAFKA_SECURITY_PROTOCOL, KAFKA_SASL_MECHANISM,
KAFKA_SASL_USERNAME, KAFKA_SASL_PASSWORD, KAFKA_SSL_CA_LOCATION.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

TOPIC_NAMES = ("commands", "results", "balances", "history", "dlq", "changelog")
# How a worker takes command records from its Faust stream: at most BATCH_MAX per batch, waiting at most
# BATCH_WINDOW_S to fill one (benchmarks/faust_ceiling.py takes them the same way).
BATCH_MAX = int(os.environ.get("LEDGER_BATCH_MAX", "2000"))
BATCH_WINDOW_S = float(os.environ.get("LEDGER_BATCH_WINDOW_S", "0.02"))


@dataclass(frozen=True, slots=True)
class Settings:
    bootstrap: str = "127.0.0.1:9092"
    # Every topic name starts with this, so several ledgers (or test runs) share one cluster.
    prefix: str = "ledger."
    # One partition count for every partitioned topic: they are co-partitioned by construction.
    partitions: int = 8
    replication: int = 1
    security: dict[str, str] = field(default_factory=dict)

    def topic(self, name: str) -> str:
        assert name in TOPIC_NAMES, name
        return f"{self.prefix}{name}"

    def kafka_config(self) -> dict[str, str]:
        """confluent-kafka (librdkafka) configuration with the security pass-through."""
        return {"bootstrap.servers": self.bootstrap, **self.security}

    def with_prefix(self, prefix: str) -> "Settings":
        return Settings(self.bootstrap, prefix, self.partitions, self.replication, dict(self.security))


def _security_from_env(env: dict[str, str]) -> dict[str, str]:
    names = {
        "KAFKA_SECURITY_PROTOCOL": "security.protocol",
        "KAFKA_SASL_MECHANISM": "sasl.mechanism",
        "KAFKA_SASL_USERNAME": "sasl.username",
        "KAFKA_SASL_PASSWORD": "sasl.password",
        "KAFKA_SSL_CA_LOCATION": "ssl.ca.location",
    }
    return {key: env[var] for var, key in names.items() if env.get(var)}


def load(env: dict[str, str] | None = None) -> Settings:
    env = dict(os.environ if env is None else env)
    return Settings(
        bootstrap=env.get("KAFKA_BOOTSTRAP") or "127.0.0.1:9092",
        prefix=env.get("LEDGER_TOPIC_PREFIX", "ledger."),
        partitions=int(env.get("LEDGER_PARTITIONS", "8")),
        replication=int(env.get("LEDGER_REPLICATION", "1")),
        security=_security_from_env(env),
    )
