"""Settlements the outside world already made are never refused (late settlement), capture modes and the
default expiry policy, through real partition processors (the scenario DSL). See docs/rules.md."""
from __future__ import annotations

from connectors import rules
from connectors.rules import Context, OrderPlaced, WithdrawalRequested
from tests.helpers.bus import START_MS
from tests.rules.scenario import Scenario, in_different_partitions

assert in_different_partitions("alice", "bob")
FEES = ("0.001", "0.001")
EXPIRES = START_MS + 60_000  # a minute after the scenario starts
LATER = START_MS + 120_000


def test_a_withdrawal_completed_after_its_hold_expired_is_still_recorded():
    """The issue's measured case: 400 USDT + fee 1, expired, then custody reports the payout."""
    s = (Scenario().users("bob")
         .deposit("d1", "bob", "USDT", "1000")
         .withdrawal_requested("w1", "bob", "USDT", "400", fee="1", expires_at_ms=EXPIRES)
         .assert_balances({"bob:USDT": ("1000", "401")})
         .at(LATER)
         .withdrawal_completed("w1", "bob", "USDT", "400", fee="1", expect="late_settlement")
         .assert_balances({"bob:USDT": ("599", "0"), "sys:custody:USDT": "-600", "sys:fees:USDT": "1"})
         .assert_hold("withdrawal:w1", "bob:USDT", "expired"))
    hold = s.bus.hold("withdrawal:w1", "user:bob:USDT")
    assert (hold.captured, hold.released) == (401_000000, 0)  # the expiry's refund was taken back
    assert len(s.history(kind="hold_expired", hold_id="withdrawal:w1")) == 1  # it did expire first
    assert s.last[0]["detail"] == "a hold it captures had ended: settled late"
    # Settled once: a redelivery is a duplicate, a new attempt finds nothing released left to settle.
    s.withdrawal_completed("w1", "bob", "USDT", "400", fee="1", expect="late_settlement", duplicate=True)
    s.withdrawal_completed("w1", "bob", "USDT", "400", fee="1", attempt=2, expect="capture_exceeds_hold")
    s.assert_balances({"bob:USDT": "599", "sys:custody:USDT": "-600"})


def test_a_completion_after_a_failure_report_still_posts_and_the_overdraw_becomes_a_receivable():
    s = (Scenario().users("alice", "bob")
         .deposit("d1", "bob", "USDT", "1000")
         .withdrawal_requested("w1", "bob", "USDT", "400", fee="1")
         .withdrawal_failed("w1", "bob", "USDT")                       # refunded: available 1,000 again
         .transfer("t1", "bob", "alice", "USDT", "700")                 # ... and spent
         .withdrawal_completed("w1", "bob", "USDT", "400", fee="1", expect="late_settlement")
         # 300 came from bob's available, the 101 it could not cover is his debt to the exchange (P2 holds).
         .assert_balances({"bob:USDT": "0", "bob:receivable.USDT": "-101", "alice:USDT": "700",
                           "sys:custody:USDT": "-600", "sys:fees:USDT": "1"})
         .assert_hold("withdrawal:w1", "bob:USDT", "released"))
    legs = s.history("withdrawal_completed:w1")
    assert sorted((h["account_id"], h["amount"], h["hold_id"]) for h in legs if h["account_id"].startswith("user:")) \
        == [("user:bob:USDT", "-300000000", "withdrawal:w1"), ("user:bob:receivable.USDT", "-101000000",
                                                                 "withdrawal:w1")]


def test_a_fill_after_the_buy_orders_hold_expired_is_still_settled_across_partitions():
    """DESIGN §8's fill, arriving after alice's bid expired: the numbers are §8's (28,020 USDT)."""
    s = (Scenario().users("alice", "bob")
         .deposit("d-alice", "alice", "USDT", "40000")
         .deposit("d-bob", "bob", "BTC", "0.2")
         .order_placed("bid-1", "alice", "buy", "0.5", "60000", expires_at_ms=EXPIRES)
         .order_placed("ask-1", "bob", "sell", "0.2", "59900")
         .at(LATER)
         .trade("fill-1", "0.2", "59900", buyer=("alice", "bid-1"), seller=("bob", "ask-1"), fees=FEES,
                expect="late_settlement")
         .assert_balances({"alice:USDT": "28020", "alice:BTC": "0.1998", "bob:USDT": "11968.02", "bob:BTC": "0",
                           "sys:fees:USDT": "11.98", "sys:fees:BTC": "0.0002"})
         .assert_hold("order:bid-1", "alice:USDT", "expired")
         .assert_hold("order:ask-1", "bob:BTC", "captured")
         .order_closed("bid-1", "alice", "buy", expect="hold_not_open"))   # it ended already: nothing to return
    hold = s.bus.hold("order:bid-1", "user:alice:USDT")
    assert (hold.captured, hold.released) == (11_980_000000, 18_020_000000)


def test_a_late_fill_the_buyer_cannot_cover_any_more_is_split_with_a_receivable():
    (Scenario().users("alice", "bob")
     .deposit("d-alice", "alice", "USDT", "40000")
     .deposit("d-bob", "bob", "BTC", "0.2")
     .order_placed("bid-1", "alice", "buy", "0.5", "60000", expires_at_ms=EXPIRES)
     .order_placed("ask-1", "bob", "sell", "0.2", "59900")
     .at(LATER)
     .transfer("t1", "alice", "bob", "USDT", "35000")       # the hold expires first: 40,000 free, 5,000 left
     .trade("fill-1", "0.2", "59900", buyer=("alice", "bid-1"), seller=("bob", "ask-1"), fees=FEES,
            expect="late_settlement")
     .assert_balances({"alice:USDT": "0", "alice:receivable.USDT": "-6980", "alice:BTC": "0.1998",
                       "bob:USDT": "46968.02", "sys:fees:USDT": "11.98"}))


def test_a_fill_on_an_open_hold_past_its_expiry_captures_it_as_usual():
    """Not yet expired by the engine (the fill is the first record of that partition after the expiry time):
    the reservation still stands, so the fill takes it, no notice."""
    s = (Scenario().users("alice")
         .deposit("d1", "alice", "USDT", "1000")
         .order_placed("bid", "alice", "buy", "0.01", "60000", expires_at_ms=EXPIRES))
    # The expiry check runs before the fill in the same partition, so the hold is expired when it is judged:
    # the fill settles late, and its numbers are the same as an on-time fill's.
    s.at(LATER).trade("t1", "0.01", "59000", buyer=("alice", "bid"), seller="bot", fees=FEES,
                      expect="late_settlement")
    s.assert_balances({"alice:USDT": ("410", "0"), "alice:BTC": "0.00999", "sys:liquidity:USDT": "590"})


def test_exact_capture_mode_a_completion_must_move_exactly_what_was_held():
    (Scenario().users("bob")
     .deposit("d1", "bob", "USDT", "500")
     .withdrawal_requested("w1", "bob", "USDT", "300", fee="1")
     .withdrawal_completed("w1", "bob", "USDT", "299", fee="1", expect="capture_not_exact")
     .assert_balances({"bob:USDT": ("500", "301")})
     .withdrawal_completed("w1", "bob", "USDT", "300", fee="1", attempt=2)
     .assert_balances({"bob:USDT": "199", "sys:custody:USDT": "-200", "sys:fees:USDT": "1"}))


def test_partial_capture_mode_fills_take_a_hold_piece_by_piece():
    (Scenario().users("alice")
     .deposit("d1", "alice", "USDT", "1000")
     .order_placed("bid", "alice", "buy", "0.01", "60000")                     # 600 held
     .trade("t1", "0.004", "60000", buyer=("alice", "bid"), seller="bot")      # 240
     .trade("t2", "0.005", "60000", buyer=("alice", "bid"), seller="bot")      # 300
     .assert_hold("order:bid", "alice:USDT", "open", remaining="60")
     .order_closed("bid", "alice", "buy")
     .assert_balances({"alice:USDT": ("460", "0"), "alice:BTC": "0.009"}))


def test_orders_and_withdrawals_get_a_default_expiry_from_their_time():
    ctx = Context(order_ttl_ms=3_600_000, withdrawal_ttl_ms=600_000)
    placed = rules.plan(OrderPlaced("o1", "alice", "sell", "BTC", "USDT", "1", occurred_at_ms=1_000), ctx)
    assert placed.commands[0].record["body"][1]["expires_at_ms"] == 3_601_000
    stated = rules.plan(OrderPlaced("o1", "alice", "sell", "BTC", "USDT", "1", expires_at_ms=5, occurred_at_ms=1))
    assert stated.commands[0].record["body"][1]["expires_at_ms"] == 5            # an explicit expiry wins
    requested = rules.plan(WithdrawalRequested("w1", "alice", "BTC", "1", occurred_at_ms=1_000), ctx)
    assert requested.commands[0].record["body"][1]["expires_at_ms"] == 601_000
    default = rules.plan(WithdrawalRequested("w1", "alice", "BTC", "1", occurred_at_ms=0))
    assert default.commands[0].record["body"][1]["expires_at_ms"] == 7 * 24 * 3600 * 1000
    # Through the processors: a withdrawal requested at log time T with the policy expires at T + 10 min and,
    # once expired, its completion still posts.
    s = Scenario(ctx).users("bob").deposit("d1", "bob", "USDT", "10")
    s.withdrawal_requested("w2", "bob", "USDT", "4", occurred_at_ms=START_MS)
    assert s.bus.hold("withdrawal:w2", "user:bob:USDT").expires_at_ms == START_MS + 600_000
    (s.at(START_MS + 600_000).withdrawal_completed("w2", "bob", "USDT", "4", expect="late_settlement")
     .assert_balances({"bob:USDT": "6", "sys:custody:USDT": "-6"}))


def test_a_tick_expires_due_holds_on_a_quiet_partition_and_a_late_completion_still_posts():
    s = (Scenario().users("bob")
         .deposit("d1", "bob", "USDT", "1000")
         .withdrawal_requested("w1", "bob", "USDT", "400", fee="1", expires_at_ms=EXPIRES)
         .at(LATER)
         .tick("bob", sealed=False)                      # anyone's empty batch: dead-lettered, nothing expires
         .assert_hold("withdrawal:w1", "bob:USDT", "open")
         .tick("bob")                                     # the worker's tick: no client command needed
         .assert_hold("withdrawal:w1", "bob:USDT", "expired")
         .assert_balances({"bob:USDT": ("1000", "0")}))
    assert [d["reason"] for d in s.bus.dead_letters] == ["empty"]
    assert not [r for r in s.bus.results if r["command_id"].startswith("tick")]  # a tick is answered by nothing
    (s.withdrawal_completed("w1", "bob", "USDT", "400", fee="1", expect="late_settlement")
     .assert_balances({"bob:USDT": ("599", "0"), "sys:custody:USDT": "-600"}))


def test_a_fill_after_the_sell_orders_hold_was_closed_is_settled_and_the_coordinator_says_so():
    """The seller's partition is a participant, not the coordinator: its vote carries the notice."""
    s = (Scenario().users("alice", "bob")
         .deposit("d-alice", "alice", "USDT", "40000")
         .deposit("d-bob", "bob", "BTC", "0.2")
         .order_placed("bid-1", "alice", "buy", "0.5", "60000")
         .order_placed("ask-1", "bob", "sell", "0.2", "59900")
         .order_closed("ask-1", "bob", "sell")                       # bob's close overtook the fill report
         .assert_balances({"bob:BTC": ("0.2", "0")})
         .trade("fill-1", "0.2", "59900", buyer=("alice", "bid-1"), seller=("bob", "ask-1"), fees=FEES,
                expect="late_settlement")
         .assert_balances({"alice:USDT": ("28020", "18020"), "alice:BTC": "0.1998", "bob:USDT": "11968.02",
                           "bob:BTC": "0"})
         .assert_hold("order:ask-1", "bob:BTC", "released"))
    hold = s.bus.hold("order:ask-1", "user:bob:BTC")
    assert (hold.captured, hold.released) == (20_000000, 0)


def test_a_late_fill_across_partitions_is_refused_when_the_owners_receivable_was_closed():
    """The one refusal a late settlement meets (docs/rules.md): judged at the participant's reservation, so the
    commit never meets it; nothing posts and clearing stays empty."""
    s = (Scenario().users("alice", "bob")
         .deposit("d-alice", "alice", "USDT", "40000")
         .deposit("d-bob", "bob", "BTC", "0.2")
         .order_placed("bid-1", "alice", "buy", "0.5", "60000")
         .order_placed("ask-1", "bob", "sell", "0.2", "59900")
         .order_closed("ask-1", "bob", "sell")
         .transfer("gift", "bob", "alice", "BTC", "0.2"))          # the refund spent: a late fill would overdraw
    for command in ({"command_id": "op-open", "client_id": "ops", "body": ("ledger.OpenAccount", {
                        "account_id": "user:bob:receivable.BTC", "currency": "BTC", "allow_negative": True,
                        "overdraft_limit": "0", "max_balance": None, "routing_key": None})},
                    {"command_id": "op-close", "client_id": "ops", "body": ("ledger.CloseAccount", {
                        "account_id": "user:bob:receivable.BTC"})}):
        s.deliver([rules.Routed("user:bob:BTC", command)])
    s.trade("fill-1", "0.2", "59900", buyer=("alice", "bid-1"), seller=("bob", "ask-1"), expect="account_closed")
    s.assert_balances({"alice:USDT": ("40000", "30000"), "alice:BTC": "0.2", "bob:BTC": "0", "bob:USDT": "0"})


def test_a_second_late_settlement_adds_to_the_receivable_the_first_one_opened():
    """Two withdrawals refunded and the money spent, then both reported paid: the first opens bob's
    receivable, the second adds to it (the receivable is not opened again, which would reset it)."""
    (Scenario().users("alice", "bob")
     .deposit("d1", "bob", "USDT", "1000")
     .withdrawal_requested("w1", "bob", "USDT", "300")
     .withdrawal_requested("w2", "bob", "USDT", "200")
     .withdrawal_failed("w1", "bob", "USDT")
     .withdrawal_failed("w2", "bob", "USDT")
     .transfer("t1", "bob", "alice", "USDT", "900")
     .withdrawal_completed("w1", "bob", "USDT", "300", expect="late_settlement")
     .assert_balances({"bob:USDT": "0", "bob:receivable.USDT": "-200"})
     .withdrawal_completed("w2", "bob", "USDT", "200", expect="late_settlement")
     .assert_balances({"bob:USDT": "0", "bob:receivable.USDT": "-400", "alice:USDT": "900",
                       "sys:custody:USDT": "-500"}))
