"""Commands through the real broker and a real worker: results, balances, history, and the oracles."""
from __future__ import annotations

from connectors.client import LedgerClient, Leg
from connectors.demo import EXPECTED, final_balances, run_example
from projections.topics import read_topic
from projections.verify import format_report, verify, wait_quiescent
from streams import routing
from tests.helpers.topics import latest_balances


def test_open_deposit_and_transfer(settings, start_worker):
    start_worker()
    client = LedgerClient(settings, "slice")
    ids = [client.open_account("user:alice:USD", "USD"), client.open_account("user:bob:USD", "USD"),
           client.post("dep-1", [Leg("sys:world:USD", -10_000), Leg("user:alice:USD", 10_000)], kind="deposit"),
           client.post("tr-1", [Leg("user:alice:USD", -2_500), Leg("user:bob:USD", 2_500)])]
    results = client.wait(ids)
    assert [results[i]["outcome"] for i in ids] == ["accepted"] * 4
    assert results["tr-1"]["transaction_id"] == "tr-1"
    assert wait_quiescent(settings)
    report = verify(settings)
    balances = latest_balances(settings)
    assert balances["user:alice:USD"]["posted"] == "7500"
    assert balances["user:bob:USD"]["posted"] == "2500"
    assert report.ok, format_report(report)
    history = [r.value for r in read_topic(settings, "history") if r.value["account_id"] == "user:alice:USD"]
    assert routing.partition_of_account("user:alice:USD", 8) != routing.partition_of_account("user:bob:USD", 8)
    # bob lives in another partition: alice's partition reserves the debit (an internal hold: held, not
    # posted) until bob's partition has voted, then posts it.
    assert [(h["seq"], h["amount"], h["posted_after"], h["held_after"]) for h in history] == [
        (1, "0", "0", "0"), (2, "10000", "10000", "0"), (3, "0", "10000", "2500"), (4, "-2500", "7500", "0")]
    client.close()


def test_worked_example_of_the_design(settings, start_worker):
    start_worker()
    client = LedgerClient(settings, "example")
    results = run_example(client)
    assert all(r["outcome"] == "accepted" for r in results), results
    assert final_balances(settings, list(EXPECTED)) == EXPECTED
    assert wait_quiescent(settings)
    report = verify(settings)
    assert report.ok, format_report(report)
    assert report.sums == {"USDT": 0, "BTC": 0}
    client.close()


def test_rejections_are_values_with_reasons(settings, start_worker):
    start_worker()
    client = LedgerClient(settings, "reject")
    ids = [client.open_account("user:carol:USD", "USD"),
           client.post("over", [Leg("user:carol:USD", -1), Leg("sys:world:USD", 1)]),
           client.post("unbal", [Leg("sys:world:USD", -2), Leg("user:carol:USD", 1)]),
           client.open_account("user:dave:XYZ", "XYZ"),
           client.post("ghost", [Leg("user:carol:USD", -1), Leg("user:carol2:USD", 1)], command_id="ghost-local")]
    results = client.wait(ids)
    assert results["over"]["reason"] == "insufficient_funds"
    assert results["unbal"]["reason"] == "unbalanced"
    assert results["open:user:dave:XYZ"]["reason"] == "unknown_currency"
    assert wait_quiescent(settings)
    report = verify(settings)
    assert report.ok, format_report(report)
    client.close()


def test_credit_to_an_unknown_account_in_another_partition_is_refused(settings, start_worker):
    start_worker()
    client = LedgerClient(settings, "ret")
    payer, ghost = "user:payer:USD", "user:ghost:USD"
    assert routing.partition_of_account(payer, 8) != routing.partition_of_account(ghost, 8)
    ids = [client.open_account(payer, "USD"),
           client.post("dep", [Leg("sys:world:USD", -500), Leg(payer, 500)], kind="deposit"),
           client.post("send", [Leg(payer, -200), Leg(ghost, 200)])]
    assert [(r["outcome"], r["reason"]) for r in client.wait(ids).values()] == \
        [("accepted", None)] * 2 + [("rejected", "unknown_account")]
    assert wait_quiescent(settings)
    report = verify(settings)
    assert report.ok, format_report(report)  # includes: nothing left in clearing
    client.close()
