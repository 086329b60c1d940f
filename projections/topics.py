"""Reading the ledger's topics from the beginning up to their current end (a quiescent snapshot)."""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any, Iterator

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from schemas.codec import DecodeError, codec
from streams.config import Settings
from streams.kafka_errors import SETTLE_WAIT_S, asking_again, timeout_within

SCHEMA_OF_TOPIC = {"commands": "command", "results": "result", "history": "history", "balances": "balance",
                   "dlq": "dead_letter", "changelog": "state"}


@dataclass(frozen=True, slots=True)
class TopicRecord:
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    raw: bytes | None
    value: dict[str, Any] | None  # None when the bytes do not decode (a poison command; on other topics, corruption)
    index: int | None = None  # a command's place in the CommandBatch record it came in, if it did
    # An item of a linked batch's copy: its record names another partition as the batch's coordinator (the
    # producer placed it here so this partition reserves in order; the coordinator's record answers it).
    copy: bool = False


def _commands_of(c, raw: bytes | None) -> tuple[list[tuple[int | None, bytes | None]], int | None]:
    """The commands a commands-topic record carries (itself, or each item of a CommandBatch) and the coordinator
    a linked batch names (None: none)."""
    if c.is_a("command_batch", raw):
        try:
            batch = c.decode("command_batch", raw)
            return list(enumerate(batch["commands"])), batch.get("coordinator") if batch["linked"] else None
        except DecodeError:
            pass  # an undecodable batch: one undecodable record, as the worker dead-letters it
    return [(None, raw)], None


def _is_copy(coordinator: int | None, partition: int, partitions: int | None) -> bool:
    """A linked batch's copy: its record names another partition, one that exists, as the coordinator (the worker
    answers every command of a batch naming one that does not exist, so its commands are commands sent)."""
    return coordinator is not None and coordinator != partition and 0 <= coordinator < (partitions or 2**31)


def records_of(name: str, partition: int, offset: int, timestamp_ms: int, key: bytes | None,
               raw: bytes | None, partitions: int | None = None) -> list[TopicRecord]:
    """The decoded record(s) of one Kafka record of a ledger topic, as read_topic yields them: on the commands
    topic a CommandBatch gives one record per command (with its index); bytes that do not decode give value None."""
    c = codec()
    schema = SCHEMA_OF_TOPIC[name]
    records = []
    items, coordinator = _commands_of(c, raw) if name == "commands" else ([(None, raw)], None)
    for index, item in items:
        try:
            value = c.decode(schema, item)
        except DecodeError:
            value = None
        records.append(TopicRecord(partition, offset, timestamp_ms, key, item, value, index,
                                   copy=_is_copy(coordinator, partition, partitions)))
    return records


def read_topic(settings: Settings, name: str, decode: bool = True,
               settle_s: float = SETTLE_WAIT_S) -> Iterator[TopicRecord]:
    """Every record of a ledger topic up to the end offsets seen at the start (in order within a partition).
    On the commands topic a CommandBatch record yields each of its commands, in order, with its index.
    Reading the end offsets asks again through leadership moving (after a broker fault) for up to settle_s,
    then raises the last error."""
    # Transaction markers take offsets but are no records: a partition's end shows as its EOF event.
    consumer = Consumer(settings.bounded_reader_config(f"reader-{uuid.uuid4()}"))
    topic = settings.topic(name)
    deadline = time.monotonic() + settle_s
    try:
        ends: dict[int, int] = {}
        assignment = []
        for partition in range(settings.partitions):
            tp = TopicPartition(topic, partition)
            low, high = asking_again(lambda: consumer.get_watermark_offsets(tp, timeout=timeout_within(deadline, 10)),
                                     deadline)
            if high > low:
                ends[partition] = high
                assignment.append(TopicPartition(topic, partition, OFFSET_BEGINNING))
        if not assignment:
            return
        # All partitions at once: one fetch session instead of one round trip per partition.
        consumer.assign(assignment)
        while ends:
            # consume() waits for the whole count or the timeout: a short one, as the last call waits all of it.
            for msg in consumer.consume(10000, timeout=0.02):
                if msg.error():
                    if msg.error().code() == KafkaError._PARTITION_EOF and \
                            msg.offset() >= ends.get(msg.partition(), float("inf")):
                        del ends[msg.partition()]
                    continue
                partition = msg.partition()
                end = ends.get(partition)
                if end is None or msg.offset() >= end:
                    continue
                if decode:
                    yield from records_of(name, partition, msg.offset(), msg.timestamp()[1], msg.key(), msg.value(),
                                          settings.partitions)
                else:
                    yield TopicRecord(partition, msg.offset(), msg.timestamp()[1], msg.key(), msg.value(), None)
                if msg.offset() + 1 >= end:
                    del ends[partition]
    finally:
        consumer.close()


def latest_per_account(records: Iterator[TopicRecord]) -> dict[str, TopicRecord]:
    """The record with the highest seq of each account (balances topic: the current view, whatever
    re-emissions or compaction left behind). Records that did not decode are skipped."""
    latest: dict[str, TopicRecord] = {}
    for record in records:
        if record.value is None:
            continue
        account_id = record.value["account_id"]
        seen = latest.get(account_id)
        if seen is None or record.value["seq"] >= seen.value["seq"]:
            latest[account_id] = record
    return latest
