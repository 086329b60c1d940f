"""Each business-event rule, end to end through the partition processors (DESIGN.md §8, issue 6)."""
from __future__ import annotations

import dataclasses

import pytest

from connectors import rules
from connectors.rules import DepositConfirmed, WithdrawalCompleted
from tests.rules.scenario import Scenario, in_different_partitions

# alice and bob live in different partitions, so their trades are multi-partition transactions.
assert in_different_partitions("alice", "bob")
FEES = ("0.001", "0.001")  # maker, taker: 0.1 %


def test_worked_example_of_design_section_8():
    s = (Scenario().users("alice", "bob")
         .deposit("d-alice", "alice", "USDT", "40000")
         .deposit("d-bob", "bob", "BTC", "0.2")
         .order_placed("bid-1", "alice", "buy", "0.5", "60000")
         .assert_balances({"alice:USDT": ("40000", "30000")})
         .order_placed("ask-1", "bob", "sell", "0.2", "59900")
         .trade("fill-1", "0.2", "59900", buyer=("alice", "bid-1"), seller=("bob", "ask-1"), maker="seller",
                fees=FEES)
         .assert_balances({"alice:USDT": ("28020", "18020"), "alice:BTC": "0.1998",
                           "bob:USDT": "11968.02", "bob:BTC": "0",
                           "sys:fees:USDT": "11.98", "sys:fees:BTC": "0.0002"})
         .assert_hold("order:ask-1", "bob:BTC", "captured"))
    # The fill is one transaction (six legs, two partitions, each partition's share through its clearing
    # shard) with the rule recorded on it.
    legs = [h for h in s.history("trade_executed:fill-1") if not h["account_id"].startswith("sys:clearing:")]
    assert len(legs) == 6
    metadata = s.last_plan.commands[0].record["body"][1]["metadata"]
    assert (metadata["rule"], metadata["rule_version"]) == ("trade_executed", "2")
    (s.order_closed("bid-1", "alice", "buy")      # the user cancels the rest: 18,020 comes back
     .assert_balances({"alice:USDT": "28020", "alice:BTC": "0.1998", "bob:USDT": "11968.02",
                       "sys:custody:USDT": "-40000", "sys:custody:BTC": "-0.2"}))
    s.order_closed("ask-1", "bob", "sell", expect="hold_not_open")  # fully filled: nothing left to release


def test_limit_bid_filled_below_its_limit_then_cancelled_gets_the_price_improvement_back():
    (Scenario().users("alice", "bob")
     .deposit("d1", "alice", "USDT", "40000")
     .deposit("d2", "bob", "BTC", "1")
     .order_placed("bid", "alice", "buy", "0.5", "60000")        # holds 30,000
     .order_placed("ask", "bob", "sell", "0.5", "59000")
     .trade("t1", "0.3", "59000", buyer=("alice", "bid"), seller=("bob", "ask"))   # 17,700
     .trade("t2", "0.2", "58500", buyer=("alice", "bid"), seller=("bob", "ask"))   # 11,700
     .assert_hold("order:bid", "alice:USDT", "open", remaining="600")
     .assert_balances({"alice:USDT": ("10600", "600"), "alice:BTC": "0.5",
                       "bob:USDT": "29400", "bob:BTC": "0.5"})
     .order_closed("bid", "alice", "buy")                         # cancelled: 600 comes back
     .assert_hold("order:bid", "alice:USDT", "released")
     .assert_balances({"alice:USDT": ("10600", "0")}))


def test_trades_against_the_exchanges_bot_use_liquidity_accounts_without_holds():
    (Scenario().users("alice")
     .deposit("d1", "alice", "USDT", "1000")
     .order_placed("bid", "alice", "buy", "0.01", "60000")       # 600
     .trade("t1", "0.01", "59000", buyer=("alice", "bid"), seller="bot", maker="seller", fees=FEES)
     .assert_balances({"alice:USDT": ("410", "10"), "alice:BTC": "0.00999",
                       "sys:liquidity:USDT": "590", "sys:liquidity:BTC": "-0.01",
                       "sys:fees:BTC": "0.00001", "sys:fees:USDT": "0"})
     .order_closed("bid", "alice", "buy")
     .order_placed("ask", "alice", "sell", "0.005", "70000")
     .trade("t2", "0.005", "70000", buyer="bot", seller=("alice", "ask"), maker="buyer", fees=FEES)
     .assert_balances({"alice:USDT": "759.65", "alice:BTC": "0.00499",
                       "sys:liquidity:USDT": "240", "sys:liquidity:BTC": "-0.005",
                       "sys:fees:USDT": "0.35", "sys:fees:BTC": "0.00001"}))


def test_a_deposit_delivered_twice_is_credited_once():
    s = (Scenario().users("alice")
         .deposit("chain-tx-9", "alice", "BTC", "1.5")
         .deposit("chain-tx-9", "alice", "BTC", "1.5", duplicate=True)
         .assert_balances({"alice:BTC": "1.5", "sys:custody:BTC": "-1.5"}))
    assert len(s.history("deposit_confirmed:chain-tx-9")) == 2  # two legs, once
    # The same deposit id with another amount is a conflict, not a second credit.
    s.deposit("chain-tx-9", "alice", "BTC", "2", expect="id_conflict").assert_balances({"alice:BTC": "1.5"})


def test_a_failed_withdrawal_report_delivered_twice_releases_once():
    s = (Scenario().users("bob")
         .deposit("d1", "bob", "USDT", "500")
         .withdrawal_requested("w1", "bob", "USDT", "300", fee="1")
         .assert_balances({"bob:USDT": ("500", "301")})
         .withdrawal_failed("w1", "bob", "USDT")
         .withdrawal_failed("w1", "bob", "USDT", duplicate=True)       # same report again: the stored answer
         .withdrawal_failed("w1", "bob", "USDT", attempt=2, expect="hold_not_open")  # even as a new attempt
         .assert_balances({"bob:USDT": ("500", "0"), "sys:custody:USDT": "-500"}))
    assert len(s.history(kind="hold_released", hold_id="withdrawal:w1")) == 1


def test_a_completed_withdrawal_pays_custody_and_the_fee():
    (Scenario().users("bob")
     .deposit("d1", "bob", "BTC", "1")
     .withdrawal_requested("w1", "bob", "BTC", "0.4", fee="0.0005")
     .withdrawal_completed("w1", "bob", "BTC", "0.4", fee="0.0005")
     .assert_hold("withdrawal:w1", "bob:BTC", "captured")
     .assert_balances({"bob:BTC": "0.5995", "sys:custody:BTC": "-0.6", "sys:fees:BTC": "0.0005"})
     .withdrawal_failed("w1", "bob", "BTC", expect="hold_not_open"))  # a late failure report changes nothing


def test_a_withdrawal_completion_that_overtakes_its_request():
    s = Scenario().users("bob").deposit("d1", "bob", "USDT", "100")
    completed = WithdrawalCompleted("w7", "bob", "USDT", "60")
    s.send(completed, expect="unknown_hold")                         # rejected cleanly: nothing posted
    s.assert_balances({"bob:USDT": "100", "sys:custody:USDT": "-100"})
    s.withdrawal_requested("w7", "bob", "USDT", "60")
    s.send(completed, expect="unknown_hold", duplicate=True)         # the inbox remembers the rejection
    retry = rules.next_attempt(completed, s.last[0])
    assert retry == dataclasses.replace(completed, attempt=2)
    s.send(retry).assert_balances({"bob:USDT": "40", "sys:custody:USDT": "-40"})
    assert s.last[0]["command_id"] == "withdrawal_completed:w7#2"
    s.send(retry, duplicate=True)                                    # the retry redelivered: no second capture
    s.send(dataclasses.replace(completed, attempt=3), expect="hold_not_open")  # a hold settles once (P5)
    assert rules.next_attempt(retry, s.last[0]) is None
    s.assert_balances({"bob:USDT": "40", "sys:custody:USDT": "-40"})


def test_a_deposit_before_its_account_is_opened_is_retried_as_a_new_attempt():
    s = Scenario()
    deposit = DepositConfirmed("d1", "erin", "USDT", "10")
    s.send(deposit, expect="unknown_account")
    s.users("erin")
    s.send(rules.next_attempt(deposit, s.last[0])).assert_balances({"erin:USDT": "10"})


def test_fx_conversion_is_one_transaction_in_two_currencies_with_its_rate_snapshot():
    s = (Scenario().users("alice")
         .deposit("d1", "alice", "USDT", "1000")
         .rate_snapshot("snap-42", "USDT", "BTC", "0.0000125")    # the rates producer records it first
         .fx("x1", "alice", "USDT", "BTC", "600", "0.0000125", "snap-42")
         .assert_balances({"alice:USDT": "400", "alice:BTC": "0.0075",
                           "sys:fx:USDT": "600", "sys:fx:BTC": "-0.0075"}))
    legs = s.history("fx_converted:x1")
    assert sorted(h["currency"] for h in legs) == ["BTC", "BTC", "USDT", "USDT"]
    body = s.last_plan.commands[0].record["body"][1]
    assert body["rate_snapshot_id"] == "snap-42" and body["metadata"]["rule"] == "fx_converted"
    s.fx("x2", "alice", "USDT", "BTC", "1000", "0.0000125", "snap-42", expect="insufficient_funds")


def test_fx_fails_closed_on_a_snapshot_the_ledger_never_recorded_or_of_another_pair():
    (Scenario().users("alice")
     .deposit("d1", "alice", "USDT", "1000")
     .fx("x1", "alice", "USDT", "BTC", "600", "0.0000125", "snap-404", expect="unknown_rate")
     .rate_snapshot("snap-eth", "USDT", "ETH", "0.0005")
     .fx("x2", "alice", "USDT", "BTC", "600", "0.0000125", "snap-eth", expect="rate_mismatch")
     .rate_snapshot("snap-eth", "USDT", "ETH", "0.0005")   # delivered again: answered as duplicates
     .assert_balances({"alice:USDT": "1000", "alice:BTC": "0"}))


def test_internal_transfer_between_users_in_different_partitions():
    (Scenario().users("alice", "bob")
     .deposit("d1", "alice", "USDT", "50")
     .transfer("gift-1", "alice", "bob", "USDT", "20")
     .transfer("gift-1", "alice", "bob", "USDT", "20")   # redelivered
     .assert_balances({"alice:USDT": "30", "bob:USDT": "20"})
     .transfer("gift-2", "alice", "bob", "USDT", "31", expect="insufficient_funds"))


def test_an_order_cannot_spend_more_than_it_held():
    (Scenario().users("alice", "bob")
     .deposit("d1", "alice", "USDT", "1000")
     .deposit("d2", "bob", "BTC", "1")
     .order_placed("bid", "alice", "buy", "0.01", "60000")     # 600 held
     .order_placed("ask", "bob", "sell", "0.02", "60000")
     .trade("t1", "0.01", "61000", buyer=("alice", "bid"), seller=("bob", "ask"), expect="capture_exceeds_hold")
     .assert_balances({"alice:USDT": ("1000", "600"), "bob:BTC": ("1", "0.02")})
     .order_placed("big", "alice", "buy", "1", "60000", expect="insufficient_funds"))


def test_a_rule_upgrade_does_not_post_a_replayed_event_twice():
    old = Scenario().users("alice").deposit("d1", "alice", "USDT", "5")
    spec = rules.RULES[DepositConfirmed]
    rules.RULES[DepositConfirmed] = dataclasses.replace(spec, version=2)
    try:
        old.deposit("d1", "alice", "USDT", "5", expect="id_conflict")  # same inbox key, other metadata
    finally:
        rules.RULES[DepositConfirmed] = spec
    old.assert_balances({"alice:USDT": "5"})


def test_a_deposit_reversed_once_by_its_own_client():
    s = (Scenario().users("alice", "bob")
         .deposit("d1", "alice", "USDT", "500")
         .reversal("r1", "deposit_confirmed:d1", "alice", "USDT")
         .assert_balances({"alice:USDT": "0", "sys:custody:USDT": "0"})
         .reversal("r1", "deposit_confirmed:d1", "alice", "USDT", duplicate=True)     # redelivered: no effect
         .reversal("r2", "deposit_confirmed:d1", "alice", "USDT", expect="already_reversed")
         .reversal("r3", "deposit_confirmed:nope", "alice", "USDT", expect="unknown_transaction")
         .assert_balances({"alice:USDT": "0", "sys:custody:USDT": "0"}))
    legs = s.history("reversal_requested:r1")
    assert sorted((h["account_id"].split("@")[0], h["amount"], h["kind"]) for h in legs) == [
        ("sys:custody:USDT", "500000000", "reversal"), ("user:alice:USDT", "-500000000", "reversal")]


def test_a_reversal_by_another_client_of_a_spent_deposit_and_across_partitions():
    s = (Scenario().users("alice", "bob")
         .deposit("d1", "alice", "USDT", "500")
         .transfer("t1", "alice", "bob", "USDT", "200")                     # alice and bob: two partitions
         .reversal("r1", "deposit_confirmed:d1", "alice", "USDT", expect="insufficient_funds")
         .reversal("r2", "internal_transfer:t1", "alice", "USDT", expect="not_reversible"))
    s.ctx = rules.Context(client_id="intruder")
    s.reversal("r3", "deposit_confirmed:d1", "alice", "USDT", expect="client_mismatch")
    s.ctx = rules.DEFAULT_CONTEXT
    (s.transfer("t2", "bob", "alice", "USDT", "200")
     .reversal("r4", "deposit_confirmed:d1", "alice", "USDT")                # whole again: reversible
     .assert_balances({"alice:USDT": "0", "bob:USDT": "0", "sys:custody:USDT": "0"}))


def test_a_deposit_returned_in_part_then_charged_back_after_it_was_spent():
    """The bank returns 100 of a 500 deposit; the user withdraws 350; the card network charges back the
    remaining 400: the 50 left is taken, 350 is booked on the user's receivable (what the user owes). Nothing
    more than what remains unreturned goes back, and a redelivered event changes nothing."""
    s = (Scenario().users("alice")
         .deposit("d1", "alice", "USDT", "500")
         .deposit_returned("r1", "deposit_confirmed:d1", "alice", "USDT", "100")
         .assert_balances({"alice:USDT": "400", "sys:custody:USDT": "-400"})
         .deposit_returned("r1", "deposit_confirmed:d1", "alice", "USDT", "100", duplicate=True)
         .withdrawal_requested("w1", "alice", "USDT", "350")
         .withdrawal_completed("w1", "alice", "USDT", "350")
         .deposit_returned("cb1", "deposit_confirmed:d1", "alice", "USDT", "400", kind="chargeback")
         .assert_balances({"alice:USDT": "0", "user:alice:receivable.USDT": "-350", "sys:custody:USDT": "350"})
         .deposit_returned("cb2", "deposit_confirmed:d1", "alice", "USDT", "1", kind="chargeback",
                           expect="exceeds_unreturned")
         .deposit_returned("r2", "deposit_confirmed:nope", "alice", "USDT", "1", expect="unknown_transaction"))
    legs = s.history("deposit_returned:cb1")
    assert sorted((h["account_id"].split("@")[0], h["amount"], h["kind"], tuple(h["links"])) for h in legs) == [
        ("sys:custody:USDT", "400000000", "chargeback", ("deposit_confirmed:d1",)),
        ("user:alice:USDT", "-50000000", "chargeback", ("deposit_confirmed:d1",)),
        ("user:alice:receivable.USDT", "-350000000", "chargeback", ("deposit_confirmed:d1",))]
    metadata = s.last_plan.commands[0].record["body"][1]["metadata"]
    assert (metadata["rule"], metadata["ledger.returns"]) == ("deposit_returned", "deposit_confirmed:nope")


def test_a_transfer_between_partitions_returned_after_the_receiver_spent_part_of_it():
    """alice (one partition) pays bob (another) 100; bob withdraws 30; the transfer is returned whole:
    alice has her 100 back, bob's 70 is taken and 30 is booked on his receivable. A second return, or
    another client's, is refused, and a redelivered event changes nothing."""
    s = (Scenario().users("alice", "bob")
         .deposit("d1", "alice", "USDT", "100")
         .transfer("t1", "alice", "bob", "USDT", "100")
         .withdrawal_requested("w1", "bob", "USDT", "30")
         .withdrawal_completed("w1", "bob", "USDT", "30")
         .transfer_returned("r2", "internal_transfer:t1", "alice", "bob", "USDT", "100")
         .assert_balances({"alice:USDT": "100", "bob:USDT": "0", "user:bob:receivable.USDT": "-30"})
         .transfer_returned("r2", "internal_transfer:t1", "alice", "bob", "USDT", "100", duplicate=True)
         .transfer_returned("r3", "internal_transfer:t1", "alice", "bob", "USDT", "0.01", kind="chargeback",
                            expect="exceeds_unreturned"))
    legs = s.history("transfer_returned:r2")
    assert sorted((h["account_id"].split("@")[0], h["amount"], tuple(h["links"])) for h in legs) == [
        ("sys:clearing:USDT", "-100000000", ("internal_transfer:t1",)),
        ("sys:clearing:USDT", "100000000", ("internal_transfer:t1",)),
        ("user:alice:USDT", "100000000", ("internal_transfer:t1",)),
        ("user:bob:USDT", "-70000000", ("internal_transfer:t1",)),
        ("user:bob:receivable.USDT", "-30000000", ("internal_transfer:t1",))]
    s.ctx = rules.Context(client_id="other")
    s.transfer_returned("r4", "internal_transfer:t1", "alice", "bob", "USDT", "0.01", expect="client_mismatch")


def test_a_deposit_in_transit_is_fronted_only_up_to_what_the_rails_owe_then_settles_or_fails():
    """Alice's bank pull of 500 is initiated and 200 of it fronted at once; a second pull of 100 is initiated
    unfronted. Fronting 500 of the second is refused (her pending account holds only 400: what the rails owe
    her and was not fronted); 100 is fronted. The first settles: custody receives 500, her other 300 becomes
    spendable. She spends 650 of her 700 (a transfer to bob), then the second pull fails: the 100 fronted
    comes back, 50 from her account and 50 booked on her receivable, and the rail's claim is written off."""
    s = (Scenario().users("alice", "bob")
         .deposit_initiated("p1", "alice", "USDT", "500", fronted="200")
         .assert_balances({"alice:USDT": "200", "alice:pending.USDT": "300", "sys:in_transit:USDT": "-500"})
         .deposit_initiated("p2", "alice", "USDT", "100")
         .assert_balances({"alice:USDT": "200", "alice:pending.USDT": "400", "sys:in_transit:USDT": "-600"})
         .deposit_fronted("p2", "alice", "USDT", "500", expect="insufficient_funds")
         .deposit_fronted("p2", "alice", "USDT", "100", attempt=2))               # a refusal is remembered
    s.deposit_fronted("p2", "alice", "USDT", "100", attempt=2, duplicate=True)  # redelivered: fronted once
    (s.assert_balances({"alice:USDT": "300", "alice:pending.USDT": "300"})
     .deposit_settled("p1", "alice", "USDT", "500", fronted="200")
     .assert_balances({"alice:USDT": "600", "alice:pending.USDT": "0", "sys:in_transit:USDT": "-100",
                       "sys:custody:USDT": "-500"})
     .transfer("t1", "alice", "bob", "USDT", "550")
     .deposit_failed("p2", "alice", "USDT", "100", fronted="100", fronting_attempt=2)
     .assert_balances({"alice:USDT": "0", "alice:receivable.USDT": "-50", "alice:pending.USDT": "0",
                       "sys:in_transit:USDT": "0", "sys:custody:USDT": "-500", "bob:USDT": "550"}))
    clawback = s.history("deposit_failed:p2:return")  # the return of deposit_fronted:p2#2
    assert sorted((h["account_id"], h["amount"], h["kind"]) for h in clawback) == [
        ("user:alice:USDT", "-50000000", "return"),
        ("user:alice:pending.USDT", "100000000", "return"),
        ("user:alice:receivable.USDT", "-50000000", "return")]


def test_a_deposit_is_never_fronted_beyond_its_amount_nor_settled_claiming_more_fronting_than_pending():
    """The rule refuses fronting more than the deposit; the ledger refuses a settlement whose stated fronting
    is too small (it would release more than the user's pending account holds)."""
    s = Scenario().users("alice")
    with pytest.raises(rules.InvalidAmount):
        s.deposit_initiated("p1", "alice", "USDT", "100", fronted="101")
    (s.deposit_initiated("p1", "alice", "USDT", "100", fronted="60")
     .deposit_settled("p1", "alice", "USDT", "100", fronted="0", expect="insufficient_funds")
     .deposit_settled("p1", "alice", "USDT", "100", fronted="60", attempt=2)
     .assert_balances({"alice:USDT": "100", "alice:pending.USDT": "0", "sys:in_transit:USDT": "0",
                       "sys:custody:USDT": "-100"}))


def test_a_settled_deposit_in_transit_is_charged_back_once_up_to_what_it_paid_the_user():
    """Alice's card payment of 500 is initiated with 200 fronted and settles; she spends 450 (to bob, another
    partition). The network charges back 100, then 400: the 50 she has and 450 on her receivable, with the
    settlement, initiation and fronting all counting it; one cent more is refused (exceeds_unreturned). The
    chargeback is the deposit's own: a redelivery is a duplicate, the same id with another amount a conflict.
    A deposit never fronted (its settlement credits her directly) is charged back through its initiation."""
    s = (Scenario().users("alice", "bob")
         .deposit_initiated("p1", "alice", "USDT", "500", fronted="200")
         .deposit_settled("p1", "alice", "USDT", "500", fronted="200")
         .transfer("t1", "alice", "bob", "USDT", "450")
         .deposit_charged_back("p1", "alice", "USDT", "100", fronted="200")
         .assert_balances({"alice:USDT": "0", "alice:receivable.USDT": "-50", "sys:custody:USDT": "-400",
                           "sys:in_transit:USDT": "0", "alice:pending.USDT": "0", "bob:USDT": "450"})
         .deposit_charged_back("p1", "alice", "USDT", "100", fronted="200", duplicate=True)
         .deposit_charged_back("p1", "alice", "USDT", "400", fronted="200", expect="id_conflict")
         .deposit_charged_back("p1", "alice", "USDT", "400.000001", fronted="200", attempt=2,
                               expect="exceeds_unreturned")
         .deposit_charged_back("p1", "alice", "USDT", "400", fronted="200", attempt=3)
         .assert_balances({"alice:USDT": "0", "alice:receivable.USDT": "-450", "sys:custody:USDT": "0"})
         .deposit_charged_back("p1", "alice", "USDT", "0.000001", fronted="200", attempt=4,
                               expect="exceeds_unreturned")
         # without its fronting the steps do not net to a payment to alice
         .deposit_charged_back("p1", "alice", "USDT", "1", attempt=5, expect="not_returnable")
         .deposit_charged_back("p404", "alice", "USDT", "1", expect="unknown_transaction"))
    legs = s.history("deposit_charged_back:p1#3")
    assert sorted((h["account_id"].split("@")[0], h["amount"], h["kind"], tuple(h["links"])) for h in legs) == [
        ("sys:custody:USDT", "400000000", "chargeback", ("deposit_settled:p1", "deposit_initiated:p1",
                                                         "deposit_fronted:p1")),
        ("user:alice:receivable.USDT", "-400000000", "chargeback", ("deposit_settled:p1", "deposit_initiated:p1",
                                                                    "deposit_fronted:p1"))]
    (s.deposit_initiated("p2", "alice", "USDT", "70")
     .deposit_settled("p2", "alice", "USDT", "70")
     .assert_balances({"alice:USDT": "70", "sys:in_transit:USDT": "0"})
     .deposit_charged_back("p2", "alice", "USDT", "70")
     .assert_balances({"alice:USDT": "0", "alice:receivable.USDT": "-450", "sys:custody:USDT": "0"}))


def test_a_wholly_fronted_deposit_is_charged_back_after_it_settled():
    """All 300 fronted: the settlement only moves custody's money to in-transit; the chargeback still finds
    the payment to alice through the fronting."""
    (Scenario().users("alice")
     .deposit_initiated("p1", "alice", "USDT", "300", fronted="300")
     .deposit_settled("p1", "alice", "USDT", "300", fronted="300")
     .assert_balances({"alice:USDT": "300", "alice:pending.USDT": "0", "sys:in_transit:USDT": "0"})
     .deposit_charged_back("p1", "alice", "USDT", "300", fronted="300")
     .assert_balances({"alice:USDT": "0", "sys:custody:USDT": "0"}))
