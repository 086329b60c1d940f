"""Worker memory against commands decided (`make bench-memory`). Prints figures only.

The worker's real batch path in process (benchmarks/engine_core_bench.py: Engine, PartitionProcessors, a
RocksDB per partition, no Kafka) decides two-leg transfers among many users, with client holds placed and
released alongside, and prints the process's resident set size every `--every` decided commands. What Kafka's
client library queues is not in it (make soak measures a real worker's RSS); what grows with history in the
worker's own state (caches of decoded records, the inbox, RocksDB memtables and block cache) is.

Run: .venv/bin/python benchmarks/memory_bench.py [--decided 1000000] [--every 100000] [--users 20000]
"""
from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.engine_core_bench import Bench  # noqa: E402


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--decided", type=int, default=1_000_000)
    parser.add_argument("--every", type=int, default=100_000)
    parser.add_argument("--users", type=int, default=20_000)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    bench = Bench(users=args.users, per_record=500)
    bench.setup()
    print(f"worker RSS in process, {args.users:,} users, two-leg transfers (a debit and a credit decided each)")
    print(f"{'decided':>10} {'RSS MiB':>8} {'s':>7}")
    began, transfers, step = time.perf_counter(), 0, max(args.every // 2, 1)
    print(f"{0:>10,} {rss_mib():>8.0f} {0.0:>7.1f}", flush=True)
    while transfers * 2 < args.decided:
        bench.transfers(transfers, step, in_flight=2000)
        transfers += step
        print(f"{transfers * 2:>10,} {rss_mib():>8.0f} {time.perf_counter() - began:>7.1f}", flush=True)
    bench.close()


if __name__ == "__main__":
    main()
