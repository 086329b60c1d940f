"""What clients ask the ledger to do. Every command is a frozen value with an id scoped by its client.

``at_ms`` is the command's log time (Kafka record timestamp, ms since epoch): the only clock the core knows.
It drives hold expiry and ``updated_at_ms`` and is excluded from the fingerprint, so a redelivery at another
time is still recognised as the same command (P4).

Fields are keyword-only: commands are built from decoded messages by name, and positional construction of
records this wide invites silent mix-ups.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Union

from streams.core._checks import (
    require_int,
    require_optional_int,
    require_optional_str,
    require_str,
)
from streams.core.model import AccountPolicy, AccountType, Leg


class _CommandBase:
    """Shared behaviour: the idempotency key and the payload fingerprint."""

    __slots__ = ()

    @property
    def key(self) -> tuple[str, str]:
        """The inbox key: (client_id, command_id). Ids are unique per client, not globally."""
        return (self.client_id, self.command_id)  # type: ignore[attr-defined]

    def fingerprint(self) -> str:
        """sha256 hex of the canonical payload (type name and every field except at_ms).

        Canonical = repr() of a tuple holding only str, int, bool, None and tuples, in declared field order,
        encoded as UTF-8 (surrogates passed through). Python's literal syntax is deterministic and injective
        for these types, and several times cheaper than JSON on the hot path.
        Same id + same fingerprint -> duplicate; same id + other fingerprint -> id_conflict.
        """
        encoded = repr(self._payload()).encode("utf-8", "surrogatepass")  # type: ignore[attr-defined]
        return hashlib.sha256(encoded).hexdigest()

    def _check_common(self) -> None:
        require_str(self.command_id, "command_id")  # type: ignore[attr-defined]
        require_str(self.client_id, "client_id")  # type: ignore[attr-defined]
        require_int(self.at_ms, "at_ms")  # type: ignore[attr-defined]


def _policy_payload(policy: AccountPolicy) -> tuple:
    return (policy.allow_negative, policy.overdraft_limit, policy.max_balance)


@dataclass(frozen=True, slots=True, kw_only=True)
class OpenAccount(_CommandBase):
    """Create an account in a registered currency with a policy."""

    command_id: str  # unique per client; the idempotency key with client_id
    client_id: str  # the producer that issued the command
    at_ms: int  # log time, ms since epoch
    account_id: str  # the new account's id, e.g. "user:42:USDT"
    currency: str  # code of a registered currency
    policy: AccountPolicy = AccountPolicy()  # negative / overdraft / cap rules
    routing_key: str | None = None  # None -> routing_key_for(account_id), the owner part
    account_type: AccountType | None = None  # None -> by its name (accounting.default_account_type)

    def __post_init__(self) -> None:
        self._check_common()
        require_str(self.account_id, "account_id")
        require_str(self.currency, "currency")
        if not isinstance(self.policy, AccountPolicy):
            raise TypeError(f"policy must be an AccountPolicy, got {self.policy!r}")
        require_optional_str(self.routing_key, "routing_key")
        if self.account_type is not None and not isinstance(self.account_type, AccountType):
            raise TypeError(f"account_type must be an AccountType, got {self.account_type!r}")

    def _payload(self) -> tuple:
        # The type joins the payload only when given, so an opening sent before types existed keeps its
        # fingerprint (a retry of it is still a duplicate, not an id_conflict).
        typed = () if self.account_type is None else (self.account_type.value,)
        return (
            "OpenAccount", self.client_id, self.command_id, self.account_id, self.currency,
            _policy_payload(self.policy), self.routing_key, *typed,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class FreezeAccount(_CommandBase):
    """Stop debits and new holds on an open account (credits still arrive)."""

    command_id: str  # unique per client
    client_id: str  # the producer that issued the command
    at_ms: int  # log time, ms since epoch
    account_id: str  # the account to freeze

    def __post_init__(self) -> None:
        self._check_common()
        require_str(self.account_id, "account_id")

    def _payload(self) -> tuple:
        return ("FreezeAccount", self.client_id, self.command_id, self.account_id)


@dataclass(frozen=True, slots=True, kw_only=True)
class UnfreezeAccount(_CommandBase):
    """Return a frozen account to open."""

    command_id: str  # unique per client
    client_id: str  # the producer that issued the command
    at_ms: int  # log time, ms since epoch
    account_id: str  # the account to unfreeze

    def __post_init__(self) -> None:
        self._check_common()
        require_str(self.account_id, "account_id")

    def _payload(self) -> tuple:
        return ("UnfreezeAccount", self.client_id, self.command_id, self.account_id)


@dataclass(frozen=True, slots=True, kw_only=True)
class CloseAccount(_CommandBase):
    """Close an account for good; only when posted == 0 and nothing is held."""

    command_id: str  # unique per client
    client_id: str  # the producer that issued the command
    at_ms: int  # log time, ms since epoch
    account_id: str  # the account to close

    def __post_init__(self) -> None:
        self._check_common()
        require_str(self.account_id, "account_id")

    def _payload(self) -> tuple:
        return ("CloseAccount", self.client_id, self.command_id, self.account_id)


@dataclass(frozen=True, slots=True, kw_only=True)
class PostTransaction(_CommandBase):
    """Post balanced legs atomically. A debit leg naming hold_id is a capture from that hold."""

    command_id: str  # unique per client
    client_id: str  # the producer that issued the command
    at_ms: int  # log time, ms since epoch
    transaction_id: str  # the transaction's id (recommended: equal to command_id; not separately deduplicated)
    legs: tuple[Leg, ...]  # >= 2 legs; each currency's legs sum to zero; currencies come from the accounts
    kind: str = "transfer"  # reason: deposit, withdrawal, fee, trade, refund, fx, reversal, adjustment ...
    reference: str | None = None  # external reference id (order id, payment id)
    links: tuple[str, ...] = ()  # related transaction ids (a refund or a reversal names what it undoes)
    metadata: tuple[tuple[str, str], ...] = ()  # free key/value pairs, keys unique, order kept
    occurred_at_ms: int | None = None  # business time; may be back-dated; None means at_ms
    rate_snapshot_id: str | None = None  # for FX: the rate snapshot the amounts were computed from

    def with_legs(self, legs: tuple[Leg, ...]) -> "PostTransaction":
        """The same transaction with other legs (dataclasses.replace, without its per-call introspection)."""
        return PostTransaction(
            command_id=self.command_id, client_id=self.client_id, at_ms=self.at_ms,
            transaction_id=self.transaction_id, legs=legs, kind=self.kind, reference=self.reference,
            links=self.links, metadata=self.metadata, occurred_at_ms=self.occurred_at_ms,
            rate_snapshot_id=self.rate_snapshot_id,
        )

    def __post_init__(self) -> None:
        # Inlined type checks: this runs once per transaction on the hot path.
        if (
            type(self.command_id) is not str
            or type(self.client_id) is not str
            or type(self.at_ms) is not int
            or type(self.transaction_id) is not str
            or type(self.kind) is not str
            or (self.reference is not None and type(self.reference) is not str)
            or (self.occurred_at_ms is not None and type(self.occurred_at_ms) is not int)
            or (self.rate_snapshot_id is not None and type(self.rate_snapshot_id) is not str)
        ):
            self._slow_check()
        if type(self.legs) is not tuple:
            raise TypeError("legs must be a tuple of Leg")
        for leg in self.legs:
            if type(leg) is not Leg:
                raise TypeError(f"legs must be Leg values, got {leg!r}")
        if self.links and (type(self.links) is not tuple or any(type(x) is not str for x in self.links)):
            raise TypeError("links must be a tuple of str")
        if self.metadata and (type(self.metadata) is not tuple or any(
            type(p) is not tuple or len(p) != 2 or type(p[0]) is not str or type(p[1]) is not str
            for p in self.metadata
        )):
            raise TypeError("metadata must be a tuple of (str, str) pairs")
        if type(self.links) is not tuple or type(self.metadata) is not tuple:
            raise TypeError("links and metadata must be tuples")

    def _slow_check(self) -> None:
        """Name the offending field (only reached when a type is wrong)."""
        self._check_common()
        require_str(self.transaction_id, "transaction_id")
        require_str(self.kind, "kind")
        require_optional_str(self.reference, "reference")
        require_optional_int(self.occurred_at_ms, "occurred_at_ms")
        require_optional_str(self.rate_snapshot_id, "rate_snapshot_id")

    def _payload(self) -> tuple:
        return (
            "PostTransaction", self.client_id, self.command_id, self.transaction_id,
            tuple([(leg.account_id, leg.amount, leg.hold_id, leg.currency) for leg in self.legs]),
            self.kind, self.reference, self.links, self.metadata, self.occurred_at_ms, self.rate_snapshot_id,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class PlaceHold(_CommandBase):
    """Reserve amount on an account (e.g. an order); only if available covers it."""

    command_id: str  # unique per client
    client_id: str  # the producer that issued the command
    at_ms: int  # log time, ms since epoch
    hold_id: str  # the new hold's id, unique ledger-wide (e.g. the order id)
    account_id: str  # the account whose money is reserved
    amount: int  # minor units to reserve; > 0
    expires_at_ms: int | None = None  # log time from which ExpireHold may end it; must be after at_ms

    def __post_init__(self) -> None:
        self._check_common()
        require_str(self.hold_id, "hold_id")
        require_str(self.account_id, "account_id")
        require_int(self.amount, "amount")
        require_optional_int(self.expires_at_ms, "expires_at_ms")

    def _payload(self) -> tuple:
        return (
            "PlaceHold", self.client_id, self.command_id, self.hold_id, self.account_id, self.amount,
            self.expires_at_ms,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ReleaseHold(_CommandBase):
    """Return the remainder of an open hold to available (e.g. order cancelled or filled)."""

    command_id: str  # unique per client
    client_id: str  # the producer that issued the command
    at_ms: int  # log time, ms since epoch
    hold_id: str  # the hold to release

    def __post_init__(self) -> None:
        self._check_common()
        require_str(self.hold_id, "hold_id")

    def _payload(self) -> tuple:
        return ("ReleaseHold", self.client_id, self.command_id, self.hold_id)


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpireHold(_CommandBase):
    """Issued by the engine once log time reaches a hold's expires_at_ms; returns the remainder."""

    command_id: str  # unique per client (the engine uses a deterministic id, e.g. "expire:<hold_id>")
    client_id: str  # the issuer (the engine)
    at_ms: int  # log time, ms since epoch; must be >= the hold's expires_at_ms
    hold_id: str  # the hold to expire

    def __post_init__(self) -> None:
        self._check_common()
        require_str(self.hold_id, "hold_id")

    def _payload(self) -> tuple:
        return ("ExpireHold", self.client_id, self.command_id, self.hold_id)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReverseTransaction(_CommandBase):
    """Undo a transaction this client posted, by a new transaction with its legs mirrored (entries are never
    edited). Decided where the original was: it is routed by account_id, the account the original was routed
    by (its debited customer account, or the credited one of a deposit). Refused unknown_transaction,
    client_mismatch or already_reversed; the mirrored legs are then judged like any transaction (a spent
    deposit cannot be reversed: insufficient_funds)."""

    command_id: str  # unique per client
    client_id: str  # must be the client that posted the original
    at_ms: int  # log time, ms since epoch
    transaction_id: str  # the reversing transaction's id
    reverses: str  # the transaction to undo
    account_id: str  # routes the command to the original's partition (the account the original was sent for)
    reference: str | None = None  # external reference; None keeps the original's
    occurred_at_ms: int | None = None  # business time of the reversal; None means at_ms

    def __post_init__(self) -> None:
        self._check_common()
        require_str(self.transaction_id, "transaction_id")
        require_str(self.reverses, "reverses")
        require_str(self.account_id, "account_id")
        require_optional_str(self.reference, "reference")
        require_optional_int(self.occurred_at_ms, "occurred_at_ms")

    def _payload(self) -> tuple:
        return ("ReverseTransaction", self.client_id, self.command_id, self.transaction_id, self.reverses,
                self.account_id, self.reference, self.occurred_at_ms)


@dataclass(frozen=True, slots=True, kw_only=True)
class RegisterCurrency(_CommandBase):
    """Make a currency known to one partition, from this command on. Every partition needs it: the client
    sends one copy per partition (docs/wallet-operations.md). A code is refused unknown_currency until its
    partition has decided this."""

    command_id: str  # unique per client (the client's copies: "<id>@<partition>")
    client_id: str  # the producer that issued the command
    at_ms: int  # log time, ms since epoch
    currency: str  # the code: 1-16 of A-Z a-z 0-9 _ . - (it ends account ids, so no ':' or '@')
    scale: int  # decimals of its minor unit, 0..MAX_SCALE

    def __post_init__(self) -> None:
        self._check_common()
        require_str(self.currency, "currency")
        require_int(self.scale, "scale")

    def _payload(self) -> tuple:
        return ("RegisterCurrency", self.client_id, self.command_id, self.currency, self.scale)


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordRate(_CommandBase):
    """Record an FX rate snapshot in one partition (a rates producer sends one copy per partition, like
    RegisterCurrency). A transaction naming a snapshot (rate_snapshot_id) is refused unknown_rate where it
    was not recorded, stale_rate from its expires_at_ms on."""

    command_id: str  # unique per client (copies: "<id>@<partition>")
    client_id: str  # the rates producer
    at_ms: int  # log time, ms since epoch
    snapshot_id: str  # the snapshot's id, unique ledger-wide
    base: str  # currency converted from
    quote: str  # currency converted to
    rate: str  # units of quote per unit of base: an exact positive decimal string
    expires_at_ms: int  # log time from which it is stale; after at_ms

    def __post_init__(self) -> None:
        self._check_common()
        for name in ("snapshot_id", "base", "quote", "rate"):
            require_str(getattr(self, name), name)
        require_int(self.expires_at_ms, "expires_at_ms")

    def _payload(self) -> tuple:
        return ("RecordRate", self.client_id, self.command_id, self.snapshot_id, self.base, self.quote, self.rate,
                self.expires_at_ms)


Command = Union[
    OpenAccount, FreezeAccount, UnfreezeAccount, CloseAccount, PostTransaction, PlaceHold, ReleaseHold,
    ExpireHold, ReverseTransaction, RegisterCurrency, RecordRate,
]


def accounts_touched(command: Command) -> tuple[str, ...]:
    """The account ids a command names, distinct, in first-mention order.

    ReleaseHold and ExpireHold name no account (only a hold): the engine reads the hold to find it.
    """
    if isinstance(command, PostTransaction):
        return tuple(dict.fromkeys(leg.account_id for leg in command.legs))
    if isinstance(command, (OpenAccount, FreezeAccount, UnfreezeAccount, CloseAccount, PlaceHold,
                            ReverseTransaction)):
        return (command.account_id,)
    if isinstance(command, (ReleaseHold, ExpireHold, RegisterCurrency, RecordRate)):
        return ()
    raise TypeError(f"not a command: {command!r}")


def reversal_of(
    original: object,
    *,
    transaction_id: str,
    command_id: str,
    client_id: str,
    at_ms: int,
    reference: str | None = None,
    occurred_at_ms: int | None = None,
) -> PostTransaction:
    """A new transaction that mirrors original (a PostTransaction, a TransactionPosted or a PostedTransaction)
    and links to it.

    Entries are never edited: a correction is this reversing transaction. Captures are mirrored as plain legs
    (the money goes back to available, not into the ended hold).
    """
    legs = tuple(Leg(leg.account_id, -leg.amount, None, leg.currency) for leg in original.legs)  # type: ignore
    return PostTransaction(
        command_id=command_id,
        client_id=client_id,
        at_ms=at_ms,
        transaction_id=transaction_id,
        legs=legs,
        kind="reversal",
        reference=reference if reference is not None else original.reference,  # type: ignore
        links=(original.transaction_id,),  # type: ignore[attr-defined]
        metadata=(),
        occurred_at_ms=occurred_at_ms,
        rate_snapshot_id=original.rate_snapshot_id,  # type: ignore[attr-defined]
    )
