"""Transactions with debits in several partitions, across in-memory partition processors (no broker).

A small bus delivers the follow-up commands each processor emits to the processor of their partition, in
order, so the reserve / vote / decide protocol runs exactly as on Kafka, only faster and with control over
interleavings and redeliveries.
"""
from __future__ import annotations

from collections import defaultdict, deque

from schemas.codec import codec
from streams import routing
from streams.partition import PartitionProcessor
from streams.store import MemoryStore
from tests.engine.test_partition import command, place_hold

C = codec()
N = 8


class Bus:
    def __init__(self, duplicate_engine_commands: bool = False):
        self.procs = {p: PartitionProcessor(p, N, MemoryStore()) for p in range(N)}
        self.queues: dict[int, deque] = defaultdict(deque)
        self.offsets: dict[int, int] = defaultdict(int)
        self.results: list[dict] = []
        self.history: list[dict] = []
        self.duplicate = duplicate_engine_commands
        self.clock = 1_700_000_000_000

    def send(self, value: bytes, account: str) -> None:
        self.queues[routing.partition_of_account(account, N)].append(value)

    def step(self, partition: int) -> None:
        value = self.queues[partition].popleft()
        proc = self.procs[partition]
        self.clock += 1
        proc.handle(self.offsets[partition], self.clock, b"k", value)
        self.offsets[partition] += 1
        outputs, changelog = proc.take()
        proc.state.commit(self.offsets[partition])
        for o in outputs:
            if o.topic == "commands":
                copies = 2 if self.duplicate else 1
                for _ in range(copies):
                    self.queues[o.partition].append(o.value)
            elif o.topic == "results":
                self.results.append(C.decode("result", o.value))
            elif o.topic == "history":
                self.history.append(C.decode("history", o.value))

    def run(self) -> None:
        while any(self.queues.values()):
            for p in range(N):
                if self.queues[p]:
                    self.step(p)

    def result(self, command_id: str) -> dict:
        return next(r for r in self.results if r["command_id"] == command_id and not r["duplicate"])

    def account(self, account_id: str):
        if routing.is_system(account_id):
            shards = [self.procs[p].state.account(routing.shard_of(account_id, p)) for p in range(N)]
            return sum(a.posted for a in shards if a), sum(a.held for a in shards if a)
        a = self.procs[routing.partition_of_account(account_id, N)].state.account(account_id)
        return a.posted, a.held

    def hold(self, hold_id: str, account_id: str):
        return self.procs[routing.partition_of_account(account_id, N)].state.hold(hold_id)


def tx(tx_id: str, legs: list[tuple], kind: str = "trade") -> bytes:
    return command(tx_id, "PostTransaction", {
        "transaction_id": tx_id, "kind": kind, "reference": None, "links": [], "metadata": {},
        "occurred_at_ms": None, "rate_snapshot_id": None,
        "legs": [{"account_id": a, "amount": str(x), "hold_id": h, "currency": c} for a, x, h, c in legs]})


BUYER_USDT, BUYER_BTC, SELLER_USDT, SELLER_BTC = "user:b:USDT", "user:b:BTC", "user:s:USDT", "user:s:BTC"


def setup_trade(bus: Bus, ask: int = 20_000_000) -> None:
    assert routing.partition_of_account(BUYER_USDT, N) != routing.partition_of_account(SELLER_USDT, N)
    for account, currency in ((BUYER_USDT, "USDT"), (BUYER_BTC, "BTC"), (SELLER_USDT, "USDT"), (SELLER_BTC, "BTC")):
        bus.send(command(f"open:{account}", "OpenAccount", {
            "account_id": account, "currency": currency, "allow_negative": False, "overdraft_limit": "0",
            "max_balance": None, "routing_key": None}), account)
    bus.run()
    bus.send(tx("dep-b", [("sys:world:USDT", -40_000_000_000, None, None), (BUYER_USDT, 40_000_000_000, None, None)]),
             BUYER_USDT)
    bus.send(tx("dep-s", [("sys:world:BTC", -20_000_000, None, None), (SELLER_BTC, 20_000_000, None, None)]),
             SELLER_BTC)
    bus.run()
    bus.send(place_hold("bid", BUYER_USDT, 30_000_000_000, None), BUYER_USDT)
    bus.send(place_hold("ask", SELLER_BTC, ask, None), SELLER_BTC)
    bus.run()


TRADE = [(BUYER_USDT, -11_980_000_000, "bid", None), (SELLER_USDT, 11_968_020_000, None, "USDT"),
         ("sys:fees:USDT", 11_980_000, None, None), (SELLER_BTC, -20_000_000, "ask", None),
         (BUYER_BTC, 19_980_000, None, "BTC"), ("sys:fees:BTC", 20_000, None, None)]


def assert_books_balance(bus: Bus) -> None:
    for currency in ("USDT", "BTC"):
        total = sum(a.posted for p in bus.procs.values() for a in _accounts(p) if a.currency == currency)
        assert total == 0, f"{currency} sums to {total}"
        clearing = bus.account(f"sys:clearing:{currency}")
        assert clearing == (0, 0), f"{currency} left in clearing: {clearing}"
    for p in bus.procs.values():
        assert not [k for k in p.state.store.data if k.startswith(b"e/")], "engine records left behind"


def _accounts(proc):
    import json
    from streams.wire import account_from_record
    return [account_from_record(json.loads(v)) for k, v in proc.state.store.scan(b"a/")]


def test_a_trade_with_debits_in_two_partitions_posts_atomically():
    bus = Bus()
    setup_trade(bus)
    bus.send(tx("fill-1", TRADE), BUYER_USDT)
    bus.run()
    assert bus.result("fill-1")["outcome"] == "accepted"
    assert bus.account(BUYER_USDT) == (28_020_000_000, 18_020_000_000)
    assert bus.account(SELLER_USDT) == (11_968_020_000, 0)
    assert bus.account(BUYER_BTC) == (19_980_000, 0)
    assert bus.account(SELLER_BTC) == (0, 0)
    assert bus.account("sys:fees:USDT") == (11_980_000, 0)
    assert bus.hold("ask", SELLER_BTC).status.value == "captured"
    bus.send(command("release:bid", "ReleaseHold", {"hold_id": "bid"}), BUYER_USDT)
    bus.run()
    assert bus.account(BUYER_USDT) == (28_020_000_000, 0)
    assert_books_balance(bus)


def test_if_one_partition_cannot_reserve_nothing_posts_anywhere():
    bus = Bus()
    setup_trade(bus, ask=10_000_000)  # the ask hold is too small for the fill
    bus.send(tx("fill-1", TRADE), BUYER_USDT)
    bus.run()
    result = bus.result("fill-1")
    assert (result["outcome"], result["reason"]) == ("rejected", "capture_exceeds_hold")
    assert bus.account(BUYER_USDT) == (40_000_000_000, 30_000_000_000), "the buyer's hold is untouched"
    assert bus.hold("bid", BUYER_USDT).remaining == 30_000_000_000
    assert bus.account(SELLER_USDT) == (0, 0)
    assert not [h for h in bus.history if h["transaction_id"] and h["transaction_id"].startswith("fill-1")]
    assert_books_balance(bus)


def test_plain_debits_in_two_partitions_are_reserved_then_captured_or_released():
    bus = Bus()
    setup_trade(bus, ask=10_000_000)  # leaves 0.1 BTC of the seller's available
    split = [(BUYER_USDT, -100, None, None), (SELLER_BTC, -5, None, None),
             (SELLER_USDT, 100, None, "USDT"), (BUYER_BTC, 5, None, "BTC")]
    bus.send(tx("swap", split, kind="swap"), BUYER_USDT)
    too_much = [(BUYER_USDT, -100, None, None), (SELLER_BTC, -10**12, None, None),
                (SELLER_USDT, 100, None, "USDT"), (BUYER_BTC, 10**12, None, "BTC")]
    bus.send(tx("greedy", too_much, kind="swap"), BUYER_USDT)
    bus.run()
    assert bus.result("swap")["outcome"] == "accepted"
    assert bus.result("greedy")["reason"] == "insufficient_funds"
    assert bus.account(BUYER_USDT) == (40_000_000_000 - 100, 30_000_000_000)
    assert bus.account(BUYER_BTC) == (5, 0)
    assert bus.account(SELLER_BTC) == (20_000_000 - 5, 10_000_000)
    assert_books_balance(bus)


def test_redelivered_protocol_messages_change_nothing():
    bus = Bus(duplicate_engine_commands=True)
    setup_trade(bus)
    bus.send(tx("fill-1", TRADE), BUYER_USDT)
    bus.run()
    assert bus.account(BUYER_USDT) == (28_020_000_000, 18_020_000_000)
    assert bus.account(SELLER_USDT) == (11_968_020_000, 0)
    assert bus.account(BUYER_BTC) == (19_980_000, 0)
    assert_books_balance(bus)


def test_a_locked_hold_cannot_be_released_while_the_transaction_is_in_flight():
    bus = Bus()
    setup_trade(bus)
    seller_p = routing.partition_of_account(SELLER_BTC, N)
    buyer_p = routing.partition_of_account(BUYER_USDT, N)
    bus.send(tx("fill-1", TRADE), BUYER_USDT)
    bus.step(buyer_p)  # coordinator: begin, Reserve sent to both partitions
    while bus.queues[seller_p]:
        bus.step(seller_p)  # the seller's partition reserves (locks the ask hold) and votes
    bus.send(command("release:ask", "ReleaseHold", {"hold_id": "ask"}), SELLER_BTC)
    bus.send(command("freeze:s", "FreezeAccount", {"account_id": SELLER_BTC}), SELLER_BTC)
    bus.step(seller_p)
    bus.step(seller_p)
    assert bus.result("release:ask")["reason"] == "in_flight"
    assert bus.result("freeze:s")["reason"] == "in_flight"
    bus.run()
    assert bus.result("fill-1")["outcome"] == "accepted"
    assert bus.hold("ask", SELLER_BTC).status.value == "captured"
    assert_books_balance(bus)


def test_a_retry_redone_after_a_crash_is_answered_once_when_decided():
    bus = Bus()
    setup_trade(bus)
    coordinator = routing.partition_of_account(BUYER_USDT, N)
    bus.send(tx("fill-1", TRADE), BUYER_USDT)
    bus.step(coordinator)  # begun: reservations in flight
    retry = tx("fill-1", TRADE)
    proc = bus.procs[coordinator]
    offset = bus.offsets[coordinator]
    for _ in range(2):  # the retry, then the same record again as a restarted worker redoes it
        proc.handle(offset, bus.clock, b"k", retry)
        proc.take()
        proc.state.commit(offset + 1)
    bus.offsets[coordinator] = offset + 1
    bus.run()
    answers = [r for r in bus.results if r["command_id"] == "fill-1"]
    assert [(r["outcome"], r["duplicate"]) for r in answers] == [("accepted", False), ("accepted", True)]
