"""Translation between Avro records (schemas/*.avsc) and the core's values.

Amounts cross the wire as decimal strings of signed integer minor units: exact in any language for the
whole 128-bit range. A wire value that cannot become a core command is a rejection value, not an exception.
"""
from __future__ import annotations

import re
from typing import Any

from streams import core
from streams.core.accounting import default_account_type
from streams.limits import MAX_AMOUNT_CHARS
from streams.core import (
    Account,
    AccountPolicy,
    AccountStatus,
    AccountType,
    HistoryEntry,
    Hold,
    HoldStatus,
    Leg,
    PostedTransaction,
    RateSnapshot,
    Rejection,
    Result,
)

_INTEGER = re.compile(r"-?(0|[1-9][0-9]*)\Z")


class WireError(ValueError):
    """A decodable command whose fields cannot form a core command."""

    def __init__(self, reason: Rejection, detail: str):
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def parse_minor(text: str, field: str) -> int:
    """A wire amount (decimal integer of minor units) -> int; WireError when it is not one."""
    if len(text) > MAX_AMOUNT_CHARS:  # never an amount in range; and int() of a huge string is slow or refused
        reason = Rejection.AMOUNT_OUT_OF_RANGE if _INTEGER.match(text) else Rejection.INVALID_AMOUNT
        raise WireError(reason, f"{field} has {len(text)} characters, the limit is {MAX_AMOUNT_CHARS}")
    if not _INTEGER.match(text):
        raise WireError(Rejection.INVALID_AMOUNT, f"{field} must be an integer of minor units, got {text[:40]!r}")
    value = int(text)
    if abs(value) > core.MAX_ABS_AMOUNT:
        raise WireError(Rejection.AMOUNT_OUT_OF_RANGE, f"{field} is beyond the signed 128-bit range")
    return value


def _optional_minor(text: str | None, field: str) -> int | None:
    return None if text is None else parse_minor(text, field)


# --- commands -------------------------------------------------------------------------------------------


COMMAND_NAMESPACE = "ledger"  # a command body's type name is "<namespace>.<kind>" (schemas/command.avsc)


def command_record(client_id: str, command_id: str, kind: str, body: dict[str, Any]) -> dict[str, Any]:
    """A Command record as the commands topic carries it: the one place such a record is built (client,
    rules, the worker's own steps). kind: the body's type, e.g. "PostTransaction"; body: its fields, wire form."""
    return {"command_id": command_id, "client_id": client_id, "body": (f"{COMMAND_NAMESPACE}.{kind}", body)}


def command_from_wire(record: dict[str, Any], at_ms: int) -> core.Command:
    """A decoded Command record -> a core command at log time at_ms. Raises WireError."""
    name, body = record["body"]
    kind = name.rsplit(".", 1)[-1]
    common = {"command_id": record["command_id"], "client_id": record["client_id"], "at_ms": at_ms}
    if kind == "PostTransaction":
        legs = tuple(
            Leg(leg["account_id"], parse_minor(leg["amount"], "leg amount"), leg["hold_id"], leg.get("currency"))
            for leg in body["legs"]
        )
        return core.PostTransaction(
            **common,
            transaction_id=body["transaction_id"],
            legs=legs,
            kind=body["kind"],
            reference=body["reference"],
            links=tuple(body["links"]),
            metadata=tuple(sorted(body["metadata"].items())),
            occurred_at_ms=body["occurred_at_ms"],
            rate_snapshot_id=body["rate_snapshot_id"],
        )
    if kind == "OpenAccount":
        policy = AccountPolicy(
            allow_negative=body["allow_negative"],
            overdraft_limit=parse_minor(body["overdraft_limit"], "overdraft_limit"),
            max_balance=_optional_minor(body["max_balance"], "max_balance"),
        )
        account_type = body.get("account_type")
        return core.OpenAccount(
            **common, account_id=body["account_id"], currency=body["currency"], policy=policy,
            routing_key=body["routing_key"], account_type=None if account_type is None else AccountType(account_type),
        )
    if kind == "PlaceHold":
        return core.PlaceHold(
            **common, hold_id=body["hold_id"], account_id=body["account_id"],
            amount=parse_minor(body["amount"], "amount"), expires_at_ms=body["expires_at_ms"],
        )
    if kind == "ReverseTransaction":
        return core.ReverseTransaction(**common, **body)
    if kind == "RegisterCurrency":
        return core.RegisterCurrency(**common, **body)
    if kind == "RecordRate":
        return core.RecordRate(**common, **body)
    simple = {
        "FreezeAccount": core.FreezeAccount,
        "UnfreezeAccount": core.UnfreezeAccount,
        "CloseAccount": core.CloseAccount,
        "ReleaseHold": core.ReleaseHold,
        "ExpireHold": core.ExpireHold,
    }
    return simple[kind](**common, **body)


def command_to_wire(command: core.Command) -> dict[str, Any]:
    """A core command -> a Command record (the inverse of command_from_wire, without at_ms)."""
    kind = type(command).__name__
    if isinstance(command, core.PostTransaction):
        body: dict[str, Any] = {
            "transaction_id": command.transaction_id,
            "legs": [
                {"account_id": leg.account_id, "amount": str(leg.amount), "hold_id": leg.hold_id,
                 "currency": leg.currency}
                for leg in command.legs
            ],
            "kind": command.kind,
            "reference": command.reference,
            "links": list(command.links),
            "metadata": dict(command.metadata),
            "occurred_at_ms": command.occurred_at_ms,
            "rate_snapshot_id": command.rate_snapshot_id,
        }
    elif isinstance(command, core.OpenAccount):
        policy = command.policy
        body = {
            "account_id": command.account_id, "currency": command.currency,
            "allow_negative": policy.allow_negative, "overdraft_limit": str(policy.overdraft_limit),
            "max_balance": None if policy.max_balance is None else str(policy.max_balance),
            "routing_key": command.routing_key,
            "account_type": None if command.account_type is None else command.account_type.value,
        }
    elif isinstance(command, core.PlaceHold):
        body = {
            "hold_id": command.hold_id, "account_id": command.account_id, "amount": str(command.amount),
            "expires_at_ms": command.expires_at_ms,
        }
    elif isinstance(command, (core.ReleaseHold, core.ExpireHold)):
        body = {"hold_id": command.hold_id}
    elif isinstance(command, core.RecordRate):
        body = {"snapshot_id": command.snapshot_id, "base": command.base, "quote": command.quote,
                "rate": command.rate, "expires_at_ms": command.expires_at_ms}
    elif isinstance(command, core.RegisterCurrency):
        body = {"currency": command.currency, "scale": command.scale}
    elif isinstance(command, core.ReverseTransaction):
        body = {"transaction_id": command.transaction_id, "reverses": command.reverses,
                "account_id": command.account_id, "reference": command.reference,
                "occurred_at_ms": command.occurred_at_ms}
    else:
        body = {"account_id": command.account_id}
    return command_record(command.client_id, command.command_id, kind, body)


# --- state records ----------------------------------------------------------------------------------------


def account_to_record(a: Account) -> dict[str, Any]:
    return {
        "account_id": a.id, "currency": a.currency, "routing_key": a.routing_key,
        "allow_negative": a.policy.allow_negative, "overdraft_limit": str(a.policy.overdraft_limit),
        "max_balance": None if a.policy.max_balance is None else str(a.policy.max_balance),
        "status": a.status.value, "posted": str(a.posted), "held": str(a.held), "seq": a.seq,
        "last_transaction_id": a.last_transaction_id, "updated_at_ms": a.updated_at_ms,
        "account_type": a.account_type.value,
    }


def account_from_record(r: dict[str, Any]) -> Account:
    policy = AccountPolicy(
        r["allow_negative"], int(r["overdraft_limit"]),
        None if r["max_balance"] is None else int(r["max_balance"]),
    )
    return Account(
        r["account_id"], r["currency"], r["routing_key"], policy, AccountStatus(r["status"]),
        int(r["posted"]), int(r["held"]), r["seq"], r["last_transaction_id"], r["updated_at_ms"],
        AccountType(r["account_type"]) if r.get("account_type") else default_account_type(r["account_id"]),
    )


def hold_to_record(h: Hold) -> dict[str, Any]:
    return {
        "hold_id": h.id, "account_id": h.account_id, "amount": str(h.amount), "captured": str(h.captured),
        "released": str(h.released), "status": h.status.value, "expires_at_ms": h.expires_at_ms,
        "capture_transaction_ids": list(h.capture_transaction_ids),
    }


def hold_from_record(r: dict[str, Any]) -> Hold:
    return Hold(
        r["hold_id"], r["account_id"], int(r["amount"]), int(r["captured"]), int(r["released"]),
        HoldStatus(r["status"]), r["expires_at_ms"], tuple(r["capture_transaction_ids"]),
    )


def rate_to_record(r: RateSnapshot) -> dict[str, Any]:
    return {"snapshot_id": r.snapshot_id, "base": r.base, "quote": r.quote, "rate": r.rate, "at_ms": r.at_ms,
            "expires_at_ms": r.expires_at_ms}


def rate_from_record(r: dict[str, Any]) -> RateSnapshot:
    return RateSnapshot(r["snapshot_id"], r["base"], r["quote"], r["rate"], r["at_ms"], r["expires_at_ms"])


def transaction_to_record(t: PostedTransaction) -> dict[str, Any]:
    return {
        "transaction_id": t.transaction_id, "client_id": t.client_id,
        "legs": [{"account_id": leg.account_id, "amount": str(leg.amount), "hold_id": leg.hold_id} for leg in t.legs],
        "kind": t.kind, "reference": t.reference, "rate_snapshot_id": t.rate_snapshot_id,
        "reversed_by": t.reversed_by, "returned": str(t.returned), "returns": t.returns,
    }


def transaction_from_record(r: dict[str, Any]) -> PostedTransaction:
    return PostedTransaction(
        r["transaction_id"], r["client_id"],
        tuple(Leg(leg["account_id"], int(leg["amount"]), leg["hold_id"]) for leg in r["legs"]),
        r["kind"], r["reference"], r["rate_snapshot_id"], r["reversed_by"],
        int(r.get("returned") or "0"), r.get("returns"),  # absent in records written before returns
    )


# --- outputs ----------------------------------------------------------------------------------------------


def result_to_wire(result: Result, at_ms: int, transaction_id: str | None, holds: list[Hold]) -> dict[str, Any]:
    return {
        "command_id": result.command_id,
        "client_id": result.client_id,
        "outcome": result.outcome,
        # An accepted result's reason is its notice (late_settlement), if any: see streams/core/settlement.py.
        "reason": result.notice if result.reason is None else result.reason.code,
        "detail": result.detail,
        "duplicate": result.duplicate,
        "transaction_id": transaction_id,
        "at_ms": at_ms,
        "holds": holds_to_wire(holds),
    }


def holds_to_wire(holds: list[Hold]) -> list[dict[str, Any]]:
    """A result's holds: the state of every hold the decision created or changed."""
    return [{"hold_id": h.id, "account_id": h.account_id, "amount": str(h.amount), "captured": str(h.captured),
             "released": str(h.released), "status": h.status.value, "expires_at_ms": h.expires_at_ms}
            for h in holds]


def rejection_to_wire(command_id: str, client_id: str, at_ms: int, reason: Rejection, detail: str) -> dict:
    return {
        "command_id": command_id, "client_id": client_id, "outcome": "rejected", "reason": reason.code,
        "detail": detail, "duplicate": False, "transaction_id": None, "at_ms": at_ms, "holds": [],
    }


def history_to_wire(e: HistoryEntry, currency: str, command_id: str, client_id: str) -> dict[str, Any]:
    return {
        "entry_id": f"{e.account_id}#{e.seq}",
        "account_id": e.account_id,
        "currency": currency,
        "seq": e.seq,
        "amount": str(e.amount),
        "posted_after": str(e.posted_after),
        "held_after": str(e.held_after),
        "transaction_id": e.transaction_id,
        "kind": e.kind,
        "reference": e.reference,
        "hold_id": e.hold_id,
        "occurred_at_ms": e.at_ms if e.occurred_at_ms is None else e.occurred_at_ms,
        "at_ms": e.at_ms,
        "command_id": command_id,
        "client_id": client_id,
        "links": list(e.links),
        "metadata": dict(e.metadata),
        "rate_snapshot_id": e.rate_snapshot_id,
    }


def balance_to_wire(a: Account) -> dict[str, Any]:
    return {
        "account_id": a.id, "currency": a.currency, "status": a.status.value, "posted": str(a.posted),
        "held": str(a.held), "available": str(a.available), "seq": a.seq,
        "last_transaction_id": a.last_transaction_id, "updated_at_ms": a.updated_at_ms,
        "account_type": a.account_type.value,
    }
