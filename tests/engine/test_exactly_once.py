"""Exactly once for a read_committed reader, on the in-memory model of the commit path (tests/helpers/bus.py).

With the engine's transactions (Bus changelog_cuts="transaction") a crash anywhere leaves a batch's outputs,
redo records and covered mark all visible or none, and a redelivered record the changelog covers is skipped:
every command has exactly one non-duplicate result and every history entry (account#seq) is published once,
whatever the interleaving and the crashes. Without them (outputs first, then the changelog), the same check
fails on a crash between the two: the contrast below keeps the check honest.
"""
from __future__ import annotations

from collections import Counter

from hypothesis import given, strategies as st

from tests.engine.test_interleavings import PROPERTY, checked_bus, operation_lists, run_interleaved, send, step
from tests.helpers.bus import Bus, Crash
from tests.helpers.records import open_account, tx

USER = "user:ann:USDT"


def copies(bus: Bus) -> tuple[list, list]:
    """(result keys published more than once as a decision, history entries published more than once)."""
    results = Counter(e.key for e in bus.emitted if not e.result["duplicate"])
    history = Counter((h["account_id"], h["seq"]) for h in bus.history)
    return [k for k, n in results.items() if n > 1], [k for k, n in history.items() if n > 1]


def crash_between_outputs_and_changelog(changelog_cuts: str) -> Bus:
    bus, oracles = checked_bus(changelog_cuts=changelog_cuts)
    send(bus, oracles, open_account(USER, "USDT"), USER)
    bus.run()
    send(bus, oracles, tx("dep-1", [("sys:world:USDT", -500, None, None), (USER, 500, None, None)]), USER)
    partition = next(p for p in range(bus.n) if bus.pending(p))
    # Every output of the deposit is produced, then the worker dies before its changelog record.
    bus.step(partition, crash=Crash("changelog", 0))
    bus.run()
    oracles.check_quiet()
    assert bus.result("dep-1")["outcome"] == "accepted"
    return bus


def test_without_transactions_a_crash_before_the_changelog_publishes_the_result_twice():
    results, history = copies(crash_between_outputs_and_changelog("between_records"))
    assert b"t/dep-1" in results and (USER, 2) in history, "the redone deposit's outputs are published again"


def test_with_transactions_the_same_crash_publishes_each_result_and_entry_once():
    results, history = copies(crash_between_outputs_and_changelog("transaction"))
    assert results == [] and history == []


@PROPERTY
@given(operations=operation_lists, seed=st.integers(0, 2**32 - 1), follow_up_batches=st.booleans())
def test_one_result_per_command_and_one_entry_per_account_seq_in_any_interleaving(operations, seed,
                                                                                  follow_up_batches):
    bus = run_interleaved(operations, seed, follow_up_batches, changelog_cuts="transaction")
    results, history = copies(bus)
    assert results == [], f"results published more than once: {results[:5]}"
    assert history == [], f"history entries published more than once: {history[:5]}"
