"""The JSON Lines command format of `ledger submit`: one command per line, amounts as exact decimal strings.

    {"type": "open", "account": "user:1:USD", "currency": "USD"}      (optional "account_type": "asset", ...)
    {"type": "post", "id": "dep-1", "kind": "deposit", (optional "occurred_at_ms", "links", "metadata")
     "legs": [{"account": "sys:world:USD", "amount": "-10.00"}, {"account": "user:1:USD", "amount": "10.00"}]}
    {"type": "hold", "id": "order-7", "account": "user:1:USD", "amount": "2.50", "expires_at_ms": 1767225600000}
    {"type": "post", "id": "fill-7", "legs": [{"account": "user:1:USD", "amount": "-2.00", "hold": "order-7"},
                                             {"account": "sys:merchant:USD", "amount": "2.00"}]}
    {"type": "release", "hold": "order-7", "account": "user:1:USD"}
    {"type": "freeze" | "unfreeze" | "close", "account": "user:1:USD"}
    {"type": "reverse", "id": "rev-1", "transaction": "dep-1", "account": "user:1:USD"}
    {"type": "return", "id": "cb-1", "transaction": "dep-1", "payee": "user:1:USD", "payer": "sys:world:USD",
     "amount": "4.00", "kind": "chargeback"}                          (kind: "return" by default; "steps":
                                              the other transactions of a payment made in steps, linked too)

Amounts are in major units with at most the currency's scale ("10.00" USD, "0.5" BTC), converted exactly;
more digits than the scale is an error, never a rounding. A currency registered at runtime is parsed with
the scale declared by `--currency CODE:SCALE`, which every partition confirms first (connectors/currencies.py). A leg's currency is its "currency" field or the
last segment of its account id. Optional on every line: "id" (the command id).

Without an "id", a line's command id is derived from its type, its target, its line number and a digest of
its text: `freeze:user:bob:USD@3~9f2c1a0b7d4e`. So two identical lines of one file are two commands (a
freeze, an unfreeze and a freeze again all take effect), while submitting the same file again sends the
same ids, and each line is answered as a duplicate of its first submission. Editing a line gives it a new id.
Every field is checked, types included, before anything is sent.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Callable

from connectors.client import LedgerClient, Leg
from streams import routing
from streams.core import DEFAULT_CURRENCIES, AccountType, CurrencyRegistry, Rejection, parse_amount


class LineError(ValueError):
    """A line that cannot become a command; the message names the field and the problem."""


@dataclass(frozen=True, slots=True)
class Parsed:
    line: int
    send: Callable[[LedgerClient], str]  # sends the command, returns its command id


def _text(obj: dict, field: str) -> str:
    value = obj.get(field)
    if not isinstance(value, str) or not value:
        raise LineError(f"{field!r} must be a non-empty string")
    return value


def _minor(text: Any, currency_code: str, currencies: CurrencyRegistry, field: str) -> int:
    if not isinstance(text, str):
        raise LineError(f"{field} must be a decimal string such as \"10.00\" (got {json.dumps(text)})")
    currency = currencies.get(currency_code)
    if currency is None:
        raise LineError(f"unknown currency {currency_code!r} for {field}")
    value = parse_amount(text, currency)
    if isinstance(value, Rejection):
        raise LineError(f"{field} {text!r}: {value.code} ({currency.code} has {currency.scale} decimals)")
    return value


def _optional_text(obj: dict, field: str) -> str | None:
    value = obj.get(field)
    if value is not None and (not isinstance(value, str) or not value):
        raise LineError(f"{field!r} must be a non-empty string when given (got {json.dumps(value)})")
    return value


def _metadata(obj: dict) -> dict[str, str]:
    value = obj.get("metadata") or {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise LineError("'metadata' must be an object of string values")
    return value


def derived_id(kind: str, target: str, number: int, text: str) -> str:
    """The command id of a line without "id": stable for the same line at the same place in a file."""
    digest = hashlib.sha256(text.strip().encode()).hexdigest()[:12]
    return f"{kind}:{target}@{number}~{digest}"


def parse_line(number: int, text: str, currencies: CurrencyRegistry = DEFAULT_CURRENCIES) -> Parsed:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise LineError(f"not JSON: {exc.msg} at column {exc.colno}") from None
    if not isinstance(obj, dict):
        raise LineError("a line must be a JSON object")
    kind = obj.get("type")
    command_id = _optional_text(obj, "id")
    if kind == "open":
        account, currency = _text(obj, "account"), _text(obj, "currency")
        if currencies.get(currency) is None:
            raise LineError(f"unknown currency {currency!r}")
        overdraft = _minor(obj.get("overdraft_limit", "0"), currency, currencies, "overdraft_limit")
        account_type = _optional_text(obj, "account_type")
        if account_type is not None and account_type not in {t.value for t in AccountType}:
            raise LineError(f"'account_type' must be one of {', '.join(t.value for t in AccountType)}")
        open_id = command_id or derived_id("open", account, number, text)
        return Parsed(number, lambda c: c.open_account(account, currency, command_id=open_id,
                                                       overdraft_limit=overdraft, account_type=account_type))
    if kind == "post":
        legs_in = obj.get("legs")
        if not isinstance(legs_in, list) or len(legs_in) < 2:
            raise LineError("'legs' must be a list of at least two legs")
        legs = []
        for i, leg in enumerate(legs_in):
            if not isinstance(leg, dict):
                raise LineError(f"leg {i} must be an object")
            account = _text(leg, "account")
            hold, leg_currency = _optional_text(leg, "hold"), _optional_text(leg, "currency")
            currency = leg_currency or routing.system_currency(account)
            legs.append(Leg(account, _minor(leg.get("amount"), currency, currencies, f"leg {i} amount"),
                            hold_id=hold, currency=leg_currency))
        tx_id = command_id or _text(obj, "id")
        tx_kind = _optional_text(obj, "kind") or "transfer"
        reference, metadata = _optional_text(obj, "reference"), _metadata(obj)
        occurred = obj.get("occurred_at_ms")
        if occurred is not None and (type(occurred) is not int or not -2**63 <= occurred < 2**63):
            raise LineError("'occurred_at_ms' must be an integer (ms since the epoch)")
        links = obj.get("links") or []
        if not isinstance(links, list) or not all(isinstance(x, str) and x for x in links):
            raise LineError("'links' must be a list of transaction ids")
        return Parsed(number, lambda c: c.post(tx_id, legs, kind=tx_kind, reference=reference, metadata=metadata,
                                               occurred_at_ms=occurred, links=links))
    if kind == "hold":
        account = _text(obj, "account")
        amount = _minor(obj.get("amount"), routing.system_currency(account), currencies, "amount")
        hold_id, expires = _text(obj, "id"), obj.get("expires_at_ms")
        if expires is not None and (type(expires) is not int or not 0 <= expires < 2**63):
            raise LineError("'expires_at_ms' must be an integer (ms since the epoch)")
        return Parsed(number, lambda c: c.place_hold(hold_id, account, amount, expires_at_ms=expires))
    if kind == "release":
        hold_id, account = _text(obj, "hold"), _text(obj, "account")
        release_id = command_id or derived_id("release", hold_id, number, text)
        return Parsed(number, lambda c: c.release_hold(hold_id, account, command_id=release_id))
    if kind == "reverse":
        reverses, account = _text(obj, "transaction"), _text(obj, "account")
        reversal_id = command_id or f"reversal:{reverses}"
        reference = _optional_text(obj, "reference")
        return Parsed(number, lambda c: c.reverse(reversal_id, reverses, account, reference=reference))
    if kind == "return":
        payee, payer = _text(obj, "payee"), _text(obj, "payer")
        amount = _minor(obj.get("amount"), routing.system_currency(payee), currencies, "amount")
        returns, return_id = _text(obj, "transaction"), _text(obj, "id")
        return_kind = _optional_text(obj, "kind") or "return"
        steps = obj.get("steps") or []
        if not isinstance(steps, list) or not all(isinstance(x, str) and x for x in steps):
            raise LineError("'steps' must be a list of transaction ids")
        return Parsed(number, lambda c: c.return_payment(return_id, returns, payee, payer, amount, kind=return_kind,
                                                         steps=steps))
    names = {"freeze": "FreezeAccount", "unfreeze": "UnfreezeAccount", "close": "CloseAccount"}
    if kind in names:
        account = _text(obj, "account")
        control_id = command_id or derived_id(kind, account, number, text)
        return Parsed(number, lambda c: c.account_command(names[kind], account, command_id=control_id))
    raise LineError(f"unknown type {kind!r}; expected one of open, post, hold, release, freeze, unfreeze, close, "
                    f"reverse, return")


def parse_file(lines: list[str], currencies: CurrencyRegistry = DEFAULT_CURRENCIES,
               ) -> tuple[list[Parsed], list[tuple[int, str]]]:
    """Every good line as a command to send, every bad line with its error; blank lines are skipped.
    currencies: what amounts are parsed against (the built-in ones and those declared with --currency,
    connectors/currencies.py)."""
    good, bad = [], []
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            good.append(parse_line(number, text, currencies))
        except LineError as exc:
            bad.append((number, str(exc)))
    return good, bad
