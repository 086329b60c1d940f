"""Linked commands (streams/core/linked.py), table-driven: each batch is a list of scenario-language commands
(tests/core/ledger_dsl.py), its expected answers in order, and the balances after it is committed."""
from __future__ import annotations

import pytest

from streams.core.linked import (execute_linked, exposure, first_failure, first_refused, judge_placement, refuse_all,
                                 unit_answers)
from streams.core import execute
from streams.core.rejections import Rejection

from .ledger_dsl import Ledger

SETUP = """
open world:USD USD neg | ok
open a:USD USD         | ok
open b:USD USD         | ok
open c:USD USD         | ok
transfer d1 world:USD->a:USD 10.00 kind=deposit | ok | a:USD=10.00
"""

CASES = [
    ("all accepted: a later command spends what an earlier one credited",
     ["transfer t1 a:USD->b:USD 10.00 id=l1", "transfer t2 b:USD->c:USD 7.00 id=l2", "hold h1 c:USD 7.00 id=l3"],
     ["ok", "ok", "ok"], "a:USD=0 b:USD=3.00 c:USD=7.00/7.00"),
    ("one refused: nothing takes effect, the others are linked_failed",
     ["transfer t1 a:USD->b:USD 10.00 id=l1", "transfer t2 b:USD->c:USD 11.00 id=l2", "open e:USD USD id=l3"],
     ["linked_failed", "insufficient_funds", "linked_failed"], "a:USD=10.00 b:USD=0 c:USD=0"),
    ("the first refused",
     ["transfer t1 nobody:USD->b:USD 1.00 id=l1", "transfer t2 a:USD->b:USD 1.00 id=l2"],
     ["unknown_account", "linked_failed"], "a:USD=10.00 b:USD=0"),
    ("two commands of the batch take the same money: the second is refused, so is the first",
     ["transfer t1 a:USD->b:USD 6.00 id=l1", "transfer t2 a:USD->c:USD 6.00 id=l2"],
     ["linked_failed", "insufficient_funds"], "a:USD=10.00 b:USD=0 c:USD=0"),
    # each command is decided against everything the ones before it leave: a hold they placed, a transaction
    # they posted
    ("a later command captures a hold an earlier one placed",
     ["hold h1 a:USD 4.00 id=l1", "capture t1 h1 a:USD->b:USD 4.00 id=l2"],
     ["ok", "ok"], "a:USD=6.00/0 b:USD=4.00"),
    ("a later command reverses a transaction an earlier one posted",
     ["transfer t1 a:USD->b:USD 3.00 id=l1", "reverse r1 t1 a:USD id=l2"],
     ["ok", "ok"], "a:USD=10.00 b:USD=0"),
    ("a later command opens an account in a currency an earlier one registered",
     ["register XAU 3 id=l1", "open vault:XAU XAU neg id=l2", "open b:XAU XAU id=l3"],
     ["ok", "ok", "ok"], ""),
]


@pytest.mark.parametrize("name,batch,expected,balances", CASES, ids=[c[0] for c in CASES])
def test_a_linked_batch_posts_all_or_nothing(name, batch, expected, balances) -> None:
    ledger = Ledger().run(SETUP)
    commands = [ledger._command(100 + i, text) for i, text in enumerate(batch)]
    decided = execute_linked(ledger.state, commands, ledger.currencies)
    assert [("ok" if r.accepted else r.reason.code) for r, _ in decided] == expected
    assert all(r.events == () for r, _ in decided if not r.accepted)  # a refusal carries no events
    for result, changes in decided:
        ledger.state.commit(changes)
        if result.reason is Rejection.LINKED_FAILED:
            failing = next(c.command_id for c, e in zip(commands, expected) if e not in ("ok", "linked_failed"))
            assert failing in result.detail
    ledger._check_books(0)  # P1 and every record's invariants after the commit
    for token in balances.split():
        account_id, _, value = token.partition("=")
        posted, _, held = value.partition("/")
        account = ledger.state.accounts[account_id]
        assert account.posted == ledger.amount(posted, account_id), (account_id, account.posted)
        assert account.held == (ledger.amount(held, account_id) if held else account.held)
    # a retry of the same batch is answered the same, as duplicates, and changes nothing more
    again = execute_linked(ledger.state, commands, ledger.currencies)
    assert [("ok" if r.accepted else r.reason.code) for r, _ in again] == expected
    assert all(r.duplicate and c.is_empty for r, c in again)


def test_a_linked_batch_across_partitions_is_refused_and_not_remembered() -> None:
    """The refusal concerns the batch, not its commands: nothing is remembered, so each command may be decided
    later (sent alone to its home); a command decided before keeps its answer."""
    ledger = Ledger().run(SETUP)
    commands = [ledger._command(100, "transfer t1 a:USD->b:USD 1.00 id=x1"),
                ledger._command(101, "transfer t2 a:USD->c:USD 1.00 id=x2")]
    assert judge_placement([{3}, {3}], 3) is None and judge_placement([], 3) is None
    reason, detail = judge_placement([{3}, {3, 5}], 3)
    assert reason is Rejection.LINKED_SPANS_PARTITIONS and "[3, 5]" in detail
    assert judge_placement([{5}, {5}], 3)[0] is Rejection.LINKED_SPANS_PARTITIONS  # all elsewhere: not here
    decided = refuse_all(ledger.state, commands, reason, detail)
    assert [(r.reason, r.duplicate) for r, _ in decided] == [(Rejection.LINKED_SPANS_PARTITIONS, False)] * 2
    assert all(changes.is_empty and changes.processed is None for _, changes in decided)
    ledger.state.commit(execute(ledger.state, commands[0])[1])  # x1 decided alone, at its home
    again = refuse_all(ledger.state, commands, reason, detail)
    assert [(r.reason, r.duplicate) for r, _ in again] == [(None, True), (Rejection.LINKED_SPANS_PARTITIONS, False)]
    assert ledger.state.accounts["a:USD"].posted == 900


def test_an_id_the_failed_batch_holds_twice_with_two_payloads_is_an_id_conflict_without_events() -> None:
    ledger = Ledger().run(SETUP)
    commands = [ledger._command(100, "transfer t1 a:USD->b:USD 1.00 id=d1"),
                ledger._command(101, "transfer t2 nobody:USD->b:USD 1.00 id=d2"),
                ledger._command(102, "transfer t3 a:USD->c:USD 2.00 id=d1")]
    decided = execute_linked(ledger.state, commands, ledger.currencies)
    assert [r.reason for r, _ in decided] == [Rejection.LINKED_FAILED, Rejection.UNKNOWN_ACCOUNT,
                                              Rejection.ID_CONFLICT]
    assert all(r.events == () for r, _ in decided) and decided[2][1].is_empty
    assert list(decided[2][1].history) == []  # what the shell iterates to emit: empty, not absent


def test_a_retry_of_a_batch_the_engine_rewrote_is_answered_from_the_inbox_when_it_failed() -> None:
    """The engine may decide a rewritten command and compare retries with the fingerprint of what the client
    sent (execute's fingerprint). A failed batch remembers every command under that fingerprint, the refused
    one and the linked_failed ones alike, so the client's retry is a duplicate, not an id conflict."""
    ledger = Ledger().run(SETUP)
    commands = [ledger._command(100, "transfer t1 a:USD->b:USD 1.00 id=f1"),
                ledger._command(101, "transfer t2 b:USD->c:USD 5.00 id=f2")]
    sent = ["as-sent-f1", "as-sent-f2"]
    decided = execute_linked(ledger.state, commands, ledger.currencies, sent)
    assert [r.reason for r, _ in decided] == [Rejection.LINKED_FAILED, Rejection.INSUFFICIENT_FUNDS]
    for _, changes in decided:
        ledger.state.commit(changes)
    again = execute_linked(ledger.state, commands, ledger.currencies, sent)
    assert [(r.reason, r.duplicate) for r, _ in again] == [(Rejection.LINKED_FAILED, True),
                                                           (Rejection.INSUFFICIENT_FUNDS, True)]


def test_a_command_without_an_id_is_answered_but_not_remembered() -> None:
    """Nothing can be remembered under an empty id (the engine refuses such a command before it, as the core
    does alone): its refusal is answered and writes nothing."""
    import dataclasses
    ledger = Ledger().run(SETUP)
    nameless = dataclasses.replace(ledger._command(100, "transfer t1 a:USD->b:USD 1.00 id=z1"), command_id="")
    (result, changes), = refuse_all(ledger.state, [nameless], Rejection.LINKED_SPANS_PARTITIONS, "elsewhere")
    assert result.reason is Rejection.LINKED_SPANS_PARTITIONS and changes.is_empty


def test_a_linked_batch_converts_at_a_rate_snapshot_an_earlier_command_of_it_recorded() -> None:
    """A batch that records a rate snapshot and then converts with it: the conversion reads the snapshot the
    batch staged (it is not in the state yet), and is judged against it like any other."""
    ledger = Ledger().run("""
open world:USD USD neg  | ok
open sys:fx:USD USD neg | ok
open sys:fx:EUR EUR neg | ok
open u:USD USD          | ok
open u:EUR EUR          | ok
transfer d1 world:USD->u:USD 100.00 kind=deposit | ok
""")
    def decide(conversion: str) -> list:
        commands = [ledger._command(100, "rate s9 USD EUR 0.925 id=l1"), ledger._command(101, conversion)]
        return [r.reason.code if r.reason else "ok" for r, _ in execute_linked(ledger.state, commands,
                                                                                ledger.currencies)]
    assert decide("tx a1 u:USD=-10.00 sys:fx:USD=10.00 sys:fx:EUR=-9.25 u:EUR=9.25 kind=fx rate=s9 id=l2") \
        == ["ok", "ok"]
    assert decide("tx a1 u:USD=-10.00 sys:fx:USD=10.00 sys:fx:EUR=-9.30 u:EUR=9.30 kind=fx rate=s9 id=l3") \
        == ["linked_failed", "amount_off_rate"]


# --- a linked batch across partitions: the rules each partition and the coordinator apply --------------------

def test_a_partitions_shares_are_judged_in_batch_order_without_being_remembered() -> None:
    ledger = Ledger().run(SETUP)
    spend_credit = [ledger._command(100, "transfer t1 a:USD->b:USD 10.00 id=s1"),
                    ledger._command(101, "transfer t2 b:USD->c:USD 7.00 id=s2")]
    assert first_refused(ledger.state, spend_credit, ledger.currencies) is None
    index, reason, detail = first_refused(ledger.state, spend_credit[::-1], ledger.currencies)
    assert (index, reason) == (0, Rejection.INSUFFICIENT_FUNDS) and "b:USD" in detail
    assert ledger.state.accounts["a:USD"].posted == 1000 and ledger.state.processed(("t", "s1")) is None


def test_exposure_is_the_lowest_and_highest_point_of_each_accounts_running_sum() -> None:
    assert exposure([[("a", -600), ("b", 600)], [("b", -500), ("c", 500)], [("b", 300), ("a", -300)]]) == {
        "a": (900, 0), "b": (0, 600), "c": (0, 500)}
    assert exposure([[("a", -5), ("a", 8)], [("a", -10)]]) == {"a": (7, 3)}
    assert exposure([[("a", -5), ("a", 8)]]) == {"a": (0, 3)}  # one command's legs post together
    assert exposure([]) == {}


def test_a_batch_across_partitions_fails_on_its_earliest_refused_command_the_most_urgent_reason_first() -> None:
    votes = [(2, Rejection.UNKNOWN_ACCOUNT, "x"), (1, Rejection.INSUFFICIENT_FUNDS, "b"),
             (1, Rejection.UNKNOWN_ACCOUNT, "c"), (1, Rejection.UNKNOWN_ACCOUNT, "a")]
    assert first_failure(votes) == (1, Rejection.UNKNOWN_ACCOUNT, "a")
    assert first_failure([]) is None


def test_every_command_of_a_batch_across_partitions_gets_its_own_answer() -> None:
    ledger = Ledger().run(SETUP)
    commands = [ledger._command(100 + i, f"transfer t{i} a:USD->b:USD 1.00 id=u{i}") for i in range(3)]
    assert [(r.command_id, r.outcome, r.reason) for r in unit_answers(commands, None)] == [
        ("u0", "accepted", None), ("u1", "accepted", None), ("u2", "accepted", None)]
    refused = unit_answers(commands, (1, Rejection.INSUFFICIENT_FUNDS, "a:USD has 0"))
    assert [(r.reason, r.detail) for r in refused] == [
        (Rejection.LINKED_FAILED, "linked with u1, which was refused insufficient_funds"),
        (Rejection.INSUFFICIENT_FUNDS, "a:USD has 0"),
        (Rejection.LINKED_FAILED, "linked with u1, which was refused insufficient_funds")]
