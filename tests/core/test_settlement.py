"""Settlement terms (streams/core/settlement.py): capture modes and late settlements, table-driven.

Each row: how the hold stands, what the settling transaction states, what it captures; expected outcome (or
notice), the user's (posted, held), the receivable's posted and the hold's (status, captured, released).
The user starts with 1,000 (minor units), a hold of 400 (expiring at t=100) and the row's own history.
"""
from __future__ import annotations

import pytest

from streams.core import (
    SYSTEM_POLICY,
    HoldStatus,
    Leg,
    MemoryState,
    OpenAccount,
    PlaceHold,
    PostTransaction,
    ReleaseHold,
    ExpireHold,
    check_account,
    check_hold,
    execute,
)
from streams.core.settlement import CAPTURE_KEY, SETTLEMENT_KEY, LATE_SETTLEMENT, judge_capture, terms_of, STRICT
from streams.core.money import Currency, CurrencyRegistry

CUR = CurrencyRegistry([Currency("USD", 2)])
USER, PAYEE, WORLD = "user:1:USD", "sys:payee:USD", "sys:world:USD"
RECEIVABLE = "user:1:receivable.USD"
EXTERNAL = ((SETTLEMENT_KEY, "external"),)
EXACT = ((CAPTURE_KEY, "exact"),)
BOTH = tuple(sorted(EXTERNAL + EXACT))


class Ledger:
    def __init__(self):
        self.state = MemoryState()
        self.n = 0
        for account, policy in ((USER, None), (PAYEE, SYSTEM_POLICY), (WORLD, SYSTEM_POLICY)):
            kw = {} if policy is None else {"policy": policy}
            self.run(OpenAccount(command_id=f"o-{account}", client_id="t", at_ms=1, account_id=account,
                                 currency="USD", **kw))
        self.pay(WORLD, USER, 1000)
        self.run(PlaceHold(command_id="h", client_id="t", at_ms=2, hold_id="h1", account_id=USER, amount=400,
                           expires_at_ms=100))

    def run(self, command):
        result, changes = execute(self.state, command, CUR)
        self.state.commit(changes)
        for account in self.state.accounts.values():
            check_account(account)
        for hold in self.state.holds.values():
            check_hold(hold)
        return result

    def pay(self, src, dst, amount, at_ms=3):
        self.n += 1
        return self.run(PostTransaction(command_id=f"p{self.n}", client_id="t", at_ms=at_ms,
                                        transaction_id=f"p{self.n}", legs=(Leg(src, -amount), Leg(dst, amount))))

    def capture(self, amount, metadata=(), at_ms=10, extra=0):
        self.n += 1
        legs = (Leg(USER, -amount, "h1"), Leg(PAYEE, amount + extra)) + ((Leg(USER, -extra),) if extra else ())
        return self.run(PostTransaction(command_id=f"c{self.n}", client_id="t", at_ms=at_ms,
                                        transaction_id=f"c{self.n}", legs=legs, metadata=metadata))

    def balance(self, account):
        a = self.state.accounts.get(account)
        return None if a is None else (a.posted, a.held)


def release(ledger):
    assert ledger.run(ReleaseHold(command_id="r", client_id="t", at_ms=5, hold_id="h1")).accepted


def expire(ledger):
    assert ledger.run(ExpireHold(command_id="x", client_id="t", at_ms=100, hold_id="h1")).accepted


def spend(amount):
    def go(ledger):
        assert ledger.pay(USER, WORLD, amount, at_ms=6).accepted
    return go


def captured(amount):
    def go(ledger):
        assert ledger.capture(amount, at_ms=4).accepted
    return go


ROWS = [
    # id, before, metadata, capture, at_ms, outcome, user (posted, held), receivable, hold (status, captured, released)
    ("partial-open", [], (), 150, 10, "accepted", (850, 250), None, ("open", 150, 0)),
    ("partial-full", [], (), 400, 10, "accepted", (600, 0), None, ("captured", 400, 0)),
    ("over-hold", [], (), 401, 10, "capture_exceeds_hold", (1000, 400), None, ("open", 0, 0)),
    ("exact-open", [], EXACT, 400, 10, "accepted", (600, 0), None, ("captured", 400, 0)),
    ("exact-short", [], EXACT, 399, 10, "capture_not_exact", (1000, 400), None, ("open", 0, 0)),
    ("exact-after-partial", [captured(100)], EXACT, 200, 10, "capture_not_exact", (900, 300), None,
     ("open", 100, 0)),
    ("strict-overdue", [], (), 400, 100, "hold_expired", (1000, 400), None, ("open", 0, 0)),
    ("external-overdue", [], EXTERNAL, 400, 100, "accepted", (600, 0), None, ("captured", 400, 0)),
    ("strict-released", [release], (), 400, 10, "hold_not_open", (1000, 0), None, ("released", 0, 400)),
    ("late-released", [release], EXTERNAL, 400, 10, LATE_SETTLEMENT, (600, 0), None, ("released", 400, 0)),
    ("late-expired-part", [expire], EXTERNAL, 150, 120, LATE_SETTLEMENT, (850, 0), None, ("expired", 150, 250)),
    ("late-exact", [expire], BOTH, 400, 120, LATE_SETTLEMENT, (600, 0), None, ("expired", 400, 0)),
    ("late-exact-short", [expire], BOTH, 399, 120, "capture_not_exact", (1000, 0), None, ("expired", 0, 400)),
    ("late-above-release", [captured(100), release], EXTERNAL, 301, 10, "capture_exceeds_hold", (900, 0), None,
     ("released", 100, 300)),
    # The user spent what the release gave back: available covers 100 of 400, the receivable the other 300.
    ("late-overdraw", [release, spend(900)], EXTERNAL, 400, 10, LATE_SETTLEMENT, (0, 0), -300,
     ("released", 400, 0)),
    ("late-overdraw-all", [release, spend(1000)], EXTERNAL, 400, 10, LATE_SETTLEMENT, (0, 0), -400,
     ("released", 400, 0)),
    # The boundary: available short of the late capture by one minor unit, and covering it exactly.
    ("late-overdraw-one", [release, spend(601)], EXTERNAL, 400, 10, LATE_SETTLEMENT, (0, 0), -1,
     ("released", 400, 0)),
    ("late-covered-exactly", [release, spend(600)], EXTERNAL, 400, 10, LATE_SETTLEMENT, (0, 0), None,
     ("released", 400, 0)),
    ("late-twice", [release, lambda l: l.capture(400, EXTERNAL)], EXTERNAL, 1, 10, "capture_exceeds_hold",
     (600, 0), None, ("released", 400, 0)),
    ("captured-hold", [captured(400)], EXTERNAL, 1, 10, "hold_not_open", (600, 0), None, ("captured", 400, 0)),
]


@pytest.mark.parametrize("row", ROWS, ids=[r[0] for r in ROWS])
def test_settlement_terms(row):
    _, before, metadata, amount, at_ms, outcome, user, receivable, hold = row
    ledger = Ledger()
    for step in before:
        step(ledger)
    result = ledger.capture(amount, metadata, at_ms)
    got = result.reason.code if result.reason is not None else (result.notice or result.outcome)
    assert got == outcome, result.detail
    assert ledger.balance(USER) == user
    assert ledger.balance(RECEIVABLE) == (None if receivable is None else (receivable, 0))
    h = ledger.state.holds["h1"]
    assert (h.status.value, h.captured, h.released) == hold
    if result.accepted:  # the payee got exactly what was settled, whoever paid it
        assert ledger.state.accounts[PAYEE].posted == amount


def test_a_late_settlement_also_pays_other_debits_only_from_available():
    """Only the late capture may overdraw into the receivable: another debit in the same transaction is
    still refused for want of funds."""
    ledger = Ledger()
    release(ledger)
    spend(1000)(ledger)
    result = ledger.capture(400, EXTERNAL, extra=1)
    assert result.reason is not None and result.reason.code == "insufficient_funds"


def test_a_late_settlement_of_two_holds_overdraws_only_the_account_that_is_short():
    """One settlement capturing ended holds of two accounts: the one whose available cannot cover its capture
    overdraws into its receivable, the other pays from its own money and gets no receivable."""
    other, other_receivable = "user:2:USD", "user:2:receivable.USD"
    ledger = Ledger()
    ledger.run(OpenAccount(command_id="o-2", client_id="t", at_ms=1, account_id=other, currency="USD"))
    ledger.pay(WORLD, other, 1000)
    assert ledger.run(PlaceHold(command_id="h2", client_id="t", at_ms=2, hold_id="h2", account_id=other,
                                amount=400, expires_at_ms=100)).accepted
    release(ledger)
    assert ledger.run(ReleaseHold(command_id="r2", client_id="t", at_ms=5, hold_id="h2")).accepted
    spend(900)(ledger)  # user:1 has 100 left for its 400
    result = ledger.run(PostTransaction(command_id="c", client_id="t", at_ms=10, transaction_id="c", legs=(
        Leg(USER, -400, "h1"), Leg(other, -400, "h2"), Leg(PAYEE, 800)), metadata=EXTERNAL))
    assert result.notice == LATE_SETTLEMENT, result.detail
    assert ledger.balance(USER) == (0, 0) and ledger.balance(RECEIVABLE) == (-300, 0)
    assert ledger.balance(other) == (600, 0) and ledger.balance(other_receivable) is None


def test_the_receivable_lives_with_its_owner_and_the_overdraw_names_the_hold():
    ledger = Ledger()
    release(ledger)
    spend(900)(ledger)
    ledger.capture(400, EXTERNAL)
    receivable = ledger.state.accounts[RECEIVABLE]
    assert receivable.routing_key == "user:1" and receivable.policy.allow_negative
    entry = [h for h in ledger.state.history if h.account_id == RECEIVABLE and h.amount][0]
    assert (entry.amount, entry.hold_id) == (-300, "h1")


@pytest.mark.parametrize("metadata, want", [
    ((), STRICT), (((CAPTURE_KEY, "partial"),), STRICT), (((CAPTURE_KEY, "all"),), str),
    (((SETTLEMENT_KEY, "yes"),), str),
])
def test_terms_are_read_strictly(metadata, want):
    terms = terms_of(metadata)
    assert (type(terms) is str) if want is str else terms == want


def test_malformed_terms_are_invalid_commands():
    ledger = Ledger()
    result = ledger.capture(100, ((CAPTURE_KEY, "most"),))
    assert result.reason.code == "invalid_command" and ledger.balance(USER) == (1000, 400)


def test_judge_capture_counts_what_is_reserved_elsewhere():
    ledger = Ledger()
    hold = ledger.state.holds["h1"]
    terms = terms_of(EXTERNAL)
    assert judge_capture("h1", hold, USER, 300, terms, 10, reserved=100) is False
    assert judge_capture("h1", hold, USER, 301, terms, 10, reserved=100)[0].code == "capture_exceeds_hold"
    assert judge_capture("h9", None, USER, 1, terms, 10)[0].code == "unknown_hold"
    assert HoldStatus.OPEN.value == "open"


def test_a_frozen_account_still_takes_a_late_settlement_but_no_ordinary_debit():
    from streams.core import FreezeAccount
    ledger = Ledger()
    release(ledger)
    assert ledger.run(FreezeAccount(command_id="f", client_id="t", at_ms=6, account_id=USER)).accepted
    assert ledger.capture(100, EXTERNAL).notice == LATE_SETTLEMENT       # the money already left
    assert ledger.balance(USER) == (900, 0)
    assert ledger.pay(USER, WORLD, 1, at_ms=7).reason.code == "account_frozen"


def test_a_receivable_an_operator_closed_refuses_the_overdraw():
    from streams.core import CloseAccount
    ledger = Ledger()
    release(ledger)
    spend(1000)(ledger)
    ledger.run(OpenAccount(command_id="o-r", client_id="t", at_ms=7, account_id=RECEIVABLE, currency="USD",
                           policy=SYSTEM_POLICY))
    assert ledger.run(CloseAccount(command_id="c-r", client_id="t", at_ms=8, account_id=RECEIVABLE)).accepted
    result = ledger.capture(400, EXTERNAL)
    assert result.reason.code == "account_closed" and ledger.balance(USER) == (0, 0)


def test_a_late_settlement_of_two_ended_holds_of_one_account_overdraws_only_what_it_cannot_cover():
    """Two ended holds of one account captured late in one settlement (400 and 300) with 200 available: the
    shortfall of 500 goes to the receivable, the first leg's 400 of it and the second leg's remaining 100; the
    account pays its own 200 and ends at zero, not above it."""
    ledger = Ledger()
    assert ledger.run(PlaceHold(command_id="h3", client_id="t", at_ms=2, hold_id="h3", account_id=USER,
                                amount=300, expires_at_ms=100)).accepted
    release(ledger)
    assert ledger.run(ReleaseHold(command_id="r3", client_id="t", at_ms=5, hold_id="h3")).accepted
    spend(800)(ledger)
    result = ledger.run(PostTransaction(command_id="c", client_id="t", at_ms=10, transaction_id="c", legs=(
        Leg(USER, -400, "h1"), Leg(USER, -300, "h3"), Leg(PAYEE, 700)), metadata=EXTERNAL))
    assert result.notice == LATE_SETTLEMENT, result.detail
    assert ledger.balance(USER) == (0, 0) and ledger.balance(RECEIVABLE) == (-500, 0)
    assert ledger.state.accounts[PAYEE].posted == 700
