"""Why a command was refused: one enum, ordered by precedence.

A lower value is checked and reported first. When a command breaks several rules, the result names the one
with the lowest value, so the same command against the same state always gets the same reason (P7).

Precedence applies among the checks of one decision. The inbox check runs before any decision: a command id
already decided is answered from its stored result (a duplicate), and ``id_conflict`` (same id, different
payload) is therefore seen before everything else in practice, although it has the highest value here.

Order: shape of the command, then amounts, then existence (currencies, ids, accounts), then the ledger-wide
rules of DESIGN.md §3 (currency_mismatch, unbalanced), then funds and limits, then account lifecycle, then
hold lifecycle. This follows the partial order of DESIGN.md §3: unknown_account < currency_mismatch <
unbalanced < insufficient_funds < account_closed < hold_not_open < capture_exceeds_hold < id_conflict.
"""

from __future__ import annotations

import enum


class Rejection(enum.IntEnum):
    """A machine-readable reason for refusing a command; ``.code`` is the wire name."""

    # A field is missing or malformed: empty id, fewer than two legs, a credit leg naming a hold, a bad policy.
    INVALID_COMMAND = 1
    # An amount is zero where money must move, negative where it must be positive, or a string is not a number.
    INVALID_AMOUNT = 2
    # An amount or a resulting balance has abs >= 2**127 (beyond the signed 128-bit range we promise).
    AMOUNT_OUT_OF_RANGE = 3
    # The currency code is not in the registry; currencies are registered before use.
    UNKNOWN_CURRENCY = 4
    # A decimal string has more fractional digits than the currency's scale (non-zero ones); never rounded.
    PRECISION_EXCEEDED = 5
    # OpenAccount for an id that already exists (also a closed one: ids are never reused).
    ACCOUNT_EXISTS = 6
    # PlaceHold with a hold id that already exists (in any state).
    HOLD_EXISTS = 7
    # A command names an account that was never opened.
    UNKNOWN_ACCOUNT = 8
    # A leg states a currency that differs from its account's currency.
    CURRENCY_MISMATCH = 9
    # The legs of a transaction do not sum to zero in some currency.
    UNBALANCED = 10
    # A hold id that does not exist, or exists on another account than the leg that draws from it.
    UNKNOWN_HOLD = 11
    # A debit or a hold would take available (posted - held) below -overdraft_limit on a non-negative account.
    INSUFFICIENT_FUNDS = 12
    # A credit would take posted above the account's max_balance.
    BALANCE_LIMIT_EXCEEDED = 13
    # The account is frozen: no debits, no new holds (credits and releases are still allowed).
    ACCOUNT_FROZEN = 14
    # The account is closed: nothing may touch it.
    ACCOUNT_CLOSED = 15
    # UnfreezeAccount on an account that is not frozen.
    ACCOUNT_NOT_FROZEN = 16
    # CloseAccount while posted != 0 or money is still held by open holds.
    ACCOUNT_NOT_EMPTY = 17
    # The hold has already ended (captured, released or expired): no capture, release or expiry.
    HOLD_NOT_OPEN = 18
    # A capture at or after the hold's expires_at_ms (judged by the command's log time).
    HOLD_EXPIRED = 19
    # ExpireHold before the hold's expires_at_ms, or for a hold without expiry.
    HOLD_NOT_EXPIRED = 20
    # The captures of a transaction take more from a hold than its remaining amount.
    CAPTURE_EXCEEDS_HOLD = 21
    # A transaction settling under the exact capture mode (streams/core/settlement.py) moves another amount than
    # its hold still reserves. Numbered apart from its neighbours (values are never reused); it ranks like them.
    CAPTURE_NOT_EXACT = 40
    # The command id (scoped by client id) was already used with a different payload; nothing changes.
    ID_CONFLICT = 22
    # Checked by the engine, not the core: the hold or account is reserved by a transaction whose debits span
    # several partitions and which is still being decided (release, freeze or close it after; retry).
    IN_FLIGHT = 23
    # A reversal names a transaction this partition never posted (or one decided across partitions, whose
    # record lives nowhere whole: see docs/wallet-operations.md).
    UNKNOWN_TRANSACTION = 24
    # A reversal by another client than the one that posted the transaction: a client undoes only its own.
    CLIENT_MISMATCH = 25
    # The transaction was reversed already: a second reversal would undo it twice.
    ALREADY_REVERSED = 26
    # Checked by the engine: the transaction moved money through clearing to or from another partition, so
    # mirroring its local legs would not undo it (post a compensating transaction instead).
    NOT_REVERSIBLE = 27
    # Checked by the engine before anything else when client keys are configured (streams/authn.py): the
    # record is unsigned, its signature does not verify, or a command in it names another client than the
    # signer. Answered, never remembered: an impostor cannot spend a client's command id. (24-27: reversals.)
    NOT_AUTHENTICATED = 28
    # The signer's policy does not allow the command (streams/core/policy.py); the detail names the rule.
    NOT_PERMITTED = 29
    # RegisterCurrency for a code this partition already knows with the same scale: nothing to do.
    CURRENCY_EXISTS = 30
    # RegisterCurrency for a code known with another scale: a scale never changes (it would rescale every
    # stored amount).
    CURRENCY_CONFLICT = 31
    # A transaction names an FX rate snapshot this partition never recorded (RecordRate): it fails closed.
    UNKNOWN_RATE = 32
    # The rate snapshot a transaction names had expired when the transaction was decided (log time).
    STALE_RATE = 33
    # The rate snapshot is for another currency pair than the transaction's currencies.
    RATE_MISMATCH = 34
    # RecordRate for a snapshot id already recorded with other content: a snapshot never changes.
    RATE_EXISTS = 35
    # A conversion's amounts disagree with the rate of the snapshot it names, by a whole minor unit or more, or
    # it moves nothing through the FX desk in both currencies (streams/core/fx.py). Judged after unbalanced,
    # before funds: an amount off the rate is a wrong command whatever the balances.
    AMOUNT_OFF_RATE = 36
    # A return or chargeback (streams/core/returns.py) of a transaction that is not a payment from one account
    # to another in one currency, or is itself a return; or whose legs do not move money from that payment's
    # payee back to its payer.
    NOT_RETURNABLE = 37
    # A return or chargeback of more than what remains unreturned of its payment; also a reversal of a payment
    # partly returned already (return the rest instead).
    EXCEEDS_UNRETURNED = 38
    # A command of a linked batch (streams/core/linked.py) that was not decided because another command of the
    # batch was refused: all or nothing. The detail names the refused command and its reason.
    LINKED_FAILED = 39
    # A linked batch that touches more than one partition and cannot be one unit of the two-phase protocol
    # (streams/spanning_linked.py): a command other than a transaction, a capture, a return, an id twice, a
    # transaction decided before (docs/wallet-operations.md). Numbered after 40, which was taken.
    LINKED_SPANS_PARTITIONS = 41

    @property
    def code(self) -> str:
        """The lowercase snake name used on the wire and in docs, e.g. "insufficient_funds"."""
        return self.name.lower()

    @classmethod
    def from_code(cls, code: str) -> "Rejection":
        """The member for a wire name; ValueError for an unknown one."""
        try:
            return cls[code.upper()]
        except KeyError:
            raise ValueError(f"unknown rejection code {code!r}") from None


# Answers that are not the command's decision: to a record that is not the command's own (another payload sent
# under a used id, a record its named client did not sign), or to a linked batch that cannot be linked as a whole
# (linked.refuse_all: nothing of any command was judged, and the command may be decided later, at its home).
# Each is published under its own result key; no reader takes it for the command's decision (projections/
# verify.py, the read store), or it would shadow or replace the decision.
NOT_A_DECISION = frozenset({Rejection.ID_CONFLICT.code, Rejection.NOT_AUTHENTICATED.code,
                            Rejection.LINKED_SPANS_PARTITIONS.code})


# The order in which a transaction's rules decide (decide._judge_transaction_rules): shape and existence
# (stages 1-2), then the rate snapshot it names (2b), double entry (3), the conversion's amounts (3b), then
# holds, funds, limits and status (4); within a stage the lowest reason. A transaction judged in parts (one
# per partition, streams/spanning.py) answers with the failure this order puts first, as one partition would.
_RATE_STAGE = frozenset({Rejection.UNKNOWN_RATE, Rejection.STALE_RATE, Rejection.RATE_MISMATCH})


def transaction_urgency(reason: Rejection) -> tuple[int, int]:
    if reason <= Rejection.CURRENCY_MISMATCH:
        return 0, reason
    if reason in _RATE_STAGE:
        return 1, reason
    if reason is Rejection.UNBALANCED:
        return 2, reason
    if reason is Rejection.AMOUNT_OFF_RATE:
        return 3, reason
    return 4, reason
