"""The operator's view of long-open holds (connectors/holds.py), folded from results of real partition
processors: what `ledger holds --open-longer-than` lists, and that releasing a listed one ends it."""
from __future__ import annotations

import pytest

from connectors.holds import duration_ms, open_holds
from tests.helpers.bus import START_MS
from tests.rules.scenario import Scenario

HOUR = 3_600_000


def test_long_open_holds_are_listed_oldest_first_and_a_released_one_is_gone():
    s = (Scenario().users("alice", "bob")
         .deposit("d1", "alice", "USDT", "1000")
         .deposit("d2", "bob", "BTC", "1")
         .order_placed("old-bid", "alice", "buy", "0.01", "60000")                 # no expiry: its event had no time
         .at(START_MS + 2 * HOUR)
         .order_placed("ask", "bob", "sell", "0.5", "61000")
         .withdrawal_requested("w1", "alice", "USDT", "100", expires_at_ms=START_MS + 10 * HOUR)
         .at(START_MS + 3 * HOUR)
         .order_placed("done", "alice", "buy", "0.001", "60000")
         .order_closed("done", "alice", "buy")                                     # ended: never listed
         .trade("t1", "0.2", "61000", buyer="bot", seller=("bob", "ask")))        # partly filled: still open
    now = START_MS + 4 * HOUR
    found = open_holds(s.bus.results, now, duration_ms("90m"))
    assert [(h.hold_id, h.account_id, h.remaining, h.expires_at_ms) for h in found] == [
        ("order:old-bid", "user:alice:USDT", 600_000000, None),
        ("order:ask", "user:bob:BTC", 30_000000, None),
        ("withdrawal:w1", "user:alice:USDT", 100_000000, START_MS + 10 * HOUR)]
    assert found[0].age_ms(now) >= 4 * HOUR - 1_000
    assert [h.hold_id for h in open_holds(s.bus.results, now, duration_ms("3.5h"))] == ["order:old-bid"]
    s.order_closed("old-bid", "alice", "buy")          # what `--release order:old-bid` sends (a ReleaseHold)
    assert [h.hold_id for h in open_holds(s.bus.results, now, duration_ms("3.5h"))] == []


@pytest.mark.parametrize("text, ms", [("90", 90_000), ("90s", 90_000), ("30m", 1_800_000), ("1.5h", 5_400_000),
                                      ("7d", 604_800_000)])
def test_durations(text, ms):
    assert duration_ms(text) == ms


def test_a_bad_duration_is_refused():
    with pytest.raises(ValueError):
        duration_ms("a week")
