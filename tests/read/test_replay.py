"""Replay (P7), into SQLite and PostgreSQL: a rebuild from offset 0 hashes equal to the live store; tampering
with any table of the projection is found and named."""
from __future__ import annotations

import re
import time

import pytest

from projections import replay
from projections.projector import catch_up
from projections.store import BOOKKEEPING, HASHED, SCHEMA, Store, digests, digests_hash, projection_hash
from projections.topics import read_topic
from projections.verify import format_report, verify
from tests.helpers.hashing import assert_every_column_hashed

# What a mismatch in each table is named by.
NAMED_BY = {"accounts": "account", "account_views": "account", "history": "account", "currency_sums": "currency",
            "transaction_links": "link", "results": "result", "holds": "hold"}


def test_rebuild_equals_live_and_the_oracles_hold(ledger_run, read_db, new_store):
    result, cmp = replay.replay_against(ledger_run.settings, read_db, new_store("rebuilt"), progress=False)
    assert result.records > 0
    assert cmp.equal and cmp.first_difference is None, cmp
    live = Store(read_db, readonly=True)
    assert result.hash == projection_hash(live.conn)
    report = verify(ledger_run.settings)  # `ledger verify` over the same stream
    assert report.ok, format_report(report)


def test_a_tampered_store_is_detected_and_the_account_named(ledger_run, read_db, new_store, capsys):
    tampered = new_store("tampered")
    catch_up(ledger_run.settings, tampered)
    store = Store(tampered)
    # One minor unit on one account's history: invisible in the balance row, caught by the hash.
    changed = store.conn.execute("UPDATE history SET amount = '19980001' "
                                 "WHERE account_id = 'user:buyer:BTC' AND amount = '19980000'")
    assert changed.rowcount == 1
    store.close()
    code = replay.run_cli(ledger_run.settings, new_store("rebuilt"), tampered, None, None, progress=False)
    assert code == 1
    err = capsys.readouterr().err
    assert "MISMATCH" in err and "first differing account: user:buyer:BTC" in err

    # Without --into: a temporary SQLite file, or a new schema next to a PostgreSQL live store.
    assert replay.run_cli(ledger_run.settings, None, read_db, None, None, progress=False) == 0
    assert "OK" in capsys.readouterr().err
    assert replay.run_cli(ledger_run.settings, read_db, read_db, None, None, progress=False) == 2  # not fresh


def test_replay_from_a_timestamp_or_offsets(ledger_run, new_store):
    settings = ledger_run.settings
    ends = {k: high for k, (_, high) in replay.watermarks(settings).items()}
    # Other tests may have added traffic since the shared store caught up: compare rebuilds to fixed ends.
    # Two loaders (history and results apart, one file copied into the other) and one: the same store.
    from_zero = replay.rebuild(settings, new_store("zero"), until=ends, progress=False, workers=2)
    everything = replay.rebuild(settings, new_store("all"), start=replay.offsets_for_time(settings, 0),
                                until=ends, progress=False, workers=1)
    assert (from_zero.loaders, everything.loaders) == (2, 1)
    assert everything.hash == from_zero.hash and everything.records == from_zero.records
    future = replay.rebuild(settings, new_store("none"),
                            start=replay.offsets_for_time(settings, replay.parse_time_ms("2999-01-01T00:00:00Z")),
                            progress=False)
    assert future.records == 0
    # Only the results topic (every other partition starts at its end): results, no balances.
    start = {k: (0 if k[0] == "results" else v) for k, v in ends.items()}
    results_only = new_store("results")
    partial = replay.rebuild(settings, results_only, start=start, until=ends, progress=False)
    store = Store(results_only, readonly=True)
    # Records, not offsets: transaction markers take offsets too.
    assert partial.records == sum(1 for r in read_topic(settings, "results", decode=False)
                                  if r.offset < ends[("results", r.partition)])
    assert store.conn.execute("SELECT count(*) FROM accounts").fetchone()[0] == 0
    assert store.conn.execute("SELECT count(*) FROM results").fetchone()[0] > 0
    assert replay.parse_offsets("history:0=5,results:*=0")[("history", 0)] == 5


def test_a_tampered_result_or_hold_is_detected_and_named(ledger_run, new_store, capsys):
    settings = ledger_run.settings
    tampered, rebuilt = new_store("tampered"), new_store("rebuilt")
    catch_up(settings, tampered)
    _, cmp = replay.replay_against(settings, tampered, rebuilt, progress=False)
    assert cmp.equal, cmp
    store = Store(tampered)
    # A decision that says otherwise: the result row only (history and balances untouched).
    changed = store.conn.execute("UPDATE results SET reason = 'account_closed' "
                                 "WHERE client_id = 'read-tests' AND command_id = 'pager-over'")
    assert changed.rowcount == 1
    cmp = replay.compare(replay.snapshot(tampered)[1], rebuilt)
    assert not cmp.equal and cmp.first_difference == ("result", "read-tests/pager-over"), cmp
    # A hold a little less captured than the results say (holds sort before results: it is named first).
    changed = store.conn.execute("UPDATE holds SET captured = '1' WHERE hold_id = 'order:ask-1'")
    assert changed.rowcount == 1
    store.close()
    cmp = replay.compare(replay.snapshot(tampered)[1], rebuilt)
    assert not cmp.equal and cmp.first_difference == ("hold", "order:ask-1"), cmp
    assert replay.run_cli(settings, new_store("again"), tampered, None, None, progress=False) == 1
    err = capsys.readouterr().err
    assert "MISMATCH" in err and "first differing hold: order:ask-1" in err, err


def test_the_hash_covers_every_column_of_every_projected_table(ledger_run, new_store):
    """Every table the store creates is hashed or named as bookkeeping; changing any value of a hashed column
    changes the hash and names the row's account, currency, result or hold; the unhashed columns (how rows were
    applied, not what the topics say) do not. (The shared run links no transactions: transaction_links is
    tampered with in test_why.py.)"""
    target = new_store("columns")
    catch_up(ledger_run.settings, target)
    store = Store(target)
    assert set(re.findall(r"CREATE TABLE IF NOT EXISTS (\w+)", SCHEMA)) == set(HASHED) | set(BOOKKEEPING)
    assert projection_hash(store.conn) == digests_hash(sorted(dict(digests(store.conn)).items()))
    for table in HASHED:
        if table != "transaction_links":
            assert_every_column_hashed(store, table, NAMED_BY[table])
    store.close()


def test_a_rebuild_skips_and_counts_undecodable_records(settings, new_store):
    """The bulk loader decodes records of the current schema directly; anything else still goes through the
    codec: a foreign body, a truncated one, trailing bytes after a whole record and an empty value are each
    skipped and counted, and the good records around them are loaded. So is a record that decodes but whose
    amount is no integer (it cannot be folded): skipped by the rebuild and by the projector alike, which
    failed on it before, at every restart."""
    from confluent_kafka import Producer

    from schemas.codec import codec

    c = codec()
    account = "user:skip:USD"
    good = [c.encode("history", {
        "entry_id": f"{account}#{seq}", "account_id": account, "currency": "USD", "seq": seq, "amount": "5",
        "posted_after": str(5 * seq), "held_after": "0", "transaction_id": f"t{seq}", "kind": "deposit",
        "reference": None, "hold_id": None, "occurred_at_ms": 1_000 + seq, "at_ms": 1_000 + seq,
        "command_id": f"t{seq}", "client_id": "c"}) for seq in (1, 2)]
    unfoldable = c.encode("history", {**c.decode("history", good[1]), "seq": 3, "entry_id": f"{account}#3",
                                      "amount": "five"})
    bad = [b"\xc3\x01garbage", good[0][:-3], good[0] + b"\x00", None, unfoldable]
    producer = Producer(settings.kafka_config())
    for value in [good[0], *bad, good[1]]:
        producer.produce(settings.topic("history"), value, account.encode(), partition=0)
    producer.flush(10)
    _until_offsets_answer(settings)
    target, live = new_store("skipping"), new_store("skipping_live")
    result = replay.rebuild(settings, target, progress=False)
    assert result.records == 2 and result.offsets[("history", 0)] == 7
    catch_up(settings, live)
    for path in (target, live):
        store = Store(path, readonly=True)
        try:
            assert [r["seq"] for r in store.conn.execute("SELECT seq FROM history ORDER BY seq")] == [1, 2]
            assert store.offsets()[("history", 0)] == 7
            if store.conn.postgres:  # a rebuild adds the keys of the tables it copied after their rows
                keys = {r[0] for r in store.conn.execute(
                    "SELECT table_name FROM information_schema.table_constraints WHERE constraint_type = "
                    "'PRIMARY KEY' AND table_schema = current_schema()")}
                assert {"history", "results", "transaction_links"} <= keys, keys
        finally:
            store.close()


def test_a_rebuild_indexes_links_as_the_projector_does_with_one_loader_or_two(settings, new_store):
    """Loaders collect the links of the history entries they load; a transaction's legs in two partitions name
    the same link, loaded by two loaders (history split between them) or by one: transaction_links, and the
    whole store, hash as the projector's."""
    from confluent_kafka import Producer

    from schemas.codec import codec

    c = codec()
    producer = Producer(settings.kafka_config())
    for partition, account in ((0, "user:a:USD"), (1, "user:b:USD")):
        for seq, (tx, links) in enumerate((("x1", []), ("r1", ["x1"]), ("r2", ["x1", "r1"])), start=1):
            value = c.encode("history", {
                "entry_id": f"{account}#{seq}", "account_id": account, "currency": "USD", "seq": seq,
                "amount": "5", "posted_after": str(5 * seq), "held_after": "0", "transaction_id": tx,
                "kind": "adjustment", "reference": None, "hold_id": None, "occurred_at_ms": 1_000 + seq,
                "at_ms": 1_000 + seq, "command_id": tx, "client_id": "c", "links": links})
            producer.produce(settings.topic("history"), value, account.encode(), partition=partition)
    producer.flush(10)
    _until_offsets_answer(settings)
    live = new_store("live")
    catch_up(settings, live)
    store = Store(live, readonly=True)
    live_hash = projection_hash(store.conn)
    store.close()
    for loaders in (2, 1):
        target = new_store(f"loaders{loaders}")
        result = replay.rebuild(settings, target, progress=False, workers=loaders)
        assert (result.loaders, result.records, result.hash) == (loaders, 6, live_hash)
        store = Store(target, readonly=True)
        try:
            assert (store.linked_to("x1"), store.linked_to("r1")) == (["r1", "r2"], ["r2"])
        finally:
            store.close()


@pytest.mark.parametrize("fault", ["raises", "silent"])
def test_a_loader_failing_after_it_handed_over_its_state_fails_the_rebuild(settings, new_store, tmp_path, fault):
    """A loader process tells the rebuild its state once its records are read, then that its share is done;
    the rebuild writes the per-account tables in between. A loader failing there fails the rebuild, and
    nothing looks complete: no SQLite file at the target (nor a partial one beside it), a PostgreSQL schema
    without offsets. Faults, in the loader process only: committing and indexing its share raises (the
    rebuild names the error); its last word cannot be pickled, so the queue's feeder thread drops it and the
    process exits cleanly (the rebuild says so, rather than waiting for ever). Run in a process of its own,
    which forks its loaders (one thread), so they inherit the fault."""
    import pickle
    import subprocess
    import sys
    from pathlib import Path

    from confluent_kafka import Producer

    from schemas.codec import codec

    c = codec()
    producer = Producer(settings.kafka_config())
    for partition, account in ((0, "user:f0:USD"), (1, "user:f1:USD")):
        for seq in (1, 2, 3):
            producer.produce(settings.topic("history"), c.encode("history", {
                "entry_id": f"{account}#{seq}", "account_id": account, "currency": "USD", "seq": seq,
                "amount": "5", "posted_after": str(5 * seq), "held_after": "0", "transaction_id": f"t{seq}",
                "kind": "deposit", "reference": None, "hold_id": None, "occurred_at_ms": 1_000 + seq,
                "at_ms": 1_000 + seq, "command_id": f"t{seq}", "client_id": "c"}), account.encode(),
                partition=partition)
    producer.flush(10)
    _until_offsets_answer(settings)
    target = new_store("failing")
    given = tmp_path / "given.pickle"
    given.write_bytes(pickle.dumps((settings, target)))
    script = """
import multiprocessing, pickle, sys
from projections import bulk, replay
settings, target = pickle.loads(open(sys.argv[1], "rb").read())
def failing(finish):
    def fail_in_a_loader_process(self, *args):
        if multiprocessing.parent_process() is not None:
            raise OSError("no space left on device")
        return finish(self, *args)
    return fail_in_a_loader_process
real_load = bulk.load
def load_losing_its_last_word(*args, **kwargs):
    loaded = real_load(*args, **kwargs)
    if multiprocessing.parent_process() is not None:
        loaded.timeline.append(("a phase", lambda: None))  # not picklable
    return loaded
if sys.argv[2] == "raises":
    bulk.SqliteSink.finish = failing(bulk.SqliteSink.finish)
    bulk.PgSink.finish = failing(bulk.PgSink.finish)
else:
    bulk.load = load_losing_its_last_word
print("start method:", bulk.start_method())
try:
    replay.rebuild(settings, target, progress=False, workers=2)
except RuntimeError as exc:
    print("rebuild failed:", exc)
"""
    root = Path(__file__).resolve().parent.parent.parent
    out = subprocess.run([sys.executable, "-c", script, str(given), fault], cwd=root, capture_output=True,
                         text=True, timeout=120).stdout
    assert "start method: fork" in out, out
    assert ("rebuild failed: replay loader 1: OSError: no space left on device" if fault == "raises" else
            "rebuild failed: replay loader replay-loader-1 exited without reporting its share done") in out, out
    if "://" in target:
        store = Store(target, readonly=True)
        try:
            assert store.offsets() == {}
        finally:
            store.close()
    else:
        assert not [p.name for p in Path(target).parent.iterdir() if p.name.startswith(Path(target).name)]


def test_a_rebuilt_store_has_every_index_of_the_schema_whatever_the_split(settings, new_store):
    """Two loaders, one with history (one entry, no links: its transaction_links stay empty), the other with
    results: the store has every index the schema names, those of a table a loader left empty too (a SQLite
    loader's file is merged table by table, and an empty table was skipped with its indexes)."""
    from confluent_kafka import Producer

    from schemas.codec import codec

    c = codec()
    producer = Producer(settings.kafka_config())
    account = "user:ix:USD"
    producer.produce(settings.topic("history"), c.encode("history", {
        "entry_id": f"{account}#1", "account_id": account, "currency": "USD", "seq": 1, "amount": "5",
        "posted_after": "5", "held_after": "0", "transaction_id": "t1", "kind": "deposit", "reference": None,
        "hold_id": None, "occurred_at_ms": 1_001, "at_ms": 1_001, "command_id": "t1", "client_id": "c"}),
        account.encode(), partition=0)
    for i in range(10):
        producer.produce(settings.topic("results"), c.encode("result", {
            "command_id": f"r{i}", "client_id": "c", "outcome": "accepted", "reason": None, "detail": "",
            "duplicate": False, "transaction_id": f"r{i}", "at_ms": 2_000 + i, "holds": []}), b"c", partition=1)
    producer.flush(10)
    _until_offsets_answer(settings)
    target = new_store("indexes")
    result = replay.rebuild(settings, target, progress=False, workers=2)
    assert (result.loaders, result.records) == (2, 11)
    expected = set(re.findall(r"CREATE INDEX IF NOT EXISTS (\w+)", SCHEMA))
    store = Store(target, readonly=True)
    try:
        if store.conn.postgres:
            query = "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()"
        else:
            query = "SELECT name FROM sqlite_master WHERE type = 'index'"
        assert expected <= {r[0] for r in store.conn.execute(query)}
    finally:
        store.close()


def _until_offsets_answer(settings) -> None:
    """New topics: the broker answers ListOffsets for every partition a moment after creating them."""
    from confluent_kafka import KafkaError, KafkaException
    while True:
        try:
            replay.watermarks(settings)
            return
        except KafkaException as exc:
            assert exc.args[0].code() == KafkaError.NOT_LEADER_FOR_PARTITION, exc
            time.sleep(0.2)
