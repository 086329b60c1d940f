"""The read store's two databases behind one interface: SQLite (a file path) or PostgreSQL (a URL).

A store target is a string: `postgresql://...` (or `postgres://...`) selects PostgreSQL, anything else is a
SQLite path. Both connections offer sqlite3's interface, so the store, the API and replay have one code path:
`execute(sql, params)` with `?` placeholders, `executemany`, `executescript`, rows readable by index and by
column name (`dict(row)` works), autocommit with explicit transactions (`transaction()`).

The few dialect differences live here:
- placeholders: `?` becomes psycopg's `%s` (and a literal `%` becomes `%%`);
- DDL: `WITHOUT ROWID` is SQLite's; PostgreSQL text columns are `COLLATE "C"`, bytewise like SQLite's BINARY,
  so ORDER BY, pages and index order are the same whatever the database's locale;
- the writer's transaction: SQLite's `BEGIN IMMEDIATE` takes the single write lock at the start; PostgreSQL
  gets the same one-writer-at-a-time by locking `meta` in a mode only writers take (readers never wait);
- a consistent read of several tables: a deferred `BEGIN` (WAL keeps one snapshot until COMMIT) or a
  REPEATABLE READ transaction.
Upserts are written once as `INSERT ... ON CONFLICT`, which both databases understand.

A PostgreSQL store is one schema of a database, named by a `schema` query parameter of the URL (default
`public`): `postgresql://user@host:5433/ledger?schema=read`. A fresh store is a schema that has no tables yet,
so a replay can rebuild next to the live store in the same database.
"""
from __future__ import annotations

import re
import sqlite3
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

PG_SCHEMES = ("postgresql://", "postgres://")
SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")  # unquoted identifiers only: no quoting to get wrong
# A new SQLite store is made with 16 KiB pages (SQLite's default is 4 KiB): a history row is about 250 bytes
# and its B-tree fills four times fewer pages, each insert splitting and rebalancing less often. Measured
# (docs/read-side.md, "sixth session"): a bulk rebuild's CPU 7% lower, the projector's batch-by-batch replay of
# the same records 14% faster. A file keeps the page size it was made with (changing it takes a VACUUM), so an
# existing store is left as it is; the pragma must come before anything writes the file's header, WAL included.
SQLITE_PAGE_SIZE = 16384


def is_postgres(target: str | Path) -> bool:
    return str(target).startswith(PG_SCHEMES)


class SqliteConnection(sqlite3.Connection):
    """sqlite3 as it is, plus the dialect's transaction statements."""

    postgres = False
    begin_write = ("BEGIN IMMEDIATE",)
    begin_snapshot = ("BEGIN",)


class Row:
    """A PostgreSQL row read like sqlite3.Row: by index, by column name, `dict(row)`."""

    __slots__ = ("_values", "_index")

    def __init__(self, values: Sequence[Any], index: dict[str, int]):
        self._values, self._index = values, index

    def __getitem__(self, key: int | str) -> Any:
        return self._values[self._index[key] if isinstance(key, str) else key]

    def keys(self) -> list[str]:
        return list(self._index)


def _pg_rows(cursor):
    index: dict[str, int] = {}
    for i, column in enumerate(cursor.description or ()):
        index.setdefault(column.name, i)  # like sqlite3.Row: a repeated name reads the first column
    return lambda values: Row(values, index)


@lru_cache(maxsize=256)
def _pg_sql(sql: str) -> str:
    return sql.replace("%", "%%").replace("?", "%s")


class PgConnection:
    """A psycopg connection (autocommit) behind sqlite3's interface."""

    postgres = True
    # SHARE ROW EXCLUSIVE conflicts with itself, not with the ACCESS SHARE of readers: one writer at a time.
    begin_write = ("BEGIN", "LOCK TABLE meta IN SHARE ROW EXCLUSIVE MODE")
    begin_snapshot = ("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY",)

    def __init__(self, conn):
        self._conn = conn

    def execute(self, sql: str, params: Sequence[Any] | None = None):
        # Without parameters psycopg sends the text as it is (a `%` in a LIKE pattern stays one `%`).
        return self._conn.execute(sql) if params is None else self._conn.execute(_pg_sql(sql), params)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        with self._conn.cursor() as cur:
            cur.executemany(_pg_sql(sql), rows)

    def executescript(self, sql: str) -> None:
        self._conn.execute(sql)  # several statements: allowed without parameters

    def copy_rows(self, table: str, columns: Sequence[str], rows: Iterable[Sequence[Any]],
                  types: Sequence[str]) -> None:
        """COPY rows into a table: the bulk path (one statement, no per-row round trip or parse). Binary,
        with the columns' types (`copy_types`): the server parses no text and the client escapes none."""
        with self._conn.cursor() as cur, \
                cur.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN (FORMAT BINARY)") as copy:
            copy.set_types(types)
            for row in rows:
                copy.write_row(row)

    def copy_stream(self, table: str, columns: Sequence[str], data: bytes | Iterable[bytes]) -> None:
        """COPY a whole stream in the binary format (signature, rows, trailer) made elsewhere: the replay
        loader's rows made in C from the records' bytes, with no Python value per field. data: the stream,
        or its parts in order, each sent as it comes (none: nothing is copied)."""
        parts = iter((data,) if isinstance(data, bytes) else data)
        first = next(parts, None)
        if first is None:
            return
        with self._conn.cursor() as cur, \
                cur.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN (FORMAT BINARY)") as copy:
            copy.write(first)
            for part in parts:
                copy.write(part)

    def close(self) -> None:
        self._conn.close()


Connection = SqliteConnection | PgConnection


def display(target: str | Path) -> str:
    """The target for logs and messages: a URL's password is not printed."""
    parts = urlsplit(str(target))
    if not is_postgres(target) or parts.password is None:
        return str(target)
    return urlunsplit(parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@", 1)))


def split_schema(url: str) -> tuple[str, str]:
    """(the URL libpq understands, the store's schema): `schema` is ours, libpq would refuse it."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    schema = next((v for k, v in query if k == "schema"), "public")
    if not SCHEMA_NAME.fullmatch(schema):
        raise ValueError(f"schema {schema!r}: use lower-case letters, digits and _ (at most 63)")
    rest = urlencode([(k, v) for k, v in query if k != "schema"])
    return urlunsplit(parts._replace(query=rest)), schema


def with_schema(url: str, schema: str) -> str:
    """The same database, another schema (a fresh store next to a live one)."""
    base, _ = split_schema(url)
    parts = urlsplit(base)
    query = parse_qsl(parts.query, keep_blank_values=True) + [("schema", schema)]
    return urlunsplit(parts._replace(query=urlencode(query)))


def _pg_connect(url: str, readonly: bool) -> PgConnection:
    import psycopg
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    base, schema = split_schema(url)
    # Settings for this session only, after any options the URL brings: the store's schema first on the
    # search path, no NOTICE chatter (CREATE ... IF NOT EXISTS), readers refused any write.
    options = [conninfo_to_dict(base).get("options") or "", f"-c search_path={schema}",
               "-c client_min_messages=warning"]
    if readonly:
        options.append("-c default_transaction_read_only=on")
    conninfo = make_conninfo(base, options=" ".join(filter(None, options)))
    return PgConnection(psycopg.connect(conninfo, autocommit=True, row_factory=_pg_rows))


def connect(target: str | Path, readonly: bool = False) -> Connection:
    """A connection in autocommit mode: transactions are explicit (`transaction()`)."""
    if is_postgres(target):
        conn = _pg_connect(str(target), readonly)
        if not readonly:
            _, schema = split_schema(str(target))
            # Checked first: CREATE SCHEMA IF NOT EXISTS needs the CREATE privilege even when it exists.
            if conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = ?", (schema,)).fetchone() is None:
                conn.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
        return conn
    if readonly:
        conn = sqlite3.connect(f"file:{Path(target)}?mode=ro", uri=True, isolation_level=None,
                               check_same_thread=False, timeout=10, factory=SqliteConnection)
    else:
        conn = sqlite3.connect(str(target), isolation_level=None, check_same_thread=False, timeout=30,
                               factory=SqliteConnection)
        conn.execute(f"PRAGMA page_size={SQLITE_PAGE_SIZE}")  # a new file's; an existing one keeps its own
        conn.execute("PRAGMA journal_mode=WAL")
        # NORMAL in WAL mode loses nothing on a process crash (only on power loss, the last commits): the
        # offsets are lost together with their rows, so even then nothing is skipped or double-applied.
        conn.execute("PRAGMA synchronous=NORMAL")
    conn.row_factory = sqlite3.Row
    return conn


def copy_types(ddl: str, table: str, columns: Sequence[str]) -> list[str]:
    """The PostgreSQL types of a table's columns for a binary COPY, read from the store's DDL (its columns
    are TEXT or BIGINT)."""
    create = re.search(rf"CREATE TABLE IF NOT EXISTS {table} \((.*?);", ddl, re.S)
    declared = dict(re.findall(r"(\w+) (TEXT|BIGINT)\b", create.group(1)))
    return [{"TEXT": "text", "BIGINT": "int8"}[declared[c]] for c in columns]


def create_tables(conn: Connection, ddl: str) -> None:
    """Run the store's DDL (written for SQLite) in the connection's dialect."""
    if conn.postgres:
        ddl = re.sub(r"\bTEXT\b", 'TEXT COLLATE "C"', re.sub(r"\s*WITHOUT ROWID", "", ddl))
    conn.executescript(ddl)


@contextmanager
def transaction(conn: Connection, snapshot: bool = False) -> Iterator[None]:
    """The writer's transaction (default) or a read-only one seeing a single snapshot; any exception rolls
    back (a crash before COMMIT leaves nothing, in either database)."""
    for statement in conn.begin_snapshot if snapshot else conn.begin_write:
        conn.execute(statement)
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def exists(target: str | Path) -> bool:
    """Whether a store is there already: the SQLite file, or the schema's tables."""
    if not is_postgres(target):
        return Path(target).exists()
    _, schema = split_schema(str(target))
    conn = _pg_connect(str(target), readonly=True)
    try:
        return conn.execute("SELECT 1 FROM information_schema.tables WHERE table_schema = ? AND table_name = 'meta'",
                            (schema,)).fetchone() is not None
    finally:
        conn.close()


def drop_schema(url: str) -> None:
    """Remove a PostgreSQL store (its schema and every table in it)."""
    _, schema = split_schema(url)
    conn = _pg_connect(url, readonly=False)
    try:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    finally:
        conn.close()
