"""The commit path: a batch of command records in, outputs, changelog and RocksDB state out.

Commit path of one batch (the numbered steps the crash-safety argument in docs/engine.md refers to).
[name] marks a crash point (streams/crashpoints.py): tests make the worker exit or pause right there.

  1. Restore every partition of the batch that is not known to be current (after start or a rebalance):
     replay its changelog from the offset stored in its RocksDB to the end.
     [during_restore]: changelog records of a partition read, none applied to RocksDB yet.
  2. Decide every record in partition order (PartitionProcessor.handle); state writes are only staged.
     A record may be a batch of commands: once OUTPUTS_PER_COMMIT outputs are staged, steps 3-5 run for
     what was decided so far, and deciding goes on. (If step 5 finds another worker's writes there and the
     partition has records left in the batch, the worker exits unacked: they would be acked undecided.)
  3. Produce the outputs (results, history, balances, dead letters, follow-up commands) and wait for
     every acknowledgement.
     [after_outputs]: outputs acknowledged, no changelog record of the batch produced.
  4. Produce one changelog record per decided command (the complete redo record) and wait for the
     acknowledgements. A changelog record therefore never exists without the outputs it stands for.
     [after_changelog]: changelog acknowledged, nothing of the batch in RocksDB.
  5. Per partition: if the changelog offsets are exactly the ones expected (nobody else wrote to the
     partition's changelog since we restored), write all staged state and the next changelog offset in one
     RocksDB WriteBatch. Otherwise another worker owns the partition now (we were paused): drop the staged
     state and restore before touching the partition again.
     [before_write] / [after_write]: around one partition's WriteBatch (the batch's other partitions
     may be written already, or not yet).
  6. Return; the caller acks the records, and Faust commits their offsets later.

A crash between any two steps leaves state that step 1 repairs: the changelog is the truth and RocksDB a
cache of it; a command decided again yields byte-identical outputs (determinism, P7), and a command whose
changelog record exists is answered from the inbox, never applied twice (P4).
Any failure in steps 3-5 raises; the worker must then exit without acking (see streams/app.py).
A [during_transaction_commit] point comes with transactional outputs, which do not exist yet.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from schemas.codec import codec
from streams import core, metrics
from streams.crashpoints import reach as crash_point
from streams.config import Settings
from streams.partition import Output, PartitionProcessor
from streams.producing import produce
from streams.seal import Seal
from streams.store import RocksStore

log = logging.getLogger("ledger.engine")
FLUSH_TIMEOUT_S = 60.0
# Follow-up commands sharing one CommandBatch record: far below Kafka's 1 MiB default record limit.
FOLLOW_UPS_PER_RECORD = 500
FOLLOW_UP_RECORD_BYTES = 512 * 1024
# Outputs staged before steps 3-5 run within a batch: bounds memory and the size of one flush.
OUTPUTS_PER_COMMIT = int(os.environ.get("LEDGER_OUTPUTS_PER_COMMIT", "20000"))


@dataclass(frozen=True, slots=True)
class CommandRecord:
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: Any = None  # the record's Kafka headers: the engine's seal on records a worker wrote


class DeliveryFailed(RuntimeError):
    pass


class PartitionLost(RuntimeError):
    """Records of a partition another worker wrote to mid-batch remain: the worker must exit unacked."""


class BatchStats:
    """Where a worker's time goes, logged every few seconds: batch sizes, deciding, emitting and committing."""

    def __init__(self, every_s: float = 10.0):
        self.every_s = every_s
        self.reset()

    def reset(self) -> None:
        self.since = time.monotonic()
        self.batches = self.commands = 0
        self.decide_s = self.commit_s = 0.0

    def add(self, commands: int, decide_s: float, commit_s: float) -> None:
        self.batches += 1
        self.commands += commands
        self.decide_s += decide_s
        self.commit_s += commit_s

    def due(self) -> bool:
        return time.monotonic() - self.since >= self.every_s

    def report(self) -> str:
        elapsed = time.monotonic() - self.since
        text = (f"{self.commands / elapsed:.0f} commands/s in {self.batches} batches "
                f"(avg {self.commands / max(self.batches, 1):.0f}); deciding {self.decide_s / elapsed:.0%}, "
                f"emitting+committing {self.commit_s / elapsed:.0%} of the time")
        self.reset()
        return text


def _producer(settings: Settings, **extra) -> Producer:
    return Producer({
        **settings.kafka_config(),
        "enable.idempotence": True,  # no duplicates or reordering from the producer's own retries
        "acks": "all",
        "linger.ms": 2,
        "batch.num.messages": 10000,
        "queue.buffering.max.messages": 500000,
        "compression.type": "lz4",
        **extra,
    })


class Engine:
    def __init__(self, settings: Settings, data_dir: Path,
                 currencies: core.CurrencyRegistry = core.DEFAULT_CURRENCIES):
        self.settings = settings
        self.data_dir = data_dir
        self.currencies = currencies
        self._codec = codec()
        self.seal = Seal.from_env()  # seals the follow-up commands this worker writes (streams/seal.py)
        # Outputs need only their failures reported: librdkafka then calls back into Python for failures
        # alone, not once per message (several per command). The changelog needs each record's offset.
        self._output_failures: list[str] = []
        self.outputs_producer = _producer(settings, **{"delivery.report.only.error": True,
                                                       "on_delivery": self._output_failed})
        self.changelog_producer = _producer(settings)
        self.processors: dict[int, PartitionProcessor] = {}
        # Next changelog offset each partition expects to write; absent = must restore first. Only the event
        # loop's thread touches it (restore and commit run in threads and hand their offsets back), and
        # _generation counts rebalances, so an offset learned before one is not recorded after it.
        self._expected: dict[int, int] = {}
        self._generation = 0
        self._topics = {name: settings.topic(name) for name in ("results", "history", "balances", "commands",
                                                                 "dlq", "changelog")}
        self.restored_records = 0
        self.stats = BatchStats()

    # --- partitions -----------------------------------------------------------------------------------------
    def processor(self, partition: int) -> PartitionProcessor:
        proc = self.processors.get(partition)
        if proc is None:
            store = RocksStore(self.data_dir / f"p{partition}")
            proc = PartitionProcessor(partition, self.settings.partitions, store, self.currencies, self.seal,
                                      self._topics["commands"])
            self.processors[partition] = proc
        return proc

    def invalidate(self) -> None:
        """After a rebalance: every partition restores from its changelog before its next command."""
        self._generation += 1
        self._expected.clear()

    def restore(self, partition: int) -> int:
        """Step 1 for one partition (blocking; run it in a thread). Returns the next changelog offset."""
        proc = self.processor(partition)
        start = proc.state.changelog_offset()
        consumer = Consumer({
            **self.settings.kafka_config(),
            "group.id": f"{self.settings.prefix}restore",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        })
        topic = self._topics["changelog"]
        try:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)
            records: list[bytes] = []
            if high > start:
                consumer.assign([TopicPartition(topic, partition, max(start, low) if start else OFFSET_BEGINNING)])
                position = start
                while position < high:
                    # A short timeout: librdkafka's consume() waits for the full count or the timeout.
                    for msg in consumer.consume(10000, timeout=0.1):
                        if msg.error():
                            if msg.error().code() == KafkaError._PARTITION_EOF:
                                position = max(position, msg.offset())
                                continue
                            raise RuntimeError(f"restoring partition {partition}: {msg.error()}")
                        records.append(msg.value())
                        position = msg.offset() + 1
            if records:
                crash_point("during_restore", f"partition {partition}, {len(records)} changelog records read")
            applied = proc.restore(records, max(high, start))
            self.restored_records += applied
            log.info("partition %d restored: %d changelog records from offset %d, %d applied",
                     partition, len(records), start, applied)
            return max(high, start)
        finally:
            consumer.close()

    # --- the commit path ------------------------------------------------------------------------------------
    async def process(self, records: list[CommandRecord]) -> None:
        # The next changelog offset of each partition of this batch, as of its restore. The batch commits
        # against these even if a rebalance invalidates them meanwhile (its records are acked when it ends,
        # so it must not drop work): step 5's check still catches another worker's writes.
        generation = self._generation
        owned: dict[int, int] = {}
        for partition in dict.fromkeys(r.partition for r in records):  # 1.
            expected = self._expected.get(partition)
            if expected is None:
                expected = await asyncio.to_thread(self.restore, partition)
                if self._generation == generation:
                    self._expected[partition] = expected
            owned[partition] = expected
        partitions = list(owned)
        started = time.perf_counter()
        commit_s = 0.0
        pending = 0
        for r in records:  # 2.
            if r.partition not in owned:
                # Another worker wrote this partition's changelog at a commit earlier in this batch. Its
                # remaining records have no changelog record of ours: acking them undecided would lose them.
                raise PartitionLost(f"partition {r.partition}: changelog written by another worker in the "
                                    f"middle of a batch; exiting so the batch is redone")
            proc = self.processor(r.partition)
            before = len(proc.outputs)
            proc.handle(r.offset, r.timestamp_ms, r.key, r.value, r.headers)
            pending += len(proc.outputs) - before
            if pending >= OUTPUTS_PER_COMMIT:  # records that are command batches can hold thousands
                commit_s += await self._commit_timed(owned, generation)
                pending = 0
        commit_s += await self._commit_timed(owned, generation)
        done = time.perf_counter()
        tally: Counter = Counter()
        for p in partitions:
            tally.update(self.processors[p].tally)
            self.processors[p].tally.clear()
        answered = sum(tally.values())  # one result or dead letter per command
        self.stats.add(answered, done - started - commit_s, commit_s)
        metrics.record_batch(tally, answered, done - started)
        if self.stats.due():
            log.info("%s", self.stats.report())

    async def _commit_timed(self, owned: dict[int, int], generation: int) -> float:
        started = time.perf_counter()
        lost = await asyncio.to_thread(self.commit, owned)
        for p in lost:
            self._expected.pop(p, None)
        if self._generation == generation:
            self._expected.update(owned)
        return time.perf_counter() - started

    def commit(self, owned: dict[int, int]) -> list[int]:
        """Steps 3-5 (blocking). owned: the next changelog offset of each partition, moved on in place; a
        partition found written by another worker is removed from it and returned."""
        lost = []
        batches = {p: self.processors[p].take() for p in owned}
        self._send([o for outputs, _ in batches.values() for o in outputs])  # 3.
        crash_point("after_outputs", batches)
        offsets = self._send_changelog({p: changelog for p, (_, changelog) in batches.items()})  # 4.
        crash_point("after_changelog", owned)
        for p, expected in list(owned.items()):  # 5.
            state = self.processors[p].state
            written = offsets.get(p, [])
            if written and written != list(range(expected, expected + len(written))):
                log.warning("partition %d: changelog written by another worker since our restore "
                            "(expected offset %d, got %s); restoring before its next command",
                            p, expected, written[:3])
                state.discard()
                del owned[p]
                lost.append(p)
                continue
            if state.has_staged:
                crash_point("before_write", p)
                state.commit(expected + len(written))
                crash_point("after_write", p)
                owned[p] = expected + len(written)
        return lost

    def _output_failed(self, err, msg) -> None:
        self._output_failures.append(f"{msg.topic()}[{msg.partition()}]: {err}")

    def _send(self, outputs: list[Output]) -> None:
        topics, producer = self._topics, self.outputs_producer
        follow_ups: dict[int, list[Output]] = {}  # per partition: a run of commands with one timestamp
        run_bytes: dict[int, int] = {}
        for o in outputs:
            if o.topic != "commands":
                produce(producer, topics[o.topic], o.value, o.key, partition=o.partition, timestamp=o.timestamp_ms)
                continue
            run = follow_ups.setdefault(o.partition, [])
            size = run_bytes.get(o.partition, 0) + len(o.value)
            if run and (run[0].timestamp_ms != o.timestamp_ms or len(run) >= FOLLOW_UPS_PER_RECORD
                        or size > FOLLOW_UP_RECORD_BYTES):
                self._send_commands(run)
                run.clear()
                size = len(o.value)
            run.append(o)
            run_bytes[o.partition] = size
        for run in follow_ups.values():
            if run:
                self._send_commands(run)
        self._flush(producer, self._output_failures)

    def _send_commands(self, run: list[Output]) -> None:
        """Follow-up commands for one partition with one log time: several travel as one CommandBatch (the
        time is the record's, so only commands sharing it can share a record). Each command is the same
        bytes on every redo; which of them share a record depends on where batches were cut."""
        first = run[0]
        value = first.value if len(run) == 1 else \
            self._codec.encode("command_batch", {"commands": [o.value for o in run]})
        produce(self.outputs_producer, self._topics["commands"], value, first.key, partition=first.partition,
                headers=self.seal.headers(self._topics["commands"], first.partition, value),
                timestamp=first.timestamp_ms)

    def _send_changelog(self, changelogs: dict[int, list[bytes]]) -> dict[int, list[int]]:
        offsets: dict[int, list[int]] = {p: [] for p in changelogs}
        errors: list[str] = []
        topic = self._topics["changelog"]
        for partition, records in changelogs.items():
            written = offsets[partition]

            def on_delivery(err, msg, written=written) -> None:
                if err is not None:
                    errors.append(f"changelog[{msg.partition()}]: {err}")
                else:
                    written.append(msg.offset())

            for value in records:
                produce(self.changelog_producer, topic, value, partition=partition, on_delivery=on_delivery)
        self._flush(self.changelog_producer, errors)
        for written in offsets.values():
            written.sort()
        return offsets

    @staticmethod
    def _flush(producer: Producer, errors: list[str]) -> None:
        remaining = producer.flush(FLUSH_TIMEOUT_S)
        if remaining:
            raise DeliveryFailed(f"{remaining} messages not acknowledged within {FLUSH_TIMEOUT_S}s")
        if errors:
            raise DeliveryFailed("; ".join(errors[:5]))

    def close(self) -> None:
        self.outputs_producer.flush(FLUSH_TIMEOUT_S)
        self.changelog_producer.flush(FLUSH_TIMEOUT_S)
        for proc in self.processors.values():
            proc.state.store.close()
        self.processors.clear()
