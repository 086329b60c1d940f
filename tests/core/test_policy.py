"""A client's policy (streams/core/policy.py): which command asks for which right, and the one judgement."""
from __future__ import annotations

import pytest

from streams import core
from streams.core.model import Leg
from streams.core.policy import OPEN, ClientPolicy, judge, requests

C = dict(client_id="wallet", at_ms=1)
WALLET = ClientPolicy("wallet", debit=("user:*", "sys:world:*"), credit=("*",), open=("user:*",),
                      hold=("user:*",))


def post(*legs: tuple[str, int]) -> core.PostTransaction:
    return core.PostTransaction(command_id="t", transaction_id="t", legs=tuple(Leg(a, x) for a, x in legs), **C)


def open_(account: str) -> core.OpenAccount:
    return core.OpenAccount(command_id="o", account_id=account, currency="USD", **C)


CASES = [
    # (command, hold_account, policy, None or the start of the refusal)
    (post(("sys:world:USD", -5), ("user:1:USD", 5)), None, WALLET, None),
    (post(("user:1:USD", -5), ("merchant:9:USD", 5)), None, WALLET, None),
    (post(("merchant:9:USD", -5), ("user:1:USD", 5)), None, WALLET,
     "policy 'wallet' rule debit allows user:*, sys:world:*; this command would debit merchant:9:USD"),
    (post(("user:1:USD", -5), ("user:2:USD", 5)), None, ClientPolicy("nocredit", debit=("*",)),
     "policy 'nocredit' rule credit allows nothing; this command would credit user:2:USD"),
    (open_("user:3:USD"), None, WALLET, None),
    (open_("merchant:3:USD"), None, WALLET, "policy 'wallet' rule open"),
    (core.FreezeAccount(command_id="f", account_id="user:1:USD", **C), None, WALLET,
     "policy 'wallet' rule freeze allows nothing"),
    (core.UnfreezeAccount(command_id="u", account_id="user:1:USD", **C), None, WALLET, "policy 'wallet' rule freeze"),
    (core.CloseAccount(command_id="c", account_id="user:1:USD", **C), None, OPEN, None),
    (core.PlaceHold(command_id="h", hold_id="h", account_id="user:1:USD", amount=5, **C), None, WALLET, None),
    (core.PlaceHold(command_id="h", hold_id="h", account_id="vip:1:USD", amount=5, **C), None, WALLET,
     "policy 'wallet' rule hold"),
    (core.ReleaseHold(command_id="r", hold_id="h", **C), "user:1:USD", WALLET, None),
    (core.ReleaseHold(command_id="r", hold_id="h", **C), "vip:1:USD", WALLET, "policy 'wallet' rule hold"),
    (core.ReleaseHold(command_id="r", hold_id="h", **C), None, WALLET, None),  # no such hold: unknown_hold
    (core.ExpireHold(command_id="x", hold_id="h", **C), "vip:1:USD", WALLET, "policy 'wallet' rule hold"),
    # A leg of zero moves no money out: it asks for no debit right (the rules refuse it as invalid_amount).
    (post(("user:1:USD", -5), ("user:2:USD", 5), ("vip:1:USD", 0)), None, WALLET, None),
    # A command that names no account (a currency, a rate) needs the right to debit every account: a pattern
    # that covers every named account is not enough.
    (core.RecordRate(command_id="q", snapshot_id="s", base="USD", quote="EUR", rate="0.9", expires_at_ms=9, **C),
     None, ClientPolicy("named", debit=("?*",)), "policy 'named' rule debit allows ?*; this command would debit "),
    (core.RegisterCurrency(command_id="g", currency="EUR", scale=2, **C), None, ClientPolicy("named", debit=("?*",)),
     "policy 'named' rule debit allows ?*; this command would debit "),
    (core.RecordRate(command_id="q", snapshot_id="s", base="USD", quote="EUR", rate="0.9", expires_at_ms=9, **C),
     None, OPEN, None),
    # Patterns are globs, case-sensitive: USER:1 is not user:*.
    (open_("USER:1:USD"), None, WALLET, "policy 'wallet' rule open"),
    (post(("user:1:USD", -5), ("user:2:USD", 5)), None, ClientPolicy("none"), "policy 'none' rule debit"),
    # A reversal moves money of the account it is routed by: it needs the right to debit it.
    (core.ReverseTransaction(command_id="v", transaction_id="v", reverses="t", account_id="user:1:USD", **C), None,
     WALLET, None),
    (core.ReverseTransaction(command_id="v", transaction_id="v", reverses="t", account_id="vip:1:USD", **C), None,
     WALLET, "policy 'wallet' rule debit allows user:*, sys:world:*; this command would debit vip:1:USD"),
]


@pytest.mark.parametrize("command, hold_account, policy, refusal", CASES)
def test_a_command_is_judged_by_every_right_it_asks_for(command, hold_account, policy, refusal):
    detail = judge(policy, command, hold_account)
    if refusal is None:
        assert detail is None
    else:
        assert detail is not None and detail.startswith(refusal), detail


def test_the_open_policy_allows_everything_and_a_capture_is_a_debit():
    capture = core.PostTransaction(command_id="t", transaction_id="t", legs=(
        Leg("user:1:USD", -5, "h1"), Leg("user:2:USD", 5)), **C)
    assert requests(capture) == (("debit", "user:1:USD"), ("credit", "user:2:USD"))
    assert judge(OPEN, capture) is None


def test_a_policy_refuses_patterns_that_are_not_strings():
    with pytest.raises(TypeError):
        ClientPolicy("bad", debit=["user:*"])  # a list, not a tuple
    with pytest.raises(TypeError):
        ClientPolicy("bad", debit=("",))
