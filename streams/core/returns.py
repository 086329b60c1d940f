"""Returns and chargebacks: money of an earlier payment going back from its payee to its payer, in part or in
whole, after the payee may have spent it. Decided here and in decide.py (``_judge_return``), once.

A return is an ordinary transaction (``PostTransaction``) that names the payment it returns in the reserved
metadata key ``ledger.returns`` (like the settlement terms of settlement.py: it travels with the transaction
and is recorded on it, with no change of the wire format), with two legs: the payee debited, the payer
credited, the same amount. Its kind says which it is (``return`` for a bank's returned deposit,
``chargeback`` for a card's), and the engine routes it by its debit, the payee, which is where a payment to
a customer was decided and is remembered (docs/wallet-operations.md).

Judged in this order: the payment is known here (``unknown_transaction``), was posted by the same client
(``client_mismatch``), is not reversed (``already_reversed``), is a payment (two legs, one account to
another, one currency) and not itself a return, and the return's legs move money from its payee back to its
payer (``not_returnable``); the amount is within what remains unreturned (``exceeds_unreturned``). Then the
legs are judged like any transaction, after one change: what the payee's available cannot cover of the
amount (the money is spent) is debited from the payee's receivable (settlement.py's ``receivable_of``, opened
by the same decision), a debt the owner owes, so a return never overdraws a customer (P2) and is never
refused for the money being gone. Only what remains in a customer's available is taken from it.

A payment made in steps (a deposit in transit: initiated, fronted, settled) is returned as one: the return
names its last step in ``ledger.returns`` and links to every other step. When the named payment alone is not
what the return moves back, the steps' legs are netted per account, and what is left must be one account
paying another in one amount (``not_returnable`` otherwise): the money the return sends back did flow from
its payer to its payee, through these steps, all posted here by the same client, none reversed or a return.
Each step counts the return, and what remains unreturned is the net amount minus the most any step counts,
so money returned through one step (a fronting clawed back) or one flow is never returned again through
another (docs/wallet-operations.md).

A payment whose payer and payee live in different partitions is remembered in shares, one per partition,
each a two-leg payment with the local clearing shard (``payer -> clearing`` in the payer's partition,
``clearing -> payee`` in the payee's). Its return goes through the engine's two phases (streams/spanning.py),
and each partition judges its share of the return, the mirror of the payment's share there, by these same
rules (judge_named), counting the returns still in flight (``in_flight``); the commits count the return on
each share (decide.py, execute_share).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import NamedTuple

from streams.core.model import Account, Leg, PostedTransaction
from streams.core.rejections import Rejection

RETURNS_KEY = "ledger.returns"


def returned_payment(metadata: Iterable[tuple[str, str]]) -> str | None:
    """The payment a transaction returns (its ledger.returns), or None for an ordinary transaction."""
    for key, value in metadata:
        if key == RETURNS_KEY:
            return value
    return None


def judge_spanning(metadata: Iterable[tuple[str, str]], legs: tuple[Leg, ...]) -> tuple[Rejection, str] | None:
    """What the coordinator of a return whose payee and payer live in different partitions judges before
    anything is reserved: its two legs, one debit and one credit. The rest is judged by each partition on
    its own share (judge_named, against the payment's share there: streams/spanning.py). None for an
    ordinary transaction, or a return of that shape."""
    paid = returned_payment(metadata)
    if paid is None:
        return None
    if len(legs) != 2 or sorted(leg.amount > 0 for leg in legs) != [False, True]:
        return (Rejection.NOT_RETURNABLE, f"a return of {paid} across partitions is two legs: its payee debited, "
                                          f"its payer credited")
    return None


def carried(metadata: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """The ledger.returns entry of a transaction's metadata, which a share of it posted in one partition
    keeps (streams/spanning.py), so the share's record says what it returns."""
    return tuple((key, value) for key, value in metadata if key == RETURNS_KEY)


def covered(payee: Account | None, amount: int) -> int:
    """What of a return's amount the payee's own account pays: all of it for an account that may go
    negative (a system payee), else what its available covers down to its overdraft floor. The rest (the
    money is spent) is debited from the payee's receivable (settlement.receivable_of)."""
    if payee is None or payee.policy.allow_negative:
        return amount
    return max(0, min(amount, payee.available + payee.policy.overdraft_limit))


def payment_legs(original: PostedTransaction) -> tuple[Leg, Leg] | None:
    """(payer's debit, payee's credit) of a two-leg payment between two accounts, else None."""
    if original.returns is not None:
        return None
    return _one_payment(original.legs)


def flow_legs(steps: Iterable[PostedTransaction]) -> tuple[Leg, Leg] | None:
    """(payer's debit, payee's credit) that a payment made in steps nets to, else None: every step's legs
    summed per account (each account has one currency, and every step balances per currency), leaving out
    the accounts the money only passed through (their sum is zero)."""
    net: dict[str, int] = {}
    for step in steps:
        for leg in step.legs:
            net[leg.account_id] = net.get(leg.account_id, 0) + leg.amount
    return _one_payment(tuple(Leg(account, amount) for account, amount in net.items() if amount))


def _one_payment(legs: tuple[Leg, ...]) -> tuple[Leg, Leg] | None:
    if len(legs) != 2:
        return None
    debit, credit = sorted(legs, key=lambda leg: leg.amount)
    if debit.amount >= 0 or credit.amount != -debit.amount or debit.account_id == credit.account_id:
        return None
    return debit, credit


class Returned(NamedTuple):
    """A return that passed its own checks and goes on to the general rules."""

    payer: str  # the payment's payer, credited by the return
    payee: str  # the payment's payee, debited by the return (the rest on its receivable when spent)
    amount: int  # minor units returned
    counted: tuple[str, ...]  # the transactions that count it: the payment named, then its other steps


def _standing(original: PostedTransaction, client_id: str) -> tuple[Rejection, str] | None:
    """A payment or step may be returned only by its own client and while it stands (not reversed)."""
    if original.client_id != client_id:
        return (Rejection.CLIENT_MISMATCH, f"transaction {original.transaction_id} was posted by another client")
    if original.reversed_by is not None:
        return (Rejection.ALREADY_REVERSED,
                f"transaction {original.transaction_id} was reversed by {original.reversed_by}")
    return None


def _moves_back(legs: tuple[Leg, ...], payment: tuple[Leg, Leg] | None) -> int | None:
    """The amount the return's legs move from the payment's payee back to its payer, else None."""
    if payment is None:
        return None
    shape = sorted(legs, key=lambda leg: leg.amount)
    if (len(shape) != 2 or shape[0].account_id != payment[1].account_id
            or shape[1].account_id != payment[0].account_id or shape[0].amount != -shape[1].amount
            or shape[1].amount <= 0 or shape[0].hold_id is not None):
        return None
    return shape[1].amount


def _nothing_in_flight(transaction_id: str) -> int:
    return 0


def judge_named(transaction_id: str, metadata: Iterable[tuple[str, str]], client_id: str, legs: tuple[Leg, ...],
                links: Iterable[str], posted: Callable[[str], PostedTransaction | None],
                in_flight: Callable[[str], int] = _nothing_in_flight) -> tuple[Rejection, str] | Returned:
    """A return as it names its payment: no payment named, or itself (``invalid_command``), a payment not
    posted here (``unknown_transaction``), then judge_return."""
    paid = returned_payment(metadata)
    if not paid or not transaction_id or paid == transaction_id:
        return (Rejection.INVALID_COMMAND, "a return names the payment it returns (ledger.returns), not itself")
    original = posted(paid)
    if original is None:
        return (Rejection.UNKNOWN_TRANSACTION, f"transaction {paid} was not posted in this partition")
    return judge_return(original, client_id, legs, links, posted, in_flight)


def judge_return(original: PostedTransaction, client_id: str, legs: tuple[Leg, ...], links: Iterable[str],
                 posted: Callable[[str], PostedTransaction | None],
                 in_flight: Callable[[str], int] = _nothing_in_flight) -> tuple[Rejection, str] | Returned:
    """The return's failure, or what it returns. ``links``: the return's links (the steps of a payment made
    in steps); ``posted``: this partition's record of a transaction, None when it never posted it;
    ``in_flight``: what returns reserved and not yet decided hold of a transaction (a return across
    partitions is judged at its reservation and counted at its commit: streams/spanning.py), so two of
    them in flight together cannot both pass the unreturned check."""
    paid = original.transaction_id
    failure = _standing(original, client_id)
    if failure is not None:
        return failure
    if original.returns is not None:
        return (Rejection.NOT_RETURNABLE, f"transaction {paid} is not a payment from one account to another "
                                          f"(it is a return)")
    payment = payment_legs(original)
    steps: tuple[PostedTransaction, ...] = (original,)
    amount = _moves_back(legs, payment)
    other_ids = tuple(link for link in dict.fromkeys(links) if link != paid)
    if amount is None and other_ids:
        for step_id in other_ids:
            step = posted(step_id)
            if step is None:
                return (Rejection.UNKNOWN_TRANSACTION, f"transaction {step_id}, a step of the payment {paid} "
                                                       f"returned, was not posted in this partition")
            failure = _standing(step, client_id)
            if failure is not None:
                return failure
            if step.returns is not None:
                return (Rejection.NOT_RETURNABLE, f"transaction {step_id} is a return, not a step of {paid}")
            steps += (step,)
        payment = flow_legs(steps)
        amount = _moves_back(legs, payment)
        if amount is None:
            named = ", ".join(s.transaction_id for s in steps)
            return (Rejection.NOT_RETURNABLE, f"{named} do not net to one payment that the return's two legs "
                                              f"move back from its payee to its payer")
    elif payment is None:
        return (Rejection.NOT_RETURNABLE, f"transaction {paid} is not a payment from one account to another")
    elif amount is None:
        return (Rejection.NOT_RETURNABLE, f"a return of {paid} moves money from {payment[1].account_id} back to "
                                          f"{payment[0].account_id} in two legs of one amount")
    assert payment is not None
    returned, done = max((step.returned + in_flight(step.transaction_id), step.returned) for step in steps)
    unreturned = payment[1].amount - returned
    if amount > unreturned:
        counted = f"{returned} of {payment[1].amount} returned already"
        if returned != done:
            counted += f", {returned - done} of it by returns in flight"
        return (Rejection.EXCEEDS_UNRETURNED, f"return of {amount} exceeds the {max(unreturned, 0)} unreturned "
                                              f"of {paid} ({counted})")
    return Returned(payment[0].account_id, payment[1].account_id, amount, tuple(s.transaction_id for s in steps))
