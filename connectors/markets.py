"""Markets as data: a trading pair's lot, tick, and how each amount a fill or a reservation moves is rounded.

Pure, like the rules (no I/O, clock or randomness). A ``Market`` is registered in the rules' ``Context``
(``Context(markets=(Market("BTC", "USDT", lot="0.00001", tick="0.01"),))``); the order and trade rules then
use it for that pair (docs/rules.md, "Markets"). Without one, a pair keeps the exact arithmetic (an inexact
product is ``InexactAmount``).

Why rounding is needed at all: a lot of 0.00001 BTC at a tick of 0.01 USDT is a notional of 0.0000001 USDT,
below USDT's 6 decimals. Each side's amount is rounded in its own direction, and the difference stays
with the exchange, on ``sys:rounding:<quote>`` (``rules.rounding_account``):

* the buyer pays the notional rounded ``pay_rounding`` (default up),
* the seller receives it rounded ``receive_rounding`` (default down),
* each side's fee is rounded ``buyer_fee_rounding`` / ``seller_fee_rounding`` (default down: never more than
  the rate; the event's own ``fee_rounding`` applies only to a pair without a market),
* a limit buy reserves qty x limit rounded ``reserve_rounding`` (default up) plus a margin of one minor unit per
  lot when a lot at a tick is not a whole number of quote minor units: a fill pays at most one unit more than
  its exact notional, an order fills in at most qty / lot fills, so the fills never exceed the reservation
  (what is left returns at the close). A market whose lot x tick is whole needs no rounding and no margin.

Every amount is an int of minor units and every price an exact fraction: nothing here is a float.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from math import gcd

from connectors.rules import (
    Amount,
    InexactAmount,
    InvalidEvent,
    Rounding,
    UnknownCurrency,
    _divide as divide,
    ratio,
    to_minor,
)
from streams.core.money import Currency, CurrencyRegistry

_ROUNDINGS = ("exact", "down", "up")


class Fill(NamedTuple):
    """What one fill moves in quote minor units, and the exact notional it was rounded from."""

    buyer_pays: int
    seller_gets: int
    dust: int  # buyer_pays - seller_gets, to rules.rounding_account(quote)
    notional: tuple[int, int]  # exact, in quote minor units: numerator, denominator (reduced)


@dataclass(frozen=True, slots=True)
class Market:
    """A trading pair: quantities in lots of base, prices in ticks of quote per one base unit."""

    base: str
    quote: str
    lot: Amount  # the quantity step, in base (decimal string in major units, or int minor units)
    tick: str | int  # the price step, quote per one base unit, as an exact decimal
    reserve_rounding: Rounding = "up"  # a limit buy's reservation of qty x limit: up (or exact)
    pay_rounding: Rounding = "up"  # what the buyer pays of an inexact notional
    receive_rounding: Rounding = "down"  # what the seller receives of it
    buyer_fee_rounding: Rounding = "down"  # the buyer's fee (in base): never more than its rate
    seller_fee_rounding: Rounding = "down"  # the seller's fee (in quote, of what it receives)

    @property
    def symbol(self) -> str:
        return f"{self.base}/{self.quote}"

    def currencies(self, registry: CurrencyRegistry) -> tuple[Currency, Currency]:
        base, quote = registry.get(self.base), registry.get(self.quote)
        if base is None or quote is None:
            raise UnknownCurrency("market", f"market {self.symbol} names an unregistered currency")
        for field in ("reserve_rounding", "pay_rounding", "receive_rounding", "buyer_fee_rounding",
                      "seller_fee_rounding"):
            if getattr(self, field) not in _ROUNDINGS:
                raise InvalidEvent(f"market.{field}", f"must be one of {_ROUNDINGS}")
        if self.reserve_rounding == "down":
            raise InvalidEvent("market.reserve_rounding", "a reservation rounded down could not pay its fills")
        if (self.pay_rounding, self.receive_rounding) in (("down", "up"), ("down", "exact"), ("exact", "up")):
            raise InvalidEvent("market.pay_rounding", "the buyer would pay less than the seller receives")
        return base, quote

    def lot_minor(self, base: Currency) -> int:
        return to_minor(self.lot, base, "market.lot")

    def lots(self, qty_minor: int, base: Currency, field: str = "qty") -> int:
        """How many lots qty is; InexactAmount unless a whole number of them."""
        lots, rest = divmod(qty_minor, self.lot_minor(base))
        if rest:
            raise InexactAmount(field, f"{qty_minor} minor units of {base.code} is not a multiple of the lot {self.lot}")
        return lots

    def price(self, value: Any, field: str) -> tuple[int, int]:
        """The price as an exact fraction; InexactAmount unless a whole number of ticks."""
        num, den = ratio(value, field)
        tick_num, tick_den = ratio(self.tick, "market.tick")
        if (num * tick_den) % (den * tick_num):
            raise InexactAmount(field, f"{value} is not a multiple of the tick {self.tick}")
        return num, den

    def notional(self, qty_minor: int, price: tuple[int, int], base: Currency,
                 quote: Currency) -> tuple[int, int]:
        """qty x price in quote minor units, exactly, as a reduced fraction."""
        num = qty_minor * price[0] * 10**quote.scale
        den = price[1] * 10**base.scale
        g = gcd(num, den)
        return num // g, den // g

    def margin(self, qty_minor: int, base: Currency, quote: Currency) -> int:
        """The reservation's margin for the buyer's per-fill rounding: one minor unit per lot, unless a lot at a
        tick is a whole number of quote minor units (then no fill is ever rounded) or fills round down."""
        if self.pay_rounding != "up":
            return 0
        num, den = self.notional(self.lot_minor(base), ratio(self.tick, "market.tick"), base, quote)
        return 0 if den == 1 else self.lots(qty_minor, base)

    def reservation(self, qty_minor: int, limit: Any, base: Currency, quote: Currency) -> int:
        """What a limit buy of qty at limit holds: qty x limit rounded, plus the margin."""
        self.lots(qty_minor, base)
        num, den = self.notional(qty_minor, self.price(limit, "limit_price"), base, quote)
        return divide(num, den, self.reserve_rounding, "limit_price") + self.margin(qty_minor, base, quote)

    def fill(self, qty_minor: int, price: Any, base: Currency, quote: Currency) -> Fill:
        self.lots(qty_minor, base)
        notional = self.notional(qty_minor, self.price(price, "price"), base, quote)
        pays = divide(*notional, self.pay_rounding, "price")
        gets = divide(*notional, self.receive_rounding, "price")
        return Fill(pays, gets, pays - gets, notional)


def find(markets: tuple[Market, ...], base: str, quote: str) -> Market | None:
    """The market registered for the pair, if any."""
    for market in markets:
        if market.base == base and market.quote == quote:
            return market
    return None
