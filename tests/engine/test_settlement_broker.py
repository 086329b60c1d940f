"""Ticks and late settlements through the real broker and one real worker (streams/ticks.py,
streams/core/settlement.py): due holds expire on a partition nobody writes to, and a completion or a fill that
arrives after its hold expired is still recorded, within one partition and across two; `ledger holds` lists a
hold left open and releases it.

One worker, ticking every half second, serves the whole test (a worker start is the expensive part).
"""
from __future__ import annotations

import json
import time

from connectors import rules
from connectors.client import LedgerClient
from projections.verify import format_report, verify
from tests.helpers.cli import cli
from tests.helpers.topics import latest_balances
from tests.rules.scenario import in_different_partitions

assert in_different_partitions("alice", "bob")


def wait_for(condition, what: str, timeout_s: float = 60.0):
    """Poll until condition() is truthy (a wait with a deadline, not a timed assertion)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"not seen within {timeout_s}s: {what}")


def outcome(result: dict) -> str:
    return result["reason"] or result["outcome"]  # an accepted result's reason is its notice


def test_ticks_expire_quiet_holds_and_late_settlements_still_post(settings, start_worker):
    start_worker(extra_env={"LEDGER_TICK_S": "0.5"})
    client = LedgerClient(settings, "exchange")
    ctx = rules.Context(client_id="exchange")

    def send(event) -> str:
        results = client.wait(client.submit(rules.plan(event, ctx)))
        return outcome(next(iter(results.values())))

    try:
        opened = [client.open_account(f"user:{u}:{c}", c) for u in ("alice", "bob") for c in ("USDT", "BTC")]
        assert {outcome(r) for r in client.wait(opened).values()} == {"accepted"}
        assert send(rules.DepositConfirmed("d1", "bob", "USDT", "1000")) == "accepted"
        assert send(rules.DepositConfirmed("d2", "bob", "BTC", "0.2")) == "accepted"
        assert send(rules.DepositConfirmed("d3", "alice", "USDT", "40000")) == "accepted"
        soon = int(time.time() * 1000) + 1_000
        assert send(rules.WithdrawalRequested("w1", "bob", "USDT", "400", "1", expires_at_ms=soon)) == "accepted"
        assert send(rules.OrderPlaced("bid-1", "alice", "buy", "BTC", "USDT", "0.5", "60000",
                                      expires_at_ms=soon)) == "accepted"
        assert send(rules.OrderPlaced("ask-1", "bob", "sell", "BTC", "USDT", "0.2", "59900")) == "accepted"

        # Nobody writes to these partitions now: only the worker's ticks move their time on.
        def released() -> bool:
            balances = latest_balances(settings)
            return balances["user:bob:USDT"]["held"] == "0" and balances["user:alice:USDT"]["held"] == "0"
        wait_for(released, "the ticks expire both holds")

        # Custody paid out and the exchange matched the fill before hearing of the expiry: both still post.
        assert send(rules.WithdrawalCompleted("w1", "bob", "USDT", "400", "1")) == "late_settlement"
        fill = rules.TradeExecuted("fill-1", "BTC", "USDT", "0.2", "59900", rules.Party("alice", "bid-1"),
                                   rules.Party("bob", "ask-1"), "seller", "0.001", "0.001")
        assert send(fill) == "late_settlement"
        expected = {"user:bob:USDT": str(599_000000 + 11_968_020000), "user:alice:USDT": "28020000000",
                    "user:alice:BTC": "19980000", "user:alice:receivable.USDT": None}
        # (The log never goes quiet while the worker ticks every half second: wait for the balances instead.)
        wait_for(lambda: {a: (b[a]["posted"] if a in b else None)
                          for b in [latest_balances(settings)] for a in expected} == expected,
                 f"the balances {expected}")
        # An order whose close report is lost (and whose event had no time, so no expiry): the operator lists
        # long-open holds and releases it.
        assert send(rules.OrderPlaced("ask-2", "alice", "sell", "BTC", "USDT", "0.1", "70000")) == "accepted"
        listed = cli(settings, "holds", "--open-longer-than", "0s", "--json")
        assert listed.returncode == 1, listed.stdout + listed.stderr  # 1: some are listed
        assert [(h["hold_id"], h["remaining"]) for h in json.loads(listed.stdout)] == [("order:ask-2", "10000000")]
        done = cli(settings, "holds", "--open-longer-than", "0s", "--release", "order:ask-2", "--json")
        assert done.returncode == 0 and json.loads(done.stdout)["outcome"] == "accepted", done.stdout + done.stderr
        wait_for(lambda: latest_balances(settings)["user:alice:BTC"]["held"] == "0", "the release")
        report = verify(settings)
        assert report.ok, format_report(report)
    finally:
        client.close()
