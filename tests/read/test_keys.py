"""Every record the ledger publishes sits in the partition Kafka's default partitioner gives its key
(toPositive(murmur2(key)) % partitions): results, history, balances and dead letters of the shared run (the
worked example's trade across partitions, holds, fees, an account with 30 deposits, a rejection) plus a poison
record. So Kafka Streams and ksqlDB joins on these keys, interactive queries and any lookup of a key by its
partition find it (docs/ecosystem.md, "Keys and partitions")."""
from __future__ import annotations

import time

from projections.topics import read_topic
from streams import routing


def test_every_output_records_key_hashes_to_its_partition(ledger_run):
    settings = ledger_run.settings
    ledger_run.client.send_raw(b"poison", "user:keys:USD")
    deadline = time.monotonic() + 60
    while not list(read_topic(settings, "dlq", decode=False)):  # its dead letter, decided by the worker
        assert time.monotonic() < deadline, "no dead letter for the poison record"
        time.sleep(0.5)

    spread = {}
    for topic in ("results", "history", "balances", "dlq"):
        records = list(read_topic(settings, topic, decode=False))
        assert records, topic
        for r in records:
            expected = routing.partition_for_key(r.key.decode(), settings.partitions)
            assert r.partition == expected, (topic, r.key, r.partition, expected)
        spread[topic] = len({r.partition for r in records})
    # Really spread by key, not all in one partition (the run touches many accounts and commands).
    assert spread["history"] > 1 and spread["balances"] > 1 and spread["results"] > 1, spread
