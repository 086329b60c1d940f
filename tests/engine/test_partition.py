"""The partition state machine without a broker: determinism, restore, expiry, and the store contract."""
from __future__ import annotations

import json

import pytest

from schemas.codec import codec
from streams import core, routing
from streams.partition import PartitionProcessor
from streams.store import MemoryStore, RocksStore
from streams.wire import account_from_record, account_to_record, hold_from_record, hold_to_record
from tests.helpers.bus import Bus, assert_books_balance
from tests.helpers.records import N, batch, command, local_users, open_account, place_hold, transfer, tx  # noqa: F401
from tests.helpers.trade import BUYER_BTC, BUYER_P, BUYER_USDT, SELLER_BTC, SELLER_P, SELLER_USDT, TRADE, setup_trade

C = codec()


def script() -> list[bytes]:
    a, b, c = local_users(3)
    remote = next(f"user:{i}:USD" for i in range(100) if routing.partition_of_account(f"user:{i}:USD", N) != 0)
    return [
        open_account(a), open_account(b), open_account(c),
        transfer("dep", ("sys:world:USD", -1_000), (a, 1_000)),
        transfer("t1", (a, -100), (b, 100)),
        transfer("t1", (a, -100), (b, 100)),  # duplicate
        transfer("t1", (a, -999), (b, 999)),  # conflict
        place_hold("h1", a, 300, 1_700_000_000_100),
        transfer("cap", (a, -50), (c, 50), hold="h1"),
        transfer("far", (a, -10), (remote, 10)),
        b"\x00poison",
        transfer("over", (b, -10_000), (c, 10_000)),
        transfer("later", (b, -1), (c, 1)),  # its time passes h1's expiry: h1 expires first
    ]


def run(proc: PartitionProcessor, records: list[bytes], start_ms: int = 1_700_000_000_000):
    for offset, value in enumerate(records):
        proc.handle(offset, start_ms + offset * 10, b"k", value)
    return proc.take()


def test_the_same_log_gives_byte_identical_outputs_and_changelog():
    first = run(PartitionProcessor(0, N, MemoryStore()), script())
    second = run(PartitionProcessor(0, N, MemoryStore()), script())
    assert first == second
    outputs, changelog = first
    results = [C.decode("result", o.value) for o in outputs if o.topic == "results"]
    by_id = {}
    for r in results:
        by_id.setdefault(r["command_id"], []).append(r)
    assert [(r["outcome"], r["duplicate"], r["reason"]) for r in by_id["t1"]] == [
        ("accepted", False, None), ("accepted", True, None), ("rejected", False, "id_conflict")]
    assert by_id["over"][0]["reason"] == "insufficient_funds"
    assert by_id["expire:h1"][0]["outcome"] == "accepted"  # expired by log time, before "later"
    assert [o.topic for o in outputs].count("dlq") == 1
    assert any(o.topic == "commands" for o in outputs), "the remote credit left as a follow-up command"


def test_restore_from_the_changelog_rebuilds_the_same_state():
    live_store = MemoryStore()
    live = PartitionProcessor(0, N, live_store)
    _, changelog = run(live, script())
    live.state.commit(len(changelog))
    fresh_store = MemoryStore()
    restored = PartitionProcessor(0, N, fresh_store)
    assert restored.restore(changelog, len(changelog)) == len(changelog)
    assert fresh_store.data == live_store.data
    # A record delivered again (a paused worker writing late) is skipped, not applied twice.
    assert restored.restore(changelog, 2 * len(changelog)) == 0
    a = local_users(1)[0]
    # "far" credits another partition: reserved here (held), posted once that partition votes.
    assert (restored.state.account(a).posted, restored.state.account(a).held) == (1_000 - 100 - 50, 10)


def test_a_command_redone_after_restore_is_answered_from_the_inbox():
    live = PartitionProcessor(0, N, MemoryStore())
    outputs, changelog = run(live, script()[:5])
    restored = PartitionProcessor(0, N, MemoryStore())
    restored.restore(changelog, len(changelog))
    redo, redo_changelog = run(restored, script()[4:5])
    assert redo_changelog == []
    (result,) = [C.decode("result", o.value) for o in redo if o.topic == "results"]
    original = next(C.decode("result", o.value) for o in outputs
                    if o.topic == "results" and C.decode("result", o.value)["command_id"] == "t1")
    assert result == {**original, "duplicate": True}


def test_a_batch_is_decided_exactly_as_its_commands_sent_one_by_one():
    """A CommandBatch record yields the same results, history and balances as its commands in records of
    their own with the same time; a poison item is dead-lettered alone with its own bytes."""
    at = 1_700_000_000_000
    one_by_one = PartitionProcessor(0, N, MemoryStore())
    for offset, value in enumerate(script()):
        one_by_one.handle(offset, at, b"k", value)
    singles, single_changelog = one_by_one.take()
    batched = PartitionProcessor(0, N, MemoryStore())
    batched.handle(0, at, b"k", batch(*script()))
    outputs, changelog = batched.take()
    assert [o for o in outputs if o.topic != "dlq"] == [o for o in singles if o.topic != "dlq"]
    def redo(records):  # the changelog minus where each command sat in the log
        return [{k: v for k, v in C.decode("state", r).items() if k != "source_offset"} for r in records]
    assert redo(changelog) == redo(single_changelog) and len(changelog) > 5
    (dead,) = [o for o in outputs if o.topic == "dlq"]
    letter = C.decode("dead_letter", dead.value)
    index = script().index(b"\x00poison")
    assert dead.key == f"0/0/{index}".encode()
    assert letter["value"] == b"\x00poison" and letter["reason"] == "not_avro"
    assert letter["detail"].startswith(f"command {index} of the batch")


def test_an_undecodable_batch_is_one_dead_letter_and_changes_nothing():
    proc = PartitionProcessor(0, N, MemoryStore())
    broken = batch(*script())[:-7]
    proc.handle(5, 1_700_000_000_000, b"k", broken)
    outputs, changelog = proc.take()
    assert changelog == [] and [o.topic for o in outputs] == ["dlq"]
    letter = C.decode("dead_letter", outputs[0].value)
    assert (letter["reason"], letter["offset"], letter["value"]) == ("corrupt", 5, broken)
    assert outputs[0].key == b"0/5"


def test_an_empty_batch_is_a_dead_letter():
    proc = PartitionProcessor(0, N, MemoryStore())
    proc.handle(3, 1_700_000_000_000, b"k", batch())
    outputs, changelog = proc.take()
    assert changelog == [] and [(o.topic, C.decode("dead_letter", o.value)["reason"]) for o in outputs] == [
        ("dlq", "empty")]


def test_retries_of_an_in_flight_transaction_in_one_batch_get_distinct_ids():
    a = local_users(1, partition=0)[0]
    b = local_users(1, partition=1)[0]
    proc = PartitionProcessor(0, N, MemoryStore())
    tx = transfer("multi", (a, -5), (b, -5), ("sys:world:USD", 10))
    proc.handle(0, 1_700_000_000_000, b"k", batch(tx, tx, tx))
    outputs, changelog = proc.take()
    ids = [C.decode("state", c)["command_id"] for c in changelog]
    # begun (its own legs judged at once, at its position, and its vote counted in place), then the two retries
    assert len(ids) == len(set(ids)) == 3, ids
    assert [i.rsplit("~", 1)[-1] for i in ids[1:]] == ["0.1", "0.2"]


def test_two_clients_may_use_the_same_command_id():
    """The inbox key is (client_id, command_id) (P4): the same id from two clients is two commands, each
    decided and answered under its own key, whether the payloads are equal or not; a retry of each is a duplicate."""
    a, b, c = local_users(3)
    same = lambda client: tx("pay", [(a, -100, None, None), (b, 100, None, None)], "transfer", client)
    other = tx("pay", [(a, -30, None, None), (c, 30, None, None)], "transfer", "carol")
    proc = PartitionProcessor(0, N, MemoryStore())
    records = [open_account(a), open_account(b), open_account(c),
               transfer("dep", ("sys:world:USD", -1_000), (a, 1_000)),
               same("alice"), same("bob"), other, same("alice"), other]
    outputs, changelog = run(proc, records)
    results = [(o.key, C.decode("result", o.value)) for o in outputs if o.topic == "results"]
    pay = [(key, r["client_id"], r["outcome"], r["duplicate"]) for key, r in results if r["command_id"] == "pay"]
    assert pay == [
        (b"alice/pay", "alice", "accepted", False),
        (b"bob/pay", "bob", "accepted", False),
        (b"carol/pay", "carol", "accepted", False),
        (b"alice/pay", "alice", "accepted", True),
        (b"carol/pay", "carol", "accepted", True),
    ]
    assert [proc.state.account(x).posted for x in (a, b, c)] == [1_000 - 100 - 100 - 30, 200, 30]
    decided = [(r["client_id"], r["command_id"]) for r in (C.decode("state", x) for x in changelog)]
    assert [k for k in decided if k[1] == "pay"] == [("alice", "pay"), ("bob", "pay"), ("carol", "pay")]


@pytest.fixture(params=["memory", "rocksdb"])
def store(request, tmp_path):
    s = MemoryStore() if request.param == "memory" else RocksStore(tmp_path / "db")
    yield s
    s.close()


def test_store_contract(store):
    assert store.get(b"a") is None
    store.write({b"a/1": b"x", b"a/2": b"y", b"b/1": b"z"}, set())
    assert store.get(b"a/1") == b"x"
    assert list(store.scan(b"a/")) == [(b"a/1", b"x"), (b"a/2", b"y")]
    store.write({b"a/3": b"w"}, {b"a/1", b"missing"})
    assert list(store.scan(b"a/")) == [(b"a/2", b"y"), (b"a/3", b"w")]
    assert list(store.scan(b"c/")) == []


def test_rocksdb_state_survives_reopening(tmp_path):
    store = RocksStore(tmp_path / "p0")
    proc = PartitionProcessor(0, N, store)
    _, changelog = run(proc, script())
    proc.state.commit(len(changelog))
    before = dict(store.scan(b""))
    store.close()
    reopened = RocksStore(tmp_path / "p0")
    assert dict(reopened.scan(b"")) == before
    assert PartitionProcessor(0, N, reopened).state.changelog_offset() == len(changelog)
    reopened.close()


# --- across partitions (tests/helpers/bus.py delivers follow-ups in order) -----------------------------------
def _funded_pair(bus, amount: int = 1_000) -> tuple[str, str]:
    """An account funded with `amount` in partition 0 and an open, empty account in another partition."""
    payer = local_users(1, partition=0)[0]
    payee = local_users(1, partition=1)[0]
    for account in (payer, payee):
        bus.send(open_account(account), account)
    bus.send(transfer("dep", ("sys:world:USD", -amount), (payer, amount)), payer)
    bus.run()
    return payer, payee


def test_a_payment_to_another_partition_posts_every_leg_under_its_own_id():
    """The payer's partition reserves the debit, the payee's checks the credit; once both voted, each posts
    its share under the transaction's own id, through its clearing shard, which ends at zero (P6)."""
    bus = Bus()
    payer, payee = _funded_pair(bus)
    bus.send(transfer("pay", (payer, -300), (payee, 300)), payer)
    bus.run()
    assert bus.result("pay")["outcome"] == "accepted"
    assert (bus.account(payer), bus.account(payee)) == ((700, 0), (300, 0))
    legs = {(h["account_id"], int(h["amount"])) for h in bus.history if h["transaction_id"] == "pay"
            and h["kind"] == "transfer"}
    assert legs == {(payer, -300), (routing.shard_of("sys:clearing:USD", 0), 300),
                    (routing.shard_of("sys:clearing:USD", 1), -300), (payee, 300)}
    assert bus.account("sys:clearing:USD") == (0, 0)
    assert_books_balance(bus, ("USD",))


@pytest.mark.parametrize("prepare, reason", [
    ("close", "account_closed"), ("unknown", "unknown_account"), ("cap", "balance_limit_exceeded")])
def test_a_credit_that_cannot_land_elsewhere_is_refused_as_it_would_be_in_one_partition(prepare, reason):
    """The sender's answer is the final outcome: a payment the payee's partition cannot credit is rejected,
    with the reason the same payment gets when both accounts live in one partition, and nothing moves."""
    answers = []
    for payee_partition in (0, 1):
        bus = Bus()
        payer = local_users(1, partition=0)[0]
        payee = next(u for u in local_users(3, partition=payee_partition) if u != payer)
        bus.send(open_account(payer), payer)
        if prepare != "unknown":
            bus.send(open_account(payee, max_balance=200 if prepare == "cap" else None), payee)
        bus.send(transfer("dep", ("sys:world:USD", -1_000), (payer, 1_000)), payer)
        if prepare == "close":
            bus.send(command("close", "CloseAccount", {"account_id": payee}), payee)
        bus.run()
        bus.send(transfer("pay", (payer, -300), (payee, 300)), payer)
        bus.run()
        answers.append((bus.result("pay")["outcome"], bus.result("pay")["reason"]))
        assert bus.account(payer) == (1_000, 0), "nothing moved, nothing stays held"
        assert bus.account("sys:clearing:USD") == (0, 0)
        assert_books_balance(bus, ("USD",))
    assert answers == [("rejected", reason)] * 2


@pytest.mark.parametrize("kind", ["transfer", "hold", "open"])
def test_a_command_sent_to_the_wrong_partition_is_forwarded_unchanged(kind):
    payer = local_users(1, partition=2)[0]
    value = {"transfer": transfer("pay", (payer, -5), ("sys:world:USD", 5)), "hold": place_hold("h", payer, 5, None),
             "open": open_account(payer, max_balance=500)}[kind]
    proc = PartitionProcessor(0, N, MemoryStore())
    outputs, changelog = run(proc, [value])
    assert changelog == []
    (forwarded,) = outputs
    assert (forwarded.topic, forwarded.partition, forwarded.key) == (
        "commands", 2, routing.routing_key_for(payer).encode())
    assert C.decode("command", forwarded.value) == C.decode("command", value)
    # Delivered where it belongs, it is decided there like any command.
    bus = Bus()
    if kind == "open":
        bus.send_to(0, value)
        bus.run()
        assert bus.result(f"open:{payer}")["outcome"] == "accepted"
        assert bus.procs[2].state.account(payer).policy.max_balance == 500  # opened where it lives, as sent
        return
    bus.send(open_account(payer), payer)
    bus.send(transfer("dep", ("sys:world:USD", -10), (payer, 10)), payer)
    bus.send_to(0, value)
    bus.run()
    command_id = "pay" if kind == "transfer" else "hold:h"
    assert bus.result(command_id)["outcome"] == "accepted"
    assert bus.account(payer) == ((5, 0) if kind == "transfer" else (10, 5))


def test_a_transaction_with_debits_in_two_partitions_needs_the_currency_of_a_remote_credit():
    """The coordinator cannot tell the currency of a credit leg in a third partition from an id like
    user:x:FOO (FOO is no registered currency) and no leg currency: invalid_command, nothing reserved."""
    bus = Bus()
    setup_trade(bus)
    stranger = next(f"user:{i}:FOO" for i in range(1_000)
                    if routing.partition_of_account(f"user:{i}:FOO", N) not in (BUYER_P, SELLER_P))
    legs = [(BUYER_USDT, -100, None, None), (SELLER_BTC, -5, None, None),
            (stranger, 100, None, None), (BUYER_BTC, 5, None, "BTC")]
    bus.send(tx("odd", legs), BUYER_USDT)
    bus.run()
    result = bus.result("odd")
    assert (result["outcome"], result["reason"]) == ("rejected", "invalid_command")
    assert result["detail"] == f"leg on {stranger} (another partition) needs its currency"
    assert bus.account(BUYER_USDT) == (40_000_000_000, 30_000_000_000)
    assert bus.account(SELLER_BTC) == (20_000_000, 20_000_000)
    assert_books_balance(bus)


def test_every_retry_of_a_transaction_in_flight_is_answered_once_it_is_decided():
    bus = Bus()
    setup_trade(bus)
    for _ in range(3):
        bus.send(tx("fill-1", TRADE), BUYER_USDT)
    bus.run()
    answers = [(r["outcome"], r["duplicate"]) for r in bus.results if r["command_id"] == "fill-1"]
    assert answers == [("accepted", False), ("accepted", True), ("accepted", True)]
    assert bus.account(BUYER_USDT) == (28_020_000_000, 18_020_000_000), "the fill posted once"
    assert_books_balance(bus)


def test_a_refused_credit_side_aborts_and_frees_every_reservation():
    """Every partition reserved, but the coordinator's own credit leg is refused (the buyer's BTC account is
    closed): the transaction is rejected with that reason, the reservations are released in both partitions
    and the holds they locked can be released by their owners again."""
    bus = Bus()
    setup_trade(bus)
    bus.send(command("close:bb", "CloseAccount", {"account_id": BUYER_BTC}), BUYER_BTC)
    bus.send(tx("fill-1", TRADE), BUYER_USDT)
    bus.run()
    assert bus.result("close:bb")["outcome"] == "accepted"
    result = bus.result("fill-1")
    assert (result["outcome"], result["reason"]) == ("rejected", "account_closed")
    assert bus.account(BUYER_USDT) == (40_000_000_000, 30_000_000_000)
    assert bus.account(SELLER_BTC) == (20_000_000, 20_000_000)
    assert bus.hold("ask", SELLER_BTC).remaining == 20_000_000
    for hold, account in (("ask", SELLER_BTC), ("bid", BUYER_USDT)):
        bus.send(command(f"release:{hold}", "ReleaseHold", {"hold_id": hold}), account)
    bus.run()
    assert bus.result("release:ask")["outcome"] == bus.result("release:bid")["outcome"] == "accepted"
    assert (bus.account(BUYER_USDT), bus.account(SELLER_BTC)) == ((40_000_000_000, 0), (20_000_000, 0))
    assert_books_balance(bus)


# --- the stored records (streams/wire.py) -------------------------------------------------------------------
@pytest.mark.parametrize("account", [
    core.Account("user:1:USD", "USD", "user:1", core.AccountPolicy(False, 0, None), core.AccountStatus.OPEN,
                 0, 0, 1, None, 5),
    core.Account("user:2:ETH", "ETH", "vip", core.AccountPolicy(False, 250, 10**30), core.AccountStatus.FROZEN,
                 -(2**100), 2**101, 9, "t9", 1_700_000_000_123),
    core.Account("sys:world:USD@3", "USD", "sys:world", core.AccountPolicy(True, 0, None),
                 core.AccountStatus.CLOSED, 0, 0, 2, "t2", 6),
], ids=["plain", "every-field-set", "system-closed"])
def test_an_account_survives_its_stored_record(account):
    record = json.loads(json.dumps(account_to_record(account)))
    assert account_from_record(record) == account


@pytest.mark.parametrize("hold", [
    core.Hold("h1", "user:1:USD", 10**25, 3, 0, core.HoldStatus.OPEN, 1_700_000_000_999, ("t1", "t2")),
    core.Hold("h2", "user:1:USD", 7, 0, 7, core.HoldStatus.EXPIRED, None, ()),
], ids=["open-captured-twice", "expired"])
def test_a_hold_survives_its_stored_record(hold):
    record = json.loads(json.dumps(hold_to_record(hold)))
    assert hold_from_record(record) == hold


# --- why a spanning transaction is refused: each participant's reservation rules -------------------------------
def _trade_with(legs_change: dict[int, tuple]) -> list[tuple]:
    legs = list(TRADE)
    for index, leg in legs_change.items():
        legs[index] = leg
    return legs


@pytest.mark.parametrize("prepare, change, reason", [
    pytest.param(lambda bus: None, {3: (SELLER_BTC, -20_000_000, "nope", None)}, "unknown_hold", id="unknown-hold"),
    pytest.param(lambda bus: bus.send(command("rel", "ReleaseHold", {"hold_id": "ask"}), SELLER_BTC), {},
                 "hold_not_open", id="hold-released"),
    pytest.param(lambda bus: bus.send(command("frz", "FreezeAccount", {"account_id": SELLER_BTC}), SELLER_BTC), {},
                 "account_frozen", id="account-frozen"),
    pytest.param(lambda bus: None, {3: (SELLER_BTC, -20_000_001, "ask", None), 4: (BUYER_BTC, 19_980_001, None, "BTC")},
                 "capture_exceeds_hold", id="beyond-the-hold"),
    # Stated in USDT, the BTC debit leaves both currencies unbalanced as the coordinator counts them, and the
    # seller's partition finds the leg's currency wrong: the more urgent reason wins, as in one partition.
    pytest.param(lambda bus: None, {3: (SELLER_BTC, -20_000_000, "ask", "USDT")}, "currency_mismatch",
                 id="leg-currency"),
    pytest.param(lambda bus: None, {3: ("user:nobody:BTC", -20_000_000, None, None)}, "unknown_account",
                 id="unknown-account"),
])
def test_a_participant_that_cannot_reserve_refuses_the_whole_transaction(prepare, change, reason):
    bus = Bus()
    setup_trade(bus)
    prepare(bus)
    bus.run()
    legs = _trade_with(change)
    if change.get(3, ("",))[0] == "user:nobody:BTC":  # its partition must differ from the buyer's
        assert routing.partition_of_account("user:nobody:BTC", N) != BUYER_P
    bus.send(tx("fill-1", legs), BUYER_USDT)
    bus.run()
    result = bus.result("fill-1")
    assert (result["outcome"], result["reason"]) == ("rejected", reason), result
    assert bus.account(BUYER_USDT) == (40_000_000_000, 30_000_000_000), "the buyer's reservation was released"
    assert bus.hold("bid", BUYER_USDT).remaining == 30_000_000_000
    assert_books_balance(bus)


def test_a_participant_refuses_a_debit_stated_in_another_currency_than_its_account():
    """USDT balances as stated, but the seller's debit names its BTC account in USDT: the seller's partition
    refuses it (currency_mismatch) and the buyer's reservation is released; clearing is left empty."""
    bus = Bus()
    setup_trade(bus)
    bus.send(tx("swap-1", [(BUYER_USDT, -100, None, None), (SELLER_BTC, -5, None, "USDT"),
                           (SELLER_USDT, 105, None, "USDT")], kind="swap"), BUYER_USDT)
    bus.run()
    result = bus.result("swap-1")
    assert (result["outcome"], result["reason"]) == ("rejected", "currency_mismatch"), result
    assert bus.account(BUYER_USDT) == (40_000_000_000, 30_000_000_000)
    assert bus.account(SELLER_BTC) == (20_000_000, 20_000_000)
    assert_books_balance(bus)


def test_an_expired_hold_cannot_be_reserved():
    bus = Bus()
    setup_trade(bus, ask_expires_at_ms=bus.clock + 1_000)
    bus.send(tx("fill-1", TRADE), BUYER_USDT, at_ms=bus.clock + 5_000)
    bus.run()
    # The partition expires the hold by log time before it decides the Reserve: the hold has ended.
    assert (bus.result("fill-1")["reason"], bus.result("fill-1")["detail"]) == ("hold_not_open", "hold ask is expired")
    assert bus.account(BUYER_USDT) == (40_000_000_000, 30_000_000_000)
    assert_books_balance(bus)


def test_the_most_urgent_refusal_of_several_participants_is_the_answer():
    """Both partitions refuse: the buyer's hold does not exist (unknown_hold) and the seller's capture exceeds
    its hold (capture_exceeds_hold); the result names unknown_hold, the higher precedence."""
    bus = Bus()
    setup_trade(bus, ask=10_000_000)
    legs = _trade_with({0: (BUYER_USDT, -11_980_000_000, "nope", None)})
    bus.send(tx("fill-1", legs), BUYER_USDT)
    bus.run()
    assert bus.result("fill-1")["reason"] == "unknown_hold"
    assert_books_balance(bus)


def test_a_participant_with_two_plain_debits_reserves_both_or_neither():
    """The buyer's partition must reserve USDT (enough) and BTC (none there): the USDT reservation it placed
    first is released again, and the whole transaction is refused insufficient_funds."""
    bus = Bus()
    setup_trade(bus)
    legs = [(BUYER_USDT, -100, None, None), (BUYER_BTC, -1, None, None), (SELLER_BTC, -5, None, None),
            (SELLER_USDT, 100, None, "USDT"), ("sys:fees:BTC", 6, None, None)]
    bus.send(tx("swap", legs, kind="swap"), BUYER_USDT)
    bus.run()
    assert bus.result("swap")["reason"] == "insufficient_funds"
    assert bus.account(BUYER_USDT) == (40_000_000_000, 30_000_000_000)
    assert bus.account(SELLER_BTC) == (20_000_000, 20_000_000)
    assert not [h for h in bus.history if (h["hold_id"] or "").startswith("~") and h["kind"] == "hold_placed"
                and h["account_id"] == BUYER_USDT and not any(
                    r["hold_id"] == h["hold_id"] and r["kind"] == "hold_released" for r in bus.history)]
    assert_books_balance(bus)


def test_every_result_is_counted_by_kind_outcome_and_reason():
    """The worker's ledger_results_total comes from this tally: a result answered again (a duplicate, a
    retry answered from the inbox) counts each time it is published."""
    a, b = local_users(2)
    proc = PartitionProcessor(0, N, MemoryStore())
    over = transfer("over", (a, -5), (b, 5))
    run(proc, [open_account(a), open_account(b), over, over, over])
    assert proc.tally[("PostTransaction", "rejected", "insufficient_funds")] == 3
    assert proc.tally[("OpenAccount", "accepted", None)] == 2


# --- dead letters, unreadable commands, the stored changelog position -----------------------------------------
def test_dead_letters_are_counted_and_keep_their_origin():
    proc = PartitionProcessor(3, N, MemoryStore())
    proc.handle(7, 1_700_000_000_007, b"key-1", b"\x00poison")
    proc.handle(8, 1_700_000_000_008, None, None)  # a tombstone: no key, no value
    proc.handle(9, 1_700_000_000_009, b"key-2", b"\x00poison again")
    outputs, changelog = proc.take()
    assert changelog == []
    assert proc.tally[("dead_letter", "dead_letter", "not_avro")] == 2
    assert proc.tally[("dead_letter", "dead_letter", "empty")] == 1
    letters = [(o.key, o.partition, o.timestamp_ms, C.decode("dead_letter", o.value)) for o in outputs]
    assert [(k, p, t) for k, p, t, _ in letters] == [
        (b"3/7", 3, 1_700_000_000_007), (b"3/8", 3, 1_700_000_000_008), (b"3/9", 3, 1_700_000_000_009)]
    first, tombstone, _ = [letter for *_, letter in letters]
    assert {k: first[k] for k in ("reason", "topic", "partition", "offset", "timestamp_ms", "key", "value")} == {
        "reason": "not_avro", "topic": "commands", "partition": 3, "offset": 7, "timestamp_ms": 1_700_000_000_007,
        "key": b"key-1", "value": b"\x00poison"}
    assert (tombstone["reason"], tombstone["key"], tombstone["value"]) == ("empty", None, None)


@pytest.mark.parametrize("extra", [0, 1])
def test_a_dead_letter_keeps_key_and_value_whole_up_to_their_limits(extra):
    from streams import limits
    value = b"\x00" + b"v" * (limits.DEAD_LETTER_VALUE_BYTES - 1 + extra)
    key = b"k" * (limits.DEAD_LETTER_KEY_BYTES + extra)
    proc = PartitionProcessor(0, N, MemoryStore())
    proc.handle(4, 1_700_000_000_000, key, value)
    (dead,) = proc.take()[0]
    letter = C.decode("dead_letter", dead.value)
    assert letter["value"] == value[:limits.DEAD_LETTER_VALUE_BYTES]
    assert letter["key"] == key[:limits.DEAD_LETTER_KEY_BYTES]
    truncated = [f"[value truncated to its first {limits.DEAD_LETTER_VALUE_BYTES} of {len(value)} bytes; "
                 "the whole record is commands 0/4]",
                 f"[key truncated to {limits.DEAD_LETTER_KEY_BYTES} of {len(key)} bytes]"]
    assert [note in letter["detail"] for note in truncated] == [bool(extra), bool(extra)]


def test_an_unreadable_command_is_remembered_like_a_decision():
    """An amount that is not a number: rejected, and remembered under a fingerprint of the record, so the same
    bytes again are a duplicate and another payload under the id is an id_conflict under its own key."""
    a, b = local_users(2)
    bad = tx("x", [(a, "-abc", None, None), (b, "abc", None, None)], "transfer")
    other = tx("x", [(a, "-zz", None, None), (b, "zz", None, None)], "transfer")
    proc = PartitionProcessor(0, N, MemoryStore())
    outputs, changelog = run(proc, [open_account(a), open_account(b), bad, bad, other])
    answers = [(o.key, C.decode("result", o.value)) for o in outputs if o.topic == "results"]
    mine = [(key, r["outcome"], r["reason"], r["duplicate"]) for key, r in answers if r["command_id"] == "x"]
    assert mine == [(b"t/x", "rejected", "invalid_amount", False), (b"t/x", "rejected", "invalid_amount", True),
                    (b"t/x#id_conflict", "rejected", "id_conflict", False)]
    conflict = [r for _, r in answers if r["reason"] == "id_conflict"][0]
    assert (conflict["client_id"], conflict["detail"]) == ("t", "command x of t was already used with another payload")
    assert [C.decode("state", c)["command_id"] for c in changelog].count("x") == 1


def test_the_changelog_position_is_stored_with_the_state():
    store = MemoryStore()
    proc = PartitionProcessor(0, N, store)
    assert proc.state.changelog_offset() == 0
    _, changelog = run(proc, script())
    proc.state.commit(len(changelog) + 40)
    assert PartitionProcessor(0, N, store).state.changelog_offset() == len(changelog) + 40


def test_a_forwarded_transaction_is_keyed_by_its_debit_account_whatever_the_leg_order():
    payer = local_users(1, partition=2)[0]
    payee = next(u for u in local_users(5, partition=2) if routing.routing_key_for(u) != routing.routing_key_for(payer))
    value = tx("pay", [(payee, 5, None, None), (payer, -5, None, None)], "transfer")
    (forwarded,) = run(PartitionProcessor(0, N, MemoryStore()), [value])[0]
    assert (forwarded.partition, forwarded.key) == (2, routing.routing_key_for(payer).encode())


def test_every_share_of_a_multi_partition_transaction_carries_its_reference_and_business_time():
    bus = Bus()
    payer, payee = _funded_pair(bus)
    bus.send(command("pay", "PostTransaction", {
        "transaction_id": "pay", "kind": "transfer", "reference": "invoice-7", "links": [], "metadata": {},
        "occurred_at_ms": 1_600_000_000_000, "rate_snapshot_id": None,
        "legs": [{"account_id": payer, "amount": "-300", "hold_id": None, "currency": None},
                 {"account_id": payee, "amount": "300", "hold_id": None, "currency": None}]}), payer)
    bus.run()
    entries = [h for h in bus.history if h["transaction_id"] == "pay" and h["kind"] == "transfer"]
    assert len(entries) == 4
    assert {(h["reference"], h["occurred_at_ms"]) for h in entries} == {("invoice-7", 1_600_000_000_000)}
    assert bus.account(payee) == (300, 0)


def test_a_command_that_fails_part_way_leaves_the_batch_staged_before_it_intact():
    """Within one batch (nothing committed yet): a hold with an expiry placed, another placed and released,
    a deposit; then a sealed step that fails part way is undone. What the batch staged before it stays: the
    balances, the first hold's expiry (it expires on time) and the second's removal (it does not expire)."""
    from streams.seal import DEVELOPMENT
    from tests.helpers.forged import reserve
    from tests.helpers.records import T0
    from tests.helpers.results import answer

    ann = local_users(1)[0]
    proc = PartitionProcessor(0, N, MemoryStore())
    proc.handle(0, T0, b"k", open_account(ann))
    proc.handle(1, T0, b"k", transfer("dep", ("sys:world:USD", -1_000), (ann, 1_000)))
    proc.handle(2, T0, b"k", place_hold("h1", ann, 100, T0 + 50))
    proc.handle(3, T0, b"k", place_hold("h2", ann, 200, T0 + 40))
    proc.handle(4, T0 + 1, b"k", command("rel", "ReleaseHold", {"hold_id": "h2"}))
    bad = reserve("bad", ann, "user:mallory:USD", "abc", 3)
    proc.handle(5, T0 + 2, b"k", bad, DEVELOPMENT.headers("commands", 0, bad))
    assert proc.state.account(ann).posted == 1_000 and proc.state.account(ann).held == 100
    assert proc.state.hold("h2").status.value == "released"
    proc.handle(6, T0 + 60, b"k", transfer("after", (ann, -1), ("sys:world:USD", 1)))
    outputs, _ = proc.take()
    assert answer(outputs, "bad")["reason"] == "invalid_command"
    assert answer(outputs, "expire:h1")["outcome"] == "accepted"
    assert not [r for r in (C.decode("result", o.value) for o in outputs if o.topic == "results")
                if r["command_id"] == "expire:h2"], "a released hold does not expire"
    assert (proc.state.account(ann).posted, proc.state.account(ann).held) == (999, 0)


def test_restore_skips_only_the_records_written_twice():
    """A changelog with a record written twice in the middle (a paused worker's late copy): restore skips
    the copy and applies everything after it."""
    live = PartitionProcessor(0, N, MemoryStore())
    _, changelog = run(live, script())
    with_copy = changelog[:3] + [changelog[1]] + changelog[3:]
    restored = PartitionProcessor(0, N, MemoryStore())
    assert restored.restore(with_copy, len(with_copy)) == len(changelog)
    a = local_users(1)[0]
    # "far" credits another partition: reserved here (held), posted once that partition votes.
    assert (restored.state.account(a).posted, restored.state.account(a).held) == (1_000 - 100 - 50, 10)


@pytest.mark.parametrize("paid, rate_expires, answer", [
    (925, 2**62, ("accepted", None)), (999, 2**62, ("rejected", "amount_off_rate")),
    (925, "soon", ("rejected", "stale_rate"))])
def test_a_conversion_across_partitions_is_judged_against_its_rate_as_in_one_partition(paid, rate_expires, answer):
    """A payment in USD to a EUR account in another partition through the FX desk: the coordinator judges the
    rate snapshot and the conversion's amounts before anything posts, with the answer one partition gives."""
    answers = []
    for payee_partition in (0, 1):
        bus = Bus()
        payer = local_users(1, partition=0)[0]
        payee = next(u for u in local_users(3, partition=payee_partition) if u != payer).replace(":USD", ":EUR")
        bus.send(open_account(payer), payer)
        bus.send(open_account(payee, "EUR"), payee)
        bus.send(transfer("dep", ("sys:world:USD", -1_000), (payer, 1_000)), payer)
        for p in range(N):
            bus.send_to(p, command(f"rate@{p}", "RecordRate", {"snapshot_id": "snap", "base": "USD", "quote": "EUR",
                                                               "rate": "0.925", "expires_at_ms":
                                                                   bus.clock + 100 if rate_expires == "soon"
                                                                   else rate_expires}))
        bus.run()
        bus.clock += 1_000
        body = {"transaction_id": "fx", "kind": "fx", "reference": None, "links": [], "metadata": {},
                "occurred_at_ms": None, "rate_snapshot_id": "snap",
                "legs": [{"account_id": a, "amount": str(x), "hold_id": None, "currency": c} for a, x, c in [
                    (payer, -1_000, None), ("sys:fx:USD", 1_000, None), ("sys:fx:EUR", -paid, None),
                    (payee, paid, "EUR")]]}
        bus.send(command("fx", "PostTransaction", body), payer)
        bus.run()
        result = bus.result("fx")
        answers.append((result["outcome"], result["reason"]))
        moved = answer[0] == "accepted"
        assert bus.account(payer) == ((0, 0) if moved else (1_000, 0))
        assert bus.account(payee) == ((paid, 0) if moved else (0, 0))
        assert bus.account("sys:clearing:USD") == (0, 0) and bus.account("sys:clearing:EUR") == (0, 0)
    assert answers == [answer, answer]


def test_what_a_transaction_returns_is_read_back_from_the_store():
    """A return's record says which payment it returns; a worker that reads it from its store (not from the
    decision it just made) still refuses to reverse it (not_reversible)."""
    from streams.core.returns import RETURNS_KEY
    a = local_users(1)[0]
    store = MemoryStore()
    first = PartitionProcessor(0, N, store)
    run(first, [open_account(a), transfer("dep", ("sys:world:USD", -100), (a, 100)),
                command("ret", "PostTransaction", {
                    "transaction_id": "ret", "kind": "return", "reference": None, "links": ["dep"],
                    "metadata": {RETURNS_KEY: "dep"}, "occurred_at_ms": None, "rate_snapshot_id": None,
                    "legs": [{"account_id": a, "amount": "-40", "hold_id": None, "currency": None},
                             {"account_id": "sys:world:USD", "amount": "40", "hold_id": None, "currency": None}]})])
    first.state.commit(3)
    later = PartitionProcessor(0, N, store)  # decodes every record from the store
    outputs, _ = run(later, [command("rev", "ReverseTransaction", {
        "transaction_id": "rev", "reverses": "ret", "account_id": a, "reference": None, "occurred_at_ms": None})],
        start_ms=1_700_000_001_000)
    (result,) = [C.decode("result", o.value) for o in outputs if o.topic == "results"]
    assert (result["outcome"], result["reason"]) == ("rejected", "not_reversible")


def test_the_decoded_records_a_partition_keeps_are_bounded(monkeypatch):
    """The decoded accounts, holds, transactions and engine records are a cache of the store: past
    DECODED_CACHE_LIMIT entries a commit drops them, so a long-running worker keeps its working set, not every
    hold and transaction key it met (each internal hold of a decided cross-partition transfer, for one)."""
    from streams import partition as partition_module

    monkeypatch.setattr(partition_module, "DECODED_CACHE_LIMIT", 10)
    state = partition_module.PartitionState(MemoryStore())
    for n in range(50):
        assert state.hold(f"~t{n}~acct") is None and state.transaction(f"t{n}") is None
        assert state.record(f"r/c/t{n}") is None
    state.commit(1)
    assert len(state._accounts) + len(state._holds) + len(state._transactions) <= 10
    assert len(state._records) <= 11
