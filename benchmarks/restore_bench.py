"""Restore time against history length, with and without snapshots (`make bench-restore`). Prints figures only.

For each history length N, the worker's real batch path (benchmarks/engine_core_bench.py: Engine,
PartitionProcessors, RocksDB, no Kafka) decides a workload among 1,000 users with snapshots every --every
changelog offsets per partition. Two workloads (--workload):

    transfers  (the default, the one of docs/engine.md's earlier tables) N/2 two-leg transfers between users
               mostly in different partitions: each runs the two-phase protocol, several decided steps (results)
               and about 4 changelog records per transfer; 150-300 of N per second in process.
    local      N commands each decided in one partition: transfers between two users of the same partition, and
               every tenth a deposit from the world account's local shard; one result and one changelog record
               each, batched 2,000 per engine batch. It reaches N = 1,000,000 in minutes.

The state a snapshot holds is mostly the inbox (every command id, P4) and the transactions, so it grows with
history in both. What it writes to the changelog and snapshots topics is produced, as it
is written and in order, to a real broker under two topic prefixes: one with the changelog only (no snapshot
exists) and one with the changelog and its snapshots. Nothing is kept in memory but librdkafka's queue, so a
history of 1,000,000 commands costs what 10,000 do in memory (kept whole, 100,000 took 1.8 GB). A fresh Engine
with an empty data directory is then assigned all 8 partitions of each (Engine.assign: their transactional
ids initialised) and restores them (Engine.restore: the log-end write, the snapshot if any, the changelog replay), and the wall time is printed with the records it replayed,
and for the restore with snapshots where that time went:

    fixed     whatever the history: the partitions' transactional ids initialised (concurrently), and per
              partition the aborted write that finds the logs' ends
    snapshot  reading the latest snapshot and loading its pairs into the store
    replay    reading the changelog's tail and applying it (the rest of the restore)

Run: .venv/bin/python benchmarks/restore_bench.py [--sizes 10000,100000,1000000] [--every 20000]
     [--workload transfers|local]
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

from benchmarks.engine_core_bench import CURRENCY, PARTITIONS, Bench, NullProducer, _transfer  # noqa: E402
from connectors.admin import create_topics, delete_topics  # noqa: E402
from streams import engine as engine_module  # noqa: E402
from streams import routing  # noqa: E402
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


def history(decided: int, plain: Settings, snapshotted: Settings, workload: str, users: int = 1000
            ) -> tuple[int, int]:
    """Decide the workload's `decided` commands in process, publishing the changelog (and snapshot) records as
    they are written; returns (results written, changelog records written)."""
    kafka = Producer({**plain.kafka_config(), "enable.idempotence": True, "linger.ms": 20,
                      "compression.type": "lz4", "queue.buffering.max.kbytes": 64 * 1024})
    bench = Bench(users=users, per_record=500)
    producer = bench.engine.producer = PublishingProducer(bench.log, kafka, plain, snapshotted)
    bench.setup()
    before = bench.log.records[bench.settings.topic("results")]
    if workload == "local":
        local_commands(bench, decided)
    else:
        bench.transfers(0, max(decided // 2, 1), in_flight=2000)  # a transfer is a debit and a credit decided
    results = bench.log.records[bench.settings.topic("results")] - before
    bench.close()
    assert kafka.flush(300) == 0, "records not delivered"
    return results, producer.published["changelog"]


def local_commands(bench: Bench, count: int, in_flight: int = 2000) -> None:
    """count commands each decided in one partition: a transfer between two users of the same partition, or
    (every tenth) a deposit from the world account's shard there; in_flight of them per engine batch."""
    homes: dict[int, list[str]] = {p: [] for p in range(PARTITIONS)}
    for i in range(bench.users):
        account = f"user:c{i}:{CURRENCY}"
        homes[routing.partition_of_account(account, PARTITIONS)].append(account)
    peers = [accounts for accounts in homes.values() if len(accounts) >= 2]
    for first in range(0, count, in_flight):
        for n in range(first, min(first + in_flight, count)):
            accounts = peers[n % len(peers)]
            payee = accounts[(n // len(peers) + 1) % len(accounts)]
            if n % 10 == 0:
                bench.send(_transfer(f"d-{n}", f"sys:world:{CURRENCY}", payee, 1), payee)
            else:
                payer = accounts[(n // len(peers)) % len(accounts)]
                bench.send(_transfer(f"l-{n}", payer, payee, 1), payer)
        bench.run(bench.records())
    bench.drain()


class Split:
    """Where a restore's time went: wall time inside the engine's fence and log-end write (fixed per partition),
    and inside its snapshot read and load (wrapped on one Engine instance; the engine itself is unchanged)."""

    def __init__(self, engine: Engine):
        self.seconds: Counter = Counter()
        for name, phase in (("assign", "fixed"), ("_log_ends", "fixed"), ("_restore_snapshot", "snapshot")):
            setattr(engine, name, self._timed(getattr(engine, name), phase))

    def _timed(self, method, phase: str):
        def timed(*args, **kwargs):
            began = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self.seconds[phase] += time.perf_counter() - began
        return timed


def restore_all(settings: Settings) -> tuple[float, int, int, Counter]:
    """(seconds, changelog records replayed, snapshots loaded, seconds by part) for a fresh engine restoring
    every partition."""
    data = Path(tempfile.mkdtemp(prefix="restore-bench-"))
    engine = Engine(settings, data)
    split = Split(engine)
    began = time.perf_counter()
    engine.assign(range(PARTITIONS))
    for p in range(PARTITIONS):
        engine.restore(p)
    elapsed = time.perf_counter() - began
    replayed, loads = engine.restored_records, engine.snapshot_loads
    engine.close()
    shutil.rmtree(data, ignore_errors=True)
    split.seconds["replay"] = elapsed - split.seconds["fixed"] - split.seconds["snapshot"]
    return elapsed, replayed, loads, split.seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--every", type=int, default=20_000, help="changelog offsets between snapshots")
    parser.add_argument("--workload", choices=("transfers", "local"), default="transfers",
                        help="two-leg transfers mostly across partitions (N/2 of them), or N single-partition "
                             "commands (see the module's docstring)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    engine_module.SNAPSHOT_EVERY = args.every
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP", "127.0.0.1:9092")
    print(f"restore of {PARTITIONS} partitions by a worker without local state; snapshots every {args.every} "
          f"changelog offsets per partition; workload {args.workload}; load average {os.getloadavg()[0]:.2f}")
    print("N: the size asked for; results: commands decided (a transfer across partitions decides several "
          "steps); with snapshots: s = fixed + snapshot + replay")
    print(f"{'N':>10} {'results':>10} {'changelog':>10} | {'no snapshot: s':>15} {'replayed':>9} | "
          f"{'snapshots: s':>13} {'replayed':>9} {'loaded':>6} {'fixed':>6} {'snapshot':>8} {'replay':>7}")
    for size in (int(s) for s in args.sizes.split(",")):
        plain, snapshotted = (Settings(bootstrap=bootstrap, prefix=f"rb{size}{kind}{os.getpid()}.",
                                       partitions=PARTITIONS) for kind in "ns")
        create_topics(plain)
        create_topics(snapshotted)
        try:
            results, changelog = history(size, plain, snapshotted, args.workload)
            row = [restore_all(plain), restore_all(snapshotted)]
        finally:
            delete_topics(plain)
            delete_topics(snapshotted)
        (plain_s, plain_n, _, _), (snap_s, snap_n, loads, split) = row
        print(f"{size:>10,} {results:>10,} {changelog:>10,} | {plain_s:>15.2f} {plain_n:>9,} | {snap_s:>13.2f} "
              f"{snap_n:>9,} {loads:>6} {split['fixed']:>6.2f} {split['snapshot']:>8.2f} {split['replay']:>7.2f}",
              flush=True)


if __name__ == "__main__":
    main()
