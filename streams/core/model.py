"""The ledger's records: accounts, holds, legs and the per-account history entries.

All are frozen values. A change is a new value; the decision returns the complete new record (never a delta)
so the engine can write it in one atomic batch.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from streams.core._checks import require_int, require_optional_int, require_optional_str, require_str


class AccountStatus(str, enum.Enum):
    """Lifecycle of an account: OPEN <-> FROZEN, OPEN | FROZEN -> CLOSED (final)."""

    OPEN = "open"  # everything allowed
    FROZEN = "frozen"  # credits, releases and expiries only: no debits, no new holds
    CLOSED = "closed"  # nothing; reached only with posted == 0 and held == 0


class HoldStatus(str, enum.Enum):
    """Lifecycle of a hold: OPEN -> CAPTURED | RELEASED | EXPIRED; the three ends are final (P5)."""

    OPEN = "open"  # money reserved; may be captured (partially, repeatedly), released or expired
    CAPTURED = "captured"  # captures used the whole amount
    RELEASED = "released"  # the remainder went back to available on request (e.g. order cancelled)
    EXPIRED = "expired"  # the remainder went back to available because log time passed expires_at_ms


class AccountType(str, enum.Enum):
    """What an account is in the books, which says its normal balance direction (docs/wallet-operations.md).

    A leg's sign is the ledger's: negative debits, positive credits, so a posted balance below zero is a
    debit balance. A debit-normal account (asset, expense) reads -posted as its balance: custody holding
    40,000 has posted -40,000 and reads +40,000. A credit-normal one (liability, equity, revenue) reads posted.
    """

    ASSET = "asset"  # what the operator holds or is owed: custody wallets, receivables, money in transit
    LIABILITY = "liability"  # what it owes: customer balances (the default of an opened account)
    EQUITY = "equity"  # the owners' stake and the world outside the books (opening balances)
    REVENUE = "revenue"  # what it earned: fees
    EXPENSE = "expense"  # what it spent

    @property
    def debit_normal(self) -> bool:
        """True when a debit (negative posted) is this type's normal balance."""
        return self in (AccountType.ASSET, AccountType.EXPENSE)

    def normal_balance(self, posted: int) -> int:
        """posted read in this type's normal direction (custody's -40,000 reads 40,000)."""
        return -posted if self.debit_normal else posted


@dataclass(frozen=True, slots=True)
class AccountPolicy:
    """What an account may do with its balance. Values are validated by decide (bad ones: invalid_command)."""

    allow_negative: bool = False  # system accounts (world, custody, fees) may go below zero without limit
    overdraft_limit: int = 0  # minor units available may go below zero when allow_negative is False
    max_balance: int | None = None  # posted may not exceed this after a credit; None means no cap

    def __post_init__(self) -> None:
        if type(self.allow_negative) is not bool:
            raise TypeError(f"allow_negative must be a bool, got {self.allow_negative!r}")
        require_int(self.overdraft_limit, "overdraft_limit")
        require_optional_int(self.max_balance, "max_balance")


# The policy of an ordinary customer account: never below zero, no cap.
DEFAULT_POLICY = AccountPolicy()
# The policy of a system account (world, custody, fees, clearing, liquidity): may go negative.
SYSTEM_POLICY = AccountPolicy(allow_negative=True)


def routing_key_for(account_id: str) -> str:
    """The default routing key: the owner part of the id, i.e. everything before the last ':'.

    "user:42:USDT" -> "user:42", so one user's accounts share a partition; "world" -> "world".
    """
    owner, sep, _ = account_id.rpartition(":")
    return owner if sep and owner else account_id


@dataclass(frozen=True, slots=True)
class Account:
    """One account's current record. available = posted - held."""

    id: str  # unique, e.g. "user:42:USDT"; never reused, even after closing
    currency: str  # code of the currency every leg on this account is in
    routing_key: str  # the Kafka key of its commands; by default the owner part of the id
    policy: AccountPolicy  # overdraft / negative / cap rules
    status: AccountStatus  # open, frozen or closed
    posted: int  # minor units: the sum of all legs ever posted to this account
    held: int  # minor units reserved by open holds (sum of their remaining); always >= 0
    seq: int  # count of changes to this record (open = 1); every change adds exactly 1 (P3)
    last_transaction_id: str | None  # the last transaction that posted a leg here, for the balance view
    updated_at_ms: int  # log time (ms) of the command that made the last change
    account_type: AccountType = AccountType.LIABILITY  # its place in the books, fixed when it is opened

    @property
    def available(self) -> int:
        """What may be spent or held now: posted minus the money reserved by open holds."""
        return self.posted - self.held

    @property
    def floor(self) -> int | None:
        """The lowest available this account may reach, or None when it may go negative without limit."""
        if self.policy.allow_negative:
            return None
        return -self.policy.overdraft_limit


@dataclass(frozen=True, slots=True)
class Hold:
    """Money reserved on one account until captured, released or expired."""

    id: str  # unique across the ledger, chosen by the client (e.g. the order id)
    account_id: str  # the account whose money is reserved
    amount: int  # minor units reserved when placed; > 0
    captured: int  # minor units taken by captures so far
    released: int  # minor units returned to available by release or expiry
    status: HoldStatus  # lifecycle state
    expires_at_ms: int | None  # log time at which it may be expired; None = until captured or released
    capture_transaction_ids: tuple[str, ...]  # transactions that captured from it, in order

    @property
    def remaining(self) -> int:
        """What is still reserved (0 once the hold has ended)."""
        return self.amount - self.captured - self.released


@dataclass(frozen=True, slots=True)
class Leg:
    """One line of a transaction: a signed amount on one account (negative = debit, positive = credit)."""

    account_id: str  # the account this leg posts to
    amount: int  # signed minor units in the account's currency; never 0
    hold_id: str | None = None  # a debit leg may draw from this hold on the same account (a capture)
    currency: str | None = None  # optional assertion by the sender: must equal the account's currency

    def __post_init__(self) -> None:
        # One fused test on the hot path; the helpers then name the offending field.
        if (
            type(self.account_id) is not str
            or type(self.amount) is not int
            or (self.hold_id is not None and type(self.hold_id) is not str)
            or (self.currency is not None and type(self.currency) is not str)
        ):
            require_str(self.account_id, "account_id")
            require_int(self.amount, "amount")
            require_optional_str(self.hold_id, "hold_id")
            require_optional_str(self.currency, "currency")


@dataclass(frozen=True, slots=True)
class PostedTransaction:
    """What a partition remembers of a transaction it posted, so it can be reversed once and only by its
    client. Kept in the partition that decided it, which is where its reversal is routed (docs/wallet-operations.md)."""

    transaction_id: str  # the transaction's id
    client_id: str  # the client that posted it: only this client may reverse it
    legs: tuple[Leg, ...]  # the legs as posted here (system accounts as this partition's shards)
    kind: str  # its reason (deposit, trade, reversal ...)
    reference: str | None  # its external reference id
    rate_snapshot_id: str | None  # the FX rate snapshot it used, carried onto its reversal
    reversed_by: str | None  # the transaction that reversed it; None while it stands
    returned: int = 0  # minor units returned or charged back of it so far (streams/core/returns.py)
    returns: str | None = None  # for a return or chargeback: the payment it returns (never reversed itself)


@dataclass(frozen=True, slots=True)
class RateSnapshot:
    """An FX rate as a rates producer recorded it in the ledger: what a conversion naming it may use."""

    snapshot_id: str  # what transactions name in rate_snapshot_id
    base: str  # currency code converted from
    quote: str  # currency code converted to
    rate: str  # units of quote per unit of base, an exact decimal string (never a float)
    at_ms: int  # log time it was recorded
    expires_at_ms: int  # log time from which a transaction naming it is stale_rate


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """One change to one account, in the account's journal (the history topic).

    Every change to an account record writes exactly one entry carrying the account's seq after the change:
    one per transaction leg (in leg order) and one per non-posting change (open, status change, hold
    placed / released / expired, with amount 0). So per-account seq in history is 1, 2, 3, ... without gaps.
    """

    account_id: str  # the account changed
    seq: int  # the account's seq after this change
    amount: int  # signed minor units posted by this change (0 for non-posting changes)
    posted_after: int  # the account's posted after this change
    held_after: int  # the account's held after this change (so available can be folded from history)
    transaction_id: str | None  # the transaction of a leg; None for non-posting changes
    kind: str  # the transaction's kind for a leg; else "account_opened", "account_frozen", "hold_placed", ...
    reference: str | None  # the transaction's reference id, if any
    occurred_at_ms: int | None  # business time of the transaction (may be back-dated); None = at_ms
    at_ms: int  # log time of the command that made the change
    hold_id: str | None  # the hold captured by this leg, or placed / released / expired by this change
    # Why the money moved, for auditors (a leg carries its transaction's; other changes carry none):
    links: tuple[str, ...] = ()  # related transaction ids (a reversal or a refund names what it undoes)
    metadata: tuple[tuple[str, str], ...] = ()  # the transaction's key/value pairs (a rule's name and version)
    rate_snapshot_id: str | None = None  # the FX rate snapshot the transaction's amounts came from
