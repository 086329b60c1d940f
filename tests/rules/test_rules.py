"""The rules as pure functions: ids, versions, legs, exact arithmetic, typed validation errors."""
from __future__ import annotations

import ast
import pathlib

import pytest

from connectors import rules
from connectors.rules import (
    BOT,
    Context,
    DepositChargedBack,
    DepositConfirmed,
    FxConverted,
    InternalTransfer,
    OrderClosed,
    OrderPlaced,
    Party,
    TradeExecuted,
    TransferReturned,
    WithdrawalCompleted,
    WithdrawalFailed,
    WithdrawalRequested,
    plan,
)
from schemas.codec import codec

C = codec()
TRADE = TradeExecuted("t1", "BTC", "USDT", "0.2", "59900", Party("alice", "bid-1"), Party("bob", "ask-1"),
                      "seller", "0.001", "0.002")
EVENTS = [
    DepositConfirmed("d1", "alice", "USDT", "40000"),
    WithdrawalRequested("w1", "alice", "BTC", "0.1", "0.0001"),
    WithdrawalCompleted("w1", "alice", "BTC", "0.1", "0.0001"),
    WithdrawalFailed("w1", "alice", "BTC"),
    OrderPlaced("bid-1", "alice", "buy", "BTC", "USDT", "0.5", "60000"),
    OrderPlaced("ask-1", "bob", "sell", "BTC", "USDT", "0.2", "59900"),
    TRADE,
    OrderClosed("bid-1", "alice", "buy", "BTC", "USDT"),
    FxConverted("x1", "alice", "USD", "EUR", "100.00", "0.92", "snap-1"),
    InternalTransfer("g1", "alice", "bob", "ETH", "0.000000000000000001"),
    DepositChargedBack("p1", "alice", "USD", "12.50", fronted="5"),
    TransferReturned("r1", "internal_transfer:g1", "alice", "bob", "USD", "2.50", kind="chargeback"),
]


def legs(p: rules.Plan) -> list[tuple[str, int, str | None]]:
    body = p.commands[0].record["body"][1]
    return [(leg["account_id"], int(leg["amount"]), leg["hold_id"]) for leg in body["legs"]]


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: type(e).__name__)
def test_every_rule_is_deterministic_encodable_and_versioned(event):
    first, again = plan(event), plan(event)
    assert first == again
    assert first.version == rules.RULE_VERSIONS[first.rule]
    for routed in first:
        routing_account, record = routed  # unpacks as a pair
        assert C.decode("command", C.encode("command", record)) == {**record, "body": record["body"]}
        assert record["command_id"].startswith(f"{first.rule}:") and record["client_id"] == "rules"
        name, body = record["body"]
        if name == "ledger.PostTransaction":
            assert body["transaction_id"] == record["command_id"]
            assert body["metadata"]["rule"] == first.rule
            assert body["metadata"]["rule_version"] == str(first.version)
            by_currency: dict[str, int] = {}
            for leg in body["legs"]:
                assert leg["amount"] != "0" and leg["currency"]
                by_currency[leg["currency"]] = by_currency.get(leg["currency"], 0) + int(leg["amount"])
            assert set(by_currency.values()) == {0}, by_currency


def test_ids_come_from_business_ids_and_attempts():
    assert plan(DepositConfirmed("tx-9", "alice", "BTC", 5)).command_ids == ["deposit_confirmed:tx-9"]
    assert plan(DepositConfirmed("tx-9", "alice", "BTC", 5, attempt=3)).command_ids == ["deposit_confirmed:tx-9#3"]
    hold = plan(OrderPlaced("o1", "alice", "sell", "BTC", "USDT", 5)).commands[0].record["body"][1]
    assert hold["hold_id"] == "order:o1"
    ctx = Context(client_id="exchange-a")
    assert plan(DepositConfirmed("d", "a", "USD", 1), ctx).commands[0].record["client_id"] == "exchange-a"


def test_bid_holds_qty_times_limit_price_exactly_across_scales():
    p = plan(OrderPlaced("b", "alice", "buy", "BTC", "USDT", "0.5", "60000"))
    assert p.commands[0].routing_account == "user:alice:USDT"
    assert p.commands[0].record["body"][1]["amount"] == str(30_000 * 10**6)
    p = plan(OrderPlaced("b", "alice", "buy", "ETH", "JPY", "0.000000000000000003", "1000000000000000000"))
    assert p.commands[0].record["body"][1]["amount"] == "3"
    p = plan(OrderPlaced("a", "alice", "sell", "BTC", "USDT", "0.5", "60000"))
    assert (p.commands[0].routing_account, p.commands[0].record["body"][1]["amount"]) == ("user:alice:BTC",
                                                                                       "50000000")


def test_trade_legs_and_fees():
    assert legs(plan(TRADE)) == [
        ("user:alice:USDT", -11_980_000_000, "order:bid-1"),
        ("user:bob:USDT", 11_968_020_000, None),       # seller is maker: 0.1 %
        ("sys:fees:USDT", 11_980_000, None),
        ("user:bob:BTC", -20_000_000, "order:ask-1"),
        ("user:alice:BTC", 19_960_000, None),          # buyer is taker: 0.2 %
        ("sys:fees:BTC", 40_000, None),
    ]


def test_trade_with_the_bot_has_plain_liquidity_legs_and_no_fee_for_the_bot():
    bot_sells = TradeExecuted("t", "BTC", "USDT", "1", "100", Party("alice", "b"), BOT, "seller",
                              "0.001", "0.001")
    assert legs(plan(bot_sells)) == [
        ("user:alice:USDT", -100_000_000, "order:b"), ("sys:liquidity:USDT", 100_000_000, None),
        ("sys:liquidity:BTC", -100_000_000, None), ("user:alice:BTC", 99_900_000, None),
        ("sys:fees:BTC", 100_000, None)]
    assert plan(bot_sells).commands[0].routing_account == "user:alice:USDT"


@pytest.mark.parametrize("rounding,fee", [("down", 0), ("up", 1)])
def test_fee_rounding_is_explicit(rounding, fee):
    # 1 satoshi at 100,000: the buyer's 0.1 % fee is 0.001 satoshi, the seller's 0.001 USDT fee 0.000001.
    event = TradeExecuted("t", "BTC", "USDT", 1, "100000", Party("a", "b"), Party("c", "d"), "seller", "0.001",
                          "0.001", fee_rounding=rounding)
    fee_legs = [leg for leg in legs(plan(event)) if leg[0] == "sys:fees:BTC"]
    assert fee_legs == ([("sys:fees:BTC", fee, None)] if fee else [])  # a zero fee is no leg
    assert ("user:a:BTC", 1 - fee, None) in legs(plan(event)) or fee == 1
    with pytest.raises(rules.InexactAmount):
        plan(TradeExecuted("t", "BTC", "USDT", 1, "100000", Party("a", "b"), Party("c", "d"), "seller", "0.001",
                           "0.001", fee_rounding="exact"))


def test_fx_converts_exactly_or_by_the_stated_rounding():
    p = plan(FxConverted("x", "alice", "USD", "EUR", "100.00", "0.92", "snap-1"))
    assert legs(p) == [("user:alice:USD", -10_000, None), ("sys:fx:USD", 10_000, None),
                       ("sys:fx:EUR", -9_200, None), ("user:alice:EUR", 9_200, None)]
    assert p.commands[0].record["body"][1]["rate_snapshot_id"] == "snap-1"
    with pytest.raises(rules.InexactAmount):
        plan(FxConverted("x", "alice", "USD", "EUR", "0.01", "0.92", "snap-1"))
    down = plan(FxConverted("x", "alice", "USD", "EUR", "1.01", "0.92", "snap-1", rounding="down"))
    assert legs(down)[2:] == [("sys:fx:EUR", -92, None), ("user:alice:EUR", 92, None)]  # 0.9292 -> 0.92
    assert down.commands[0].record["body"][1]["metadata"]["rounding"] == "down"
    up = plan(FxConverted("x", "alice", "USD", "EUR", "1.01", "0.92", "snap-1", rounding="up"))
    assert legs(up)[3] == ("user:alice:EUR", 93, None)
    with pytest.raises(rules.InvalidAmount):  # rounds to nothing
        plan(FxConverted("x", "alice", "USD", "EUR", "0.01", "0.92", "snap-1", rounding="down"))


@pytest.mark.parametrize("event,error", [
    (DepositConfirmed("d", "alice", "USDT", -5), rules.InvalidAmount),
    (DepositConfirmed("d", "alice", "USDT", 0), rules.InvalidAmount),
    (DepositConfirmed("d", "alice", "USDT", 1.5), rules.InvalidAmount),
    (DepositConfirmed("d", "alice", "USDT", True), rules.InvalidAmount),
    (DepositConfirmed("d", "alice", "USDT", "-5"), rules.InvalidAmount),
    (DepositConfirmed("d", "alice", "USD", "1.001"), rules.PrecisionExceeded),
    (DepositConfirmed("d", "alice", "XYZ", 5), rules.UnknownCurrency),
    (DepositConfirmed("", "alice", "USD", 5), rules.InvalidId),
    (DepositConfirmed("d#2", "alice", "USD", 5), rules.InvalidId),
    (DepositConfirmed("d", "al:ice", "USD", 5), rules.InvalidId),
    (DepositConfirmed("d", "alice", "USD", 5, attempt=0), rules.InvalidEvent),
    (DepositConfirmed("d", "alice", "USD", 5, occurred_at_ms=-1), rules.InvalidEvent),
    (OrderPlaced("o", "alice", "buy", "BTC", "USDT", "-0.1", "60000"), rules.InvalidAmount),
    (OrderPlaced("o", "alice", "buy", "BTC", "USDT", "0.1"), rules.InvalidEvent),
    (OrderPlaced("o", "alice", "buy", "BTC", "USDT", 1, "0.5"), rules.InexactAmount),
    (OrderPlaced("o", "alice", "buy", "BTC", "USDT", "0.1", "-1"), rules.InvalidAmount),
    (OrderPlaced("o", "alice", "buy", "BTC", "USDT", "0.1", "1e5"), rules.InvalidAmount),
    (OrderPlaced("o", "alice", "hold", "BTC", "USDT", "0.1", "1"), rules.InvalidEvent),
    (OrderPlaced("o", "alice", "sell", "BTC", "BTC", "0.1"), rules.InvalidEvent),
    (TradeExecuted("t", "BTC", "USDT", "0.1", "1", BOT, BOT, "seller"), rules.InvalidEvent),
    (TradeExecuted("t", "BTC", "USDT", "0.1", "1", Party("a"), BOT, "seller"), rules.InvalidId),
    (TradeExecuted("t", "BTC", "USDT", "0.1", "1", Party(None, "o"), Party("a", "o"), "seller"), rules.InvalidEvent),
    (TradeExecuted("t", "BTC", "USDT", "0.1", "1", Party("a", "o"), Party("b", "p"), "taker"), rules.InvalidEvent),
    (TradeExecuted("t", "BTC", "USDT", "0.1", "1", Party("a", "o"), Party("b", "p"), "seller", "2"),
     rules.InvalidAmount),
    (TradeExecuted("t", "BTC", "USDT", "0.1", "1", Party("a", "o"), Party("b", "p"), "buyer",
                   fee_rounding="nearest"), rules.InvalidEvent),
    (FxConverted("x", "alice", "USD", "USD", 5, "1", "s"), rules.InvalidEvent),
    (FxConverted("x", "alice", "USD", "EUR", 5, "1", ""), rules.InvalidId),
    (InternalTransfer("g", "alice", "alice", "USD", 5), rules.InvalidEvent),
    (TransferReturned("r", "internal_transfer:g", "alice", "alice", "USD", 5), rules.InvalidEvent),
    (TransferReturned("r", "internal_transfer:g", "alice", "bob", "USD", 5, kind="refund"), rules.InvalidEvent),
    (TransferReturned("r", "", "alice", "bob", "USD", 5), rules.InvalidId),
    (WithdrawalRequested("w", "alice", "USD", 5, fee=-1), rules.InvalidAmount),
])
def test_bad_events_raise_typed_errors(event, error):
    with pytest.raises(error) as info:
        plan(event)
    assert isinstance(info.value, rules.RuleError) and info.value.code and info.value.field


def test_next_attempt():
    e = WithdrawalCompleted("w", "a", "USD", 5)
    rejected = {"outcome": "rejected", "duplicate": False}
    assert rules.next_attempt(e, {**rejected, "reason": "unknown_hold"}).attempt == 2
    assert rules.next_attempt(e, {**rejected, "reason": "in_flight"}).attempt == 2  # remembered: a new attempt
    assert rules.next_attempt(e, {**rejected, "reason": "insufficient_funds"}) is None
    assert rules.next_attempt(e, {"outcome": "accepted", "reason": None}) is None


def test_rules_are_pure():
    """No I/O, clock, randomness or Kafka in the rules module: only the pure core, routing and the wire form of a
    command (streams/wire.py, which builds every command record)."""
    tree = ast.parse(pathlib.Path(rules.__file__).read_text())
    imported = {alias.name for n in ast.walk(tree) if isinstance(n, ast.Import) for alias in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    allowed = {"__future__", "dataclasses", "re", "typing", "streams", "streams.core.money",
               "streams.core.rejections", "streams.core.settlement", "streams.core.fx", "streams.core.returns", "streams.wire"}
    assert imported <= allowed, imported - allowed


def test_a_chargeback_of_a_settled_deposit_names_the_settlement_and_links_every_step():
    body = plan(DepositChargedBack("p1", "alice", "USD", "12.50", fronted="5", fronting_attempt=2,
                                   settlement_attempt=3, attempt=2)).commands[0].record["body"][1]
    assert body["transaction_id"] == "deposit_charged_back:p1#2"
    assert (body["kind"], body["reference"]) == ("chargeback", "p1")
    assert body["links"] == ["deposit_settled:p1#3", "deposit_initiated:p1", "deposit_fronted:p1#2"]
    assert body["metadata"]["ledger.returns"] == "deposit_settled:p1#3"
    assert (body["metadata"]["fronted"], body["metadata"]["deposit_id"]) == ("500", "p1")
    assert [(leg["account_id"], leg["amount"]) for leg in body["legs"]] == [
        ("user:alice:USD", "-1250"), ("sys:custody:USD", "1250")]
    unfronted = plan(DepositChargedBack("p1", "alice", "USD", 1)).commands[0].record["body"][1]
    assert unfronted["links"] == ["deposit_settled:p1", "deposit_initiated:p1"]
    with pytest.raises(rules.InvalidEvent) as bad:
        plan(DepositChargedBack("p1", "alice", "USD", 1, settlement_attempt=0))
    assert bad.value.field == "settlement_attempt"
    with pytest.raises(rules.InvalidAmount):
        plan(DepositChargedBack("p1", "alice", "USD", 0))
