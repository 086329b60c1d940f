"""Reconciliation of one account against an external statement (a custodian's report, a bank statement).

A statement line says what the outside saw: a reference, an amount, maybe a date. The ledger's side is the
account's journal as the read API serves it: each transaction's legs on that account, summed, under the
transaction's reference (or its id when it has none). Both sides are grouped by that key and summed, then:

- matched: both sides have the key, with the same amount;
- amount mismatch: both have it, the amounts differ;
- missing from the ledger: only the statement has it;
- missing from the statement: only the ledger has it.

Amounts on a statement are signed the way the outside reads the account: in its normal balance direction
(streams/core/accounting.py). A custodian reports a deposit as +40,000 in custody, which the ledger posted as
a debit of -40,000 on `sys:custody:USDT` (an asset): the ledger side is turned into the statement's sign by
the account's type. Exact integers of minor units throughout; the statement's decimals are parsed at the
account currency's scale and never rounded. Pure: parsing and matching, no I/O.
"""
from __future__ import annotations

import csv
import io
import json
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from streams.core import AccountType, Currency, Rejection, parse_amount

# The kinds of difference, as the report, the exit code and the metric name them.
KINDS = ("matched", "amount_mismatch", "missing_from_ledger", "missing_from_statement")


class StatementError(ValueError):
    """A statement that cannot be read; the message names the line and the field."""


@dataclass(frozen=True, slots=True)
class StatementLine:
    line: int  # 1-based, the header of a CSV counts as line 1
    reference: str  # what the outside calls the movement (a chain tx id, a bank reference)
    amount: int  # minor units, in the account's normal direction


@dataclass(frozen=True, slots=True)
class LedgerItem:
    reference: str  # the transaction's reference, or its id when it has none
    transaction_id: str
    amount: int  # minor units on the account, in its normal direction
    occurred_at_ms: int


@dataclass(frozen=True, slots=True)
class Difference:
    kind: str  # one of KINDS
    reference: str
    statement: int | None  # the statement's total for the reference, None when it has none
    ledger: int | None  # the ledger's total, None when it has none
    transactions: tuple[str, ...]  # the ledger's transactions under the reference
    lines: tuple[int, ...]  # the statement's lines under it


@dataclass(frozen=True, slots=True)
class Reconciliation:
    account_id: str
    currency: str
    items: tuple[Difference, ...]  # every reference, sorted by (kind, reference)

    def of(self, kind: str) -> list[Difference]:
        return [d for d in self.items if d.kind == kind]

    @property
    def counts(self) -> dict[str, int]:
        return {kind: len(self.of(kind)) for kind in KINDS}

    @property
    def reconciled(self) -> bool:
        return all(d.kind == "matched" for d in self.items)


def parse_statement(text: str, currency: Currency) -> list[StatementLine]:
    """Statement lines from CSV (a header row naming `reference` or `id`, and `amount`) or JSON (an array of
    objects, or one object per line) with the same fields. Amounts are exact decimal strings in major units."""
    stripped = text.lstrip()
    if stripped.startswith(("[", "{")):
        return _from_json(stripped, currency)
    return _from_csv(text, currency)


def _from_json(text: str, currency: Currency) -> list[StatementLine]:
    try:
        if text.startswith("["):
            rows = list(enumerate(json.loads(text), start=1))
        else:
            rows = [(n, json.loads(line)) for n, line in enumerate(text.splitlines(), start=1) if line.strip()]
    except json.JSONDecodeError as exc:
        raise StatementError(f"not JSON: {exc.msg} (line {exc.lineno})") from None
    return [_line(n, row, currency) for n, row in rows]


def _from_csv(text: str, currency: Currency) -> list[StatementLine]:
    reader = csv.DictReader(io.StringIO(text))
    if reader.fieldnames is None:
        return []
    return [_line(n, row, currency) for n, row in enumerate(reader, start=2)]


def _line(number: int, row: Any, currency: Currency) -> StatementLine:
    if not isinstance(row, dict):
        raise StatementError(f"line {number}: an object with reference and amount is expected")
    reference = row.get("reference") or row.get("id")
    if not isinstance(reference, str) or not reference.strip():
        raise StatementError(f"line {number}: no reference (a 'reference' or 'id' field)")
    amount = row.get("amount")
    if not isinstance(amount, str):  # a JSON number may already have lost digits: refused, never guessed
        raise StatementError(f"line {number}: amount must be a decimal string such as \"12.50\", "
                             f"got {json.dumps(amount)}")
    minor = parse_amount(amount.strip(), currency)
    if isinstance(minor, Rejection):
        raise StatementError(f"line {number}: amount {amount!r}: {minor.code} ({currency.code} has "
                             f"{currency.scale} decimals)")
    return StatementLine(number, reference.strip(), minor)


def ledger_items(entries: Iterable[dict[str, Any]], account_type: AccountType) -> list[LedgerItem]:
    """The account's transactions from its history entries (the API's shape): legs summed per transaction,
    turned into the account's normal direction; changes that post nothing are left out."""
    by_tx: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in entries:
        if e["transaction_id"] is not None and int(e["amount"]["minor"]) != 0:
            by_tx[e["transaction_id"]].append(e)
    items = []
    for tx, legs in by_tx.items():
        posted = sum(int(e["amount"]["minor"]) for e in legs)
        items.append(LedgerItem(legs[0]["reference"] or tx, tx, account_type.normal_balance(posted),
                                min(e["occurred_at_ms"] for e in legs)))
    return items


def reconcile(account_id: str, currency: str, statement: list[StatementLine], ledger: list[LedgerItem],
              since_ms: int | None = None, until_ms: int | None = None) -> Reconciliation:
    """Match both sides by reference (ledger items outside [since_ms, until_ms] by business time are left
    out: a statement covers a period)."""
    ledger = [i for i in ledger if (since_ms is None or i.occurred_at_ms >= since_ms)
              and (until_ms is None or i.occurred_at_ms <= until_ms)]
    outside: dict[str, list[StatementLine]] = defaultdict(list)
    for line in statement:
        outside[line.reference].append(line)
    inside: dict[str, list[LedgerItem]] = defaultdict(list)
    for item in ledger:
        inside[item.reference].append(item)
    items = []
    for reference in sorted(set(outside) | set(inside)):
        lines, txs = outside.get(reference, []), inside.get(reference, [])
        said = sum(line.amount for line in lines) if lines else None
        booked = sum(item.amount for item in txs) if txs else None
        kind = ("missing_from_ledger" if booked is None else "missing_from_statement" if said is None
                else "matched" if said == booked else "amount_mismatch")
        items.append(Difference(kind, reference, said, booked, tuple(sorted(i.transaction_id for i in txs)),
                                tuple(line.line for line in lines)))
    items.sort(key=lambda d: (KINDS.index(d.kind), d.reference))
    return Reconciliation(account_id, currency, tuple(items))


def metrics_text(r: Reconciliation, now_ms: int) -> str:
    """The result in Prometheus' text format, for node_exporter's textfile collector (a one-shot command has
    no endpoint to scrape): references by kind, and when this account was last reconciled."""
    label = r.account_id.replace("\\", "\\\\").replace('"', '\\"')
    out = ["# HELP ledger_reconciliation_references References of the last reconciliation of an account, by kind.",
           "# TYPE ledger_reconciliation_references gauge"]
    out += [f'ledger_reconciliation_references{{account="{label}",kind="{k}"}} {n}' for k, n in r.counts.items()]
    out += ["# HELP ledger_reconciliation_timestamp_seconds When the account was last reconciled.",
            "# TYPE ledger_reconciliation_timestamp_seconds gauge",
            f'ledger_reconciliation_timestamp_seconds{{account="{label}"}} {now_ms / 1000:.3f}']
    return "\n".join(out) + "\n"


def as_json(r: Reconciliation, money: Callable[[int, str], dict]) -> dict[str, Any]:
    def amount(v: int | None):
        return None if v is None else money(v, r.currency)

    return {"account_id": r.account_id, "currency": r.currency, "reconciled": r.reconciled, "counts": r.counts,
            "items": [{"kind": d.kind, "reference": d.reference, "statement": amount(d.statement),
                       "ledger": amount(d.ledger), "transactions": list(d.transactions), "lines": list(d.lines)}
                      for d in r.items]}
