"""A producer's copy of a transaction that reaches a partition whose waiting queue is full (WAITING_LIMIT) is
refused there as the copy's step, the partition's vote, never under the client's command id: the coordinator
alone answers the client, once (P4). Broker-free, through eight partition processors."""
from __future__ import annotations

from schemas.codec import codec
from streams import spanning
from streams.core.rejections import NOT_A_DECISION
from tests.helpers.bus import assert_books_balance
from tests.helpers.interleavings import payee_with_a_reserved_credit
from tests.helpers.records import command, tx

C = codec()


def test_a_copy_refused_by_a_full_waiting_queue_leaves_the_answer_to_the_coordinator(monkeypatch):
    monkeypatch.setattr(spanning, "WAITING_LIMIT", 3)
    bus, payer, payee = payee_with_a_reserved_credit()  # the copy reserves the payee's credit in partition 1
    for i in range(3):  # freezes of the payee wait for it until the queue is full
        bus.send(command(f"fz{i}", "FreezeAccount", {"account_id": payee}), payee)
        bus.step(1)
    bus.send_placed(tx("t1", [(payer, -5, None, None), (payee, 5, None, None)], "transfer"), payer)
    bus.run()
    decisions = {r.value for r in bus.emitted if r.result["command_id"] == "t1" and not r.result["duplicate"]
                 and r.result["reason"] not in NOT_A_DECISION}
    assert len(decisions) == 1, [C.decode("result", v) for v in decisions]
    (only,) = decisions
    assert C.decode("result", only)["reason"] == "in_flight"  # partition 1 refused: its vote
    assert bus.account(payer) == (90, 0) and bus.account(payee) == (10, 0)
    assert_books_balance(bus, ("USD",))
