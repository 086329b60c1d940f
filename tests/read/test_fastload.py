"""The replay loader's common case in C (projections/fastload.pyx) against the Python loop it stands in for
(broker-free): the same records, ordinary and irregular, loaded with it and without it give the same store,
row for row, and the same counts, offsets, balances, holds and refolded accounts; and neither fails on any of
them (a corrupt record is skipped and counted, so is one whose amounts are no integers).

The records are fed by a stand-in for confluent-kafka's Consumer (what `consume()` returns, in batches), so
the test exercises the hand-off between the two paths at every kind of record and at batch boundaries.
"""
from __future__ import annotations

import random
import re
import sqlite3
from pathlib import Path
from unittest import mock

import pytest

from projections import bulk, fastload
from projections.store import SCHEMA
from schemas import cdecode
from schemas.codec import codec
from streams import config
from tests.helpers.loader_traffic import history, needs_build, result, traffic
from tests.helpers.pgcopy import SIGNATURE, TRAILER, rows_of
from tests.helpers.stub_consumer import Message, consumer_of

def _load(tmp: Path, settings, messages, ends, keys, batch: int, fast: bool):
    """(Loaded, the rows of each table)."""
    path = tmp / f"{'fast' if fast else 'python'}.db"
    sink = bulk.SqliteSink(str(path))
    env = {} if fast else {"LEDGER_LOADER": "python"}
    with mock.patch.object(bulk, "Consumer", consumer_of(messages, ends, batch)), mock.patch.dict("os.environ", env):
        loaded = bulk.load(settings, keys, sink, lambda n: None)
    sink.close()
    conn = sqlite3.connect(path)
    tables = {}
    for table in ("history", "results", "transaction_links"):
        tables[table] = sorted(conn.execute(f"SELECT * FROM {table}").fetchall(), key=repr)
    conn.close()
    return loaded, tables


@needs_build
def test_the_fast_path_serves_the_current_schemas():
    """When the module is built, it reads the schemas the ledger writes now: a new schema version or a new
    column fails here, not silently slower (fastload.SCHEMA_HEADERS, HISTORY_BIND)."""
    assert fastload.unavailable(codec()) is None
    assert "CREATE TABLE IF NOT EXISTS history" in SCHEMA


@needs_build
def test_a_sqlite_connection_it_cannot_trust_gets_the_python_loop(tmp_path, monkeypatch):
    """On an interpreter whose sqlite3 connection layout is not known here, the fast path does not serve a
    SQLite loader at all (its rows go straight to the connection's handle, or nowhere)."""
    sink = bulk.SqliteSink(str(tmp_path / "x.db"))
    args = (codec(), {}, {}, {}, {}, set(), set(), {})
    assert fastload.batch(sink.conn, *args) is not None
    monkeypatch.setattr(fastload, "HANDLE_FIRST", ())
    assert fastload.batch(sink.conn, *args) is None
    assert fastload.batch(None, *args) is not None  # a PostgreSQL loader's rows do not need the handle
    sink.close()


@needs_build
@pytest.mark.parametrize("seed", range(30))
def test_the_fast_path_loads_what_the_python_loop_loads(tmp_path, seed):
    settings, messages, ends, keys = traffic(seed)
    batch = [1, 7, 10_000][seed % 3]
    python_loaded, python_tables = _load(tmp_path, settings, messages, ends, keys, batch, fast=False)
    fast_loaded, fast_tables = _load(tmp_path, settings, messages, ends, keys, batch, fast=True)
    assert python_tables["history"], "the mix loads history rows"
    for table, rows in python_tables.items():
        assert fast_tables[table] == rows, table
    for name in ("applied", "skipped", "offsets", "balances", "holds", "refold"):
        assert getattr(fast_loaded, name) == getattr(python_loaded, name), name
    assert python_loaded.skipped > 0 and python_loaded.refold, "the mix has undecodable and out-of-order records"


class RowSink:
    """What a PostgreSQL loader would copy: the Python loop's rows, and the fast path's COPY streams read back."""

    def __init__(self):
        self.rows = {"history": [], "links": [], "results": []}
        self.finished = None
        self.streams = 0
        self.copied = []  # (table, the rows of one stream)
        self.parts = []  # how many parts each stream came in

    def copy(self, table, data):
        self.streams += 1
        parts = [data] if isinstance(data, bytes) else list(data)  # a stream, or its parts in order
        self.parts.append(len(parts))
        rows = rows_of(b"".join(parts), bulk.PgSink.TYPES[table])
        if len(parts) > 1:  # each part whole rows: the signature only before the first, the trailer after the last
            bodies = [parts[0][len(SIGNATURE):], *parts[1:-1], parts[-1][:-len(TRAILER)]]
            assert [r for body in bodies for r in rows_of(SIGNATURE + body + TRAILER, bulk.PgSink.TYPES[table])] == rows
        self.rows[table] += rows
        self.copied.append((table, rows))

    def history(self, rows):
        self.rows["history"] += rows

    def links(self, rows):
        self.rows["links"] += rows

    def results(self, rows):
        self.rows["results"] += rows

    def finish(self, late_results, refold, indexes):
        self.finished = (list(late_results), sorted(refold))

    def close(self):
        pass


@needs_build
@pytest.mark.parametrize("seed", range(40, 60))
def test_the_rows_it_hands_a_postgresql_loader_are_the_python_loops(seed):
    """Without a SQLite connection (a PostgreSQL loader) the fast path makes the rows the loop makes, in COPY's
    binary format (in streams of their own: the order of rows between two streams does not matter to a
    table, whose keys are unique in a share). History's key-ordered rows come as one stream in parts of about
    bulk.COPY_PART bytes (here 2 KiB: several), whole rows each, signature first and trailer last."""
    settings, messages, ends, keys = traffic(seed)
    outcomes = []
    for fast in (False, True):
        sink = RowSink()
        env = {} if fast else {"LEDGER_LOADER": "python"}
        with mock.patch.object(bulk, "Consumer", consumer_of(messages, ends, [1, 7, 10_000][seed % 3])), \
                mock.patch.dict("os.environ", env), mock.patch.object(bulk, "COPY_PART", 2048):
            loaded = bulk.load(settings, keys, sink, lambda n: None)
        assert (sink.streams > 0) == fast
        assert not fast or max(sink.parts) > 1, sink.parts
        rows = {table: sorted(got, key=repr) for table, got in sink.rows.items()}
        outcomes.append((rows, sink.finished, loaded.applied, loaded.skipped, loaded.offsets, loaded.balances,
                         loaded.holds, loaded.refold))
    assert outcomes[1] == outcomes[0]


@needs_build
@pytest.mark.parametrize("seed", [40, 41, 42])
def test_the_rows_a_postgresql_loader_copies_come_in_key_order(seed):
    """The fast path's streams hold history rows in the history table's key order (account, seq) and result
    rows in the results table's (client_id, command_id), compared bytewise as PostgreSQL's COLLATE "C"
    does: their primary keys' builds sort input already sorted."""
    settings, messages, ends, keys = traffic(seed)
    sink = RowSink()
    with mock.patch.object(bulk, "Consumer", consumer_of(messages, ends, 7)):
        bulk.load(settings, keys, sink, lambda n: None)
    assert {table for table, _ in sink.copied} == {"history", "results"}
    for table, rows in sink.copied:
        key = [(row[0].encode(), row[1] if table == "history" else row[1].encode()) for row in rows]
        assert len(rows) > 1 and key == sorted(key), table


@needs_build
def test_the_fast_path_takes_the_common_records(tmp_path):
    """Ordinary records are taken by the fast path: the Python loop builds rows for the rest only."""
    settings, messages, ends, keys = traffic(99, count=300)
    with mock.patch.object(bulk, "history_row", wraps=bulk.history_row) as rows:
        _load(tmp_path, settings, messages, ends, keys, 10_000, fast=True)
    history_records = sum(1 for m in messages if m.topic() == settings.topic("history"))
    assert 0 < rows.call_count < history_records / 2


def _ordinary_history(accounts: int, per_account: int):
    """(settings, messages, ends, keys): ordinary history entries of interleaved accounts over 4 partitions, in
    the log's order (every account's entries in seq order, the accounts mixed as transfers mix them)."""
    rng = random.Random(7)
    c = codec()
    settings = config.load().with_prefix("fastload-order.")
    topic = settings.topic("history")
    names = [f"user:{rng.randrange(10**6)}:USD" for _ in range(accounts)]
    seqs = {a: 0 for a in names}
    offsets: dict[int, int] = {}
    messages = []
    for _ in range(accounts * per_account):
        account = rng.choice([a for a in names if seqs[a] < per_account])
        seqs[account] += 1
        partition = names.index(account) % 4
        offset = offsets.get(partition, 0)
        offsets[partition] = offset + 1
        messages.append(Message(topic, partition, offset, c.encode("history", history(account, seqs[account], rng))))
    ends = {(topic, p): n for p, n in offsets.items()}
    keys = {("history", p): (0, n) for p, n in offsets.items()}
    return settings, messages, ends, keys


def _inserted_history(tmp: Path, settings, messages, ends, keys) -> tuple[list[tuple[str, int]], list]:
    """The (account, seq) of each history row in the order SQLite was asked to insert them, and the rows."""
    path = tmp / "order.db"
    sink = bulk.SqliteSink(str(path))
    order: list[tuple[str, int]] = []
    pattern = re.compile(r"INSERT INTO history \(account_id, seq,.*VALUES \('([^']*)', (\d+),", re.S)

    def traced(sql: str) -> None:
        found = pattern.match(sql)
        if found:
            order.append((found[1], int(found[2])))

    sink.conn.set_trace_callback(traced)  # SQLite's own trace: the statements stepped in C are seen too
    with mock.patch.object(bulk, "Consumer", consumer_of(messages, ends, 500)):
        bulk.load(settings, keys, sink, lambda n: None)
    sink.conn.set_trace_callback(None)
    sink.close()
    conn = sqlite3.connect(path)
    rows = conn.execute("SELECT * FROM history ORDER BY account_id, seq").fetchall()
    conn.close()
    return order, rows


@needs_build
def test_the_fast_path_inserts_history_in_key_order(tmp_path):
    """The history rows it takes reach SQLite in the table's key order (account, then seq), not the log's:
    each lands after the one before in the B-tree (docs/read-side.md measures the difference)."""
    settings, messages, ends, keys = _ordinary_history(accounts=30, per_account=20)
    order, rows = _inserted_history(tmp_path, settings, messages, ends, keys)
    assert len(order) == len(rows) == 600
    assert order == sorted(order)
    assert sorted(order) == [(r[0], r[1]) for r in rows]


@needs_build
def test_history_rows_kept_past_the_bound_are_inserted_in_runs(tmp_path):
    """With less room than the share's rows (fastload.defer_bytes), the rows kept so far are inserted each
    time it fills: key-ordered runs, and the same rows."""
    module = cdecode.load_module(fastload.SOURCE)
    settings, messages, ends, keys = _ordinary_history(accounts=30, per_account=20)
    before = module.defer_bytes()
    try:
        module.defer_bytes(20_000)  # about a hundred records
        order, rows = _inserted_history(tmp_path, settings, messages, ends, keys)
    finally:
        module.defer_bytes(before)
    runs = 1 + sum(1 for a, b in zip(order, order[1:]) if b < a)
    assert 3 <= runs <= 12, runs
    assert sorted(order) == [(r[0], r[1]) for r in rows] and len(rows) == 600


@needs_build
@pytest.mark.parametrize("seed", range(60, 68))
def test_the_fast_path_loads_what_the_python_loop_loads_in_small_runs(tmp_path, seed):
    """The seeded mixes again, with room for a few history records only: every run inserted as it fills."""
    module = cdecode.load_module(fastload.SOURCE)
    settings, messages, ends, keys = traffic(seed)
    batch = [1, 7, 10_000][seed % 3]
    python_loaded, python_tables = _load(tmp_path, settings, messages, ends, keys, batch, fast=False)
    before = module.defer_bytes()
    try:
        module.defer_bytes(300 * (seed % 4 + 1))
        fast_loaded, fast_tables = _load(tmp_path, settings, messages, ends, keys, batch, fast=True)
    finally:
        module.defer_bytes(before)
    assert python_tables["history"]
    assert fast_tables == python_tables
    assert (fast_loaded.applied, fast_loaded.skipped, fast_loaded.offsets, fast_loaded.refold) == \
        (python_loaded.applied, python_loaded.skipped, python_loaded.offsets, python_loaded.refold)


@needs_build
@pytest.mark.parametrize("seed", [43, 44, 45])
def test_a_postgresql_loaders_rows_in_small_runs_are_the_python_loops(seed):
    """With room for a few records only, the PostgreSQL loader's history and result rows are written in many
    key-ordered runs, each as it fills: the same rows as the Python loop's."""
    module = cdecode.load_module(fastload.SOURCE)
    settings, messages, ends, keys = traffic(seed)
    outcomes = []
    before = module.defer_bytes()
    try:
        module.defer_bytes(300 * (seed % 3 + 1))
        for fast in (False, True):
            sink = RowSink()
            env = {} if fast else {"LEDGER_LOADER": "python"}
            with mock.patch.object(bulk, "Consumer", consumer_of(messages, ends, 7)), \
                    mock.patch.dict("os.environ", env):
                loaded = bulk.load(settings, keys, sink, lambda n: None)
            outcomes.append(({t: sorted(rows, key=repr) for t, rows in sink.rows.items()}, loaded.applied,
                             loaded.offsets, loaded.refold))
    finally:
        module.defer_bytes(before)
    assert outcomes[1] == outcomes[0]


@needs_build
def test_a_closed_batch_refuses_to_be_used():
    batch = fastload.batch(None, codec(), {}, {}, {}, {}, set(), set(), {})
    batch.close()
    batch.close()  # twice is harmless
    for use in (lambda: batch.run([], 0), batch.flush, batch.copies, lambda: batch.history_part(1024)):
        with pytest.raises(RuntimeError, match="closed"):
            use()


@needs_build
def test_the_fast_path_inserts_results_in_key_order(tmp_path):
    """Result rows reach SQLite in the results table's key order (client, command), not the log's."""
    rng = random.Random(3)
    c = codec()
    settings = config.load().with_prefix("fastload-order.")
    topic = settings.topic("results")
    messages = [Message(topic, n % 4, n // 4, c.encode("result", result(n, rng, client_id=rng.choice(["b", "a"]),
                                                                       command_id=f"x{rng.randrange(10**9)}")))
                for n in range(400)]
    ends = {(topic, p): 100 for p in range(4)}
    keys = {("results", p): (0, 100) for p in range(4)}
    sink = bulk.SqliteSink(str(tmp_path / "r.db"))
    order: list[tuple[str, str]] = []
    pattern = re.compile(r"INSERT INTO results \(client_id, command_id,.*VALUES \('([^']*)', '([^']*)',", re.S)
    sink.conn.set_trace_callback(lambda sql: (found := pattern.match(sql)) and order.append((found[1], found[2])))
    with mock.patch.object(bulk, "Consumer", consumer_of(messages, ends, 50)):
        loaded = bulk.load(settings, keys, sink, lambda n: None)
    sink.conn.set_trace_callback(None)
    rows = sink.conn.execute("SELECT client_id, command_id FROM results").fetchall()
    sink.close()
    assert loaded.applied == 400 and len(order) == len(rows) == 400
    assert order == sorted(order)
