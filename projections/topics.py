"""Reading the ledger's topics from the beginning up to their current end (a quiescent snapshot)."""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Iterator

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from schemas.codec import DecodeError, codec
from streams.config import Settings

SCHEMA_OF_TOPIC = {"commands": "command", "results": "result", "history": "history", "balances": "balance",
                   "dlq": "dead_letter", "changelog": "state"}


@dataclass(frozen=True, slots=True)
class TopicRecord:
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    raw: bytes | None
    value: dict[str, Any] | None  # None when the bytes do not decode (only possible on commands)


def read_topic(settings: Settings, name: str, decode: bool = True) -> Iterator[TopicRecord]:
    """Every record of a ledger topic, partition by partition, up to the end offsets seen at the start."""
    consumer = Consumer({**settings.kafka_config(), "group.id": f"reader-{uuid.uuid4()}",
                         "enable.auto.commit": False, "isolation.level": "read_committed"})
    topic = settings.topic(name)
    schema = SCHEMA_OF_TOPIC[name]
    c = codec()
    try:
        for partition in range(settings.partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
            if high <= low:
                continue
            consumer.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])
            position = low
            while position < high:
                for msg in consumer.consume(5000, timeout=0.2):
                    if msg.error():
                        continue
                    position = msg.offset() + 1
                    value = None
                    if decode:
                        try:
                            value = c.decode(schema, msg.value())
                        except DecodeError:
                            value = None
                    yield TopicRecord(partition, msg.offset(), msg.timestamp()[1], msg.key(), msg.value(), value)
                    if position >= high:
                        break
    finally:
        consumer.close()
