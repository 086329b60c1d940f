"""The waiting queue (streams/waiting.py): one engine record per waiting command, kept in arrival order by the
partition state, through restarts and from the single record an earlier version kept. Broker-free, through
eight partition processors."""
from __future__ import annotations

import json
import random

import pytest

from streams import partition
from streams.spanning import Spanning
from streams.waiting import (COPIED_CREDIT_WAIT_MS, COPIED_WAIT_OVER, WAITING_ENTRY, WaitingIndex, parse_waiting_key,
                             waiting_key)
from tests.helpers.bus import Bus, assert_books_balance
from tests.helpers.interleavings import X1, X2, Y1, Y2, balances, funded_two_partitions, payee_with_a_reserved_credit
from tests.helpers.records import command, local_users, open_account, place_hold, transfer, tx


def _entry(*keys: str, kind: str = "ledger.FreezeAccount", **fields) -> dict:
    return {"keys": list(keys), "command": {"body": [kind, {}]}, "at_ms": 0, **fields}


def test_the_index_keeps_arrival_order_and_counts_what_entries_hold():
    index = WaitingIndex([(5, _entry("a:x")), (2, _entry("a:x", "h:1")), (9, _entry("a:y"))])
    assert list(index.entries) == [2, 5, 9] and index.next_seq() == 10
    assert index.holds_any(["a:x"]) and index.holds_any(["h:1", "a:z"]) and not index.holds_any(["a:z"])
    index.drop(2)
    assert index.holds_any(["a:x"]) and not index.holds_any(["h:1"])  # 5 still holds a:x
    index.drop(5)
    index.drop(5)  # twice: nothing more
    assert not index.holds_any(["a:x"]) and index.holds_any(["a:y"]) and len(index) == 1
    index.put(3, _entry("a:z"))  # below the last: kept in order
    assert list(index.entries) == [3, 9]
    index.put(9, _entry("a:w"))  # the same seq again: replaced, its old keys no longer held
    assert not index.holds_any(["a:y"]) and index.holds_any(["a:w"])
    index.drop(3), index.drop(9)
    assert index.next_seq() == 0 and not index.held
    # Only debits still counting copied credits are indexed by the end of that wait.
    index.put(1, _entry("a:x", kind="ledger.PostTransaction"))
    index.put(2, _entry("a:y", kind="ledger.PlaceHold"))
    index.put(3, _entry("a:z", kind="ledger.PostTransaction", **{COPIED_WAIT_OVER: True}))
    index.put(4, _entry("a:w"))
    assert sorted(index.dues.live) == ["1", "2"] and index.dues.get("1") == COPIED_CREDIT_WAIT_MS
    index.put(1, _entry("a:x", kind="ledger.PostTransaction", **{COPIED_WAIT_OVER: True}))  # rewritten: over
    index.drop(2)
    assert not index.dues.live
    assert parse_waiting_key(waiting_key(42)) == 42 and waiting_key(42).startswith(WAITING_ENTRY)


def _order(bus: Bus, ids: list[str]) -> list[str]:
    return [r["command_id"] for r in bus.results if r["command_id"] in ids and not r["duplicate"]]


def _waiting_records(bus: Bus, partition: int) -> list[bytes]:
    return [k for k, _ in bus.stored(partition, b"e/" + WAITING_ENTRY.encode())] + \
        [k for k, _ in bus.stored(partition, b"e/w") if k == b"e/w"]


def test_waiting_commands_keep_their_order_through_a_restart_from_the_changelog():
    bus, _, payee = payee_with_a_reserved_credit()
    ids = [f"fz{i}" for i in range(3)] + ["uf"]
    for i in range(3):  # freezes wait for the reservation, the unfreeze behind them
        bus.send(command(f"fz{i}", "FreezeAccount", {"account_id": payee}), payee)
        bus.step(1)
    bus.send(command("uf", "UnfreezeAccount", {"account_id": payee}), payee)
    bus.step(1)
    assert not _order(bus, ids) and len(bus.procs[1].state.waiting) == 4
    bus.crash_restore(1, fresh_store=True)  # a new worker: the queue comes back from the changelog
    assert len(bus.procs[1].state.waiting) == 4
    bus.run()
    assert _order(bus, ids) == ids
    assert not _waiting_records(bus, 1) and len(bus.procs[1].state.waiting) == 0
    assert bus.account(payee) == (10, 0)
    assert_books_balance(bus, ("USD",))


def test_a_waiting_command_keeps_its_place_behind_a_blocked_one_through_other_decisions():
    """A freeze of Y waits for a transfer in flight to Y (its copy reserved the credit; its coordinator, in a
    third partition, has not read it); an unfreeze and a hold on Y wait behind it, though neither would wait
    alone. Other transfers into Y's partition are decided meanwhile, and each decision drains the queue: the
    freeze is still held back, so nothing behind it may go. Once the transfer is decided: freeze, unfreeze,
    hold, in that order."""
    z, x, y, y2 = local_users(1, 2)[0], local_users(1, 0)[0], *local_users(2, 1)
    bus = Bus()
    for account in (z, x, y, y2):
        bus.send(open_account(account), account)
    for account in (z, x):
        bus.send(tx(f"dep-{account}", [("sys:world:USD", -100, None, None), (account, 100, None, None)], "deposit"),
                 account)
    bus.run()
    bus.send_placed(tx("t0", [(z, -10, None, None), (y, 10, None, None)], "transfer"), z)
    bus.step(1)  # the copy reserves the credit to y; partition 2 (its coordinator) is left unread below
    bus.send(command("fz", "FreezeAccount", {"account_id": y}), y)
    bus.send(command("uf", "UnfreezeAccount", {"account_id": y}), y)
    bus.send(place_hold("h", y, 5, None), y)
    for i in range(3):  # decided meanwhile, each ending with a Decide in partition 1
        bus.send_placed(tx(f"t{i + 1}", [(x, -1, None, None), (y2, 1, None, None)], "transfer"), x)
    while bus.pending(0) or bus.pending(1):
        for p in (0, 1):
            if bus.pending(p):
                bus.step(p)
    ids = ["fz", "uf", "hold:h"]
    assert [bus.result(f"t{i + 1}")["outcome"] for i in range(3)] == ["accepted"] * 3
    assert not _order(bus, ids) and len(bus.procs[1].state.waiting) == 3
    bus.run()
    assert _order(bus, ids) == ids
    assert bus.account(y) == (10, 5)
    assert_books_balance(bus, ("USD",))


def test_the_single_queue_record_of_an_earlier_version_is_drained_first():
    bus, _, payee = payee_with_a_reserved_credit()
    for i in range(2):
        bus.send(command(f"fz{i}", "FreezeAccount", {"account_id": payee}), payee)
        bus.step(1)
    # What an earlier version stored: the same entries in one list under `w`, no wq/ records.
    store = bus.stores[1]
    queued = [(k, json.loads(v)) for k, v in store.scan(b"e/" + WAITING_ENTRY.encode())]
    assert len(queued) == 2
    store.write({b"e/w": json.dumps([e for _, e in queued], separators=(",", ":")).encode()},
                {k for k, _ in queued})
    bus.crash_restore(1)
    assert len(bus.procs[1].state.waiting) == 0
    bus.send(command("uf", "UnfreezeAccount", {"account_id": payee}), payee)  # keeps its place behind them
    bus.step(1)
    assert len(bus.procs[1].state.waiting) == 1
    bus.run()
    assert _order(bus, ["fz0", "fz1", "uf"]) == ["fz0", "fz1", "uf"]
    assert not _waiting_records(bus, 1)
    assert_books_balance(bus, ("USD",))


def _chasing_traffic(seed: int) -> tuple[list, dict]:
    """Transfers into Y1 (some refused: X1 runs out), payments out of Y1 chasing them (some across partitions),
    holds on Y1 that expire in log time and releases of them, freezes and unfreezes of Y2, delivered in a
    seeded random order: what the waiting commands' judgements depend on changes in every way, not only by
    the credits in flight. Returns every result and the balances."""
    rng = random.Random(seed)
    bus = funded_two_partitions()
    for i in range(10):
        bus.send_placed(transfer(f"in-{i}", (X1, -100), (Y1, 100)), X1)
        amount = rng.randint(40, 160)
        bus.send_placed(transfer(f"out-{i}", (Y1, -amount), (rng.choice([Y2, X2]), amount)), Y1)
        if rng.random() < 0.5:
            bus.send(place_hold(f"h{i}", Y1, rng.randint(10, 120), bus.clock + rng.randint(1, 30)), Y1)
        if rng.random() < 0.3:
            bus.send(command(f"rel-{i}", "ReleaseHold", {"hold_id": f"h{i - 1}"}), Y1)
        if rng.random() < 0.2:
            kind = rng.choice(["FreezeAccount", "UnfreezeAccount"])
            bus.send(command(f"fz-{i}", kind, {"account_id": Y2}), Y2)
        for _ in range(rng.randint(0, 3)):
            bus.tick(rng, max_records=4)
    bus.run_random(rng, max_records=4)
    return ([(r["command_id"], r["outcome"], r["reason"], r["duplicate"]) for r in bus.results],
            balances(bus))


@pytest.mark.parametrize("forget", [False, True], ids=["versions kept", "versions forgotten at each commit"])
@pytest.mark.parametrize("seed", range(8))
def test_reusing_a_waiting_command_s_judgement_changes_no_decision(seed, forget, monkeypatch):
    """A drain reuses a waiting command's last judgement while nothing it read was written since
    (Spanning._still_blocked). The same traffic decided with every waiting command judged afresh at every
    drain gives the same results, in the same order, and the same balances; also when the state forgets its
    write counts at every commit (as it does past DECODED_CACHE_LIMIT keys), which must make every memo stale."""
    if forget:
        monkeypatch.setattr(partition, "DECODED_CACHE_LIMIT", 0)
    remembered = _chasing_traffic(seed)
    assert any(r[0].startswith("out-") and r[1] == "accepted" for r in remembered[0])
    monkeypatch.setattr(Spanning, "_still_blocked", lambda self, where, entry, command: self._blocked(command, {}))
    assert _chasing_traffic(seed) == remembered


def test_a_debit_in_the_queue_record_of_an_earlier_version_counts_no_copied_credit():
    """An earlier version's one queue record (`w`) had no wait for credits, and its entries are never marked over
    (end_copied_waits walks the wq/ records): a debit found there is judged without the credits only copies
    reserved, not held back by them until the copies are dropped."""
    bus, payer, payee = payee_with_a_reserved_credit()  # 10 to the payee in flight, reserved by a copy only
    bus.send(transfer("pay", (payee, -5), (payer, 5)), payee)
    bus.step(1)  # it waits for the copied credit
    store = bus.stores[1]
    queued = [(k, json.loads(v)) for k, v in store.scan(b"e/" + WAITING_ENTRY.encode())]
    assert len(queued) == 1
    store.write({b"e/w": json.dumps([e for _, e in queued], separators=(",", ":")).encode()}, {k for k, _ in queued})
    bus.crash_restore(1)
    del bus.logs[0][bus.position[0]:]  # t0's coordinator never reads it: its copy's credit stays copied only
    other = local_users(2, 1)[1]
    bus.send(open_account(other), other)
    bus.send_placed(tx("t1", [(payer, -1, None, None), (other, 1, None, None)], "transfer"), payer)
    bus.run()  # t1 is decided, and its Decide drains partition 1's queue
    assert _order(bus, ["pay"]) == ["pay"]
    assert bus.result("pay")["reason"] == "insufficient_funds"
