"""A replay loader's CPU per record, in process, without Kafka: what `projections.bulk.load` costs on its own.

  python benchmarks/load_bench.py [--records 300000] [--rounds 2]

The records are those of `make bench-read` (benchmarks/replay_bench.py's synthetic history, balances and
results over 2,000 accounts in 8 partitions), encoded once and handed to the loader by a stand-in for
confluent-kafka's Consumer that returns them in batches as `consume()` would. The loader writes a real SQLite
file. Variants, alternated round by round so the machine's swings fall on each alike: the common records taken
by the loader's fast path in C (projections/fastload.py), or every record by its Python loop with the decoders
compiled to C (schemas/cdecode.py) or with the generated Python ones. Printed: CPU µs per record
(time.process_time) and records/s of CPU. The loader switches the cyclic garbage collector off while it
loads (docs/read-side.md), so every variant here runs without it. Its stand-in for the consumer is its own: a
benchmark imports nothing of tests/. Being no librdkafka consumer, it gets no reader in C
(fastload.reader): the records reach the fast path through `Batch.run`, so reading them is not measured here
(`replay_bench` measures it, end to end).
"""
from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.replay_bench import synthetic  # noqa: E402
from projections import bulk  # noqa: E402
from schemas import codec as codec_module  # noqa: E402
from streams import config, routing  # noqa: E402


class _Message:
    __slots__ = ("_topic", "_partition", "_offset", "_value")

    def __init__(self, topic: str, partition: int, offset: int, value: bytes):
        self._topic, self._partition, self._offset, self._value = topic, partition, offset, value

    def error(self):
        return None

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def value(self) -> bytes:
        return self._value


class _Position:
    def __init__(self, topic: str, partition: int, offset: int):
        self.topic, self.partition, self.offset = topic, partition, offset


class FakeConsumer:
    """Hands out the prepared messages in order, `consume(n)` at a time; positions at the end when done."""

    messages: list[_Message] = []
    ends: dict[tuple[str, int], int] = {}

    def __init__(self, _config):
        self.at = 0

    def assign(self, _partitions):
        pass

    def consume(self, n: int, timeout: float = 0):
        batch = self.messages[self.at:self.at + n]
        self.at += len(batch)
        return batch

    def position(self, tps):
        done = self.at >= len(self.messages)
        return [_Position(tp.topic, tp.partition, self.ends[(tp.topic, tp.partition)] if done else 0) for tp in tps]

    def incremental_unassign(self, _partitions):
        pass

    def close(self):
        pass


def prepare(settings, records: int):
    c = codec_module.Codec(native=False)
    offsets: dict[tuple[str, int], int] = {}
    messages = []
    for account, history, balance, result in synthetic(2000, records // 3):
        p = routing.partition_for_key(routing.routing_key_for(account), settings.partitions)
        for name, schema, value in (("history", "history", history), ("balances", "balance", balance),
                                    ("results", "result", result)):
            topic = settings.topic(name)
            offset = offsets.get((topic, p), 0)
            offsets[(topic, p)] = offset + 1
            messages.append(_Message(topic, p, offset, c.encode(schema, value)))
    FakeConsumer.messages = messages
    FakeConsumer.ends = offsets
    names = {settings.topic(t): t for t in bulk.SCHEMA_OF}
    return {(names[topic], p): (0, end) for (topic, p), end in offsets.items()}


def run_once(settings, keys, native: bool, fast: bool) -> float:
    codec_module._codec = codec_module.Codec(native=native)
    with tempfile.TemporaryDirectory(prefix="ledger-load-bench-") as tmp, \
            mock.patch.object(bulk, "Consumer", FakeConsumer), \
            mock.patch.dict("os.environ", {} if fast else {"LEDGER_LOADER": "python"}):
        sink = bulk.SqliteSink(str(Path(tmp) / "store.db"))
        gc.collect()
        t0 = time.process_time()
        loaded = bulk.load(settings, keys, sink, lambda n: None)
        cpu = time.process_time() - t0
        sink.close()
    assert loaded.applied == len(FakeConsumer.messages), loaded.applied
    return cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    settings = config.load().with_prefix("load-bench.")
    keys = prepare(settings, args.records)
    n = len(FakeConsumer.messages)
    variants = [("fast path in C (fastload)", True, True), ("Python loop, compiled decoders", True, False),
                ("Python loop and decoders", False, False)]
    cpu: dict[str, list[float]] = {label: [] for label, _, _ in variants}
    for r in range(args.rounds):
        for label, native, fast in (variants if r % 2 == 0 else variants[::-1]):
            cpu[label].append(run_once(settings, keys, native, fast))
    print(f"load_bench: {n} records (history, balances, results), one loader into SQLite, in process, "
          f"{args.rounds} rounds; load, indexes and commit included")
    for label, _, _ in variants:
        best = min(cpu[label])
        print(f"  {label:<32} {best / n * 1e6:6.2f} us of CPU per record = {n / best:>9,.0f} records/s "
              f"(rounds: {', '.join(f'{t:.2f} s' for t in cpu[label])})")


if __name__ == "__main__":
    main()
