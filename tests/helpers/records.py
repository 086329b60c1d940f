"""Encoded command records, as a producer writes them to the commands topic."""
from __future__ import annotations

from schemas.codec import codec
from streams import routing
from streams.wire import command_record

C = codec()
N = 8  # partitions of the tests' ledger
T0 = 1_700_000_000_000  # log time where the tests that drive a PartitionProcessor by hand start


def command(command_id: str, body_name: str, body: dict, client: str = "t") -> bytes:
    return C.encode("command", command_record(client, command_id, body_name, body))


def open_account(account: str, currency: str = "USD", client: str = "t", max_balance: int | None = None) -> bytes:
    return command(f"open:{account}", "OpenAccount", {"account_id": account, "currency": currency,
                                                     "allow_negative": False, "overdraft_limit": "0",
                                                     "max_balance": None if max_balance is None else str(max_balance),
                                                     "routing_key": None}, client)


def transfer(tx: str, *legs: tuple[str, int], hold: str | None = None) -> bytes:
    return command(tx, "PostTransaction", {
        "transaction_id": tx, "kind": "transfer", "reference": None, "links": [], "metadata": {},
        "occurred_at_ms": None, "rate_snapshot_id": None,
        "legs": [{"account_id": a, "amount": str(x), "hold_id": hold if x < 0 else None, "currency": None}
                 for a, x in legs]})


def tx(tx_id: str, legs: list[tuple], kind: str = "trade", client: str = "t") -> bytes:
    """A PostTransaction; legs are (account, amount, hold id or None, currency or None)."""
    return command(tx_id, "PostTransaction", {
        "transaction_id": tx_id, "kind": kind, "reference": None, "links": [], "metadata": {},
        "occurred_at_ms": None, "rate_snapshot_id": None,
        "legs": [{"account_id": a, "amount": str(x), "hold_id": h, "currency": c} for a, x, h, c in legs]},
        client)


def place_hold(hold: str, account: str, amount: int, expires_at_ms: int | None, client: str = "t") -> bytes:
    return command(f"hold:{hold}", "PlaceHold", {"hold_id": hold, "account_id": account, "amount": str(amount),
                                                "expires_at_ms": expires_at_ms}, client)


def batch(*values: bytes) -> bytes:
    return C.encode("command_batch", {"commands": list(values)})


def linked(*values: bytes) -> bytes:
    """A linked CommandBatch: its commands take effect all together or not at all."""
    return C.encode("command_batch", {"commands": list(values), "linked": True})


def local_users(count: int, partition: int = 0) -> list[str]:
    users = (f"user:{i}:USD" for i in range(10_000))
    return [u for u in users if routing.partition_of_account(u, N) == partition][:count]
