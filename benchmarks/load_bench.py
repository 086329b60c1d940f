"""A replay loader's CPU per record, in process, without Kafka: what `projections.bulk.load` costs on its own.

  python benchmarks/load_bench.py [--records 300000] [--rounds 2]

The records are those of `make bench-read` (benchmarks/replay_bench.py's synthetic history, balances and
results over 2,000 accounts in 8 partitions), encoded once and handed to the loader by a stand-in for
confluent-kafka's Consumer (tests/helpers/stub_consumer.py) that returns them in batches as `consume()` would.
The loader writes a real SQLite file. Variants, alternated round by round so the machine's swings fall on each
alike: the common records taken by the loader's fast path in C (projections/fastload.py), or every record by
its Python loop with the decoders compiled to C (schemas/cdecode.py) or with the generated Python ones.
Printed: CPU µs per record (time.process_time) and records/s of CPU. (The cyclic garbage collector switched
off while loading made no difference here: 8.61 against 8.81 µs with the compiled decoders, 15.04 against
14.73 with the Python ones, 150,000 records; it stays on.)
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
from tests.helpers.stub_consumer import Message, consumer_of  # noqa: E402


def prepare(settings, records: int):
    """(messages, end offsets, keys) of the benchmark's records, encoded once."""
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
            messages.append(Message(topic, p, offset, c.encode(schema, value)))
    names = {settings.topic(t): t for t in bulk.SCHEMA_OF}
    return messages, offsets, {(names[topic], p): (0, end) for (topic, p), end in offsets.items()}


def run_once(settings, messages, ends, keys, native: bool, fast: bool) -> float:
    codec_module._codec = codec_module.Codec(native=native)
    with tempfile.TemporaryDirectory(prefix="ledger-load-bench-") as tmp, \
            mock.patch.object(bulk, "Consumer", consumer_of(messages, ends)), \
            mock.patch.dict("os.environ", {} if fast else {"LEDGER_LOADER": "python"}):
        sink = bulk.SqliteSink(str(Path(tmp) / "store.db"))
        gc.collect()
        t0 = time.process_time()
        loaded = bulk.load(settings, keys, sink, lambda n: None)
        cpu = time.process_time() - t0
        sink.close()
    assert loaded.applied == len(messages), loaded.applied
    return cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    settings = config.load().with_prefix("load-bench.")
    messages, ends, keys = prepare(settings, args.records)
    n = len(messages)
    variants = [("fast path in C (fastload)", True, True), ("Python loop, compiled decoders", True, False),
                ("Python loop and decoders", False, False)]
    cpu: dict[str, list[float]] = {label: [] for label, _, _ in variants}
    for r in range(args.rounds):
        for label, native, fast in (variants if r % 2 == 0 else variants[::-1]):
            cpu[label].append(run_once(settings, messages, ends, keys, native, fast))
    print(f"load_bench: {n} records (history, balances, results), one loader into SQLite, in process, "
          f"{args.rounds} rounds; load, indexes and commit included")
    for label, _, _ in variants:
        best = min(cpu[label])
        print(f"  {label:<32} {best / n * 1e6:6.2f} us of CPU per record = {n / best:>9,.0f} records/s "
              f"(rounds: {', '.join(f'{t:.2f} s' for t in cpu[label])})")


if __name__ == "__main__":
    main()
