"""apply(state, events) -> Changes: fold accepted events into complete new records. Pure and deterministic.

This is the only place records change, so the live path (execute) and replay build identical state.
Seq rule: every change to an account record adds 1 to its seq and writes one HistoryEntry carrying the new seq
(open sets seq = 1; each leg, hold placement / release / expiry and status change adds 1).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from streams.core.accounting import ACCOUNT_TYPE_KEY, default_account_type
from streams.core.events import (
    AccountOpened,
    AccountStatusChanged,
    CurrencyRegistered,
    Event,
    HoldExpired,
    HoldPlaced,
    HoldReleased,
    RateRecorded,
    TransactionPosted,
    TransactionReturned,
    TransactionReversed,
)
from streams.core.model import (
    Account,
    AccountStatus,
    HistoryEntry,
    Hold,
    HoldStatus,
    PostedTransaction,
    RateSnapshot,
)
from streams.core.money import Currency
from streams.core.state import Changes, StateReader

# History kinds of the non-posting changes (transaction legs carry the transaction's own kind).
KIND_ACCOUNT_OPENED = "account_opened"
KIND_STATUS = {
    AccountStatus.OPEN: "account_unfrozen",
    AccountStatus.FROZEN: "account_frozen",
    AccountStatus.CLOSED: "account_closed",
}
KIND_HOLD_PLACED = "hold_placed"
KIND_HOLD_RELEASED = "hold_released"
KIND_HOLD_EXPIRED = "hold_expired"


class _Overlay:
    """The records as they stand part-way through one decision: changed ones first, then the state."""

    __slots__ = ("state", "accounts", "holds", "history", "transactions", "currencies", "rates")

    def __init__(self, state: StateReader) -> None:
        self.state = state
        self.accounts: dict[str, Account] = {}
        self.holds: dict[str, Hold] = {}
        self.history: list[HistoryEntry] = []
        self.transactions: dict[str, PostedTransaction] = {}
        self.currencies: list[Currency] = []
        self.rates: list[RateSnapshot] = []

    def account(self, account_id: str) -> Account:
        account = self.accounts.get(account_id)
        if account is None:
            account = self.state.account(account_id)
            assert account is not None, f"event for unknown account {account_id}"
        return account

    def hold(self, hold_id: str) -> Hold:
        hold = self.holds.get(hold_id)
        if hold is None:
            hold = self.state.hold(hold_id)
            assert hold is not None, f"event for unknown hold {hold_id}"
        return hold

    def note(self, account: Account, kind: str, at_ms: int, hold_id: str | None,
             metadata: tuple[tuple[str, str], ...] = ()) -> None:
        """Store a non-posting change of account and its history entry."""
        self.accounts[account.id] = account
        self.history.append(
            HistoryEntry(
                account.id, account.seq, 0, account.posted, account.held, None, kind, None, None, at_ms,
                hold_id, (), metadata,
            )
        )


def _with(account: Account, *, status: AccountStatus | None = None, held: int | None = None,
          at_ms: int) -> Account:
    """account after a non-posting change (seq + 1)."""
    return Account(
        account.id, account.currency, account.routing_key, account.policy,
        account.status if status is None else status, account.posted,
        account.held if held is None else held, account.seq + 1, account.last_transaction_id, at_ms,
        account.account_type,
    )


def _apply_opened(o: _Overlay, e: AccountOpened) -> None:
    assert o.accounts.get(e.account_id) is None and o.state.account(e.account_id) is None
    account_type = e.account_type if e.account_type is not None else default_account_type(e.account_id)
    account = Account(e.account_id, e.currency, e.routing_key, e.policy, AccountStatus.OPEN, 0, 0, 1, None, e.at_ms,
                      account_type)
    o.note(account, KIND_ACCOUNT_OPENED, e.at_ms, None, ((ACCOUNT_TYPE_KEY, account_type.value),))


def _apply_status(o: _Overlay, e: AccountStatusChanged) -> None:
    account = o.account(e.account_id)
    assert account.status is e.previous, f"{e.account_id}: status is {account.status}, event says {e.previous}"
    o.note(_with(account, status=e.status, at_ms=e.at_ms), KIND_STATUS[e.status], e.at_ms, None)


def _apply_posted(o: _Overlay, e: TransactionPosted) -> None:
    tx = e.transaction_id
    at_ms = e.at_ms
    accounts = o.accounts
    history = o.history
    for leg in e.legs:
        account = o.account(leg.account_id)
        amount = leg.amount
        held = account.held
        hold_id = leg.hold_id
        if hold_id is not None:
            hold = o.hold(hold_id)
            captured = hold.captured - amount
            ids = hold.capture_transaction_ids
            if not ids or ids[-1] != tx:
                ids = (*ids, tx)
            if hold.status is HoldStatus.OPEN:
                assert hold.account_id == account.id and -amount <= hold.remaining
                status = HoldStatus.CAPTURED if captured + hold.released == hold.amount else HoldStatus.OPEN
                o.holds[hold_id] = Hold(
                    hold.id, hold.account_id, hold.amount, captured, hold.released, status, hold.expires_at_ms, ids
                )
                held += amount  # the capture consumes reserved money: posted and held fall together
            else:  # settled late (settlement.py): released money is taken again from available (or, for what
                # available could not cover, from the owner's receivable); the status keeps how the hold ended
                assert -amount <= hold.released, f"late settlement above what hold {hold_id} released"
                o.holds[hold_id] = Hold(
                    hold.id, hold.account_id, hold.amount, captured, hold.released + amount, hold.status,
                    hold.expires_at_ms, ids,
                )
        posted = account.posted + amount
        seq = account.seq + 1
        accounts[account.id] = Account(
            account.id, account.currency, account.routing_key, account.policy, account.status, posted, held,
            seq, tx, at_ms, account.account_type,
        )
        history.append(
            HistoryEntry(account.id, seq, amount, posted, held, tx, e.kind, e.reference, e.occurred_at_ms,
                         at_ms, hold_id, e.links, e.metadata, e.rate_snapshot_id)
        )
    _record_posted(o, e)


def _record_posted(o: _Overlay, e: TransactionPosted) -> None:
    o.transactions[e.transaction_id] = PostedTransaction(
        e.transaction_id, e.client_id, e.legs, e.kind, e.reference, e.rate_snapshot_id, None)


def _apply_reversed(o: _Overlay, e: TransactionReversed) -> None:
    original = o.transactions.get(e.transaction_id) or o.state.transaction(e.transaction_id)
    assert original is not None and original.reversed_by is None, f"reversal of {e.transaction_id} twice"
    o.transactions[e.transaction_id] = dataclasses.replace(original, reversed_by=e.reversed_by)


def _apply_returned(o: _Overlay, e: TransactionReturned) -> None:
    """The payment counts what was returned of it; the return (posted just before) names what it returns."""
    original = o.transactions.get(e.transaction_id) or o.state.transaction(e.transaction_id)
    returning = o.transactions.get(e.returned_by)
    assert original is not None and returning is not None, f"return of {e.transaction_id} without its records"
    o.transactions[e.transaction_id] = dataclasses.replace(original, returned=original.returned + e.amount)
    if returning.returns is None:  # a payment made in steps: each step counts it, the first is the one named
        o.transactions[e.returned_by] = dataclasses.replace(returning, returns=e.transaction_id)


def _apply_currency(o: _Overlay, e: CurrencyRegistered) -> None:
    o.currencies.append(Currency(e.currency, e.scale))


def _apply_rate(o: _Overlay, e: RateRecorded) -> None:
    o.rates.append(e.snapshot)


def _apply_placed(o: _Overlay, e: HoldPlaced) -> None:
    assert o.holds.get(e.hold_id) is None and o.state.hold(e.hold_id) is None
    account = o.account(e.account_id)
    o.holds[e.hold_id] = Hold(e.hold_id, e.account_id, e.amount, 0, 0, HoldStatus.OPEN, e.expires_at_ms, ())
    o.note(_with(account, held=account.held + e.amount, at_ms=e.at_ms), KIND_HOLD_PLACED, e.at_ms, e.hold_id)


def _end_hold(o: _Overlay, hold_id: str, account_id: str, amount: int, status: HoldStatus, kind: str,
              at_ms: int) -> None:
    hold = o.hold(hold_id)
    assert hold.status is HoldStatus.OPEN and hold.remaining == amount and hold.account_id == account_id
    o.holds[hold_id] = Hold(
        hold.id, hold.account_id, hold.amount, hold.captured, hold.released + amount, status,
        hold.expires_at_ms, hold.capture_transaction_ids,
    )
    account = o.account(account_id)
    o.note(_with(account, held=account.held - amount, at_ms=at_ms), kind, at_ms, hold_id)


def _apply_released(o: _Overlay, e: HoldReleased) -> None:
    _end_hold(o, e.hold_id, e.account_id, e.amount, HoldStatus.RELEASED, KIND_HOLD_RELEASED, e.at_ms)


def _apply_expired(o: _Overlay, e: HoldExpired) -> None:
    _end_hold(o, e.hold_id, e.account_id, e.amount, HoldStatus.EXPIRED, KIND_HOLD_EXPIRED, e.at_ms)


_APPLIERS = {
    AccountOpened: _apply_opened,
    AccountStatusChanged: _apply_status,
    TransactionPosted: _apply_posted,
    TransactionReversed: _apply_reversed,
    TransactionReturned: _apply_returned,
    CurrencyRegistered: _apply_currency,
    RateRecorded: _apply_rate,
    HoldPlaced: _apply_placed,
    HoldReleased: _apply_released,
    HoldExpired: _apply_expired,
}


def apply(state: StateReader, events: Iterable[Event]) -> Changes:
    """The complete records changed by events (accounts, holds, history); processed is left None."""
    overlay = _Overlay(state)
    for event in events:
        _APPLIERS[type(event)](overlay, event)  # KeyError here = not an event: a programmer error
    return Changes(overlay.accounts, overlay.holds, tuple(overlay.history), None, overlay.transactions,
                   tuple(overlay.currencies), tuple(overlay.rates))
