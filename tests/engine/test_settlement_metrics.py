"""A late settlement is counted as a notice, not a rejection (ledger_notices_total, streams/metrics.py), from the
tally real partition processors keep."""
from __future__ import annotations

from collections import Counter

from streams import metrics
from tests.rules.scenario import Scenario


def sample(counter, label: str) -> float:
    return counter.labels(label)._value.get()


def test_late_settlements_are_counted_as_notices():
    s = (Scenario().users("bob")
         .deposit("d1", "bob", "USDT", "1000")
         .withdrawal_requested("w1", "bob", "USDT", "400", fee="1")
         .withdrawal_failed("w1", "bob", "USDT")
         .withdrawal_completed("w1", "bob", "USDT", "400", fee="1", expect="late_settlement"))
    tally = Counter()
    for proc in s.bus.procs.values():
        tally.update(proc.tally)
    assert tally[("PostTransaction", "accepted", "late_settlement")] == 1
    notices, rejections = sample(metrics.NOTICES, "late_settlement"), sample(metrics.REJECTIONS, "late_settlement")
    metrics.record_batch(tally, 1, 0.001)
    assert sample(metrics.NOTICES, "late_settlement") == notices + 1
    assert sample(metrics.REJECTIONS, "late_settlement") == rejections     # never counted as a rejection
