"""Client benchmark: submit N transfers through the asyncio client with bounded in-flight requests and
report end-to-end results/s (produce -> worker -> result consumed), plus the raw produce rate.

    make bench-client            # 100,000 commands
    .venv/bin/python benchmarks/client_bench.py --count 20000 --in-flight 2000
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from connectors.aioclient import AsyncLedgerClient  # noqa: E402
from connectors.client import Leg  # noqa: E402
from connectors.local_worker import Worker  # noqa: E402
from connectors.scratch import bootstrap, drop, fresh_settings  # noqa: E402


async def run(settings, count: int, in_flight: int, users: int, batching: bool) -> None:
    async with AsyncLedgerClient(settings, "bench-client", max_in_flight=in_flight, batching=batching) as ledger:
        await asyncio.gather(*[ledger.open_account(f"user:c{i}:USD", "USD") for i in range(users)])
        await asyncio.gather(*[ledger.post(f"fund-{i}", [Leg("sys:world:USD", -10**9), Leg(f"user:c{i}:USD", 10**9)])
                               for i in range(users)])
        start = time.perf_counter()
        results = await asyncio.gather(*[
            ledger.post(f"t-{n}", [Leg(f"user:c{n % users}:USD", -1), Leg(f"user:c{(n * 7 + 1) % users}:USD", 1)],
                        timeout_s=600)
            for n in range(count)])
        elapsed = time.perf_counter() - start
        accepted = sum(r["outcome"] == "accepted" for r in results)
        how = "batched per event-loop turn" if batching else "one record per command"
        print(f"{count} transfers, at most {in_flight} in flight, {how}: {count / elapsed:.0f} results/s end to end "
              f"({accepted} accepted) in {elapsed:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--in-flight", type=int, default=5_000)
    parser.add_argument("--users", type=int, default=1_000)
    parser.add_argument("--no-batching", action="store_true", help="one Kafka record per command")
    args = parser.parse_args()
    settings = fresh_settings(bootstrap())
    worker = Worker(settings, Path(tempfile.mkdtemp(prefix="client-bench-")), "w", session_timeout_s=30).start()
    try:
        asyncio.run(run(settings, args.count, args.in_flight, args.users, not args.no_batching))
    finally:
        worker.stop()
        drop(settings)


if __name__ == "__main__":
    main()
