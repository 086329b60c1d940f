"""The projector against the real broker, into SQLite and PostgreSQL: catch-up gives the worked example's
balances; crashes are safe; both databases hold the same projection."""
from __future__ import annotations

import sqlite3

from connectors.demo import EXPECTED
from projections.db import split_schema
from projections.projector import catch_up
from projections.store import Record, Store, projection_hash
from projections.topics import read_topic
from tests.read.conftest import require_postgres

SCHEMA_OF = {"balances": "balance", "history": "history", "results": "result"}
COUNTS = [("count(*)", "history"), ("count(*)", "results"), ("count(*)", "accounts"), ("sum(next_offset)", "offsets")]


def test_catch_up_after_the_worked_example(ledger_run, new_store):
    settings = ledger_run.settings
    db = new_store("read")
    progress = catch_up(settings, db)
    assert progress.applied > 0 and progress.lag == {"balances": 0, "history": 0, "results": 0}
    store = Store(db, readonly=True)
    for account, (posted, held) in EXPECTED.items():
        view = store.view(account)
        assert (int(view["posted"]), int(view["held"])) == (posted, held), account
    sums = store.currency_sums()  # other tests may add EUR traffic on their own accounts
    assert {"USDT", "BTC", "USD"} <= set(sums) and set(sums.values()) == {0}
    assert [c["posted"] for c in store.clearing()] in ([], [0], [0, 0])
    # The fill's result carries the hold states: the bid ended released, nothing open.
    hold = store.conn.execute("SELECT * FROM holds WHERE hold_id = 'order:bid-1'").fetchone()
    assert (hold["status"], hold["captured"], hold["released"]) == ("released", str(11_980 * 10**6),
                                                                     str(18_020 * 10**6))
    before = projection_hash(store.conn)
    # A second catch-up over the same store reads nothing new and changes nothing.
    assert catch_up(settings, db).applied == 0
    assert projection_hash(store.conn) == before


def _records(settings) -> tuple[list[Record], dict]:
    from schemas.codec import codec

    records, offsets = [], {}
    for topic in SCHEMA_OF:
        for r in read_topic(settings, topic, decode=False):
            records.append(Record(topic, r.partition, r.offset, codec().decode(SCHEMA_OF[topic], r.raw)))
            offsets[(topic, r.partition)] = r.offset + 1
    return records, offsets


def test_a_crashed_batch_leaves_nothing_and_a_reapplied_batch_changes_nothing(ledger_run, new_store):
    settings = ledger_run.settings
    records, offsets = _records(settings)

    # A crash inside the transaction (here: an exception after the rows were written) rolls back rows and
    # offsets together: the store is exactly as before, so the projector re-reads the batch.
    target = new_store("crash")
    store = Store(target, settings.prefix)
    empty = projection_hash(store.conn)
    original = store._apply_balances

    def crash(*args):
        original(*args)
        raise KeyboardInterrupt("kill -9 stand-in")

    store._apply_balances = crash
    try:
        store.apply(records, offsets)
    except KeyboardInterrupt:
        pass
    store._apply_balances = original
    assert store.offsets() == {} and projection_hash(store.conn) == empty
    assert store.conn.execute("SELECT count(*) FROM history").fetchone()[0] == 0

    # Applied once, then the same batch again (the offsets did not reach Kafka, or a worker re-emitted it).
    store.apply(records, offsets)
    once = (projection_hash(store.conn), store.currency_sums(), store.offsets(),
            store.conn.execute("SELECT count(*) FROM results").fetchone()[0])
    store.apply(records, offsets)
    store.apply(list(reversed(records)), offsets)  # even out of order: balances keep the highest seq
    again = (projection_hash(store.conn), store.currency_sums(), store.offsets(),
             store.conn.execute("SELECT count(*) FROM results").fetchone()[0])
    assert again == once
    assert int(store.view("user:buyer:USDT")["posted"]) == EXPECTED["user:buyer:USDT"][0]

    # And the store continues from its offsets: a projector started on it has nothing left to apply.
    assert catch_up(settings, target).applied == 0


def test_both_databases_hold_the_same_projection(ledger_run):
    """The shared run's stores, read with each database's own driver (not the store's layer): the PostgreSQL
    rows are really in PostgreSQL, in the store's schema, and hash equal to the SQLite ones."""
    require_postgres()
    import psycopg

    url, schema = split_schema(ledger_run.stores["postgres"])
    with psycopg.connect(url) as pg:
        in_pg = [int(pg.execute(f"SELECT {q} FROM {schema}.{t}").fetchone()[0]) for q, t in COUNTS]
    lite = sqlite3.connect(ledger_run.stores["sqlite"])
    try:
        in_sqlite = [int(lite.execute(f"SELECT {q} FROM {t}").fetchone()[0]) for q, t in COUNTS]
    finally:
        lite.close()
    assert in_pg == in_sqlite and min(in_sqlite) > 0
    hashes = set()
    for target in ledger_run.stores.values():
        store = Store(target, readonly=True)
        hashes.add(projection_hash(store.conn))
        store.close()
    assert len(hashes) == 1
