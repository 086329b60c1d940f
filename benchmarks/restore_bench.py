"""Restore time against history length, with and without snapshots (`make bench-restore`). Prints figures only.

For each history length N (decided commands), the worker's real batch path (benchmarks/engine_core_bench.py:
Engine, PartitionProcessors, RocksDB, no Kafka) decides transfers among 1,000 users with snapshots every
LEDGER_SNAPSHOT_EVERY changelog offsets. What it writes to the changelog and snapshots topics is produced, as it
is written and in order, to a real broker under two topic prefixes: one with the changelog only (no snapshot
exists) and one with the changelog and its snapshots. Nothing is kept in memory but librdkafka's queue, so a
history of 1,000,000 commands costs what 10,000 do in memory (kept whole, 100,000 took 1.8 GB). A fresh Engine
with an empty data directory then restores all 8 partitions of each (Engine.restore: the fence, the log-end
write, the snapshot if any, the changelog replay), and the wall time is printed with the records it replayed.

Run: .venv/bin/python benchmarks/restore_bench.py [--sizes 10000,100000,1000000] [--every 20000]
"""
from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from confluent_kafka import Producer  # noqa: E402

from benchmarks.engine_core_bench import PARTITIONS, Bench, NullProducer  # noqa: E402
from connectors.admin import create_topics, delete_topics  # noqa: E402
from streams import engine as engine_module  # noqa: E402
from streams.config import Settings  # noqa: E402
from streams.engine import Engine  # noqa: E402
from streams.producing import produce  # noqa: E402


class PublishingProducer(NullProducer):
    """A NullProducer that also publishes each changelog and snapshot record, as it is written, to the topics of
    both histories (snapshots to the one with snapshots only), in log order per partition."""

    def __init__(self, log, kafka: Producer, plain: Settings, snapshotted: Settings):
        super().__init__(log)
        self.kafka, self.plain, self.snapshotted = kafka, plain, snapshotted
        self.published: Counter = Counter()  # records per topic name (changelog, snapshots)

    def produce(self, topic, value=None, key=None, partition=-1, on_delivery=None, timestamp=0, headers=None):
        name = topic.rsplit(".", 1)[1]
        if name in ("changelog", "snapshots"):
            targets = [self.snapshotted] if name == "snapshots" else [self.plain, self.snapshotted]
            for settings in targets:
                produce(self.kafka, settings.topic(name), value, key, partition=partition)
            self.kafka.poll(0)
            self.published[name] += 1
        super().produce(topic, value, key, partition, on_delivery, timestamp, headers)


def history(decided: int, plain: Settings, snapshotted: Settings, users: int = 1000) -> int:
    """Decide about `decided` commands in process, publishing the changelog (and snapshot) records as they are
    written; returns the changelog records written."""
    kafka = Producer({**plain.kafka_config(), "enable.idempotence": True, "linger.ms": 20,
                      "compression.type": "lz4", "queue.buffering.max.kbytes": 64 * 1024})
    bench = Bench(users=users, per_record=500)
    producers = [PublishingProducer(bench.log, kafka, plain, snapshotted) for _ in range(PARTITIONS)]
    for p in range(PARTITIONS):
        bench.engine.producers[p] = producers[p]
    bench.setup()
    bench.transfers(0, max(decided // 2, 1), in_flight=2000)  # a transfer is a debit and a credit decided
    bench.close()
    assert kafka.flush(300) == 0, "records not delivered"
    return sum(p.published["changelog"] for p in producers)


def restore_all(settings: Settings) -> tuple[float, int, int]:
    """(seconds, changelog records replayed, snapshots loaded) for a fresh engine restoring every partition."""
    data = Path(tempfile.mkdtemp(prefix="restore-bench-"))
    engine = Engine(settings, data)
    began = time.perf_counter()
    for p in range(PARTITIONS):
        engine.restore(p)
    elapsed = time.perf_counter() - began
    replayed, loads = engine.restored_records, engine.snapshot_loads
    engine.close()
    shutil.rmtree(data, ignore_errors=True)
    return elapsed, replayed, loads


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--every", type=int, default=20_000, help="changelog offsets between snapshots")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    engine_module.SNAPSHOT_EVERY = args.every
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP", "127.0.0.1:9092")
    print(f"restore of {PARTITIONS} partitions by a worker without local state; snapshots every {args.every} "
          f"changelog offsets per partition")
    print(f"{'decided':>10} {'changelog':>10} | {'no snapshot: s':>15} {'replayed':>9} | "
          f"{'snapshots: s':>13} {'replayed':>9} {'loaded':>6}")
    for size in (int(s) for s in args.sizes.split(",")):
        plain, snapshotted = (Settings(bootstrap=bootstrap, prefix=f"rb{size}{kind}{os.getpid()}.",
                                       partitions=PARTITIONS) for kind in "ns")
        create_topics(plain)
        create_topics(snapshotted)
        try:
            changelog = history(size, plain, snapshotted)
            row = [restore_all(plain), restore_all(snapshotted)]
        finally:
            delete_topics(plain)
            delete_topics(snapshotted)
        (plain_s, plain_n, _), (snap_s, snap_n, loads) = row
        print(f"{size:>10,} {changelog:>10,} | {plain_s:>15.2f} {plain_n:>9,} | {snap_s:>13.2f} {snap_n:>9,} "
              f"{loads:>6}", flush=True)

if __name__ == "__main__":
    main()
