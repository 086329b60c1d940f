"""What a refusal says: each invalid command is answered with the reason code and the detail that names what is
wrong, table-driven. A client fixes its command from the detail (the code alone says only "invalid_command"), so
a detail that named another fault, or none, is a wrong answer."""
from __future__ import annotations

import dataclasses

import pytest

from streams.core import MAX_LEGS, AccountPolicy, Leg, Rejection, decide

from .ledger_dsl import Ledger

SETUP = """
open world:USD USD neg | ok
open u:USD USD         | ok
open v:USD USD         | ok
transfer d1 world:USD->u:USD 10.00 | ok
transfer d2 world:USD->u:USD 1.00  | ok
hold h1 u:USD 1.00     | ok
"""
BIG = 2**127
I = Rejection.INVALID_COMMAND
R = "meta=ledger.returns:"


def line(text: str, **changes):
    """A command from one scenario line, with some fields replaced (what the language cannot write)."""
    def build(ledger: Ledger):
        command = ledger._command(100, text)
        return dataclasses.replace(command, **changes) if changes else command
    return build


def policy(**kw) -> AccountPolicy:
    return AccountPolicy(**kw)


ROWS = [
    # opening an account
    ("open-negative-overdraft", line("open w:USD USD", policy=policy(overdraft_limit=-1)), I,
     "overdraft_limit is negative"),
    ("open-negative-cap", line("open w:USD USD", policy=policy(max_balance=-1)), I, "max_balance is negative"),
    ("open-both-negative", line("open w:USD USD", policy=policy(overdraft_limit=-1, max_balance=-1)), I,
     "max_balance is negative"),  # the lowest of two reasons of one code: the detail decides, and is stable
    ("open-overdraft-beyond", line("open w:USD USD", policy=policy(overdraft_limit=BIG)),
     Rejection.AMOUNT_OUT_OF_RANGE, "policy limit beyond 2**127-1"),
    ("open-cap-beyond", line("open w:USD USD", policy=policy(max_balance=BIG)), Rejection.AMOUNT_OUT_OF_RANGE,
     "policy limit beyond 2**127-1"),
    ("open-no-id", line("open w:USD USD", account_id=""), I, "account_id is empty"),
    # transactions
    ("tx-no-id", line("transfer t1 u:USD->v:USD 1.00", transaction_id=""), I, "transaction_id is empty"),
    ("tx-no-kind", line("transfer t1 u:USD->v:USD 1.00", kind=""), I, "kind is empty"),
    ("tx-one-leg", line("tx t1 u:USD=-1.00"), I, f"a transaction needs 2..{MAX_LEGS} legs, got 1"),
    ("tx-metadata-twice", line("tx t1 u:USD=-1.00 v:USD=1.00 meta=a:1 meta=a:2"), I,
     "metadata keys are not unique"),
    ("tx-leg-no-account", line("transfer t1 u:USD->v:USD 1.00", legs=(Leg("", -1), Leg("v:USD", 1))), I,
     "leg 0: account_id is empty"),
    ("tx-zero-leg", line("transfer t1 u:USD->v:USD 1.00", legs=(Leg("u:USD", 0), Leg("v:USD", 0))),
     Rejection.INVALID_AMOUNT, "leg 0: amount is zero"),
    ("tx-leg-beyond", line("transfer t1 u:USD->v:USD 1.00", legs=(Leg("u:USD", -BIG), Leg("v:USD", BIG))),
     Rejection.AMOUNT_OUT_OF_RANGE, "leg 0: amount beyond 2**127-1"),
    ("tx-credit-names-hold", line("tx t1 u:USD=-1.00 v:USD@h1=1.00"), I,
     "leg 1: only a debit leg may name a (non-empty) hold"),
    # reversals
    ("reverse-no-ids", line("reverse r1 d1 u:USD", reverses=""), I, "transaction_id and reverses must not be empty"),
    ("reverse-itself", line("reverse d1 d1 u:USD"), I, "a transaction cannot reverse itself"),
    ("reverse-unknown", line("reverse r1 d9 u:USD"), Rejection.UNKNOWN_TRANSACTION,
     "transaction d9 was not posted in this partition"),
    ("reverse-id-taken", line("reverse d1 d2 u:USD"), I, "transaction id d1 is taken"),
    # returns
    ("return-of-itself", line(f"tx r1 v:USD=-1.00 u:USD=1.00 kind=return {R}r1"), I,
     "a return names the payment it returns (ledger.returns), not itself"),
    # holds
    ("hold-beyond", line("hold h2 u:USD 1.00", amount=BIG), Rejection.AMOUNT_OUT_OF_RANGE,
     "hold amount beyond 2**127-1"),
    ("hold-zero", line("hold h2 u:USD 1.00", amount=0), Rejection.INVALID_AMOUNT,
     "hold amount must be positive, got 0"),
    ("hold-exists", line("hold h1 u:USD 1.00"), Rejection.HOLD_EXISTS, "hold h1 already exists"),
    ("hold-no-account", line("hold h2 u:USD 1.00", account_id=""), I, "account_id is empty"),
    ("release-unknown", line("release h9"), Rejection.UNKNOWN_HOLD, "hold h9 does not exist"),
    # rates
    ("rate-no-id", line("rate s1 USD EUR 0.9", snapshot_id=""), I, "snapshot_id is empty"),
    ("rate-one-currency", line("rate s1 USD USD 1"), I, "a rate needs two currencies"),
]


@pytest.mark.parametrize("build, reason, detail", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_a_refusal_names_what_is_wrong(build, reason, detail) -> None:
    ledger = Ledger().run(SETUP)
    result = decide(ledger.state, build(ledger), ledger.currencies)
    assert (result.reason, result.detail) == (reason, detail)


@pytest.mark.parametrize("limits", [dict(overdraft_limit=BIG - 1), dict(max_balance=BIG - 1),
                                    dict(overdraft_limit=BIG - 1, max_balance=BIG - 1)],
                         ids=["overdraft", "cap", "both"])
def test_a_policy_limit_of_exactly_the_largest_amount_is_accepted(limits) -> None:
    """2**127-1 is the largest amount: a limit of exactly it is in range (only beyond it is refused)."""
    ledger = Ledger().run(SETUP)
    result = decide(ledger.state, line("open w:USD USD", policy=policy(**limits))(ledger), ledger.currencies)
    assert result.reason is None and result.outcome == "accepted", (result.reason, result.detail)
