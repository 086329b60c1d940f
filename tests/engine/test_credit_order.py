"""A payment sent after a transfer to the account it spends from is decided after that transfer (P10), in the
partition where the money arrives, also while the transfer is still in flight across partitions: the debit the
credit in flight could fund waits for the transfer's decision (spanning.Spanning._awaits_credit) instead of
being refused for the money the transfer is bringing. Broker-free, through eight partition processors (through
the broker: tests/engine/test_cross_partition.py)."""
from __future__ import annotations

import pytest

from schemas.codec import codec
from streams import names, placement, routing, spanning
from streams.core.policy import ClientPolicy
from streams.inflight import coordinator_key, vote_owed_key
from streams.waiting import COPIED_CREDIT_WAIT_MS
from tests.helpers import forged
from tests.helpers.bus import Bus, Record, assert_books_balance
from tests.helpers.interleavings import (EVERYONE, X1, X2, Y1, Y2, balances, checked_bus, finish,
                                        funded_two_partitions, send)
from tests.helpers.records import linked, local_users, open_account, place_hold, transfer


C = codec()


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



# --- what a review of the wait found (each failed before its fix) --------------------------------------------
def _answers(bus: Bus, *ids: str) -> list[tuple | None]:
    return [next(((r["outcome"], r["reason"]) for r in bus.results if r["command_id"] == i and not r["duplicate"]),
                 None) for i in ids]


def _later(bus: Bus, ms: int) -> None:
    """Log time moves ms on in partitions 0 and 1 (a command each), and everything is delivered."""
    at = bus.clock + ms
    bus.send(open_account("user:late-0:USD"), X1, at)
    bus.send(open_account("user:late-1:USD"), Y1, at)
    bus.run()


def test_two_payments_each_waiting_for_the_other_s_copied_credit_wait_only_so_long():
    """X1 (partition 0, 1,000) sends Y1 1,200 and Y1 (partition 1, 100) sends X1 300 at once: each partition reads
    the other's copy first, so each payment finds the other's credit in flight, reserved by a copy only, and
    waits; neither transaction begins, so neither credit is decided. A credit only a copy reserved is waited for
    COPIED_CREDIT_WAIT_MS of log time, not until the copies are dropped (COPY_WAIT_MS): then both are judged on
    what they hold and refused, and the deposit queued behind them posts."""
    bus = funded_two_partitions()
    bus.send(transfer("dep-y", ("sys:world:USD", -100), (Y1, 100)), Y1)
    bus.run()
    bus.send_placed(transfer("t1", (X1, -1_200), (Y1, 1_200)), X1)
    bus.send_placed(transfer("t2", (Y1, -300), (X1, 300)), Y1)
    logs = bus.logs[0]
    logs[-2], logs[-1] = logs[-1], logs[-2]  # partition 0 reads t2's copy before t1
    bus.run()
    bus.send(transfer("dep-x", ("sys:world:USD", -5), (X1, 5)), X1)
    bus.run()
    assert _answers(bus, "t1", "t2", "dep-x") == [None, None, None]  # waiting, the deposit behind t1
    _later(bus, COPIED_CREDIT_WAIT_MS + 1)
    assert _answers(bus, "t1", "t2", "dep-x") == [("rejected", "insufficient_funds")] * 2 + [("accepted", None)]
    assert_books_balance(bus, ("USD",))


def test_a_cycle_through_the_order_of_waiting_commands_ends_as_well():
    """No transaction waits for a credit itself: in partition 0 a payment X2 -> X1 waits for T2's copied credit
    to X2, and T1 (X1 -> Y1, coordinated there) keeps its place behind it; in partition 1 a payment Y1 -> Y2
    waits for T1's copied credit to Y1, and T2 (Y2 -> X2) behind it. After COPIED_CREDIT_WAIT_MS both payments
    are judged on what they hold (refused), and both transfers go on."""
    bus = funded_two_partitions()
    bus.send(transfer("dep-y2", ("sys:world:USD", -100), (Y2, 100)), Y2)
    bus.run()
    bus.send_placed(transfer("t1", (X1, -100), (Y1, 100)), X1)
    bus.send_placed(transfer("t2", (Y2, -100), (X2, 100)), Y2)
    bus.send(transfer("d0", (X2, -50), (X1, 50)), X2)
    bus.send(transfer("d1", (Y1, -50), (Y2, 50)), Y1)
    p0, p1 = bus.logs[0], bus.logs[1]
    p0[-3:] = [p0[-2], p0[-1], p0[-3]]  # t2's copy, d0, t1
    p1[-3:] = [p1[-3], p1[-1], p1[-2]]  # t1's copy, d1, t2
    bus.run()
    assert _answers(bus, "t1", "t2", "d0", "d1") == [None] * 4
    _later(bus, COPIED_CREDIT_WAIT_MS + 1)
    assert _answers(bus, "t1", "t2", "d0", "d1") == [("accepted", None)] * 2 + [("rejected", "insufficient_funds")] * 2
    assert_books_balance(bus, ("USD",))


def test_a_credit_the_coordinator_has_begun_is_waited_for_past_that_bound():
    """The transfer's Reserve has reserved its credit (its coordinator began it), but its decision is late: the
    payment chasing it waits as long as that takes, since a begun transaction is decided whatever waits
    anywhere."""
    bus = funded_two_partitions()
    bus.send(transfer("in", (X1, -600), (Y1, 600)), X1)  # not placed: partition 1 gets the Reserve only
    bus.step(0)  # begun: the Reserve is in partition 1's log
    bus.step(1)  # reserved there
    bus.send(transfer("out", (Y1, -500), (Y2, 500)), Y1)
    bus.step(1)
    bus.send(open_account("user:late-1:USD"), Y1, bus.clock + COPIED_CREDIT_WAIT_MS + 1)
    bus.step(1)  # log time is past the bound: still waiting
    assert _answers(bus, "out") == [None]
    bus.run()
    assert _answers(bus, "in", "out") == [("accepted", None)] * 2
    assert balances(bus) == {X1: (400, 0), X2: (0, 0), Y1: (100, 0), Y2: (500, 0)}


def test_a_debit_the_credits_in_flight_could_not_fund_is_refused_at_once():
    """A payout of 1,000,000 from Y1 (it holds nothing) with a transfer of 100 to Y1 in flight: it cannot fit
    whatever the transfer does, so it does not wait, and a deposit sent after it does not wait behind it."""
    bus = funded_two_partitions()
    bus.send_placed(transfer("in-0", (X1, -100), (Y1, 100)), X1)
    bus.step(1)  # the copy: 100 to Y1 in flight
    bus.send(transfer("big", (Y1, -1_000_000), (Y2, 1_000_000)), Y1)
    bus.step(1)
    bus.send(transfer("dep-y", ("sys:world:USD", -5), (Y1, 5)), Y1)
    bus.step(1)
    assert _answers(bus, "big", "dep-y") == [("rejected", "insufficient_funds"), ("accepted", None)]
    bus.run()
    assert balances(bus)[Y1] == (105, 0)


@pytest.mark.parametrize("across", [False, True], ids=["in one partition", "across partitions"])
def test_a_linked_batch_that_funds_its_own_debit_does_not_wait_for_a_credit_in_flight(across):
    """Y1 holds nothing and X1's transfer to Y1 is reserved in partition 1 (its copy). A linked batch deposits 100
    to Y1 and pays 100 out of it: the batch credits before it debits, so it fits whatever the transfer does, and
    is decided at once (it was refused in_flight when the wait judged the payment without the batch's deposit)."""
    bus = funded_two_partitions()
    bus.send_placed(transfer("in", (X1, -600), (Y1, 600)), X1)
    bus.step(1)
    payee = X2 if across else Y2
    bus.send(linked(transfer("l-dep", ("sys:world:USD", -100), (Y1, 100)),
                    transfer("l-pay", (Y1, -100), (payee, 100))), Y1)
    bus.run()
    assert _answers(bus, "l-dep", "l-pay", "in") == [("accepted", None)] * 3
    assert balances(bus)[payee] == (100, 0) and balances(bus)[Y1] == (600, 0)
    assert_books_balance(bus, ("USD",))


@pytest.mark.parametrize("restart", [False, True], ids=["running", "restarted while its vote is owed"])
def test_a_share_reserved_by_a_copy_waits_for_the_credits_in_flight_too(restart):
    """The same client sends X1 -> Y1 600, then X1 -100, Y1 -100 -> X2 (coordinated in partition 0). In that order
    both fit. Partition 1 reads the second's copy while the first's credit is in flight there: the copy waits, and
    the coordinator's Reserve, which comes while it waits, waits with it (the copy votes once decided). Before,
    the copy was judged at once and the Reserve reserved afresh: refused for the money the first was bringing."""
    bus = funded_two_partitions()
    bus.send_placed(transfer("in", (X1, -600), (Y1, 600)), X1)
    bus.send_placed(transfer("two", (X1, -100), (Y1, -100), (X2, 200)), X1)
    bus.step(1)  # in's copy: 600 to Y1 reserved
    bus.step(1)  # two's copy: Y1 -100 waits for that credit
    bus.step(0)
    bus.step(0)  # both begun: their Reserves are in partition 1's log, in's first
    bus.step(1)  # in's Reserve: its copy's reservation is the vote
    bus.step(1)  # two's Reserve: its copy still waits, so does the vote
    assert _answers(bus, "in", "two") == [None, None]
    assert bus.procs[1].state.record(vote_owed_key("t/two")) is not None
    if restart:
        bus.crash_restore(1)
    bus.run()
    assert _answers(bus, "in", "two") == [("accepted", None)] * 2
    assert balances(bus) == {X1: (300, 0), X2: (200, 0), Y1: (500, 0), Y2: (0, 0)}
    assert bus.procs[1].state.record(vote_owed_key("t/two")) is None
    assert_books_balance(bus, ("USD",))


def test_two_copies_each_waiting_for_the_other_s_begun_transaction_vote_after_the_bound():
    """T1 (coordinated in partition 0) credits X2 and debits Y1, which holds nothing; T2 (coordinated in partition
    1) credits Y1 and debits X2, which holds nothing. Each partition begins its own transaction first, so each
    copy finds the other's credit in flight, begun, and waits, and each coordinator's Reserve waits for that copy:
    each transaction waits for the other. A copy whose vote is owed waits COPIED_CREDIT_WAIT_MS of log time at
    most; then both are judged on what the accounts hold (neither can go first: both refused), not never."""
    bus = funded_two_partitions()
    bus.send(transfer("dep-y2", ("sys:world:USD", -1_000), (Y2, 1_000)), Y2)
    bus.run()
    bus.send_placed(transfer("t1", (X1, -100), (X2, 150), (Y1, -50)), X1)
    bus.send_placed(transfer("t2", (Y2, -100), (Y1, 150), (X2, -50)), Y2)
    log = bus.logs[1]
    log[-2], log[-1] = log[-1], log[-2]  # partition 1 reads t2 (its own) before t1's copy, as partition 0 t1
    bus.run()
    assert _answers(bus, "t1", "t2") == [None, None], "each waits for the other"
    _later(bus, COPIED_CREDIT_WAIT_MS + 1)
    assert _answers(bus, "t1", "t2") == [("rejected", "insufficient_funds")] * 2
    assert balances(bus) == {X1: (1_000, 0), X2: (0, 0), Y1: (0, 0), Y2: (1_000, 0)}
    for p in (0, 1):
        assert not bus.stored(p, b"e/r/") and not bus.stored(p, b"e/rv/") and not bus.stored(p, b"e/wq/")
    assert_books_balance(bus, ("USD",))


def _bound_outlives(restart: bool) -> list:
    """D (X1 -> X2 1,200; X1 holds 1,000) waits for a begun credit of 300 (b, which will abort) and a copied one
    of 300 (c, whose coordinator does not read it). Its wait for the copied credit ends while b still holds it
    back; then b aborts (its Decide carries b's own, older, log time), and much later another record comes.
    The end of that wait is in the queue's record, so d is judged on what X1 holds whatever the drain's log
    time, and the same with a restart between two records."""
    bus = funded_two_partitions()
    bus.send(transfer("b", (Y2, -300), (X1, 300)), Y2)  # coordinated in partition 1; Y2 holds nothing
    bus.step(1)  # begun: the Reserve is in partition 0's log
    bus.step(0)  # partition 0 reserves b's credit to X1
    bus.send_placed(transfer("c", (Y1, -300), (X1, 300)), Y1)
    bus.step(0)  # c's copy: 300 more to X1, reserved by the copy only
    bus.send(transfer("d", (X1, -1_200), (X2, 1_200)), X1)
    bus.step(0)
    waited = _answers(bus, "d")
    bus.send(open_account("user:late-0:USD"), X1, bus.clock + COPIED_CREDIT_WAIT_MS + 1)
    bus.step(0)  # the copied wait is over; d still waits, rightly, for b: 1,000 + 300 >= 1,200
    still = _answers(bus, "d")
    bus.step(1)  # b's vote: b is refused (Y2 holds nothing); its Decide goes to partition 0
    bus.step(0)  # b's credit released: d is judged again
    if restart:
        bus.crash_restore(0)
    bus.send(open_account("user:later-0:USD"), X1, bus.clock + 60_000)
    bus.step(0)
    return [waited, still, _answers(bus, "d")]


@pytest.mark.parametrize("restart", [False, True], ids=["running", "restarted between two records"])
def test_the_end_of_a_wait_for_copied_credits_outlives_older_log_times_and_restarts(restart):
    assert _bound_outlives(restart) == [[None], [None], [("rejected", "insufficient_funds")]]


def test_a_linked_batch_counts_a_copied_credit_only_for_a_while():
    """A copy's credit to Y1 whose coordinator never reads it: a linked batch paying out of that money is refused
    in_flight (send it again) while the copy is recent, and judged on what Y1 holds (refused for funds) once
    COPIED_CREDIT_WAIT_MS has passed since the copy, not for the copy's whole life (COPY_WAIT_MS)."""
    bus = funded_two_partitions()
    bus.send_placed(transfer("in", (X1, -600), (Y1, 600)), X1)
    bus.logs[0].pop()  # its coordinator never gets it (the producer died between its sends)
    bus.step(1)
    bus.send(linked(transfer("l1", ("sys:world:USD", -1), (Y1, 1)), transfer("l2", (Y1, -100), (Y2, 100))), Y1)
    bus.run()
    assert _answers(bus, "l2") == [("rejected", "in_flight")]
    at = bus.clock + COPIED_CREDIT_WAIT_MS + 1
    bus.send(linked(transfer("l3", ("sys:world:USD", -1), (Y1, 1)), transfer("l4", (Y1, -100), (Y2, 100))), Y1, at)
    bus.run()
    assert _answers(bus, "l4") == [("rejected", "insufficient_funds")]


def _two_with_its_vote_owed() -> Bus:
    """The setting of the test above, stopped once partition 1 owes the vote of "two" (its copy waits)."""
    bus = funded_two_partitions()
    bus.send_placed(transfer("in", (X1, -600), (Y1, 600)), X1)
    bus.send_placed(transfer("two", (X1, -100), (Y1, -100), (X2, 200)), X1)
    for partition in (1, 1, 0, 0, 1, 1):  # both copies, both begins, both Reserves
        bus.step(partition)
    assert bus.procs[1].state.record(vote_owed_key("t/two")) is not None
    return bus


def test_an_abort_that_comes_while_the_vote_is_owed_leaves_nothing_reserved():
    """The coordinator aborts "two" while partition 1 still owes its vote (as it did when it refused a retry of
    the transaction under a changed policy): the copy, decided later, finds the decision and reserves
    nothing. Before, it reserved and voted, and the coordinator's answer to that vote, an abort under the step
    id the first one had used, was taken for a duplicate: a reservation nothing ended, holding Y1's money."""
    bus = _two_with_its_vote_owed()
    abort = forged.decide(names.step_id("t/two", names.DECIDE, 1), False, "t", "two")
    bus.logs[1].append(Record(bus.clock, b"k", abort, bus._seal(1, abort)))
    bus.run()
    assert not bus.stored(1, b"e/r/t/two") and not bus.stored(1, b"e/rv/"), "a reservation nothing ends"
    assert not [e for e in bus.history if e["account_id"] == Y1 and "two" in (e["command_id"] or "")], \
        "partition 1 moved money for an aborted transaction"


def test_a_copy_of_another_payload_waiting_under_the_same_ids_votes_for_what_the_coordinator_judged():
    """A broken or hostile producer places "two" in partition 0 and, under the same ids, another payload in
    partition 1 (Y1 -150 there). Partition 1's copy waits for the credit in flight; the coordinator's Reserve
    (for the payload partition 0 began) comes meanwhile and waits for it. The vote partition 1 then sends is for
    the Reserve's transaction, which it reserves and later posts: the books balance. Before, it reserved and
    posted the copy's legs, which the coordinator never judged, and clearing no longer summed to zero."""
    bus = funded_two_partitions()
    bus.send_placed(transfer("in", (X1, -600), (Y1, 600)), X1)
    at = bus.clock + 1
    for partition, value in ((0, transfer("two", (X1, -100), (Y1, -100), (X2, 200))),
                             (1, transfer("two", (X1, -100), (Y1, -150), (X2, 250)))):
        record = C.decode("command", value)
        placed, partitions = placement.placements(record, X1, bus.n)
        assert partitions == [0, 1]
        bus.send_to(partition, C.encode("command", placed), at, routing.routing_key_for(X1).encode())
    for partition in (1, 1, 0, 0, 1, 1):  # both copies (two's waits), both begins, both Reserves
        bus.step(partition)
    assert bus.procs[1].state.record(vote_owed_key("t/two")) is not None
    bus.run()
    assert _answers(bus, "in", "two") == [("accepted", None)] * 2
    assert balances(bus) == {X1: (300, 0), X2: (200, 0), Y1: (500, 0), Y2: (0, 0)}
    assert_books_balance(bus, ("USD",))


def test_a_retry_of_a_transaction_under_way_is_answered_by_its_decision_whatever_the_policy_says_now():
    """The client's policy at the coordinator changes while "two" is in flight (its clients file reloaded), and
    the client sends "two" again: the retry is answered when the transaction is decided, with its decision.
    Before, the retry was judged again under the new policy, refused not_permitted and remembered while the
    transaction went on, and the abort sent for it reached partition 1 before its vote."""
    bus = _two_with_its_vote_owed()
    bus.procs[0].clients = _Clients(debit=())  # the policy now lets client t debit nothing
    bus.send_placed(transfer("two", (X1, -100), (Y1, -100), (X2, 200)), X1)  # the client's retry
    bus.run()
    decisions = [(r["outcome"], r["reason"]) for r in bus.results if r["command_id"] == "two"]
    assert decisions and set(decisions) == {("accepted", None)}, decisions
    assert balances(bus) == {X1: (300, 0), X2: (200, 0), Y1: (500, 0), Y2: (0, 0)}
    assert_books_balance(bus, ("USD",))


class _Clients:
    """The clients file as the partition sees it (streams/authn.py): every record taken as client t's (the
    signatures are tests/engine/test_authn.py's), t's policy as given."""

    def __init__(self, debit: tuple[str, ...]):
        self._policy = ClientPolicy("t", debit=debit, credit=("*",), open=("*",), freeze=("*",), hold=("*",))

    def authenticate(self, topic, partition, value, headers) -> tuple[str, str]:
        return "t", ""

    def policy(self, client_id: str) -> ClientPolicy:
        return self._policy



def test_a_waiting_command_that_only_shares_the_ids_is_not_taken_for_the_copy():
    """Partition 1 queues a payment of its own under the ids of a transaction T that partition 0 coordinates
    (the same client reusing a command id). T's Reserve must not take that payment for T's copy: it reserves
    and votes at once. Before, it recorded a vote owed that nothing ever paid: T never decided, X1's 50 held
    (a review's finding, verified by this test)."""
    bus = funded_two_partitions()
    bus.send(transfer("in", (X1, -600), (Y1, 600)), X1)
    bus.step(0)
    bus.step(1)  # in reserved in partition 1: a begun credit; its vote is in partition 0's log
    bus.send(transfer("t", (Y1, -500), (Y2, 500)), Y1)  # a local payment, ids t/t
    bus.step(1)  # waits for in's credit
    bus.send(transfer("t", (X1, -50), (Y1, 50)), X1)  # T, the same ids, coordinated in partition 0
    log = bus.logs[0]
    log[-2], log[-1] = log[-1], log[-2]  # T begins before in's vote is read
    bus.step(0)
    bus.step(1)  # T's Reserve
    bus.run()
    _later(bus, COPIED_CREDIT_WAIT_MS + 1)
    assert bus.procs[1].state.record(vote_owed_key("t/t")) is None, "a vote owed for ever"
    assert bus.procs[0].state.record(coordinator_key("t/t")) is None, "T never decided, X1's 50 held"
    assert_books_balance(bus, ("USD",))


def test_a_copy_sent_again_while_the_first_waits_leaves_the_vote_to_the_first(monkeypatch):
    """The copy of "two" waits and its Reserve leaves the vote owed; the producer sends "two" again while the
    waiting queue is full (WAITING_LIMIT, 1 here). Before, the second copy was refused in_flight as the copy's
    step, which the first then found and did nothing: no vote was ever sent (a review's finding). Now a copy
    already waiting here is not queued or refused again, and the first votes at its turn."""
    monkeypatch.setattr(spanning, "WAITING_LIMIT", 1)
    bus = _two_with_its_vote_owed()
    bus.send_placed(transfer("two", (X1, -100), (Y1, -100), (X2, 200)), X1)  # the producer's retry
    bus.run()
    _later(bus, COPIED_CREDIT_WAIT_MS + 1)
    assert _answers(bus, "in", "two") == [("accepted", None)] * 2
    assert balances(bus) == {X1: (300, 0), X2: (200, 0), Y1: (500, 0), Y2: (0, 0)}
    assert_books_balance(bus, ("USD",))


def test_a_copy_of_another_payload_sent_while_the_copy_waits_does_not_take_its_step(monkeypatch):
    """As the test above, but the copy sent again carries another payload under the same ids, naming no
    account of the waiting copy (its share, Y2 -100, itself waits for a credit in flight), while the queue is
    full. It must not be refused as the copy's step either: the waiting copy votes at its turn. Before, whether
    a copy waited was looked up by the keys of the one arriving (a review's finding)."""
    monkeypatch.setattr(spanning, "WAITING_LIMIT", 1)
    bus = funded_two_partitions()
    x3 = next(u for u in local_users(50, 0) if u not in EVERYONE)  # in partition 0, named by no other command
    bus.send(open_account(x3), x3)
    bus.send(transfer("dep3", ("sys:world:USD", -100), (x3, 100)), x3)
    bus.run()
    bus.send_placed(transfer("in", (X1, -600), (Y1, 600)), X1)
    bus.send_placed(transfer("in2", (X1, -300), (Y2, 300)), X1)
    bus.send_placed(transfer("two", (X1, -100), (Y1, -100), (X2, 200)), X1)
    for partition in (1, 1, 1, 0, 0, 0, 1, 1, 1):  # the copies (two's waits), the begins, the Reserves
        bus.step(partition)
    assert bus.procs[1].state.record(vote_owed_key("t/two")) is not None
    other = C.decode("command", transfer("two", (x3, -100), (Y2, -100), (x3, 200)))  # no account of the first
    placed, partitions = placement.placements(other, x3, bus.n)
    assert partitions == [0, 1]
    bus.send_to(1, C.encode("command", placed), None, routing.routing_key_for(X1).encode())
    bus.run()
    _later(bus, COPIED_CREDIT_WAIT_MS + 1)
    assert _answers(bus, "in", "in2", "two") == [("accepted", None)] * 3
    assert balances(bus) == {X1: (0, 0), X2: (200, 0), Y1: (500, 0), Y2: (300, 0)}
    assert_books_balance(bus, ("USD",))
