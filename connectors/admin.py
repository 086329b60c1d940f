"""Topic administration: create the ledger's topics and check that they are co-partitioned."""
from __future__ import annotations

import time
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from streams.config import TOPIC_NAMES, Settings

# Per-topic configuration. Balances is the latest view per account, so it is compacted; the others are
# logs that replay and audit read from offset 0, so they are never deleted by age or size.
TOPIC_CONFIGS: dict[str, dict[str, str]] = {
    "balances": {"cleanup.policy": "compact", "min.compaction.lag.ms": "60000"},
    # The latest snapshot of each partition's state (streams/snapshot.py): its keys repeat per snapshot, so
    # compaction keeps one; short segments let it do so soon.
    "snapshots": {"cleanup.policy": "compact", "segment.ms": "600000", "min.cleanable.dirty.ratio": "0.1"},
    **{name: {"retention.ms": "-1", "retention.bytes": "-1"} for name in TOPIC_NAMES
       if name not in ("balances", "snapshots")},
}


@dataclass(frozen=True, slots=True)
class TopicReport:
    name: str
    partitions: int | None  # None: the topic does not exist
    created: bool


class CoPartitioningError(RuntimeError):
    """A topic exists with another partition count than the ledger's; keys would land elsewhere."""


class KafkaNotReady(ConnectionError):
    """The cluster could not serve what was asked within Settings.connect_timeout_s (LEDGER_CONNECT_TIMEOUT_S):
    it did not answer at all (BrokerUnreachable) or does not serve a topic's partition yet (TopicNotReady)."""

    # The exit status of a CLI command that gave up for this reason (sysexits' EX_UNAVAILABLE).
    EXIT_STATUS = 69


class BrokerUnreachable(KafkaNotReady):
    """The cluster did not answer within Settings.connect_timeout_s (LEDGER_CONNECT_TIMEOUT_S)."""

    def __init__(self, settings: Settings, cause: object = ""):
        super().__init__(f"cannot reach Kafka at {settings.bootstrap} within {settings.connect_timeout_s:g} s"
                         + (f" ({cause})" if cause else ""))


class TopicNotReady(KafkaNotReady):
    """The cluster answers, but within the connect timeout it did not serve a partition of a topic: the topic is
    unknown to the broker asked (not created, or created a moment ago and its metadata not spread yet), or the
    partition's leadership is still settling (after a broker fault). Not "unreachable": the cure differs."""

    def __init__(self, settings: Settings, topic: str, partition: int, why: str, cause: object = ""):
        super().__init__(f"Kafka at {settings.bootstrap} answers, but within {settings.connect_timeout_s:g} s "
                         f"it did not serve {topic}[{partition}]: {why}" + (f" ({cause})" if cause else ""))


def require_broker(settings: Settings, handle=None) -> None:
    """Return once the cluster answers a metadata request; raise BrokerUnreachable after the connect
    timeout. handle: any confluent-kafka client already made for these settings (saves a connection)."""
    refusals: list[str] = []  # a cluster that answers but refuses our credentials says so only here

    def on_error(error) -> None:
        if error.code() in (KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED):
            refusals.append(error.str())

    own = handle is None
    handle = handle or AdminClient({**settings.kafka_config(), "error_cb": on_error})
    try:
        handle.list_topics(timeout=settings.connect_timeout_s)
    except KafkaException as exc:
        error = exc.args[0]
        if own:
            handle.poll(0)  # serves the error events queued meanwhile (on_error)
        if refusals:
            raise BrokerUnreachable(settings, f"authentication failed: {refusals[-1]}") from None
        raise BrokerUnreachable(settings, error.str() if hasattr(error, "str") else error) from None


def admin_client(settings: Settings) -> AdminClient:
    client = AdminClient(settings.kafka_config())
    require_broker(settings, client)
    return client


def describe(settings: Settings, admin: AdminClient | None = None) -> dict[str, int | None]:
    """Partition count of each ledger topic (None when missing)."""
    admin = admin or admin_client(settings)
    metadata = admin.list_topics(timeout=10)
    counts: dict[str, int | None] = {}
    for name in TOPIC_NAMES:
        topic = metadata.topics.get(settings.topic(name))
        counts[name] = len(topic.partitions) if topic is not None and topic.error is None else None
    return counts


def check_copartitioned(settings: Settings, counts: dict[str, int | None]) -> None:
    wrong = {n: c for n, c in counts.items() if c is not None and c != settings.partitions}
    if wrong:
        detail = ", ".join(f"{settings.topic(n)} has {c}" for n, c in sorted(wrong.items()))
        raise CoPartitioningError(
            f"every ledger topic must have {settings.partitions} partitions: {detail}"
        )


# Replicas the ledger asks for when LEDGER_REPLICATION is not set and the cluster has this many brokers or more:
# a write acknowledged by two replicas survives the loss of any one broker, and the topic stays writable
# while one of three is down (acks=all needs min.insync.replicas of them).
REPLICATED_BROKERS = 3
REPLICATED = (3, {"min.insync.replicas": "2"})
CLUSTER_DEFAULT = -1  # CreateTopics: the broker's default.replication.factor


def topic_replication(settings: Settings, brokers: int) -> tuple[int, dict[str, str]]:
    """(replication factor, extra topic configuration) for a new topic of this ledger on a cluster of `brokers`
    brokers: LEDGER_REPLICATION when set (with the cluster's min.insync.replicas); else RF 3 with min ISR 2
    on 3 or more brokers, the cluster's own default below that (one or two brokers: a development cluster)."""
    if settings.replication is not None:
        return settings.replication, {}
    if brokers >= REPLICATED_BROKERS:
        factor, extra = REPLICATED
        return factor, dict(extra)
    return CLUSTER_DEFAULT, {}


def new_topic(settings: Settings, admin: AdminClient, name: str, config: dict[str, str]) -> NewTopic:
    """A NewTopic of this ledger's partition count and replication (topic_replication) for `name`."""
    factor, extra = topic_replication(settings, len(admin.list_topics(timeout=10).brokers))
    return NewTopic(name, settings.partitions, factor, config={**config, **extra})


def create_topics(settings: Settings) -> list[TopicReport]:
    """Create whatever is missing; idempotent. Raises CoPartitioningError on a mismatch."""
    admin = admin_client(settings)
    counts = describe(settings, admin)
    check_copartitioned(settings, counts)
    missing = [n for n, c in counts.items() if c is None]
    if missing:
        futures = admin.create_topics(
            [new_topic(settings, admin, settings.topic(n), TOPIC_CONFIGS[n]) for n in missing],
            operation_timeout=30,
        )
        for name, future in futures.items():
            try:
                future.result()
            except KafkaException as exc:
                if exc.args[0].name() != "TOPIC_ALREADY_EXISTS":  # a concurrent creator won
                    raise
    # Creation returns once the controller has the topics; the broker answering metadata may learn of them a
    # moment later. Read the counts once every partition has a leader, not before (they would read as missing).
    wait_for_leaders(settings, admin)
    after = describe(settings, admin)
    check_copartitioned(settings, after)
    return [TopicReport(settings.topic(n), after[n], n in missing) for n in TOPIC_NAMES]


def wait_for_leaders(settings: Settings, admin: AdminClient, timeout_s: float = 30.0) -> None:
    """Block until every partition of every ledger topic has a leader (new topics need a moment)."""
    deadline = time.monotonic() + timeout_s
    names = {settings.topic(n) for n in TOPIC_NAMES}
    while True:
        metadata = admin.list_topics(timeout=10)
        known = {name: metadata.topics[name] for name in names
                 if name in metadata.topics and metadata.topics[name].error is None
                 and metadata.topics[name].partitions}
        leaderless = [
            f"{name}[{p.id}]"
            for name, topic in known.items()
            for p in topic.partitions.values()
            if p.leader < 0 or p.error is not None
        ]
        if not leaderless and len(known) == len(names):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"partitions without a leader after {timeout_s}s: {leaderless[:5]}")
        time.sleep(0.1)


def delete_topics(settings: Settings) -> None:
    """Delete every topic under this prefix: the ledger's and those made alongside them (Faust's assignor
    topic, rebuilt projections)."""
    admin = admin_client(settings)
    names = [name for name in admin.list_topics(timeout=10).topics if name.startswith(settings.prefix)]
    if names:
        for future in admin.delete_topics(names, operation_timeout=30).values():
            future.result()
