"""DESIGN.md §8's worked example, run through the real broker and a real worker (`ledger demo`).

A buyer with 40,000 USDT places a limit bid for 0.5 BTC at 60,000 (a hold of 30,000 USDT). A resting ask of
0.2 BTC at 59,900 fills it partly: the buyer pays 11,980 USDT from the hold and gets 0.2 BTC minus a 0.1%
taker fee; the seller gets 11,980 USDT minus a 0.1% maker fee; both fees go to the exchange's fee account.
The buyer cancels the rest: the hold is released and 18,020 USDT comes back.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from connectors.client import LedgerClient, Leg
from streams import config, routing
from streams.config import Settings
from streams.core import DEFAULT_CURRENCIES, format_amount

USDT = 10**6  # minor units per USDT (scale 6)
BTC = 10**8  # minor units per BTC (scale 8)

BUYER_USDT, BUYER_BTC = "user:buyer:USDT", "user:buyer:BTC"
SELLER_USDT, SELLER_BTC = "user:seller:USDT", "user:seller:BTC"

# What the example must end with (minor units): account -> (posted, held).
EXPECTED = {
    BUYER_USDT: (28_020 * USDT, 0),
    BUYER_BTC: (19_980_000, 0),  # 0.2 BTC - 0.0002 taker fee
    SELLER_USDT: (11_968_020_000, 0),  # 11,980 - 11.98 maker fee
    SELLER_BTC: (0, 0),
    "sys:fees:USDT": (11_980_000, 0),
    "sys:fees:BTC": (20_000, 0),
    "sys:world:USDT": (-40_000 * USDT, 0),
    "sys:world:BTC": (-20_000_000, 0),
}


def run_example(client: LedgerClient, timeout_s: float = 60.0) -> list[dict]:
    """Send the example's commands, in order, each after the previous result. Returns the results."""
    steps = [
        lambda: client.open_account(BUYER_USDT, "USDT"),
        lambda: client.open_account(BUYER_BTC, "BTC"),
        lambda: client.open_account(SELLER_USDT, "USDT"),
        lambda: client.open_account(SELLER_BTC, "BTC"),
        lambda: client.post("deposit-buyer", [Leg("sys:world:USDT", -40_000 * USDT), Leg(BUYER_USDT, 40_000 * USDT)],
                            kind="deposit"),
        lambda: client.post("deposit-seller", [Leg("sys:world:BTC", -20_000_000), Leg(SELLER_BTC, 20_000_000)],
                            kind="deposit"),
        # Limit bid 0.5 BTC @ 60,000 USDT; resting ask 0.2 BTC.
        lambda: client.place_hold("order:bid-1", BUYER_USDT, 30_000 * USDT),
        lambda: client.place_hold("order:ask-1", SELLER_BTC, 20_000_000),
        # The fill at 59,900: one transaction capturing from both holds. The buyer and the seller live in
        # different partitions, so it is reserved in both before any leg posts (streams/spanning.py).
        lambda: client.post("fill-1", [
            Leg(BUYER_USDT, -11_980 * USDT, hold_id="order:bid-1"),
            Leg(SELLER_USDT, 11_968_020_000, currency="USDT"),
            Leg("sys:fees:USDT", 11_980_000),
            Leg(SELLER_BTC, -20_000_000, hold_id="order:ask-1"),
            Leg(BUYER_BTC, 19_980_000, currency="BTC"),
            Leg("sys:fees:BTC", 20_000),
        ], kind="trade", reference="order:bid-1"),
        # The buyer cancels the rest of the order: the remaining 18,020 USDT comes back.
        lambda: client.release_hold("order:bid-1", BUYER_USDT),
    ]
    results = []
    for step in steps:
        results.append(client.result(step(), timeout_s))
    return results


def final_balances(settings: Settings, accounts: list[str], timeout_s: float = 30.0) -> dict[str, tuple[int, int]]:
    """Latest (posted, held) per account from the balances topic; system accounts summed over shards."""
    from projections.fold import group_shards, sum_shards
    from projections.topics import latest_per_account, read_topic

    deadline = time.monotonic() + timeout_s
    while True:
        latest = latest_per_account(read_topic(settings, "balances"))
        views = {name: sum_shards(rows) for name, rows in group_shards(r.value for r in latest.values()).items()}
        totals = {name: (view["posted"], view["held"]) for name, view in views.items()}
        picked = {a: totals.get(a, (0, 0)) for a in accounts}
        # Credits to other partitions land a moment after their transaction's result: wait for them.
        if picked == {a: EXPECTED.get(a, picked[a]) for a in accounts} or time.monotonic() > deadline:
            return picked
        time.sleep(0.2)


def format_table(balances: dict[str, tuple[int, int]]) -> str:
    lines = [f"{'account':20} {'posted':>22} {'held':>18} {'available':>22}"]
    for account, (posted, held) in balances.items():
        currency = DEFAULT_CURRENCIES.get(routing.system_currency(account))
        lines.append(f"{account:20} {format_amount(posted, currency):>22} {format_amount(held, currency):>18} "
                     f"{format_amount(posted - held, currency):>22}")
    return "\n".join(lines)


def run_demo(keep_topics: bool = False) -> int:
    """Fresh topics, a worker of our own, the example, the balances table; 0 when every number matches."""
    from connectors.admin import create_topics, delete_topics

    base = config.load()
    settings = base.with_prefix(f"demo-{int(time.time())}.")
    create_topics(settings)
    data_dir = Path(tempfile.mkdtemp(prefix="ledger-demo-"))
    env = {**os.environ, "KAFKA_BOOTSTRAP": settings.bootstrap, "LEDGER_TOPIC_PREFIX": settings.prefix,
           "LEDGER_DATA_DIR": str(data_dir)}
    log = open(data_dir / "worker.log", "w")
    worker = subprocess.Popen([sys.executable, "-m", "connectors.cli", "worker"], env=env, stdout=log,
                              stderr=subprocess.STDOUT)
    client = None
    try:
        client = LedgerClient(settings, "demo")
        print(f"topics under prefix {settings.prefix!r} ({'kept' if keep_topics else 'deleted at the end'});"
              f" worker log {data_dir / 'worker.log'}")
        for result in run_example(client):
            status = result["outcome"] + (f" ({result['reason']}: {result['detail']})" if result["reason"] else "")
            print(f"  {result['command_id']:24} {status}")
        balances = final_balances(settings, list(EXPECTED))
        print()
        print(format_table(balances))
        sums: dict[str, int] = {}
        for account, (posted, _) in balances.items():
            cur = routing.system_currency(account)
            sums[cur] = sums.get(cur, 0) + posted
        print("\nsum per currency: " + ", ".join(f"{c} {s}" for c, s in sorted(sums.items())))
        wrong = {a: b for a, b in balances.items() if b != EXPECTED[a]}
        if wrong:
            print(f"MISMATCH: {wrong}")
            return 1
        print("every balance matches the worked example; the buyer has 28,020 USDT available and nothing held")
        return 0
    finally:
        if client is not None:
            client.close()
        worker.terminate()
        worker.wait(30)
        if not keep_topics:
            delete_topics(settings)
