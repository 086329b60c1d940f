"""Tampering with one column of a read store, to show the replay hash sees it (P7)."""
from __future__ import annotations

from projections.db import transaction
from projections.store import HASHED, UNHASHED, Store, DigestKey, digests, first_difference


class _Undo(Exception):
    """Rolls a tampering back."""


def digests_with(store: Store, table: str, column: str) -> dict[DigestKey, str]:
    """The store's digests with one value of table.column changed (in a transaction rolled back afterwards)."""
    seen = {}
    try:
        with transaction(store.conn):
            row = store.conn.execute(f"SELECT {column} FROM {table} WHERE {column} IS NOT NULL LIMIT 1").fetchone()
            if row is None:  # NULL in every row (holds without expiry): give one a value
                other = 1 if column.endswith("_ms") else "~"
                changed = store.conn.execute(f"UPDATE {table} SET {column} = ? WHERE {column} IS NULL", (other,))
            else:
                other = row[0] + 10**12 if isinstance(row[0], int) else row[0] + "~"  # far off: no key collides
                changed = store.conn.execute(f"UPDATE {table} SET {column} = ? WHERE {column} = ?", (other, row[0]))
            assert changed.rowcount >= 1, (table, column)
            seen = dict(digests(store.conn))
            raise _Undo
    except _Undo:
        pass
    return seen


def assert_every_column_hashed(store: Store, table: str, named_by: str) -> None:
    """Every column of a (non-empty) table is hashed or named unhashed; changing a hashed one changes the
    digests and names the row's `named_by` (account, currency, link, result, hold); an unhashed one does not."""
    clean = dict(digests(store.conn))
    row = store.conn.execute(f"SELECT * FROM {table} LIMIT 1").fetchone()
    assert row is not None, f"{table} is empty: nothing to tamper with"
    columns = row.keys()
    assert set(columns) == set(HASHED[table]) | (set(UNHASHED) & set(columns)), table
    for column in columns:
        changed = digests_with(store, table, column)
        if column in UNHASHED:
            assert changed == clean, (table, column)
        else:
            assert first_difference(clean, changed)[0] == named_by, (table, column)
    assert dict(digests(store.conn)) == clean  # every change was rolled back
