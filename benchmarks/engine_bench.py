"""Engine benchmark on the local broker (`make bench`). Prints figures; asserts nothing.

1. Raw ceiling: a confluent-kafka consume-and-produce loop with no ledger logic, over the same number of
   command records, in the same run (this machine is shared and noisy: only the ratio means much).
2. Throughput: a realistic mix (same- and cross-partition transfers, holds and captures, deposits) sent as
   fast as possible; commands/s from the first send to the last result.
3. Latency at a fixed rate: produce-to-result and produce-to-balance-visible p50/p99.
4. Worker RSS at start and end.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from connectors.client import LedgerClient  # noqa: E402
from connectors.loadgen import LoadGenerator, Mix  # noqa: E402
from schemas.codec import codec  # noqa: E402
from streams.producing import produce  # noqa: E402
from tests.harness import Worker, bootstrap, drop, fresh_settings  # noqa: E402


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def raw_ceiling(settings, count: int) -> float:
    """Consume `count` command records and produce one record per input, as fast as librdkafka allows."""
    topic_in, topic_out = settings.topic("commands"), settings.topic("dlq")
    consumer = Consumer({**settings.kafka_config(), "group.id": f"raw-{uuid.uuid4()}", "enable.auto.commit": False,
                         "auto.offset.reset": "earliest"})
    producer = Producer({**settings.kafka_config(), "enable.idempotence": True, "linger.ms": 2,
                         "compression.type": "lz4"})
    consumer.subscribe([topic_in])
    seen, start = 0, None
    while seen < count:
        for msg in consumer.consume(2000, timeout=0.5):
            if msg.error():
                continue
            if start is None:
                start = time.perf_counter()
            produce(producer, topic_out, msg.value(), msg.key(), partition=msg.partition())
            seen += 1
        producer.poll(0)
    producer.flush(60)
    elapsed = time.perf_counter() - start
    consumer.close()
    return seen / elapsed


def collect_latencies(settings, sent_at: dict[str, float], topic: str, stop: threading.Event,
                      out: dict[str, float]) -> None:
    c = codec()
    consumer = Consumer({**settings.kafka_config(), "group.id": f"lat-{uuid.uuid4()}", "enable.auto.commit": False})
    name = settings.topic(topic)
    consumer.assign([TopicPartition(name, p, consumer.get_watermark_offsets(TopicPartition(name, p))[1])
                     for p in range(settings.partitions)])
    while not stop.is_set():
        for msg in consumer.consume(2000, timeout=0.01):
            if msg.error():
                continue
            now = time.perf_counter()
            if topic == "results":
                v = c.decode("result", msg.value())
                key = v["command_id"]
            else:
                v = c.decode("balance", msg.value())
                key = v["last_transaction_id"]
            if key in sent_at and key not in out:
                out[key] = now - sent_at[key]
    consumer.close()


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=30000, help="commands for the throughput run")
    parser.add_argument("--rate", type=float, default=1000, help="commands/s for the latency run")
    parser.add_argument("--seconds", type=float, default=15, help="length of the latency run")
    args = parser.parse_args()

    settings = fresh_settings(bootstrap())
    worker = Worker(settings, Path(tempfile.mkdtemp(prefix="bench-")), "bench", session_timeout_s=30).start()
    try:
        client = LedgerClient(settings, "bench")
        gen = LoadGenerator(client, seed=1, mix=Mix(users=2000, invalid=0.02), run_id="b")
        client.wait(gen.open_accounts(), 120)
        rss_start = rss_mib(worker.proc.pid)

        # Throughput: everything sent at once, bounded only by the producer's queue.
        start = time.perf_counter()
        ids = list(gen.commands(args.count))
        client.flush()
        sent_s = time.perf_counter() - start
        client.wait(ids, 600)
        elapsed = time.perf_counter() - start
        ledger_rate = args.count / elapsed

        ceiling = raw_ceiling(settings, args.count)

        # Latency at a fixed rate.
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
        for command_id in gen.paced(int(args.rate * args.seconds), args.rate):
            sent_at[command_id] = time.perf_counter()
            n += 1
        client.flush()
        time.sleep(3)
        stop.set()
        for t in threads:
            t.join()
        rss_end = rss_mib(worker.proc.pid)
        lat = list(results_lat.values())
        bal = list(balance_lat.values())

        print(f"throughput run: {args.count} commands (sent in {sent_s:.1f} s) -> all results in {elapsed:.1f} s")
        print(f"  ledger:       {ledger_rate:8.0f} commands/s (one worker)")
        print(f"  raw ceiling:  {ceiling:8.0f} records/s (confluent-kafka consume+produce, same topic)")
        print(f"  ratio:        {ledger_rate / ceiling:8.3f}")
        print(f"latency run: {n} commands at {args.rate:.0f}/s for {args.seconds:.0f} s; "
              f"{len(lat)} results seen")
        if lat:
            print(f"  produce->result   p50 {pct(lat, 0.5):7.1f} ms  p99 {pct(lat, 0.99):7.1f} ms")
        if bal:
            print(f"  produce->balance  p50 {pct(bal, 0.5):7.1f} ms  p99 {pct(bal, 0.99):7.1f} ms")
        print(f"worker RSS: {rss_start:.0f} MiB at start, {rss_end:.0f} MiB at end")
        client.close()
    finally:
        worker.stop()
        drop(settings)


if __name__ == "__main__":
    main()
