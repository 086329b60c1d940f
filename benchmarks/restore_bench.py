"""Restore time against history length, with and without snapshots (`make bench-restore`). Prints figures only.

For each history length N (decided commands), the worker's real batch path (benchmarks/engine_core_bench.py:
Engine, PartitionProcessors, RocksDB, no Kafka) decides transfers among 1,000 users with snapshots every
LEDGER_SNAPSHOT_EVERY changelog offsets, keeping what it writes to the changelog and snapshots topics. Those
records are then produced, in order, to a real broker under two topic prefixes: one with the changelog only
(no snapshot exists) and one with the changelog and its snapshots. A fresh Engine with an empty data directory
restores all 8 partitions of each (Engine.restore: the fence, the log-end write, the snapshot if any, the
changelog replay), and the wall time is printed with the records it replayed.

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
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from confluent_kafka import Producer  # noqa: E402

from benchmarks.engine_core_bench import PARTITIONS, Bench, NullProducer  # noqa: E402
from connectors.admin import create_topics, delete_topics  # noqa: E402
from streams import engine as engine_module  # noqa: E402
from streams.config import Settings  # noqa: E402
from streams.engine import Engine  # noqa: E402


class KeepingProducer(NullProducer):
    """A NullProducer that also keeps the changelog and snapshot records, per partition, in log order."""

    kept: dict[tuple[str, int], list[tuple[bytes | None, bytes | None]]] = defaultdict(list)

    def produce(self, topic, value=None, key=None, partition=-1, on_delivery=None, timestamp=0, headers=None):
        if topic.endswith(("changelog", "snapshots")):
            self.kept[(topic.rsplit(".", 1)[1], partition)].append((key, value))
        super().produce(topic, value, key, partition, on_delivery, timestamp, headers)


def history(decided: int, users: int = 1000) -> dict:
    """Decide about `decided` commands in process; returns the changelog and snapshot records written."""
    KeepingProducer.kept = defaultdict(list)
    bench = Bench(users=users, per_record=500)
    for p in range(PARTITIONS):
        bench.engine.producers[p] = KeepingProducer(bench.log)
    bench.setup()
    bench.transfers(0, max(decided // 2, 1), in_flight=2000)  # a transfer is a debit and a credit decided
    bench.close()
    return KeepingProducer.kept


def publish(settings: Settings, kept: dict, with_snapshots: bool) -> int:
    producer = Producer({**settings.kafka_config(), "enable.idempotence": True, "linger.ms": 20,
                         "compression.type": "lz4", "queue.buffering.max.messages": 1_000_000})
    count = 0
    for (name, p), records in sorted(kept.items()):
        if name == "snapshots" and not with_snapshots:
            continue
        for key, value in records:
            while True:
                try:
                    producer.produce(settings.topic(name), value, key, partition=p)
                    break
                except BufferError:
                    producer.poll(0.05)
            count += 1
    assert producer.flush(120) == 0
    return count


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
        kept = history(size)
        changelog = sum(len(r) for (name, _), r in kept.items() if name == "changelog")
        row = []
        for with_snapshots in (False, True):
            settings = Settings(bootstrap=bootstrap, prefix=f"rb{size}{'s' if with_snapshots else 'n'}"
                                f"{os.getpid()}.", partitions=PARTITIONS)
            create_topics(settings)
            try:
                publish(settings, kept, with_snapshots)
                row.append(restore_all(settings))
            finally:
                delete_topics(settings)
        (plain_s, plain_n, _), (snap_s, snap_n, loads) = row
        print(f"{size:>10,} {changelog:>10,} | {plain_s:>15.2f} {plain_n:>9,} | {snap_s:>13.2f} {snap_n:>9,} "
              f"{loads:>6}", flush=True)


if __name__ == "__main__":
    main()
