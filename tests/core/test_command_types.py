"""A command built with a value of the wrong type is a programmer error at the edge (a field not parsed): it
raises TypeError naming that field, so the edge's log says which one. Every field of every command, and of a
leg and a policy, table-driven from the dataclasses themselves."""
from __future__ import annotations

import dataclasses

import pytest

from streams.core import (
    AccountPolicy,
    CloseAccount,
    ExpireHold,
    FreezeAccount,
    Leg,
    OpenAccount,
    PlaceHold,
    PostTransaction,
    RecordRate,
    RegisterCurrency,
    ReleaseHold,
    ReverseTransaction,
    UnfreezeAccount,
)

C = dict(command_id="c", client_id="k", at_ms=1)
VALID = [
    OpenAccount(**C, account_id="u:1:USD", currency="USD"),
    FreezeAccount(**C, account_id="u:1:USD"),
    UnfreezeAccount(**C, account_id="u:1:USD"),
    CloseAccount(**C, account_id="u:1:USD"),
    PostTransaction(**C, transaction_id="t", legs=(Leg("a", -1), Leg("b", 1)), links=("t0",),
                    metadata=(("k", "v"),)),
    PlaceHold(**C, hold_id="h", account_id="u:1:USD", amount=5, expires_at_ms=9),
    ReleaseHold(**C, hold_id="h"),
    ExpireHold(**C, hold_id="h"),
    ReverseTransaction(**C, transaction_id="r", reverses="t", account_id="u:1:USD"),
    RegisterCurrency(**C, currency="XAU", scale=3),
    RecordRate(**C, snapshot_id="s", base="USD", quote="EUR", rate="0.9", expires_at_ms=9),
    Leg("a", -1, "h", "USD"),
    AccountPolicy(overdraft_limit=1, max_balance=2),
]
# The message a wrong type of each field starts with where it is not "<field> must be".
OTHER_START = {"metadata": "metadata must be a tuple of (str, str) pairs"}
CASES = [(value, f.name) for value in VALID for f in dataclasses.fields(value)]


@pytest.mark.parametrize("value, field", CASES, ids=[f"{type(v).__name__}.{name}" for v, name in CASES])
def test_a_field_of_the_wrong_type_is_named(value, field) -> None:
    wrong = 1.5  # no field of a command is a float: money is never one
    with pytest.raises(TypeError) as raised:
        dataclasses.replace(value, **{field: wrong})
    assert str(raised.value).startswith(OTHER_START.get(field, f"{field} must be")), str(raised.value)


def test_links_and_metadata_must_be_tuples_even_empty() -> None:
    post = VALID[4]
    for field in ("links", "metadata"):
        with pytest.raises(TypeError, match=r"^links and metadata must be tuples$"):
            dataclasses.replace(post, **{field: []})
    with pytest.raises(TypeError, match=r"^links must be a tuple of str$"):
        dataclasses.replace(post, links=("t0", 1))
    with pytest.raises(TypeError, match=r"^legs must be Leg values, got \('a', -1\)$"):
        dataclasses.replace(post, legs=(("a", -1), Leg("b", 1)))
