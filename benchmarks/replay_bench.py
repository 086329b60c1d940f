"""Read-side benchmark: replay records/s next to a raw consumer's rate, and API latency under load.

  python benchmarks/replay_bench.py [--records 300000] [--api-history 1000000] [--concurrency 32] [--pg-url URL]

1. Replay: synthetic but well-formed history, balances and results records (what a worker publishes:
   one history and one balance record per change, one result per command) are produced under a fresh
   topic prefix; then a bare confluent-kafka consumer reads them (the ceiling on this machine, now) and
   a replay rebuilds a SQLite read store from them, and with a PostgreSQL server (--pg-url, default
   LEDGER_TEST_PG_URL, which `make bench-read` sets) a PostgreSQL one too. Reported side by side, because
   the machine is shared.
2. API: a read store with --api-history history entries is written directly (no broker: this measures
   the API, not the projector), served by uvicorn in a subprocess, and GET /accounts/{id} is called by
   --concurrency concurrent clients; p50/p99/max latency and requests/s are printed.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from confluent_kafka import Producer  # noqa: E402

from connectors.admin import create_topics, delete_topics  # noqa: E402
from projections import replay  # noqa: E402
from projections.store import Record, Store  # noqa: E402
from schemas.codec import codec  # noqa: E402
from streams import config, routing  # noqa: E402
from streams.producing import produce as produce_one  # noqa: E402


def synthetic(accounts: int, changes: int):
    """(topic, key, partition, value dict) for `changes` deposits spread over `accounts` accounts."""
    seqs = [0] * accounts
    for n in range(changes):
        i = n % accounts
        seqs[i] += 1
        seq, account = seqs[i], f"user:{i}:USD"
        at = 1_700_000_000_000 + n
        history = {"entry_id": f"{account}#{seq}", "account_id": account, "currency": "USD", "seq": seq,
                   "amount": "100", "posted_after": str(100 * seq), "held_after": "0", "transaction_id": f"tx{n}",
                   "kind": "deposit", "reference": None, "hold_id": None, "occurred_at_ms": at, "at_ms": at,
                   "command_id": f"tx{n}", "client_id": "bench"}
        balance = {"account_id": account, "currency": "USD", "status": "open", "posted": str(100 * seq), "held": "0",
                   "available": str(100 * seq), "seq": seq, "last_transaction_id": f"tx{n}", "updated_at_ms": at}
        result = {"command_id": f"tx{n}", "client_id": "bench", "outcome": "accepted", "reason": None, "detail": "",
                  "duplicate": False, "transaction_id": f"tx{n}", "at_ms": at, "holds": []}
        yield account, history, balance, result


def produce(settings, records: int) -> int:
    c = codec()
    producer = Producer({**settings.kafka_config(), "linger.ms": 20, "batch.size": 1_000_000,
                         "compression.type": "lz4"})
    topics = {name: settings.topic(name) for name in ("history", "balances", "results")}
    sent = 0
    for account, history, balance, result in synthetic(2000, records // 3):
        p = routing.partition_for_key(routing.routing_key_for(account), settings.partitions)
        for name, schema, value in (("history", "history", history), ("balances", "balance", balance),
                                    ("results", "result", result)):
            produce_one(producer, topics[name], c.encode(schema, value), account.encode(), partition=p)
            sent += 1
        producer.poll(0)
    producer.flush(60)
    return sent


def bench_replay(records: int, pg_url: str | None) -> dict:
    settings = config.load().with_prefix(f"bench-replay-{uuid.uuid4().hex[:8]}.")
    create_topics(settings)
    try:
        t0 = time.perf_counter()
        sent = produce(settings, records)
        print(f"produced {sent} records in {time.perf_counter() - t0:.1f} s", flush=True)
        figures = replay.measure(settings, pg_url)
        print(f"raw consumer : {figures['raw_records']:>9} records in {figures['raw_s']:6.2f} s = "
              f"{figures['raw_rps']:>10,.0f} rec/s")
        print(f"replay       : {figures['records']:>9} records in {figures['replay_s']:6.2f} s = "
              f"{figures['replay_rps']:>10,.0f} rec/s  (ratio {figures['ratio']:.3f} of raw)")
        if pg_url:
            print(f"replay (PG)  : {figures['records']:>9} records in {figures['pg_replay_s']:6.2f} s = "
                  f"{figures['pg_replay_rps']:>10,.0f} rec/s  (ratio {figures['pg_ratio']:.3f} of raw)")
        return figures
    finally:
        delete_topics(settings)


def build_store(path: Path, entries: int, accounts: int = 10_000) -> None:
    store = Store(path, "bench.")
    batch: list[Record] = []
    t0 = time.perf_counter()
    for n, (_, history, balance, result) in enumerate(synthetic(accounts, entries)):
        batch += [Record("history", 0, n, history), Record("balances", 0, n, balance), Record("results", 0, n, result)]
        if len(batch) >= 30_000:
            store.apply(batch, {("history", 0): n + 1})
            batch = []
    if batch:
        store.apply(batch, {("history", 0): entries})
    print(f"store with {entries} history entries over {accounts} accounts in {time.perf_counter() - t0:.1f} s",
          flush=True)
    store.close()


async def load(base: str, accounts: int, requests: int, concurrency: int) -> list[float]:
    import httpx

    latencies: list[float] = []
    rng = random.Random(7)
    async with httpx.AsyncClient(base_url=base, timeout=30,
                                 limits=httpx.Limits(max_connections=concurrency)) as client:
        async def worker(n: int) -> None:
            for _ in range(n):
                t = time.perf_counter()
                r = await client.get(f"/accounts/user:{rng.randrange(accounts)}:USD")
                latencies.append(time.perf_counter() - t)
                assert r.status_code == 200, r.text

        await asyncio.gather(*(worker(requests // concurrency) for _ in range(concurrency)))
    return latencies


def bench_api(entries: int, concurrency: int, requests: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="ledger-api-bench-") as tmp:
        db = Path(tmp) / "read.db"
        accounts = 10_000
        build_store(db, entries, accounts)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        code = ("import uvicorn; from projections.api import create_app; "
                f"uvicorn.run(create_app({str(db)!r}), host='127.0.0.1', port={port}, log_level='warning')")
        server = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
        try:
            import httpx

            for _ in range(200):
                try:
                    httpx.get(f"http://127.0.0.1:{port}/openapi.json", timeout=1)
                    break
                except httpx.HTTPError:
                    time.sleep(0.1)
            asyncio.run(load(f"http://127.0.0.1:{port}", accounts, 500, concurrency))  # warm up
            t0 = time.perf_counter()
            lat = sorted(asyncio.run(load(f"http://127.0.0.1:{port}", accounts, requests, concurrency)))
            elapsed = time.perf_counter() - t0
        finally:
            server.terminate()
            server.wait(10)
    pick = lambda q: lat[min(int(q * len(lat)), len(lat) - 1)] * 1000  # noqa: E731
    figures = {"requests": len(lat), "rps": len(lat) / elapsed, "p50_ms": pick(0.50), "p99_ms": pick(0.99),
               "max_ms": lat[-1] * 1000}
    print(f"API GET /accounts/{{id}} with {entries} history entries, {concurrency} concurrent clients: "
          f"{figures['rps']:,.0f} req/s, p50 {figures['p50_ms']:.1f} ms, p99 {figures['p99_ms']:.1f} ms, "
          f"max {figures['max_ms']:.1f} ms (client and server share this machine)")
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=300_000, help="records to replay (history+balances+results)")
    parser.add_argument("--api-history", type=int, default=1_000_000, help="history entries in the API's store")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--skip-api", action="store_true")
    parser.add_argument("--pg-url", default=os.environ.get("LEDGER_TEST_PG_URL"),
                        help="a PostgreSQL server to replay into as well (a fresh schema, dropped afterwards)")
    args = parser.parse_args()
    bench_replay(args.records, args.pg_url)
    if not args.skip_api:
        bench_api(args.api_history, args.concurrency, args.requests)


if __name__ == "__main__":
    main()
