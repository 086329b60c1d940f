"""Worker memory against commands decided (`make bench-memory`). Prints figures only.

The worker's real batch path in process (benchmarks/engine_core_bench.py: Engine, PartitionProcessors, a
RocksDB per partition, no Kafka) decides two-leg transfers among many users, with client holds placed and
released alongside, and prints the process's resident set size every `--every` decided commands. What Kafka's
client library queues is not in it (make soak measures a real worker's RSS); what grows with history in the
worker's own state (caches of decoded records, the inbox, RocksDB memtables and block cache) is.

With --worker, a real worker process on the broker instead (`make soak-memory`): the load generator's mix in
CommandBatch records at --rate commands/s, and the worker's RSS (librdkafka's queues and Faust included) every
--every commands it has answered.

Run: .venv/bin/python benchmarks/memory_bench.py [--decided 1000000] [--every 100000] [--users 20000]
     .venv/bin/python benchmarks/memory_bench.py --worker [--decided 1000000] [--rate 1500]
"""
from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.engine_core_bench import Bench  # noqa: E402


def rss_mib(pid: int | str = "self") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--decided", type=int, default=1_000_000)
    parser.add_argument("--every", type=int, default=100_000)
    parser.add_argument("--users", type=int, default=20_000)
    parser.add_argument("--worker", action="store_true", help="a real worker on the broker (KAFKA_BOOTSTRAP)")
    parser.add_argument("--rate", type=float, default=1500)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.worker:
        return worker_rss(args.decided, args.every, args.rate, args.users)
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


def worker_rss(decided: int, every: int, rate: float, users: int) -> None:
    import tempfile

    from connectors.client import LedgerClient
    from connectors.loadgen import LoadGenerator, Mix
    from connectors.local_worker import Worker
    from connectors.scratch import bootstrap, drop, fresh_settings

    settings = fresh_settings(bootstrap())
    worker = Worker(settings, Path(tempfile.mkdtemp(prefix="memory-soak-")), "mem").start()
    try:
        client = LedgerClient(settings, "mem")
        gen = LoadGenerator(client, seed=3, mix=Mix(users=min(users, 2000)), run_id="mem")
        client.wait(gen.open_accounts(), 120)
        print(f"a worker's RSS under the load generator's mix at {rate:.0f} commands/s in CommandBatch records")
        print(f"{'answered':>10} {'RSS MiB':>8} {'s':>7}")
        began = time.perf_counter()
        print(f"{0:>10,} {rss_mib(worker.proc.pid):>8.0f} {0.0:>7.1f}", flush=True)
        for done in range(every, decided + 1, every):
            sent = list(gen.paced(every, rate, batch_window_s=0.02))
            # In slices: each pass of a wait looks up every id it was given, and a 100,000-id pass every 20 ms
            # took about half a core from the worker being measured.
            for first in range(0, len(sent), 2000):
                client.wait(sent[first:first + 2000], 600)
            print(f"{done:>10,} {rss_mib(worker.proc.pid):>8.0f} {time.perf_counter() - began:>7.1f}", flush=True)
        client.close()
    finally:
        worker.stop()
        drop(settings)


if __name__ == "__main__":
    main()
