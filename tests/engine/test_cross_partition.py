"""Cross-partition order through a real broker and a real worker (DESIGN.md P10).

The producer (LedgerClient) places a trade whose buyer and seller live in different partitions in both
partitions, then at once sends the closes of both orders: every partition decides the trade before the
closes, so every trade is accepted and every close releases exactly what the trade left.
"""
from __future__ import annotations

from connectors import rules
from connectors.client import LedgerClient
from connectors.rules import DepositConfirmed, OrderClosed, OrderPlaced, Party, TradeExecuted
from projections.verify import format_report, verify, wait_quiescent
from streams import routing

PAIRS = 20


def _pairs(partitions: int) -> list[tuple[str, str]]:
    """(buyer, seller) names whose accounts live in different partitions."""
    names = [f"x{i}" for i in range(400)]
    home = {n: routing.partition_of_account(f"user:{n}:USDT", partitions) for n in names}
    pairs, used = [], set()
    for b in names:
        if b in used:
            continue
        s = next((s for s in names if s not in used and s != b and home[s] != home[b]), None)
        if s is None:
            break
        used.update((b, s))
        pairs.append((b, s))
        if len(pairs) == PAIRS:
            return pairs
    raise AssertionError("not enough users in distinct partitions")


def _send(client: LedgerClient, event) -> list[str]:
    return client.submit(rules.plan(event))


def test_a_close_sent_right_after_a_trade_never_overtakes_it(settings, start_worker):
    start_worker()
    client = LedgerClient(settings, rules.DEFAULT_CLIENT_ID)
    pairs = _pairs(settings.partitions)
    ids = []
    for b, s in pairs:
        for user in (b, s):
            for currency in ("USDT", "BTC"):
                routed = rules.open_user_account(user, currency)
                ids.append(client.send(routed.record["command_id"], "OpenAccount", routed.record["body"][1],
                                       routed.routing_account))
    assert all(r["outcome"] == "accepted" for r in client.wait(ids, timeout_s=120).values())
    ids = []
    for b, s in pairs:
        ids += _send(client, DepositConfirmed(f"dep-{b}", b, "USDT", "1000"))
        ids += _send(client, DepositConfirmed(f"dep-{s}", s, "BTC", "1"))
    assert all(r["outcome"] == "accepted" for r in client.wait(ids, timeout_s=120).values())
    ids = []
    for b, s in pairs:
        ids += _send(client, OrderPlaced(f"bid-{b}", b, "buy", "BTC", "USDT", "0.5", "1000"))
        ids += _send(client, OrderPlaced(f"ask-{s}", s, "sell", "BTC", "USDT", "0.5"))
    assert all(r["outcome"] == "accepted" for r in client.wait(ids, timeout_s=120).values())
    # Each trade, then at once the closes of both its orders, from the same producer; nothing waits between.
    trades, closes = [], []
    for b, s in pairs:
        trades += _send(client, TradeExecuted(f"t-{b}", "BTC", "USDT", "0.2", "1000", Party(b, f"bid-{b}"),
                                              Party(s, f"ask-{s}"), "seller"))
        closes.append(_send(client, OrderClosed(f"bid-{b}", b, "buy", "BTC", "USDT")))
        closes.append(_send(client, OrderClosed(f"ask-{s}", s, "sell", "BTC", "USDT")))
    results = client.wait(trades + [i for c in closes for i in c], timeout_s=180)
    refused = {i: (results[i]["reason"], results[i]["detail"]) for i in trades if results[i]["outcome"] != "accepted"}
    assert not refused, f"{len(refused)} of {len(trades)} trades refused: {list(refused.items())[:3]}"
    for close in closes:
        for i in close:
            r = results[i]
            assert r["outcome"] == "accepted", r
            released = [h for h in r["holds"] if h["status"] == "released"]
            assert released, r
            for h in released:  # 0.2 of 0.5 BTC (200 of 500 USDT) taken by the trade: the rest released
                assert int(h["captured"]) * 3 == int(h["released"]) * 2, h
    assert wait_quiescent(settings)
    report = verify(settings)
    assert report.ok, format_report(report)
    client.close()
