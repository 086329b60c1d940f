"""Transactions in flight at the same time, delivered in shuffled orders, with redeliveries and crashes.

The multi-partition bus (tests/helpers/bus.py) runs the engine's commit path per partition; here it delivers
in seeded random orders (each partition's records stay in order, as on Kafka), several records per commit,
and crashes workers at any step of the commit path. The oracles (tests/helpers/oracles.py) check the
promises of DESIGN.md after every step, not only once the bus is quiet.

First, explicit contention on one hold or one account (each drives the bus into the contended state, then
lets a random schedule finish); then a property test that sends many commands without waiting.
"""
from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from streams import routing
from tests.helpers.bus import Bus, Crash
from tests.helpers.interleavings import (
    PROPERTY, checked_bus, fill, finish, operation_lists, run_interleaved, send, step, until_reserved,
)
from tests.helpers.records import N, command, open_account, tx
from tests.helpers.trade import BUYER_BTC, BUYER_P, BUYER_USDT, SELLER_BTC, SELLER_P, SELLER_USDT, TRADE, setup_trade

SEEDS = range(6)

def outcome(bus: Bus, command_id: str) -> str:
    r = bus.result(command_id)
    return r["outcome"] if r["outcome"] == "accepted" else r["reason"]


# --- two transactions on one hold ---------------------------------------------------------------------------

@pytest.mark.parametrize("seed", SEEDS)
def test_a_client_capture_cannot_take_the_part_of_a_hold_a_trade_in_flight_has_locked(seed):
    bus, oracles = checked_bus()
    setup_trade(bus, ask=30_000_000, seller_btc=30_000_000)
    send(bus, oracles, tx("fill-1", TRADE), BUYER_USDT)  # 0.2 of the 0.3 BTC ask
    step(bus, oracles, BUYER_P)  # begun: Reserve to both partitions
    until_reserved(bus, oracles, SELLER_P)  # 0.2 BTC of the ask locked; the vote is on its way
    grab = [(SELLER_BTC, -20_000_000, "ask", None), ("sys:fees:BTC", 20_000_000, None, None)]
    nibble = [(SELLER_BTC, -10_000_000, "ask", None), ("sys:fees:BTC", 10_000_000, None, None)]
    send(bus, oracles, tx("grab", grab, kind="fee"), SELLER_BTC)
    send(bus, oracles, tx("nibble", nibble, kind="fee"), SELLER_BTC)
    step(bus, oracles, SELLER_P)
    step(bus, oracles, SELLER_P)
    assert outcome(bus, "grab") == "capture_exceeds_hold", "the locked part is not the client's to capture"
    assert outcome(bus, "nibble") == "accepted", "the unlocked rest is"
    finish(bus, oracles, seed)
    assert outcome(bus, "fill-1") == "accepted"
    ask = bus.hold("ask", SELLER_BTC)
    assert (ask.status.value, ask.captured) == ("captured", 30_000_000)
    assert bus.account(BUYER_BTC) == (19_980_000, 0)  # the fill, less the taker fee


@pytest.mark.parametrize("seed", SEEDS)
def test_a_reservation_cannot_lock_what_another_transaction_in_flight_has_locked(seed):
    bus, oracles = checked_bus()
    setup_trade(bus, ask=30_000_000, seller_btc=30_000_000)
    send(bus, oracles, tx("fill-1", fill("fill-1", 20_000_000)), BUYER_USDT)
    send(bus, oracles, tx("fill-2", fill("fill-2", 20_000_000)), BUYER_USDT)
    step(bus, oracles, BUYER_P)
    step(bus, oracles, BUYER_P)  # both begun: four Reserves out, none decided
    until_reserved(bus, oracles, SELLER_P)
    seller = bus.procs[SELLER_P]
    assert seller.spanning.locked_amount("ask") == 20_000_000, "one reservation locked the ask, not both"
    finish(bus, oracles, seed)
    assert sorted([outcome(bus, "fill-1"), outcome(bus, "fill-2")]) == ["accepted", "capture_exceeds_hold"]
    ask = bus.hold("ask", SELLER_BTC)
    assert (ask.status.value, ask.captured, ask.remaining) == ("open", 20_000_000, 10_000_000)
    assert bus.account(BUYER_BTC) == (20_000_000, 0)
    assert bus.hold("bid", BUYER_USDT).captured == 11_980_000_000, "only the accepted fill took from the bid"


@pytest.mark.parametrize("seed", SEEDS)
def test_a_hold_locked_by_a_transaction_in_flight_expires_only_after_the_decision(seed):
    bus, oracles = checked_bus()
    expires = bus.clock + 10_000
    setup_trade(bus, ask_expires_at_ms=expires)
    send(bus, oracles, tx("fill-1", fill("fill-1", 10_000_000)), BUYER_USDT)  # half the ask, before it expires
    step(bus, oracles, BUYER_P)
    until_reserved(bus, oracles, SELLER_P)
    deposit = [("sys:world:USDT", -1, None, None), (SELLER_USDT, 1, None, None)]
    send(bus, oracles, tx("late", deposit, kind="deposit"), SELLER_USDT, at_ms=expires + 1)
    step(bus, oracles, SELLER_P)  # its log time is past the ask's expiry, but the ask is locked
    assert outcome(bus, "late") == "accepted"
    assert bus.hold("ask", SELLER_BTC).status.value == "open", "expired while a transaction had it locked"
    finish(bus, oracles, seed)
    assert outcome(bus, "fill-1") == "accepted"
    assert bus.hold("ask", SELLER_BTC).captured == 10_000_000
    send(bus, oracles, tx("later", deposit, kind="deposit"), SELLER_USDT, at_ms=expires + 2)
    finish(bus, oracles, seed)
    ask = bus.hold("ask", SELLER_BTC)
    assert (ask.status.value, ask.captured, ask.released) == ("expired", 10_000_000, 10_000_000), \
        "the unlocked rest expires with the partition's next command"


def users_in_distinct_partitions(count: int, currency: str = "USD") -> list[str]:
    found: dict[int, str] = {}
    for i in range(1000):
        account = f"user:{i}:{currency}"
        found.setdefault(routing.partition_of_account(account, N), account)
        if len(found) == count:
            return list(found.values())
    raise AssertionError("not enough partitions")


@pytest.mark.parametrize("seed", SEEDS)
def test_two_cross_partition_transactions_on_one_account_with_funds_for_one(seed):
    bus, oracles = checked_bus()
    a, b, c = users_in_distinct_partitions(3)
    for account in (a, b, c):
        send(bus, oracles, open_account(account), account)
    bus.run()
    for account in (a, b):
        send(bus, oracles, tx(f"dep:{account}", [("sys:world:USD", -100, None, None), (account, 100, None, None)],
                              kind="deposit"), account)
    bus.run()
    legs = [(a, -80, None, None), (b, -10, None, None), (c, 90, None, "USD")]
    send(bus, oracles, tx("t1", legs), a)
    send(bus, oracles, tx("t2", legs), a)
    coordinator = routing.partition_of_account(a, N)
    step(bus, oracles, coordinator)
    step(bus, oracles, coordinator)  # both begun before either reserves
    finish(bus, oracles, seed)
    assert sorted([outcome(bus, "t1"), outcome(bus, "t2")]) == ["accepted", "insufficient_funds"]
    assert [bus.account(x) for x in (a, b, c)] == [(20, 0), (90, 0), (90, 0)]


# --- order across partitions (P10) ---------------------------------------------------------------------------

@pytest.mark.parametrize("seed", SEEDS)
def test_a_close_sent_after_a_trade_never_overtakes_it(seed):
    """The producer places the trade in both partitions it debits (as LedgerClient does), so the seller's
    partition reserves the ask at the trade's own position, before the close; the close then waits for the
    trade's decision and releases exactly what the trade left."""
    bus, oracles = checked_bus()
    setup_trade(bus)
    trade = tx("fill-1", fill("fill-1", 5_000_000))
    placed = bus.send_placed(trade, BUYER_USDT)
    assert placed == [BUYER_P, SELLER_P]
    oracles.sent_command(bus.logs[BUYER_P][-1].value)
    send(bus, oracles, command("close:ask", "ReleaseHold", {"hold_id": "ask"}), SELLER_BTC)
    send(bus, oracles, command("close:bid", "ReleaseHold", {"hold_id": "bid"}), BUYER_USDT)
    finish(bus, oracles, seed)
    assert outcome(bus, "fill-1") == "accepted", "the trade was sent before the close"
    ask = bus.hold("ask", SELLER_BTC)
    assert (ask.status.value, ask.captured, ask.released) == ("released", 5_000_000, 15_000_000)
    bid = bus.hold("bid", BUYER_USDT)
    assert (bid.status.value, bid.captured, bid.released) == ("released", 2_995_000_000, 27_005_000_000)
    for close in ("close:ask", "close:bid"):
        assert outcome(bus, close) == "accepted"
        assert len([r for r in bus.results if r["command_id"] == close and not r["duplicate"]]) == 1


# --- many transactions in flight: a property test ---------------------------------------------------------------



@PROPERTY
@given(operations=operation_lists, seed=st.integers(0, 2**32 - 1), follow_up_batches=st.booleans())
def test_many_transactions_in_flight_keep_every_promise_in_any_interleaving(operations, seed, follow_up_batches):
    """A crash may cut the changelog between the redo records of two command records (the test below cuts
    anywhere)."""
    run_interleaved(operations, seed, follow_up_batches, changelog_cuts="between_records")


# A crash may cut the changelog anywhere, even between the redo records of one command (the final Vote
# writes the transaction's decision first, then its own record that ends the in-flight record): the redo
# finds the decision and completes the vote.
@PROPERTY
@given(operations=operation_lists, seed=st.integers(0, 2**32 - 1), follow_up_batches=st.booleans())
# One trade whose schedule (seed 44 with this generator) crashes the coordinator after the final Vote's own redo
# record reached the changelog but not the posting's; rerun a seed search if the generator changes.
@example(operations=[("trade", 0, 1, 99, 99, 100, 10)], seed=44, follow_up_batches=False)
# A capture whose credit lives in another partition commits its share; a crash keeps that posting's redo record
# and cuts the Decide's: the lock on the captured hold must end with the posting, not after it (P5).
@example(operations=[("retry", 0), ("hold", 2, "USDT", 50, None), ("release", 0), ("trade", 0, 1, 0, 0, 1, 1),
                     ("hold", 0, "USDT", 50, None), ("hold", 0, "USDT", 50, None), ("hold", 0, "USDT", 50, None),
                     ("capture", 0, 1, 0), ("release", 0), ("capture", 2, 1, 0), ("capture", 21, 105, 0),
                     ("trade", 0, 1, 0, 0, 1, 1), ("release", 0), ("hold", 1, "USDT", 50, None),
                     ("hold", 1, "USDT", 50, None)], seed=1805, follow_up_batches=False)
# Records delivered again after a crash whose effects the state holds: one of later log time than the record
# that expired a hold the first time must not expire it again at its own time (P7).
@example(operations=[("release", 0), ("capture", 14, 1, 0), ("freeze", 1, "USDT", False),
                     ("transfer", 1, 2, "USDT", 1), ("trade", 0, 2, 0, 1, 1, 1), ("capture", 0, 1, 0),
                     ("hold", 1, "USDT", 50, None),
                     ("hold", 0, "USDT", 50, 1), ("advance", 13), ("capture", 0, 1, 0), ("trade", 2, 1, 0, 0, 1, 1),
                     ("trade", 2, 1, 0, 0, 1, 1), ("hold", 0, "USDT", 50, 1), ("release", 0), ("release", 0),
                     ("capture", 0, 1, 0)], seed=3238, follow_up_batches=False)
# The final vote commits the coordinator's own share in place and wakes waiting commands; a crash cutting the
# woken ones' records: the redelivered vote wakes them again, at its own position (P4, P7).
@example(operations=[("transfer", 2, 2, "USDT", 229), ("advance", 10), ("transfer", 0, 1, "USDT", 36),
                     ("trade", 0, 2, 79, 12, 181, 24), ("hold", 1, "BTC", 94, 28), ("freeze", 2, "BTC", False),
                     ("freeze", 0, "USDT", True), ("transfer", 0, 0, "USDT", 208), ("trade", 1, 1, 14, 48, 203, 16),
                     ("retry", 22), ("retry", 75), ("hold", 0, "USDT", 322, 18), ("trade", 0, 1, 45, 3, 162, 21),
                     ("trade", 0, 2, 89, 30, 172, 10), ("release", 96), ("transfer", 1, 0, "USDT", 76),
                     ("transfer", 0, 2, "USDT", 282)], seed=257, follow_up_batches=True)
@example(operations=[("hold", 0, "USDT", 50, None), ("trade", 0, 1, 0, 0, 1, 1), ("release", 0), ("release", 86),
                     ("release", 1), ("hold", 1, "USDT", 50, None), ("transfer", 2, 0, "BTC", 1), ("release", 0),
                     ("freeze", 2, "BTC", True), ("hold", 0, "USDT", 50, None), ("hold", 0, "USDT", 50, None),
                     ("hold", 0, "USDT", 50, None), ("hold", 1, "USDT", 50, None), ("trade", 0, 1, 0, 0, 1, 1),
                     ("hold", 0, "USDT", 50, None)], seed=24061164, follow_up_batches=False)
def test_many_transactions_in_flight_keep_every_promise_when_a_crash_cuts_a_commands_redo_records(
        operations, seed, follow_up_batches):
    run_interleaved(operations, seed, follow_up_batches, changelog_cuts="anywhere")


@pytest.mark.parametrize("kept", [1, 2, 3])
def test_a_crash_between_the_final_votes_redo_records_loses_nothing(kept):
    """The final vote writes the decision, then the vote that ends the in-flight record, then the coordinator's
    own commit (its posting, its decide mark): a crash may keep any prefix of them, and the redelivered vote
    completes the rest, once."""
    bus, oracles = checked_bus()
    setup_trade(bus)
    send(bus, oracles, tx("fill-1", TRADE), BUYER_USDT)
    step(bus, oracles, BUYER_P)  # begun; the coordinator reserves its own legs at once and counts its vote
    step(bus, oracles, SELLER_P)  # the seller's partition reserves and votes
    # The final vote: all outputs out (the result, the Decide to the seller), then only `kept` of its redo
    # records reach the changelog before the worker dies.
    bus.step(BUYER_P, crash=Crash("changelog", kept))
    bus.run()
    assert outcome(bus, "fill-1") == "accepted"
    assert bus.account(BUYER_BTC) == (19_980_000, 0), "the buyer's BTC was never credited"
    oracles.check_quiet()


def test_p11_forged_engine_steps():
    pytest.skip("P11 (forged engine steps reaching a worker through the commands topic) belongs to later work; "
                "this bus delivers only what clients and workers send")
