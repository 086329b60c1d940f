"""Markets as data (connectors/markets.py): lot, tick, rounding per side, limit and market orders, through
real partition processors. The property: in every combination, a close releases exactly reserved - captured."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from connectors import rules
from connectors.markets import Market
from connectors.rules import Context, InexactAmount, OrderClosed, OrderPlaced, Party, TradeExecuted
from streams.core import DEFAULT_CURRENCIES
from tests.rules.scenario import Scenario

BTC_USDT = Market("BTC", "USDT", lot="0.00001", tick="0.01")  # a lot at a tick: 0.0000001 USDT, below 6 decimals
CTX = Context(markets=(BTC_USDT,))


def metadata(s: Scenario) -> dict:
    return s.last_plan.commands[0].record["body"][1]["metadata"]


def test_a_lot_at_a_tick_below_the_quotes_scale_is_reserved_paid_and_refunded_in_whole_units():
    s = (Scenario(CTX).users("alice", "bob")
         .deposit("d1", "alice", "USDT", "1")
         .deposit("d2", "bob", "BTC", "0.00001")
         # 0.00001 x 60000.01 = 0.6000001 USDT: reserved rounded up (0.600001) + one unit of margin per lot
         .order_placed("bid", "alice", "buy", "0.00001", "60000.01")
         .assert_balances({"alice:USDT": ("1", "0.600002")})
         .order_placed("ask", "bob", "sell", "0.00001", "60000.01")
         .trade("t1", "0.00001", "60000.01", buyer=("alice", "bid"), seller=("bob", "ask"))
         # the buyer pays 0.600001 (up), the seller receives 0.6 (down), the exchange keeps 0.000001
         .assert_balances({"alice:USDT": ("0.399999", "0.000001"), "alice:BTC": "0.00001",
                           "bob:USDT": "0.6", "bob:BTC": "0", "sys:rounding:USDT": "0.000001"}))
    assert {k: metadata(s)[k] for k in ("market", "notional", "buyer_pays", "seller_gets", "rounding_dust",
                                        "pay_rounding", "receive_rounding")} == {
        "market": "BTC/USDT", "notional": "6000001/10", "buyer_pays": "600001", "seller_gets": "600000",
        "rounding_dust": "1", "pay_rounding": "up", "receive_rounding": "down"}
    (s.order_closed("bid", "alice", "buy")             # the margin's unit comes back: reserved - paid
     .assert_balances({"alice:USDT": ("0.399999", "0")}))


def test_the_margin_covers_a_fill_rounded_up_in_every_lot():
    """3 lots at 33.33: exactly 0.0009999 USDT, reserved 0.001 + 3 units; three one-lot fills pay 0.000334
    each (0.001002 in all), which the rounded reservation alone (0.001) could not pay."""
    s = (Scenario(CTX).users("alice")
         .deposit("d1", "alice", "USDT", "1")
         .order_placed("bid", "alice", "buy", "0.00003", "33.33")
         .assert_balances({"alice:USDT": ("1", "0.001003")}))
    for n in range(3):
        s.trade(f"t{n}", "0.00001", "33.33", buyer=("alice", "bid"), seller="bot")
    (s.assert_hold("order:bid", "alice:USDT", "open", remaining="0.000001")
     .assert_balances({"sys:liquidity:USDT": "0.000999", "sys:rounding:USDT": "0.000003"})
     .order_closed("bid", "alice", "buy")
     .assert_balances({"alice:USDT": ("0.998998", "0"), "alice:BTC": "0.00003"}))


def test_a_market_buy_holds_its_budget_and_the_close_refunds_what_it_did_not_pay():
    s = (Scenario(CTX).users("alice")
         .deposit("d1", "alice", "USDT", "1000")
         .order_placed("mkt", "alice", "buy", "0.01", budget="700")
         .assert_balances({"alice:USDT": ("1000", "700")})
         .trade("t1", "0.004", "60000", buyer=("alice", "mkt"), seller="bot")     # 240
         .trade("t2", "0.006", "60500", buyer=("alice", "mkt"), seller="bot")     # 363
         .order_closed("mkt", "alice", "buy")                                     # 700 - 603 = 97 back
         .assert_balances({"alice:USDT": ("397", "0"), "alice:BTC": "0.01"}))
    assert s.bus.hold("order:mkt", "user:alice:USDT").released == 97_000000


@pytest.mark.parametrize("event, field", [
    (OrderPlaced("o", "alice", "buy", "BTC", "USDT", "0.000015", "60000"), "qty"),            # not whole lots
    (OrderPlaced("o", "alice", "buy", "BTC", "USDT", "0.00001", "60000.005"), "limit_price"),  # not whole ticks
    (TradeExecuted("t", "BTC", "USDT", "0.00001", "1.001", Party("a", "o"), Party(None), "seller"), "price"),
])
def test_quantities_and_prices_off_the_grid_are_refused(event, field):
    with pytest.raises(InexactAmount) as raised:
        rules.plan(event, CTX)
    assert raised.value.field == field


def test_market_orders_need_a_budget_and_only_market_buys_hold_one():
    with pytest.raises(rules.InvalidEvent):
        rules.plan(OrderPlaced("o", "alice", "buy", "BTC", "USDT", "1"), CTX)
    with pytest.raises(rules.InvalidEvent):
        rules.plan(OrderPlaced("o", "alice", "sell", "BTC", "USDT", "1", budget="5"), CTX)
    with pytest.raises(rules.InvalidEvent):  # a market whose buyer could pay less than its seller receives
        rules.plan(OrderPlaced("o", "a", "sell", "BTC", "USDT", "1"),
                   Context(markets=(Market("BTC", "USDT", "0.001", "1", pay_rounding="down", receive_rounding="up"),)))


# --- the property: every reserved unit is paid or returned ------------------------------------------------

PAIRS = [("BTC", "USDT"), ("ETH", "JPY"), ("BTC", "USD"), ("USDT", "JPY")]
ROUNDINGS = [("up", "down"), ("up", "up"), ("down", "down"), ("up", "exact")]


@st.composite
def cases(draw):
    base, quote = draw(st.sampled_from(PAIRS))
    bscale = DEFAULT_CURRENCIES.get(base).scale
    lot = draw(st.sampled_from([1, 3, 25])) * 10 ** draw(st.integers(0, min(bscale, 12)))  # minor units
    tick_digits = draw(st.integers(0, 4))
    tick = f"{draw(st.sampled_from([1, 5, 25]))}e-{tick_digits}"
    tick = str(int(tick.split("e-")[0])) if tick_digits == 0 else \
        "0." + str(int(tick.split("e-")[0])).rjust(tick_digits, "0") if len(tick.split("e-")[0]) <= tick_digits \
        else tick.split("e-")[0][:-tick_digits] + "." + tick.split("e-")[0][-tick_digits:]
    pay, receive = draw(st.sampled_from(ROUNDINGS))
    market = Market(base, quote, lot, tick, pay_rounding=pay, receive_rounding=receive)
    lots = draw(st.integers(1, 6))
    limit_ticks = draw(st.integers(1, 10**6))
    fills = draw(st.lists(st.integers(1, lots), min_size=1, max_size=4))
    kept, left = [], lots
    for n in fills:  # fill sizes in lots that never exceed the order
        if left:
            kept.append(min(n, left))
            left -= kept[-1]
    prices = [draw(st.integers(1, limit_ticks)) for _ in kept]
    return market, lots, limit_ticks, list(zip(kept, prices)), draw(st.booleans())


def price_of(market: Market, ticks: int) -> str:
    num, den = rules.ratio(market.tick, "tick")
    whole, rest = divmod(num * ticks, den)
    digits = len(str(den)) - 1
    return str(whole) if digits == 0 else f"{whole}.{str(rest).rjust(digits, '0')}"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_a_close_releases_exactly_reserved_minus_captured(case):
    market, lots, limit_ticks, fills, market_order = case
    base, quote = DEFAULT_CURRENCIES.get(market.base), DEFAULT_CURRENCIES.get(market.quote)
    ctx = Context(markets=(market,))
    qty = lots * market.lot
    limit = price_of(market, limit_ticks)
    try:
        reserved = market.reservation(qty, limit, base, quote)
        paid = [market.fill(n * market.lot, price_of(market, p), base, quote) for n, p in fills]
    except InexactAmount:
        assert "exact" in (market.pay_rounding, market.receive_rounding)  # only an exact market refuses
        event("inexact under exact rounding")
        return
    for (n, p), fill in zip(fills, paid):
        if fill.seller_gets == 0:  # below the quote's unit for the seller: refused, never rounded away
            event("a fill below one quote unit")
            with pytest.raises(rules.InvalidAmount):
                rules.plan(TradeExecuted("t", market.base, market.quote, n * market.lot, price_of(market, p),
                                         Party("a", "o"), Party(None), "seller"), ctx)
            return
    event("settled through the processors")
    s = Scenario(ctx, currencies=(market.base, market.quote)).users("alice")
    s.deposit("d1", "alice", market.quote, reserved)
    order = OrderPlaced("bid", "alice", "buy", market.base, market.quote, qty,
                        None if market_order else limit, budget=reserved if market_order else None)
    s.send(order)
    for i, ((n, p), fill) in enumerate(zip(fills, paid)):
        s.send(TradeExecuted(f"t{i}", market.base, market.quote, n * market.lot, price_of(market, p),
                             Party("alice", "bid"), Party(None), "seller"))
    total = sum(f.buyer_pays for f in paid)
    assert total <= reserved
    hold = s.bus.hold("order:bid", f"user:alice:{market.quote}")
    assert hold.captured == total
    s.send(OrderClosed("bid", "alice", "buy", market.base, market.quote),
           "accepted" if total < reserved else "hold_not_open")
    hold = s.bus.hold("order:bid", f"user:alice:{market.quote}")
    assert (hold.captured, hold.released) == (total, reserved - total)  # every reserved unit paid or returned
    assert s.balance(f"alice:{market.quote}") == (reserved - total, 0)
    assert s.balance(f"sys:rounding:{market.quote}")[0] == sum(f.dust for f in paid)
    assert s.balance(f"alice:{market.base}") == (sum(n for n, _ in fills) * market.lot, 0)


def test_markets_are_pure():
    """Like the rules: no I/O, clock or randomness."""
    import ast
    import pathlib

    from connectors import markets
    tree = ast.parse(pathlib.Path(markets.__file__).read_text())
    imported = {alias.name for n in ast.walk(tree) if isinstance(n, ast.Import) for alias in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported <= {"__future__", "dataclasses", "math", "typing", "connectors.rules", "streams.core.money"}


def test_each_sides_fee_is_rounded_as_the_market_says_and_recorded():
    """0.00003 BTC at 33.33 between two users, 0.1 % each: the seller receives 0.000999 USDT, its fee is
    0.000000999 (up: 0.000001); the buyer's fee of 0.00003 BTC is 0.00000003 (down: exact)."""
    market = Market("BTC", "USDT", lot="0.00001", tick="0.01", seller_fee_rounding="up")
    s = (Scenario(Context(markets=(market,))).users("alice", "bob")
         .deposit("d1", "alice", "USDT", "1")
         .deposit("d2", "bob", "BTC", "0.00003")
         .order_placed("bid", "alice", "buy", "0.00003", "33.33")
         .order_placed("ask", "bob", "sell", "0.00003", "33.33")
         .trade("t1", "0.00003", "33.33", buyer=("alice", "bid"), seller=("bob", "ask"), fees=("0.001", "0.001"))
         .assert_balances({"bob:USDT": "0.000998", "sys:fees:USDT": "0.000001", "alice:BTC": "0.00002997",
                           "sys:fees:BTC": "0.00000003", "sys:rounding:USDT": "0.000001"}))
    assert metadata(s)["fee_rounding"] == "buyer:down,seller:up"
