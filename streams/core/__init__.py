"""The pure ledger core: exact money, accounts, balanced transactions, holds, results as values.

Imports only the standard library (checked by tests/core/test_purity.py). See docs/core.md.
"""

from streams.core.apply import apply
from streams.core.commands import (
    CloseAccount,
    Command,
    ExpireHold,
    FreezeAccount,
    OpenAccount,
    PlaceHold,
    PostTransaction,
    RecordRate,
    RegisterCurrency,
    ReleaseHold,
    ReverseTransaction,
    UnfreezeAccount,
    accounts_touched,
    reversal_of,
)
from streams.core.decide import MAX_LEGS, decide, execute, execute_share, transaction_shape_failures
from streams.core.events import (
    AccountOpened,
    AccountStatusChanged,
    CurrencyRegistered,
    Event,
    HoldExpired,
    HoldPlaced,
    HoldReleased,
    TransactionPosted,
    TransactionReversed,
)
from streams.core.invariants import assert_changes_balanced, check_account, check_hold
from streams.core.model import (
    DEFAULT_POLICY,
    SYSTEM_POLICY,
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
    routing_key_for,
)
from streams.core.money import (
    DEFAULT_CURRENCIES,
    MAX_ABS_AMOUNT,
    Currency,
    CurrencyRegistry,
    format_amount,
    parse_amount,
)
from streams.core.rejections import Rejection, transaction_urgency
from streams.core.results import Processed, Result
from streams.core.state import Changes, InboxKey, MemoryState, StateReader, no_changes

__all__ = [
    "Account", "AccountOpened", "AccountPolicy", "AccountStatus", "AccountStatusChanged", "AccountType",
    "Changes", "CloseAccount", "Command", "Currency", "CurrencyRegistered", "CurrencyRegistry",
    "DEFAULT_CURRENCIES", "DEFAULT_POLICY", "Event", "ExpireHold", "FreezeAccount", "HistoryEntry", "Hold",
    "HoldExpired", "HoldPlaced", "HoldReleased", "HoldStatus", "InboxKey", "Leg", "MAX_ABS_AMOUNT", "MAX_LEGS",
    "MemoryState", "OpenAccount", "PlaceHold", "PostTransaction", "PostedTransaction", "Processed", "RateSnapshot",
    "RecordRate", "RegisterCurrency", "Rejection", "transaction_urgency", "transaction_shape_failures", "ReleaseHold", "Result", "ReverseTransaction", "SYSTEM_POLICY",
    "StateReader", "TransactionPosted", "TransactionReversed", "UnfreezeAccount", "accounts_touched", "apply",
    "assert_changes_balanced", "check_account", "check_hold", "decide",
    "execute", "execute_share", "format_amount", "no_changes", "parse_amount", "reversal_of", "routing_key_for",
]
