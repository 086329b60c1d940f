"""The projector: consumes balances, history and results into the read store (`ledger projector`).

It assigns every partition of the three topics itself (no consumer group: there is one projector per
store, and the store, not Kafka, holds its offsets) and starts each partition at the offset stored with
the rows, so restarting after a crash continues exactly where the last committed batch ended.

The loop: consume up to `batch_size` records -> decode -> `Store.apply` (rows + offsets, one database
transaction) -> every second, record the end offsets so readers can show the lag.
"""
from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

from projections.db import display
from projections.fold import unfoldable
from projections.store import TOPICS, Record, Store
from schemas.codec import DecodeError, codec
from streams.config import Settings

log = logging.getLogger("ledger.projector")

SCHEMA_OF = {"balances": "balance", "history": "history", "results": "result"}
TopicPartitionKey = tuple[str, int]  # (logical topic name, partition)


@dataclass
class Progress:
    applied: int = 0  # records applied since start
    skipped: int = 0  # records that did not decode (logged, offsets still advance: never stall)
    batches: int = 0
    lag: dict[str, int] = field(default_factory=dict)  # topic -> records behind (at the last end check)


class Projector:
    """One consumer feeding one store. `until`: stop applying a partition at that offset (replay)."""

    def __init__(self, settings: Settings, store: Store, *, start: dict[TopicPartitionKey, int] | None = None,
                 until: dict[TopicPartitionKey, int] | None = None, batch_size: int = 5000,
                 topics: tuple[str, ...] = TOPICS):
        self.settings = settings
        self.store = store
        self.batch_size = batch_size
        self.topics = topics
        self.until = until
        self.progress = Progress()
        self._codec = codec()
        self._names = {settings.topic(t): t for t in topics}
        self._consumer = Consumer({
            **settings.kafka_config(), "group.id": f"projector-{uuid.uuid4()}", "enable.auto.commit": False,
            "enable.auto.offset.store": False, "isolation.level": "read_committed",
            # A stored offset below the log start (it cannot happen with the ledger's retention) re-reads
            # from the earliest record: re-applying is harmless, skipping would not be.
            "auto.offset.reset": "earliest", "fetch.wait.max.ms": 100, "fetch.max.bytes": 64 * 1024 * 1024,
            "queued.max.messages.kbytes": 256 * 1024})
        stored = store.offsets()
        self._next: dict[TopicPartitionKey, int] = dict(stored)
        assignment = []
        for t in topics:
            for p in range(settings.partitions):
                key = (t, p)
                offset = (start or {}).get(key, stored.get(key, OFFSET_BEGINNING))
                if offset > self._next.get(key, 0):
                    self._next[key] = offset  # a replay from a later offset: everything before counts as read
                if until is not None and until.get(key, 0) <= max(offset, 0):
                    continue  # nothing to read there
                assignment.append(TopicPartition(settings.topic(t), p, offset))
        self._assigned = {(self._names[tp.topic], tp.partition) for tp in assignment}
        if assignment:
            self._consumer.assign(assignment)
        # End offsets come from a consumer of their own: on the fetching consumer's connection a ListOffsets
        # request waits behind the long-poll fetches (500 ms each by default: 24 partitions, 12 s).
        self._meta = Consumer({**settings.kafka_config(), "group.id": f"projector-meta-{uuid.uuid4()}",
                               "enable.auto.commit": False, "isolation.level": "read_committed"})
        self._last_end_check = 0.0
        self._ends: dict[TopicPartitionKey, int] = {}

    # --- offsets ------------------------------------------------------------------------------------------
    def end_offsets(self) -> dict[TopicPartitionKey, int]:
        """The high watermark of every partition of the read topics, now."""
        ends = {}
        for t in self.topics:
            for p in range(self.settings.partitions):
                ends[(t, p)] = _watermark(self._meta, self.settings.topic(t), p)
        return ends

    def positions(self) -> dict[TopicPartitionKey, int]:
        """Next offset per partition: what is applied, or further if only control records follow."""
        result = dict(self._next)
        if self._assigned:
            for tp in self._consumer.position([TopicPartition(self.settings.topic(t), p)
                                               for t, p in self._assigned]):
                key = (self._names[tp.topic], tp.partition)
                if tp.offset >= 0:
                    result[key] = max(result.get(key, 0), tp.offset)
        return result

    def lag(self, ends: dict[TopicPartitionKey, int]) -> dict[str, int]:
        pos = self.positions()
        per_topic: dict[str, int] = {t: 0 for t in self.topics}
        for (t, p), end in ends.items():
            per_topic[t] += max(end - pos.get((t, p), 0), 0)
        return per_topic

    def reached(self, ends: dict[TopicPartitionKey, int]) -> bool:
        pos = self.positions()
        return all(pos.get(key, 0) >= end or end == 0 for key, end in ends.items())

    def check_ends(self, every_s: float = 1.0) -> None:
        """Refresh the end offsets (at most every `every_s`) and store them for the lag readers show."""
        now = time.monotonic()
        if now - self._last_end_check < every_s:
            return
        self._last_end_check = now
        self._ends = self.end_offsets()
        self.progress.lag = self.lag(self._ends)
        self.store.record_end_offsets(self._caught_up_ends(self._ends), int(time.time() * 1000))

    def _caught_up_ends(self, ends: dict[TopicPartitionKey, int]) -> dict[TopicPartitionKey, int]:
        """The end offsets to record for the lag readers show. A partition whose consumer has reached its end
        has nothing left to apply: only transaction markers (every transaction writes one into each partition
        it touched) or aborted records lie past its last applied record, so it is recorded as not behind."""
        pos = self.positions()
        return {key: min(end, self._next.get(key, end)) if pos.get(key, 0) >= end else end
                for key, end in ends.items()}

    # --- the loop step ------------------------------------------------------------------------------------
    def step(self, timeout_s: float = 0.2) -> int:
        """Consume one batch and apply it. Returns the number of records applied."""
        if not self._assigned:
            time.sleep(timeout_s)
            return 0
        messages = self._consumer.consume(self.batch_size, timeout=timeout_s)
        records: list[Record] = []
        moved: dict[TopicPartitionKey, int] = {}
        for msg in messages:
            if msg.error():
                log.warning("consume error: %s", msg.error())
                continue
            topic = self._names[msg.topic()]
            key = (topic, msg.partition())
            offset = msg.offset()
            if self.until is not None and offset >= self.until.get(key, 0):
                self._finish(key)
                continue
            moved[key] = offset + 1
            try:
                value = self._codec.decode(SCHEMA_OF[topic], msg.value())
            except DecodeError as exc:
                self.progress.skipped += 1
                log.error("skipping undecodable %s record at %d/%d: %s", topic, msg.partition(), offset, exc)
                continue
            why = unfoldable(topic, value)
            if why is not None:
                self.progress.skipped += 1
                log.error("skipping %s record at %d/%d that cannot be folded: %s", topic, msg.partition(), offset,
                          why)
                continue
            records.append(Record(topic, msg.partition(), offset, value))
        if moved:
            self.store.apply(records, moved)
            self._next.update(moved)
            self.progress.applied += len(records)
            self.progress.batches += 1
            if self.until is not None:
                for key, offset in moved.items():
                    if offset >= self.until.get(key, 0):
                        self._finish(key)
        return len(records)

    def _finish(self, key: TopicPartitionKey) -> None:
        """Replay reached `until` on this partition: stop fetching it."""
        if key in self._assigned:
            self._assigned.discard(key)
            self._consumer.incremental_unassign([TopicPartition(self.settings.topic(key[0]), key[1])])

    def close(self) -> None:
        self._consumer.close()
        self._meta.close()


def _watermark(consumer: Consumer, topic: str, partition: int, attempts: int = 50) -> int:
    for attempt in range(attempts):
        try:
            return consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)[1]
        except KafkaException:  # leadership still settling on a new topic
            if attempt == attempts - 1:
                raise
            time.sleep(0.1)
    raise AssertionError("unreachable")


def catch_up(settings: Settings, target: str | Path, timeout_s: float = 60.0) -> Progress:
    """Apply everything up to the end offsets seen at the start, then return (tests, one-shot rebuilds)."""
    store = Store(target, settings.prefix)
    projector = Projector(settings, store)
    try:
        ends = projector.end_offsets()
        store.record_end_offsets(ends, int(time.time() * 1000))
        deadline = time.monotonic() + timeout_s
        while not projector.reached(ends):
            if time.monotonic() > deadline:
                raise TimeoutError(f"projector still behind after {timeout_s}s: {projector.lag(ends)}")
            projector.step()
        projector.progress.lag = projector.lag(projector.end_offsets())
        return projector.progress
    finally:
        projector.close()
        store.close()


def run(settings: Settings, target: str | Path, stop_event: threading.Event,
        on_batch: Callable[[Progress], None] | None = None) -> Progress:
    """Project until stop_event is set (the `ledger projector` loop, or a thread of `ledger api`)."""
    store = Store(target, settings.prefix)
    projector = Projector(settings, store)
    log.info("projector: %s -> %s from offsets %s", settings.prefix, display(target), store.offsets() or "0")
    try:
        while not stop_event.is_set():
            if projector.step() and on_batch is not None:
                on_batch(projector.progress)
            projector.check_ends()
        return projector.progress
    finally:
        projector.close()
        store.close()


def main(settings: Settings, target: str | Path, report_every_s: float = 10.0) -> int:
    """`ledger projector`: run until SIGINT/SIGTERM, logging progress and lag now and then."""
    import signal

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    last = [time.monotonic()]

    def report(progress: Progress) -> None:
        if time.monotonic() - last[0] >= report_every_s:
            last[0] = time.monotonic()
            print(f"projector: {progress.applied} records applied, lag {progress.lag}", flush=True)

    print(f"projector: {settings.prefix}* -> {display(target)}", flush=True)
    progress = run(settings, target, stop, on_batch=report)
    print(f"projector: stopped after {progress.applied} records", flush=True)
    return 0
