"""The commit path: a batch of command records in, outputs, changelog and RocksDB state out.

Commit path of one batch (the numbered steps the crash-safety argument in docs/engine.md refers to).
[name] marks a crash point (streams/crashpoints.py): tests make the worker exit or pause right there.

  0. At every assignment (Engine.assign): for each partition assigned, initialise its transactional.id
     "<prefix>ledger-p<partition>" (init_transactions aborts the open transaction of whoever used it last,
     a worker that died or lost the partition, and fences that producer), and keep the producer of the
     lowest one: every batch commits on it, in one transaction, with the worker's group membership.
  1. For every partition of the batch that is not known to be current (after start or a rebalance):
     restore: replay the changelog (read_committed) from the offset stored in the partition's RocksDB to
     the end, and learn the commands offset the changelog covers. A store whose offset is beyond the
     changelog's end is refused: it is wiped and rebuilt from the changelog.
     [during_restore]: changelog records of a partition read, none applied to RocksDB yet.
  2. Decide every record in partition order (PartitionProcessor.handle); state writes are only staged.
     A record below the partition's covered offset was committed before (its results are published):
     it is skipped, with no new result. Once OUTPUTS_PER_COMMIT outputs are staged, steps 3-5 run for
     what was decided so far (between records), and deciding goes on.
  3. Begin the batch's transaction and produce every partition's outputs (results, history, balances, dead
     letters, follow-up commands) into it.
     [after_outputs]: the outputs produced (not yet flushed) inside the open transaction.
  4. In the same transaction, per partition: one changelog record per decided command (the complete redo
     record), then a covered mark (key m/covered: the next commands offset this transaction covers). Flush,
     send the commands offsets with the worker's group membership (streams/membership.py: the group
     coordinator refuses them from a worker that is no longer the partitions' owner), then commit. A worker
     fenced (its producer's id initialised by another, or its membership out of date) cannot commit: it
     exits unacked.
     [during_transaction_commit]: every record produced and flushed, the offsets sent, the commit not asked for.
     [after_changelog]: the transaction committed, nothing of the batch in RocksDB.
  5. Per partition: write all staged state, the next changelog offset and the covered offset in one
     RocksDB WriteBatch.
     [before_write] / [after_write]: around one partition's WriteBatch (the batch's other partitions
     may be written already, or not yet).
  6. Return; the caller acks the records, and Faust commits their offsets later.

A crash anywhere leaves the batch's transaction either committed (outputs, redo records and marks of all its
partitions visible to read_committed readers) or not (none of them visible, ever). Step 1 repairs the rest: the changelog
is the truth and RocksDB a cache of it; a committed record redelivered is skipped (its mark covers it), an
uncommitted one is decided again with byte-identical outputs (determinism, P7), and a command whose changelog
record exists is answered from the inbox, never applied twice (P4).
Any failure in steps 3-5 raises; the worker must then exit without acking (see streams/app.py).
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import time
import concurrent.futures
from concurrent.futures import ThreadPoolExecutor
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition

from schemas.codec import codec
from streams import config, core, metrics, snapshot, ticks
from streams.crashpoints import reach as crash_point
from streams.config import Settings
from streams.partition import CHANGELOG_OFFSET_KEY, Output, PartitionProcessor
from streams.producing import produce
from streams.seal import Seal
from streams.authn import Clients
from streams.store import RocksStore

log = logging.getLogger("ledger.engine")
FLUSH_TIMEOUT_S = 60.0
FATAL_REASON_WAIT_S = 2.0  # how long a refused call waits for the fatal error callback that says why (_raise)
# How long step 4 waits for the group coordinator to take the transaction's offsets. It answers in milliseconds,
# or in seconds while it loads after moving; but librdkafka's send_offsets_to_transaction can stay blocked past
# its own timeout, for good, when the coordinator's broker went away (librdkafka issues 5456 and 5511, open in
# 2026): the call is made on the pool and given up after this, which ends the batch unacknowledged (the worker
# exits, and its transaction is aborted by its successor's step 0).
OFFSETS_TIMEOUT_S = float(os.environ.get("LEDGER_OFFSETS_TIMEOUT_S", "20"))
# Follow-up commands sharing one CommandBatch record: far below Kafka's 1 MiB default record limit.
FOLLOW_UPS_PER_RECORD = 500
FOLLOW_UP_RECORD_BYTES = 512 * 1024
# Outputs staged before steps 3-5 run within a batch: bounds memory and the size of one flush.
OUTPUTS_PER_COMMIT = int(os.environ.get("LEDGER_OUTPUTS_PER_COMMIT", "20000"))
# How long the broker lets a transaction stay open before aborting it itself. The next owner of the committing
# producer's partition aborts a dead or paused worker's transaction at once (step 0), so this bounds only a
# transaction nobody takes over (its records hold back read_committed readers of the partitions it wrote,
# commands partitions of other workers included, until then). It must exceed the longest commit
# (FLUSH_TIMEOUT_S of sends, then the commit).
TRANSACTION_TIMEOUT_MS = int(os.environ.get("LEDGER_TRANSACTION_TIMEOUT_MS", "90000"))
# The changelog record that closes each transaction: key COVERED_MARK, value the next commands offset covered.
COVERED_MARK = b"m/covered"
COVERED_KEY = b"m/covered"  # the same, in the partition's RocksDB
# Changelog offsets between two snapshots of a partition (0: none). A snapshot bounds what a restore without local
# state replays; writing one costs a scan of the partition's store inside one commit (docs/engine.md).
SNAPSHOT_EVERY = int(os.environ.get("LEDGER_SNAPSHOT_EVERY", "100000"))
SNAPSHOT_KEY = b"m/snapshot"  # in the partition's RocksDB: the changelog offset and chunk count of its last one
# Chunks of a snapshot librdkafka may hold unacknowledged while it is written (8 x 512 KiB), per partition.
SNAPSHOT_CHUNKS_QUEUED = 8


def _snapshot_mark(offset: int, chunks: int) -> bytes:
    return json.dumps({"changelog_offset": offset, "chunks": chunks}).encode()


class _Reader:
    """The records of one topic partition from `start`, read_committed, until the partition-EOF event passes
    `end`. Transaction markers take offsets but yield no record, so progress comes from the EOF event, not
    from a record's offset. An earlier owner's open transaction holds it back until the partition's new owners
    abort it (Engine.assign: whoever owns the partition whose transactional id that owner committed on, at the
    same rebalance), and the broker aborts any other after TRANSACTION_TIMEOUT_MS: wait that long at most. `position` is the next offset after what was read."""

    def __init__(self, consumer: Consumer, topic: str, partition: int, start: int, end: int):
        self.consumer, self.topic, self.partition, self.start, self.end = consumer, topic, partition, start, end
        self.position = start

    def __iter__(self):
        # Learn the partition's leader first: assigned a partition whose leader it does not know yet, librdkafka
        # looks up the start offset only when its retry timer fires, half a second later.
        self.consumer.get_watermark_offsets(TopicPartition(self.topic, self.partition), timeout=30)
        self.consumer.assign([TopicPartition(self.topic, self.partition, self.start or OFFSET_BEGINNING)])
        deadline = time.monotonic() + TRANSACTION_TIMEOUT_MS / 1000 + 30
        while self.position <= self.end:
            if time.monotonic() > deadline:
                raise RuntimeError(f"restoring {self.topic}[{self.partition}]: the log stays open at "
                                   f"{self.position}, below its end {self.end}")
            # A short timeout: librdkafka's consume() waits for the full count or the timeout, and the last
            # call of every read (the one that brings the EOF event) waits the whole of it.
            for msg in self.consumer.consume(10000, timeout=0.02):
                if msg.error():
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        self.position = max(self.position, msg.offset())
                        continue
                    raise RuntimeError(f"restoring {self.topic}[{self.partition}]: {msg.error()}")
                self.position = max(self.position, msg.offset() + 1)
                yield msg
        self.consumer.unassign()


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


class BatchStats:
    """Where a worker's time goes, logged every few seconds: batch sizes, deciding, emitting and committing, and
    the commit's own steps (milliseconds per commit, mean): sending the outputs (step 3), flushing them with the
    redo records (4), the offsets with the membership (4), the commit itself (4), the RocksDB writes (5)."""

    STEPS = ("send", "flush", "offsets", "end", "store")

    def __init__(self, every_s: float = 10.0):
        self.every_s = every_s
        self.reset()

    def reset(self) -> None:
        self.since = time.monotonic()
        self.batches = self.commands = self.commits = 0
        self.decide_s = self.commit_s = 0.0
        self.steps = dict.fromkeys(self.STEPS, 0.0)

    def add(self, commands: int, decide_s: float, commit_s: float) -> None:
        self.batches += 1
        self.commands += commands
        self.decide_s += decide_s
        self.commit_s += commit_s

    def step(self, name: str, seconds: float) -> None:
        self.steps[name] += seconds
        self.commits += name == "store"

    def due(self) -> bool:
        return time.monotonic() - self.since >= self.every_s

    def report(self) -> str:
        elapsed = time.monotonic() - self.since
        text = (f"{self.commands / elapsed:.0f} commands/s in {self.batches} batches "
                f"(avg {self.commands / max(self.batches, 1):.0f}); deciding {self.decide_s / elapsed:.0%}, "
                f"emitting+committing {self.commit_s / elapsed:.0%} of the time")
        if self.commits:
            text += "; per commit " + ", ".join(f"{name} {seconds * 1000 / self.commits:.1f}"
                                                 for name, seconds in self.steps.items()) + " ms"
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
        # Results, history, balances and dead letters go where Kafka's default partitioner would put their key
        # (the Java client's murmur2; docs/ecosystem.md, "Keys and partitions"): a key's partition is its hash.
        "partitioner": "murmur2_random",
        # A paused or unreachable broker must not hold a send past the cluster's move of its partitions
        # (streams/config.py, docs/reliability.md); the delivery timeout stays below FLUSH_TIMEOUT_S.
        "socket.timeout.ms": config.WORKER_SOCKET_TIMEOUT_MS,
        "request.timeout.ms": config.WORKER_ACK_TIMEOUT_MS,
        "message.timeout.ms": config.WORKER_DELIVERY_TIMEOUT_MS,
        **extra,
    })


# Every transactional.id of the workers starts with the prefix and this stem (connectors/acl.py grants them).
TRANSACTIONAL_ID_STEM = "ledger-p"
# Errors that say the worker no longer owns what it commits: its producer's id was initialised by another
# producer, or the group coordinator refused its membership (a later generation, or no longer a member).
FENCES = (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH,
          KafkaError.ILLEGAL_GENERATION, KafkaError.UNKNOWN_MEMBER_ID, KafkaError.FENCED_INSTANCE_ID)


def transactional_id(settings: Settings, partition: int) -> str:
    """One transactional.id per partition (and topic prefix). Whoever is assigned the partition initialises it,
    which aborts the open transaction of the producer that used it last and fences that producer; a worker
    commits on the id of the lowest partition it owns (Engine.assign)."""
    return f"{settings.prefix}{TRANSACTIONAL_ID_STEM}{partition}"


class Engine:
    def __init__(self, settings: Settings, data_dir: Path,
                 currencies: core.CurrencyRegistry = core.DEFAULT_CURRENCIES):
        self.settings = settings
        self.data_dir = data_dir
        self.currencies = currencies
        self._codec = codec()
        self._tick_producer: Producer | None = None  # writes the ticks (produce_ticks)
        self.seal = Seal.from_env()  # seals the follow-up commands this worker writes (streams/seal.py)
        # Who the clients are and what each may do (streams/authn.py); None: the ledger runs open (dev mode).
        self.clients = Clients.from_env()
        # The one transactional producer every batch commits on, made at each assignment (assign) for the
        # partitions in `owned`, and the fatal error it reported (error_cb: a send refused later says only _FATAL).
        self.producer: Producer | None = None
        self._fatal: dict[str, KafkaError] = {}
        self.owned: frozenset[int] = frozenset()
        # The worker's group membership (streams/membership.py), sent with each transaction's commands offsets so
        # that the group coordinator refuses the commit of a worker that lost its partitions. None: the engine
        # is driven without a consumer group (benchmarks, tests), and no offsets are sent.
        self.membership: bytes | None = None
        self.processors: dict[int, PartitionProcessor] = {}
        # Next changelog offset of each partition as of its restore or last commit; absent = must restore
        # first. Only the event loop's thread touches it, and _generation counts rebalances, so an offset
        # learned before one is not recorded after it.
        self._expected: dict[int, int] = {}
        # Next commands offset not yet covered by a committed transaction, per partition.
        self.covered: dict[int, int] = {}
        self._generation = 0
        self._topics = {name: settings.topic(name) for name in ("results", "history", "balances", "commands",
                                                                 "dlq", "changelog", "snapshots")}
        # client id -> its own results topic, for the clients that have one (refresh_client_results).
        self.client_results: dict[str, str] = {}
        self._metadata = None  # an AdminClient, made at the first periodic refresh
        self._client_results_generation = -1  # the rebalance generation client_results was learnt in
        self.restored_records = 0
        self.skipped_records = 0
        self.snapshot_loads = 0
        self.snapshots_written = 0
        self.stats = BatchStats()
        self._pool = ThreadPoolExecutor(max_workers=max(2, min(settings.partitions, 16)),
                                        thread_name_prefix="txn")

    # --- partitions -----------------------------------------------------------------------------------------
    def processor(self, partition: int) -> PartitionProcessor:
        proc = self.processors.get(partition)
        if proc is None:
            store = RocksStore(self.data_dir / f"p{partition}")
            proc = PartitionProcessor(partition, self.settings.partitions, store, self.currencies, self.seal,
                                      self._topics["commands"], clients=self.clients)
            self.processors[partition] = proc
        return proc

    def refresh_client_results(self, handle=None) -> None:
        """Learn which clients have their own results topic (`ledger acl apply` makes them): from now on each
        of their results is also written there, in the same transaction as the shared results topic, which
        stays complete (verify, tail and auditors read it). Called at every restore and periodically
        (streams/app.py), so a client registered while workers run is served within that period."""
        if handle is None:
            if self._metadata is None:  # one client for the periodic refresh, not a connection each time
                from confluent_kafka.admin import AdminClient
                self._metadata = AdminClient(self.settings.kafka_config())
            handle = self._metadata
        stem = self.settings.client_results_topic("")
        metadata = handle.list_topics(timeout=30)
        self.client_results = {name[len(stem):]: name for name, topic in metadata.topics.items()
                               if name.startswith(stem) and topic.error is None
                               and len(topic.partitions) == self.settings.partitions}

    def invalidate(self) -> None:
        """After a rebalance: every partition restores from its changelog before its next command."""
        self._generation += 1
        self._expected.clear()

    def assign(self, partitions, membership: bytes | None = None) -> None:
        """Step 0 (blocking), at every assignment of the workers' group: the partitions this worker owns now and
        its membership. Every partition's transactional id is initialised, concurrently: whoever used one last
        (a worker that owned the partition before, dead, paused or moved on; this worker before a restart) has
        its open transaction aborted and its producer fenced, so no earlier owner's transaction is left holding
        a restore back. The lowest partition's producer is kept, and every batch commits on it."""
        self.invalidate()
        self._take(frozenset(partitions), membership)

    def _take(self, partitions: frozenset[int], membership: bytes | None) -> None:
        old, self.producer, self._fatal = self.producer, None, {}
        self.owned, self.membership = partitions, membership
        if old is not None:
            old.close()  # idle: Faust lets the batch in flight end before it rejoins the group
        if not partitions:
            return
        committer, fatal = min(partitions), self._fatal

        def initialise(p: int) -> None:
            producer = self._fence(p, fatal if p == committer else {})
            if p == committer:
                self.producer = producer
            else:
                producer.close()

        self._map(initialise, sorted(partitions))

    def _fence(self, partition: int, fatal: dict[str, KafkaError]) -> Producer:
        """A fresh transactional producer with the partition's transactional.id; init_transactions fences
        every earlier producer of the id and aborts (or completes) its open transaction."""
        def on_error(error: KafkaError) -> None:
            if error.fatal():  # e.g. "Fatal error: Local: This instance has been fenced by a newer instance"
                fatal["error"] = error

        producer = _producer(self.settings, **{"transactional.id": transactional_id(self.settings, partition),
                                               "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
                                               "error_cb": on_error})
        # The cluster's brokers first: a new librdkafka producer (2.16) that asks for its transaction coordinator
        # while it still replaces its bootstrap connection by the broker it learns loses the answer about one
        # time in three, and asks again only when its coordinator timer fires 500 ms later (per partition
        # restored). A failure here is init_transactions' to report.
        try:
            producer.list_topics(timeout=self.settings.connect_timeout_s)
        except KafkaException:
            pass
        for attempt in range(5):
            try:
                producer.init_transactions(FLUSH_TIMEOUT_S)
                break
            except KafkaException as exc:
                if not exc.args[0].retriable() or attempt == 4:
                    raise
                time.sleep(0.5)
        return producer

    def _log_ends(self, partition: int, names: tuple[str, ...] = ("changelog", "snapshots")) -> dict[str, int]:
        """The true log end offset of the partition of each named topic, learnt by writing one record to each
        in a transaction that is then aborted (so it advances a lagging high watermark and is never read)."""
        producer, landed = self.producer, {}

        def on_delivery(err, msg) -> None:
            if err is None:
                landed[msg.topic()] = msg.offset()

        producer.begin_transaction()
        for name in names:
            produce(producer, self._topics[name], b"", b"m/log-end", partition=partition, on_delivery=on_delivery)
        producer.flush(FLUSH_TIMEOUT_S)
        producer.abort_transaction(FLUSH_TIMEOUT_S)
        if len(landed) != len(names):
            raise DeliveryFailed(f"partition {partition}: could not learn the log ends of {', '.join(names)}")
        return {name: landed[self._topics[name]] for name in names}

    def _wipe(self, partition: int) -> PartitionProcessor:
        """Drop the partition's local store (it is only a cache of the changelog) and start an empty one."""
        proc = self.processors.pop(partition, None)
        if proc is not None:
            proc.state.store.close()
        shutil.rmtree(self.data_dir / f"p{partition}", ignore_errors=True)
        return self.processor(partition)

    def _read_committed(self, consumer: Consumer, name: str, partition: int, start: int, end: int) -> "_Reader":
        return _Reader(consumer, self._topics[name], partition, start, end)

    def _restore_snapshot(self, consumer: Consumer, partition: int, ends: dict[str, int], start: int,
                          low: int) -> tuple[PartitionProcessor, int]:
        """Load the partition's latest committed snapshot into an emptied store when it is ahead of `start` and
        the changelog continues it (streams/snapshot.py). Returns the processor and where the changelog's
        replay starts. A snapshot that claims more than the changelog holds is refused; a stale one only
        costs replay time."""
        proc = self.processor(partition)
        found = self._latest_manifest(consumer, partition, ends["snapshots"])
        if found is None:
            return proc, start
        manifest, at = found
        offset = manifest.changelog_offset
        if offset > ends["changelog"]:
            log.warning("partition %d: refused a snapshot that claims changelog offset %d, beyond the changelog's "
                        "end %d", partition, offset, ends["changelog"])
            return proc, start
        if offset <= start or offset < low:
            return proc, start  # the store is as far, or the changelog cannot continue the snapshot
        proc = self._wipe(partition)
        try:
            if manifest.format == snapshot.FRAMED:
                self._load_framed(consumer, partition, manifest, ends["snapshots"])
            else:
                self._load_table(consumer, partition, manifest, at, ends["snapshots"])
        except snapshot.SnapshotError as exc:
            log.warning("partition %d: refused a snapshot: %s", partition, exc)
            return self._wipe(partition), 0
        proc.state.store.write({CHANGELOG_OFFSET_KEY: str(offset).encode(),
                                COVERED_KEY: str(manifest.covered).encode(),
                                SNAPSHOT_KEY: _snapshot_mark(offset, manifest.chunks)}, set())
        proc.state.discard()  # caches and the expiry heap are rebuilt from the store
        self.snapshot_loads += 1
        log.info("partition %d: loaded the snapshot at changelog offset %d (%d pairs in %d chunks)", partition,
                 offset, manifest.pairs, manifest.chunks)
        return proc, offset

    def _latest_manifest(self, consumer: Consumer, partition: int, end: int) -> tuple[snapshot.Manifest, int] | None:
        """The partition's latest committed manifest and its offset. Each snapshot ends with its manifest, and
        what follows the latest one is aborted (read_committed skips it) or markers, so it is found in the last
        few offsets: read windows back from the end, each four times the last, until one holds a manifest."""
        window = 64
        while True:
            first = max(0, end - window)
            at, raw = None, None
            for msg in self._read_committed(consumer, "snapshots", partition, first, end):
                if msg.key() == snapshot.MANIFEST_KEY:
                    at, raw = msg.offset(), msg.value()
            if raw is not None:
                try:
                    return snapshot.Manifest.decode(raw), at
                except snapshot.SnapshotError as exc:
                    log.warning("partition %d: refused a snapshot: %s", partition, exc)
                    return None
            if first == 0:
                return None
            window *= 4

    def _load_table(self, consumer: Consumer, partition: int, manifest: snapshot.Manifest, at: int,
                    end: int) -> None:
        """A format 2 snapshot: its chunks, the committed records from chunk/0's offset to the manifest at `at`,
        written to a table file as they are read and ingested into the emptied store once the digest holds."""
        if not manifest.chunks:
            return
        table = snapshot.TableWriter(manifest, self._table_path(f"in-{partition}"))
        try:
            for msg in self._read_committed(consumer, "snapshots", partition, manifest.first_offset, end):
                n = snapshot.chunk_number(msg.key())
                if msg.offset() < at and n is not None and n < manifest.chunks:
                    table.add(n, msg.value() or b"")
            self.processors[partition].state.store.ingest_table(table.verify())
        finally:
            table.discard()

    def _table_path(self, name: str) -> Path:
        """Where a snapshot's table file is written or received: beside the partitions' stores, not in one (the
        p<n> directories are the stores)."""
        folder = self.data_dir / "snapshot-tables"
        folder.mkdir(parents=True, exist_ok=True)
        return folder / f"{name}.sst"

    def _load_framed(self, consumer: Consumer, partition: int, manifest: snapshot.Manifest, end: int) -> None:
        """A format 1 snapshot (earlier workers'): its manifest does not say where its chunks start, so the
        partition is read from its start, keeping the last value of each chunk key."""
        chunks: dict[int, bytes] = {}
        for msg in self._read_committed(consumer, "snapshots", partition, 0, end):
            n = snapshot.chunk_number(msg.key())
            if n is not None:
                if msg.value() is None:
                    chunks.pop(n, None)
                else:
                    chunks[n] = msg.value()
        store, batch = self.processors[partition].state.store, {}
        for key, value in snapshot.decode_framed(manifest, chunks):
            batch[key] = value
            if len(batch) >= 10_000:
                store.write(batch, set())
                batch = {}
        store.write(batch, set())

    def _store_agrees(self, proc: PartitionProcessor, consumer: Consumer, partition: int, start: int,
                      low: int) -> bool:
        """Whether the last covered mark committed in the changelog before `start` is the one the store holds.

        A transaction the worker saw committed (commit_transaction returned, so step 5 wrote RocksDB) can still
        lose its commit marker in the changelog partition when a broker dies while it writes the markers (Kafka
        then completes the transaction without it: docs/reliability.md, "Hazards still open"); the next
        transaction of the same producer that ends there settles those records: a commit keeps them, an abort
        (this restore's own aborted write, by the same transactional id) discards them. Discarded, the store is
        ahead of the changelog, which is the truth: its commands would be skipped as covered while their outputs
        were discarded with them. Such a store is refused (rebuilt from the changelog, where those commands are
        decided again with byte-identical outputs, P7). Read back from `start` in windows until a mark is found;
        none down to `low`: nothing to compare with, the store is kept."""
        raw = proc.state.store.get(COVERED_KEY)
        if raw is None:
            return True
        window, begin = 64, start
        while begin > low:
            begin = max(low, start - window)
            marks = [msg.value() for msg in self._read_committed(consumer, "changelog", partition, begin, start - 1)
                     if msg.offset() < start and msg.key() == COVERED_MARK]
            if marks:
                if int(marks[-1]) == int(raw):
                    return True
                log.warning("partition %d: local state is ahead of the committed changelog (it covers commands "
                            "below offset %d, the changelog's last committed mark before offset %d below %d: a "
                            "transaction it saw committed was discarded); refused: wiping it and restoring from "
                            "the changelog", partition, int(raw), start, int(marks[-1]))
                return False
            window *= 4
        return True

    def _snapshot_due(self, p: int, offset: int) -> bool:
        if SNAPSHOT_EVERY <= 0:
            return False
        raw = self.processors[p].state.store.get(SNAPSHOT_KEY)
        last = 0 if raw is None else json.loads(raw)["changelog_offset"]
        return offset - last >= SNAPSHOT_EVERY

    def _send_snapshot(self, p: int, producer: Producer, offset: int) -> bytes:
        """Into the partition's open transaction: the store as it is committed (changelog below `offset`), as one
        table file in chunks, tombstones for the previous snapshot's extra chunks, and the manifest. Returns the
        store's new snapshot mark."""
        store = self.processors[p].state.store
        raw = store.get(SNAPSHOT_KEY)
        previous_chunks = 0 if raw is None else json.loads(raw)["chunks"]
        table = self._table_path(f"out-{p}")
        topic, digest, first = self._topics["snapshots"], snapshot.Digest(), {}

        def on_first(err, msg) -> None:
            first["error"], first["offset"] = err, msg.offset()

        try:
            pairs = store.export_table(table, skip=snapshot.META_PREFIX)
            for n, chunk in enumerate(snapshot.file_chunks(table) if pairs else ()):
                produce(producer, topic, digest.add(chunk), snapshot.chunk_key(n), partition=p,
                        **({"on_delivery": on_first} if n == 0 else {}))
                # The snapshot is the whole state, which grows with history: each chunk waits until at most
                # SNAPSHOT_CHUNKS_QUEUED are unacknowledged, so librdkafka holds a few chunks, not the snapshot
                # (queued whole, the snapshots of 8 partitions raised a worker's RSS by about 200 MiB at 100,000
                # changelog offsets each; docs/engine.md, Memory). Acknowledged is not committed: they stay in
                # the partition's open transaction.
                while len(producer) > SNAPSHOT_CHUNKS_QUEUED:
                    producer.poll(0.05)
        finally:
            table.unlink(missing_ok=True)
        for n in range(digest.chunks, previous_chunks):
            produce(producer, topic, None, snapshot.chunk_key(n), partition=p)
        # The manifest names chunk/0's offset, so that a restore reads this snapshot only: learn it first.
        while digest.chunks and not first:
            producer.poll(0.05)
        if first.get("error") is not None:
            raise DeliveryFailed(f"partition {p}: a snapshot's first chunk was not delivered: {first['error']}")
        manifest = snapshot.Manifest(offset, self.covered.get(p, 0), digest.chunks, pairs, digest.hexdigest(),
                                     first_offset=first.get("offset"))
        produce(producer, topic, manifest.encode(), snapshot.MANIFEST_KEY, partition=p)
        self.snapshots_written += 1
        log.info("partition %d: snapshot at changelog offset %d (%d pairs in %d chunks)", p, offset,
                 manifest.pairs, manifest.chunks)
        return _snapshot_mark(offset, manifest.chunks)

    def restore(self, partition: int) -> int:
        """Step 1 for one partition (blocking; run it in a thread). Returns the next changelog offset."""
        if partition not in self.owned:
            if self.membership is not None:  # the group gave it to another worker: never decide its commands
                raise RuntimeError(f"partition {partition} is not assigned to this worker ({sorted(self.owned)})")
            self._take(self.owned | {partition}, None)  # driven without a consumer group (benchmarks, tests)
        proc = self.processor(partition)
        start = proc.state.changelog_offset()
        # read_committed: never an aborted transaction's records.
        consumer = Consumer(self.settings.bounded_reader_config(f"{self.settings.prefix}restore"))
        topic = self._topics["changelog"]
        try:
            if self._client_results_generation != self._generation:  # once per rebalance, not per partition
                self.refresh_client_results(consumer)
                self._client_results_generation = self._generation
            # The changelog's true end. Right after a broker restart a partition's high watermark can lag its
            # log (it is recovered from a periodic checkpoint and moves on only with the next write), and a
            # restore that stopped there would miss committed transactions: their commands would be decided a
            # second time. So write one record in a transaction that is then aborted: no read_committed reader
            # ever sees it, the write moves the high watermark to the log's end, and its offset is that end.
            ends = self._log_ends(partition)
            end = ends["changelog"]
            low, _ = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)
            if start > end:
                # The store claims changelog records the topic does not hold (the topic was recreated, or the
                # store comes from elsewhere): its state cannot be trusted, and a commit would take our own
                # writes for another worker's. Rebuild it from the changelog.
                log.warning("partition %d: local state is ahead of the changelog (offset %d, changelog ends at "
                            "%d); refused: wiping it and restoring from the changelog", partition, start, end)
                proc = self._wipe(partition)
                start = 0
            elif start > low and not self._store_agrees(proc, consumer, partition, start, low):
                proc = self._wipe(partition)
                start = 0
            if start == 0 or start < low:
                # No local state, or the changelog no longer holds where it stops: start from the latest
                # snapshot that the changelog can continue.
                proc, start = self._restore_snapshot(consumer, partition, ends, start, low)
            if start < low:
                raise RuntimeError(f"restoring partition {partition}: the changelog starts at offset {low}, the "
                                   f"state needs it from {start}, and no snapshot covers the gap (the changelog's "
                                   f"retention must keep what follows the latest snapshot: docs/engine.md)")
            records: list[bytes] = []
            covered = None
            reader = self._read_committed(consumer, "changelog", partition, start, end)
            for msg in reader:
                if msg.key() == COVERED_MARK:
                    covered = int(msg.value())
                else:
                    records.append(msg.value())
            position = max(start, reader.position)
            if records:
                crash_point("during_restore", f"partition {partition}, {len(records)} changelog records read")
            meta = {} if covered is None else {COVERED_KEY: str(covered).encode()}
            applied = proc.restore(records, position, meta)
            self.restored_records += applied
            raw = proc.state.store.get(COVERED_KEY)
            self.covered[partition] = 0 if raw is None else int(raw)
            log.info("partition %d restored: %d changelog records from offset %d, %d applied; commands "
                     "covered below offset %d", partition, len(records), start, applied, self.covered[partition])
            return position
        finally:
            consumer.close()

    # --- the commit path ------------------------------------------------------------------------------------
    async def process(self, records: list[CommandRecord]) -> None:
        # The next changelog offset of each partition of this batch, as of its restore. The batch commits
        # against these even if a rebalance invalidates them meanwhile (its records are acked when it ends, so
        # it must not drop work): if another worker took a partition, our transaction is fenced.
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
        upto: dict[int, int] = {}  # next commands offset after the records decided since the last commit
        for r in records:  # 2.
            if r.offset < self.covered.get(r.partition, 0):
                self.skipped_records += 1  # committed before a crash or a handover: published already
                continue
            proc = self.processor(r.partition)
            before = len(proc.outputs)
            proc.handle(r.offset, r.timestamp_ms, r.key, r.value, r.headers)
            upto[r.partition] = r.offset + 1
            pending += len(proc.outputs) - before
            if pending >= OUTPUTS_PER_COMMIT:  # records that are command batches can hold thousands
                commit_s += await self._commit_timed(owned, upto, generation)
                upto = {}
                pending = 0
        if upto:
            commit_s += await self._commit_timed(owned, upto, generation)
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

    async def _commit_timed(self, owned: dict[int, int], upto: dict[int, int], generation: int) -> float:
        started = time.perf_counter()
        await asyncio.to_thread(self.commit, owned, upto)
        if self._generation == generation:
            self._expected.update(owned)
        return time.perf_counter() - started

    def commit(self, owned: dict[int, int], upto: dict[int, int]) -> None:
        """Steps 3-5 (blocking) for the partitions in upto (partition: next commands offset decided), in one
        transaction. owned: the next changelog offset of each partition, moved on in place."""
        began = time.perf_counter()
        batches = {p: self.processors[p].take() for p in upto}
        producer = self.producer
        marks = {p: {COVERED_KEY: str(upto[p]).encode()} for p in batches}
        with self._failing_as_delivery(batches):  # a fence can come back from any of these calls
            producer.begin_transaction()
            for p, (outputs, _) in batches.items():  # 3.
                if self._snapshot_due(p, owned[p]):
                    marks[p][SNAPSHOT_KEY] = self._send_snapshot(p, producer, owned[p])
                self._send(outputs, producer)
        # No flush here: the outputs, redo records and marks are one transaction, all visible or none, so the
        # outputs need not be acknowledged before the redo records are sent; step 4's flush covers both.
        crash_point("after_outputs", batches)
        self.stats.step("send", time.perf_counter() - began)
        last: dict[int, int] = {}
        with self._failing_as_delivery(batches):
            self._commit_transaction({p: changelog for p, (_, changelog) in batches.items()}, upto, last)  # 4.
        crash_point("after_changelog", upto)
        began = time.perf_counter()
        for p in batches:  # 5.
            state = self.processors[p].state
            crash_point("before_write", p)
            # Past the mark: the transaction's commit marker follows it; a restore from there reads it as
            # nothing.
            state.commit(last[p] + 1, marks[p])
            crash_point("after_write", p)
            self.covered[p] = upto[p]
            owned[p] = last[p] + 1
        self.stats.step("store", time.perf_counter() - began)

    def _map(self, fn, partitions) -> None:
        """fn(p) for every partition, concurrently on the pool (librdkafka calls release the GIL)."""
        partitions = list(partitions)
        if len(partitions) == 1:
            fn(partitions[0])
            return
        for future in [self._pool.submit(fn, p) for p in partitions]:
            future.result()

    @contextlib.contextmanager
    def _failing_as_delivery(self, partitions):
        """A Kafka error of the batch's transaction ends the batch unacknowledged as DeliveryFailed, a fence
        named as one (_raise), whichever call of steps 3-4 it came from."""
        try:
            yield
        except KafkaException as exc:
            self._raise(partitions, exc)
        except SystemError as exc:
            # confluent-kafka raises a fatal error (a fence) from inside flush(); when librdkafka logs a line in the
            # same call, the Python log callback runs with that exception pending and the KafkaException comes out
            # wrapped in a SystemError. It is still the fence.
            if isinstance(exc.__cause__, KafkaException):
                self._raise(partitions, exc.__cause__)
            raise

    def _commit_transaction(self, changelogs: dict[int, list[bytes]], upto: dict[int, int],
                            last: dict[int, int]) -> None:
        """Step 4: every partition's redo records and covered mark, the commands offsets with the membership,
        then the commit."""
        producer = self.producer
        topic = self._topics["changelog"]
        errors: list[str] = []

        def on_delivery(err, msg) -> None:
            if err is not None:
                errors.append(f"changelog[{msg.partition()}]: " + str(err))
            else:
                last[msg.partition()] = max(last.get(msg.partition(), -1), msg.offset())

        for p, changelog in changelogs.items():
            for value in changelog:
                produce(producer, topic, value, partition=p, on_delivery=on_delivery)
            produce(producer, topic, str(upto[p]).encode(), COVERED_MARK, partition=p, on_delivery=on_delivery)
        began = time.perf_counter()
        remaining = producer.flush(FLUSH_TIMEOUT_S)
        self.stats.step("flush", time.perf_counter() - began)
        if remaining or errors:
            # A fenced producer's sends fail too: say so, and end the worker (nothing of it becomes visible).
            fenced = [e for e in errors if "fenc" in e.lower() or "epoch" in e.lower()]
            if fenced:
                self._say_fenced(changelogs, fenced[0])
            raise DeliveryFailed(f"partitions {sorted(changelogs)}: {remaining} unacknowledged; "
                                 + "; ".join(errors[:5]))
        began = time.perf_counter()
        if self.membership is not None:
            commands = self._topics["commands"]
            offsets = [TopicPartition(commands, p, upto[p]) for p in changelogs]
            sent = self._pool.submit(producer.send_offsets_to_transaction, offsets, self.membership,
                                     OFFSETS_TIMEOUT_S)
            try:
                sent.result(OFFSETS_TIMEOUT_S + 1)
            except concurrent.futures.TimeoutError:
                raise DeliveryFailed(f"partitions {sorted(changelogs)}: the group coordinator did not take the "
                                     f"transaction's offsets within {OFFSETS_TIMEOUT_S:.0f} s") from None
        crash_point("during_transaction_commit", sorted(changelogs))
        self.stats.step("offsets", time.perf_counter() - began)
        began = time.perf_counter()
        for attempt in range(5):
            try:
                producer.commit_transaction(FLUSH_TIMEOUT_S)
                self.stats.step("end", time.perf_counter() - began)
                return
            except KafkaException as exc:
                error = exc.args[0]
                if error.retriable() and not error.fatal() and not error.txn_requires_abort() and attempt < 4:
                    continue  # the outcome is unknown: committing again is what librdkafka asks for
                raise

    @staticmethod
    def _say_fenced(partitions, reason) -> None:
        for p in sorted(partitions):
            log.warning("partition %d: transaction fenced: another worker owns the partition now (%s); "
                        "exiting without acknowledging the batch", p, reason)

    def _raise(self, partitions, exc: KafkaException) -> None:
        error = exc.args[0]
        if error.code() == KafkaError._FATAL and "error" not in self._fatal and self.producer is not None:
            # The producer turned fatal in its own thread (the broker fenced it) and refused this call with a bare
            # _FATAL. The reason comes out of the next poll: confluent-kafka raises it there as a KafkaException
            # (the error callback is not called for it; measured with a fenced transactional producer), or,
            # with other versions, serves it to the error callback. Asked for up to FATAL_REASON_WAIT_S, on this
            # failure path only.
            deadline = time.monotonic() + FATAL_REASON_WAIT_S
            while "error" not in self._fatal and time.monotonic() < deadline:
                try:
                    self.producer.poll(0.05)
                except KafkaException as reason:
                    self._fatal["error"] = reason.args[0]
                except Exception:  # noqa: BLE001 - only the reason is wanted here; the failure is raised below
                    break
        if error.code() == KafkaError._FATAL and "error" in self._fatal:
            # A producer that became fatal in an earlier call refuses every later one with a bare _FATAL; the
            # reason is the fatal error it reported then (a fence, for a transactional producer).
            error = self._fatal["error"]
        if error.code() in FENCES or "fenc" in error.str().lower():
            self._say_fenced(partitions, error)
        raise DeliveryFailed(f"partitions {sorted(partitions)}: transaction failed: {error}") from exc

    def _send(self, outputs: list[Output], producer: Producer) -> None:
        """One partition's outputs, into its open transaction. Failures surface at the commit."""
        topics = self._topics
        follow_ups: dict[int, list[Output]] = {}  # per partition: a run of commands with one timestamp
        run_bytes: dict[int, int] = {}
        own_results = self.client_results
        for o in outputs:
            if o.topic != "commands":
                # No partition given: the producer's partitioner places the record by its key's murmur2 hash.
                produce(producer, topics[o.topic], o.value, o.key, timestamp=o.timestamp_ms)
                if o.client_id is not None and o.client_id in own_results:  # the client's own copy
                    produce(producer, own_results[o.client_id], o.value, o.key, timestamp=o.timestamp_ms)
                continue
            run = follow_ups.setdefault(o.partition, [])
            size = run_bytes.get(o.partition, 0) + len(o.value)
            if run and (run[0].timestamp_ms != o.timestamp_ms or len(run) >= FOLLOW_UPS_PER_RECORD
                        or size > FOLLOW_UP_RECORD_BYTES):
                self._send_commands(run, producer)
                run.clear()
                size = len(o.value)
            run.append(o)
            run_bytes[o.partition] = size
        for run in follow_ups.values():
            if run:
                self._send_commands(run, producer)

    def _send_commands(self, run: list[Output], producer: Producer) -> None:
        """Follow-up commands for one partition with one log time: several travel as one CommandBatch (the
        time is the record's, so only commands sharing it can share a record). Each command is the same
        bytes on every redo; which of them share a record depends on where batches were cut."""
        first = run[0]
        value = first.value if len(run) == 1 else \
            self._codec.encode("command_batch", {"commands": [o.value for o in run]})
        produce(producer, self._topics["commands"], value, first.key, partition=first.partition,
                headers=self.seal.headers(self._topics["commands"], first.partition, value),
                timestamp=first.timestamp_ms)

    def produce_ticks(self, partitions: list[int]) -> None:
        """A sealed tick into each of these commands partitions (the ones this worker owns) where a hold or the
        end of a copy's wait is due by the wall clock, so it expires without traffic (streams/ticks.py). A
        partition with nothing due gets none: an idle ledger's log stays still. Outside the partitions'
        transactions: a tick carries only its log time, so a lost or repeated one changes nothing (and a look
        at a heap being changed by a decision at worst sends one in vain or one interval late)."""
        due = [p for p in partitions if self._due(p, int(time.time() * 1000))]
        if not due:
            return
        if self._tick_producer is None:
            self._tick_producer = _producer(self.settings)
        topic, value = self._topics["commands"], ticks.value()
        for p in due:
            produce(self._tick_producer, topic, value, ticks.KEY, partition=p,
                    headers=self.seal.headers(topic, p, value))
        self._tick_producer.poll(0)

    def _due(self, partition: int, now_ms: int) -> bool:
        """Whether the partition's earliest indexed expiry, the end of a copy's wait for its coordinator's
        Reserve, or the end of a waiting command's wait for copied credits has passed (ended holds still indexed
        count too: the tick drops them)."""
        proc = self.processors.get(partition)
        if proc is None:
            return False
        state = proc.state
        return state.expiries.due_by(now_ms) or state.copy_dues.due_by(now_ms) or state.waiting.dues.due_by(now_ms)

    def close(self) -> None:
        if self.producer is not None:
            self.producer.flush(FLUSH_TIMEOUT_S)
            self.producer = None
        for proc in self.processors.values():
            proc.state.store.close()
        self.processors.clear()
        self._pool.shutdown(wait=False)
