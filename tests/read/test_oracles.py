"""The oracles of `verify` can fail: a clean run of real partition processors passes, and each crafted break of
it is reported by the oracle it breaks, naming the account, transaction, hold or command concerned.

No broker: eight PartitionProcessors on in-memory stores, wired by a small recorder that keeps every record
they publish (and every command sent to them) at its partition and offset, as `read_topic` would return them.
Breaks are made of real wire records, encoded with schemas.codec.
"""
from __future__ import annotations

import dataclasses
import random
from collections import defaultdict

import pytest

from projections.topics import TopicRecord, records_of
from projections.verify import Report, Streams, check, format_report
from schemas.codec import codec
from streams import routing
from tests.helpers.bus import Bus
from tests.helpers.recorder import START_MS, TOPICS, Recorder
from tests.helpers.records import N, batch, linked, local_users, open_account, place_hold, transfer, tx

C = codec()


A, B, CC = local_users(3, partition=0)
REMOTE = next(f"user:{i}:USD" for i in range(100) if routing.partition_of_account(f"user:{i}:USD", N) != 0)
BUYER_USDT, BUYER_BTC, SELLER_USDT, SELLER_BTC = "user:b:USDT", "user:b:BTC", "user:s:USDT", "user:s:BTC"
H1_EXPIRES_MS = START_MS + 400


def script(bus, settle) -> None:
    """Deposits, transfers, a retry and a conflict, a hold captured then expired, a hold left open, a credit in
    another partition (through clearing), poison (alone and in a batch), a refusal, and a trade whose debits
    live in two partitions (reserve / vote / decide), and a payment with debits in two partitions."""
    for account in (A, B, CC, REMOTE):
        bus.send(open_account(account), account)
    for account, currency in ((BUYER_USDT, "USDT"), (BUYER_BTC, "BTC"), (SELLER_USDT, "USDT"), (SELLER_BTC, "BTC")):
        bus.send(open_account(account, currency), account)
    settle()
    bus.send(transfer("dep", ("sys:world:USD", -1_000), (A, 1_000)), A)
    bus.send(transfer("t1", (A, -100), (B, 100)), A)
    bus.send(transfer("t1", (A, -100), (B, 100)), A)  # a retry: the original result again
    bus.send(transfer("t1", (A, -999), (B, 999)), A)  # same id, other payload: id_conflict
    bus.send(place_hold("h1", A, 300, H1_EXPIRES_MS), A)
    bus.send(transfer("cap", (A, -50), (CC, 50), hold="h1"), A)
    bus.send(transfer("far", (A, -10), (REMOTE, 10)), A)  # credit in another partition, through clearing
    bus.send(b"\x00poison", A)
    bus.send(transfer("over", (B, -10_000), (CC, 10_000)), B)  # insufficient funds
    bus.send(place_hold("h2", B, 20, None), B)  # stays open
    settle()
    bus.clock = H1_EXPIRES_MS + 100
    bus.send(transfer("later", (B, -1), (CC, 1)), B)  # its time passes h1's expiry: h1 expires first
    bus.send(batch(transfer("in-batch", (B, -2), (CC, 2)), b"\x00poison-in-batch"), B)
    bus.send(tx("dep-b", [("sys:world:USDT", -40_000, None, None), (BUYER_USDT, 40_000, None, None)]), BUYER_USDT)
    bus.send(tx("dep-s", [("sys:world:BTC", -200, None, None), (SELLER_BTC, 200, None, None)]), SELLER_BTC)
    settle()
    bus.send(place_hold("bid", BUYER_USDT, 30_000, None), BUYER_USDT)
    bus.send(place_hold("ask", SELLER_BTC, 200, None), SELLER_BTC)
    settle()
    bus.send(tx("trade", [(BUYER_USDT, -11_980, "bid", None), (SELLER_USDT, 11_968, None, "USDT"),
                          ("sys:fees:USDT", 12, None, None), (SELLER_BTC, -20, "ask", None),
                          (BUYER_BTC, 19, None, "BTC"), ("sys:fees:BTC", 1, None, None)]), BUYER_USDT)
    # Two debits in two partitions, one currency: under its own id, one credit and one clearing leg.
    bus.send(tx("split", [(A, -5, None, None), (REMOTE, -5, None, None), (CC, 10, None, None)], kind="payment"), A)
    settle()


def clean_run() -> Streams:
    bus = Recorder()
    script(bus, bus.run)
    return bus.streams()


CLEAN = clean_run()


class RecordingBus(Bus):
    """The shared test bus (batches, crashes at any step of the commit path, redelivery from the committed
    offset), with what it publishes kept as a reader of the topics would see it: copies re-emitted by a
    redone batch included."""

    def __init__(self) -> None:
        super().__init__()
        self.published: dict[str, dict[int, list[tuple[int, bytes | None, bytes | None]]]] = {
            name: defaultdict(list) for name in TOPICS if name != "commands"}

    def _emit(self, partition, outputs, decisions):
        for o in outputs:
            if o.topic != "commands":
                self.published[o.topic][o.partition].append((o.timestamp_ms, o.key, o.value))
        super()._emit(partition, outputs, decisions)

    def streams(self) -> Streams:
        logs = {"commands": {p: [(r.timestamp_ms, r.key, r.value) for r in log] for p, log in self.logs.items()},
                **self.published}
        topics = {name: [record for partition, log in sorted(logs[name].items())
                         for offset, (at_ms, key, value) in enumerate(log)
                         for record in records_of(name, partition, offset, at_ms, key, value)]
                  for name in TOPICS}
        return Streams(commands=topics["commands"], results=topics["results"], history=topics["history"],
                       balances=topics["balances"], dead_letters=topics["dlq"])


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_run_with_crashes_and_redeliveries_satisfies_every_oracle(seed):
    """Workers crash at random steps of the commit path and redo batches: records published twice are
    byte-identical copies, and the oracles judge the run as clean."""
    rng = random.Random(seed)
    bus = RecordingBus()
    script(bus, lambda: bus.run_random(rng, max_records=3, crash_rate=0.3))
    assert bus.crashes > 0
    streams = bus.streams()
    report = check(streams)
    assert report.ok, format_report(report)
    published = [r.raw for r in (*streams.results, *streams.history, *streams.balances)]
    assert len(published) > len(set(published)), "no output was published twice"
    assert report.counts["dead_letters"] >= 2


# Crafting ------------------------------------------------------------------------------------------------------

SCHEMA = {"commands": "command", "results": "result", "history": "history", "balances": "balance",
          "dlq": "dead_letter"}
FIELD = {"commands": "commands", "results": "results", "history": "history", "balances": "balances",
         "dlq": "dead_letters"}


def oracles(report: Report) -> set[str]:
    return {v.split(":", 1)[0] for v in report.violations}


def reported(report: Report, oracle: str) -> list[str]:
    return [v for v in report.violations if v.startswith(f"{oracle}: ")]


def records(streams: Streams, topic: str) -> list[TopicRecord]:
    return list(getattr(streams, FIELD[topic]))


def with_records(streams: Streams, topic: str, new: list[TopicRecord]) -> Streams:
    return dataclasses.replace(streams, **{FIELD[topic]: new})


def encoded(topic: str, like: TopicRecord, value: dict, **place) -> TopicRecord:
    """A real wire record of `topic` carrying `value`, at the place of `like` unless told otherwise."""
    raw = C.encode(SCHEMA[topic], value)
    assert C.decode(SCHEMA[topic], raw) == value
    return dataclasses.replace(like, raw=raw, value=value, **place)


def edit(streams: Streams, topic: str, match, change) -> Streams:
    """Re-encode every record of `topic` whose value matches, with change(value) -> new value."""
    out, hits = [], 0
    for r in records(streams, topic):
        if r.value is not None and match(r.value):
            hits += 1
            r = encoded(topic, r, change(dict(r.value)))
        out.append(r)
    assert hits, f"nothing matched in {topic}"
    return with_records(streams, topic, out)


def drop(streams: Streams, topic: str, match) -> Streams:
    kept = [r for r in records(streams, topic) if r.value is None or not match(r.value)]
    assert len(kept) < len(records(streams, topic)), f"nothing matched in {topic}"
    return with_records(streams, topic, kept)


def append(streams: Streams, topic: str, value: dict, partition: int, key: bytes) -> TopicRecord:
    offset = 1 + max((r.offset for r in records(streams, topic) if r.partition == partition), default=-1)
    raw = C.encode(SCHEMA[topic], value)
    return TopicRecord(partition, offset, START_MS + 10**6, key, raw, C.decode(SCHEMA[topic], raw))


def journal(streams: Streams, account: str) -> list[dict]:
    return sorted((r.value for r in streams.history if r.value["account_id"] == account), key=lambda v: v["seq"])


def latest_balance(streams: Streams, account: str) -> dict:
    return max((r.value for r in streams.balances if r.value["account_id"] == account), key=lambda v: v["seq"])


def result_of(streams: Streams, command_id: str, client: str = "t") -> dict:
    (value,) = [r.value for r in streams.results
                if (r.value["client_id"], r.value["command_id"]) == (client, command_id)
                and not r.value["duplicate"] and r.value["reason"] != "id_conflict"]
    return value


def shift_posted(streams: Streams, account: str, from_seq: int, delta: int) -> Streams:
    """Move `account`'s books by `delta` from entry #from_seq on, coherently: that entry's amount, every
    posted_after from there, and its latest balance (so only the double-entry check can notice)."""
    def move(v):
        if v["seq"] == from_seq:
            v["amount"] = str(int(v["amount"]) + delta)
        v["posted_after"] = str(int(v["posted_after"]) + delta)
        return v
    streams = edit(streams, "history", lambda v: v["account_id"] == account and v["seq"] >= from_seq, move)
    last = latest_balance(streams, account)["seq"]
    return edit(streams, "balances", lambda v: v["account_id"] == account and v["seq"] == last,
                lambda v: {**v, "posted": str(int(v["posted"]) + delta), "available": str(int(v["available"]) + delta)})


def forge_posting(streams: Streams, command_id: str, legs: list[tuple[str, int]]) -> Streams:
    """A transaction that was never sent through the ledger, published as if it had been accepted: its command,
    its result, one history entry per leg continuing each account's journal, and each account's new balance."""
    template = next(r for r in streams.commands if r.value and r.value["command_id"] == "t1")
    command = transfer(command_id, *legs)
    cmd = append(streams, "commands", C.decode("command", command), template.partition, b"k")
    result = {**result_of(streams, "t1"), "command_id": command_id, "transaction_id": command_id, "holds": []}
    res = append(streams, "results", result, template.partition, f"t/{command_id}".encode())
    history, balances = records(streams, "history"), records(streams, "balances")
    for account, amount in legs:
        last = journal(streams, account)[-1]
        place = next(r.partition for r in streams.history if r.value["account_id"] == account)
        seq, posted = last["seq"] + 1, int(last["posted_after"]) + amount
        entry = {**last, "entry_id": f"{account}#{seq}", "seq": seq, "amount": str(amount), "posted_after": str(posted),
                 "transaction_id": command_id, "kind": "transfer", "reference": None, "hold_id": None,
                 "command_id": command_id, "client_id": "t"}
        history.append(append(with_records(streams, "history", history), "history", entry, place, account.encode()))
        view = latest_balance(streams, account)
        view = {**view, "posted": str(posted), "available": str(posted - int(view["held"])), "seq": seq,
                "last_transaction_id": command_id}
        balances.append(append(with_records(streams, "balances", balances), "balances", view, place, account.encode()))
    return dataclasses.replace(streams, commands=[*streams.commands, cmd], results=[*streams.results, res],
                               history=history, balances=balances)


def shard(system_account: str) -> str:
    """The first shard of a system account in the clean run's history."""
    return next(r.value["account_id"] for r in CLEAN.history
                if routing.unsharded(r.value["account_id"]) == system_account)


# The clean run ------------------------------------------------------------------------------------------------

def test_the_clean_run_satisfies_every_oracle_and_covers_what_they_judge():
    report = check(CLEAN)
    assert report.ok, format_report(report)
    c = report.counts
    assert c["commands.undecodable"] == 2 and c["dead_letters"] == 2
    assert c["commands"] > c["commands.from_clients"], "no engine follow-ups (cross-partition steps) ran"
    assert c["holds"] >= 4 and c["transactions"] >= 8
    assert report.sums == {"USD": 0, "USDT": 0, "BTC": 0}
    begun = {r.value["command_id"] for r in CLEAN.results if r.value["command_id"].endswith("~begin")}
    assert begun == {"t/trade~begin", "t/split~begin", "t/far~begin"}, "the multi-partition transactions did not run"
    assert any(r.value["reason"] == "id_conflict" for r in CLEAN.results)
    assert any(r.value["duplicate"] for r in CLEAN.results)
    assert any(r.index is not None for r in CLEAN.commands), "no CommandBatch"
    assert any(routing.unsharded(r.value["account_id"]) == "sys:clearing:USD" for r in CLEAN.history)
    assert not report.notes


def test_an_unsealed_engine_step_sent_twice_is_answered_twice_and_is_no_decision():
    """A forged Reserve (client "ledger", no seal), written twice by a plain producer a few ms apart: each copy
    is refused at its own time (the refusal is not remembered: the id may be a real step's), so the two answers
    differ in their bytes. They are answers, not decisions: neither P4 (two decisions) nor P8 (never decided)."""
    bus = Recorder()
    script(bus, bus.run)
    forged = C.encode("command", {"command_id": "t/steal~reserve~0", "client_id": routing.ENGINE_CLIENT,
                                  "body": ("ledger.Reserve", {"transaction_client_id": "t",
                                                              "transaction_command_id": "steal",
                                                              "coordinator_partition": 0, "transaction": {
        "transaction_id": "steal", "kind": "transfer", "reference": None, "links": [], "metadata": {},
        "occurred_at_ms": None, "rate_snapshot_id": None,
        "legs": [{"account_id": A, "amount": "-5", "hold_id": None, "currency": None},
                 {"account_id": "user:mallory:USD", "amount": "5", "hold_id": None, "currency": "USD"}]}})})
    bus.send(forged, A)
    bus.send(forged, A)
    bus.run()
    streams = bus.streams()
    answers = {r.raw for r in streams.results if r.value["command_id"] == "t/steal~reserve~0"}
    assert len(answers) == 2, "the two copies were not answered at their own times"
    report = check(streams)
    assert report.ok, format_report(report)


# P8: every command answered -----------------------------------------------------------------------------------

def test_p8_a_command_without_a_result():
    broken = drop(CLEAN, "results", lambda v: v["command_id"] == "cap")
    report = check(broken)
    assert oracles(report) == {"P8"}, report.violations
    (message,) = reported(report, "P8")
    assert "('t', 'cap')" in message and "has no result" in message


def test_p8_a_retried_command_whose_decision_was_lost():
    """The retry's duplicate and the conflict's rejection answer later deliveries; the first one needs the decision."""
    broken = drop(CLEAN, "results", lambda v: v["command_id"] == "t1" and not v["duplicate"] and v["reason"] is None)
    report = check(broken)
    assert oracles(report) == {"P8"}, report.violations
    (message,) = reported(report, "P8")
    assert "('t', 't1')" in message and "never decided" in message


def test_p8_an_undecodable_command_without_a_dead_letter():
    poison = next(r for r in CLEAN.commands if r.value is None and r.index is None)
    broken = drop(CLEAN, "dlq", lambda v: (v["partition"], v["offset"]) == (poison.partition, poison.offset)
                  and v["value"] == poison.raw)
    report = check(broken)
    assert oracles(report) == {"P8"}, report.violations
    (message,) = reported(report, "P8")
    assert f"undecodable command at {poison.partition}/{poison.offset} has no dead letter" in message


def test_p8_an_undecodable_item_of_a_batch_needs_its_own_dead_letter():
    item = next(r for r in CLEAN.commands if r.value is None and r.index is not None)
    where = f"{item.partition}/{item.offset}/{item.index}"
    broken = drop(CLEAN, "dlq", lambda v: v["value"] == item.raw)
    report = check(broken)
    assert oracles(report) == {"P8"}, report.violations
    assert any(where in m for m in reported(report, "P8")), report.violations


def test_p8_new_junk_on_the_commands_topic_without_a_dead_letter():
    junk = append(CLEAN, "commands", {"command_id": "x", "client_id": "t",
                                      "body": ("ledger.ReleaseHold", {"hold_id": "h2"})}, 3, b"k")
    junk = dataclasses.replace(junk, raw=b"\xc3\x01garbage", value=None)
    report = check(dataclasses.replace(CLEAN, commands=[*CLEAN.commands, junk]))
    assert oracles(report) == {"P8"}, report.violations
    assert reported(report, "P8") == [f"P8: undecodable command at 3/{junk.offset} has no dead letter"]


# P4: one decision per command, re-emissions identical, changed the books exactly once -------------------------

def test_p4_a_second_decision_with_another_outcome():
    original = next(r for r in CLEAN.results if r.value["command_id"] == "far" and not r.value["duplicate"])
    other = encoded("results", original, {**original.value, "outcome": "rejected", "reason": "insufficient_funds",
                                          "transaction_id": None, "detail": "not enough"},
                    offset=original.offset + 1000)
    report = check(dataclasses.replace(CLEAN, results=[*CLEAN.results, other]))
    assert oracles(report) == {"P4"}, report.violations
    (message,) = reported(report, "P4")
    assert "('t', 'far') got 2 different decisions (accepted, rejected)" in message


def test_p4_a_re_emitted_result_that_differs():
    original = next(r for r in CLEAN.results if r.value["command_id"] == "dep")
    again = encoded("results", original, {**original.value, "at_ms": original.value["at_ms"] + 1})
    report = check(dataclasses.replace(CLEAN, results=[*CLEAN.results, again]))
    assert oracles(report) == {"P4"}, report.violations
    assert "('t', 'dep') got 2 different decisions" in reported(report, "P4")[0]


def test_p4_a_re_emitted_history_entry_that_differs():
    first = next(r for r in CLEAN.history if r.value["command_id"] == "t1" and r.value["account_id"] == B)
    again = encoded("history", first, {**first.value, "at_ms": first.value["at_ms"] + 1}, offset=first.offset + 1000)
    report = check(dataclasses.replace(CLEAN, history=[*CLEAN.history, again]))
    assert oracles(report) == {"P4"}, report.violations
    (message,) = reported(report, "P4")
    assert f"history entry {first.value['entry_id']} (command t1 of t) published with two different contents" in message


def test_p4_an_accepted_transaction_missing_from_the_books():
    """One leg of t1 attributed to another command: t1 changed the books once, but only half of it."""
    broken = edit(CLEAN, "history", lambda v: v["command_id"] == "t1" and v["account_id"] == B,
                  lambda v: {**v, "command_id": "someone-else"})
    report = check(broken)
    assert oracles(report) == {"P4"}, report.violations
    assert reported(report, "P4") == ["P4: command ('t', 't1') has 1 history entries, expected 2"]


def test_p4_an_accepted_multi_partition_trade_counted_under_its_commits():
    """Each partition posted its share under an engine id (its decide step ``t/trade~decide~<p>``), none under the
    trade's own id. An entry of a share attributed to another command is missing."""
    broken = edit(CLEAN, "history",
                  lambda v: "t/trade~decide~" in v["command_id"] and v["account_id"].startswith("sys:fees:BTC@"),
                  lambda v: {**v, "command_id": "someone-else"})
    report = check(broken)
    assert oracles(report) == {"P4"}, report.violations
    assert reported(report, "P4") == ["P4: command ('t', 'trade') has 0 history entries under its own id and 5 "
                                      "under its commits, expected 0 and 6"]


def test_p4_shares_of_older_logs_counted_under_their_commit_steps():
    """Before a share posted as its decide step it posted under a step of its own, ``~commit~<p>``: a log
    written then still checks clean, and the same entry missing is still found."""
    def older(v):
        return {**v, "command_id": v["command_id"].replace("~decide~", "~commit~")}
    renamed = edit(CLEAN, "history", lambda v: "t/trade~decide~" in v["command_id"], older)
    assert check(renamed).violations == []
    broken = edit(renamed, "history",
                  lambda v: "t/trade~commit~" in v["command_id"] and v["account_id"].startswith("sys:fees:BTC@"),
                  lambda v: {**v, "command_id": "someone-else"})
    assert reported(check(broken), "P4") == ["P4: command ('t', 'trade') has 0 history entries under its own id "
                                             "and 5 under its commits, expected 0 and 6"]


def _across_partitions(*sends) -> Streams:
    """A, B, CC (partition 0) and REMOTE (another) opened, A funded 1,000; then each (record, account) sent."""
    bus = Recorder()
    for account in (A, B, CC, REMOTE):
        bus.send(open_account(account), account)
    bus.send(transfer("fund", ("sys:world:USD", -1_000), (A, 1_000)), A)
    bus.run()
    for value, account in sends:
        bus.send(value, account)
    bus.run()
    return bus.streams()


def test_p4_shares_whose_legs_on_one_account_net_or_post_leg_by_leg_check_clean():
    """A transaction across partitions alone nets an account's legs within its share (B's -10 and +10 post
    nothing); a linked batch's shares post each leg (A's -50 and -30 are two entries). Both are the books
    changed once: the oracle counted neither so and failed a correct log."""
    netted = transfer("n1", (A, -100), (B, -10), (B, 10), (REMOTE, 100))
    leg_by_leg = linked(transfer("k1", (A, -50), (A, -30), (REMOTE, 80)), transfer("k2", (REMOTE, -20), (CC, 20)))
    streams = _across_partitions((netted, A), (leg_by_leg, A))
    assert [result_of(streams, c)["outcome"] for c in ("n1", "k1", "k2")] == ["accepted"] * 3
    report = check(streams)
    assert report.ok, format_report(report)
    broken = drop(streams, "history", lambda v: v["command_id"].startswith("t/k1~decide~") and v["amount"] == "-30")
    assert "P4: command ('t', 'k1') has 0 history entries under its own id and 2 under its commits, expected 0 " \
           "and 3" in reported(check(broken), "P4")


# P3: seq gapless and increasing, posted_after the fold ----------------------------------------------------------

def test_p3_a_seq_skipped():
    last = journal(CLEAN, CC)[-1]["seq"]
    broken = edit(CLEAN, "history", lambda v: v["account_id"] == CC and v["seq"] == last,
                  lambda v: {**v, "seq": last + 1})
    broken = edit(broken, "balances", lambda v: v["account_id"] == CC and v["seq"] == last,
                  lambda v: {**v, "seq": last + 1})
    report = check(broken)
    assert oracles(report) == {"P3"}, report.violations
    (message,) = reported(report, "P3")
    assert message.startswith(f"P3: {CC} seqs are not 1..n: ") and f"{last - 1}, {last + 1}]" in message


def test_p3_a_history_entry_dropped():
    """An account's journal loses its 'account opened' entry: a gap at #1, and the open left no trace."""
    broken = drop(CLEAN, "history", lambda v: v["account_id"] == REMOTE and v["seq"] == 1)
    report = check(broken)
    assert oracles(report) == {"P3", "P4"}, report.violations
    rest = [v["seq"] for v in journal(broken, REMOTE)]
    assert rest[0] == 2
    assert reported(report, "P3") == [f"P3: {REMOTE} seqs are not 1..n: {rest}"]
    assert reported(report, "P4") == [f"P4: command ('t', 'open:{REMOTE}') has 0 history entries, expected 1"]


def test_p3_a_leg_dropped_breaks_every_oracle_that_reads_it():
    dropped = next(v for v in journal(CLEAN, B) if v["command_id"] == "t1")
    broken = drop(CLEAN, "history", lambda v: v["entry_id"] == dropped["entry_id"])
    report = check(broken)
    assert oracles(report) == {"P1", "P2", "P3", "P4", "fold"}, report.violations  # B's later debits overdraw
    assert any(m.startswith(f"P3: {B} seqs are not 1..n") for m in reported(report, "P3"))
    assert any(m.startswith(f"P3: {B}#") and "posted_after" in m for m in reported(report, "P3"))
    assert "P1: transaction t1 of t sums to -100 in USD" in report.violations
    assert f"balance of {B}" in reported(report, "fold")[0]


def test_p3_posted_after_not_the_fold():
    entry = next(v for v in journal(CLEAN, A) if v["command_id"] == "t1")
    broken = edit(CLEAN, "history", lambda v: v["entry_id"] == entry["entry_id"],
                  lambda v: {**v, "posted_after": str(int(v["posted_after"]) + 7)})
    report = check(broken)
    assert oracles(report) == {"P3"}, report.violations
    assert reported(report, "P3") == [
        f"P3: {A}#{entry['seq']} posted_after {int(entry['posted_after']) + 7} != fold {entry['posted_after']}"]


def test_p3_an_amount_changed_alone():
    entry = next(v for v in journal(CLEAN, CC) if v["command_id"] == "cap")
    broken = edit(CLEAN, "history", lambda v: v["entry_id"] == entry["entry_id"], lambda v: {**v, "amount": "51"})
    report = check(broken)
    assert f"P3: {CC}#{entry['seq']} posted_after {entry['posted_after']} != fold {int(entry['posted_after']) + 1}" \
        in report.violations
    assert "P1: transaction cap of t sums to 1 in USD" in report.violations
    assert oracles(report) == {"P1", "P3", "fold"}, report.violations


# P2: no overdraft ---------------------------------------------------------------------------------------------------

def test_p2_an_account_below_its_floor():
    posted = int(journal(CLEAN, CC)[-1]["posted_after"])
    broken = forge_posting(CLEAN, "drain", [(CC, -(posted + 5)), (shard("sys:world:USD"), posted + 5)])
    report = check(broken)
    assert oracles(report) == {"P2"}, report.violations
    seq = journal(broken, CC)[-1]["seq"]
    assert reported(report, "P2") == [f"P2: {CC}#{seq} available -5 below 0"]


def test_p2_counts_open_holds():
    """B's posted stays >= 0 but its open hold h2 makes available negative."""
    last = journal(CLEAN, B)[-1]
    posted, held = int(last["posted_after"]), int(last["held_after"])
    assert held == 20
    broken = forge_posting(CLEAN, "drain", [(B, -(posted - 5)), (shard("sys:world:USD"), posted - 5)])
    report = check(broken)
    assert oracles(report) == {"P2"}, report.violations
    assert reported(report, "P2") == [f"P2: {B}#{last['seq'] + 1} available -15 below 0"]


def test_p2_a_system_account_may_go_negative():
    world = shard("sys:world:USD")
    assert int(journal(CLEAN, world)[-1]["posted_after"]) < 0
    broken = forge_posting(CLEAN, "mint", [(world, -5), (A, 5)])
    report = check(broken)
    assert report.ok, report.violations  # the world shard has no floor


# fold: balances = the fold of history ---------------------------------------------------------------------------------

def test_fold_a_balance_that_disagrees_with_history():
    view = latest_balance(CLEAN, A)
    broken = edit(CLEAN, "balances", lambda v: v["account_id"] == A and v["seq"] == view["seq"],
                  lambda v: {**v, "posted": str(int(v["posted"]) + 1), "available": str(int(v["available"]) + 1)})
    report = check(broken)
    assert oracles(report) == {"fold"}, report.violations
    (message,) = reported(report, "fold")
    assert message.startswith(f"fold: balance of {A} {int(view['posted']) + 1}/{view['held']}#{view['seq']} != history")


def test_fold_an_account_with_history_but_no_balance():
    broken = drop(CLEAN, "balances", lambda v: v["account_id"] == REMOTE)
    report = check(broken)
    assert oracles(report) == {"fold"}, report.violations
    last = journal(CLEAN, REMOTE)[-1]["seq"]
    assert reported(report, "fold") == [f"fold: {REMOTE} has history up to #{last} but no balance"]


def test_fold_a_balance_behind_its_history():
    last = latest_balance(CLEAN, SELLER_USDT)["seq"]
    broken = drop(CLEAN, "balances", lambda v: v["account_id"] == SELLER_USDT and v["seq"] == last)
    report = check(broken)
    assert oracles(report) == {"fold"}, report.violations
    assert f"balance of {SELLER_USDT} " in reported(report, "fold")[0]


# P1: transactions balanced, currencies sum to zero --------------------------------------------------------------

def test_p1_an_unbalanced_transaction_coherent_everywhere_else():
    """dep credits A one cent more than it debits the world, and A's journal and balance agree with it: only
    double entry can tell."""
    entry = next(v for v in journal(CLEAN, A) if v["command_id"] == "dep")
    broken = shift_posted(CLEAN, A, entry["seq"], 1)
    report = check(broken)
    assert oracles(report) == {"P1"}, report.violations
    assert reported(report, "P1") == ["P1: transaction dep of t sums to 1 in USD",
                                      "P1: USD sums to 1 over all accounts"]
    assert report.sums["USD"] == 1


def test_p1_a_forged_unbalanced_transaction():
    broken = forge_posting(CLEAN, "mint", [(shard("sys:world:BTC"), -3), (BUYER_BTC, 5)])
    report = check(broken)
    assert oracles(report) == {"P1"}, report.violations
    assert "P1: transaction mint of t sums to 2 in BTC" in report.violations
    assert "P1: BTC sums to 2 over all accounts" in report.violations


# P6: clearing empty once quiescent -------------------------------------------------------------------------------

def test_p6_money_left_in_clearing():
    """Shards of one currency may be non-zero (a credit leaves from one, lands from another); their sum may not."""
    clearing = shard("sys:clearing:USD")
    before = int(journal(CLEAN, clearing)[-1]["posted_after"])
    broken = forge_posting(CLEAN, "stuck", [(A, -7), (clearing, 7)])
    report = check(broken)
    assert oracles(report) == {"P6"}, report.violations
    (message,) = reported(report, "P6")
    assert message.startswith("P6: 7 USD still in clearing (") and f"{clearing} {before + 7}" in message


def test_p6_a_cross_partition_credit_that_never_landed():
    """Half the credit of 'far' in REMOTE's partition (funded from that partition's clearing shard) is undone
    coherently in both accounts' books: 5 stay in the debit partition's clearing shard."""
    credit = next(v for v in journal(CLEAN, REMOTE) if v["amount"] == "10")
    funding = next(r.value for r in CLEAN.history if r.value["command_id"] == credit["command_id"]
                   and routing.unsharded(r.value["account_id"]) == "sys:clearing:USD")
    broken = shift_posted(CLEAN, REMOTE, credit["seq"], -5)
    broken = shift_posted(broken, funding["account_id"], funding["seq"], 5)
    report = check(broken)
    assert oracles(report) == {"P6"}, report.violations
    (message,) = reported(report, "P6")
    assert message.startswith("P6: 5 USD still in clearing (sys:clearing:USD@"), message


# P5: holds settle exactly once --------------------------------------------------------------------------------

def _hold_edit(streams: Streams, hold_id: str, status: str, change) -> Streams:
    def touches(v):
        return not v["duplicate"] and any(h["hold_id"] == hold_id and h["status"] == status for h in v["holds"])
    return edit(streams, "results", touches, lambda v: {**v, "holds": [
        change(dict(h)) if h["hold_id"] == hold_id else h for h in v["holds"]]})


def test_p5_a_hold_that_ended_with_money_unaccounted():
    h1 = [h for r in CLEAN.results for h in r.value["holds"] if h["hold_id"] == "h1"]
    assert [h["status"] for h in h1] == ["open", "open", "expired"]
    broken = _hold_edit(CLEAN, "h1", "expired", lambda h: {**h, "released": str(int(h["released"]) - 10)})
    report = check(broken)
    assert oracles(report) == {"P5"}, report.violations
    assert reported(report, "P5") == [f"P5: hold h1 on {A} ended expired with captured+released 290 != 300"]


def test_p5_a_hold_settled_twice():
    broken = _hold_edit(CLEAN, "h1", "expired", lambda h: {**h, "released": str(int(h["released"]) + 50)})
    report = check(broken)
    assert oracles(report) == {"P5"}, report.violations
    assert reported(report, "P5") == [f"P5: hold h1 on {A} ended expired with captured+released 350 != 300"]


def test_p5_held_is_not_the_open_remainders():
    broken = _hold_edit(CLEAN, "h2", "open", lambda h: {**h, "amount": "15"})
    report = check(broken)
    assert oracles(report) == {"P5"}, report.violations
    assert reported(report, "P5") == [f"P5: {B} holds 20 but its open holds total 15"]


def test_p5_an_open_hold_with_nothing_remaining():
    broken = _hold_edit(CLEAN, "h2", "open", lambda h: {**h, "captured": "20"})
    report = check(broken)
    assert oracles(report) == {"P5"}, report.violations
    assert f"P5: hold h2 on {B} is open with nothing remaining" in report.violations
    assert f"P5: {B} holds 20 but its open holds total 0" in report.violations


def test_p5_money_still_held_after_its_hold_ended():
    """bid's last state says released in full while the buyer's books still hold the rest."""
    broken = _hold_edit(CLEAN, "bid", "open", lambda h: {**h, "status": "released",
                                                         "released": str(int(h["amount"]) - int(h["captured"]))})
    report = check(broken)
    assert oracles(report) == {"P5"}, report.violations
    (message,) = reported(report, "P5")
    assert message.startswith(f"P5: {BUYER_USDT} holds 18020 but its open holds total 0")


# Records verify cannot read ------------------------------------------------------------------------------------

def corrupted(record: TopicRecord, raw: bytes) -> TopicRecord:
    return dataclasses.replace(record, raw=raw, value=None)


@pytest.mark.parametrize("topic", ["results", "history", "balances", "dlq"])
def test_unreadable_records_are_skipped_counted_and_named(topic):
    """Bytes that do not decode, added to a topic, are not a broken promise: the report stays ok and says
    where they are (a reader must never crash on them)."""
    like = records(CLEAN, topic)[-1]
    junk = corrupted(dataclasses.replace(like, offset=like.offset + 1), like.raw[:-3])
    report = check(with_records(CLEAN, topic, [*records(CLEAN, topic), junk]))
    assert report.ok, report.violations
    assert report.counts[f"unreadable.{topic}"] == 1
    (note,) = report.notes
    assert note.startswith(f"unreadable {topic} record at {junk.partition}/{junk.offset} (key {junk.key.decode()}): ")
    assert "corrupt" in note
    assert note in format_report(report)


def test_an_unreadable_result_leaves_its_command_unanswered():
    original = next(r for r in CLEAN.results if r.value["command_id"] == "later")
    broken = with_records(CLEAN, "results", [corrupted(r, b"\x00") if r is original else r for r in CLEAN.results])
    report = check(broken)
    assert report.counts["unreadable.results"] == 1
    assert report.notes == [f"unreadable results record at {original.partition}/{original.offset} (key t/later): "
                            "not_avro: missing the Avro single-object marker C3 01"]
    assert oracles(report) == {"P8"}, report.violations
    assert "('t', 'later')" in reported(report, "P8")[0]


def test_an_unreadable_history_entry_leaves_a_gap():
    target = next(r for r in CLEAN.history if r.value["account_id"] == CC and r.value["command_id"] == "cap")
    broken = with_records(CLEAN, "history", [corrupted(r, r.raw[:20]) if r is target else r for r in CLEAN.history])
    report = check(broken)
    assert report.counts["unreadable.history"] == 1
    assert f"key {CC}" in report.notes[0]
    assert any(m.startswith(f"P3: {CC} seqs are not 1..n") for m in reported(report, "P3"))


def test_money_that_is_not_an_integer_is_unreadable_not_a_crash():
    entry = journal(CLEAN, A)[-1]
    broken = edit(CLEAN, "history", lambda v: v["entry_id"] == entry["entry_id"], lambda v: {**v, "amount": "1.5"})
    broken = edit(broken, "results", lambda v: v["command_id"] == "hold:h2",
                  lambda v: {**v, "holds": [{**h, "captured": "lots"} for h in v["holds"]]})
    broken = edit(broken, "balances", lambda v: v["account_id"] == CC, lambda v: {**v, "held": ""})
    report = check(broken)
    assert (report.counts["unreadable.history"], report.counts["unreadable.results"]) == (1, 1)
    assert report.counts["unreadable.balances"] == len([r for r in CLEAN.balances if r.value["account_id"] == CC])
    assert any("amount '1.5' is not an integer" in n and f"key {A}" in n for n in report.notes)
    assert any("hold h2 captured 'lots' is not an integer" in n and "key t/hold:h2" in n for n in report.notes)
    assert "P8: command ('t', 'hold:h2') at " in "\n".join(report.violations)


# A reservation's internal holds and the shares' ids, as the engine writes them --------------------------------

def _two_debtors_one_payee():
    """A bus with x (partition 0) and d, y (partition 1) opened and funded."""
    bus = RecordingBus()
    x, (d, y) = local_users(1, partition=0)[0], local_users(2, partition=1)
    for a in (x, d, y):
        bus.send(open_account(a), a)
    for a in (x, d):
        bus.send(tx("dep" + a, [("sys:world:USD", -1_000, None, None), (a, 1_000, None, None)], kind="deposit"), a)
    bus.run()
    return bus, x, d, y


def test_p5_an_internal_hold_still_reserved_is_named_by_the_step_that_placed_it():
    """A producer that wrote only the copy of a payment (it died between its sends): the copy's reservation
    holds d's debit for COPY_WAIT_MS. The internal hold is placed inside the copy's step, not as a command
    of its own, and that step's result names it, so the held amount has an open hold behind it (P5)."""
    from streams import placement
    from tests.helpers.bus import C
    bus, x, d, y = _two_debtors_one_payee()
    record, _ = placement.placements(C.decode("command", tx("pay", [(x, -5, None, None), (d, -5, None, None),
                                                                   (y, 10, None, None)])), x, N)
    bus.send_to(1, C.encode("command", record), bus.clock + 1)  # the copy only
    bus.run()
    report = check(bus.streams())
    assert oracles(report) == {"P8"}, report.violations  # the payment itself never reached its coordinator
    assert reported(report, "P8") == ["P8: command ('t', 'pay') at 1/3 has no result"]


def test_p4_a_command_id_holding_a_step_name_is_not_taken_for_a_share():
    """Client ids may hold the step mark: `pay~decide~x` is a payment of its own, and the steps of `pay` (its
    begin, whose history carries the internal hold) are not shares of it."""
    bus, x, d, y = _two_debtors_one_payee()
    for command_id in ("pay", "pay~decide~x", "pay~decide~1"):
        bus.send(tx(command_id, [(x, -5, None, None), (d, -5, None, None), (y, 10, None, None)]), x)
    bus.run()
    report = check(bus.streams())
    assert report.violations == [], report.violations
    assert report.counts["transactions"] == 5
