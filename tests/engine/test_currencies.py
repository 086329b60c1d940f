"""Currencies registered at runtime, through real partition processors (the in-memory bus, no Kafka): refused
until the partition has decided its RegisterCurrency, then exact at their scale, across partitions, and still
known after a restore from the changelog alone."""
from __future__ import annotations

from schemas.codec import codec
from streams import routing
from tests.helpers.bus import Bus
from tests.helpers.records import N

C = codec()
ANN, BOB = "user:ann:XAU", "user:bob:XAU"  # two partitions


def command(command_id: str, name: str, body: dict) -> bytes:
    return C.encode("command", {"command_id": command_id, "client_id": "vault", "body": (f"ledger.{name}", body)})


def open_(account: str) -> bytes:
    return command(f"open:{account}", "OpenAccount", {"account_id": account, "currency": "XAU", "allow_negative": False,
                                                     "overdraft_limit": "0", "max_balance": None, "routing_key": None})


def post(tx: str, *legs: tuple[str, int]) -> bytes:
    return command(tx, "PostTransaction", {"transaction_id": tx, "kind": "transfer", "reference": None, "links": [],
                                           "metadata": {}, "occurred_at_ms": None, "rate_snapshot_id": None,
                                           "legs": [{"account_id": a, "amount": str(v), "hold_id": None,
                                                     "currency": "XAU"} for a, v in legs]})


def outcome(bus: Bus, command_id: str) -> str:
    result = bus.result(command_id)
    return result["outcome"] if result["outcome"] == "accepted" else result["reason"]


def test_a_currency_registered_in_every_partition_then_used_across_them():
    assert routing.partition_of_account(ANN, N) != routing.partition_of_account(BOB, N)
    bus = Bus()
    bus.send(open_(ANN), ANN)
    bus.run()
    assert outcome(bus, f"open:{ANN}") == "unknown_currency"
    for p in range(N):  # what LedgerClient.register_currency sends
        bus.send_to(p, command(f"currency:XAU@{p}", "RegisterCurrency", {"currency": "XAU", "scale": 3}))
    bus.send_to(0, command("currency:XAU-again@0", "RegisterCurrency", {"currency": "XAU", "scale": 4}))
    bus.run()
    assert [outcome(bus, f"currency:XAU@{p}") for p in range(N)] == ["accepted"] * N
    assert outcome(bus, "currency:XAU-again@0") == "currency_conflict"
    for account in (ANN, BOB):
        bus.send(command(f"open2:{account}", "OpenAccount", {
            "account_id": account, "currency": "XAU", "allow_negative": False, "overdraft_limit": "0",
            "max_balance": None, "routing_key": None, "account_type": None}), account)
    bus.send(post("dep-1", ("sys:custody:XAU", -2_500), (ANN, 2_500)), ANN)     # 2.500 XAU
    bus.send(post("pay-1", (ANN, -1_250), (BOB, 1_250)), ANN)                  # through clearing to bob
    bus.run()
    assert [outcome(bus, c) for c in ("open2:" + ANN, "open2:" + BOB, "dep-1", "pay-1")] == ["accepted"] * 4
    assert (bus.account(ANN), bus.account(BOB), bus.account("sys:custody:XAU")) == ((1_250, 0), (1_250, 0),
                                                                                    (-2_500, 0))
    # A worker that restarts from the changelog alone still knows XAU (the registration is in its redo log).
    bob_partition = routing.partition_of_account(BOB, N)
    bus.crash_restore(bob_partition, fresh_store=True)
    assert bus.procs[bob_partition].currencies.get("XAU").scale == 3
    bus.send(post("pay-2", (BOB, -250), (ANN, 250)), BOB)
    bus.run()
    assert outcome(bus, "pay-2") == "accepted" and bus.account(BOB) == (1_000, 0)
