"""The replay loader's common case in C (projections/fastload.pyx) against the Python loop it stands in for
(broker-free): the same records, ordinary and irregular, loaded with it and without it give the same store,
row for row, and the same counts, offsets, balances, holds and refolded accounts; and neither fails on any of
them (a corrupt record is skipped and counted, so is one whose amounts are no integers).

The records are fed by a stand-in for confluent-kafka's Consumer (what `consume()` returns, in batches), so
the test exercises the hand-off between the two paths at every kind of record and at batch boundaries.
"""
from __future__ import annotations

import sqlite3
from pathlib import Path
from unittest import mock

import pytest

from projections import bulk, fastload
from projections.store import SCHEMA
from schemas.codec import codec
from tests.helpers.loader_traffic import needs_build, traffic
from tests.helpers.stub_consumer import consumer_of

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
@pytest.mark.parametrize("seed", range(40))
def test_the_fast_path_loads_what_the_python_loop_loads(tmp_path, seed, monkeypatch):
    """Seeds 30 and above: on an interpreter whose connection layout is not known, the rows are made in C and
    inserted by the sqlite3 module."""
    if seed >= 30:
        monkeypatch.setattr(fastload, "HANDLE_FIRST", ())
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
    def __init__(self):
        self.rows = {"history": [], "links": [], "results": []}
        self.finished = None

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
    """Without a SQLite connection (a PostgreSQL loader) the fast path makes the rows the loop makes, in the
    same order."""
    settings, messages, ends, keys = traffic(seed)
    outcomes = []
    for fast in (False, True):
        sink = RowSink()
        env = {} if fast else {"LEDGER_LOADER": "python"}
        with mock.patch.object(bulk, "Consumer", consumer_of(messages, ends, [1, 7, 10_000][seed % 3])), \
                mock.patch.dict("os.environ", env):
            loaded = bulk.load(settings, keys, sink, lambda n: None)
        outcomes.append((sink.rows, sink.finished, loaded.applied, loaded.skipped, loaded.offsets, loaded.balances,
                         loaded.holds, loaded.refold))
    assert outcomes[1] == outcomes[0]


@needs_build
def test_the_fast_path_takes_the_common_records(tmp_path):
    """Ordinary records are taken by the fast path: the Python loop builds rows for the rest only."""
    settings, messages, ends, keys = traffic(99, count=300)
    with mock.patch.object(bulk, "history_row", wraps=bulk.history_row) as rows:
        _load(tmp_path, settings, messages, ends, keys, 10_000, fast=True)
    history_records = sum(1 for m in messages if m.topic() == settings.topic("history"))
    assert 0 < rows.call_count < history_records / 2
