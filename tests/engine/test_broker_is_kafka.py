"""The broker under test is a real Apache Kafka in KRaft mode, and topic administration is idempotent."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from connectors.admin import CoPartitioningError, create_topics, describe
from streams.config import TOPIC_NAMES, Settings
from tests.harness import drop

ROOT = Path(__file__).resolve().parents[2]


def test_broker_reports_a_kraft_cluster(kafka_bootstrap):
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    cluster = admin.describe_cluster(request_timeout=10).result()
    # A KRaft cluster id is 16 random bytes in URL-safe base64 (22 characters).
    assert cluster.cluster_id and len(cluster.cluster_id) == 22
    assert cluster.nodes
    local_id = ROOT / ".state/kafka/cluster.id"
    if not os.environ.get("KAFKA_BOOTSTRAP_EXTERNAL") and local_id.exists():
        assert cluster.cluster_id == local_id.read_text().strip(), "not the broker scripts/kafka.sh started"
    node = str(cluster.nodes[0].id)
    configs = admin.describe_configs([ConfigResource(ConfigResource.Type.BROKER, node)])
    values = next(iter(configs.values())).result()
    assert "broker" in values["process.roles"].value  # KRaft: no ZooKeeper, roles instead
    assert values["log.dirs"].value


def test_topics_are_created_once_and_copartitioned(kafka_bootstrap):
    settings = Settings(bootstrap=kafka_bootstrap, prefix=f"adm{os.getpid()}.", partitions=4)
    try:
        first = create_topics(settings)
        second = create_topics(settings)
        assert all(r.created for r in first) and not any(r.created for r in second)
        assert describe(settings) == {name: 4 for name in TOPIC_NAMES}
        admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
        configs = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, settings.topic("balances"))])
        assert next(iter(configs.values())).result()["cleanup.policy"].value == "compact"
    finally:
        drop(settings)


def test_a_topic_with_another_partition_count_is_refused(kafka_bootstrap):
    settings = Settings(bootstrap=kafka_bootstrap, prefix=f"cop{os.getpid()}.", partitions=4)
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(settings.topic("history"), 3, 1)])[settings.topic("history")].result()
    try:
        deadline = time.monotonic() + 10
        while describe(settings)["history"] != 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        with pytest.raises(CoPartitioningError, match="history has 3"):
            create_topics(settings)
    finally:
        drop(settings)
