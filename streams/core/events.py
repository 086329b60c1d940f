"""What happened: the facts a decision produces. ``apply`` folds them into records.

Each event carries ``at_ms`` (the log time of the command that caused it) so applying it needs nothing else.
Captures have no event of their own: they are the TransactionPosted legs that name a hold_id.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from streams.core.model import AccountPolicy, AccountStatus, AccountType, Leg, RateSnapshot


@dataclass(frozen=True, slots=True, kw_only=True)
class AccountOpened:
    """An account now exists, empty and open."""

    account_id: str  # the new account
    currency: str  # its currency code
    routing_key: str  # its resolved routing key
    policy: AccountPolicy  # its policy
    at_ms: int  # log time of the opening command
    account_type: AccountType | None = None  # None -> by its name (accounting.default_account_type)


@dataclass(frozen=True, slots=True, kw_only=True)
class AccountStatusChanged:
    """An account was frozen, unfrozen or closed."""

    account_id: str  # the account
    previous: AccountStatus  # status before
    status: AccountStatus  # status after
    at_ms: int  # log time of the command


@dataclass(frozen=True, slots=True, kw_only=True)
class TransactionPosted:
    """Balanced legs were posted atomically; legs with hold_id captured from that hold."""

    transaction_id: str  # the transaction's id
    legs: tuple[Leg, ...]  # as requested, in order
    kind: str  # reason (deposit, trade, fee, reversal ...)
    reference: str | None  # external reference id
    links: tuple[str, ...]  # related transaction ids
    metadata: tuple[tuple[str, str], ...]  # free key/value pairs
    occurred_at_ms: int | None  # business time (None = at_ms)
    rate_snapshot_id: str | None  # FX rate snapshot id
    at_ms: int  # log time of the command
    client_id: str = ""  # the client that posted it (recorded so only it may reverse the transaction)


@dataclass(frozen=True, slots=True, kw_only=True)
class TransactionReversed:
    """A transaction was undone by a reversing transaction (posted in the same decision); it stays in the
    journal, marked, so it is never reversed twice."""

    transaction_id: str  # the transaction undone
    reversed_by: str  # the reversing transaction's id
    at_ms: int  # log time of the command


@dataclass(frozen=True, slots=True, kw_only=True)
class TransactionReturned:
    """Part or all of a payment was returned or charged back by a transaction posted in the same decision
    (streams/core/returns.py); the payment records how much, so no more than it moved is ever returned. A payment
    made in steps gets one per step, the named payment first."""

    transaction_id: str  # the payment returned (or a step of it)
    returned_by: str  # the returning transaction's id
    amount: int  # minor units returned by it
    at_ms: int  # log time of the command


@dataclass(frozen=True, slots=True, kw_only=True)
class HoldPlaced:
    """Money was reserved on an account."""

    hold_id: str  # the new hold
    account_id: str  # the account whose money is reserved
    amount: int  # minor units reserved
    expires_at_ms: int | None  # log time from which it may expire
    at_ms: int  # log time of the command


@dataclass(frozen=True, slots=True, kw_only=True)
class HoldReleased:
    """An open hold ended on request; its remainder went back to available."""

    hold_id: str  # the hold
    account_id: str  # its account
    amount: int  # the remainder returned (minor units)
    at_ms: int  # log time of the command


@dataclass(frozen=True, slots=True, kw_only=True)
class HoldExpired:
    """An open hold ended because log time reached expires_at_ms; its remainder went back to available."""

    hold_id: str  # the hold
    account_id: str  # its account
    amount: int  # the remainder returned (minor units)
    at_ms: int  # log time of the command


@dataclass(frozen=True, slots=True, kw_only=True)
class CurrencyRegistered:
    """A currency became known to this partition."""

    currency: str  # its code
    scale: int  # decimals of its minor unit
    at_ms: int  # log time of the command


@dataclass(frozen=True, slots=True, kw_only=True)
class RateRecorded:
    """An FX rate snapshot became known to this partition."""

    snapshot: RateSnapshot  # the snapshot, complete


Event = Union[
    AccountOpened, AccountStatusChanged, TransactionPosted, TransactionReversed, TransactionReturned, HoldPlaced,
    HoldReleased, HoldExpired, CurrencyRegistered, RateRecorded,
]
