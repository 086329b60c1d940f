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
"""

from __future__ import annotations

from collections.abc import Iterable

from streams.core.model import Leg, PostedTransaction
from streams.core.rejections import Rejection

RETURNS_KEY = "ledger.returns"


def returned_payment(metadata: Iterable[tuple[str, str]]) -> str | None:
    """The payment a transaction returns (its ledger.returns), or None for an ordinary transaction."""
    for key, value in metadata:
        if key == RETURNS_KEY:
            return value
    return None


def judge_spanning(metadata: Iterable[tuple[str, str]]) -> tuple[Rejection, str] | None:
    """A return whose payee and payer live in different partitions is refused: the payment it names is
    remembered there in shares, one per partition (streams/spanning.py), so no partition holds the payment's
    two legs the rules below judge, nor counts what was returned of it. None for an ordinary transaction."""
    paid = returned_payment(metadata)
    if paid is None:
        return None
    return (Rejection.NOT_RETURNABLE, f"a return of {paid}, whose payee and payer live in different partitions, "
                                      f"is not decided across partitions: post a compensating transaction instead")


def payment_legs(original: PostedTransaction) -> tuple[Leg, Leg] | None:
    """(payer's debit, payee's credit) of a two-leg payment between two accounts, else None."""
    if len(original.legs) != 2 or original.returns is not None:
        return None
    debit, credit = sorted(original.legs, key=lambda leg: leg.amount)
    if debit.amount >= 0 or credit.amount != -debit.amount or debit.account_id == credit.account_id:
        return None
    return debit, credit


def judge_return(original: PostedTransaction, client_id: str,
                 legs: tuple[Leg, ...]) -> tuple[Rejection, str] | tuple[str, str, int]:
    """The return's failure, or (payer, payee, amount) of a return that may go on to the general rules."""
    paid = original.transaction_id
    if original.client_id != client_id:
        return (Rejection.CLIENT_MISMATCH, f"transaction {paid} was posted by another client")
    if original.reversed_by is not None:
        return (Rejection.ALREADY_REVERSED, f"transaction {paid} was reversed by {original.reversed_by}")
    payment = payment_legs(original)
    if payment is None:
        return (Rejection.NOT_RETURNABLE, f"transaction {paid} is not a payment from one account to another"
                                          f"{' (it is a return)' if original.returns is not None else ''}")
    payer, payee = payment[0].account_id, payment[1].account_id
    shape = sorted(legs, key=lambda leg: leg.amount)
    if (len(shape) != 2 or shape[0].account_id != payee or shape[1].account_id != payer
            or shape[0].amount != -shape[1].amount or shape[1].amount <= 0 or shape[0].hold_id is not None):
        return (Rejection.NOT_RETURNABLE, f"a return of {paid} moves money from {payee} back to {payer} "
                                          f"in two legs of one amount")
    amount = shape[1].amount
    unreturned = payment[1].amount - original.returned
    if amount > unreturned:
        return (Rejection.EXCEEDS_UNRETURNED, f"return of {amount} exceeds the {unreturned} unreturned of {paid} "
                                              f"({original.returned} of {payment[1].amount} returned already)")
    return payer, payee, amount
