"""A linked batch across partitions written, as LedgerClient writes it, to its coordinator and as a copy to every
other partition its transactions touch (placement.linked_placements): each partition reserves its share at the
producer's own position, so a command the producer sends after the batch never overtakes it there (P10).
Broker-free, through eight partition processors (tests/helpers/bus.py)."""
from __future__ import annotations

import random

import pytest

from streams import placement, routing
from streams.spanning import COPY_WAIT_MS
from tests.helpers.bus import C, Bus, Crash, assert_books_balance
from tests.helpers.interleavings import CHAOS, checked_bus, funded_users, send
from tests.helpers.oracles import Oracles
from tests.helpers.records import N, command, linked, local_users, open_account, transfer

X1, X2 = local_users(2, partition=0)
Y1, Y2 = local_users(2, partition=1)
EVERYONE = (X1, X2, Y1, Y2)


def funded(y1: int = 0) -> Bus:
    """X1 holds 1,000 in partition 0, Y1 holds y1 in partition 1; X2 (partition 0) and Y2 (partition 1) are empty."""
    bus = Bus()
    for account in EVERYONE:
        bus.send(open_account(account), account)
    bus.send(transfer("dep", ("sys:world:USD", -1_000), (X1, 1_000)), X1)
    if y1:
        bus.send(transfer("dep-y", ("sys:world:USD", -y1), (Y1, y1)), Y1)
    bus.run()
    return bus


def balances(bus: Bus) -> dict[str, tuple[int, int]]:
    return {a: bus.account(a) for a in EVERYONE}


def answers(bus: Bus, *ids: str) -> list[tuple]:
    """(id, outcome, reason, duplicate) of each answer to these commands, in the order of ids (for each id, as
    emitted)."""
    found = [(r["command_id"], r["outcome"], r["reason"], r["duplicate"]) for r in bus.results
             if r["command_id"] in ids]
    return sorted(found, key=lambda a: (a[3], ids.index(a[0])))


def engine_records(bus: Bus) -> list[bytes]:
    return [k for p in range(bus.n) for k, _ in bus.stored(p, b"e/")]


def coordinated_by(coordinator: int | None, batch: bytes) -> bytes:
    """The linked batch as its producer writes it: naming its coordinator partition."""
    return C.encode("command_batch", {**C.decode("command_batch", batch), "coordinator": coordinator})


def assert_y1_first_batch_posted(bus: Bus) -> None:
    """The batch l1 (Y1 pays X2 80), l2 (X1 pays Y1 600) from funded(y1=100) posted whole, nothing left in flight."""
    assert [a[:3] for a in answers(bus, "l1", "l2")] == [("l1", "accepted", None), ("l2", "accepted", None)]
    assert balances(bus) == {X1: (400, 0), X2: (80, 0), Y1: (620, 0), Y2: (0, 0)}
    assert not engine_records(bus)


def spending_what_came_first() -> bytes:
    """X1 pays Y1 600 (partition 0 to 1), then Y1 pays X2 500 of it (1 to 0)."""
    return linked(transfer("l1", (X1, -600), (Y1, 600)), transfer("l2", (Y1, -500), (X2, 500)))


def freeze(account: str, command_id: str = "fz") -> bytes:
    return command(command_id, "FreezeAccount", {"account_id": account})


def test_the_batch_is_written_to_its_coordinator_and_as_a_copy_to_the_other_partition():
    bus = funded()
    assert bus.send_linked_placed(spending_what_came_first(), X1) == [0, 1]
    copy = C.decode("command_batch", bus.logs[1][-1].value)
    assert (copy["linked"], copy["coordinator"]) == (True, 0)
    assert bus.logs[0][-1].value == bus.logs[1][-1].value, "the same bytes everywhere"
    # A batch in one partition, or one holding more than transactions, goes to one partition and names none.
    assert bus.send_linked_placed(linked(transfer("n1", (X1, -1), (X2, 1))), X1) == [0]
    assert C.decode("command_batch", bus.logs[0][-1].value)["coordinator"] is None
    assert bus.send_linked_placed(linked(open_account("user:zz:USD"), transfer("n2", (X1, -1), (Y1, 1))), X1) == [0]
    bus.run()


def test_a_freeze_sent_after_the_batch_waits_for_it_in_the_other_partition():
    """The producer sends the batch, then freezes Y1. Partition 1 reads the copy first: Y1's share is reserved
    at the producer's position, so the freeze waits for the batch's decision and Y1 spends the 600 it got."""
    bus = funded()
    bus.send_linked_placed(spending_what_came_first(), X1)
    bus.send(freeze(Y1), Y1)
    bus.step(1)  # the copy: partition 1 reserves its share (nothing answered)
    assert not bus.results[-1:] or bus.results[-1]["command_id"] not in ("l1", "l2")
    bus.step(1)  # the freeze: waits
    assert not answers(bus, "fz", "l1", "l2")
    bus.run()
    assert answers(bus, "l1", "l2", "fz") == [("l1", "accepted", None, False), ("l2", "accepted", None, False),
                                              ("fz", "accepted", None, False)]
    assert balances(bus) == {X1: (400, 0), X2: (500, 0), Y1: (100, 0), Y2: (0, 0)}
    assert not engine_records(bus)
    assert_books_balance(bus, ("USD",))


def test_without_the_copy_the_same_freeze_overtakes_the_batch_and_the_batch_fails():
    """The same sends with the batch written to its coordinator only: the freeze is decided in partition 1
    before the coordinator's ReserveLinked arrives there, and the batch is refused (what the copy prevents)."""
    bus = funded()
    bus.send(spending_what_came_first(), X1)
    bus.send(freeze(Y1), Y1)
    bus.step(1)
    bus.run()
    assert [a[:3] for a in answers(bus, "fz", "l1", "l2")] == [
        ("fz", "accepted", None), ("l1", "rejected", "linked_failed"), ("l2", "rejected", "account_frozen")]
    assert balances(bus) == {X1: (1_000, 0), X2: (0, 0), Y1: (0, 0), Y2: (0, 0)}


def test_a_copy_that_cannot_reserve_is_its_partition_s_vote():
    """Y1 holds 100; the batch's second transaction takes 500 from Y2, who has nothing: the copy refuses at the
    producer's position and the coordinator's ReserveLinked gets that vote. Nothing moves anywhere."""
    bus = funded(y1=100)
    bus.send_linked_placed(linked(transfer("l1", (X1, -600), (Y1, 600)), transfer("l2", (Y2, -500), (X2, 500))), X1)
    bus.step(1)  # the copy refuses: nothing held
    assert bus.account(Y1) == (100, 0)
    bus.run()
    assert [a[:3] for a in answers(bus, "l1", "l2")] == [("l1", "rejected", "linked_failed"),
                                                          ("l2", "rejected", "insufficient_funds")]
    assert balances(bus) == {X1: (1_000, 0), X2: (0, 0), Y1: (100, 0), Y2: (0, 0)}
    assert not engine_records(bus)
    assert_books_balance(bus, ("USD",))


def test_the_copy_holds_what_its_share_takes_and_a_payment_sent_after_the_batch_is_decided_after_it():
    """Y1 holds 100 and the batch takes 80 of it first (to X2), then credits it 600 from X1: the copy holds 80 of
    Y1 at once, before the coordinator has read the batch. A payment of 50 from Y1 sent after the batch does not
    fit the 20 left free, but the batch's credit would fund it: it waits for the batch's decision, and posts
    after it, as it would were the batch decided first."""
    bus = funded(y1=100)
    bus.send_linked_placed(linked(transfer("l1", (Y1, -80), (X2, 80)), transfer("l2", (X1, -600), (Y1, 600))), X1)
    bus.send(transfer("after", (Y1, -50), (Y2, 50)), Y1)
    bus.step(1)
    assert bus.account(Y1) == (100, 80)
    bus.step(1)
    assert not answers(bus, "after"), "decided before the batch"
    bus.run()
    assert [a[:3] for a in answers(bus, "l1", "l2", "after")] == [("l1", "accepted", None), ("l2", "accepted", None),
                                                                   ("after", "accepted", None)]
    assert balances(bus) == {X1: (400, 0), X2: (80, 0), Y1: (570, 0), Y2: (50, 0)}
    assert not engine_records(bus)
    assert_books_balance(bus, ("USD",))


def test_a_copy_whose_coordinator_never_got_the_batch_is_dropped_after_its_wait_unanswered():
    """The producer wrote the copy only (it died before writing to the coordinator): partition 1 holds Y1's
    share until COPY_WAIT_MS of its log time has passed, then drops it. Nothing is answered (nothing was
    decided); the batch sent again later is decided in full."""
    bus = funded(y1=100)
    batch = linked(transfer("l1", (Y1, -80), (X2, 80)), transfer("l2", (X1, -600), (Y1, 600)))
    placed = coordinated_by(0, batch)
    bus.send_to(1, placed, key=routing.routing_key_for(X1).encode())
    bus.run()
    assert bus.account(Y1) == (100, 80) and not answers(bus, "l1", "l2")
    sent_at = bus.clock
    bus.send(transfer("later", (Y2, 0), (Y1, 0)), Y1, at_ms=sent_at + COPY_WAIT_MS - 1)  # any command moves log time
    bus.run()
    assert bus.account(Y1) == (100, 80), "not due yet"
    bus.send(transfer("later-2", (Y2, 0), (Y1, 0)), Y1, at_ms=sent_at + COPY_WAIT_MS + 1)
    bus.run()
    assert bus.account(Y1) == (100, 0)
    assert not answers(bus, "l1", "l2") and not engine_records(bus)
    bus.send_linked_placed(batch, X1)
    bus.run()
    assert_y1_first_batch_posted(bus)
    assert_books_balance(bus, ("USD",))


def test_a_copy_read_after_the_coordinator_s_reserve_reserves_nothing_more():
    bus = funded(y1=100)
    batch = linked(transfer("l1", (Y1, -80), (X2, 80)), transfer("l2", (X1, -600), (Y1, 600)))
    placed = coordinated_by(0, batch)
    bus.send_to(0, placed, key=routing.routing_key_for(X1).encode())
    bus.step(0)  # begun: ReserveLinked is in partition 1's log before the copy
    bus.send_to(1, placed, key=routing.routing_key_for(X1).encode())
    bus.run()
    assert_y1_first_batch_posted(bus)


def test_a_copy_of_other_payloads_under_the_batch_s_ids_is_undone_when_the_real_batch_reserves():
    """A copy naming the same commands with another amount (the producer's own forgery: the ids are its own)
    holds 90 of Y1; the coordinator's ReserveLinked carries the batch it read, so partition 1 undoes the copy's
    reservation and reserves the real share."""
    bus = funded(y1=100)
    real = linked(transfer("l1", (Y1, -80), (X2, 80)), transfer("l2", (X1, -600), (Y1, 600)))
    other = linked(transfer("l1", (Y1, -90), (X2, 90)), transfer("l2", (X1, -600), (Y1, 600)))
    key = routing.routing_key_for(X1).encode()
    for partition, value in ((1, other), (0, real)):
        bus.send_to(partition, coordinated_by(0, value), key=key)
    bus.step(1)
    assert bus.account(Y1) == (100, 90)
    bus.run()
    assert_y1_first_batch_posted(bus)
    assert_books_balance(bus, ("USD",))


def test_the_copy_sent_again_and_the_batch_sent_again_change_nothing_twice():
    bus = funded(y1=100)
    batch = linked(transfer("l1", (Y1, -80), (X2, 80)), transfer("l2", (X1, -600), (Y1, 600)))
    bus.send_linked_placed(batch, X1)
    bus.send_linked_placed(batch, X1)
    bus.run()
    assert [a for a in answers(bus, "l1", "l2")] == [
        ("l1", "accepted", None, False), ("l2", "accepted", None, False),
        ("l1", "accepted", None, True), ("l2", "accepted", None, True)]
    assert balances(bus) == {X1: (400, 0), X2: (80, 0), Y1: (620, 0), Y2: (0, 0)}
    assert not engine_records(bus)


def test_a_batch_naming_a_coordinator_that_does_not_exist_is_refused_whole():
    bus = funded()
    batch = linked(transfer("l1", (X1, -1), (Y1, 1)), transfer("l2", (X1, -1), (X2, 1)))
    bus.send_to(0, coordinated_by(N, batch))
    bus.run()
    assert [a[:3] for a in answers(bus, "l1", "l2")] == [("l1", "rejected", "invalid_command"),
                                                          ("l2", "rejected", "invalid_command")]
    assert f"names partition {N} to coordinate it" in bus.result("l1")["detail"]
    assert balances(bus)[X1] == (1_000, 0)


@pytest.mark.parametrize("crash", [None, Crash("outputs", 1), *(Crash("changelog", n) for n in range(7))],
                         ids=lambda c: "none" if c is None else f"{c.point}-{c.count}")
def test_a_command_sent_alone_while_its_copy_waits_is_decided_when_the_copy_is_dropped(crash):
    """The producer wrote the batch's copy only (it died before writing to the coordinator) and, restarted,
    sends l1 alone to its home, partition 1, where the copy marked it in flight: it is counted as a retry, to be
    answered by the batch's decision. No ReserveLinked comes; when the copy's wait ends, l1 waits no more for
    a batch and is decided alone (before, the copy's drop forgot it: l1 was never answered), also when the
    worker crashes part way through the record that drops the copy."""
    bus = funded(y1=100)
    oracles = Oracles(bus)
    batch = linked(transfer("l1", (Y1, -80), (X2, 80)), transfer("l2", (X1, -600), (Y1, 600)))
    placed = coordinated_by(0, batch)
    bus.send_to(1, placed, key=routing.routing_key_for(X1).encode())
    bus.run()
    assert bus.account(Y1) == (100, 80)
    alone = transfer("l1", (Y1, -80), (X2, 80))
    oracles.sent_command(alone)
    bus.send(alone, Y1)
    bus.run()
    assert not answers(bus, "l1"), "a retry of the batch in flight: answered when it is decided"
    bus.send(transfer("later", (Y2, 0), (Y1, 0)), Y1, at_ms=bus.clock + COPY_WAIT_MS + 1)
    bus.step(1, crash=crash)
    bus.run()
    oracles.check_quiet()
    # (a crash after l1 was woken and decided, before it left the queue, answers it again: a duplicate)
    assert {a[:3] for a in answers(bus, "l1", "l2")} == {("l1", "accepted", None)}
    assert [a for a in answers(bus, "l1", "l2") if not a[3]] == [("l1", "accepted", None, False)]
    assert balances(bus) == {X1: (1_000, 0), X2: (80, 0), Y1: (20, 0), Y2: (0, 0)}
    assert not engine_records(bus)
    assert_books_balance(bus, ("USD",))


@pytest.mark.parametrize("crash", [None, Crash("outputs", 1), *(Crash("changelog", n) for n in range(5))],
                         ids=lambda c: "none" if c is None else f"{c.point}-{c.count}")
def test_a_command_sent_again_only_in_another_batch_while_its_copy_waits_never_posts_alone(crash):
    """As above, but l1 is sent again only inside another linked batch (l1 with l8, coordinated in partition 1),
    which fails on it: l1 is in flight there, it keeps its own decision. When the copy is dropped unconfirmed,
    that decision is the refusal the other batch met (in_flight), remembered at l1's home: l1 never posts
    alone, since it was only ever sent linked with commands that did not post, and a batch sent later that
    holds it fails on it."""
    bus = funded(y1=100)
    oracles = Oracles(bus)
    batch = linked(transfer("l1", (Y1, -80), (X2, 80)), transfer("l2", (X1, -600), (Y1, 600)))
    placed = coordinated_by(0, batch)
    bus.send_to(1, placed, key=routing.routing_key_for(X1).encode())
    bus.run()
    other = [transfer("l1", (Y1, -80), (X2, 80)), transfer("l8", (Y2, 0), (X2, 0))]
    for item in other:
        oracles.sent_command(item)
    bus.send(linked(*other), Y1)
    bus.run()
    assert [a[:3] for a in answers(bus, "l1", "l8")] == [("l8", "rejected", "linked_failed")]
    bus.send(transfer("later", (Y2, 0), (Y1, 0)), Y1, at_ms=bus.clock + COPY_WAIT_MS + 1)
    bus.step(1, crash=crash)
    bus.run()
    oracles.check_quiet()
    # (a crash after the answers went out and before the changelog did publishes them again, byte for byte)
    assert sorted({a[:3] for a in answers(bus, "l1", "l8")}) == [("l1", "rejected", "in_flight"),
                                                                  ("l8", "rejected", "linked_failed")]
    assert balances(bus) == {X1: (1_000, 0), X2: (0, 0), Y1: (100, 0), Y2: (0, 0)}
    assert not engine_records(bus)
    assert_books_balance(bus, ("USD",))


def test_a_batch_holding_a_transaction_under_way_at_its_coordinator_decides_nothing_for_another_partition():
    """l1 (partition 0 to 1) is under way alone when the batch l1, l2 arrives; l2's home is partition 1. The
    batch fails on l1, which keeps its own decision, and l2's answer is recorded at its home, by the two-phase
    protocol, where the copy had reserved (before, the coordinator remembered l2 linked_failed before looking
    where the batch's commands live, and l2 sent alone to its home later was decided a second time there)."""
    bus = funded(y1=100)
    oracles = Oracles(bus)
    l1, l2 = transfer("l1", (X1, -600), (Y1, 600)), transfer("l2", (Y1, -80), (X2, 80))
    for item in (l1, l2):
        oracles.sent_command(item)
    bus.send(l1, X1)
    bus.step(0)  # l1 begun alone: under way
    bus.send_linked_placed(linked(l1, l2), X1)
    bus.run()
    assert answers(bus, "l1", "l2") == [("l1", "accepted", None, False), ("l2", "rejected", "linked_failed", False),
                                        ("l1", "accepted", None, True)]
    assert "l1" in bus.result("l2")["detail"]
    bus.send(l2, Y1)  # l2 alone, to its home: answered from its decision there
    bus.run()
    oracles.check_quiet()
    assert answers(bus, "l2")[-1] == ("l2", "rejected", "linked_failed", True)
    assert balances(bus) == {X1: (400, 0), X2: (0, 0), Y1: (700, 0), Y2: (0, 0)}
    assert not engine_records(bus)
    assert_books_balance(bus, ("USD",))


def unreadable_batch(payer: str, oracles: Oracles) -> tuple[bytes, bytes, bytes]:
    """bad (payer pays X2 an amount that cannot be read), l1 (X1 pays Y1 600), l2 (Y1 pays X2 80), told to the
    oracles as sent."""
    bad = command("bad", "PostTransaction", {
        "transaction_id": "bad", "kind": "transfer", "reference": None, "links": [], "metadata": {},
        "occurred_at_ms": None, "rate_snapshot_id": None,
        "legs": [{"account_id": payer, "amount": "abc", "hold_id": None, "currency": None},
                 {"account_id": X2, "amount": "1", "hold_id": None, "currency": None}]})
    l1, l2 = transfer("l1", (X1, -600), (Y1, 600)), transfer("l2", (Y1, -80), (X2, 80))
    for item in (l1, l2, bad):
        oracles.sent_command(item)
    return bad, l1, l2


def test_an_unreadable_command_in_a_copy_is_answered_by_the_coordinator_only():
    """The batch, copies and all, holds a transaction whose amount cannot be read. The coordinator answers it
    (invalid_amount, remembered) and refuses the others; the copy reserves nothing and answers nothing (before,
    the copy's partition remembered invalid_amount too: the command was decided in two partitions)."""
    bus = funded(y1=100)
    oracles = Oracles(bus)
    bad, l1, l2 = unreadable_batch(Y1, oracles)
    placed = coordinated_by(0, linked(l1, l2, bad))
    for partition in (0, 1):
        bus.send_to(partition, placed, at_ms=bus.clock + 1, key=routing.routing_key_for(X1).encode())
    bus.run()
    oracles.check_quiet()
    assert [(e.partition, e.result["command_id"], e.result["reason"]) for e in bus.emitted
            if e.result["command_id"] in ("l1", "l2", "bad") and (e.partition == 1 or e.result["command_id"] == "bad")
            ] == [(0, "bad", "invalid_amount")]
    assert balances(bus) == {X1: (1_000, 0), X2: (0, 0), Y1: (100, 0), Y2: (0, 0)}


def test_a_batch_across_partitions_refused_for_an_unreadable_command_decides_none_of_the_others():
    """The batch l1, l2, bad (l2's home is partition 1) is refused at its coordinator for bad, which cannot be
    read. The others are answered linked_spans_partitions, not remembered (the batch decides none of them, as a
    batch that cannot be linked across partitions); l2 sent alone to its home is then decided there, once
    (before, the coordinator remembered l2 linked_failed, and l2 was decided again at its home)."""
    bus = funded(y1=100)
    oracles = Oracles(bus)
    bad, l1, l2 = unreadable_batch(X1, oracles)
    bus.send(linked(l1, l2, bad), X1)
    bus.run()
    assert answers(bus, "l1", "l2", "bad") == [("l1", "rejected", "linked_spans_partitions", False),
                                               ("l2", "rejected", "linked_spans_partitions", False),
                                               ("bad", "rejected", "invalid_amount", False)]
    assert "bad" in bus.result("l2")["detail"]
    bus.send(l2, Y1)
    bus.run()
    oracles.check_quiet()
    assert answers(bus, "l2")[-1] == ("l2", "accepted", None, False)
    assert balances(bus) == {X1: (1_000, 0), X2: (80, 0), Y1: (20, 0), Y2: (0, 0)}


# --- copies amid everything else, delivered in random orders with crashes -----------------------------------------
@pytest.mark.parametrize("seed", [0, 1, 7, 11, 19, 23, 34])
@pytest.mark.parametrize("changelog_cuts", ["anywhere", "transaction"])
def test_copies_keep_every_promise_while_producers_die_retry_and_log_time_jumps(seed, changelog_cuts):
    """Linked batches among accounts of three partitions written as LedgerClient writes them, some by a producer
    that died before writing the coordinator's record (copies only), some holding a command of an earlier
    batch; commands of earlier batches sent again alone; log time jumping by half a copy's wait; random
    delivery with crashes and restarts; finally every copy's wait ends. Every promise's oracle holds after each
    step and once quiet: every command sent is answered (before, a command sent again alone while only a copy
    marked it in flight was never answered once the copy was dropped), nothing stays reserved."""
    rng = random.Random(seed)
    bus, oracles = checked_bus(changelog_cuts=changelog_cuts)
    accounts = funded_users(bus, oracles)

    def log_time_moves(name: str) -> None:  # a command in every partition, at the bus's clock
        for p in range(3):
            a, b = local_users(2, partition=p)
            send(bus, oracles, transfer(f"{name}-{p}", (a, 0), (b, 0)), a)

    sent: list[tuple[bytes, str]] = []  # the commands of every batch written, with their payers
    for n in range(14):
        r = rng.random()
        if r < 0.55 or not sent:
            items = [rng.choice(sent)] if sent and rng.random() < 0.3 else []
            while len(items) < rng.randint(1, 3):
                payer, payee = rng.sample(accounts, 2)
                amount = rng.choice((50, 200, 450, 900))
                items.append((transfer(f"b{n}-{len(items)}", (payer, -amount), (payee, amount)), payer))
            values = [value for value, _ in items]
            records = [C.decode("command", value) for value in values]
            coordinator, partitions = placement.linked_placements(records, items[0][1], bus.n)
            placed = coordinated_by(coordinator if len(partitions) > 1 else None, linked(*values))
            copies_only = len(partitions) > 1 and rng.random() < 0.3
            if not copies_only:
                for value in values:
                    oracles.sent_command(value)
            bus.clock += 1
            for p in partitions:
                if not (copies_only and p == coordinator):
                    bus.send_to(p, placed, bus.clock, routing.routing_key_for(items[0][1]).encode())
            sent += items
        elif r < 0.75:
            send(bus, oracles, *rng.choice(sent))  # a command of a batch, alone, to its home
        else:
            bus.clock += COPY_WAIT_MS // 2 + rng.randint(0, 1_000)
            log_time_moves(f"t{n}")
        for _ in range(rng.choice((0, 1, 2))):
            bus.tick(rng, **CHAOS)
            oracles.check_step()
    bus.run_random(rng, oracles.check_step, **CHAOS)
    bus.clock += COPY_WAIT_MS + 1  # every copy's wait ends
    log_time_moves("end")
    bus.run_random(rng, oracles.check_step, **CHAOS)
    oracles.check_quiet()
