"""The trial balance over the read store and through the API, as of a business time, with exact numbers."""
from __future__ import annotations

from fastapi.testclient import TestClient

from projections.api import create_app
from projections.reports import parse_as_of
from tests.helpers.bus import START_MS
from tests.helpers.read_store import filled_store
from tests.rules.scenario import Scenario

JAN_10 = parse_as_of("2023-01-10T09:00:00Z")  # business times before the bus's log times (2023-11)


def test_trial_balance_now_and_as_of_a_date(tmp_path):
    s = (Scenario().users("alice", "bob")
         .deposit("d-alice", "alice", "USDT", "40000", occurred_at_ms=JAN_10)
         .deposit("d-bob", "bob", "BTC", "0.2")
         .order_placed("bid-1", "alice", "buy", "0.5", "60000")
         .order_placed("ask-1", "bob", "sell", "0.2", "59900")
         .trade("fill-1", "0.2", "59900", buyer=("alice", "bid-1"), seller=("bob", "ask-1"),
                fees=("0.001", "0.001")))
    path = str(tmp_path / "read.db")
    filled_store(path, s).close()
    with TestClient(create_app(path, drift_every_s=0)) as api:
        now = api.get("/reports/trial-balance").json()
        assert now["balanced"] and now["as_of_ms"] is None
        usdt = next(c for c in now["currencies"] if c["currency"] == "USDT")
        accounts = {a["account_id"]: (a["account_type"], a["debit"]["decimal"], a["credit"]["decimal"],
                                      a["balance"]["decimal"]) for a in usdt["accounts"]}
        assert accounts == {
            "sys:custody:USDT": ("asset", "40000.000000", "0.000000", "40000.000000"),   # reads +40,000
            "sys:fees:USDT": ("revenue", "0.000000", "11.980000", "11.980000"),
            "user:alice:USDT": ("liability", "0.000000", "28020.000000", "28020.000000"),
            "user:bob:USDT": ("liability", "0.000000", "11968.020000", "11968.020000")}
        assert [(t["account_type"], t["normal_balance"], t["balance"]["decimal"]) for t in usdt["types"]] == [
            ("asset", "debit", "40000.000000"), ("liability", "credit", "39988.020000"),
            ("revenue", "credit", "11.980000")]
        assert (usdt["debit"]["decimal"], usdt["credit"]["decimal"]) == ("40000.000000", "40000.000000")

        # As of the day of alice's back-dated deposit: only it (the rest was posted in November).
        day = api.get("/reports/trial-balance", params={"as_of": "2023-01-10"}).json()
        assert [c["currency"] for c in day["currencies"]] == ["USDT"]
        assert [(a["account_id"], a["balance"]["minor"]) for a in day["currencies"][0]["accounts"]] == [
            ("sys:custody:USDT", "40000000000"), ("user:alice:USDT", "40000000000")]
        assert api.get("/reports/trial-balance", params={"as_of": "2023-01-09"}).json()["currencies"] == []
        before = api.get("/reports/trial-balance", params={"as_of": str(START_MS - 1)}).json()
        assert before["as_of_ms"] == START_MS - 1 and len(before["currencies"]) == 1
        bad = api.get("/reports/trial-balance", params={"as_of": "last tuesday"})
        assert bad.status_code == 422 and bad.json()["error"]["code"] == "invalid_parameter"


def test_as_of_parsing():
    assert parse_as_of("2026-11-30") == 1796083199999  # the last millisecond of the day, UTC
    assert parse_as_of("2026-11-30T00:00:00Z") == 1795996800000 == parse_as_of("2026-11-30T01:00:00+01:00")
    assert parse_as_of("1795996800000") == 1795996800000
