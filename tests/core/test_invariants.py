"""The record invariants (streams/core/invariants.py), table-driven: each broken record must trip its assertion,
and the records at the edge of every rule must pass. The engine calls these after loading a record; a check that
passes everything would let a corrupt store through unnoticed."""
from __future__ import annotations

import dataclasses

import pytest

from streams.core import (
    MAX_ABS_AMOUNT,
    Account,
    AccountPolicy,
    AccountStatus,
    Hold,
    HoldStatus,
    check_account,
    check_hold,
)
from streams.core.invariants import assert_changes_balanced

ACCOUNT = Account(id="a", currency="USD", routing_key="a", policy=AccountPolicy(overdraft_limit=10),
                  status=AccountStatus.OPEN, posted=100, held=60, seq=3, last_transaction_id=None, updated_at_ms=1)
HOLD = Hold(id="h", account_id="a", amount=100, captured=30, released=0, status=HoldStatus.OPEN,
            expires_at_ms=None, capture_transaction_ids=("t",))
NEGATIVE = AccountPolicy(allow_negative=True)


@pytest.mark.parametrize("changes", [
    {},
    {"posted": MAX_ABS_AMOUNT, "held": MAX_ABS_AMOUNT},
    {"posted": -10, "held": 0},  # available exactly at the floor (-overdraft_limit)
    {"posted": 50, "held": 60},
    {"posted": -MAX_ABS_AMOUNT, "held": 0, "policy": NEGATIVE},  # no floor at all
    {"posted": -1, "held": MAX_ABS_AMOUNT, "policy": NEGATIVE},
    {"seq": 1},
    {"status": AccountStatus.CLOSED, "posted": 0, "held": 0},
    {"status": AccountStatus.FROZEN},
], ids=repr)
def test_consistent_accounts_pass(changes: dict) -> None:
    check_account(dataclasses.replace(ACCOUNT, **changes))


@pytest.mark.parametrize("changes, message", [
    ({"posted": 100.0}, "money must be int"),
    ({"held": True}, "money must be int"),
    ({"posted": MAX_ABS_AMOUNT + 1, "held": 0, "policy": NEGATIVE}, "posted out of range"),
    ({"posted": -MAX_ABS_AMOUNT - 1, "held": 0, "policy": NEGATIVE}, "posted out of range"),
    ({"held": -1}, "held out of range"),
    ({"posted": MAX_ABS_AMOUNT, "held": MAX_ABS_AMOUNT + 1}, "held out of range"),
    ({"seq": 0}, "seq must start at 1"),
    ({"posted": -11, "held": 0}, "below its floor"),
    ({"posted": 49, "held": 60}, "below its floor"),
    ({"status": AccountStatus.CLOSED, "posted": 0, "held": 1, "policy": NEGATIVE}, "closed but not empty"),
    ({"status": AccountStatus.CLOSED, "posted": -1, "held": 0, "policy": NEGATIVE}, "closed but not empty"),
    ({"status": AccountStatus.CLOSED, "posted": 1, "held": 0}, "closed but not empty"),
], ids=repr)
def test_broken_accounts_trip_their_assertion(changes: dict, message: str) -> None:
    with pytest.raises(AssertionError, match=message):
        check_account(dataclasses.replace(ACCOUNT, **changes))


@pytest.mark.parametrize("changes", [
    {},
    {"captured": 0, "released": 0},
    {"captured": 99, "released": 0},  # one unit still reserved
    {"status": HoldStatus.CAPTURED, "captured": 100},
    {"status": HoldStatus.RELEASED, "captured": 30, "released": 70},
    {"status": HoldStatus.EXPIRED, "captured": 0, "released": 100},
], ids=repr)
def test_consistent_holds_pass(changes: dict) -> None:
    check_hold(dataclasses.replace(HOLD, **changes))


@pytest.mark.parametrize("changes, message", [
    ({"amount": 0, "captured": 0}, "negative part"),
    ({"captured": -1}, "negative part"),
    ({"released": -1}, "negative part"),
    ({"captured": 60, "released": 41}, "above amount"),
    ({"captured": 100}, "open with nothing remaining"),
    ({"status": HoldStatus.CAPTURED, "captured": 99}, "ended with money still reserved"),
    ({"status": HoldStatus.RELEASED, "captured": 30, "released": 69}, "ended with money still reserved"),
], ids=repr)
def test_broken_holds_trip_their_assertion(changes: dict, message: str) -> None:
    with pytest.raises(AssertionError, match=message):
        check_hold(dataclasses.replace(HOLD, **changes))


def test_a_decision_must_balance_per_currency() -> None:
    b = dataclasses.replace(ACCOUNT, id="b", posted=0, held=0)
    btc = dataclasses.replace(ACCOUNT, id="x", currency="BTC", posted=0, held=0)
    before = {"a": ACCOUNT, "b": b, "x": btc}
    moved = [dataclasses.replace(ACCOUNT, posted=70), dataclasses.replace(b, posted=30)]
    assert_changes_balanced(before, moved)
    assert_changes_balanced({"a": ACCOUNT, "new": None},
                            [dataclasses.replace(ACCOUNT, posted=95), dataclasses.replace(b, id="new", posted=5)])
    with pytest.raises(AssertionError, match="does not balance in USD: -1"):
        assert_changes_balanced(before, [dataclasses.replace(ACCOUNT, posted=70), dataclasses.replace(b, posted=29)])
    with pytest.raises(AssertionError, match="does not balance in BTC: 5"):
        assert_changes_balanced(before, moved + [dataclasses.replace(btc, posted=5)])
