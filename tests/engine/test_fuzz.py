"""A short seeded fuzz run against the real broker and a real worker (`make fuzz` runs a longer one):
hostile records of every class (tests/adversary.py) mixed with valid traffic. The worker never exits,
every record gets a result or a dead letter (verify's P8), every oracle holds, forged engine steps are all
refused, and the valid traffic ends with the balances it has without the noise."""
from __future__ import annotations

from projections.verify import format_report, wait_quiescent
from tests import adversary


def test_hostile_records_mixed_with_valid_traffic_change_nothing_valid(settings, start_worker):
    worker = start_worker()
    sent = adversary.send(settings, seed=20_261_130, noise_records=3_000, valid_steps=200)
    assert set(sent.by_class) == set(adversary.CLASSES), sent.by_class
    assert wait_quiescent(settings, timeout_s=400), "the worker did not get through the records"
    verdict = adversary.judge(settings, sent)
    assert worker.alive and worker.starts == 1, worker.tail()
    assert not worker.crashed(), worker.tail()  # no exception at all, even one the worker survived
    assert verdict.report.ok, format_report(verdict.report)[:4000]
    assert verdict.valid_answered == len(sent.valid_ids) and not verdict.valid_rejected, verdict.valid_rejected[:10]
    assert not verdict.forged_accepted, verdict.forged_accepted
    assert not verdict.unprocessable, verdict.unprocessable
    assert not verdict.balances_differ, verdict.balances_differ
    assert verdict.dead_letters > 0 and verdict.report.counts["dead_letters"] == verdict.dead_letters
