"""Returns of a payment whose money crossed partitions, through eight in-memory partition processors (no
broker): the payment X -> Y is remembered in two shares, ``X -> clearing@x`` in X's partition and
``clearing@y -> Y`` in Y's, and a return Y -> X goes through the two phases, each partition judging its
own share of the return against the payment's share there (streams/core/returns.py, judge_named), the
payee's partition counting the returns in flight (docs/wallet-operations.md, "Returns of a payment whose
money crossed partitions"). Amounts are minor units of USD (scale 2): 100_00 is 100.00.
"""
from __future__ import annotations

import pytest

from streams import routing
from streams.core.returns import RETURNS_KEY
from tests.helpers.bus import CRASH_POINTS, Bus, Crash, assert_books_balance
from tests.helpers.records import N, command, local_users, open_account, tx

A, B = local_users(1, partition=0)[0], local_users(1, partition=1)[0]  # the payer, the payee
A_P, B_P = routing.partition_of_account(A, N), routing.partition_of_account(B, N)
B_RECEIVABLE = f"{routing.routing_key_for(B)}:receivable.USD"


def a_return(return_id: str, payment: str, amount: int, client: str = "t", payee: str = B, payer: str = A,
             kind: str = "return") -> bytes:
    """As LedgerClient.return_payment sends it: two legs, linked to the payment, naming it in ledger.returns."""
    return command(return_id, "PostTransaction", {
        "transaction_id": return_id, "kind": kind, "reference": None, "links": [payment],
        "metadata": {RETURNS_KEY: payment}, "occurred_at_ms": None, "rate_snapshot_id": None,
        "legs": [{"account_id": payee, "amount": str(-amount), "hold_id": None, "currency": None},
                 {"account_id": payer, "amount": str(amount), "hold_id": None, "currency": None}]}, client)


def paid_and_spent(spent: int = 30_00, a_cap: int | None = None) -> Bus:
    """A deposits 100.00 and pays B 100.00 (across partitions); B spends `spent` of it."""
    bus = Bus()
    bus.send(open_account(A, max_balance=a_cap), A)
    bus.send(open_account(B), B)
    bus.send(tx("dep", [("sys:world:USD", -100_00, None, None), (A, 100_00, None, None)], kind="deposit"), A)
    bus.run()
    bus.send(tx("pay", [(A, -100_00, None, None), (B, 100_00, None, None)], kind="transfer"), A)
    bus.run()
    if spent:
        bus.send(tx("spend", [(B, -spent, None, None), ("sys:world:USD", spent, None, None)], kind="withdrawal"), B)
        bus.run()
    assert [bus.result(c)["outcome"] for c in ("dep", "pay", *(["spend"] if spent else []))] == ["accepted"] * (
        3 if spent else 2)
    return bus


def answers(bus: Bus, *command_ids: str) -> list[tuple[str, str | None]]:
    return [(bus.result(c)["outcome"], bus.result(c)["reason"]) for c in command_ids]


def share(bus: Bus, partition: int, transaction_id: str):
    return bus.procs[partition].state.transaction(transaction_id)


def test_a_payment_across_partitions_spent_in_part_is_returned_whole_the_spent_part_on_the_receivable():
    bus = paid_and_spent()
    bus.send(a_return("ret-1", "pay", 100_00), B)
    bus.run()
    bus.send(a_return("ret-2", "pay", 1), B)
    bus.run()
    assert answers(bus, "ret-1", "ret-2") == [("accepted", None), ("rejected", "exceeds_unreturned")]
    assert bus.result("ret-2")["detail"] == ("return of 1 exceeds the 0 unreturned of pay "
                                             "(10000 of 10000 returned already)")
    assert bus.account(A) == (100_00, 0), "all of it back"
    assert bus.account(B) == (0, 0), "the 70.00 left is taken"
    assert bus.account(B_RECEIVABLE) == (-30_00, 0), "the 30.00 spent is what B owes"
    # Each share keeps the client, the payment's shares count the return, the return's shares say what they return.
    for p in (A_P, B_P):
        assert (share(bus, p, "pay").client_id, share(bus, p, "pay").returned) == ("t", 100_00)
        assert (share(bus, p, "ret-1").client_id, share(bus, p, "ret-1").returns) == ("t", "pay")
    ret = sorted((h["account_id"].split("@")[0], h["amount"], h["kind"], tuple(h["links"]))
                 for h in bus.history if h["transaction_id"] == "ret-1")
    assert ret == sorted([(A, "10000", "return", ("pay",)), (B, "-7000", "return", ("pay",)),
                          (B_RECEIVABLE, "-3000", "return", ("pay",)),
                          ("sys:clearing:USD", "10000", "return", ("pay",)),
                          ("sys:clearing:USD", "-10000", "return", ("pay",))])
    assert_books_balance(bus, ("USD",))


def test_a_return_in_parts_takes_what_is_left_first_and_never_more_than_was_paid():
    bus = paid_and_spent()
    bus.send(a_return("ret-1", "pay", 50_00), B)  # 70.00 left: all of it from B
    bus.run()
    bus.send(a_return("ret-2", "pay", 50_00, kind="chargeback"), B)  # 20.00 left: 30.00 on the receivable
    bus.run()
    bus.send(a_return("ret-3", "pay", 1), B)
    bus.run()
    assert answers(bus, "ret-1", "ret-2", "ret-3") == [("accepted", None)] * 2 + [("rejected", "exceeds_unreturned")]
    assert (bus.account(A), bus.account(B), bus.account(B_RECEIVABLE)) == ((100_00, 0), (0, 0), (-30_00, 0))
    assert_books_balance(bus, ("USD",))


def test_a_return_across_partitions_is_judged_as_in_one_partition():
    """Another client's return, a payment neither share knows, a return of a return, three legs, the payer
    not the one paid: refused with the reason one partition would give, and nothing moves or stays reserved."""
    bus = paid_and_spent(spent=0)
    bus.send(tx("local", [(B, -10_00, None, None), ("sys:world:USD", 10_00, None, None)], kind="withdrawal"), B)
    other_payer = local_users(2, partition=0)[1]
    bus.send(open_account(other_payer), other_payer)
    bus.run()
    bus.send(a_return("by-other", "pay", 10_00, client="other"), B)
    bus.send(a_return("unknown", "no-such-payment", 10_00), B)
    bus.send(a_return("to-other", "pay", 10_00, payer=other_payer), B)
    # A payment of B's partition alone (to sys:world): B's partition votes not_returnable (its payer is not
    # A), A's partition never posted it (unknown_transaction, the more urgent reason, as ever across votes).
    bus.send(a_return("of-local", "local", 10_00), B)
    three = command("three", "PostTransaction", {
        "transaction_id": "three", "kind": "return", "reference": None, "links": ["pay"],
        "metadata": {RETURNS_KEY: "pay"}, "occurred_at_ms": None, "rate_snapshot_id": None,
        "legs": [{"account_id": B, "amount": "-1000", "hold_id": None, "currency": None},
                 {"account_id": A, "amount": "500", "hold_id": None, "currency": None},
                 {"account_id": other_payer, "amount": "500", "hold_id": None, "currency": None}]})
    bus.send(three, B)
    bus.run()
    assert answers(bus, "by-other", "unknown", "to-other", "of-local", "three") == [
        ("rejected", "client_mismatch"), ("rejected", "unknown_transaction"), ("rejected", "not_returnable"),
        ("rejected", "unknown_transaction"), ("rejected", "not_returnable")]
    bus.send(a_return("ret-1", "pay", 40_00), B)
    bus.run()
    bus.send(a_return("ret-of-ret", "ret-1", 10_00, payee=A, payer=B), A)
    bus.run()
    assert answers(bus, "ret-1", "ret-of-ret") == [("accepted", None), ("rejected", "not_returnable")]
    assert (bus.account(A), bus.account(B)) == ((40_00, 0), (50_00, 0))
    assert_books_balance(bus, ("USD",))


def test_two_returns_in_flight_together_cannot_both_pass_the_unreturned_check():
    """Both reach the payee's partition before either is decided: the first reserves 60.00 of the payment,
    so the second (60.00 of the 40.00 left) is refused there; a third of 40.00 fits beside the first."""
    bus = paid_and_spent(spent=0)
    bus.send(a_return("ret-a", "pay", 60_00), B)
    bus.send(a_return("ret-b", "pay", 60_00), B)
    bus.send(a_return("ret-c", "pay", 40_00), B)
    for _ in range(3):
        bus.step(B_P)  # each begins: B's share judged and reserved, its Reserve out to A's partition
    assert not [r for r in bus.results if r["command_id"].startswith("ret-")], "none decided yet"
    bus.run()
    assert answers(bus, "ret-a", "ret-b", "ret-c") == [
        ("accepted", None), ("rejected", "exceeds_unreturned"), ("accepted", None)]
    assert bus.result("ret-b")["detail"] == ("return of 6000 exceeds the 4000 unreturned of pay (6000 of 10000 "
                                             "returned already, 6000 of it by returns in flight)")
    assert (bus.account(A), bus.account(B)) == ((100_00, 0), (0, 0))
    assert share(bus, B_P, "pay").returned == share(bus, A_P, "pay").returned == 100_00
    assert_books_balance(bus, ("USD",))


def test_two_returns_the_partitions_see_in_opposite_orders_do_not_refuse_each_other():
    """Two producers place a return of 60.00 each (in both partitions); B's partition gets ret-a first, A's
    partition ret-b's copy first. The payee's partition alone holds the payment's returns in flight, so
    ret-a passes and ret-b is refused there; had the payer's partition held them too, each would have been
    refused by one partition and neither would pass."""
    from schemas.codec import codec
    from streams import placement

    bus = paid_and_spent(spent=0)
    placed = {}
    for return_id in ("ret-a", "ret-b"):
        record, partitions = placement.placements(codec().decode("command", a_return(return_id, "pay", 60_00)), B, N)
        assert partitions == [B_P, A_P]
        placed[return_id] = codec().encode("command", record)
    key = routing.routing_key_for(B).encode()
    for partition, return_id in ((B_P, "ret-a"), (B_P, "ret-b"), (A_P, "ret-b"), (A_P, "ret-a")):
        bus.send_to(partition, placed[return_id], key=key)
    bus.run()
    assert answers(bus, "ret-a", "ret-b") == [("accepted", None), ("rejected", "exceeds_unreturned")]
    assert (bus.account(A), bus.account(B)) == ((60_00, 0), (40_00, 0))
    assert_books_balance(bus, ("USD",))


def test_a_return_refused_by_the_payers_partition_releases_what_it_reserved_against_the_payment():
    """A's cap refuses the credit: the return is refused, B's hold and the 100.00 it counted in flight are
    released, and a return of all of it passes once A has room."""
    bus = paid_and_spent(spent=0, a_cap=150_00)
    bus.send(tx("dep-2", [("sys:world:USD", -150_00, None, None), (A, 150_00, None, None)], kind="deposit"), A)
    bus.run()
    bus.send(a_return("ret-1", "pay", 100_00), B)
    bus.run()
    assert answers(bus, "dep-2", "ret-1") == [("accepted", None), ("rejected", "balance_limit_exceeded")]
    assert bus.account(B) == (100_00, 0), "B's reservation released"
    assert not [k for p in range(bus.n) for k, _ in bus.stored(p, b"e/")], "nothing in flight left"
    bus.send(tx("wd", [(A, -100_00, None, None), ("sys:world:USD", 100_00, None, None)], kind="withdrawal"), A)
    bus.run()
    bus.send(a_return("ret-2", "pay", 100_00), B)
    bus.run()
    assert answers(bus, "wd", "ret-2") == [("accepted", None)] * 2
    assert (bus.account(A), bus.account(B)) == ((150_00, 0), (0, 0))
    assert_books_balance(bus, ("USD",))


def test_a_return_in_flight_survives_a_restore_from_the_changelog():
    """B's partition is rebuilt from its changelog alone while the return is reserved: the reservation and
    what it counts in flight come back, so a second return is still refused, and the first commits."""
    bus = paid_and_spent()
    bus.send(a_return("ret-1", "pay", 100_00), B)
    bus.step(B_P)  # begun: B's 70.00 held, 30.00 held on the receivable, 100.00 of pay in flight
    assert bus.account(B_RECEIVABLE) == (0, 30_00)
    bus.crash_restore(B_P, fresh_store=True)
    bus.send(a_return("ret-2", "pay", 1), B)
    bus.run()
    assert answers(bus, "ret-1", "ret-2") == [("accepted", None), ("rejected", "exceeds_unreturned")]
    assert (bus.account(A), bus.account(B), bus.account(B_RECEIVABLE)) == ((100_00, 0), (0, 0), (-30_00, 0))
    assert_books_balance(bus, ("USD",))


@pytest.mark.parametrize("point", CRASH_POINTS)
@pytest.mark.parametrize("where", ["decision", "payer's commit"])
def test_a_crash_anywhere_in_the_decision_of_a_return_loses_and_doubles_nothing(where, point):
    """The worker dies part way through the step that decides (B's partition: the final vote and B's
    share) or through A's commit, and restarts from its changelog alone: the return is decided once and
    posts once."""
    bus = paid_and_spent()
    bus.send(a_return("ret-1", "pay", 100_00), B)
    bus.step(B_P)  # begun
    bus.step(A_P)  # A's share reserved, its vote out
    partition = B_P if where == "decision" else A_P
    if where == "payer's commit":
        bus.step(B_P)  # the final vote: decided, B's share posted, the Decide out to A
    bus.step(partition, crash=Crash(point, count=1, fresh_store=True))
    bus.run()
    answered = [r for r in bus.results if r["command_id"] == "ret-1" and not r["duplicate"]]
    assert {(r["outcome"], r["reason"]) for r in answered} == {("accepted", None)}
    assert (bus.account(A), bus.account(B), bus.account(B_RECEIVABLE)) == ((100_00, 0), (0, 0), (-30_00, 0))
    assert share(bus, B_P, "pay").returned == share(bus, A_P, "pay").returned == 100_00
    assert_books_balance(bus, ("USD",))


@pytest.mark.parametrize("seed", range(4))
def test_returns_placed_as_the_client_places_them_race_through_crashes_and_keep_every_promise(seed):
    """Two returns of 60.00 of the same payment, sent as LedgerClient sends them (to both partitions), and
    delivered in a seeded random order with crashes and restores, the oracles checked after every step:
    exactly one passes."""
    from tests.helpers.interleavings import checked_bus, finish

    bus, oracles = checked_bus()
    for value, account in ((open_account(A), A), (open_account(B), B),
                           (tx("dep", [("sys:world:USD", -100_00, None, None), (A, 100_00, None, None)],
                               kind="deposit"), A)):
        oracles.sent_command(value)
        bus.send(value, account)
    bus.run()
    for value, account in ((tx("pay", [(A, -100_00, None, None), (B, 100_00, None, None)], kind="transfer"), A),
                           (tx("spend", [(B, -50_00, None, None), ("sys:world:USD", 50_00, None, None)],
                               kind="withdrawal"), B)):
        oracles.sent_command(value)
        bus.send_placed(value, account)
        bus.run()
    for return_id in ("ret-a", "ret-b"):
        value = a_return(return_id, "pay", 60_00)
        oracles.sent_command(value)
        bus.send_placed(value, B)
    finish(bus, oracles, seed)
    assert sorted(answers(bus, "ret-a", "ret-b")) == [("accepted", None), ("rejected", "exceeds_unreturned")]
    assert (bus.account(A), bus.account(B), bus.account(B_RECEIVABLE)) == ((60_00, 0), (0, 0), (-10_00, 0))
    assert share(bus, B_P, "pay").returned == share(bus, A_P, "pay").returned == 60_00
    assert_books_balance(bus, ("USD",))


def _decided_return(payer: str, payee: str, spent: int, earlier: int, amount: int, frozen: bool):
    """The answer to a return of `amount` of a 100.00 payment payer -> payee, after the payee spent `spent`,
    `earlier` was returned already and the payee was frozen or not; then the payer's, the payee's and the
    payee's receivable's balances (None: never opened)."""
    bus = Bus()
    for account in (payer, payee):
        bus.send(open_account(account), account)
    bus.send(tx("dep", [("sys:world:USD", -100_00, None, None), (payer, 100_00, None, None)], kind="deposit"), payer)
    bus.run()
    bus.send(tx("pay", [(payer, -100_00, None, None), (payee, 100_00, None, None)]), payer)
    bus.run()
    if spent:
        bus.send(tx("spend", [(payee, -spent, None, None), ("sys:world:USD", spent, None, None)]), payee)
    if earlier:
        bus.send(a_return("earlier", "pay", earlier, payee=payee, payer=payer), payee)
    if frozen:
        bus.send(command("freeze", "FreezeAccount", {"account_id": payee}), payee)
    bus.run()
    bus.send(a_return("ret", "pay", amount, payee=payee, payer=payer), payee)
    bus.run()
    receivable = bus.procs[routing.partition_of_account(payee, N)].state.account(
        f"{routing.routing_key_for(payee)}:receivable.USD")
    assert_books_balance(bus, ("USD",))
    return (answers(bus, "ret")[0], bus.account(payer)[0], bus.account(payee)[0],
            None if receivable is None else receivable.posted)


@pytest.mark.parametrize("frozen", [False, True])
@pytest.mark.parametrize("earlier", [0, 40_00])
@pytest.mark.parametrize("spent", [0, 30_00, 100_00])
def test_a_return_across_partitions_is_decided_as_in_one_partition(spent, earlier, frozen):
    """The same story with payer and payee in one partition, then in two: one answer, the same balances."""
    one = _decided_return(*local_users(2, partition=0), spent, earlier, 70_00, frozen)
    assert _decided_return(A, B, spent, earlier, 70_00, frozen) == one
    assert one[0] == (("rejected", "exceeds_unreturned") if earlier else
                      ("rejected", "account_frozen") if frozen and spent < 100_00 else ("accepted", None))
