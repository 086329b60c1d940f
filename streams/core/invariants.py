"""Assertions for programmer errors: the invariants every stored record and every decision must keep.

They raise AssertionError (crash on violation, TIGER_STYLE). execute calls assert_changes_balanced before
returning a decision. check_account / check_hold say what a stored account or hold must satisfy: the tests
assert them after every step; the worker does not call them on load (a stored record is one the core wrote,
and the oracles of projections/verify.py check the same properties over the topics).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from streams.core.model import Account, AccountStatus, Hold, HoldStatus
from streams.core.money import MAX_ABS_AMOUNT


def check_account(account: Account) -> None:
    """Assert that a stored account record is internally consistent."""
    assert type(account.posted) is int and type(account.held) is int, "money must be int"
    assert abs(account.posted) <= MAX_ABS_AMOUNT, f"{account.id}: posted out of range"
    assert 0 <= account.held <= MAX_ABS_AMOUNT, f"{account.id}: held out of range"
    assert account.seq >= 1, f"{account.id}: seq must start at 1"
    floor = account.floor
    assert floor is None or account.available >= floor, f"{account.id}: below its floor (P2)"
    if account.status is AccountStatus.CLOSED:
        assert account.posted == 0 and account.held == 0, f"{account.id}: closed but not empty"


def check_hold(hold: Hold) -> None:
    """Assert that a stored hold record is internally consistent (P5)."""
    assert hold.amount > 0 and hold.captured >= 0 and hold.released >= 0, f"hold {hold.id}: negative part"
    assert hold.remaining >= 0, f"hold {hold.id}: captured + released above amount"
    if hold.status is HoldStatus.OPEN:
        assert hold.remaining > 0, f"hold {hold.id}: open with nothing remaining"
    else:
        assert hold.remaining == 0, f"hold {hold.id}: ended with money still reserved"


def assert_changes_balanced(
    before: Mapping[str, Account | None], after: Iterable[Account]
) -> None:
    """Assert P1 for one decision: the posted deltas of the changed accounts sum to zero per currency."""
    totals: dict[str, int] = {}
    for account in after:
        old = before.get(account.id)
        delta = account.posted - (old.posted if old is not None else 0)
        if delta:
            totals[account.currency] = totals.get(account.currency, 0) + delta
    for currency, total in totals.items():
        assert total == 0, f"decision does not balance in {currency}: {total}"
