"""Linked batches across partitions (streams/spanning_linked.py), broker-free through eight partition processors
(tests/helpers/bus.py): the batch is one unit of the two-phase protocol, all or nothing, judged in batch order in
each partition, one answer per command."""
from __future__ import annotations

import random

import pytest

from streams import routing
from tests.helpers.bus import C, Bus, assert_books_balance
from tests.helpers.interleavings import (CHAOS, EVERYONE, X1, X2, Y1, Y2, balances, checked_bus, funded_two_partitions,
                                        funded_users)
from tests.helpers.records import N, command, linked, local_users, open_account, transfer



def answers(bus: Bus, *ids: str, duplicate: bool = False) -> dict[str, tuple]:
    return {r["command_id"]: (r["outcome"], r["reason"]) for r in bus.results
            if r["command_id"] in ids and r["duplicate"] is duplicate}


def spending_what_came_first() -> bytes:
    """X1 pays Y1 600 (partition 0 to 1), then Y1 pays X2 500 of it (1 to 0): the second spends the first's credit."""
    return linked(transfer("l1", (X1, -600), (Y1, 600)), transfer("l2", (Y1, -500), (X2, 500)))


def test_a_batch_across_two_partitions_posts_whole_and_a_later_item_spends_an_earlier_credit():
    bus = funded_two_partitions()
    assert routing.partition_of_account(X1, N) == 0 and routing.partition_of_account(Y1, N) == 1
    bus.send(spending_what_came_first(), X1)
    bus.run()
    assert answers(bus, "l1", "l2") == {"l1": ("accepted", None), "l2": ("accepted", None)}
    assert balances(bus) == {X1: (400, 0), X2: (500, 0), Y1: (100, 0), Y2: (0, 0)}
    assert {h["transaction_id"] for h in bus.history if h["account_id"] in EVERYONE} >= {"l1", "l2"}
    assert_books_balance(bus, ("USD",))


def test_one_refused_in_another_partition_nothing_moves_anywhere_and_the_answers_name_it():
    bus = funded_two_partitions()
    bus.send(linked(transfer("l1", (X1, -600), (Y1, 600)), transfer("l2", (Y2, -50), (X2, 50))), X1)
    bus.run()
    assert answers(bus, "l1", "l2") == {"l1": ("rejected", "linked_failed"), "l2": ("rejected", "insufficient_funds")}
    assert "l2, which was refused insufficient_funds" in bus.result("l1")["detail"]
    assert balances(bus) == {X1: (1_000, 0), X2: (0, 0), Y1: (0, 0), Y2: (0, 0)}
    assert not [h for h in bus.history if h["transaction_id"] in ("l1", "l2")]
    assert_books_balance(bus, ("USD",))


def test_an_item_cannot_spend_a_credit_a_later_item_makes():
    """Batch order is the order of judgement: Y1 spending 500 before X1's 600 reaches it is refused."""
    bus = funded_two_partitions()
    bus.send(linked(transfer("l2", (Y1, -500), (X2, 500)), transfer("l1", (X1, -600), (Y1, 600))), Y1)
    bus.run()
    assert answers(bus, "l1", "l2") == {"l1": ("rejected", "linked_failed"), "l2": ("rejected", "insufficient_funds")}
    assert balances(bus) == {X1: (1_000, 0), X2: (0, 0), Y1: (0, 0), Y2: (0, 0)}
    assert_books_balance(bus, ("USD",))


def test_a_retry_of_the_batch_and_of_each_command_is_answered_as_duplicates():
    bus = funded_two_partitions()
    bus.send(spending_what_came_first(), X1)
    bus.send(spending_what_came_first(), X1)  # while the first is in flight
    bus.run()
    bus.send(spending_what_came_first(), X1)  # once decided
    bus.send(transfer("l2", (Y1, -500), (X2, 500)), Y1)  # one of them alone, at its own partition
    bus.run()
    assert answers(bus, "l1", "l2") == {"l1": ("accepted", None), "l2": ("accepted", None)}
    duplicates = [(r["command_id"], r["outcome"]) for r in bus.results if r["duplicate"] and r["client_id"] == "t"
                  and r["command_id"] in ("l1", "l2")]
    assert sorted(duplicates) == [("l1", "accepted")] * 2 + [("l2", "accepted")] * 3
    assert balances(bus) == {X1: (400, 0), X2: (500, 0), Y1: (100, 0), Y2: (0, 0)}
    assert_books_balance(bus, ("USD",))


def test_a_refused_batch_is_answered_the_same_on_a_retry():
    bus = funded_two_partitions()
    refused = linked(transfer("l1", (X1, -600), (Y1, 600)), transfer("l2", (Y2, -50), (X2, 50)))
    bus.send(refused, X1)
    bus.run()
    bus.send(refused, X1)
    bus.run()
    assert answers(bus, "l1", "l2", duplicate=True) == {"l1": ("rejected", "linked_failed"),
                                                        "l2": ("rejected", "insufficient_funds")}
    assert balances(bus)[X1] == (1_000, 0)


def test_restores_in_the_middle_change_nothing():
    """Every partition crashes after each step (its state rebuilt from the changelog, once from nothing), and
    the batch ends as without crashes."""
    bus = funded_two_partitions()
    bus.send(spending_what_came_first(), X1)
    fresh = True
    while not bus.quiet:
        for p in range(bus.n):
            if bus.pending(p):
                bus.step(p, commit_offset=False)
                bus.crash_restore(p, fresh_store=fresh)  # the step is delivered again
                fresh = not fresh
                if bus.pending(p):
                    bus.step(p)
    assert answers(bus, "l1", "l2") == {"l1": ("accepted", None), "l2": ("accepted", None)}
    assert balances(bus) == {X1: (400, 0), X2: (500, 0), Y1: (100, 0), Y2: (0, 0)}
    assert_books_balance(bus, ("USD",))


def test_every_step_delivered_twice_changes_nothing_twice():
    bus = Bus(duplicate_engine_commands=True)
    for account in EVERYONE:
        bus.send(open_account(account), account)
    bus.send(transfer("dep", ("sys:world:USD", -1_000), (X1, 1_000)), X1)
    bus.run()
    bus.send(spending_what_came_first(), X1)
    bus.send(linked(transfer("l3", (X1, -100), (Y1, 100)), transfer("l4", (Y2, -50), (X2, 50))), X1)
    bus.run()
    assert answers(bus, "l1", "l2", "l3", "l4") == {"l1": ("accepted", None), "l2": ("accepted", None),
                                                    "l3": ("rejected", "linked_failed"),
                                                    "l4": ("rejected", "insufficient_funds")}
    assert balances(bus) == {X1: (400, 0), X2: (500, 0), Y1: (100, 0), Y2: (0, 0)}
    assert_books_balance(bus, ("USD",))


def test_while_in_flight_the_money_is_reserved_and_a_command_of_the_batch_sent_alone_waits_its_answer():
    bus = funded_two_partitions()
    bus.send(spending_what_came_first(), X1)
    bus.step(0)  # begun: partition 0 reserved its share (X1's 600 held), ReserveLinked sent to partition 1
    assert bus.account(X1) == (1_000, 600)
    bus.send(transfer("l1", (X1, -600), (Y1, 600)), X1)  # l1 alone: a retry of the batch's, in flight
    bus.send(transfer("spend", (X1, -500), (X2, 500)), X1)  # more than X1 has beside what is reserved
    bus.send(linked(transfer("l1", (X1, -600), (Y1, 600)), transfer("l9", (X1, -1), (X2, 1))), X1)
    bus.step(0)
    bus.step(0)
    bus.step(0)
    assert [(r["command_id"], r["reason"]) for r in bus.results if r["command_id"] in ("l1", "spend", "l9")] == [
        ("spend", "insufficient_funds")]
    bus.run()
    assert [(r["outcome"], r["duplicate"]) for r in bus.results if r["command_id"] == "l1"] == [
        ("accepted", False), ("accepted", True), ("accepted", True)]
    assert bus.result("l9")["reason"] == "linked_failed" and "l1" in bus.result("l9")["detail"]
    assert balances(bus) == {X1: (400, 0), X2: (500, 0), Y1: (100, 0), Y2: (0, 0)}
    assert_books_balance(bus, ("USD",))


# --- many batches in flight, delivered in random orders with crashes ---------------------------------------------
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("changelog_cuts", ["between_records", "anywhere", "transaction"])
def test_linked_batches_across_partitions_keep_every_promise_through_crashes(seed, changelog_cuts):
    """Linked batches of transfers among accounts of three partitions (with fees to a system account, some
    unfundable, some sent again, half of them with copies placed), amid single transfers, while the bus delivers
    in a random order with crashes and restarts: every promise's oracle holds after every step and once quiet,
    and each batch is all or nothing, every command of it answered once."""
    rng = random.Random(seed)
    bus, oracles = checked_bus(changelog_cuts=changelog_cuts)
    accounts = funded_users(bus, oracles)
    batches: list[list[str]] = []
    sent: list[tuple[bytes, str]] = []
    linked_items: list[tuple[bytes, str]] = []
    alone: set[str] = set()  # commands of batches also sent alone: decided alone first, the batch fails on them
    for n in range(12):
        if sent and rng.random() < 0.2:
            value, account = rng.choice(sent)  # a retry
        elif linked_items and rng.random() < 0.2:
            value, account = rng.choice(linked_items)  # a command of a batch, alone, to its own partition
            alone.add(C.decode("command", value)["command_id"])
        elif rng.random() < 0.25:
            payer, payee = rng.sample(accounts, 2)
            value, account = transfer(f"single-{n}", (payer, -100), (payee, 100)), payer
        else:
            items, ids = [], []
            for i in range(rng.randint(1, 3)):
                payer, payee = rng.sample(accounts, 2)
                amount = rng.choice((50, 200, 450, 900))
                legs = [(payer, -amount), (payee, amount - 5), ("sys:fees:USD", 5)] if rng.random() < 0.3 else \
                    [(payer, -amount), (payee, amount)]
                ids.append(f"b{n}-{i}")
                items.append(transfer(ids[-1], *legs))
                linked_items.append((items[-1], payer))
            for item in items:
                oracles.sent_command(item)
            batches.append(ids)
            first_payer = C.decode("command", items[0])["body"][1]["legs"][0]["account_id"]
            value, account = linked(*items), first_payer
            sent.append((value, account))
            if rng.random() < 0.5:  # as LedgerClient writes it: copies to the other partitions it touches
                bus.send_linked_placed(value, account)
            else:
                bus.send(value, account)
            for _ in range(rng.choice((0, 1, 2))):
                bus.tick(rng, **CHAOS)
                oracles.check_step()
            continue
        if C.is_a("command", value):
            oracles.sent_command(value)
        sent.append((value, account))
        bus.send(value, account)
    bus.run_random(rng, oracles.check_step, **CHAOS)
    oracles.check_quiet()
    for ids in batches:
        if alone.intersection(ids):
            continue
        first = [bus.result(i) for i in ids]
        assert len({r["outcome"] for r in first}) == 1, f"not all or nothing: {first}"
        failed = [r for r in first if r["reason"] not in (None, "linked_failed")]
        assert first[0]["outcome"] == "accepted" or len(failed) == 1, first


def test_a_command_decided_alone_before_its_batch_keeps_its_answer_and_the_batch_fails_on_it():
    """l2 reaches its own partition alone, and is decided there, before the batch that holds it: the batch
    fails on it (across partitions a batch takes only commands not decided yet), l2 keeps its answer, even
    to a retry of the whole batch, and nothing of l1 moves."""
    bus = funded_two_partitions()
    bus.send(transfer("l2", (Y1, -500), (X2, 500)), Y1)  # alone: Y1 has nothing yet
    bus.run()
    assert bus.result("l2")["reason"] == "insufficient_funds"
    bus.send(spending_what_came_first(), X1)
    bus.run()
    bus.send(spending_what_came_first(), X1)
    bus.run()
    assert [(r["reason"], r["duplicate"]) for r in bus.results if r["command_id"] == "l2"] == [
        ("insufficient_funds", False), ("insufficient_funds", True)]
    assert [(r["reason"], r["duplicate"]) for r in bus.results if r["command_id"] == "l1"] == [
        ("linked_failed", False), ("linked_failed", True)]
    assert balances(bus) == {X1: (1_000, 0), X2: (0, 0), Y1: (0, 0), Y2: (0, 0)}
    assert_books_balance(bus, ("USD",))


def test_fees_and_a_batch_sent_where_none_of_its_accounts_live():
    """A fee to a system account rides on the share where its transaction's system legs live; a batch written
    to a partition that holds none of its accounts is coordinated there all the same."""
    bus = funded_two_partitions()
    far = local_users(1, partition=2)[0]
    bus.send(open_account(far), far)
    bus.run()
    fee = linked(transfer("f1", (X1, -105), (Y1, 100), ("sys:fees:USD", 5)), transfer("f2", (Y1, -60), (Y2, 60)))
    bus.send_to(2, fee)
    bus.run()
    assert answers(bus, "f1", "f2") == {"f1": ("accepted", None), "f2": ("accepted", None)}
    assert balances(bus) == {X1: (895, 0), X2: (0, 0), Y1: (40, 0), Y2: (60, 0)}
    assert bus.account("sys:fees:USD") == (5, 0)
    assert_books_balance(bus, ("USD",))


def test_a_cap_is_judged_at_every_step_of_the_batch_and_a_freeze_waits_for_the_decision():
    """Y2 may hold at most 700: 600 in, 500 out, 300 in stays under it at every step; 800 in at once does not.
    A freeze of Y2 sent while the first batch is reserved waits for its decision, then applies."""
    bus = funded_two_partitions()
    capped = local_users(3, partition=1)[2]
    bus.send(open_account(capped, max_balance=700), capped)
    bus.run()
    bus.send(linked(transfer("c1", (X1, -600), (capped, 600)), transfer("c2", (capped, -500), (X2, 500)),
                    transfer("c3", (X1, -300), (capped, 300))), X1)
    bus.step(0)  # begun, ReserveLinked out to partition 1
    bus.step(1)  # partition 1 reserves: capped's highest point (600) counted, its lowest (0) needs no hold
    bus.send(command("freeze", "FreezeAccount", {"account_id": capped}), capped)
    bus.step(1)
    assert not [r for r in bus.results if r["command_id"] == "freeze"], "the freeze waits"
    bus.run()
    assert answers(bus, "c1", "c2", "c3", "freeze") == {"c1": ("accepted", None), "c2": ("accepted", None),
                                                        "c3": ("accepted", None), "freeze": ("accepted", None)}
    assert (bus.account(capped), bus.account(X1), bus.account(X2)) == ((400, 0), (100, 0), (500, 0))
    bus.send(command("unfreeze", "UnfreezeAccount", {"account_id": capped}), capped)
    bus.send(linked(transfer("c4", (X2, -400), (capped, 400)), transfer("c5", (capped, -1), (X1, 1))), X2)
    bus.run()
    assert answers(bus, "c4", "c5") == {"c4": ("rejected", "balance_limit_exceeded"),
                                        "c5": ("rejected", "linked_failed")}
    assert bus.account(capped) == (400, 0)
    assert_books_balance(bus, ("USD",))


def test_a_freeze_of_a_system_shard_a_share_posts_to_waits_for_the_decision():
    """f1 takes 50 from the world's shard where f1's system legs live (partition 0): a freeze of that shard sent
    while the batch is reserved waits for the decision, as for one transaction, instead of making the reserved
    share's commit fail (which left the batch undecided and X1's 50 held)."""
    bus = funded_two_partitions()
    bus.send(linked(transfer("w1", (X1, -50), ("sys:world:USD", -50), (Y1, 100)), transfer("w2", (Y1, -60), (Y2, 60))),
             X1)
    bus.step(0)  # begun: partition 0's share (X1 and the world's shard) reserved, ReserveLinked out
    bus.send_to(0, command("fz", "FreezeAccount", {"account_id": "sys:world:USD"}))
    bus.step(0)
    assert not [r for r in bus.results if r["command_id"] == "fz"], "the freeze waits"
    bus.run()
    assert not [r for r in bus.results if "unprocessable" in (r["detail"] or "")]
    assert answers(bus, "w1", "w2", "fz") == {"w1": ("accepted", None), "w2": ("accepted", None),
                                              "fz": ("accepted", None)}
    assert balances(bus) == {X1: (950, 0), X2: (0, 0), Y1: (40, 0), Y2: (60, 0)}
    assert not [k for p in range(bus.n) for k, _ in bus.stored(p, b"e/")]
    assert_books_balance(bus, ("USD",))


def test_an_account_whose_running_sum_never_leaves_zero_is_not_left_marked():
    """X2 is debited and credited 10 by l1: no hold, no credit counted, but marked while the batch is in flight;
    the decision ends its mark, so a later freeze of X2 is decided (it waited forever)."""
    bus = funded_two_partitions()
    bus.send(linked(transfer("l1", (X1, -100), (X2, -10), (X2, 10), (Y1, 100)), transfer("l2", (Y1, -60), (Y2, 60))),
             X1)
    bus.run()
    assert answers(bus, "l1", "l2") == {"l1": ("accepted", None), "l2": ("accepted", None)}
    assert not [k for p in range(bus.n) for k, _ in bus.stored(p, b"e/")]
    bus.send(command("fz", "FreezeAccount", {"account_id": X2}), X2)
    bus.run()
    assert answers(bus, "fz") == {"fz": ("accepted", None)}


def _answers_of(bus: Bus, *ids: str) -> list[tuple]:
    return sorted((r["command_id"], r["outcome"], r["reason"], r["duplicate"]) for r in bus.results
                  if r["command_id"] in ids)


def test_two_commands_of_a_batch_in_flight_sent_again_in_another_batch_across_partitions_are_both_retries():
    """l1 and l2 are in flight in their batch when a second batch holding both (and l3) reaches their home:
    each is a retry, answered with the first batch's decision (l2's retry was counted as l1's, and lost)."""
    bus = funded_two_partitions()
    bus.send(linked(transfer("l1", (X1, -100), (Y1, 100)), transfer("l2", (X1, -100), (Y2, 100))), X1)
    bus.step(0)  # begun
    bus.send(linked(transfer("l1", (X1, -100), (Y1, 100)), transfer("l2", (X1, -100), (Y2, 100)),
                    transfer("l3", (X1, -1), (Y2, 1))), X1)
    bus.run()
    assert _answers_of(bus, "l1", "l2") == [("l1", "accepted", None, False), ("l1", "accepted", None, True),
                                            ("l2", "accepted", None, False), ("l2", "accepted", None, True)]
    assert [r["reason"] for r in bus.results if r["command_id"] == "l3"] == ["linked_failed"]
    assert balances(bus) == {X1: (800, 0), X2: (0, 0), Y1: (100, 0), Y2: (100, 0)}
    assert_books_balance(bus, ("USD",))


def test_commands_in_flight_sent_again_in_a_batch_of_one_partition_keep_their_batch_s_answer():
    """l2 and l3 (local to partition 0) are in flight in a batch across partitions when a batch of just the two
    reaches partition 0: both are retries. l3 was refused linked_failed there, and that refusal, remembered
    under its id, became its answer in its own batch, which posted it."""
    bus = funded_two_partitions()
    bus.send(linked(transfer("l1", (X1, -100), (Y1, 100)), transfer("l2", (X1, -100), (X2, 100)),
                    transfer("l3", (X1, -50), (X2, 50))), X1)
    bus.step(0)  # begun
    bus.send(linked(transfer("l2", (X1, -100), (X2, 100)), transfer("l3", (X1, -50), (X2, 50))), X1)
    bus.run()
    assert _answers_of(bus, "l1", "l2", "l3") == [
        ("l1", "accepted", None, False), ("l2", "accepted", None, False), ("l2", "accepted", None, True),
        ("l3", "accepted", None, False), ("l3", "accepted", None, True)]
    assert balances(bus) == {X1: (750, 0), X2: (150, 0), Y1: (100, 0), Y2: (0, 0)}
    assert_books_balance(bus, ("USD",))


@pytest.mark.parametrize("second", [Y1, "partition 2"])
def test_one_batch_written_to_two_partitions_is_decided_in_each_and_nothing_stays_reserved(second):
    """A producer writes the same batch to X1's partition and to another: two coordinators. Each batch finds the
    other's commands in flight and fails; every command is answered (its batch's answer, and its retry's), and
    nothing stays held or marked. Before, the two coordinators' steps had the same ids: neither was decided,
    nobody was answered and X1's 600 stayed held."""
    bus = funded_two_partitions()
    batch = spending_what_came_first()
    bus.send(batch, X1)
    if second == Y1:
        bus.send(batch, Y1)
    else:
        bus.send_to(2, batch)
    bus.run()
    got = _answers_of(bus, "l1", "l2")
    assert [(c, d) for c, _, _, d in got] == [("l1", False), ("l1", True), ("l2", False), ("l2", True)]
    assert len({(c, o, r) for c, o, r, _ in got}) == 2, "a retry is answered as the original"
    assert not [k for p in range(bus.n) for k, _ in bus.stored(p, b"e/")]
    assert balances(bus)[X1][1] == 0
    assert_books_balance(bus, ("USD",))


def test_a_decided_batch_written_again_to_another_partition_is_answered_and_leaves_nothing():
    bus = funded_two_partitions()
    bus.send(spending_what_came_first(), X1)
    bus.run()
    bus.send(spending_what_came_first(), Y1)
    bus.run()
    assert _answers_of(bus, "l1", "l2") == [("l1", "accepted", None, False), ("l1", "accepted", None, True),
                                            ("l2", "accepted", None, False), ("l2", "accepted", None, True)]
    assert not [k for p in range(bus.n) for k, _ in bus.stored(p, b"e/")]
    assert balances(bus) == {X1: (400, 0), X2: (500, 0), Y1: (100, 0), Y2: (0, 0)}
    assert_books_balance(bus, ("USD",))


@pytest.mark.parametrize("retried", ["after the decision", "while in flight"])
def test_a_retry_of_a_failed_batch_answers_a_command_decided_before_with_its_own_decision(retried):
    """b1 was decided alone (accepted) before the batch [bad, b1, b2] failed on bad: b1 keeps its answer at its
    home, and a retry of the batch, after the decision or while in flight, leaves it out (its votes name it as
    keeping a decision of its own), while bad and b2 get the batch's answers again."""
    bus = funded_two_partitions()
    bus.send(transfer("b1", (X1, -100), (Y1, 100)), X1)
    bus.run()
    batch = linked(transfer("bad", (Y2, -50), (X2, 50)), transfer("b1", (X1, -100), (Y1, 100)),
                   transfer("b2", (X1, -1), (Y2, 1)))
    bus.send(batch, Y2)
    if retried == "after the decision":
        bus.run()
    bus.send(batch, Y2)
    bus.run()
    assert {(r["outcome"], r["reason"]) for r in bus.results if r["command_id"] == "b1"} == {("accepted", None)}
    assert sorted((r["duplicate"], r["command_id"], r["reason"]) for r in bus.results
                  if r["command_id"] in ("bad", "b2")) == [
        (False, "b2", "linked_failed"), (False, "bad", "insufficient_funds"), (True, "b2", "linked_failed"),
        (True, "bad", "insufficient_funds")]
    assert balances(bus) == {X1: (900, 0), X2: (0, 0), Y1: (100, 0), Y2: (0, 0)}
    assert_books_balance(bus, ("USD",))


def test_a_payment_of_a_batch_across_partitions_is_returned_like_any_payment_across_them():
    """Each share keeps its transaction's client (as a transaction across partitions posts its shares), so the
    payee's partition returns part of l1 as it returns any payment whose money crossed partitions."""
    from streams.core.returns import RETURNS_KEY
    bus = funded_two_partitions()
    bus.send(spending_what_came_first(), X1)
    bus.run()
    bus.send(command("ret", "PostTransaction", {
        "transaction_id": "ret", "kind": "return", "reference": None, "links": [],
        "metadata": {RETURNS_KEY: "l1"}, "occurred_at_ms": None, "rate_snapshot_id": None,
        "legs": [{"account_id": Y1, "amount": "-100", "hold_id": None, "currency": None},
                 {"account_id": X1, "amount": "100", "hold_id": None, "currency": None}]}), Y1)
    bus.run()
    assert bus.result("ret")["outcome"] == "accepted"
    assert balances(bus) == {X1: (500, 0), X2: (500, 0), Y1: (0, 0), Y2: (0, 0)}
    assert_books_balance(bus, ("USD",))


def test_a_forged_step_of_a_linked_batch_is_refused():
    """ReserveLinked, VoteLinked and DecideLinked are taken only from a record a worker sealed (P11)."""
    from streams.routing import ENGINE_CLIENT
    bus = funded_two_partitions()
    batch = {"batch_client_id": "t", "batch_command_id": "l1~linked~0"}
    forged = [command("f-reserve", "ReserveLinked", {**batch, "coordinator_partition": 0, "items": []}),
              command("f-vote", "VoteLinked", {**batch, "participant": 1, "item": -1, "reason": None, "detail": ""},
                      client=ENGINE_CLIENT),
              command("f-decide", "DecideLinked", {**batch, "commit": True, "item": -1, "reason": None,
                                                   "detail": ""}, client=ENGINE_CLIENT)]
    for value in forged:
        bus.send(value, Y1)
    bus.run()
    assert [bus.result(c)["reason"] for c in ("f-reserve", "f-vote", "f-decide")] == ["invalid_command"] * 3
    assert balances(bus)[X1] == (1_000, 0)
    assert_books_balance(bus, ("USD",))
