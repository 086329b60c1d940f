"""Engine steps of the two-phase protocol (streams/spanning.py) written by hand, as someone forging them on the
commands topic would: what the worker must refuse or answer harmlessly (P11)."""
from __future__ import annotations

from streams.routing import ENGINE_CLIENT
from tests.helpers.records import command


def reserve(command_id: str, debtor: str, creditor: str, amount: str, coordinator: int,
            tx_client: str = "mallory", tx_command: str = "steal-1") -> bytes:
    body = {"transaction_client_id": tx_client, "transaction_command_id": tx_command,
            "coordinator_partition": coordinator,
            "transaction": {"transaction_id": tx_command, "kind": "transfer", "reference": None, "links": [],
                            "metadata": {}, "occurred_at_ms": None, "rate_snapshot_id": None,
                            "legs": [{"account_id": debtor, "amount": f"-{amount}" if amount.isdigit() else amount,
                                      "hold_id": None, "currency": None},
                                     {"account_id": creditor, "amount": amount, "hold_id": None,
                                      "currency": "USD"}]}}
    return command(command_id, "Reserve", body, client=ENGINE_CLIENT)


def decide(command_id: str, commit: bool, tx_client: str = "mallory", tx_command: str = "steal-1") -> bytes:
    return command(command_id, "Decide", {"transaction_client_id": tx_client, "transaction_command_id": tx_command,
                                          "commit": commit}, client=ENGINE_CLIENT)
