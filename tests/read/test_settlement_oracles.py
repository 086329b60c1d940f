"""verify's oracles over late settlements (streams/core/settlement.py): a completion and a fill that arrive after
their holds ended, one overdrawing into its owner's receivable, within one partition and across two, pass every
oracle; and a receivable leg the decision did not make is still caught. Real partition processors, no broker
(the Recorder of tests/helpers/recorder.py)."""
from __future__ import annotations

import dataclasses
import json

from connectors import rules
from projections.verify import check, format_report
from schemas.codec import codec
from tests.helpers.recorder import Recorder
from tests.rules.scenario import in_different_partitions

C = codec()
assert in_different_partitions("alice", "bob")


def send(rec: Recorder, event) -> None:
    for routing_account, record in rules.plan(event, rules.DEFAULT_CONTEXT):
        rec.send(C.encode("command", record), routing_account)
    rec.run()


def late_settlements() -> Recorder:
    rec = Recorder()
    for user in ("alice", "bob"):
        for currency in ("USDT", "BTC"):
            routed = rules.open_user_account(user, currency)
            rec.send(C.encode("command", routed.record), routed.routing_account)
    rec.run()
    for event in (rules.DepositConfirmed("d1", "bob", "USDT", "1000"),
                  rules.DepositConfirmed("d2", "bob", "BTC", "0.2"),
                  rules.DepositConfirmed("d3", "alice", "USDT", "40000"),
                  rules.WithdrawalRequested("w1", "bob", "USDT", "400", "1"),
                  rules.WithdrawalFailed("w1", "bob", "USDT"),
                  rules.InternalTransfer("t1", "bob", "alice", "USDT", "700"),
                  rules.WithdrawalCompleted("w1", "bob", "USDT", "400", "1"),          # 300 + 101 receivable
                  rules.OrderPlaced("bid", "alice", "buy", "BTC", "USDT", "0.5", "60000"),
                  rules.OrderPlaced("ask", "bob", "sell", "BTC", "USDT", "0.2", "59900"),
                  rules.OrderClosed("bid", "alice", "buy", "BTC", "USDT"),
                  rules.InternalTransfer("t2", "alice", "bob", "USDT", "35000"),
                  rules.TradeExecuted("f1", "BTC", "USDT", "0.2", "59900", rules.Party("alice", "bid"),
                                      rules.Party("bob", "ask"), "seller")):       # 5,700 + 6,280 receivable
        send(rec, event)
    return rec


def test_late_settlements_with_receivables_pass_every_oracle():
    rec = late_settlements()
    streams = rec.streams()
    reasons = {r.value["command_id"]: r.value["reason"] for r in streams.results}
    assert reasons["withdrawal_completed:w1"] == reasons["trade_executed:f1"] == "late_settlement"
    receivables = {h.value["account_id"] for h in streams.history if ":receivable." in h.value["account_id"]}
    assert receivables == {"user:bob:receivable.USDT", "user:alice:receivable.USDT"}
    report = check(streams)
    assert report.ok, format_report(report)


def test_a_receivable_entry_the_decision_did_not_make_is_caught():
    rec = late_settlements()
    streams = rec.streams()
    # Publish the withdrawal's receivable leg twice (as a second entry): the books changed more than once.
    leg = next(h for h in streams.history if h.value["account_id"] == "user:bob:receivable.USDT"
               and h.value["kind"] == "withdrawal")
    forged = dataclasses.replace(leg, value={**leg.value, "entry_id": leg.value["entry_id"] + "x", "seq": 99})
    report = check(dataclasses.replace(streams, history=[*streams.history, forged]))
    assert not report.ok and any("withdrawal_completed:w1" in v for v in report.violations), format_report(report)
    json.dumps(report.violations)
