"""Why money moved, as an auditor reads it: links, metadata (rule and version), the FX rate snapshot and the
business time on every history entry, in the read store and the API, with filters by link and by flow.

Broker-free: the history and results come from real partition processors (the rules' scenario bus), are
applied to a SQLite read store as the projector applies them, and read through the API.
"""
from __future__ import annotations

import sqlite3

from fastapi.testclient import TestClient

from projections.api import create_app
from projections.store import SCHEMA_TABLES, projection_hash
from tests.helpers.hashing import assert_every_column_hashed
from tests.helpers.read_store import filled_store
from tests.rules.scenario import Scenario

OCCURRED_MS = 1_600_000_000_000


def scenario() -> Scenario:
    return (Scenario().users("alice")
            .deposit("d1", "alice", "USDT", "500", occurred_at_ms=OCCURRED_MS)
            .rate_snapshot("snap-42", "USDT", "BTC", "0.0000125")
            .fx("x1", "alice", "USDT", "BTC", "400", "0.0000125", "snap-42")
            .reversal("r1", "fx_converted:x1", "alice", "USDT")
            .reversal("r2", "deposit_confirmed:d1", "alice", "USDT"))


def test_history_entries_carry_links_metadata_rule_snapshot_and_business_time(tmp_path):
    s = scenario()
    deposit = s.history("deposit_confirmed:d1")[0]
    assert (deposit["metadata"], deposit["links"], deposit["occurred_at_ms"]) == (
        {"deposit_id": "d1", "rule": "deposit_confirmed", "rule_version": "1"}, [], OCCURRED_MS)
    assert {h["rate_snapshot_id"] for h in s.history("fx_converted:x1")} == {"snap-42"}
    reversal = s.history("reversal_requested:r1")
    assert len(reversal) == 4 and {h["rate_snapshot_id"] for h in reversal} == {"snap-42"}
    assert {tuple(h["links"]) for h in reversal} == {("fx_converted:x1",)}

    filled_store(str(tmp_path / "read.db"), s).close()
    with TestClient(create_app(str(tmp_path / "read.db"), drift_every_s=0)) as api:
        journal = api.get("/accounts/user:alice:USDT/history").json()["entries"]
        assert [(e["kind"], e["amount"]["minor"], e["rule"], e["links"]) for e in journal] == [
            ("account_opened", "0", None, []),
            ("deposit", "500000000", "deposit_confirmed", []),
            ("fx", "-400000000", "fx_converted", []),
            ("reversal", "400000000", None, ["fx_converted:x1"]),
            ("reversal", "-500000000", None, ["deposit_confirmed:d1"])]
        fx = api.get("/transactions/fx_converted:x1").json()
        assert (fx["rule"], fx["rule_version"], fx["rate_snapshot_id"], fx["kind"]) == (
            "fx_converted", "1", "snap-42", "fx")
        assert fx["metadata"]["rate"] == "0.0000125" and fx["linked_by"] == ["reversal_requested:r1"]
        deposit = api.get("/transactions/deposit_confirmed:d1").json()
        assert deposit["occurred_at_ms"] == OCCURRED_MS and deposit["linked_by"] == ["reversal_requested:r2"]

        by_link = api.get("/history", params={"link": "fx_converted:x1"}).json()
        assert by_link["transactions"] == ["reversal_requested:r1"]
        assert sorted(e["amount"]["minor"] for e in by_link["entries"]) == [
            "-400000000", "-500000", "400000000", "500000"]  # 400 USDT and 0.005 BTC back, each way
        flow = api.get("/history", params={"flow": "reversal_requested:r2"}).json()
        assert flow["transactions"] == ["deposit_confirmed:d1", "reversal_requested:r2"]
        assert [e["amount"]["minor"] for e in flow["entries"] if e["account_id"] == "user:alice:USDT"] == [
            "500000000", "-500000000"]
        assert api.get("/history").status_code == 422
        assert api.get("/history", params={"link": "nothing"}).json()["entries"] == []


def test_a_store_from_before_the_detail_columns_is_migrated_and_reads_the_same(tmp_path):
    s = scenario()
    old = str(tmp_path / "old.db")
    conn = sqlite3.connect(old)
    ddl = SCHEMA_TABLES.replace("\n    links TEXT NOT NULL DEFAULT '[]', metadata TEXT NOT NULL DEFAULT '{}', "
                                "rate_snapshot_id TEXT,", "")
    assert ddl != SCHEMA_TABLES
    conn.executescript(ddl)
    conn.close()
    migrated = filled_store(old, s)
    fresh = filled_store(str(tmp_path / "new.db"), s)
    assert projection_hash(migrated.conn) == projection_hash(fresh.conn)
    assert migrated.flow("deposit_confirmed:d1") == ["deposit_confirmed:d1", "reversal_requested:r2"]


def test_the_replay_hash_covers_the_transaction_links(new_store, tmp_path):
    """transaction_links is written by two paths (per batch, and by a bulk rebuild at its end): the hash
    covers it, equal in both databases, and a changed link or linking transaction is named by the link."""
    store = filled_store(new_store("links"), scenario())
    assert store.linked_to("fx_converted:x1") == ["reversal_requested:r1"]
    sqlite = filled_store(str(tmp_path / "sqlite.db"), scenario())
    assert projection_hash(store.conn) == projection_hash(sqlite.conn)
    sqlite.close()
    assert_every_column_hashed(store, "transaction_links", "link")
    store.close()
