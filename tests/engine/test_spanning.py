"""Transactions with debits in several partitions, across in-memory partition processors (no broker).

The bus (tests/helpers/bus.py) delivers the follow-up commands each processor emits to the processor of
their partition, in order, so the reserve / vote / decide protocol runs exactly as on Kafka, only faster and
with control over interleavings and redeliveries. These tests use its fixed round-robin order;
tests/engine/test_interleavings.py shuffles it.
"""
from __future__ import annotations

import pytest

from streams import names, routing
from streams.authn import Clients
from streams.inflight import coordinator_key
from streams.spanning import Spanning
from tests.helpers.authn import CLIENTS, A, B, funded, results, send, wallet_tx
from tests.helpers.bus import Bus, Crash, assert_books_balance
from tests.helpers.interleavings import X1, X2, Y1, Y2, balances, funded_two_partitions
from tests.helpers import records
from tests.helpers.records import N, command, tx
from tests.helpers.trade import BUYER_BTC, BUYER_P, BUYER_USDT, SELLER_BTC, SELLER_USDT, TRADE, setup_trade


def test_a_trade_with_debits_in_two_partitions_posts_atomically():
    bus = Bus()
    setup_trade(bus)
    bus.send(tx("fill-1", TRADE), BUYER_USDT)
    bus.run()
    assert bus.result("fill-1")["outcome"] == "accepted"
    assert bus.account(BUYER_USDT) == (28_020_000_000, 18_020_000_000)
    assert bus.account(SELLER_USDT) == (11_968_020_000, 0)
    assert bus.account(BUYER_BTC) == (19_980_000, 0)
    assert bus.account(SELLER_BTC) == (0, 0)
    assert bus.account("sys:fees:USDT") == (11_980_000, 0)
    assert bus.hold("ask", SELLER_BTC).status.value == "captured"
    bus.send(command("release:bid", "ReleaseHold", {"hold_id": "bid"}), BUYER_USDT)
    bus.run()
    assert bus.account(BUYER_USDT) == (28_020_000_000, 0)
    assert_books_balance(bus)


def test_if_one_partition_cannot_reserve_nothing_posts_anywhere():
    bus = Bus()
    setup_trade(bus, ask=10_000_000)  # the ask hold is too small for the fill
    bus.send(tx("fill-1", TRADE), BUYER_USDT)
    bus.run()
    result = bus.result("fill-1")
    assert (result["outcome"], result["reason"]) == ("rejected", "capture_exceeds_hold")
    assert bus.account(BUYER_USDT) == (40_000_000_000, 30_000_000_000), "the buyer's hold is untouched"
    assert bus.hold("bid", BUYER_USDT).remaining == 30_000_000_000
    assert bus.account(SELLER_USDT) == (0, 0)
    assert not [h for h in bus.history if h["transaction_id"] and h["transaction_id"].startswith("fill-1")]
    assert_books_balance(bus)


def test_plain_debits_in_two_partitions_are_reserved_then_captured_or_released():
    bus = Bus()
    setup_trade(bus, ask=10_000_000)  # leaves 0.1 BTC of the seller's available
    split = [(BUYER_USDT, -100, None, None), (SELLER_BTC, -5, None, None),
             (SELLER_USDT, 100, None, "USDT"), (BUYER_BTC, 5, None, "BTC")]
    bus.send(tx("swap", split, kind="swap"), BUYER_USDT)
    too_much = [(BUYER_USDT, -100, None, None), (SELLER_BTC, -10**12, None, None),
                (SELLER_USDT, 100, None, "USDT"), (BUYER_BTC, 10**12, None, "BTC")]
    bus.send(tx("greedy", too_much, kind="swap"), BUYER_USDT)
    bus.run()
    assert bus.result("swap")["outcome"] == "accepted"
    assert bus.result("greedy")["reason"] == "insufficient_funds"
    assert bus.account(BUYER_USDT) == (40_000_000_000 - 100, 30_000_000_000)
    assert bus.account(BUYER_BTC) == (5, 0)
    assert bus.account(SELLER_BTC) == (20_000_000 - 5, 10_000_000)
    assert_books_balance(bus)


def test_redelivered_protocol_messages_change_nothing():
    bus = Bus(duplicate_engine_commands=True)
    setup_trade(bus)
    bus.send(tx("fill-1", TRADE), BUYER_USDT)
    bus.run()
    assert bus.account(BUYER_USDT) == (28_020_000_000, 18_020_000_000)
    assert bus.account(SELLER_USDT) == (11_968_020_000, 0)
    assert bus.account(BUYER_BTC) == (19_980_000, 0)
    assert_books_balance(bus)


def test_a_release_or_freeze_of_what_a_transaction_in_flight_reserved_waits_for_its_decision():
    """Instead of a refusal (in_flight), the release and the freeze wait, and are decided right after the
    transaction, at their own log time: as if the transaction, sent first, had been decided first."""
    bus = Bus()
    setup_trade(bus, ask=30_000_000, seller_btc=30_000_000)
    seller_p = routing.partition_of_account(SELLER_BTC, N)
    buyer_p = routing.partition_of_account(BUYER_USDT, N)
    bus.send(tx("fill-1", TRADE), BUYER_USDT)
    bus.step(buyer_p)  # coordinator: begun, its own side reserved, Reserve sent to the seller's partition
    while bus.pending(seller_p):
        bus.step(seller_p)  # the seller's partition reserves (locks 0.2 of the 0.3 BTC ask) and votes
    bus.send(command("release:ask", "ReleaseHold", {"hold_id": "ask"}), SELLER_BTC)
    bus.send(command("freeze:s", "FreezeAccount", {"account_id": SELLER_BTC}), SELLER_BTC)
    bus.step(seller_p)
    bus.step(seller_p)
    assert not [r for r in bus.results if r["command_id"] in ("release:ask", "freeze:s")], "both wait"
    bus.run()
    assert bus.result("fill-1")["outcome"] == "accepted"
    assert bus.result("release:ask")["outcome"] == "accepted"
    assert bus.result("freeze:s")["outcome"] == "accepted"
    ask = bus.hold("ask", SELLER_BTC)
    assert (ask.status.value, ask.captured, ask.released) == ("released", 20_000_000, 10_000_000)
    assert_books_balance(bus)


def test_a_retry_redone_after_a_crash_is_answered_once_when_decided():
    bus = Bus()
    setup_trade(bus)
    coordinator = routing.partition_of_account(BUYER_USDT, N)
    bus.send(tx("fill-1", TRADE), BUYER_USDT)
    bus.send(tx("fill-1", TRADE), BUYER_USDT)  # the client's retry
    bus.step(coordinator)  # begun: its own legs reserved and its vote counted, the Reserve out to the seller
    # The retry is decided and committed, then the worker dies before the consumer offset is committed: the
    # restarted worker delivers the retry again.
    bus.step(coordinator, commit_offset=False, crash=Crash("offset"))
    assert bus.pending(coordinator) == 1, "the retry again"
    bus.run()
    answers = [r for r in bus.results if r["command_id"] == "fill-1"]
    assert [(r["outcome"], r["duplicate"]) for r in answers] == [("accepted", False), ("accepted", True)]


def test_a_retry_while_the_trade_holds_its_own_locks_is_answered_as_a_duplicate():
    """The retry reaches the coordinator after the trade's own reservation locked the bid: it is the same
    transaction under way, not a capture competing for the hold."""
    bus = Bus()
    setup_trade(bus)
    whole_bid = [(BUYER_USDT, -30_000_000_000, "bid", None), (SELLER_USDT, 30_000_000_000, None, "USDT"),
                 (SELLER_BTC, -20_000_000, "ask", None), (BUYER_BTC, 20_000_000, None, "BTC")]
    bus.send(tx("fill-1", whole_bid), BUYER_USDT)
    while bus.pending(BUYER_P):
        bus.step(BUYER_P)  # begun, and the buyer's side reserved: all of the bid is locked by fill-1
    assert bus.procs[BUYER_P].spanning.locked_amount("bid") == 30_000_000_000
    bus.send(tx("fill-1", whole_bid), BUYER_USDT)  # the client's retry
    bus.run()
    answers = [(r["outcome"], r["reason"], r["duplicate"]) for r in bus.results if r["command_id"] == "fill-1"]
    assert answers == [("accepted", None, False), ("accepted", None, True)]
    assert bus.hold("bid", BUYER_USDT).status.value == "captured"
    assert_books_balance(bus)


def test_a_command_rejected_before_the_core_gets_one_decision_however_often_it_is_sent():
    bus = Bus()
    setup_trade(bus)
    bad = command("bad-1", "PostTransaction", {
        "transaction_id": "bad-1", "kind": "transfer", "reference": None, "links": [], "metadata": {},
        "occurred_at_ms": None, "rate_snapshot_id": None,
        "legs": [{"account_id": BUYER_USDT, "amount": "1.5", "hold_id": None, "currency": None},
                 {"account_id": "sys:fees:USDT", "amount": "-1.5", "hold_id": None, "currency": None}]})
    internal = tx("int-1", [(BUYER_USDT, -5, None, None), ("sys:clearing:USDT", 5, None, None)])
    for _ in range(2):
        bus.send(bad, BUYER_USDT)
        bus.send(internal, BUYER_USDT)
        bus.run()
    for command_id in ("bad-1", "int-1"):
        answers = [r for r in bus.results if r["command_id"] == command_id]
        assert [(r["outcome"], r["duplicate"]) for r in answers] == [("rejected", False), ("rejected", True)]
        assert answers[0]["at_ms"] == answers[1]["at_ms"], "the retry is answered with the decision, not judged again"


def test_a_command_id_with_slashes_goes_through_both_phases():
    """The transaction's key is client_id/command_id; a command id may hold '/' itself (ids are free text).
    A payment across partitions with a fee, under such an id, posts everywhere and leaves nothing reserved."""
    from tests.helpers.records import local_users, open_account
    x, y = local_users(1, partition=0)[0], local_users(1, partition=1)[0]
    bus = Bus()
    for account in (x, y):
        bus.send(open_account(account), account)
    bus.send(tx("dep", [("sys:world:USD", -1_000, None, None), (x, 1_000, None, None)], kind="deposit"), x)
    bus.send(tx("orders/7/pay", [(x, -105, None, None), (y, 100, None, None), ("sys:fees:USD", 5, None, None)]), x)
    bus.run()
    assert bus.result("orders/7/pay")["outcome"] == "accepted"
    assert (bus.account(x), bus.account(y), bus.account("sys:fees:USD")) == ((895, 0), (100, 0), (5, 0))
    assert not [k for p in range(bus.n) for k, _ in bus.stored(p, b"e/r/")], "a reservation is left"
    assert_books_balance(bus, ("USD",))


def _copy_only(legacy: bool):
    """A payment whose producer wrote only its copy (the coordinator never gets it): the copy's partition
    reserves its share (a debit held, a credit counted) and waits spanning.COPY_WAIT_MS of log time for the
    Reserve. legacy: the wait recorded as versions before the index did, in one list record (``o``)."""
    from streams import placement
    from streams.inflight import copy_due_key
    from streams.routing import ENGINE_CLIENT
    from streams.spanning import COPY_TIMEOUTS, COPY_WAIT_MS
    from tests.helpers.bus import C
    from tests.helpers.records import local_users, open_account
    x, (d, y) = local_users(1, partition=0)[0], local_users(2, partition=1)
    bus = Bus()
    for account in (x, d, y):
        bus.send(open_account(account), account)
    bus.send(tx("dep", [("sys:world:USD", -1_000, None, None), (d, 1_000, None, None)], kind="deposit"), d)
    bus.run()
    record, partitions = placement.placements(
        C.decode("command", tx("pay", [(x, -5, None, None), (d, -5, None, None), (y, 10, None, None)])), x, N)
    assert partitions == [0, 1]
    sent_at = bus.clock + 1
    bus.send_to(1, C.encode("command", record), sent_at)  # the copy only
    bus.run()
    assert bus.account(d) == (1_000, 5), "the copy's debit is held"
    due_key = copy_due_key(sent_at + COPY_WAIT_MS, "t/pay")
    assert [k for k, _ in bus.stored(1, b"e/o")] == [b"e/" + due_key.encode()]
    if legacy:
        proc = bus.procs[1]
        proc.state.begin_command()
        proc.commit_change(ENGINE_CLIENT, "as-written-before", "", bus.position[1], {
            "command_id": "as-written-before", "client_id": ENGINE_CLIENT, "outcome": "accepted", "reason": None,
            "detail": "", "duplicate": False, "transaction_id": None, "at_ms": sent_at, "holds": []},
            records=[(COPY_TIMEOUTS, [[sent_at + COPY_WAIT_MS, "t/pay"]]), (due_key, None)])
        bus.changelogs[1].extend(proc.take()[1])
        proc.state.commit(len(bus.changelogs[1]))
        assert [k for k, _ in bus.stored(1, b"e/o")] == [b"e/o"]
    return bus, sent_at + COPY_WAIT_MS, d, y


def _open_at(bus: Bus, at_ms: int) -> None:
    from tests.helpers.records import local_users, open_account
    z = local_users(3, partition=1)[2]
    bus.send(open_account(z, client=f"c{at_ms}"), z, at_ms=at_ms)
    bus.run()


@pytest.mark.parametrize("legacy", [False, True], ids=["indexed", "list-of-earlier-versions"])
def test_a_copy_whose_reserve_never_comes_is_dropped_when_its_wait_ends_even_after_a_rebuild(legacy):
    bus, due, d, y = _copy_only(legacy)
    _open_at(bus, due - 1)
    assert bus.account(d) == (1_000, 5), "still waiting one millisecond before its due time"
    bus.crash_restore(1, fresh_store=True)  # the wait is rebuilt from the changelog
    _open_at(bus, due)
    assert bus.result("t/pay~copyexpired~1")["outcome"] == "accepted"
    assert (bus.account(d), bus.account(y)) == ((1_000, 0), (0, 0))
    assert not bus.stored(1, b"e/"), "no reservation, count or wait is left"


def test_a_quiet_partition_gets_a_tick_when_a_copys_wait_has_ended(tmp_path):
    """A copy's reservation holds the payer's money until its wait ends in log time; on a partition nobody
    writes to, only a worker's tick moves that time on (streams/ticks.py), so the worker ticks it then, as it
    does for a due hold."""
    from streams import engine as engine_module
    from streams.config import Settings
    from streams.inflight import copy_due_key
    from streams.routing import ENGINE_CLIENT

    engine = engine_module.Engine(Settings(bootstrap="127.0.0.1:1", prefix="copytick.", partitions=1), tmp_path)
    try:
        proc = engine.processor(0)
        proc.state.begin_command()
        proc.commit_change(ENGINE_CLIENT, "a-copy", "", 0, {
            "command_id": "a-copy", "client_id": ENGINE_CLIENT, "outcome": "accepted", "reason": None,
            "detail": "", "duplicate": False, "transaction_id": None, "at_ms": 1_000, "holds": []},
            records=[(copy_due_key(5_000, "t/pay"), 1)])
        proc.state.commit(1)
        assert not engine._due(0, 4_999), "not yet due"
        assert engine._due(0, 5_000), "the copy's wait has ended: the partition needs a tick"
    finally:
        engine.close()


def test_a_reserve_that_fails_part_way_votes_against_and_the_transaction_ends(monkeypatch):
    """Partition 1 fails part way through a Reserve (a fault of its own: any exception, undone). Before, the
    Reserve was only rejected and the coordinator waited for ever for its vote, X1's money reserved and the
    sender unanswered. Now the Reserve is remembered as rejected invalid_command and votes so: the transfer is
    refused with that reason and nothing stays reserved anywhere."""
    bus = funded_two_partitions()
    reserve_share = Spanning._reserve_share

    def failing_in_partition_1(self, key, tx, *args, **kwargs):
        if self.proc.partition == 1:
            raise RuntimeError("a fault of partition 1's own")
        return reserve_share(self, key, tx, *args, **kwargs)

    monkeypatch.setattr(Spanning, "_reserve_share", failing_in_partition_1)
    bus.send(records.transfer("out", (X1, -100), (Y1, 100)), X1)  # not placed: partition 1 hears of it by the Reserve
    bus.run()
    assert [(r["outcome"], r["reason"]) for r in bus.results if r["command_id"] == "out"] == [
        ("rejected", "invalid_command")]
    assert balances(bus) == {X1: (1_000, 0), X2: (0, 0), Y1: (0, 0), Y2: (0, 0)}
    for p in (0, 1):
        assert not bus.stored(p, b"e/r/") and not bus.stored(p, b"e/c/"), "left in flight"
    assert_books_balance(bus, ("USD",))


def test_another_payload_under_the_ids_of_a_transaction_under_way_is_refused_not_executed():
    """While "in" (X1 -> Y1, across partitions) is under way in partition 0, the client sends another payload
    under the same ids that partition 0 could post alone (X1 -> X2). It is id_conflict, and moves nothing.
    Before, a retry of a transaction under way was routed afresh: the other payload posted as a command of its
    own, and the transaction's final vote then took its inbox entry for the decision (a review's finding)."""
    bus = funded_two_partitions()
    bus.send(records.transfer("in", (X1, -600), (Y1, 600)), X1)
    bus.step(0)  # under way: its Reserve is in partition 1's log
    bus.send(records.transfer("in", (X1, -300), (X2, 300)), X1)
    bus.run()
    answers = [(r["outcome"], r["reason"]) for r in bus.results if r["command_id"] == "in" and not r["duplicate"]]
    assert answers == [("rejected", "id_conflict"), ("accepted", None)], answers
    assert balances(bus) == {X1: (400, 0), X2: (0, 0), Y1: (600, 0), Y2: (0, 0)}
    assert_books_balance(bus, ("USD",))


def test_another_kind_of_command_under_the_ids_of_a_transaction_under_way_is_refused_not_executed():
    """T ("in": X1 -600, Y1 -100, X2 +700; Y1 holds nothing, so partition 1 refuses) is under way in partition 0
    when the client sends a hold under the same command id. It is id_conflict, and T is refused. Before, the
    hold was executed as a command of its own, and T's final vote took its inbox entry for the decision: T
    committed in partition 0 although partition 1 had refused, money created (a review's finding)."""
    bus = funded_two_partitions()
    bus.send(records.transfer("in", (X1, -600), (Y1, -100), (X2, 700)), X1)
    bus.step(0)  # under way
    bus.send(records.command("in", "PlaceHold", {"hold_id": "h", "account_id": X1, "amount": "10",
                                                "expires_at_ms": None}), X1)
    bus.run()
    answers = [(r["outcome"], r["reason"]) for r in bus.results if r["command_id"] == "in" and not r["duplicate"]]
    assert answers == [("rejected", "id_conflict"), ("rejected", "insufficient_funds")], answers
    assert balances(bus) == {X1: (1_000, 0), X2: (0, 0), Y1: (0, 0), Y2: (0, 0)}
    assert_books_balance(bus, ("USD",))


@pytest.mark.parametrize("first", [True, False], ids=["named first", "named second"])
def test_a_linked_batch_naming_a_transaction_under_way_by_another_command_is_refused_whole(first):
    """As the test above, the hold sent in a linked batch of one partition with another hold. The hold under
    T's id is id_conflict and its batch is refused whole; T is refused as its participant voted. Before, the
    batch executed the hold under T's id and T's final vote took it for the decision (a review's finding)."""
    bus = funded_two_partitions()
    bus.send(records.transfer("in", (X1, -600), (Y1, -100), (X2, 700)), X1)
    bus.step(0)  # under way
    named = records.command("in", "PlaceHold", {"hold_id": "h", "account_id": X1, "amount": "10",
                                               "expires_at_ms": None})
    other = records.place_hold("h2", X1, 20, None)
    bus.send(records.linked(*((named, other) if first else (other, named))), X1)
    bus.run()
    answers = [(r["outcome"], r["reason"]) for r in bus.results if r["command_id"] == "in" and not r["duplicate"]]
    assert answers == [("rejected", "id_conflict"), ("rejected", "insufficient_funds")], answers
    assert [(r["outcome"], r["reason"]) for r in bus.results if r["command_id"] == "hold:h2"] == [
        ("rejected", "linked_failed")]
    assert balances(bus) == {X1: (1_000, 0), X2: (0, 0), Y1: (0, 0), Y2: (0, 0)}
    assert_books_balance(bus, ("USD",))


def test_an_unreadable_command_under_the_ids_of_a_transaction_under_way_does_not_decide_it():
    """While "in" is under way, the client sends a hold under the same command id whose amount cannot be read.
    It is id_conflict, not remembered, and "in" is decided by its votes (accepted). Before, its rejection was
    remembered under those ids and the final vote took it for the decision: a transaction every participant
    had accepted was aborted, its client answered invalid_amount (a review's finding)."""
    bus = funded_two_partitions()
    bus.send(records.transfer("in", (X1, -600), (Y1, 600)), X1)
    bus.step(0)  # under way
    bus.send(records.command("in", "PlaceHold", {"hold_id": "h", "account_id": X1, "amount": "abc",
                                                "expires_at_ms": None}), X1)
    bus.run()
    answers = [(r["outcome"], r["reason"]) for r in bus.results if r["command_id"] == "in" and not r["duplicate"]]
    assert answers == [("rejected", "id_conflict"), ("accepted", None)], answers
    assert balances(bus) == {X1: (400, 0), X2: (0, 0), Y1: (600, 0), Y2: (0, 0)}
    assert_books_balance(bus, ("USD",))


def test_a_command_its_policy_refuses_in_a_linked_batch_under_the_ids_of_a_transaction_under_way():
    """With clients and policies: "in" (wallet's, debits in two partitions) is under way when wallet sends, in a
    linked batch of one partition, a freeze under the same command id, which its policy does not allow. It is
    id_conflict, not remembered, and "in" is decided by its votes. Before, the policy's refusal was remembered
    under those ids and the final vote took it for the decision (a review's finding, reproduced)."""
    bus = Bus()
    clients = Clients.from_mapping(CLIENTS)
    for proc in bus.procs.values():
        proc.clients = clients
    funded(bus)
    home = routing.partition_of_account(A, N)
    far = next(f"user:{i}:USD" for i in range(100, 10_000) if routing.partition_of_account(f"user:{i}:USD", N) != home)
    send(bus, records.open_account(far, client="wallet"), far)
    send(bus, wallet_tx("dep2", ("sys:world:USD", -500), (far, 500)), far)
    bus.run()
    send(bus, wallet_tx("in", (A, -600), (far, -100), (B, 700)), A)
    bus.step(home)
    assert bus.procs[home].state.record(coordinator_key(names.transaction_key("wallet", "in"))) is not None
    send(bus, records.linked(command("in", "FreezeAccount", {"account_id": A}, "wallet")), A)
    bus.run()
    assert [r[:2] for r in results(bus, "in") if not r[2]] == [("rejected", "id_conflict"), ("accepted", None)]
    assert_books_balance(bus, ("USD",))


def test_the_final_vote_never_commits_on_another_command_s_entry_under_the_transaction_s_ids():
    """The last line of defence behind the refusals above: an accepted inbox entry of another command under
    the ids of a transaction in flight (written here by hand, as no path of the shell may any more) is not
    taken for the transaction's acceptance. The transaction, which a participant refused, is aborted
    everywhere and the books balance; before, its coordinator committed its share (money created)."""
    bus = funded_two_partitions()
    bus.send(records.transfer("in", (X1, -600), (Y1, -100), (X2, 700)), X1)  # Y1 holds nothing: refused there
    bus.step(0)  # under way
    proc = bus.procs[0]
    proc.state.begin_command()
    proc.commit_change("t", "in", "another command's fingerprint", bus.position[0], {
        "command_id": "in", "client_id": "t", "outcome": "accepted", "reason": None, "detail": "",
        "duplicate": False, "transaction_id": None, "at_ms": bus.clock, "holds": []})
    bus.changelogs[0].extend(proc.take()[1])
    proc.state.commit(len(bus.changelogs[0]))
    bus.run()
    assert balances(bus) == {X1: (1_000, 0), X2: (0, 0), Y1: (0, 0), Y2: (0, 0)}
    assert_books_balance(bus, ("USD",))
