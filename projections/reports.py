"""Month-end reports over the read store, as the API and `ledger report` give them: the trial balance.

The figures come from `Store.trial_balance` (the fold is `streams/core/accounting.py`); this module reads the
"as of" a person types and shapes the answer. Amounts are exact minor units with their decimal rendering.
"""
from __future__ import annotations

import datetime as dt
import re
from typing import Any

from projections.metrics import money
from streams.core.accounting import CurrencyTrialBalance

_DATE = re.compile(r"\d{4}-\d{2}-\d{2}\Z")


class BadAsOf(ValueError):
    """An "as of" that is neither a date, a date and time, nor milliseconds since the epoch."""


def parse_as_of(text: str) -> int:
    """Milliseconds since the epoch of the end of what `text` names, inclusive:
    "2026-11-30" -> the last millisecond of that day (UTC), so the report covers the whole day;
    "2026-11-30T12:00:00Z" (ISO 8601, UTC when no offset is given) -> that instant; "1764460800000" -> as is."""
    text = text.strip()
    if text.isdigit():
        return int(text)
    try:
        if _DATE.match(text):
            day = dt.datetime.strptime(text, "%Y-%m-%d").replace(tzinfo=dt.timezone.utc)
            return int((day + dt.timedelta(days=1)).timestamp() * 1000) - 1
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise BadAsOf(f"as of {text[:40]!r}: expected YYYY-MM-DD, an ISO 8601 date and time, or ms") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return int(when.timestamp() * 1000)


def parse_since(text: str) -> int:
    """Like parse_as_of, but a bare date names its first millisecond (the start of a period, inclusive)."""
    if _DATE.match(text.strip()):
        return parse_as_of(text) - 86_400_000 + 1
    return parse_as_of(text)


def trial_balance_json(report: tuple[CurrencyTrialBalance, ...], as_of_ms: int | None) -> dict[str, Any]:
    """The trial balance as the API answers it: per currency, its accounts, totals by type, and whether
    debits equal credits."""
    currencies = []
    for c in report:
        cur = c.currency
        currencies.append({
            "currency": cur, "debit": money(c.debit, cur), "credit": money(c.credit, cur), "balanced": c.balanced,
            "types": [{"account_type": t.account_type.value,
                       "normal_balance": "debit" if t.account_type.debit_normal else "credit",
                       "debit": money(t.debit, cur), "credit": money(t.credit, cur),
                       "balance": money(t.balance, cur)} for t in c.types],
            "accounts": [{"account_id": line.account_id, "account_type": line.account_type.value,
                          "debit": money(line.debit, cur), "credit": money(line.credit, cur),
                          "balance": money(line.account_type.normal_balance(line.posted), cur)}
                         for line in c.lines],
        })
    return {"as_of_ms": as_of_ms, "balanced": all(c.balanced for c in report), "currencies": currencies}
