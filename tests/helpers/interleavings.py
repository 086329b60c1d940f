"""Driving the in-memory multi-partition bus (tests/helpers/bus.py) with the oracles (tests/helpers/oracles.py)
checking after every step, and the property test's generator: many commands of three traders in distinct
partitions (holds, trades that capture them, client captures, releases, transfers, freezes, retries), sent
without waiting while the bus delivers in seeded random orders with crashes (``run_interleaved``).
"""
from __future__ import annotations

import os
import random

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from schemas.codec import codec
from streams import placement, routing
from tests.helpers.bus import Bus
from tests.helpers.oracles import Oracles
from tests.helpers.records import N, batch, command, linked, local_users, open_account, transfer, tx
from tests.helpers.trade import BUYER_BTC, BUYER_USDT, SELLER_BTC, SELLER_USDT

C = codec()
CHAOS = {"max_records": 3, "crash_rate": 0.15, "restart_rate": 0.05}


def checked_bus(**options) -> tuple[Bus, Oracles]:
    bus = Bus(**options)
    return bus, Oracles(bus)


def funded_users(bus: Bus, oracles: Oracles, partitions: int = 3, per_partition: int = 2,
                 amount: int = 500) -> list[str]:
    """per_partition USD users in each of the first partitions, opened and given amount each, told to the
    oracles, delivered; returns them, partition by partition."""
    accounts = [a for p in range(partitions) for a in local_users(per_partition, partition=p)]
    for account in accounts:
        send(bus, oracles, open_account(account), account)
    for account in accounts:
        send(bus, oracles, transfer(f"dep:{account}", ("sys:world:USD", -amount), (account, amount)), account)
    bus.run()
    return accounts


# Two users in partition 0 and two in partition 1, for scenarios across two partitions.
X1, X2 = local_users(2, partition=0)
Y1, Y2 = local_users(2, partition=1)
EVERYONE = (X1, X2, Y1, Y2)


def funded_two_partitions() -> Bus:
    """X1 holds 1,000 in partition 0; X2 (partition 0), Y1 and Y2 (partition 1) are empty."""
    bus = Bus()
    for account in EVERYONE:
        bus.send(open_account(account), account)
    bus.send(transfer("dep", ("sys:world:USD", -1_000), (X1, 1_000)), X1)
    bus.run()
    return bus


def payee_with_a_reserved_credit() -> tuple[Bus, str, str]:
    """A transfer's copy has reserved a credit to the payee in partition 1; its coordinator has not read it."""
    payer, payee = local_users(1, 0)[0], local_users(1, 1)[0]
    bus = Bus()
    for account in (payer, payee):
        bus.send(open_account(account), account)
    bus.send(tx("dep", [("sys:world:USD", -100, None, None), (payer, 100, None, None)], "deposit"), payer)
    bus.run()
    bus.send_placed(tx("t0", [(payer, -10, None, None), (payee, 10, None, None)], "transfer"), payer)
    bus.step(1)
    return bus, payer, payee


def balances(bus: Bus) -> dict[str, tuple[int, int]]:
    """(posted, held) of each of EVERYONE."""
    return {a: bus.account(a) for a in EVERYONE}


def send(bus: Bus, oracles: Oracles, value: bytes, account: str, at_ms: int | None = None) -> int:
    oracles.sent_command(value)
    return bus.send(value, account, at_ms)


def step(bus: Bus, oracles: Oracles, partition: int, **options) -> None:
    bus.step(partition, **options)
    oracles.check_step()


def finish(bus: Bus, oracles: Oracles, seed: int) -> None:
    """Deliver everything in a random order with crashes, checking after every step, then once quiet."""
    bus.run_random(random.Random(seed), oracles.check_step, **CHAOS)
    oracles.check_quiet()



# --- many transactions in flight: the property test's generator and driver ----------------------------------

def _traders(count: int) -> list[str]:
    """Owners (routing keys) in distinct partitions, so every trade between two of them spans two."""
    found: dict[int, str] = {}
    for i in range(1000):
        found.setdefault(routing.partition_for_key(f"user:t{i}", N), f"user:t{i}")
        if len(found) == count:
            return list(found.values())
    raise AssertionError("not enough partitions")


TRADERS = _traders(3)
CURRENCIES = ("USDT", "BTC")
FUNDS = {"USDT": 1_000, "BTC": 100}  # small, so commands compete for them

trader = st.integers(0, len(TRADERS) - 1)
currency = st.sampled_from(CURRENCIES)
amount = st.integers(1, 400)
# Weighted towards holds and what contends for them: trades that capture them, client captures, releases.
hold_op = st.tuples(st.just("hold"), trader, currency, st.integers(50, 400), st.none() | st.integers(1, 40))
trade_op = st.tuples(st.just("trade"), trader, st.integers(1, len(TRADERS) - 1), st.integers(0, 99),
                     st.integers(0, 99), st.integers(1, 250), st.integers(1, 30))
capture_op = st.tuples(st.just("capture"), st.integers(0, 99), st.integers(1, 300), trader)
ops = st.one_of(
    hold_op, hold_op, trade_op, trade_op, trade_op, capture_op, capture_op,
    st.tuples(st.just("release"), st.integers(0, 99)),
    st.tuples(st.just("transfer"), trader, trader, currency, amount),
    st.tuples(st.just("freeze"), trader, currency, st.booleans()),
    st.tuples(st.just("retry"), st.integers(0, 99)),
    st.tuples(st.just("advance"), st.integers(1, 30)),
)


def scaled(n: int, cur: str) -> int:
    """An amount of 1..400 in USDT; a fifth of it in BTC (funds: 1,000 USDT, 100 BTC)."""
    return n if cur == "USDT" else max(1, n // 5)


class Producer:
    """Turns generated operations into commands, remembering holds and what was sent (for retries)."""

    def __init__(self):
        self.holds: list[tuple[str, str]] = []  # (hold id, account)
        self.sent: list[tuple[bytes, str]] = []  # (record, account it was sent to)
        self.count = 0

    def holds_on(self, account: str) -> list[str]:
        return [h for h, a in self.holds if a == account]

    def command(self, op: tuple, now_ms: int) -> tuple[bytes, str] | None:
        kind, *args = op
        self.count += 1
        cid = f"c{self.count}"
        if kind == "transfer":
            src, dst, cur, n = args
            n = scaled(n, cur)
            src_account, dst_account = f"{TRADERS[src]}:{cur}", f"{TRADERS[dst]}:{cur}"
            if src == dst:  # to the outside world instead
                dst_account = f"sys:world:{cur}"
            return tx(cid, [(src_account, -n, None, None), (dst_account, n, None, cur)], kind="transfer"), src_account
        if kind == "hold":
            who, cur, n, expires_in = args
            n = scaled(n, cur)
            account = f"{TRADERS[who]}:{cur}"
            hold_id = f"h{self.count}"
            self.holds.append((hold_id, account))
            expires = None if expires_in is None else now_ms + expires_in
            return command(f"hold:{hold_id}", "PlaceHold", {"hold_id": hold_id, "account_id": account,
                                                            "amount": str(n), "expires_at_ms": expires}), account
        if kind == "trade":
            buyer, offset, bid_pick, ask_pick, usdt, btc = args
            b, s = TRADERS[buyer], TRADERS[(buyer + offset) % len(TRADERS)]
            bids, asks = self.holds_on(f"{b}:USDT"), self.holds_on(f"{s}:BTC")
            # Mostly the standing order (the first hold of the account); a quarter of the legs without a hold.
            bid = bids[0 if bid_pick < 60 else bid_pick % len(bids)] if bids and bid_pick % 4 else None
            ask = asks[0 if ask_pick < 60 else ask_pick % len(asks)] if asks and ask_pick % 4 else None
            legs = [(f"{b}:USDT", -usdt, bid, None), (f"{s}:USDT", usdt, None, "USDT"),
                    (f"{s}:BTC", -btc, ask, None), (f"{b}:BTC", btc, None, "BTC")]
            return tx(cid, legs, kind="trade"), f"{b}:USDT"
        if kind == "capture":
            pick, n, dst = args
            if not self.holds:
                return None
            hold_id, account = self.holds[pick % (len(TRADERS) * 2) if pick < 60 else pick % len(self.holds)]
            cur = account.rsplit(":", 1)[1]
            n = scaled(n, cur)
            target = f"{TRADERS[dst]}:{cur}"
            if target == account:
                target = f"sys:fees:{cur}"
            return tx(cid, [(account, -n, hold_id, None), (target, n, None, cur)], kind="fill"), account
        if kind == "release":
            if not self.holds:
                return None
            hold_id, account = self.holds[args[0] % len(self.holds)]
            return command(f"release:{cid}", "ReleaseHold", {"hold_id": hold_id}), account
        if kind == "freeze":
            who, cur, freeze = args
            account = f"{TRADERS[who]}:{cur}"
            body = "FreezeAccount" if freeze else "UnfreezeAccount"
            return command(f"{body}:{cid}", body, {"account_id": account}), account
        if kind == "retry":
            if not self.sent:
                return None
            return self.sent[args[0] % len(self.sent)]
        raise AssertionError(kind)


def run_interleaved(operations: list[tuple], seed: int, follow_up_batches: bool,
                    changelog_cuts: str = "between_records", linking: bool = False) -> Bus:
    """Setup (quiet), then the operations sent without waiting: between sends the bus delivers 0-3 random
    batches; commands sent together go to a partition as one CommandBatch half the time. Every step is
    checked; once everything is sent the bus runs until quiet and the quiet checks run. linking: commands sent
    together go as one linked batch (60%), a plain one (20%) or one by one, never placed (as
    LedgerClient.linked() sends them); the random draws are the same as without it otherwise, so the
    explicit examples found by search keep their schedules."""
    rng = random.Random(seed)
    bus, oracles = checked_bus(batch_follow_ups=follow_up_batches, changelog_cuts=changelog_cuts)
    for t in TRADERS:
        for cur in CURRENCIES:
            account = f"{t}:{cur}"
            send(bus, oracles, open_account(account, cur), account)
    bus.run()
    for t in TRADERS:
        for cur in CURRENCIES:
            account = f"{t}:{cur}"
            send(bus, oracles, tx(f"dep:{account}", [(f"sys:world:{cur}", -FUNDS[cur], None, None),
                                                     (account, FUNDS[cur], None, None)], kind="deposit"), account)
    bus.run()
    # Standing orders: a bid (USDT) and an ask (BTC) per trader, which most trades and captures draw on; some
    # expire (log time) while the commands below are in flight.
    producer = Producer()
    for t in TRADERS:
        for side, cur, n in (("bid", "USDT", 300), ("ask", "BTC", 40)):
            expires = None if rng.random() < 0.5 else bus.clock + rng.randint(5, 80)
            hold_id = f"{side}:{t}"
            producer.holds.append((hold_id, f"{t}:{cur}"))
            send(bus, oracles, command(f"hold:{hold_id}", "PlaceHold", {
                "hold_id": hold_id, "account_id": f"{t}:{cur}", "amount": str(n), "expires_at_ms": expires}),
                f"{t}:{cur}")
    bus.run()
    oracles.check_quiet()
    window: list[tuple[bytes, str]] = []

    # Half the runs send as LedgerClient does: a transaction with debits in several partitions also goes, as
    # a copy, to each other partition it debits (placement.placements).
    placing = rng.random() < 0.5 and not linking

    def flush() -> None:
        by_partition: dict[int, list[tuple[bytes, str]]] = {}
        for value, account in window:
            partitions = [routing.partition_of_account(account, N)]
            if placing:
                record, partitions = placement.placements(C.decode("command", value), account, N)
                value = C.encode("command", record)
            for partition in partitions:
                by_partition.setdefault(partition, []).append((value, account))
        for partition, items in by_partition.items():
            for value, _ in items:
                oracles.sent_command(value)
            pick = rng.random() if len(items) > 1 else 1.0
            if linking and pick < 0.6:
                bus.send_to(partition, linked(*[v for v, _ in items]))
            elif pick < (0.8 if linking else 0.5):
                bus.send_to(partition, batch(*[v for v, _ in items]))
            else:
                for value, account in items:
                    bus.send_to(partition, value, key=routing.routing_key_for(account).encode())
        window.clear()

    for op in operations:
        if op[0] == "advance":
            bus.clock += op[1]
            continue
        made = producer.command(op, bus.clock)
        if made is None:
            continue
        producer.sent.append(made)
        window.append(made)
        deliveries = rng.choice((0, 0, 1, 2, 3))
        if deliveries:
            flush()
        for _ in range(deliveries):
            if not bus.tick(rng, **CHAOS):
                break
            oracles.check_step()
    flush()
    bus.run_random(rng, oracles.check_step, **CHAOS)
    oracles.check_quiet()
    return bus


EXAMPLES = int(os.environ.get("LEDGER_INTERLEAVING_EXAMPLES", "60"))
PROPERTY = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
operation_lists = st.lists(ops, min_size=15, max_size=40)


def fill(fill_id: str, btc: int) -> list[tuple]:
    """The buyer pays 59,900 USDT per BTC from the bid; the seller delivers `btc` satoshi from the ask."""
    usdt = btc * 59_900 * 10**6 // 10**8
    return [(BUYER_USDT, -usdt, "bid", None), (SELLER_USDT, usdt, None, "USDT"),
            (SELLER_BTC, -btc, "ask", None), (BUYER_BTC, btc, None, "BTC")]


def until_reserved(bus: Bus, oracles: Oracles, partition: int) -> None:
    while bus.pending(partition):
        step(bus, oracles, partition)
