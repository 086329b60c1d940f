"""What the read API answers: store rows as JSON-ready bodies (amounts exact, formatted at the currency's
scale) and its errors (ApiError, answered as `{"error": {"code", "message"}}` by projections/api.py).

Pure formatting plus the two checks every account route makes first; the queries are the store's
(projections/store.py) and the routes are projections/routes.py.
"""
from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, Field

from connectors.rules import RULE_KEY, RULE_VERSION_KEY
from projections import fold
from projections.metrics import money
from projections.store import Store
from streams import routing


class ErrorDetail(BaseModel):
    code: str = Field(description="Stable machine-readable code, e.g. unknown_account")
    message: str = Field(description="What went wrong, for a person")


class ErrorBody(BaseModel):
    error: ErrorDetail


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for the error answers a route really gives (all with the ErrorBody shape)."""
    text = {400: "sharded_account", 404: "unknown_account, unknown_transaction, unknown_command or unknown_seq",
            409: "ambiguous_transaction (several clients use the id: ask with client_id)", 422: "invalid_parameter", 503: "not_caught_up (read-your-writes gave up; Retry-After in seconds)"}
    return {status: {"model": ErrorBody, "description": text[status]} for status in statuses}


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers


# --- rows -> bodies ---------------------------------------------------------------------------------------------
def view(row) -> dict[str, Any]:
    cur = row["currency"]
    out = {"account_id": row["account_id"], "currency": cur, "status": row["status"],
           "posted": money(int(row["posted"]), cur), "held": money(int(row["held"]), cur),
           "available": money(int(row["available"]), cur), "seq": row["seq"],
           "last_transaction_id": row["last_transaction_id"], "updated_at_ms": row["updated_at_ms"]}
    if row["shards"] > 1 or routing.is_system(row["account_id"]):
        out["shards"] = row["shards"]
    return out


def entry(row) -> dict[str, Any]:
    cur = row["currency"]
    return {"entry_id": row["entry_id"], "account_id": row["account_id"], "seq": row["seq"], "currency": cur,
            "amount": money(int(row["amount"]), cur), "posted_after": money(int(row["posted_after"]), cur),
            "held_after": money(int(row["held_after"]), cur), "transaction_id": row["transaction_id"],
            "kind": row["kind"], "reference": row["reference"], "hold_id": row["hold_id"],
            "occurred_at_ms": row["occurred_at_ms"], "at_ms": row["at_ms"], "client_id": row["client_id"],
            "command_id": row["command_id"], **why(row)}


def why(row) -> dict[str, Any]:
    """Why the money moved: the transaction's links, metadata, the rule and version that posted it (from its
    metadata) and its FX rate snapshot. A store not yet migrated by its projector has none of them."""
    if "links" not in row.keys():
        return {"links": [], "metadata": {}, "rule": None, "rule_version": None, "rate_snapshot_id": None}
    metadata = json.loads(row["metadata"])
    return {"links": json.loads(row["links"]), "metadata": metadata, "rule": metadata.get(RULE_KEY),
            "rule_version": metadata.get(RULE_VERSION_KEY), "rate_snapshot_id": row["rate_snapshot_id"]}


def result(row) -> dict[str, Any]:
    return {"client_id": row["client_id"], "command_id": row["command_id"], "outcome": row["outcome"],
            "reason": row["reason"], "detail": row["detail"], "transaction_id": row["transaction_id"],
            "at_ms": row["at_ms"], "holds": json.loads(row["holds"])}


def hold(h, currency: str) -> dict[str, Any]:
    return {"hold_id": h["hold_id"], "status": h["status"], "amount": money(int(h["amount"]), currency),
            "captured": money(int(h["captured"]), currency), "released": money(int(h["released"]), currency),
            "remaining": money(fold.remaining(h), currency), "expires_at_ms": h["expires_at_ms"],
            "updated_at_ms": h["updated_at_ms"]}


def balance(account_id: str, currency: str, posted: int, held: int, **as_of: int) -> dict[str, Any]:
    return {"account_id": account_id, "currency": currency, **as_of, "posted": money(posted, currency),
            "held": money(held, currency), "available": money(posted - held, currency)}


# --- what every account route checks first ----------------------------------------------------------------------
def account_or_404(store: Store, account_id: str):
    row = store.view(account_id)
    if row is None:
        raise ApiError(404, "unknown_account", f"no account {account_id!r} in the read store")
    return row


def single_sequence(store: Store, row) -> None:
    """A per-account sequence (history, as of a seq) exists per shard, not for a summed system account."""
    account_id = row["account_id"]
    if row["shards"] > 1 or (routing.is_system(account_id) and routing.SHARD_MARK not in account_id):
        shards = [s["account_id"] for s in store.shards(account_id)]
        raise ApiError(400, "sharded_account", f"{account_id} is the sum of shards with their own seqs; "
                                               f"ask one of {shards}")
