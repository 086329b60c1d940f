"""The replay loader's common case in C (projections/fastload.pyx) against the Python loop it stands in for
(broker-free): the same records, ordinary and irregular, loaded with it and without it give the same store,
row for row, and the same counts, offsets, balances, holds and refolded accounts; and neither fails on any of
them (a corrupt record is skipped and counted, so is one whose amounts are no integers).

The records are fed by a stand-in for confluent-kafka's Consumer (what `consume()` returns, in batches), so
the test exercises the hand-off between the two paths at every kind of record and at batch boundaries.
"""
from __future__ import annotations

import random
import sqlite3
from pathlib import Path
from unittest import mock

import pytest

from projections import bulk, fastload
from projections.store import SCHEMA
from schemas import cdecode
from schemas.codec import codec
from streams import config
from tests.helpers.stub_consumer import Message, consumer_of

BUILT = cdecode.load_module(fastload.SOURCE) is not None
needs_build = pytest.mark.skipif(not BUILT, reason="the fast path is not built on this machine (no C compiler)")


def _history(account, seq, rng, **over):
    at = 1_000_000 + seq * 10 + rng.randrange(3)
    v = {"entry_id": f"{account}#{seq}", "account_id": account, "currency": "USD", "seq": seq,
         "amount": str(rng.randrange(-500, 500)), "posted_after": str(seq), "held_after": str(rng.randrange(3)),
         "transaction_id": rng.choice([None, f"t{seq}{account}"]), "kind": rng.choice(["deposit", "transfer"]),
         "reference": rng.choice([None, "ref"]), "hold_id": rng.choice([None, "h1"]), "occurred_at_ms": at,
         "at_ms": at, "command_id": f"c{seq}", "client_id": "app", "links": [], "metadata": {},
         "rate_snapshot_id": rng.choice([None, "fx1"])}
    v.update(over)
    return v


def _result(n, rng, **over):
    v = {"command_id": f"cmd{n}", "client_id": rng.choice(["app", "other"]),
         "outcome": rng.choice(["accepted", "rejected"]), "reason": rng.choice([None, "insufficient_funds"]),
         "detail": rng.choice(["", "why"]), "duplicate": False, "transaction_id": rng.choice([None, f"t{n}"]),
         "at_ms": 2_000_000 + n, "holds": []}
    v.update(over)
    return v


def _balance(account, seq):
    return {"account_id": account, "currency": "USD", "status": "open", "posted": str(seq), "held": "0",
            "available": str(seq), "seq": seq, "last_transaction_id": None, "updated_at_ms": 3_000_000 + seq}


def _irregular_history(account, seq, rng):
    """A history entry the fast path must hand back (or take exactly as the loop would)."""
    case = rng.randrange(13)
    if case == 0:
        return _history(account, seq, rng, links=["x1", "x2"])
    if case == 1:
        return _history(account, seq, rng, metadata={"rule": "fee", "a": "b"})
    if case == 2:
        return _history(account, seq, rng, kind="dépôt")
    if case == 3:
        return _history(account, seq, rng, amount="12345678901234567890")  # beyond 64 bits
    if case == 4:
        return _history(account, seq, rng, amount=rng.choice(["007", "-0", "+5", " 5", "1_000",
                                                               "-999999999999999999"]))
    if case == 5:
        return _history(account, seq, rng, amount="9223372036854775807")  # the sum overflows 64 bits next
    if case == 6:
        return _history(account, seq, rng, occurred_at_ms=1)  # back-dated
    if case == 7:
        return _history(account, seq, rng, at_ms=1, occurred_at_ms=1)
    if case == 8:
        return _history(account, seq, rng, occurred_at_ms=1_000_000 + seq * 10)  # a tie in business time
    if case == 9:
        return _history(account, seq, rng, reference="réf")
    if case == 10:
        return _history(account, seq, rng, amount="99999999999999999")
    if case == 11:
        return _history(account, seq, rng, **rng.choice([{"amount": "abc"}, {"held_after": "x"},
                                                          {"posted_after": ""}, {"amount": "1" * 5000}]))
    return _history(account, seq, rng, currency="EUR", held_after="-7")


def _corrupt(value: bytes, rng) -> bytes | None:
    case = rng.randrange(7)
    if case == 0:
        return value[:rng.randrange(len(value))]
    if case == 1:
        return value + b"\x00"
    if case == 2:
        i = rng.randrange(10, len(value))
        return value[:i] + bytes([rng.randrange(256)]) + value[i + 1:]
    if case == 3:
        return None
    if case == 4:
        return b"\xc3\x01" + bytes(rng.randrange(256) for _ in range(rng.randrange(30)))
    if case == 5:
        return value[:12] + b"\xff\xfe" + value[14:]
    return value[:10] + b"\x80" * 12


def _traffic(seed: int, count: int = 600):
    """(messages, ends, keys) of one seeded mix over 4 partitions of each topic."""
    rng = random.Random(seed)
    c = codec()
    settings = config.load().with_prefix("fastload-test.")
    accounts = [f"user:{i}:USD" for i in range(12)] + ["user:é:USD"]
    seqs = {a: 0 for a in accounts}
    offsets: dict[tuple[str, int], int] = {}
    messages = []

    def put(logical, partition, value, error=None):
        topic = settings.topic(logical)
        offset = offsets.get((topic, partition), 0)
        offsets[(topic, partition)] = offset + 1
        messages.append(Message(topic, partition, offset, value, error))

    results_seen = []
    for n in range(count):
        kind = rng.random()
        account = rng.choice(accounts)
        partition = accounts.index(account) % 4
        if kind < 0.5:
            roll = rng.random()
            if roll < 0.7 or seqs[account] == 0:
                seqs[account] += 1
                seq = seqs[account]
                v = _history(account, seq, rng) if rng.random() < 0.8 else _irregular_history(account, seq, rng)
            elif roll < 0.8:
                seq = rng.randrange(1, seqs[account] + 1)  # a re-emission
                v = _history(account, seq, rng)
            elif roll < 0.9:
                seqs[account] += 2  # a gap, filled later (or never)
                v = _history(account, seqs[account], rng)
            else:
                v = _history(account, rng.randrange(1, seqs[account] + 3), rng)
            value = c.encode("history", v)
            if rng.random() < 0.05:
                value = _corrupt(value, rng)
            put("history", partition, value)
        elif kind < 0.8:
            roll = rng.random()
            if roll < 0.15 and results_seen:
                v = dict(rng.choice(results_seen), duplicate=rng.random() < 0.5, outcome="rejected",
                         reason=rng.choice(["id_conflict", "insufficient_funds"]))  # a retry answered again
            elif roll < 0.25:
                v = _result(n, rng, holds=[{"hold_id": f"h{n % 5}", "account_id": account, "amount": "10",
                                            "captured": rng.choice([str(rng.randrange(5))] * 9 + ["?"]),
                                            "released": "0",
                                            "status": rng.choice(["open", "captured"]), "expires_at_ms": None}])
            elif roll < 0.3:
                v = _result(n, rng, detail="naïve")
            else:
                v = _result(n, rng, duplicate=rng.random() < 0.1)
            results_seen.append(v)
            value = c.encode("result", v)
            if rng.random() < 0.05:
                value = _corrupt(value, rng)
            put("results", rng.randrange(4), value)
        elif kind < 0.97:
            balance = _balance(account, rng.randrange(1, 20))
            if rng.random() < 0.03:
                balance["held"] = "1e3"  # no integer: skipped by both (fold.unfoldable)
            value = c.encode("balance", balance)
            if rng.random() < 0.05:
                value = _corrupt(value, rng)
            put("balances", partition, value)
        else:
            put(rng.choice(["history", "results"]), rng.randrange(4), b"x", error="a consumer error")
    names = {settings.topic(t): t for t in bulk.SCHEMA_OF}
    # Some partitions end before their last records (a rebuild to given offsets): those are not loaded.
    keys = {(names[t], p): (0, end - (1 if rng.random() < 0.3 else 0)) for (t, p), end in offsets.items()}
    return settings, messages, offsets, keys


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
    settings, messages, ends, keys = _traffic(seed)
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
    settings, messages, ends, keys = _traffic(seed)
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
    settings, messages, ends, keys = _traffic(99, count=300)
    with mock.patch.object(bulk, "history_row", wraps=bulk.history_row) as rows:
        _load(tmp_path, settings, messages, ends, keys, 10_000, fast=True)
    history_records = sum(1 for m in messages if m.topic() == settings.topic("history"))
    assert 0 < rows.call_count < history_records / 2
