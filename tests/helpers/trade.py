"""The exchange example of DESIGN.md §8 on the bus: a buyer and a seller in two partitions, each with a hold
(the buyer's bid in USDT, the seller's ask in BTC), and a fill whose debits capture both holds."""
from __future__ import annotations

from streams import routing
from tests.helpers.bus import Bus
from tests.helpers.records import N, command, place_hold, tx

BUYER_USDT, BUYER_BTC, SELLER_USDT, SELLER_BTC = "user:b:USDT", "user:b:BTC", "user:s:USDT", "user:s:BTC"
BUYER_P = routing.partition_of_account(BUYER_USDT, N)  # the coordinator of TRADE
SELLER_P = routing.partition_of_account(SELLER_BTC, N)

# 0.2 BTC at 59,900 USDT: the buyer pays 11,980 USDT from the bid, the seller delivers 0.2 BTC from the ask.
TRADE = [(BUYER_USDT, -11_980_000_000, "bid", None), (SELLER_USDT, 11_968_020_000, None, "USDT"),
         ("sys:fees:USDT", 11_980_000, None, None), (SELLER_BTC, -20_000_000, "ask", None),
         (BUYER_BTC, 19_980_000, None, "BTC"), ("sys:fees:BTC", 20_000, None, None)]


def open_account(account: str, currency: str) -> bytes:
    return command(f"open:{account}", "OpenAccount", {
        "account_id": account, "currency": currency, "allow_negative": False, "overdraft_limit": "0",
        "max_balance": None, "routing_key": None})


def setup_trade(bus: Bus, ask: int = 20_000_000, ask_expires_at_ms: int | None = None,
                seller_btc: int = 20_000_000) -> None:
    """Open the four accounts, fund the buyer (40,000 USDT) and the seller (`seller_btc` satoshi, 0.2 BTC),
    place the bid (30,000 USDT) and the ask (`ask` satoshi); the bus is quiet afterwards."""
    assert BUYER_P != SELLER_P
    for account, currency in ((BUYER_USDT, "USDT"), (BUYER_BTC, "BTC"), (SELLER_USDT, "USDT"), (SELLER_BTC, "BTC")):
        bus.send(open_account(account, currency), account)
    bus.run()
    bus.send(tx("dep-b", [("sys:world:USDT", -40_000_000_000, None, None), (BUYER_USDT, 40_000_000_000, None, None)]),
             BUYER_USDT)
    bus.send(tx("dep-s", [("sys:world:BTC", -seller_btc, None, None), (SELLER_BTC, seller_btc, None, None)]),
             SELLER_BTC)
    bus.run()
    bus.send(place_hold("bid", BUYER_USDT, 30_000_000_000, None), BUYER_USDT)
    bus.send(place_hold("ask", SELLER_BTC, ask, ask_expires_at_ms), SELLER_BTC)
    bus.run()
