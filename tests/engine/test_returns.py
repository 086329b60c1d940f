"""Returns and chargebacks through the broker: a partial return, a chargeback after the money was spent (the
rest overdrawn into the user's receivable, opened by the worker), an over-return and an unknown payment refused,
a settled deposit in transit charged back through the rules (deposit_charged_back), a payment between users
of two partitions returned after it was spent (through both phases), and the oracles after. Each
decision rule has its table-driven case in tests/core/test_scenarios.py, each rule its scenario in
tests/rules/test_scenarios.py; one worker serves the whole test."""
from __future__ import annotations

from connectors import rules
from streams import routing
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

        # A card deposit of 100.00, 40.00 fronted, settles; 90.00 is spent; the network charges all of it back.
        ctx = rules.Context(client_id="gateway")
        ids = [gateway.open_account("user:cy:USD", "USD")]
        for event in (rules.DepositInitiated("card-1", "cy", "USD", "100.00", fronted="40.00"),
                      rules.DepositSettled("card-1", "cy", "USD", "100.00", fronted="40.00")):
            ids += gateway.submit(rules.plan(event, ctx))
        ids.append(gateway.post("wd-cy", [Leg("user:cy:USD", -9_000), Leg("sys:world:USD", 9_000)]))
        assert [outcome(r) for r in gateway.wait(ids).values()] == ["accepted"] * len(ids)
        ids = [*gateway.submit(rules.plan(rules.DepositChargedBack("card-1", "cy", "USD", "100.00", fronted="40.00"),
                                          ctx)),
               *gateway.submit(rules.plan(rules.DepositChargedBack("card-1", "cy", "USD", "0.01", fronted="40.00",
                                                                   attempt=2), ctx))]
        results = gateway.wait(ids)
        assert [outcome(results[i]) for i in ids] == ["accepted", "exceeds_unreturned"]
        balances = latest_balances(settings)
        assert (balances["user:cy:USD"]["posted"], balances["user:cy:receivable.USD"]["posted"],
                balances["user:cy:pending.USD"]["posted"]) == ("0", "-9000", "0")
        assert sum(int(b["posted"]) for account, b in balances.items()
                   if account.split("@")[0] in ("sys:custody:USD", "sys:in_transit:USD")) == 0
        charged = [r.value for r in read_topic(settings, "history")
                   if r.value["transaction_id"] == "deposit_charged_back:card-1"]
        assert sorted((h["account_id"].split("@")[0], h["amount"]) for h in charged) == [
            ("sys:custody:USD", "10000"), ("user:cy:USD", "-1000"), ("user:cy:receivable.USD", "-9000")]

        # 100.00 paid from a user of one partition to a user of another, 30.00 of it spent, all of it returned:
        # sent as the client places it (to both partitions), judged in each on its share of the payment.
        payer = "user:dee:USD"
        payee = next(f"user:ed{i}:USD" for i in range(100) if routing.partition_of_account(f"user:ed{i}:USD",
            settings.partitions) != routing.partition_of_account(payer, settings.partitions))
        ids = [gateway.open_account(payer, "USD"), gateway.open_account(payee, "USD"),
               gateway.post("dep-dee", [Leg("sys:world:USD", -10_000), Leg(payer, 10_000)], kind="deposit")]
        ids.append(gateway.post("pay-ed", [Leg(payer, -10_000), Leg(payee, 10_000)]))
        assert [outcome(r) for r in gateway.wait(ids).values()] == ["accepted"] * len(ids)
        ids = [gateway.post("wd-ed", [Leg(payee, -3_000), Leg("sys:world:USD", 3_000)], kind="withdrawal")]
        assert [outcome(r) for r in gateway.wait(ids).values()] == ["accepted"]
        ids = [gateway.return_payment("ret-ed", "pay-ed", payee, payer, 10_000)]
        assert [outcome(r) for r in gateway.wait(ids).values()] == ["accepted"]
        other = LedgerClient(settings, "other")
        try:
            ids = [gateway.return_payment("ret-ed-2", "pay-ed", payee, payer, 1)]
            refused = [other.return_payment("ret-ed-3", "pay-ed", payee, payer, 1)]
            assert [outcome(r) for r in gateway.wait(ids).values()] == ["exceeds_unreturned"]
            assert [outcome(r) for r in other.wait(refused).values()] == ["client_mismatch"]
        finally:
            other.close()
        balances = latest_balances(settings)
        owed = f"{routing.routing_key_for(payee)}:receivable.USD"
        assert (balances[payer]["posted"], balances[payee]["posted"], balances[owed]["posted"]) == (
            "10000", "0", "-3000")
        assert wait_quiescent(settings)
        report = verify(settings)
        assert report.ok, format_report(report)
    finally:
        gateway.close()
