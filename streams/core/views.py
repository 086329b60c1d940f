"""Read-side views: the balance of an account now, as of a business time, and as of a seq."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from streams.core.model import Account, HistoryEntry


@dataclass(frozen=True, slots=True)
class BalanceView:
    """What the balances topic publishes per account (latest wins, ordered by seq)."""

    account_id: str  # the account
    currency: str  # its currency code
    posted: int  # minor units posted
    held: int  # minor units reserved by open holds
    available: int  # posted - held: what may be spent now
    seq: int  # the account's version; consumers keep the highest
    last_transaction_id: str | None  # the last transaction that posted here
    updated_at_ms: int  # log time of the last change

    @classmethod
    def from_account(cls, account: Account) -> "BalanceView":
        """The view of an account record."""
        return cls(account.id, account.currency, account.posted, account.held, account.available, account.seq,
                   account.last_transaction_id, account.updated_at_ms)


def balance_as_of_time(history_entries: Iterable[HistoryEntry], account_id: str, occurred_at_ms: int) -> int:
    """Posted balance of account_id counting the legs whose business time is <= occurred_at_ms.

    A leg's business time is its occurred_at_ms, or its at_ms when none was given, so a back-dated entry
    counts from the time it says it happened, not from when it was recorded. Needs the full history (replay).
    """
    total = 0
    for entry in history_entries:
        if entry.account_id == account_id:
            when = entry.occurred_at_ms if entry.occurred_at_ms is not None else entry.at_ms
            if when <= occurred_at_ms:
                total += entry.amount
    return total


def balance_as_of_seq(history_entries: Iterable[HistoryEntry], account_id: str, seq: int) -> int:
    """Posted balance of account_id right after its change number seq (0 before any change)."""
    return sum(e.amount for e in history_entries if e.account_id == account_id and e.seq <= seq)
