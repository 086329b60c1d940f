"""Test harness: the broker tests' topics, workers and checks. The launcher and the throwaway topics are the
product's own (connectors/local_worker.py, connectors/scratch.py; the benchmarks use them too), as is the
strict exactly-once check (projections/exactly_once.py); what only the tests need stays here."""
from __future__ import annotations

import uuid
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from connectors.local_worker import RESTORED, Worker
from connectors.scratch import bootstrap, drop, fresh_settings
from projections.exactly_once import assert_exactly_once
from projections.verify import format_report, verify, wait_quiescent
from streams import config
from streams.config import Settings

__all__ = ["RESTORED", "ROOT", "Worker", "assert_books_ok", "assert_exactly_once", "bootstrap", "broker_api_versions",
           "changelog_ends", "drop", "fresh_settings", "load_settings"]

ROOT = Path(__file__).resolve().parent.parent


def changelog_ends(settings: Settings) -> dict[int, int]:
    """The end offset of every partition of the changelog topic."""
    consumer = Consumer({**settings.kafka_config(), "group.id": f"ends-{uuid.uuid4()}"})
    try:
        topic = settings.topic("changelog")
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in range(settings.partitions)}
    finally:
        consumer.close()


def broker_api_versions(server: str) -> tuple[str, int]:
    """(cluster id, broker count) as the broker reports them."""
    md = AdminClient({"bootstrap.servers": server}).list_topics(timeout=10)
    return md.cluster_id, len(md.brokers)


def assert_books_ok(settings: Settings):
    """Once the workers caught up with the commands topic, every oracle of projections/verify.py holds; the
    report (for its counts)."""
    assert wait_quiescent(settings), "the workers did not catch up with the commands topic"
    report = verify(settings)
    assert report.ok, format_report(report)
    return report


def load_settings() -> Settings:
    return config.load()
