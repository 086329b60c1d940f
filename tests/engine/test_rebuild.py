"""The balances topic is a pure fold of the history topic: rebuilt byte for byte, and a tampered one caught."""
from __future__ import annotations

from confluent_kafka import Producer

from connectors.client import LedgerClient
from connectors.demo import run_example
from connectors.loadgen import LoadGenerator, Mix
from projections.rebuild import rebuild_balances
from projections.topics import read_topic
from projections.verify import wait_quiescent
from schemas.codec import codec
from streams import routing


def _read_raw(settings, topic: str) -> dict[bytes, bytes]:
    import uuid

    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({**settings.kafka_config(), "group.id": f"rb-{uuid.uuid4()}"})
    ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(settings.partitions)}
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p, end in ends.items() if end])
    seen: dict[bytes, bytes] = {}
    remaining = sum(ends.values())
    while remaining > 0:
        for msg in consumer.consume(1000, timeout=1):
            if not msg.error():
                seen[msg.key()] = msg.value()
                remaining -= 1
    consumer.close()
    return seen


def test_balances_rebuilt_from_history_are_byte_identical_and_tampering_is_named(settings, start_worker):
    start_worker()
    client = LedgerClient(settings, "rebuild")
    run_example(client)
    gen = LoadGenerator(client, seed=4, mix=Mix(users=40), run_id="rb")
    client.wait(gen.open_accounts(), 60)
    client.wait(list(gen.commands(600)), 120)
    assert wait_quiescent(settings)

    topic = f"{settings.prefix}balances.rebuilt"
    report = rebuild_balances(settings, into_topic=topic)
    assert report.ok, report.details
    assert report.accounts > 40 and report.history_records > 600 and report.unreadable == 0
    written = _read_raw(settings, topic)
    assert len(written) == report.accounts

    # A balance that disagrees with history, published by mistake, is found and named.
    c = codec()
    live = max((r.value for r in read_topic(settings, "balances") if r.value["account_id"] == "user:buyer:USDT"),
               key=lambda v: v["seq"])
    forged = {**live, "posted": str(int(live["posted"]) + 1), "available": str(int(live["available"]) + 1),
              "seq": live["seq"] + 1}
    producer = Producer(settings.kafka_config())
    producer.produce(settings.topic("balances"), c.encode("balance", forged), b"user:buyer:USDT",
                     partition=routing.partition_of_account("user:buyer:USDT", settings.partitions))
    producer.flush(10)
    tampered = rebuild_balances(settings)
    assert not tampered.ok and tampered.first_difference == "user:buyer:USDT"

    # Foreign bytes on history and balances are skipped and counted, never a crash.
    for name in ("history", "balances"):
        producer.produce(settings.topic(name), b"not avro", b"user:buyer:USDT", partition=0)
    producer.flush(10)
    skipped = rebuild_balances(settings)
    assert skipped.unreadable == 2 and skipped.first_difference == "user:buyer:USDT"
    client.close()
