"""A new SQLite store is made with pages of db.SQLITE_PAGE_SIZE, by the projector and by a bulk rebuild alike; an
existing store keeps the page size it was made with (SQLite changes it only by a VACUUM)."""
from __future__ import annotations

import sqlite3

from projections import bulk, db
from projections.store import Store


def _page_size(conn) -> int:
    return conn.execute("PRAGMA page_size").fetchone()[0]


def test_a_new_store_has_the_stores_page_size(tmp_path):
    store = Store(tmp_path / "new.db")
    try:
        assert _page_size(store.conn) == db.SQLITE_PAGE_SIZE == 16384
        assert store.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        store.close()


def test_a_bulk_rebuilds_files_have_the_stores_page_size(tmp_path):
    sink = bulk.SqliteSink(str(tmp_path / "part.db"))
    try:
        assert _page_size(sink.conn) == db.SQLITE_PAGE_SIZE
    finally:
        sink.close()


def test_an_existing_store_keeps_its_page_size_and_opens(tmp_path):
    path = tmp_path / "old.db"
    old = sqlite3.connect(path)
    old.execute("PRAGMA page_size=4096")
    old.execute("CREATE TABLE earlier (x)")
    old.commit()
    old.close()
    store = Store(path)
    try:
        assert _page_size(store.conn) == 4096
        assert store.conn.execute("SELECT count(*) FROM history").fetchone()[0] == 0  # the store's tables made
    finally:
        store.close()
