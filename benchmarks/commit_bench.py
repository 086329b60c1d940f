"""Where a command's latency goes between partitions (`make bench-commit`). Prints figures; asserts nothing.

1. The broker's price of a worker's commit, without the ledger: N transactional producers (a worker has one per
   partition it owns, for fencing) each writing R records spread over K partitions in one transaction, all N
   flushed and committed concurrently, as `Engine.commit` does. Printed per round: p50 / p99 of the round, and
   of its slowest flush and slowest `commit_transaction`. The shapes: one partition with little to do, a
   latency run's (8 transactions touching about 13 partitions each: results, history and balances are keyed,
   so they spread over every partition of their topics), and a loaded one (26 each).
2. Produce -> result through a real worker, by kind, at a low rate and at a moderate one: a deposit is decided
   in one partition (one batch, one commit); a transfer to a user in another partition takes three batches in
   a row (the coordinator's begin and Reserve, the participant's vote, the decision), each a commit.
   The worker's own log line (`commands/s in N batches ...; deciding x%, emitting+committing y%`) is printed
   for each run.

Run: .venv/bin/python benchmarks/commit_bench.py [--rates 20,200] [--seconds 10] [--rounds 40]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from connectors.client import LedgerClient, Leg  # noqa: E402
from connectors.local_worker import Worker  # noqa: E402
from connectors.scratch import bootstrap, drop, fresh_settings  # noqa: E402
from streams import routing  # noqa: E402
from benchmarks.engine_bench import collect_latencies, pct  # noqa: E402  (pct: in ms)

SHAPES = ((1, 1, 20), (1, 13, 20), (8, 1, 20), (8, 7, 20), (8, 13, 20), (8, 26, 20), (1, 40, 160))


def commit_shapes(server: str, rounds: int) -> list[str]:
    """Part 1: each shape's concurrent flush+commit, timed per round."""
    admin = AdminClient({"bootstrap.servers": server})
    base = f"commit-bench-{uuid.uuid4().hex[:8]}"
    topics = [f"{base}-{i}" for i in range(5)]
    for future in admin.create_topics([NewTopic(t, 8, 1) for t in topics]).values():
        future.result()
    places = [(t, p) for t in topics for p in range(8)]
    lines = []
    try:
        for n, k, r in SHAPES:
            producers = []
            for i in range(n):
                producer = Producer({"bootstrap.servers": server, "transactional.id": f"{base}-{n}-{k}-{i}",
                                     "linger.ms": 2, "acks": "all", "enable.idempotence": True,
                                     "compression.type": "lz4"})  # as the worker's (streams/engine.py)
                producer.init_transactions()
                producers.append(producer)

            def one(i: int) -> tuple[float, float]:
                producer = producers[i]
                began = time.perf_counter()
                producer.begin_transaction()
                for j in range(r):
                    topic, partition = places[(i * 5 + j % k) % len(places)]
                    producer.produce(topic, b"x" * 150, partition=partition)
                producer.flush()
                flushed = time.perf_counter()
                producer.commit_transaction()
                return flushed - began, time.perf_counter() - flushed

            rows = []
            with ThreadPoolExecutor(n) as pool:
                for round_ in range(rounds + 5):
                    began = time.perf_counter()
                    times = list(pool.map(one, range(n)))
                    if round_ >= 5:  # the first rounds register partitions and warm connections
                        rows.append((time.perf_counter() - began, max(t[0] for t in times),
                                     max(t[1] for t in times)))
            secs = [[row[c] for row in rows] for c in range(3)]
            lines.append(f"  {n} transaction(s) x {k:2d} partitions, {r} records each: round p50 {pct(secs[0], .5):5.1f} "
                         f"ms p99 {pct(secs[0], .99):5.1f}; slowest flush p50 {pct(secs[1], .5):5.1f}, slowest commit "
                         f"p50 {pct(secs[2], .5):4.1f}")
    finally:
        admin.delete_topics(topics)
    return lines


def hop_latency(settings, worker: Worker, rate: float, seconds: float) -> list[str]:
    """Part 2 at one rate: half deposits (one partition), half transfers to a user in another partition."""
    client = LedgerClient(settings, f"hops-{uuid.uuid4().hex[:6]}")
    users = [f"user:{i}:USD" for i in range(64)]
    where = {u: routing.partition_of_account(u, settings.partitions) for u in users}
    run = uuid.uuid4().hex[:6]
    client.wait([client.open_account(u, "USD", command_id=f"open-{u}") for u in users], 120)
    client.wait([client.post(f"fund-{run}-{u}", [Leg("sys:world:USD", -10**9), Leg(u, 10**9)], kind="deposit")
                 for u in users], 120)
    sent_at: dict[str, float] = {}
    seen: dict[str, float] = {}
    stop = threading.Event()
    reader = threading.Thread(target=collect_latencies, args=(settings, sent_at, "results", stop, seen))
    reader.start()
    time.sleep(1.0)
    kinds: dict[str, str] = {}
    log_from = worker.log_path.stat().st_size
    count = int(rate * seconds)
    start = time.perf_counter()
    for i in range(count):
        payer = users[i % len(users)]
        if i % 2 == 0:
            command_id = client.post(f"dep-{run}-{i}", [Leg("sys:world:USD", -5), Leg(payer, 5)], kind="deposit")
            kinds[command_id] = "deposit (one partition)"
        else:
            payee = next(u for u in users[(i * 7 + 3) % len(users):] + users if where[u] != where[payer])
            command_id = client.post(f"tr-{run}-{i}", [Leg(payer, -5), Leg(payee, 5)])
            kinds[command_id] = "transfer to another partition"
        sent_at[command_id] = time.perf_counter()
        time.sleep(max(0.0, start + (i + 1) / rate - time.perf_counter()))
    client.flush()
    time.sleep(3)
    stop.set()
    reader.join()
    client.close()
    lines = [f"  at {rate:.0f}/s for {seconds:.0f} s ({count} commands):"]
    for kind in dict.fromkeys(kinds.values()):
        waits = [seen[c] for c in seen if kinds.get(c) == kind]
        if waits:
            lines.append(f"    {kind:31s} {len(waits):5d} seen, p50 {pct(waits, .5):6.1f} ms, p90 {pct(waits, .9):6.1f}, "
                         f"p99 {pct(waits, .99):6.1f}")
    with open(worker.log_path, errors="replace") as log:
        log.seek(log_from)
        lines += ["    worker: " + line.split("[INFO] ", 1)[1].strip() for line in log if "commands/s in" in line]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="20,200", help="commands/s of each latency run, comma-separated")
    parser.add_argument("--seconds", type=float, default=10, help="length of each latency run")
    parser.add_argument("--rounds", type=int, default=40, help="commit rounds per shape in part 1")
    parser.add_argument("--partitions", type=int, default=8, help="partitions of the ledger's topics in part 2")
    parser.add_argument("--skip-shapes", action="store_true", help="part 2 only")
    args = parser.parse_args()
    server = bootstrap()
    if not args.skip_shapes:
        print("1. a worker's commit without the ledger: N concurrent transactions, each R records over K partitions")
        print("\n".join(commit_shapes(server, args.rounds)))
    print(f"2. produce -> result through one worker ({args.partitions} partitions), by kind")
    settings = fresh_settings(server, args.partitions)
    worker = Worker(settings, Path(tempfile.mkdtemp(prefix="commit-bench-")), "hops", session_timeout_s=30).start()
    try:
        for rate in (float(r) for r in args.rates.split(",")):
            print("\n".join(hop_latency(settings, worker, rate, args.seconds)))
    finally:
        worker.stop()
        drop(settings)


if __name__ == "__main__":
    main()
