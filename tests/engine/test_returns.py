"""Returns and chargebacks through the broker: a partial return, a chargeback after the money was spent (the
rest overdrawn into the user's receivable, opened by the worker), an over-return and an unknown payment refused,
and the oracles after. Each decision rule has its table-driven case in tests/core/test_scenarios.py."""
from __future__ import annotations

from connectors.client import LedgerClient, Leg
from projections.topics import read_topic
from projections.verify import format_report, verify, wait_quiescent
from tests.helpers.results import outcome
from tests.helpers.topics import latest_balances


def test_a_chargeback_after_the_money_is_spent_overdraws_into_the_receivable(settings, start_worker):
    start_worker(extra_env={"LEDGER_TICK_S": "0"})
    gateway = LedgerClient(settings, "gateway")
    try:
        ids = [gateway.open_account("user:bo:USD", "USD"),
               gateway.post("dep-1", [Leg("sys:world:USD", -10_000), Leg("user:bo:USD", 10_000)], kind="deposit"),
               gateway.return_payment("ret-1", "dep-1", "user:bo:USD", "sys:world:USD", 3_000),
               gateway.post("wd-1", [Leg("user:bo:USD", -6_500), Leg("sys:world:USD", 6_500)], kind="withdrawal"),
               gateway.return_payment("cb-1", "dep-1", "user:bo:USD", "sys:world:USD", 7_000, kind="chargeback"),
               gateway.return_payment("cb-2", "dep-1", "user:bo:USD", "sys:world:USD", 1, kind="chargeback"),
               gateway.return_payment("cb-3", "dep-404", "user:bo:USD", "sys:world:USD", 1, kind="chargeback")]
        results = gateway.wait(ids)
        assert [outcome(results[i]) for i in ids] == ["accepted"] * 5 + ["exceeds_unreturned", "unknown_transaction"]
        balances = latest_balances(settings)
        assert (balances["user:bo:USD"]["posted"], balances["user:bo:receivable.USD"]["posted"]) == ("0", "-6500")
        assert balances["user:bo:receivable.USD"]["account_type"] == "asset"
        chargeback = [r.value for r in read_topic(settings, "history") if r.value["transaction_id"] == "cb-1"]
        assert sorted((h["account_id"].split("@")[0], h["amount"], tuple(h["links"]), h["kind"]) for h in chargeback) == [
            ("sys:world:USD", "7000", ("dep-1",), "chargeback"),
            ("user:bo:USD", "-500", ("dep-1",), "chargeback"),
            ("user:bo:receivable.USD", "-6500", ("dep-1",), "chargeback")]
        assert wait_quiescent(settings)
        report = verify(settings)
        assert report.ok, format_report(report)
    finally:
        gateway.close()
