"""Who may move whose money: a client's policy and the one judgement of a command against it.

A policy lists, per action, the account patterns (shell-style globs, matched case-sensitively: ``user:*``,
``sys:world:*``, ``*``) a client may act on. Anything not listed is refused: an action without patterns
allows nothing. The actions:

- ``debit``: a negative leg of a transaction (a capture from a hold is a debit of the hold's account);
- ``credit``: a positive leg of a transaction;
- ``open``: OpenAccount;
- ``freeze``: FreezeAccount, UnfreezeAccount and CloseAccount (they all stop or restart an account's use);
- ``hold``: PlaceHold on the account, and ReleaseHold / ExpireHold of a hold on the account;
- any other command (a reversal of the client's own transaction) needs ``debit`` on the account it names.

Pure: the engine (streams/partition.py) calls :func:`judge` with the signer's policy, loaded by the shell
(streams/authn.py), for each command a client wrote; the engine's own follow-ups are never judged again.
The account of a hold a command names only by id comes from the engine's state (``hold_account``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from fnmatch import translate
from functools import lru_cache

from streams.core.commands import (
    CloseAccount,
    Command,
    ExpireHold,
    FreezeAccount,
    OpenAccount,
    PlaceHold,
    PostTransaction,
    ReleaseHold,
    UnfreezeAccount,
)

ACTIONS = ("debit", "credit", "open", "freeze", "hold")


@dataclass(frozen=True, slots=True)
class ClientPolicy:
    """What one client may do. name: how results and logs name the policy (the client's id in the clients
    file); each action: the glob patterns of the accounts it may be done to."""

    name: str
    debit: tuple[str, ...] = ()
    credit: tuple[str, ...] = ()
    open: tuple[str, ...] = ()
    freeze: tuple[str, ...] = ()
    hold: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for action in ACTIONS:
            patterns = getattr(self, action)
            if type(patterns) is not tuple or not all(isinstance(p, str) and p for p in patterns):
                raise TypeError(f"policy {self.name!r}: {action} must be a tuple of non-empty patterns")


# A policy that allows everything: what every client may do when no clients file is configured (open mode).
OPEN = ClientPolicy("open", *(("*",),) * len(ACTIONS))


def requests(command: Command, hold_account: str | None = None) -> tuple[tuple[str, str], ...]:
    """The (action, account) pairs a command asks for, in the command's own order. hold_account: the
    account of the hold a ReleaseHold or ExpireHold names (None when no such hold exists: nothing is asked,
    and the core answers unknown_hold)."""
    if isinstance(command, PostTransaction):
        return tuple(("debit" if leg.amount < 0 else "credit", leg.account_id) for leg in command.legs)
    if isinstance(command, OpenAccount):
        return (("open", command.account_id),)
    if isinstance(command, (FreezeAccount, UnfreezeAccount, CloseAccount)):
        return (("freeze", command.account_id),)
    if isinstance(command, PlaceHold):
        return (("hold", command.account_id),)
    if isinstance(command, (ReleaseHold, ExpireHold)):
        return (("hold", hold_account),) if hold_account is not None else ()
    # Any other command (a reversal, which mirrors the legs of a transaction this client posted) moves money
    # of the account it is routed by: it needs the strictest right on it.
    return (("debit", getattr(command, "account_id", None) or ""),)


@lru_cache(maxsize=1024)
def _matcher(patterns: tuple[str, ...]):
    """One compiled regex for a rule's globs (case-sensitive, like fnmatch.fnmatchcase): one match per account
    instead of one per pattern, on the path of every command."""
    return re.compile("|".join(f"(?:{translate(p)})" for p in patterns)).match if patterns else lambda _: None


def judge(policy: ClientPolicy, command: Command, hold_account: str | None = None) -> str | None:
    """None when the policy allows everything the command asks for; else the detail of the refusal
    (``not_permitted``), naming the policy, its rule and the first account it does not cover."""
    for action, account in requests(command, hold_account):
        patterns = getattr(policy, action)
        if _matcher(patterns)(account) is None:
            allowed = ", ".join(patterns) if patterns else "nothing"
            return (f"policy {policy.name!r} rule {action} allows {allowed}; "
                    f"this command would {action} {account}")
    return None
