"""Every record the ledger publishes sits in the partition Kafka's default partitioner gives its key
(toPositive(murmur2(key)) % partitions): results, history, balances and dead letters, after the worked example
(a trade across partitions, holds, fees), a rejection and a poison record. So Kafka Streams and ksqlDB joins
on these keys, interactive queries and any lookup of a key by its partition find it (docs/ecosystem.md)."""
from __future__ import annotations

from collections import Counter

from connectors.client import LedgerClient, Leg
from connectors.demo import run_example
from projections.topics import read_topic
from streams import routing


def test_every_output_records_key_hashes_to_its_partition(settings, start_worker):
    start_worker()
    client = LedgerClient(settings, "keys")
    try:
        assert all(r["outcome"] == "accepted" for r in run_example(client))
        ids = [client.post("keys-over", [Leg("user:buyer:USDT", -10**15), Leg("sys:world:USDT", 10**15)])]
        client.send_raw(b"poison", "user:buyer:USDT")
        assert client.wait(ids)["keys-over"]["reason"] == "insufficient_funds"
    finally:
        client.close()
    # No need to wait for quiescence: whatever has been published so far must be placed by its key.

    placed = Counter()
    for topic in ("results", "history", "balances", "dlq"):
        records = list(read_topic(settings, topic, decode=False))
        assert records, topic
        for r in records:
            expected = routing.partition_for_key(r.key.decode(), settings.partitions)
            assert r.partition == expected, (topic, r.key, r.partition, expected)
        placed[topic] = len({r.partition for r in records})
    # Not all in one partition: the records really are spread by key (the example touches many accounts).
    assert placed["history"] > 1 and placed["balances"] > 1, placed
