"""The read store: a SQLite or PostgreSQL projection of the balances, history and results topics.

Readers (the API, the dashboard, replay's comparison) never touch the workers' state; they read this.
A store is named by a target: a SQLite path by default, or a `postgresql://` URL (`projections/db.py`
holds the small dialect layer; the schema, the queries and the tests are the same for both).

Why it is crash-safe: `apply()` writes a batch of records AND the next offset of every partition it read
in ONE database transaction (SQLite: WAL journal, synchronous=NORMAL is durable against a process crash;
PostgreSQL: a committed transaction is durable). The
projector resumes from the stored offsets, so after a kill -9 it neither skips a record (the offsets did
not move without the rows) nor applies one twice (the rows did not land without the offsets). Applying a
record again anyway (a worker re-emitting its outputs after its own crash, or a replay over a copy) is
harmless: history and results are keyed by their ids, a balance only replaces one with a lower seq.

Why amounts are TEXT: balances are signed 128-bit integers of minor units (P9). SQLite integers are
64 bits (9.2 ETH in wei already overflows) and its SUM() falls back to REAL, a float; PostgreSQL's BIGINT is
64 bits too, and NUMERIC would be a second representation to keep exact in two dialects. So every sum is
computed in Python ints while applying, and stored as decimal strings: `account_views` (system shards
summed into `sys:x:CUR`) and `currency_sums` (Σ posted per currency) are maintained in the same
transaction instead of being SQL views.
"""
from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from projections import db
from projections.db import Connection, transaction
from projections import fold
from projections.fold import Tail, fold_holds, newer_hold, sum_shards
from streams import names, routing
from streams.core.accounting import CurrencyTrialBalance, TrialBalanceLine, default_account_type, trial_balance
from streams.core.model import AccountType
from streams.core.rejections import NOT_A_DECISION

TOPICS = ("balances", "history", "results")

# One schema for both databases (db.create_tables drops `WITHOUT ROWID` and makes text bytewise-ordered for
# PostgreSQL). BIGINT: offsets, seqs and millisecond times overflow PostgreSQL's 32-bit INTEGER; in SQLite it
# is the same 64-bit integer affinity as INTEGER.
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
-- Next offset to read per topic partition; written in the same transaction as the rows it covers.
CREATE TABLE IF NOT EXISTS offsets (topic TEXT NOT NULL, partition BIGINT NOT NULL, next_offset BIGINT NOT NULL,
    PRIMARY KEY (topic, partition));
-- End offsets the projector saw last, for the lag (not part of the projection).
CREATE TABLE IF NOT EXISTS end_offsets (topic TEXT NOT NULL, partition BIGINT NOT NULL, end_offset BIGINT NOT NULL,
    seen_at_ms BIGINT NOT NULL, PRIMARY KEY (topic, partition));
-- Latest balance record per account id as published (system accounts: one row per shard, sys:x:CUR@n).
CREATE TABLE IF NOT EXISTS accounts (account_id TEXT PRIMARY KEY, base_id TEXT NOT NULL, currency TEXT NOT NULL,
    status TEXT NOT NULL, posted TEXT NOT NULL, held TEXT NOT NULL, available TEXT NOT NULL, seq BIGINT NOT NULL,
    last_transaction_id TEXT, updated_at_ms BIGINT NOT NULL, version BIGINT NOT NULL, account_type TEXT);
CREATE INDEX IF NOT EXISTS accounts_base ON accounts (base_id);
-- The reported view: one row per account as users see it (system shards summed). seq of a system account is
-- the sum of its shards' seqs: it still grows by one per change, so it works as a version.
CREATE TABLE IF NOT EXISTS account_views (account_id TEXT PRIMARY KEY, currency TEXT NOT NULL, status TEXT NOT NULL,
    posted TEXT NOT NULL, held TEXT NOT NULL, available TEXT NOT NULL, seq BIGINT NOT NULL, shards BIGINT NOT NULL,
    last_transaction_id TEXT, updated_at_ms BIGINT NOT NULL, nonzero_since_ms BIGINT, version BIGINT NOT NULL);
CREATE INDEX IF NOT EXISTS account_views_version ON account_views (version);
CREATE TABLE IF NOT EXISTS currency_sums (currency TEXT PRIMARY KEY, posted TEXT NOT NULL);
-- The account journal: one row per history entry, entry_id = account_id#seq.
CREATE TABLE IF NOT EXISTS history (account_id TEXT NOT NULL, seq BIGINT NOT NULL, entry_id TEXT NOT NULL,
    currency TEXT NOT NULL, amount TEXT NOT NULL, posted_after TEXT NOT NULL, held_after TEXT NOT NULL,
    transaction_id TEXT, kind TEXT NOT NULL, reference TEXT, hold_id TEXT, occurred_at_ms BIGINT NOT NULL,
    at_ms BIGINT NOT NULL, command_id TEXT NOT NULL, client_id TEXT NOT NULL,
    posted_by_time TEXT NOT NULL, held_by_time TEXT NOT NULL,
    links TEXT NOT NULL DEFAULT '[]', metadata TEXT NOT NULL DEFAULT '{}', rate_snapshot_id TEXT,
    PRIMARY KEY (account_id, seq)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS history_transaction ON history (transaction_id) WHERE transaction_id IS NOT NULL;
-- Balances as of a time in one lookup each (fold.by_time): the last entry at or before T in business-time
-- order carries Σ amounts so far (posted_by_time), in log-time order the held amount then (held_by_time).
CREATE INDEX IF NOT EXISTS history_business_time ON history (account_id, occurred_at_ms, seq);
CREATE INDEX IF NOT EXISTS history_log_time ON history (account_id, at_ms, seq);
-- Which transactions link to which (a reversal or a refund to what it undoes): derived from history's links,
-- for the API's filters by link and by flow.
CREATE TABLE IF NOT EXISTS transaction_links (link TEXT NOT NULL, transaction_id TEXT NOT NULL,
    PRIMARY KEY (link, transaction_id)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS transaction_links_back ON transaction_links (transaction_id);
-- The decision for each command (duplicates answer the original and are not stored).
CREATE TABLE IF NOT EXISTS results (client_id TEXT NOT NULL, command_id TEXT NOT NULL, outcome TEXT NOT NULL,
    reason TEXT, detail TEXT NOT NULL, transaction_id TEXT, at_ms BIGINT NOT NULL, holds TEXT NOT NULL,
    PRIMARY KEY (client_id, command_id)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS results_at ON results (at_ms);
CREATE INDEX IF NOT EXISTS results_outcome ON results (outcome, reason);
CREATE INDEX IF NOT EXISTS results_transaction ON results (transaction_id) WHERE transaction_id IS NOT NULL;
CREATE TABLE IF NOT EXISTS holds (hold_id TEXT PRIMARY KEY, account_id TEXT NOT NULL, amount TEXT NOT NULL,
    captured TEXT NOT NULL, released TEXT NOT NULL, status TEXT NOT NULL, expires_at_ms BIGINT,
    updated_at_ms BIGINT NOT NULL);
CREATE INDEX IF NOT EXISTS holds_account ON holds (account_id, status);
"""

# The same DDL in two parts: a rebuild loads a fresh store's tables first and builds the secondary indexes
# once at the end (one sort instead of an index update per row).
SCHEMA_TABLES = ";\n".join(st for st in SCHEMA.split(";\n") if "CREATE INDEX" not in st) + ";\n"
SCHEMA_INDEXES = ";\n".join(st.strip() for st in SCHEMA.split(";\n") if "CREATE INDEX" in st) + ";\n"
# The bulk tables' primary keys, which a PostgreSQL rebuild adds after the rows (projections/bulk.py).
PRIMARY_KEYS = {"history": ("account_id", "seq"), "results": ("client_id", "command_id")}


def tables_without_keys(tables: Iterable[str]) -> str:
    """SCHEMA_TABLES without the primary keys of these tables (of PRIMARY_KEYS)."""
    ddl = SCHEMA_TABLES
    for table in tables:
        key = f",\n    PRIMARY KEY ({', '.join(PRIMARY_KEYS[table])})) WITHOUT ROWID"
        if ddl.count(key) != 1:
            raise ValueError(f"the schema's {table} table does not end with its primary key as expected")
        ddl = ddl.replace(key, ") WITHOUT ROWID")
    return ddl


def add_primary_key(table: str) -> str:
    return f"ALTER TABLE {table} ADD PRIMARY KEY ({', '.join(PRIMARY_KEYS[table])})"

HISTORY_FIELDS = ("account_id", "seq", "entry_id", "currency", "amount", "posted_after", "held_after",
                  "transaction_id", "kind", "reference", "hold_id", "occurred_at_ms", "at_ms", "command_id",
                  "client_id")
# The prefix folds by time (fold.by_time) kept on every history row: derived from the history rows themselves.
BY_TIME = ("posted_by_time", "held_by_time")
# Why the money moved (after BY_TIME: a store from before them gets them appended by ALTER TABLE, in this order).
DETAIL = ("links", "metadata", "rate_snapshot_id")
HISTORY_COLUMNS = HISTORY_FIELDS + BY_TIME + DETAIL
RESULT_COLUMNS = ("client_id", "command_id", "outcome", "reason", "detail", "transaction_id", "at_ms", "holds")
HOLD_COLUMNS = ("hold_id", "account_id", "amount", "captured", "released", "status", "expires_at_ms",
                "updated_at_ms")
ACCOUNT_COLUMNS = ("account_id", "base_id", "currency", "status", "posted", "held", "available", "seq",
                   "last_transaction_id", "updated_at_ms", "version", "account_type")
VIEW_COLUMNS = ("account_id", "currency", "status", "posted", "held", "available", "seq", "shards",
                "last_transaction_id", "updated_at_ms", "nonzero_since_ms", "version")


def upsert(table: str, columns: tuple[str, ...], key: tuple[str, ...], update: bool = True) -> str:
    """INSERT ... ON CONFLICT: replace the non-key columns (update) or keep the stored row. One statement
    for both databases (SQLite 3.24+, PostgreSQL 9.5+), instead of SQLite's INSERT OR REPLACE / IGNORE."""
    sql = (f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))}) "
           f"ON CONFLICT ({', '.join(key)}) DO ")
    if not update:
        return sql + "NOTHING"
    return sql + "UPDATE SET " + ", ".join(f"{c} = excluded.{c}" for c in columns if c not in key)


INSERT_HISTORY = upsert("history", HISTORY_COLUMNS, ("account_id", "seq"), update=False)
INSERT_LINK = upsert("transaction_links", ("link", "transaction_id"), ("link", "transaction_id"), update=False)
# A flow (River's word): a transaction and every transaction linked to it, either way, transitively. Bounded,
# so a pathological chain cannot make one request walk the whole ledger.
FLOW_LIMIT = 1_000


def history_detail(v: Mapping[str, Any]) -> tuple[str, str, str | None]:
    """The DETAIL columns of a decoded history record: links and metadata as canonical JSON (metadata keeps
    the order the wire gives it, sorted by key), so a live store and a rebuilt one hold the same text."""
    links, metadata = v.get("links"), v.get("metadata")
    # Most entries have neither: their text is a constant (json.dumps costs microseconds a call).
    return (json.dumps(links, separators=(",", ":")) if links else "[]",
            json.dumps(metadata, separators=(",", ":")) if metadata else "{}", v.get("rate_snapshot_id"))


def link_rows(v: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(link, transaction_id) of a decoded history record's links."""
    return [(link, v["transaction_id"]) for link in v.get("links") or () if v["transaction_id"] is not None]


def index_links(conn: Connection) -> None:
    """Rebuild transaction_links from history (a bulk load writes history rows only)."""
    rows = conn.execute("SELECT DISTINCT transaction_id, links FROM history "
                        "WHERE transaction_id IS NOT NULL AND links <> '[]'").fetchall()
    conn.executemany(INSERT_LINK, [(link, r[0]) for r in rows for link in json.loads(r[1])])
SET_BY_TIME = "UPDATE history SET posted_by_time = ?, held_by_time = ? WHERE account_id = ? AND seq = ?"
REPLACE_RESULT = upsert("results", RESULT_COLUMNS, ("client_id", "command_id"))
KEEP_RESULT = upsert("results", RESULT_COLUMNS, ("client_id", "command_id"), update=False)
REPLACE_HOLD = upsert("holds", HOLD_COLUMNS, ("hold_id",))
REPLACE_ACCOUNT = upsert("accounts", ACCOUNT_COLUMNS, ("account_id",))
# Keys per `IN (...)` query: far below SQLite's 32,766 host parameters and PostgreSQL's 65,535.
IN_CHUNK = 500
REPLACE_VIEW = upsert("account_views", VIEW_COLUMNS, ("account_id",))
REPLACE_SUM = upsert("currency_sums", ("currency", "posted"), ("currency",))
REPLACE_META = upsert("meta", ("key", "value"), ("key",))
REPLACE_END = upsert("end_offsets", ("topic", "partition", "end_offset", "seen_at_ms"), ("topic", "partition"))
# Offsets only ever move forward (a batch re-applied out of order must not move them back).
ADVANCE_OFFSET = (upsert("offsets", ("topic", "partition", "next_offset"), ("topic", "partition"))
                  + " WHERE excluded.next_offset > offsets.next_offset")


@dataclass(frozen=True, slots=True)
class Record:
    """One decoded record of a read topic (`topic` is the logical name: balances, history or results)."""

    topic: str
    partition: int
    offset: int
    value: dict[str, Any]


class PrefixMismatch(RuntimeError):
    """The store was built from another ledger's topics; mixing them would corrupt it."""


class Store:
    """The writer side (one per database: the projector) plus the queries every reader shares.

    `target`: a SQLite path, or a `postgresql://` URL (its `schema` parameter names the store's schema)."""

    # Time tails (see time_tails) the writer remembers between batches: reading them back costs three index
    # lookups per touched account per batch, which halved the projector's rate. Bounded; a miss reads them.
    TAILS_CACHED = 200_000

    def __init__(self, target: str | Path, prefix: str | None = None, readonly: bool = False):
        self.target = str(target)
        self.conn = db.connect(self.target, readonly)
        self._tails: dict[str, Tail] = {}
        self._new_tails: dict[str, Tail] = {}  # this batch's, kept only once it commits
        if not readonly:
            db.create_tables(self.conn, SCHEMA_TABLES)
            self._add_by_time_columns()
            self._add_detail_columns()
            db.create_tables(self.conn, SCHEMA_INDEXES)
            if prefix is not None:
                self._bind_prefix(prefix)

    def _add_by_time_columns(self) -> None:
        """A store written before the prefix folds by time existed gets them (computed from its history)."""
        columns = [d[0] for d in self.conn.execute("SELECT * FROM history LIMIT 0").description]
        if "posted_by_time" in columns:
            return
        with transaction(self.conn):
            for column in BY_TIME:
                self.conn.execute(f"ALTER TABLE history ADD COLUMN {column} TEXT NOT NULL DEFAULT '0'")
            refold_by_time(self.conn, [r[0] for r in self.conn.execute("SELECT DISTINCT account_id FROM history")])

    def _add_detail_columns(self) -> None:
        """A store written before history carried links, metadata and the rate snapshot, or balances their
        account type, gets the columns (empty for the rows it has: their records carried none)."""
        columns = [d[0] for d in self.conn.execute("SELECT * FROM history LIMIT 0").description]
        with transaction(self.conn):
            if "links" not in columns:
                self.conn.execute("ALTER TABLE history ADD COLUMN links TEXT NOT NULL DEFAULT '[]'")
                self.conn.execute("ALTER TABLE history ADD COLUMN metadata TEXT NOT NULL DEFAULT '{}'")
                self.conn.execute("ALTER TABLE history ADD COLUMN rate_snapshot_id TEXT")
            if "account_type" not in [d[0] for d in self.conn.execute("SELECT * FROM accounts LIMIT 0").description]:
                self.conn.execute("ALTER TABLE accounts ADD COLUMN account_type TEXT")

    def _bind_prefix(self, prefix: str) -> None:
        row = self.conn.execute("SELECT value FROM meta WHERE key = 'prefix'").fetchone()
        if row is None:
            self.conn.execute("INSERT INTO meta VALUES ('prefix', ?)", (prefix,))
        elif row[0] != prefix:
            raise PrefixMismatch(f"{db.display(self.target)} holds a projection of prefix {row[0]!r}, not {prefix!r}")

    def close(self) -> None:
        self.conn.close()

    # --- writing ------------------------------------------------------------------------------------------
    def offsets(self) -> dict[tuple[str, int], int]:
        return {(r["topic"], r["partition"]): r["next_offset"]
                for r in self.conn.execute("SELECT topic, partition, next_offset FROM offsets")}

    def apply(self, records: Iterable[Record], next_offsets: dict[tuple[str, int], int]) -> int:
        """Apply a batch and move the offsets, atomically. Returns the store version this batch wrote.

        1. Begin the writer's transaction (one writer; readers keep their snapshot).
        2. History and results: insert by id, ignoring what is already there (re-emissions are identical).
        3. Balances: collapse the batch to the highest seq per account, replace only a lower stored seq,
           keep Σ per currency exact from the old and new posted values, re-sum touched system accounts.
        4. Holds: from the results' hold states, keep the most settled state of each hold.
        5. Offsets: only ever forward. 6. COMMIT; any exception rolls everything back.
        """
        by_topic: dict[str, list[dict]] = defaultdict(list)
        for r in records:
            by_topic[r.topic].append(r.value)
        c = self.conn
        self._new_tails = {}
        try:
            with transaction(c):
                version = self._apply(c, by_topic, next_offsets)
        except BaseException:
            self._tails.clear()  # what the failed batch read or wrote may not be the database's
            raise
        if len(self._tails) + len(self._new_tails) > self.TAILS_CACHED:
            self._tails.clear()
        self._tails.update(self._new_tails)
        return version

    def _apply(self, c, by_topic: dict[str, list[dict]], next_offsets: dict[tuple[str, int], int]) -> int:
        """Steps 2-5 inside the writer's transaction."""
        version = int(c.execute("SELECT COALESCE((SELECT value FROM meta WHERE key='version'), '0')")
                      .fetchone()[0]) + 1
        c.execute(REPLACE_META, ("version", str(version)))
        if by_topic["history"]:
            self._apply_history(by_topic["history"])
        self._apply_results(by_topic["results"])
        self._apply_balances(by_topic["balances"], version)
        c.executemany(ADVANCE_OFFSET, [(t, p, o) for (t, p), o in next_offsets.items()])
        return version

    def _apply_history(self, entries: list[dict]) -> None:
        """Insert new entries (a re-emitted one is already there: kept as it is) with their prefix folds by
        time. An entry that comes after everything the account has, in seq, business time and log time (the
        usual case), extends the folds of the account's last entries; any other (back-dated, or a gap in seq
        filled late) has its account's folds recomputed from its history (`refold_by_time`)."""
        by_account: dict[str, dict[int, dict]] = defaultdict(dict)
        for v in entries:
            by_account[v["account_id"]].setdefault(v["seq"], v)
        cached = self._tails
        tails = time_tails(self.conn, [a for a in by_account if a not in cached])
        rows, refold, links = [], [], []
        for account_id, items in by_account.items():
            tail, in_order = cached.get(account_id) or tails.get(account_id), True
            for seq in sorted(items):
                v = items[seq]
                if in_order:
                    extended = fold.extend_by_time(tail, v)
                    in_order, tail = extended is not None, extended or tail
                by_time = (str(tail[2]), v["held_after"]) if in_order else ("0", "0")  # else: recomputed below
                rows.append(tuple(v[f] for f in HISTORY_FIELDS) + by_time + history_detail(v))
                if v.get("links"):
                    links += link_rows(v)
            if not in_order:
                refold.append(account_id)
                self._tails.pop(account_id, None)  # read back after the refold when next needed
            else:
                self._new_tails[account_id] = tail
        self.conn.executemany(INSERT_HISTORY, rows)
        if links:
            self.conn.executemany(INSERT_LINK, links)
        refold_by_time(self.conn, refold)

    def _apply_results(self, results: list[dict]) -> None:
        rows, conflicts = [], []
        for v in results:
            if v["duplicate"]:
                continue  # answers an original decision that is earlier in the log
            row = (v["client_id"], v["command_id"], v["outcome"], v["reason"], v["detail"], v["transaction_id"],
                   v["at_ms"], json.dumps(v["holds"], sort_keys=True))
            # An id_conflict answers a second payload under a used id: it must not replace the decision.
            (conflicts if v["reason"] in NOT_A_DECISION else rows).append(row)
        self.conn.executemany(REPLACE_RESULT, rows)
        self.conn.executemany(KEEP_RESULT, conflicts)
        holds = fold_holds(results)
        stored = {r["hold_id"]: r for r in self._rows_where_in("SELECT * FROM holds", "hold_id", list(holds))}
        rows = []
        for hold_id, h in holds.items():
            old = stored.get(hold_id)
            if old is not None and newer_hold(dict(old), h) is not h:
                continue
            rows.append((hold_id, h["account_id"], h["amount"], h["captured"], h["released"], h["status"],
                         h["expires_at_ms"], h["updated_at_ms"]))
        self.conn.executemany(REPLACE_HOLD, rows)

    def _rows_where_in(self, select: str, column: str, keys: list[str]) -> list:
        """Rows of `select` whose `column` is one of keys: one query per chunk of keys, not one per key
        (a round trip each on PostgreSQL)."""
        rows = []
        for i in range(0, len(keys), IN_CHUNK):
            chunk = keys[i:i + IN_CHUNK]
            rows += self.conn.execute(f"{select} WHERE {column} IN ({','.join('?' * len(chunk))})", chunk).fetchall()
        return rows

    def _apply_balances(self, balances: list[dict], version: int) -> None:
        latest: dict[str, dict] = {}
        for v in balances:
            seen = latest.get(v["account_id"])
            if seen is None or v["seq"] > seen["seq"]:
                latest[v["account_id"]] = v
        stored = {r["account_id"]: r for r in self._rows_where_in(
            "SELECT account_id, posted, seq FROM accounts", "account_id", list(latest))}
        sums: dict[str, int] = defaultdict(int)
        bases = set()
        rows = []
        for account_id, v in latest.items():
            old = stored.get(account_id)
            if old is not None and old["seq"] >= v["seq"]:
                continue  # already have this one or a newer one
            sums[v["currency"]] += int(v["posted"]) - (int(old["posted"]) if old is not None else 0)
            base = routing.unsharded(account_id)
            bases.add(base)
            rows.append((account_id, base, v["currency"], v["status"], v["posted"], v["held"], v["available"],
                         v["seq"], v["last_transaction_id"], v["updated_at_ms"], version, v.get("account_type")))
        self.conn.executemany(REPLACE_ACCOUNT, rows)
        for currency, delta in sums.items():
            row = self.conn.execute("SELECT posted FROM currency_sums WHERE currency = ?", (currency,)).fetchone()
            total = (int(row[0]) if row else 0) + delta
            self.conn.execute(REPLACE_SUM, (currency, str(total)))
        self._refresh_views(sorted(bases), version)

    def _refresh_views(self, bases: list[str], version: int) -> None:
        """Re-sum the reported view of each base account from its rows (one per shard for system accounts)."""
        shards: dict[str, list] = defaultdict(list)
        for row in self._rows_where_in("SELECT * FROM accounts", "base_id", bases):
            shards[row["base_id"]].append(row)
        old_views = {r["account_id"]: r for r in self._rows_where_in(
            "SELECT account_id, posted, nonzero_since_ms FROM account_views", "account_id", bases)}
        rows = []
        for base in bases:
            view = sum_shards(shards[base])
            old = old_views.get(base)
            # Since when the account holds money (log time): the age of money sitting in clearing. It depends
            # on where batches begin and end (a batch shows only its last state), so replay does not hash it.
            since = None
            if view["posted"] != 0:
                since = old["nonzero_since_ms"] if old is not None and int(old["posted"]) != 0 \
                    else view["updated_at_ms"]
            rows.append((base, view["currency"], view["status"], str(view["posted"]), str(view["held"]),
                         str(view["available"]), view["seq"], view["shards"], view["last_transaction_id"],
                         view["updated_at_ms"], since, version))
        self.conn.executemany(REPLACE_VIEW, rows)

    def record_end_offsets(self, ends: dict[tuple[str, int], int], now_ms: int) -> None:
        """Remember the end offsets seen (for the lag readers show); outside the projection proper."""
        self.conn.executemany(REPLACE_END, [(t, p, o, now_ms) for (t, p), o in ends.items()])

    # --- reading ------------------------------------------------------------------------------------------
    def version(self) -> int:
        row = self.conn.execute("SELECT value FROM meta WHERE key = 'version'").fetchone()
        return int(row[0]) if row else 0

    def lag(self) -> dict[str, int]:
        """Records behind per topic: end offset seen by the projector - next offset applied."""
        rows = self.conn.execute(
            "SELECT e.topic, SUM(CASE WHEN e.end_offset > COALESCE(o.next_offset, 0) "
            "THEN e.end_offset - COALESCE(o.next_offset, 0) ELSE 0 END) AS lag FROM end_offsets e "
            "LEFT JOIN offsets o ON o.topic = e.topic AND o.partition = e.partition GROUP BY e.topic")
        return {r["topic"]: int(r["lag"]) for r in rows}  # PostgreSQL sums BIGINT into NUMERIC

    def currency_sums(self) -> dict[str, int]:
        return {r["currency"]: int(r["posted"]) for r in self.conn.execute("SELECT * FROM currency_sums")}

    def clearing(self) -> list[dict]:
        """Money in clearing per currency and since when (log time), from the summed views."""
        rows = self.conn.execute("SELECT account_id, currency, posted, nonzero_since_ms FROM account_views "
                                 "WHERE account_id LIKE ? ORDER BY account_id", (names.CLEARING_PREFIX + "%",))
        return [{"currency": r["currency"], "posted": int(r["posted"]), "since_ms": r["nonzero_since_ms"]}
                for r in rows]

    def transfers_in_clearing(self) -> list[dict]:
        """Transactions whose money is still in clearing (their clearing entries do not sum to zero: reserved
        in one partition, not yet credited in another), one row per (transaction, currency), oldest first,
        with the log time of the transaction's first clearing entry.

        The database narrows the clearing journal to the candidates (a float sum, exact below 2^53: amounts of
        more than 15 digits are always candidates), then fold.in_clearing decides on exact integers. Cost: one
        pass over the clearing shards' journal (their primary key range), not over the whole history."""
        low, high = names.CLEARING_PREFIX, names.CLEARING_PREFIX[:-1] + chr(ord(names.CLEARING_PREFIX[-1]) + 1)
        candidates = [r[0] for r in self.conn.execute(
            "SELECT transaction_id FROM history WHERE account_id >= ? AND account_id < ? "
            "AND transaction_id IS NOT NULL GROUP BY transaction_id "
            "HAVING SUM(CAST(amount AS DOUBLE PRECISION)) <> 0 OR MAX(LENGTH(amount)) > 15", (low, high))]
        by_transaction: dict[str, list] = defaultdict(list)
        for row in self._rows_where_in("SELECT transaction_id, account_id, currency, amount, at_ms FROM history",
                                       "transaction_id", candidates):
            if row["account_id"] >= low and row["account_id"] < high:
                by_transaction[row["transaction_id"]].append(row)
        out = []
        for transaction_id, entries in by_transaction.items():
            since_ms = min(e["at_ms"] for e in entries)
            for currency, amount in sorted(fold.in_clearing(entries).items()):
                if amount:
                    out.append({"transaction_id": transaction_id, "currency": currency, "amount": amount,
                                "since_ms": since_ms})
        return sorted(out, key=lambda t: (t["since_ms"], t["transaction_id"], t["currency"]))

    def balance_rows(self, after_account: str, limit: int) -> list:
        """Published balance rows (shards as they are) after an account id, in id order: a checker's walk."""
        return self.conn.execute("SELECT * FROM accounts WHERE account_id > ? ORDER BY account_id LIMIT ?",
                                 (after_account, limit)).fetchall()

    def journal(self, account_id: str, after_seq: int, upto_seq: int) -> list:
        """An account's history entries with after_seq < seq <= upto_seq, in seq order."""
        return self.conn.execute("SELECT * FROM history WHERE account_id = ? AND seq > ? AND seq <= ? ORDER BY seq",
                                 (account_id, after_seq, upto_seq)).fetchall()

    def journal_tail(self, account_id: str, limit: int) -> list:
        """An account's last `limit` history entries, oldest first."""
        rows = self.conn.execute("SELECT seq, at_ms, posted_after, held_after FROM history WHERE account_id = ? "
                                 "ORDER BY seq DESC LIMIT ?", (account_id, limit)).fetchall()
        return rows[::-1]

    def lag_by_partition(self) -> dict[str, dict[int, int]]:
        """Records behind the topics per topic and partition (at the projector's last end check)."""
        out: dict[str, dict[int, int]] = defaultdict(dict)
        for r in self.conn.execute("SELECT e.topic AS topic, e.partition AS partition, e.end_offset AS e, "
                                   "COALESCE(o.next_offset, 0) AS n FROM end_offsets e LEFT JOIN offsets o "
                                   "ON o.topic = e.topic AND o.partition = e.partition"):
            out[r["topic"]][r["partition"]] = max(r["e"] - r["n"], 0)
        return dict(out)

    def view(self, account_id: str) -> Any:
        """The account as reported: a shard id reads its shard, any other id the (summed) view."""
        if routing.SHARD_MARK in account_id:
            return self.conn.execute("SELECT *, 1 AS shards, NULL AS nonzero_since_ms FROM accounts "
                                     "WHERE account_id = ?", (account_id,)).fetchone()
        return self.conn.execute("SELECT * FROM account_views WHERE account_id = ?", (account_id,)).fetchone()

    def account_type(self, account_id: str) -> str:
        """An account's type (a system account's from any shard), or the one its name gives when its balance
        record predates types."""
        row = self.conn.execute("SELECT account_type FROM accounts WHERE account_id = ? OR base_id = ? LIMIT 1",
                                (account_id, account_id)).fetchone()
        return row[0] if row is not None and row[0] else default_account_type(account_id).value

    def shards(self, base_id: str) -> list:
        return self.conn.execute("SELECT * FROM accounts WHERE base_id = ? ORDER BY account_id",
                                 (base_id,)).fetchall()

    def history_page(self, account_id: str, after_seq: int, limit: int) -> list:
        """Up to `limit` history entries of an account after seq `after_seq`, oldest first."""
        return self.conn.execute("SELECT * FROM history WHERE account_id = ? AND seq > ? ORDER BY seq LIMIT ?",
                                 (account_id, after_seq, limit)).fetchall()

    def entry_at_seq(self, account_id: str, seq: int) -> Any:
        """The account's last history entry at or before seq (None before its first)."""
        return self.conn.execute("SELECT * FROM history WHERE account_id = ? AND seq <= ? ORDER BY seq DESC LIMIT 1",
                                 (account_id, seq)).fetchone()

    def balance_as_of_ms(self, account_id: str, as_of_ms: int) -> tuple[int, int]:
        """(posted, held) of an account (summed over its shards) at a time, as `fold.as_of_ms` defines them:
        posted is the sum of the legs with business time `occurred_at_ms` <= as_of_ms (back-dated entries count
        where they belong); held has no business time, so it is the held amount recorded (log time `at_ms`) by
        then. Two index lookups per shard (history_business_time, history_log_time), whatever the history's
        length: the rows carry their prefix folds (`posted_by_time`, `held_by_time`)."""
        posted = held = 0
        for shard in [s["account_id"] for s in self.shards(account_id)] or [account_id]:
            row = self.conn.execute("SELECT posted_by_time FROM history WHERE account_id = ? AND occurred_at_ms <= ? "
                                    "ORDER BY occurred_at_ms DESC, seq DESC LIMIT 1", (shard, as_of_ms)).fetchone()
            posted += int(row[0]) if row else 0
            row = self.conn.execute("SELECT held_by_time FROM history WHERE account_id = ? AND at_ms <= ? "
                                    "ORDER BY at_ms DESC, seq DESC LIMIT 1", (shard, as_of_ms)).fetchone()
            held += int(row[0]) if row else 0
        return posted, held

    def trial_balance(self, as_of_ms: int | None = None) -> tuple[CurrencyTrialBalance, ...]:
        """Every account with a balance (now, or as of a business time: `balance_as_of_ms`), system accounts
        summed over their shards, totalled by currency and account type (streams/core/accounting.py). An
        account whose balance record predates types gets the type its name says."""
        posted: dict[str, int] = defaultdict(int)
        kind: dict[str, tuple[str, AccountType]] = {}
        for r in self.conn.execute("SELECT account_id, base_id, currency, posted, account_type FROM accounts"):
            if as_of_ms is None:
                posted[r["base_id"]] += int(r["posted"])
            else:
                posted[r["base_id"]] += self.balance_as_of_ms(r["account_id"], as_of_ms)[0]
            kind[r["base_id"]] = (r["currency"], AccountType(r["account_type"]) if r["account_type"]
                                  else default_account_type(r["base_id"]))
        return trial_balance(TrialBalanceLine(base, kind[base][0], kind[base][1], total)
                             for base, total in posted.items() if total)

    def linked_to(self, transaction_id: str) -> list[str]:
        """The transactions whose links name transaction_id (its reversals, refunds ...), by id."""
        return [r[0] for r in self.conn.execute(
            "SELECT transaction_id FROM transaction_links WHERE link = ? ORDER BY transaction_id", (transaction_id,))]

    def flow(self, transaction_id: str) -> list[str]:
        """transaction_id and every transaction linked to it either way, transitively (at most FLOW_LIMIT),
        sorted by id."""
        seen, todo = {transaction_id}, [transaction_id]
        while todo and len(seen) < FLOW_LIMIT:
            tx = todo.pop()
            near = self.linked_to(tx) + [r[0] for r in self.conn.execute(
                "SELECT link FROM transaction_links WHERE transaction_id = ?", (tx,))]
            for other in near:
                if other not in seen and len(seen) < FLOW_LIMIT:
                    seen.add(other)
                    todo.append(other)
        return sorted(seen)

    def entries_of(self, transaction_ids: list[str]) -> list:
        """The history entries of these transactions, in log order."""
        return sorted(self._rows_where_in("SELECT * FROM history", "transaction_id", transaction_ids),
                      key=lambda r: (r["at_ms"], r["transaction_id"], r["account_id"], r["seq"]))

    def holds_of(self, account_id: str, open_only: bool) -> list:
        """The holds on an account (only the open ones with open_only), by hold id."""
        sql = "SELECT * FROM holds WHERE account_id = ?" + (" AND status = 'open'" if open_only else "")
        return self.conn.execute(sql + " ORDER BY hold_id", (account_id,)).fetchall()

    def transaction(self, transaction_id: str, client_id: str | None = None) -> tuple[list, list]:
        """(history entries, results) of a transaction; with client_id, only that client's and the engine's steps
        of that client's transactions (transaction ids are chosen by each client, so two may use one).
        A rejected command carries no transaction id: when nothing has the id, a rejected command of that id
        (clients usually use one for both) is the answer."""
        where, args = "transaction_id = ?", [transaction_id]
        if client_id is not None:  # the client's own rows, and the engine's steps of its transactions
            where += " AND (client_id = ? OR (client_id = ? AND substr(command_id, 1, ?) = ?))"
            args += [client_id, routing.ENGINE_CLIENT, len(client_id) + 1, names.transaction_key(client_id, "")]
        entries = self.conn.execute(f"SELECT * FROM history WHERE {where} ORDER BY at_ms, account_id, seq",
                                    args).fetchall()
        results = self.conn.execute(f"SELECT * FROM results WHERE {where} ORDER BY at_ms", args).fetchall()
        if not entries and not results:
            results = self.conn.execute(f"SELECT * FROM results WHERE {where.replace('transaction_id', 'command_id')}"
                                        " AND outcome = 'rejected'", args).fetchall()
        return entries, results

    def result(self, client_id: str, command_id: str) -> Any:
        """The decision for a command (None if the store has none)."""
        return self.conn.execute("SELECT * FROM results WHERE client_id = ? AND command_id = ?",
                                 (client_id, command_id)).fetchone()

    def recent_views(self, limit: int) -> list:
        """The most recently changed account views (the dashboard's first page)."""
        return self.conn.execute("SELECT * FROM account_views ORDER BY updated_at_ms DESC, account_id LIMIT ?",
                                 (limit,)).fetchall()

    def views_since(self, version: int, limit: int = 500) -> list:
        """Account views written by a batch after store version `version`, oldest batch first."""
        return self.conn.execute("SELECT * FROM account_views WHERE version > ? ORDER BY version LIMIT ?",
                                 (version, limit)).fetchall()

    def views_between(self, after: int, upto: int) -> list:
        """Account views last written by a batch after store version `after`, up to `upto`, oldest batch first
        (a view rewritten meanwhile by a later batch comes with that batch instead: nothing is missed)."""
        return self.conn.execute("SELECT * FROM account_views WHERE version > ? AND version <= ? "
                                 "ORDER BY version, account_id", (after, upto)).fetchall()

    def account_count(self) -> int:
        return self.conn.execute("SELECT count(*) FROM account_views").fetchone()[0]

    # --- reading: results for the dashboard and /metrics --------------------------------------------------
    def outcomes(self) -> list[dict]:
        """Decided commands per (outcome, reason)."""
        rows = self.conn.execute("SELECT outcome, reason, count(*) AS n FROM results GROUP BY outcome, reason")
        return [{"outcome": r["outcome"], "reason": r["reason"], "count": r["n"]} for r in rows]

    def recent_rejections(self, limit: int = 12) -> list[dict]:
        """The latest rejections of clients' commands (engine steps aside), newest first."""
        return [dict(r) for r in self.conn.execute(
            "SELECT client_id, command_id, reason, detail, at_ms FROM results WHERE outcome = 'rejected' "
            "AND client_id != ? ORDER BY at_ms DESC LIMIT ?", (routing.ENGINE_CLIENT, limit))]

    def newest_result_ms(self) -> int | None:
        return self.conn.execute("SELECT max(at_ms) FROM results").fetchone()[0]

    def results_per_second(self, since_ms: int) -> dict[tuple[int, str], int]:
        """Clients' decided commands (not engine steps) per (second of log time, outcome) from since_ms on."""
        return {(r["s"], r["outcome"]): r["n"] for r in self.conn.execute(
            "SELECT at_ms / 1000 AS s, outcome, count(*) AS n FROM results WHERE at_ms >= ? AND client_id != ? "
            "GROUP BY s, outcome", (since_ms, routing.ENGINE_CLIENT))}


# --- prefix folds by time (balances as of a time) -----------------------------------------------------------


def time_tails(conn: Connection, accounts: list[str]) -> dict[str, Tail]:
    """account -> (highest seq, (occurred_at_ms, seq) of its last entry in business time, that entry's
    posted_by_time, (at_ms, seq) of its last entry in log time), for the accounts that have history."""
    tails: dict[str, Tail] = {}
    if conn.postgres:  # one round trip per chunk, each part an index lookup
        for i in range(0, len(accounts), IN_CHUNK):
            for r in conn.execute(
                    "SELECT a.id, m.seq, o.occurred_at_ms, o.seq, o.posted_by_time, l.at_ms, l.seq "
                    "FROM unnest(?::text[]) AS a(id) "
                    "CROSS JOIN LATERAL (SELECT max(seq) AS seq FROM history WHERE account_id = a.id COLLATE \"C\") m "
                    "JOIN LATERAL (SELECT occurred_at_ms, seq, posted_by_time FROM history WHERE account_id = "
                    "a.id COLLATE \"C\" ORDER BY occurred_at_ms DESC, seq DESC LIMIT 1) o ON true "
                    "JOIN LATERAL (SELECT at_ms, seq FROM history WHERE account_id = a.id COLLATE \"C\" "
                    "ORDER BY at_ms DESC, seq DESC LIMIT 1) l ON true", (accounts[i:i + IN_CHUNK],)):
                tails[r[0]] = (r[1], (r[2], r[3]), int(r[4]), (r[5], r[6]))
        return tails
    for account_id in accounts:  # in process: three index lookups cost microseconds
        top = conn.execute("SELECT max(seq) FROM history WHERE account_id = ?", (account_id,)).fetchone()[0]
        if top is None:
            continue
        o = conn.execute("SELECT occurred_at_ms, seq, posted_by_time FROM history WHERE account_id = ? "
                         "ORDER BY occurred_at_ms DESC, seq DESC LIMIT 1", (account_id,)).fetchone()
        a = conn.execute("SELECT at_ms, seq FROM history WHERE account_id = ? ORDER BY at_ms DESC, seq DESC LIMIT 1",
                         (account_id,)).fetchone()
        tails[account_id] = (top, (o[0], o[1]), int(o[2]), (a[0], a[1]))
    return tails


def refold_by_time(conn: Connection, accounts: Iterable[str]) -> int:
    """Recompute the prefix folds by time of every history row of these accounts (after a back-dated entry
    or a late one); O(entries of the account), only for entries that arrive out of order. Returns the rows
    changed."""
    changed = 0
    for account_id in accounts:
        rows = conn.execute("SELECT seq, amount, held_after, occurred_at_ms, at_ms, posted_by_time, held_by_time "
                            "FROM history WHERE account_id = ?", (account_id,)).fetchall()
        folds = fold.by_time(rows)
        updates = [(str(p), str(h), account_id, r["seq"]) for r in rows
                   for p, h in [folds[r["seq"]]] if (str(p), str(h)) != (r["posted_by_time"], r["held_by_time"])]
        conn.executemany(SET_BY_TIME, updates)
        changed += len(updates)
    return changed


# --- canonical hash (P7) ------------------------------------------------------------------------------------
# What replay hashes: every table the readers read, every column but two that record how the rows were
# applied rather than what the topics say (`version`: the batch that wrote the row; `nonzero_since_ms`: a
# batch shows only its last state, so it depends on where batches begin and end), and the prefix folds by
# time (BY_TIME: recomputed from the hashed history columns). transaction_links is derived from history's
# links too, but it is written by two paths (the projector per batch, a bulk rebuild at the end: index_links),
# so it is hashed: a rebuild that missed a link would answer /history?link= differently. Not hashed at all:
# the bookkeeping tables, meta (store version, topic prefix), offsets (where the projector is: replay compares
# stores at equal offsets) and end_offsets (what the projector last saw of the topics, for the lag).
BOOKKEEPING = ("meta", "offsets", "end_offsets")
UNHASHED = ("version", "nonzero_since_ms") + BY_TIME
HASHED = {
    "accounts": tuple(c for c in ACCOUNT_COLUMNS if c not in UNHASHED),
    "account_views": tuple(c for c in VIEW_COLUMNS if c not in UNHASHED),
    "currency_sums": ("currency", "posted"),
    "history": HISTORY_FIELDS + DETAIL,
    "transaction_links": ("link", "transaction_id"),
    "results": RESULT_COLUMNS,
    "holds": HOLD_COLUMNS,
}
DigestKey = tuple[str, str]  # (what: account, currency, link, result or hold; its id)


def _digest(doc: Any) -> str:
    return hashlib.sha256(json.dumps(doc, separators=(",", ":")).encode()).hexdigest()


def _rows(conn: Connection, table: str) -> Iterator[list]:
    for row in conn.execute(f"SELECT {', '.join(HASHED[table])} FROM {table}"):
        yield [row[c] for c in HASHED[table]]


def digests(conn: Connection) -> Iterator[tuple[DigestKey, str]]:
    """((what, id), sha256) for everything the store projects, in key order:
    - ("account", id): its balance row (a shard's or an account's, as published), its reported view (system
      accounts: the base id sums the shards) and every history entry, so a mismatch names the account;
    - ("currency", code): Σ posted; ("link", transaction id): the transactions whose links name it, sorted;
      ("result", "client_id/command_id"): the decision; ("hold", id): its state.
    Each as canonical JSON of values, so two stores hash equal exactly when they project the same records,
    whichever database holds them (both return ints and strings for the same rows)."""
    accounts = {r[0]: r for r in _rows(conn, "accounts")}
    views = {r[0]: r for r in _rows(conn, "account_views")}
    entries: dict[str, list] = defaultdict(list)
    for r in _rows(conn, "history"):
        entries[r[0]].append(r)
    keyed: list[tuple[DigestKey, str]] = []
    for account_id in set(accounts) | set(views) | set(entries):
        doc = {"account": accounts.get(account_id), "view": views.get(account_id),
               "history": sorted(entries.get(account_id, []), key=lambda e: e[1])}
        keyed.append((("account", account_id), _digest(doc)))
    keyed += [(("currency", r[0]), _digest(r)) for r in _rows(conn, "currency_sums")]
    linked_by: dict[str, list[str]] = defaultdict(list)
    for link, transaction_id in _rows(conn, "transaction_links"):
        linked_by[link].append(transaction_id)
    keyed += [(("link", link), _digest(sorted(ids))) for link, ids in linked_by.items()]
    keyed += [(("result", f"{r[0]}/{r[1]}"), _digest(r)) for r in _rows(conn, "results")]
    keyed += [(("hold", r[0]), _digest(r)) for r in _rows(conn, "holds")]
    yield from sorted(keyed)


def digests_hash(items: Iterable[tuple[DigestKey, str]]) -> str:
    """One hash over digests given in key order."""
    total = hashlib.sha256()
    for (what, key), digest in items:
        total.update(f"{what}\0{key}\0{digest}\n".encode())
    return total.hexdigest()


def projection_hash(conn: Connection) -> str:
    """One hash over everything a store projects (see HASHED)."""
    return digests_hash(digests(conn))


def first_difference(left: Mapping[DigestKey, str], right: Mapping[DigestKey, str]) -> DigestKey | None:
    """The first (what, id) in key order whose digest differs between two stores, else None."""
    for key in sorted(set(left) | set(right)):
        if left.get(key) != right.get(key):
            return key
    return None
