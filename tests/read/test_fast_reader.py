"""The replay loader reading its partitions straight from librdkafka (fastload.Reader, `Batch.drain`) against
`consume()` and against the Python loop, on a real broker: the same ordinary, irregular and corrupt records
(tests/helpers/loader_traffic.py's seeded mixes, written by a plain producer), loaded the three ways, give the same store row for
row and the same counts, offsets, balances, holds and refolded accounts. And the reader is used only on the
consumer it was made for."""
from __future__ import annotations

import os
import random
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path
from unittest import mock

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from projections import bulk, fastload
from schemas.codec import codec
from tests.helpers.loader_traffic import history, needs_build, traffic
from tests.helpers.pgcopy import rows_of

WAYS = {"read in C": {}, "consume()": {"LEDGER_LOADER": "consume"}, "Python loop": {"LEDGER_LOADER": "python"}}


def _write(settings, messages) -> None:
    """The mix's records into the test's topics, partition by partition in order (offsets from 0, as in
    the mix); the stand-in's consumer errors are not records and are left out (the loader skips them)."""
    failed = []
    producer = Producer({**settings.kafka_config(), "enable.idempotence": True, "linger.ms": 5})
    for m in messages:
        if m.error():
            continue
        # a key: the balances topic is compacted, and a compacted topic takes no record without one
        producer.produce(settings.topic(m.topic().split(".", 1)[1]), key=b"k", value=m.value(),
                         partition=m.partition(), on_delivery=lambda err, _: err and failed.append(err))
    assert producer.flush(30) == 0 and not failed, failed


def _load(tmp: Path, settings, keys, env: dict) -> tuple:
    path = tmp / f"{uuid.uuid4().hex[:8]}.db"
    sink = bulk.SqliteSink(str(path))
    with mock.patch.dict("os.environ", env):
        loaded = bulk.load(settings, keys, sink, lambda n: None)
    sink.close()
    conn = sqlite3.connect(path)
    tables = {t: sorted(conn.execute(f"SELECT * FROM {t}").fetchall(), key=repr)
              for t in ("history", "results", "transaction_links")}
    conn.close()
    return loaded, tables


@needs_build
@pytest.mark.parametrize("seed", [3, 11, 26])
def test_reading_in_c_loads_what_consume_and_the_python_loop_load(settings, tmp_path, seed):
    _, messages, ends, keys = traffic(seed, count=1500)
    # The mix's records were counted with the consumer errors left out here: end offsets from what is written,
    written: dict = {}
    for m in messages:
        if not m.error():
            written[(m.topic().split(".", 1)[1], m.partition())] = written.get((m.topic().split(".", 1)[1],
                                                                                m.partition()), 0) + 1
    keys = {k: (0, min(until, written.get(k, 0))) for k, (_, until) in keys.items()}
    # and two partitions end half way: their later records come in the same fetches as others' records
    for k in sorted(keys)[::5]:
        keys[k] = (0, keys[k][1] // 2)
    _write(settings, messages)
    loads = {way: _load(tmp_path, settings, keys, env) for way, env in WAYS.items()}
    c_loaded, c_tables = loads["read in C"]
    assert any("read in C too" in phase for phase, _ in c_loaded.timeline), c_loaded.timeline
    assert not any("read in C too" in phase for phase, _ in loads["consume()"][0].timeline)
    assert c_tables["history"] and c_loaded.skipped > 0 and c_loaded.refold, "the mix has every kind of record"
    for way in ("consume()", "Python loop"):
        loaded, tables = loads[way]
        for table, rows in tables.items():
            assert c_tables[table] == rows, (way, table)
        for name in ("applied", "skipped", "offsets", "balances", "holds", "refold"):
            assert getattr(c_loaded, name) == getattr(loaded, name), (way, name)


@needs_build
def test_the_reader_serves_only_the_consumer_it_was_made_for(settings):
    """fastload.reader reads the consumer's librdkafka handle only after librdkafka names it with the
    client.id the consumer was given; another id, or a stand-in consumer, gets no reader (consume() then)."""
    client_id = f"ledger-test-{uuid.uuid4()}"
    consumer = Consumer({**settings.kafka_config(), "group.id": client_id, "client.id": client_id})
    try:
        partitions = [(settings.topic("history"), 0)]
        assert fastload.reader(consumer, "another-id", partitions) is None
        made = fastload.reader(consumer, client_id, partitions)
        assert made is not None
        made.close()
        made.close()  # closing twice is harmless
    finally:
        consumer.close()

    class Lookalike:
        pass

    assert fastload.reader(Lookalike(), client_id, partitions) is None


@needs_build
def test_records_past_a_partitions_end_are_read_and_left_alone(settings):
    """A partition's records at and after its end offset are read in the same batches as the others (a batch
    holds whatever was fetched) and change nothing: no row, no offset, not counted as applied."""
    c = codec()
    rng = random.Random(1)
    topic = settings.topic("history")
    producer = Producer(settings.kafka_config())
    for seq in range(1, 11):
        producer.produce(topic, key=b"k", value=c.encode("history", history("user:a:USD", seq, rng)), partition=0)
    assert producer.flush(30) == 0
    client_id = f"ledger-test-{uuid.uuid4()}"
    consumer = Consumer({**settings.kafka_config(), "group.id": client_id, "client.id": client_id})
    remaining, offsets, rows = {("history", 0): 4}, {}, []
    fast = fastload.batch(None, c, {topic: "history"}, remaining, offsets, {}, set(), set(), {})
    reader = fastload.reader(consumer, client_id, [(topic, 0)])
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        read, deadline = 0, time.monotonic() + 30
        while read < 10 and time.monotonic() < deadline:
            count, left = fast.drain(reader, 100, 100)
            assert left == []
            read += count
        assert read == 10
        fast.flush()  # the history rows it kept, into the COPY stream
        rows += [row for _, data in fast.copies() for row in rows_of(data, bulk.PgSink.HISTORY_TYPES)]
    finally:
        fast.close()
        reader.close()
        consumer.close()
    assert (offsets, [row[1] for row in rows], fast.applied) == ({("history", 0): 4}, [1, 2, 3, 4], 4)


READ_A_MISSING_TOPIC = """
import sys, time, uuid
from confluent_kafka import Consumer, TopicPartition
from projections import fastload
from streams import config
settings = config.load().with_prefix(sys.argv[1])
client_id = f"ledger-test-{uuid.uuid4()}"
consumer = Consumer({**settings.kafka_config(), "group.id": client_id, "client.id": client_id,
                     "topic.metadata.propagation.max.ms": 200})
partitions = [(settings.topic("history"), 0), (settings.prefix + "no-such-topic", 0)]
reader = fastload.reader(consumer, client_id, partitions)
consumer.assign([TopicPartition(t, p, 0) for t, p in partitions])
read, deadline = 0, time.monotonic() + 20
while (read < 3 or not reader.errors) and time.monotonic() < deadline:
    read += reader.skim(100, 100)
print(read, reader.errors, reader.last_error)
reader.close()
consumer.close()
"""


@needs_build
def test_an_error_on_a_partition_is_counted_not_a_crash(settings):
    """librdkafka puts some errors on a partition's own queue (its topic does not exist or was deleted, its
    reading is no longer authorized); read as `consume()` reads, such an error calls confluent-kafka's error
    callback outside the thread state it needs, and the process aborts. The reader reads events: the error is
    counted and kept, the partition's neighbours are read. (In a child process: a regression is a failure here,
    not the end of the test run.)"""
    producer = Producer(settings.kafka_config())
    for n in range(3):
        producer.produce(settings.topic("history"), key=b"k", value=b"x%d" % n, partition=0)
    assert producer.flush(30) == 0
    done = subprocess.run([sys.executable, "-c", READ_A_MISSING_TOPIC, settings.prefix], capture_output=True,
                          text=True, timeout=60, cwd=Path(__file__).resolve().parents[2],
                          env={**os.environ, "KAFKA_BOOTSTRAP": settings.bootstrap})
    assert done.returncode == 0, done.stderr[-2000:]
    read, errors, text = done.stdout.split(" ", 2)
    assert int(read) == 3 and int(errors) >= 1 and "no-such-topic" in text, done.stdout


@needs_build
def test_a_record_on_the_consumers_own_queue_stops_the_rebuild_and_reader_errors_are_logged(settings, caplog):
    """Between batches the loader serves the consumer's own queue (logs, errors not about a partition). A record
    there would be one no reader took (a partition not forwarded): it stops the rebuild rather than being lost.
    And what the reader counted as errors is logged once."""
    topic = settings.topic("history")
    producer = Producer(settings.kafka_config())
    producer.produce(topic, key=b"k", value=b"x", partition=1)
    assert producer.flush(30) == 0
    client_id = f"ledger-test-{uuid.uuid4()}"
    consumer = Consumer({**settings.kafka_config(), "group.id": client_id, "client.id": client_id})
    reader = fastload.reader(consumer, client_id, [(topic, 0)])  # partition 1 is not forwarded
    try:
        consumer.assign([TopicPartition(topic, 0, 0), TopicPartition(topic, 1, 0)])
        reader.errors, reader.last_error = 2, "history [7]: topic does not exist"
        with caplog.at_level("WARNING", logger="ledger.replay"):
            deadline = time.monotonic() + 20
            with pytest.raises(RuntimeError, match=r"history/1 reached the consumer's own queue"):
                while time.monotonic() < deadline:
                    bulk._serve_consumer_queue(consumer, reader, "loader 0")
                    time.sleep(0.05)
        assert [r.getMessage() for r in caplog.records] == [
            "loader 0: librdkafka reported 2 error(s) on its partitions, the last: history [7]: topic does not exist"]
        assert reader.reported == 2
    finally:
        reader.close()
        consumer.close()
