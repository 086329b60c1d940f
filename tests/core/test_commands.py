"""Command helpers and small core values, exactly: accounts_touched, reversal_of, decide without writes,
Rejection.from_code, the currency registry, and the status commands' own refusals."""
from __future__ import annotations

import pytest

from streams.core import (
    DEFAULT_CURRENCIES,
    AccountPolicy,
    AccountStatus,
    AccountStatusChanged,
    CloseAccount,
    Currency,
    CurrencyRegistry,
    ExpireHold,
    FreezeAccount,
    Leg,
    MemoryState,
    OpenAccount,
    PlaceHold,
    PostTransaction,
    Rejection,
    ReleaseHold,
    UnfreezeAccount,
    HoldReleased,
    accounts_touched,
    apply,
    decide,
    execute,
    reversal_of,
)

from .ledger_dsl import run

BASE = dict(client_id="c", at_ms=5)
TX = PostTransaction(command_id="t", **BASE, transaction_id="t1", kind="fx", reference="ref-1", links=("t0",),
                     metadata=(("desk", "7"),), occurred_at_ms=3, rate_snapshot_id="rate-9",
                     legs=(Leg("a:USD", -10, "h1", "USD"), Leg("b:USD", 4), Leg("a:USD", 6), Leg("c:USD", 0)))


@pytest.mark.parametrize("command, touched", [
    (TX, ("a:USD", "b:USD", "c:USD")),
    (OpenAccount(command_id="o", **BASE, account_id="x", currency="USD"), ("x",)),
    (FreezeAccount(command_id="f", **BASE, account_id="x"), ("x",)),
    (UnfreezeAccount(command_id="u", **BASE, account_id="x"), ("x",)),
    (CloseAccount(command_id="k", **BASE, account_id="x"), ("x",)),
    (PlaceHold(command_id="p", **BASE, hold_id="h", account_id="x", amount=1), ("x",)),
    (ReleaseHold(command_id="r", **BASE, hold_id="h"), ()),
    (ExpireHold(command_id="e", **BASE, hold_id="h"), ()),
])
def test_accounts_touched(command, touched) -> None:
    assert accounts_touched(command) == touched


def test_accounts_touched_refuses_what_is_not_a_command() -> None:
    with pytest.raises(TypeError, match="not a command"):
        accounts_touched(Leg("a", 1))


def test_reversal_of_mirrors_every_leg_and_keeps_only_what_it_should() -> None:
    reversal = reversal_of(TX, transaction_id="r1", command_id="rc", client_id="ops", at_ms=99)
    assert reversal == PostTransaction(
        command_id="rc", client_id="ops", at_ms=99, transaction_id="r1", kind="reversal", reference="ref-1",
        links=("t1",), metadata=(), occurred_at_ms=None, rate_snapshot_id="rate-9",
        legs=(Leg("a:USD", 10, None, "USD"), Leg("b:USD", -4), Leg("a:USD", -6), Leg("c:USD", 0)))
    own = reversal_of(TX, transaction_id="r2", command_id="rc2", client_id="ops", at_ms=99, reference="mine",
                      occurred_at_ms=42)
    assert (own.reference, own.occurred_at_ms) == ("mine", 42)  # the reversal's own business time, if given


def test_decide_is_execute_without_writes() -> None:
    ledger = run("""
open world:USD USD neg   | ok
open a:USD USD           | ok
""")
    command = PostTransaction(command_id="d", client_id="c", at_ms=9, transaction_id="d", kind="deposit",
                              legs=(Leg("world:USD", -5), Leg("a:USD", 5)))
    before = dict(ledger.state.accounts)
    result = decide(ledger.state, command)
    assert result == execute(ledger.state, command)[0]
    assert result.accepted and ledger.state.accounts == before and ("c", "d") not in ledger.state.inbox
    # The registry is the third argument: without USD the same open is refused.
    assert decide(MemoryState(), OpenAccount(command_id="o", **BASE, account_id="x", currency="USD"),
                  CurrencyRegistry()).reason is Rejection.UNKNOWN_CURRENCY


@pytest.mark.parametrize("cls", [FreezeAccount, UnfreezeAccount, CloseAccount])
def test_status_commands_need_an_account(cls) -> None:
    state = MemoryState()
    empty, _ = execute(state, cls(command_id="s1", **BASE, account_id=""))
    assert (empty.reason, empty.detail) == (Rejection.INVALID_COMMAND, "account_id is empty")
    unknown, _ = execute(state, cls(command_id="s2", **BASE, account_id="nobody"))
    assert (unknown.reason, unknown.detail) == (Rejection.UNKNOWN_ACCOUNT, "account nobody does not exist")


@pytest.mark.parametrize("command", [
    PlaceHold(command_id="h1", **BASE, hold_id="", account_id="a:USD", amount=5),
    ReleaseHold(command_id="h2", **BASE, hold_id=""),
    ExpireHold(command_id="h3", **BASE, hold_id=""),
], ids=["place", "release", "expire"])
def test_hold_commands_need_a_hold_id(command) -> None:
    """An empty hold id is an invalid command, never a hold: placed, it could not be captured or released by
    name; released or expired, it names nothing."""
    ledger = run("open a:USD USD | ok")
    result, changes = execute(ledger.state, command)
    assert (result.reason, result.detail) == (Rejection.INVALID_COMMAND, "hold_id is empty")
    assert not changes.holds and not changes.accounts


def test_status_changes_are_events_with_both_statuses() -> None:
    ledger = run("open a:USD USD | ok")
    frozen, _ = execute(ledger.state, FreezeAccount(command_id="f", client_id="c", at_ms=7, account_id="a:USD"))
    assert frozen.events == (AccountStatusChanged(account_id="a:USD", previous=AccountStatus.OPEN,
                                                  status=AccountStatus.FROZEN, at_ms=7),)
    ledger = run("""
open a:USD USD | ok
freeze a:USD   | ok
""")
    for cls, status in ((UnfreezeAccount, AccountStatus.OPEN), (CloseAccount, AccountStatus.CLOSED)):
        result, _ = execute(ledger.state, cls(command_id=cls.__name__, client_id="c", at_ms=8, account_id="a:USD"))
        assert result.events == (AccountStatusChanged(account_id="a:USD", previous=AccountStatus.FROZEN,
                                                      status=status, at_ms=8),)


@pytest.mark.parametrize("reason", list(Rejection))
def test_rejection_codes_round_trip(reason: Rejection) -> None:
    assert Rejection.from_code(reason.code) is reason


def test_an_unknown_rejection_code_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="unknown rejection code 'no_such_reason'"):
        Rejection.from_code("no_such_reason")


def test_the_registry_accepts_the_same_currency_twice_and_answers_membership() -> None:
    registry = CurrencyRegistry([Currency("A", 1), Currency("A", 1), Currency("B", 0)])
    assert [c.code for c in registry] == ["A", "B"] and len(registry) == 2
    assert "A" in registry and "C" not in registry
    assert registry.with_currency(Currency("B", 0)).get("B") == Currency("B", 0)
    assert "USD" in DEFAULT_CURRENCIES and AccountPolicy().overdraft_limit == 0


def test_an_ended_hold_keeps_its_record() -> None:
    ledger = run("""
open world:USD USD neg                | ok
open a:USD USD                        | ok
transfer d1 world:USD->a:USD 10       | ok
hold h1 a:USD 4 expires=90000         | ok
capture c1 h1 a:USD->world:USD 1      | ok
release h1                            | ok | a:USD=9/0
""")
    hold = ledger.state.holds["h1"]
    assert (hold.amount, hold.captured, hold.released, hold.expires_at_ms, hold.capture_transaction_ids) == (
        400, 100, 300, 90000, ("c1",))


@pytest.mark.parametrize("amount, account", [(299, "a:USD"), (300, "world:USD")])
def test_apply_refuses_a_release_that_does_not_match_the_hold(amount: int, account: str) -> None:
    """apply asserts hold transitions (a programmer error, e.g. a corrupt event log): the released amount
    must be the hold's remainder, on the hold's own account."""
    ledger = run("""
open world:USD USD neg                | ok
open a:USD USD                        | ok
transfer d1 world:USD->a:USD 10       | ok
hold h1 a:USD 3                       | ok
""")
    with pytest.raises(AssertionError):
        apply(ledger.state, (HoldReleased(hold_id="h1", account_id=account, amount=amount, at_ms=1),))
    apply(ledger.state, (HoldReleased(hold_id="h1", account_id="a:USD", amount=300, at_ms=1),))


def test_apply_refuses_to_open_an_account_or_place_a_hold_twice_in_one_stream() -> None:
    """An account or a hold is created once: a stream (one batch of events, e.g. a corrupt log replayed)
    that creates the same one twice trips apply's assertion, whether the first is stored or in the batch."""
    from streams.core import AccountOpened, HoldPlaced, MemoryState

    opened = AccountOpened(account_id="a:USD", currency="USD", routing_key="a", policy=AccountPolicy(), at_ms=1)
    placed = HoldPlaced(hold_id="h1", account_id="a:USD", amount=1, expires_at_ms=None, at_ms=2)
    with pytest.raises(AssertionError):
        apply(MemoryState(), (opened, opened))
    with pytest.raises(AssertionError):
        apply(MemoryState(), (opened, placed, placed))
    state = MemoryState()
    state.commit(apply(state, (opened,)))
    with pytest.raises(AssertionError):
        apply(state, (opened,))


@pytest.mark.parametrize("routing_key, accepted", [
    (None, True), ("user:42", True), ("", False), ("user:43", False), ("user:42:USD", False)])
def test_an_account_routing_key_is_its_ids_owner_part_or_none(routing_key, accepted) -> None:
    """Producers route an account by its id: a stored routing key naming another owner would never be used."""
    result = decide(MemoryState(), OpenAccount(command_id="o", **BASE, account_id="user:42:USD", currency="USD",
                                               routing_key=routing_key))
    assert result.accepted is accepted
    if not accepted:
        assert result.reason is Rejection.INVALID_COMMAND and "owner part" in result.detail
