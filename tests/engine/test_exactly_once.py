"""Exactly once for a read_committed reader, on the in-memory model of the commit path (tests/helpers/bus.py).

With the engine's transactions (Bus changelog_cuts="transaction") a crash anywhere leaves a batch's outputs,
redo records and covered mark all visible or none, and a redelivered record the changelog covers is skipped:
every command has exactly one non-duplicate result and every history entry (account#seq) is published once,
whatever the interleaving and the crashes. Without them (outputs first, then the changelog), the same check
fails on a crash between the two: the contrast below keeps the check honest.
"""
from __future__ import annotations

import re
import shutil
import uuid
from collections import Counter

from hypothesis import example, given, strategies as st

from tests.helpers.bus import Bus, Crash
from tests.helpers.interleavings import PROPERTY, checked_bus, operation_lists, run_interleaved, send
from tests.helpers.records import open_account, tx

USER = "user:ann:USDT"


def copies(bus: Bus) -> tuple[list, list]:
    """(result keys published more than once as a decision, history entries published more than once)."""
    results = Counter(e.key for e in bus.emitted if not e.result["duplicate"])
    history = Counter((h["account_id"], h["seq"]) for h in bus.history)
    return [k for k, n in results.items() if n > 1], [k for k, n in history.items() if n > 1]


def crash_between_outputs_and_changelog(changelog_cuts: str) -> Bus:
    bus, oracles = checked_bus(changelog_cuts=changelog_cuts)
    send(bus, oracles, open_account(USER, "USDT"), USER)
    bus.run()
    send(bus, oracles, tx("dep-1", [("sys:world:USDT", -500, None, None), (USER, 500, None, None)]), USER)
    partition = next(p for p in range(bus.n) if bus.pending(p))
    # Every output of the deposit is produced, then the worker dies before its changelog record.
    bus.step(partition, crash=Crash("changelog", 0))
    bus.run()
    oracles.check_quiet()
    assert bus.result("dep-1")["outcome"] == "accepted"
    return bus


def test_without_transactions_a_crash_before_the_changelog_publishes_the_result_twice():
    results, history = copies(crash_between_outputs_and_changelog("between_records"))
    assert b"t/dep-1" in results and (USER, 2) in history, "the redone deposit's outputs are published again"


def test_with_transactions_the_same_crash_publishes_each_result_and_entry_once():
    results, history = copies(crash_between_outputs_and_changelog("transaction"))
    assert results == [] and history == []


def test_redelivered_records_all_covered_already_leave_the_covered_mark_where_it_was():
    """Two deposits committed in one transaction, the consumer offset not committed, a restart: they are
    delivered again one at a time. The first alone is covered, skipped, and must not move the mark back (the
    engine moves it only past what it decides); else the second was decided again and answered twice."""
    bus, oracles = checked_bus(changelog_cuts="transaction")
    send(bus, oracles, open_account(USER, "USDT"), USER)
    bus.run()
    for n in (1, 2):
        send(bus, oracles, tx(f"dep-{n}", [("sys:world:USDT", -5, None, None), (USER, 5, None, None)]), USER)
    partition = next(p for p in range(bus.n) if bus.pending(p))
    bus.step(partition, records=2, commit_offset=False)
    bus.crash_restore(partition)
    bus.step(partition)
    bus.step(partition)
    oracles.check_quiet()
    assert [r["command_id"] for r in bus.results if r["command_id"].startswith("dep-")] == ["dep-1", "dep-2"]


# Found by the search: a trade placed in two partitions waits in both at the same offset, and the two waits had
# one engine id (decided twice, for the P4 oracle) until the partition became part of it.
PLACED_COPIES_WAIT_AT_ONE_OFFSET = [
    ('capture', 75, 258, 0), ('transfer', 0, 0, 'USDT', 366), ('trade', 1, 1, 23, 73, 186, 26), ('release', 0),
    ('capture', 70, 3, 0), ('release', 30), ('trade', 0, 1, 53, 14, 198, 23), ('capture', 21, 267, 0),
    ('release', 2), ('release', 59), ('release', 0), ('trade', 2, 2, 0, 24, 57, 4), ('hold', 0, 'USDT', 50, None),
    ('retry', 4), ('transfer', 1, 1, 'BTC', 380), ('advance', 3), ('capture', 58, 285, 1),
    ('freeze', 1, 'USDT', False)]


@PROPERTY
@given(operations=operation_lists, seed=st.integers(0, 2**32 - 1), follow_up_batches=st.booleans())
@example(operations=PLACED_COPIES_WAIT_AT_ONE_OFFSET, seed=5821251, follow_up_batches=True)
def test_one_result_per_command_and_one_entry_per_account_seq_in_any_interleaving(operations, seed,
                                                                                  follow_up_batches):
    bus = run_interleaved(operations, seed, follow_up_batches, changelog_cuts="transaction")
    results, history = copies(bus)
    assert results == [], f"results published more than once: {results[:5]}"
    assert history == [], f"history entries published more than once: {history[:5]}"


# --- against the broker -------------------------------------------------------------------------------------
def _rebuilt_from_changelog(settings, partition: int) -> dict[bytes, bytes]:
    """The partition's state rebuilt from its committed changelog alone (covered marks left out)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    from streams.engine import COVERED_MARK
    from streams.partition import PartitionProcessor
    from streams.store import MemoryStore

    consumer = Consumer({**settings.kafka_config(), "group.id": f"rebuild-{uuid.uuid4()}",
                         "isolation.level": "read_committed", "enable.partition.eof": True})
    records: list[bytes] = []
    try:
        consumer.assign([TopicPartition(settings.topic("changelog"), partition, OFFSET_BEGINNING)])
        done = False
        while not done:
            for msg in consumer.consume(1000, timeout=0.5):
                if msg.error():
                    done = done or msg.error().code() == KafkaError._PARTITION_EOF
                elif msg.key() != COVERED_MARK:
                    records.append(msg.value())
    finally:
        consumer.close()
    store = MemoryStore()
    PartitionProcessor(partition, settings.partitions, store).restore(records, 0)
    return {k: v for k, v in store.data.items() if not k.startswith(b"m/")}


def _stored(worker, partition: int) -> dict[bytes, bytes]:
    from streams.store import RocksStore

    store = RocksStore(worker.data_dir / f"p{partition}")
    try:
        return {k: v for k, v in store.scan(b"") if not k.startswith(b"m/")}
    finally:
        store.close()


def test_local_state_ahead_of_the_changelog_is_refused_and_rebuilt(settings, start_worker):
    """A store whose changelog offset is beyond the changelog's end (a store from another cluster, or from
    before the topic was recreated) is not trusted: the worker wipes it and restores from the changelog."""
    from connectors.client import LedgerClient
    from connectors.loadgen import LoadGenerator, Mix
    from projections.verify import format_report, verify, wait_quiescent
    from streams.partition import CHANGELOG_OFFSET_KEY
    from streams.store import RocksStore
    from tests.harness import assert_exactly_once, changelog_ends

    worker = start_worker("w1")
    client = LedgerClient(settings, "ahead")
    gen = LoadGenerator(client, seed=7, mix=Mix(users=30), run_id="a")
    sent = gen.open_accounts()
    sent += list(gen.commands(200))
    client.wait(sent, 120)
    worker.stop()
    ends = changelog_ends(settings)
    foreign = [p for p, end in ends.items() if end > 0][:3]
    assert foreign, ends
    for p in foreign:  # a foreign store: nothing of ours in it, an offset far past the changelog's end
        path = worker.data_dir / f"p{p}"
        shutil.rmtree(path)
        store = RocksStore(path)
        store.write({CHANGELOG_OFFSET_KEY: str(ends[p] + 1000).encode(), b"a/user:nobody:USD": b"{}"}, set())
        store.close()

    worker.start()
    sent += list(gen.commands(200))
    client.wait(sent, 120)
    assert wait_quiescent(settings, 120)
    log = worker.log_since_start()
    refused = {int(p) for p in re.findall(r"partition (\d+): local state is ahead of the changelog", log)}
    assert set(foreign) <= refused, f"refused {sorted(refused)} of {foreign}:\n{worker.tail()}"
    report = verify(settings)
    assert report.ok, format_report(report)
    assert_exactly_once(settings, "ahead", sent)
    worker.stop()
    for p in foreign:
        assert _stored(worker, p) == _rebuilt_from_changelog(settings, p), f"partition {p} is not the changelog's"
    client.close()
