"""Engine benchmark on the local broker (`make bench`). Prints figures; asserts nothing.

1. Throughput: a realistic mix (same- and cross-partition transfers, holds and captures, deposits) sent as
   fast as possible; commands/s from the first send to the last result. Once with one Kafka record per
   command, once with the commands in CommandBatch records (client.batch()).
2. Ceilings over the same command records, in the same run (this machine is shared and noisy: only the
   ratios mean much): a raw confluent-kafka consume-and-produce loop with no ledger logic, and a Faust
   agent that takes the records and does nothing (benchmarks/faust_ceiling.py).
3. Latency, unbatched and batched: produce-to-result and produce-to-balance-visible p50/p99, by default at half
   the saturated rate measured in 1. (one record per command, then batched every 20 ms; the goal of issue 15 is
   a p99 of at most 100 ms there) and at 300/s.
4. Worker RSS at start and end.
(Until 2026-12-03 a fifth part compared the partitions' transactions committed one after another and
concurrently; a batch is one transaction since, docs/engine.md, "One Kafka transaction per batch".)
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from contextlib import nullcontext
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from connectors.client import LedgerClient  # noqa: E402
from connectors.loadgen import LoadGenerator, Mix  # noqa: E402
from schemas.codec import codec  # noqa: E402
from streams.producing import produce  # noqa: E402
from connectors.local_worker import Worker  # noqa: E402
from connectors.scratch import bootstrap, drop, fresh_settings  # noqa: E402


# The last commit whose engine produced outputs and changelog without Kafka transactions.


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def raw_ceiling(settings, idle_s: float = 2.0) -> tuple[float, int]:
    """(records/s, records) of a consume-and-produce loop over every record of the commands topic, one record
    produced per input, as fast as librdkafka allows. It reads until nothing has come for idle_s (the time is
    taken to the last record): the topic's end offsets cannot say how many records there are, since the
    worker's follow-up commands are written there in Kafka transactions, whose commit markers take offsets no
    consumer receives (counting offsets, this loop waited for ever)."""
    topic_in, topic_out = settings.topic("commands"), settings.topic("dlq")
    consumer = Consumer({**settings.kafka_config(), "group.id": f"raw-{uuid.uuid4()}", "enable.auto.commit": False,
                         "auto.offset.reset": "earliest"})
    producer = Producer({**settings.kafka_config(), "enable.idempotence": True, "linger.ms": 2,
                         "compression.type": "lz4"})
    consumer.subscribe([topic_in])
    seen, start, last = 0, None, time.perf_counter()
    while start is None or time.perf_counter() - last < idle_s:
        for msg in consumer.consume(2000, timeout=0.2):
            if msg.error():
                continue
            if start is None:
                start = time.perf_counter()
            produce(producer, topic_out, msg.value(), msg.key(), partition=msg.partition())
            seen += 1
            last = time.perf_counter()
        producer.poll(0)
        if start is None and time.perf_counter() - last > 60:
            raise RuntimeError(f"raw ceiling: no record of {topic_in} came within 60 s")
    producer.flush(60)
    consumer.close()
    return seen / max(last - start, 1e-6), seen


def collect_latencies(settings, sent_at: dict[str, float], topic: str, stop: threading.Event,
                      out: dict[str, float]) -> None:
    c = codec()
    consumer = Consumer({**settings.kafka_config(), "group.id": f"lat-{uuid.uuid4()}", "enable.auto.commit": False,
                         "isolation.level": "read_committed"})  # visible to readers = committed
    name = settings.topic(topic)
    consumer.assign([TopicPartition(name, p, consumer.get_watermark_offsets(TopicPartition(name, p))[1])
                     for p in range(settings.partitions)])
    while not stop.is_set():
        for msg in consumer.consume(2000, timeout=0.01):
            if msg.error():
                continue
            now = time.perf_counter()
            if topic == "results":  # keyed client_id/command_id: no decoding (this process shares the CPU)
                key = msg.key().decode().split("/", 1)[1]
            else:
                v = c.decode("balance", msg.value())
                key = v["last_transaction_id"]
            if key in sent_at and key not in out:
                out[key] = now - sent_at[key]
    consumer.close()


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] * 1000


def faust_ceiling(settings, records: int) -> float:
    """records/s of a Faust agent that only takes the command records (benchmarks/faust_ceiling.py)."""
    env = {**os.environ, "KAFKA_BOOTSTRAP": settings.bootstrap, "LEDGER_TOPIC_PREFIX": settings.prefix,
           "LEDGER_PARTITIONS": str(settings.partitions), "CEILING_RECORDS": str(records),
           "CEILING_DIR": tempfile.mkdtemp(prefix="ceiling-")}
    out = subprocess.run([sys.executable, "benchmarks/faust_ceiling.py", "worker", "-l", "warn"], env=env,
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    found = re.search(r"records/s (\d+)", out.stdout + out.stderr)  # Faust logs what the agent prints
    if found:
        return float(found.group(1))
    raise RuntimeError(f"faust ceiling run failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")


def throughput(client, gen, count: int, batch: int) -> tuple[float, float]:
    """(commands/s from first send to last result, seconds spent sending)."""
    start = time.perf_counter()
    with client.batch(batch) if batch > 1 else nullcontext():
        ids = list(gen.commands(count))
    client.flush()
    sent_s = time.perf_counter() - start
    client.wait(ids, 900)
    return count / (time.perf_counter() - start), sent_s


def latency(settings, gen, client, rate: float, seconds: float, batch_ms: float) -> str:
    sent_at: dict[str, float] = {}
    results_lat: dict[str, float] = {}
    balance_lat: dict[str, float] = {}
    stop = threading.Event()
    threads = [threading.Thread(target=collect_latencies, args=(settings, sent_at, t, stop, out))
               for t, out in (("results", results_lat), ("balances", balance_lat))]
    for t in threads:
        t.start()
    time.sleep(1.0)
    n = 0
    for command_id in gen.paced(int(rate * seconds), rate, batch_ms / 1000):
        sent_at[command_id] = time.perf_counter()
        n += 1
    client.flush()
    time.sleep(3)
    stop.set()
    for t in threads:
        t.join()
    lat, bal = list(results_lat.values()), list(balance_lat.values())
    how = f"batched every {batch_ms:.0f} ms" if batch_ms else "one record per command"
    lines = [f"latency at {rate:.0f}/s for {seconds:.0f} s, {how}: {n} sent, {len(lat)} results seen"]
    if lat:
        lines.append(f"  produce->result   p50 {pct(lat, 0.5):7.1f} ms  p99 {pct(lat, 0.99):7.1f} ms")
    if bal:
        lines.append(f"  produce->balance  p50 {pct(bal, 0.5):7.1f} ms  p99 {pct(bal, 0.99):7.1f} ms")
    return "\n".join(lines)


def scale(counts: list[int], count: int, batch: int) -> list[str]:
    """Throughput with 1, 2, 4, ... worker processes sharing the partitions of one fresh set of topics each
    (the group rebalances as each worker joins; accounts are opened after the last one is ready)."""
    from confluent_kafka.admin import AdminClient
    brokers = len(AdminClient({"bootstrap.servers": bootstrap()}).list_topics(timeout=10).brokers)
    lines = [f"scale-out ({brokers} broker(s), {count} commands per throughput run, {batch} per CommandBatch "
             f"when batched):"]
    for n in counts:
        settings = fresh_settings(bootstrap())
        workers = [Worker(settings, Path(tempfile.mkdtemp(prefix="bench-")), f"scale{n}-{i}",
                          session_timeout_s=30).start() for i in range(n)]
        try:
            client = LedgerClient(settings, "bench")
            gen = LoadGenerator(client, seed=1, mix=Mix(users=2000, invalid=0.02), run_id=f"s{n}")
            client.wait(gen.open_accounts(), 180)
            single, _ = throughput(client, gen, count, 1)
            batched, _ = throughput(client, gen, count, batch)
            lines.append(f"  {n} worker(s), {settings.partitions // n if n <= settings.partitions else 0}"
                         f"-{-(-settings.partitions // n)} partitions each: {single:6.0f} commands/s one per "
                         f"record, {batched:6.0f} batched")
            print(lines[-1], flush=True)
            client.close()
        finally:
            for w in workers:
                w.stop()
            drop(settings)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=30000, help="commands for each throughput run")
    parser.add_argument("--batch", type=int, default=500, help="commands per CommandBatch record (batched run)")
    parser.add_argument("--latency", default="half:0,half:20,300:0",
                        help="latency runs, rate:batch_ms comma-separated (batch_ms 0 = one record per command; "
                             "rate 'half': half the saturated rate of the throughput run of the same kind)")
    parser.add_argument("--seconds", type=float, default=15, help="length of each latency run")
    parser.add_argument("--workers", type=int, default=1, help="worker processes sharing the partitions")
    parser.add_argument("--partitions", type=int, default=8,
                        help="partitions of the ledger's topics")
    parser.add_argument("--scale", help="only the scale-out runs: worker counts, comma-separated (e.g. 1,2,4)")
    args = parser.parse_args()
    if args.scale:
        print("\n".join(scale([int(n) for n in args.scale.split(",")], args.count, args.batch)))
        return

    settings = fresh_settings(bootstrap(), args.partitions)
    workers = [Worker(settings, Path(tempfile.mkdtemp(prefix="bench-")), f"bench{i}", session_timeout_s=30).start()
               for i in range(args.workers)]
    try:
        client = LedgerClient(settings, "bench")
        gen = LoadGenerator(client, seed=1, mix=Mix(users=2000, invalid=0.02), run_id="b")
        client.wait(gen.open_accounts(), 120)
        rss_start = [rss_mib(w.proc.pid) for w in workers]

        single_rate, single_sent = throughput(client, gen, args.count, 1)
        ceiling, records = raw_ceiling(settings)
        faust = faust_ceiling(settings, records)
        batched_rate, batched_sent = throughput(client, gen, args.count, args.batch)
        latencies = []
        for rate, batch_ms in (run.split(":") for run in args.latency.split(",")):
            if rate == "half":  # half the saturated rate of the same kind of run, as issue 15's goal is put
                rate = (batched_rate if float(batch_ms) else single_rate) / 2
                text = latency(settings, gen, client, rate, args.seconds, float(batch_ms))
                first, *rest = text.split("\n")
                latencies.append("\n".join([first + " (half the saturated rate; goal: p99 <= 100 ms)", *rest]))
            else:
                latencies.append(latency(settings, gen, client, float(rate), args.seconds, float(batch_ms)))
        rss_end = [rss_mib(w.proc.pid) for w in workers]

        print(f"throughput, {args.count} commands each run ({args.workers} worker(s), "
              f"{settings.partitions} partitions):")
        print(f"  one record per command:      {single_rate:8.0f} commands/s (sent in {single_sent:.1f} s)")
        print(f"  {args.batch} per CommandBatch:       {batched_rate:8.0f} commands/s (sent in {batched_sent:.1f} s)")
        print(f"  raw ceiling:                 {ceiling:8.0f} records/s (confluent-kafka consume+produce, "
              f"same {records} records)")
        print(f"  Faust ceiling:               {faust:8.0f} records/s (a Faust agent taking the same records, "
              f"doing nothing)")
        print(f"  ratio to raw ceiling:        {single_rate / ceiling:8.3f} one per record, "
              f"{batched_rate / ceiling:.3f} batched")
        print(f"  ratio to Faust ceiling:      {single_rate / faust:8.3f} one per record")
        for text in latencies:
            print(text)
        for start_mib, end_mib in zip(rss_start, rss_end):
            print(f"worker RSS: {start_mib:.0f} MiB at start, {end_mib:.0f} MiB at end")
        client.close()
    finally:
        for w in workers:
            w.stop()
        drop(settings)


if __name__ == "__main__":
    main()
