"""A payment sent after a transfer to the account it spends from is decided after that transfer (P10), in the
partition where the money arrives, also while the transfer is still in flight across partitions: the debit the
credit in flight could fund waits for the transfer's decision (spanning.Spanning._awaits_credit) instead of
being refused for the money the transfer is bringing. Broker-free, through eight partition processors (through
the broker: tests/engine/test_cross_partition.py)."""
from __future__ import annotations

import pytest

from tests.helpers.bus import Bus, assert_books_balance
from tests.helpers.interleavings import (EVERYONE, X1, X2, Y1, Y2, balances, checked_bus, finish,
                                        funded_two_partitions, send)
from tests.helpers.records import linked, open_account, place_hold, transfer


def answer(bus: Bus, command_id: str) -> tuple:
    found = [(r["outcome"], r["reason"]) for r in bus.results if r["command_id"] == command_id]
    assert len(found) == 1, found
    return found[0]


@pytest.mark.parametrize("placed", ["copies", "reserve first"])
def test_a_payment_from_money_in_flight_waits_for_the_transfer_and_spends_it(placed):
    """X1 sends Y1 600 across partitions, then Y1 pays Y2 500 in partition 1. Partition 1 reads the transfer's
    copy (or its Reserve) before the payment: the payment waits, and posts once the transfer has."""
    bus = funded_two_partitions()
    if placed == "copies":
        bus.send_placed(transfer("in", (X1, -600), (Y1, 600)), X1)
    else:
        bus.send(transfer("in", (X1, -600), (Y1, 600)), X1)
        bus.step(0)  # begun: the Reserve is in partition 1's log
    bus.send(transfer("out", (Y1, -500), (Y2, 500)), Y1)
    bus.step(1)  # the copy or the Reserve: the credit of 600 to Y1 is counted in flight
    bus.step(1)  # the payment: waits
    assert not [r for r in bus.results if r["command_id"] == "out"], "decided before the transfer"
    bus.run()
    assert (answer(bus, "in"), answer(bus, "out")) == (("accepted", None), ("accepted", None))
    assert balances(bus) == {X1: (400, 0), X2: (0, 0), Y1: (100, 0), Y2: (500, 0)}
    assert_books_balance(bus, ("USD",))


def test_when_the_transfer_fails_the_waiting_payment_is_refused_for_funds():
    """The transfer is refused in partition 0 after partition 1 reserved its credit (X1 spends its money first
    there): the payment that waited is then judged on what Y1 holds, and refused."""
    bus = funded_two_partitions()
    bus.send_placed(transfer("in", (X1, -600), (Y1, 600)), X1)
    bus.send(transfer("first", (X1, -900), (X2, 900)), X1)  # reaches partition 0 before the transfer's begin
    bus.send(transfer("out", (Y1, -500), (Y2, 500)), Y1)
    bus.step(1)
    bus.step(1)
    logs = bus.logs[0]
    logs[-2], logs[-1] = logs[-1], logs[-2]  # partition 0 reads "first" before "in"
    bus.run()
    assert (answer(bus, "first"), answer(bus, "in"), answer(bus, "out")) == (
        ("accepted", None), ("rejected", "insufficient_funds"), ("rejected", "insufficient_funds"))
    assert balances(bus) == {X1: (100, 0), X2: (900, 0), Y1: (0, 0), Y2: (0, 0)}
    assert_books_balance(bus, ("USD",))


def test_a_hold_and_a_linked_batch_s_copy_wait_the_same_way():
    """The credit in flight is a linked batch's, reserved by its copy; a hold on it sent after waits too."""
    bus = funded_two_partitions()
    bus.send_linked_placed(linked(transfer("l1", (X1, -300), (Y1, 300)), transfer("l2", (X1, -300), (Y2, 300))), X1)
    bus.send(place_hold("h", Y1, 250, None), Y1)
    bus.step(1)
    bus.step(1)
    assert not [r for r in bus.results if r["command_id"] == "hold:h"], "decided before the batch"
    bus.run()
    assert [answer(bus, i) for i in ("l1", "l2", "hold:h")] == [("accepted", None)] * 3
    assert balances(bus) == {X1: (400, 0), X2: (0, 0), Y1: (300, 250), Y2: (300, 0)}


def test_a_payment_that_would_fit_without_the_credit_does_not_wait():
    bus = funded_two_partitions()
    bus.send(transfer("dep-y", ("sys:world:USD", -50), (Y1, 50)), Y1)
    bus.run()
    bus.send_placed(transfer("in", (X1, -600), (Y1, 600)), X1)
    bus.send(transfer("small", (Y1, -40), (Y2, 40)), Y1)
    bus.step(1)
    bus.step(1)
    assert answer(bus, "small") == ("accepted", None)
    bus.run()
    assert balances(bus) == {X1: (400, 0), X2: (0, 0), Y1: (610, 0), Y2: (40, 0)}


@pytest.mark.parametrize("seed", range(4))
def test_payments_chasing_transfers_keep_every_promise_through_crashes(seed):
    """Chains of transfers across partitions, each followed at once by a payment out of the money it brings,
    delivered in a random order with crashes: every oracle holds, and every payment posts."""
    bus, oracles = checked_bus(changelog_cuts="transaction")
    for account in EVERYONE:
        send(bus, oracles, open_account(account), account)
    send(bus, oracles, transfer("dep", ("sys:world:USD", -1_000), (X1, 1_000)), X1)
    bus.run()
    for i in range(6):
        value = transfer(f"in-{i}", (X1, -100), (Y1, 100))
        oracles.sent_command(value)
        bus.send_placed(value, X1)
        send(bus, oracles, transfer(f"out-{i}", (Y1, -60), (Y2, 60)), Y1)
    finish(bus, oracles, seed)
    assert all(answer(bus, f"out-{i}") == ("accepted", None) for i in range(6))
    assert balances(bus) == {X1: (400, 0), X2: (0, 0), Y1: (240, 0), Y2: (360, 0)}


def test_a_payment_across_partitions_from_money_in_flight_waits_too():
    """Y1 pays X2 (partition 0) 500 out of the 600 X1's transfer is bringing: the payment's share in partition 1
    (its coordinator's) would hold 500 of Y1, which the core refuses for funds now, so it waits."""
    bus = funded_two_partitions()
    bus.send_placed(transfer("in", (X1, -600), (Y1, 600)), X1)
    bus.send_placed(transfer("out", (Y1, -500), (X2, 500)), Y1)
    bus.step(1)
    bus.step(1)
    assert not [r for r in bus.results if r["command_id"] == "out"], "decided before the transfer"
    bus.run()
    assert (answer(bus, "in"), answer(bus, "out")) == (("accepted", None), ("accepted", None))
    assert balances(bus) == {X1: (400, 0), X2: (500, 0), Y1: (100, 0), Y2: (0, 0)}
    assert_books_balance(bus, ("USD",))

