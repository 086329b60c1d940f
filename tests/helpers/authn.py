"""Signed commands on the test bus (streams/authn.py): the clients file the tests use, a signing producer, and
a funded pair of accounts."""
from __future__ import annotations

from streams import routing
from streams.authn import Signer
from tests.helpers.bus import Bus, Record
from tests.helpers.records import N, command, local_users, open_account

TOPIC = "commands"
CLIENTS = {"clients": {
    "wallet": {"key": "wallet-secret", "old_keys": ["wallet-old"], "debit": ["user:*", "sys:world:*"],
               "credit": ["*"], "open": ["user:*"], "hold": ["user:*"]},
    "reader": {"key": "reader-secret"},  # may do nothing
}}
WALLET = Signer("wallet", b"wallet-secret")


def send(bus: Bus, value: bytes, account: str, signer: Signer | None = WALLET) -> int:
    partition = routing.partition_of_account(account, N)
    headers = () if signer is None else tuple(signer.headers(TOPIC, partition, value))
    bus.clock += 1
    bus.logs[partition].append(Record(bus.clock, routing.routing_key_for(account).encode(), value, headers))
    return partition


def results(bus: Bus, command_id: str) -> list[tuple[str, str | None, bool]]:
    return [(r["outcome"], r["reason"], r["duplicate"]) for r in bus.results if r["command_id"] == command_id]


A, B = local_users(2)


def funded(bus: Bus) -> None:
    for account in (A, B):
        send(bus, open_account(account, client="wallet"), account)
    send(bus, wallet_tx("dep", ("sys:world:USD", -1_000), (A, 1_000)), A)
    bus.run()
    assert results(bus, "dep") == [("accepted", None, False)]


def _tx(tx_id: str, *legs: tuple[str, int]) -> dict:
    return {"transaction_id": tx_id, "kind": "transfer", "reference": None, "links": [], "metadata": {},
            "occurred_at_ms": None, "rate_snapshot_id": None,
            "legs": [{"account_id": a, "amount": str(x), "hold_id": None, "currency": None} for a, x in legs]}


def wallet_tx(tx_id: str, *legs: tuple[str, int], client: str = "wallet") -> bytes:
    return command(tx_id, "PostTransaction", _tx(tx_id, *legs), client)
