"""Producing without dropping anything when librdkafka's local queue is full."""
from __future__ import annotations

from confluent_kafka import Producer


def produce(producer: Producer, topic: str, value: bytes | None, key: bytes | None = None, **kwargs) -> None:
    """Producer.produce, waiting for room when the local queue is full (BufferError) instead of failing:
    serving delivery reports is what frees the room."""
    while True:
        try:
            producer.produce(topic, value, key, **kwargs)
            return
        except BufferError:
            producer.poll(0.05)
