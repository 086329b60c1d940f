"""The plain transfer (one debit leg, one credit leg, no hold, metadata or rate) is decided by the fast path in
streams/core/decide.py, without the general rules: it is most of the load, and its cost is the one
docs/core.md measures. Accepting on the fast path must agree with the general rules (the answers are
checked everywhere else); this checks that every acceptable plain transfer, up to each limit exactly, stays on it
instead of falling back to the slower general rules."""
from __future__ import annotations

import sys

import pytest

from streams.core import MAX_ABS_AMOUNT, Leg, execute

from .ledger_dsl import Ledger

DECIDE = sys.modules["streams.core.decide"]
SETUP = """
open world:USD USD neg            | ok
open mint:USD USD neg             | ok
open u:USD USD overdraft=5.00     | ok
open v:USD USD max=100.00         | ok
open w:USD USD                    | ok
transfer d1 world:USD->u:USD 10.00 | ok
hold h1 u:USD 2.00                | ok
"""

ROWS = [
    # id, debit account, credit account, amount (minor units), what is at its limit afterwards
    ("one-minor-unit", "u:USD", "w:USD", 1),
    ("down-to-the-overdraft-limit", "u:USD", "w:USD", 1300),  # 10.00 - 2.00 held - 13.00 = -5.00
    ("a-negative-account-far-below-zero", "world:USD", "w:USD", 10**20),
    ("up-to-the-balance-cap", "world:USD", "v:USD", 10000),
    ("the-largest-amount", "world:USD", "w:USD", MAX_ABS_AMOUNT - 1000),  # world: -(MAX - 1000) - 1000 = -MAX
    ("both-balances-to-the-largest", "mint:USD", "w:USD", MAX_ABS_AMOUNT),  # mint -MAX, w +MAX
]


@pytest.mark.parametrize("debit, credit, amount", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_an_acceptable_plain_transfer_never_needs_the_general_rules(debit, credit, amount, monkeypatch) -> None:
    ledger = Ledger().run(SETUP)
    command = ledger._command(100, f"transfer t1 {debit}->{credit} 0.01")
    command = command.with_legs((Leg(debit, -amount), Leg(credit, amount)))
    general = []
    rules = DECIDE._judge_transaction_rules
    monkeypatch.setattr(DECIDE, "_judge_transaction_rules", lambda *a, **k: general.append(a) or rules(*a, **k))
    result, _ = execute(ledger.state, command, ledger.currencies)
    assert result.accepted, result.detail
    assert general == [], "decided by the general rules"
