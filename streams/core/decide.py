"""decide(state, command) -> Result, and execute = decide + apply -> (Result, Changes).

Decision path, for every command:
  1. shape: command_id and client_id must be non-empty (else invalid_command, not remembered: no inbox key);
  2. inbox: a key already decided with the same fingerprint -> the stored result, duplicate=True, no changes;
     with another fingerprint -> id_conflict, no changes (the stored entry stays);
  3. judge: the rules of the command, checked in stages; within a stage every failing rule is collected and
     the one with the lowest Rejection value wins, so the reason follows the precedence of rejections.py;
  4. accepted -> events; apply(events) -> complete records; assert the decision balances per currency (P1);
  5. the inbox entry (fingerprint, result) joins the Changes, for accepted and rejected commands alike.
"""

from __future__ import annotations

import dataclasses

from streams.core.apply import apply
from streams.core.commands import (
    CloseAccount,
    Command,
    ExpireHold,
    FreezeAccount,
    OpenAccount,
    PlaceHold,
    PostTransaction,
    RecordRate,
    RegisterCurrency,
    ReleaseHold,
    ReverseTransaction,
    UnfreezeAccount,
    reversal_of,
)
from streams.core.events import (
    AccountOpened,
    AccountStatusChanged,
    CurrencyRegistered,
    Event,
    HoldExpired,
    HoldPlaced,
    HoldReleased,
    RateRecorded,
    TransactionPosted,
    TransactionReturned,
    TransactionReversed,
)
from streams.core.fx import judge_conversion, judge_snapshot, valid_rate
from streams.core.invariants import assert_changes_balanced
from streams.core.model import SYSTEM_POLICY, Account, AccountStatus, HoldStatus, Leg, RateSnapshot, routing_key_for
from streams.core.money import DEFAULT_CURRENCIES, MAX_ABS_AMOUNT, MAX_SCALE, CurrencyRegistry, valid_code
from streams.core.rejections import Rejection
from streams.core.results import ACCEPTED, REJECTED, Processed, Result
from streams.core.returns import Returned, covered, judge_named, returned_payment
from streams.core.settlement import LATE_SETTLEMENT, STRICT, ended, judge_capture, receivable_of, terms_of
from streams.core.state import Changes, StateReader, WithAccounts, no_changes

__all__ = ["decide", "execute", "execute_share", "apply", "Result", "MAX_LEGS", "transaction_shape_failures"]

# More legs than this is refused as invalid_command: a bound on the work and size of one decision.
MAX_LEGS = 256

# A judgement: accepted events, or the winning (reason, detail) of a rejection.
_Failure = tuple[Rejection, str]
_Judgement = "tuple[Event, ...] | _Failure"

_INVALID = Rejection.INVALID_COMMAND
_OPEN = AccountStatus.OPEN
_FROZEN = AccountStatus.FROZEN
_CLOSED = AccountStatus.CLOSED


def _out_of_range(amount: int) -> bool:
    return amount > MAX_ABS_AMOUNT or amount < -MAX_ABS_AMOUNT


# ---------------------------------------------------------------------------------------------------- accounts


def _judge_open(state: StateReader, c: OpenAccount, currencies: CurrencyRegistry) -> _Judgement:
    failures: list[_Failure] = []
    policy = c.policy
    if not c.account_id:
        failures.append((_INVALID, "account_id is empty"))
    if c.routing_key is not None and c.routing_key != routing_key_for(c.account_id):
        # Every producer routes an account by its id (streams/routing.py): a key that named another owner
        # would be stored and never used, and its late settlements' receivable would live elsewhere.
        failures.append((_INVALID, f"routing_key must be the owner part of the account id "
                                   f"({routing_key_for(c.account_id)!r}) or null: accounts are routed by their id"))
    if policy.overdraft_limit < 0:
        failures.append((_INVALID, "overdraft_limit is negative"))
    if policy.max_balance is not None and policy.max_balance < 0:
        failures.append((_INVALID, "max_balance is negative"))
    if _out_of_range(policy.overdraft_limit) or (policy.max_balance is not None and _out_of_range(policy.max_balance)):
        failures.append((Rejection.AMOUNT_OUT_OF_RANGE, "policy limit beyond 2**127-1"))
    if failures:
        return min(failures)
    if currencies.get(c.currency) is None:
        failures.append((Rejection.UNKNOWN_CURRENCY, f"currency {c.currency} is not registered"))
    if state.account(c.account_id) is not None:
        failures.append((Rejection.ACCOUNT_EXISTS, f"account {c.account_id} already exists"))
    if failures:
        return min(failures)
    routing_key = c.routing_key if c.routing_key is not None else routing_key_for(c.account_id)
    return (AccountOpened(account_id=c.account_id, currency=c.currency, routing_key=routing_key,
                          policy=policy, at_ms=c.at_ms, account_type=c.account_type),)


def _load_account(state: StateReader, account_id: str) -> Account | _Failure:
    if not account_id:
        return (_INVALID, "account_id is empty")
    account = state.account(account_id)
    if account is None:
        return (Rejection.UNKNOWN_ACCOUNT, f"account {account_id} does not exist")
    return account


def _status_event(account: Account, status: AccountStatus, at_ms: int) -> tuple[Event, ...]:
    return (AccountStatusChanged(account_id=account.id, previous=account.status, status=status, at_ms=at_ms),)


def _judge_freeze(state: StateReader, c: FreezeAccount, currencies: CurrencyRegistry) -> _Judgement:
    account = _load_account(state, c.account_id)
    if type(account) is tuple:
        return account
    if account.status is _CLOSED:
        return (Rejection.ACCOUNT_CLOSED, f"account {account.id} is closed")
    if account.status is _FROZEN:
        return (Rejection.ACCOUNT_FROZEN, f"account {account.id} is already frozen")
    return _status_event(account, _FROZEN, c.at_ms)


def _judge_unfreeze(state: StateReader, c: UnfreezeAccount, currencies: CurrencyRegistry) -> _Judgement:
    account = _load_account(state, c.account_id)
    if type(account) is tuple:
        return account
    if account.status is _CLOSED:
        return (Rejection.ACCOUNT_CLOSED, f"account {account.id} is closed")
    if account.status is not _FROZEN:
        return (Rejection.ACCOUNT_NOT_FROZEN, f"account {account.id} is not frozen")
    return _status_event(account, _OPEN, c.at_ms)


def _judge_close(state: StateReader, c: CloseAccount, currencies: CurrencyRegistry) -> _Judgement:
    account = _load_account(state, c.account_id)
    if type(account) is tuple:
        return account
    if account.status is _CLOSED:
        return (Rejection.ACCOUNT_CLOSED, f"account {account.id} is already closed")
    if account.posted != 0 or account.held != 0:
        return (Rejection.ACCOUNT_NOT_EMPTY,
                f"account {account.id} has posted {account.posted} and held {account.held}")
    return _status_event(account, _CLOSED, c.at_ms)


# ------------------------------------------------------------------------------------------------ transactions


def _judge_transaction(state: StateReader, c: PostTransaction, currencies: CurrencyRegistry) -> _Judgement:
    """Fast path for the common plain transfer (debit leg, then credit leg); everything else, and every
    case the fast path cannot accept, goes through the general rules, which alone decide rejections."""
    legs = c.legs
    if len(legs) == 2 and c.transaction_id and c.kind and not c.metadata and c.rate_snapshot_id is None:
        debit_leg, credit_leg = legs
        amount = credit_leg.amount
        debit_id = debit_leg.account_id
        credit_id = credit_leg.account_id
        if (
            0 < amount <= MAX_ABS_AMOUNT
            and debit_leg.amount == -amount
            and debit_leg.hold_id is None
            and credit_leg.hold_id is None
            and debit_leg.currency is None
            and credit_leg.currency is None
            and debit_id
            and credit_id
            and debit_id != credit_id
        ):
            debit = state.account(debit_id)
            credit = state.account(credit_id)
            if (
                debit is not None
                and credit is not None
                and debit.status is _OPEN
                and credit.status is _OPEN
                and debit.currency == credit.currency
            ):
                debit_policy = debit.policy
                credit_cap = credit.policy.max_balance
                debit_posted = debit.posted - amount
                credit_posted = credit.posted + amount
                if (
                    (debit_policy.allow_negative or debit_posted - debit.held >= -debit_policy.overdraft_limit)
                    and debit_posted >= -MAX_ABS_AMOUNT
                    and credit_posted <= MAX_ABS_AMOUNT
                    and (credit_cap is None or credit_posted <= credit_cap)
                ):
                    return (TransactionPosted(
                        transaction_id=c.transaction_id, legs=legs, kind=c.kind, reference=c.reference,
                        links=c.links, metadata=c.metadata, occurred_at_ms=c.occurred_at_ms,
                        rate_snapshot_id=c.rate_snapshot_id, at_ms=c.at_ms, client_id=c.client_id,
                    ),)
    if c.metadata and returned_payment(c.metadata) is not None:
        return _judge_return(state, c, currencies)
    return _judge_transaction_rules(state, c, currencies)


def transaction_shape_failures(c: PostTransaction) -> list[_Failure]:
    """Stage 1 of a transaction's rules: shape and amounts (invalid_command, invalid_amount,
    amount_out_of_range), judged without any state. The coordinator of a transaction whose legs live in
    several partitions judges it so before anything is reserved (streams/spanning.py)."""
    legs = c.legs
    failures: list[_Failure] = []
    if not c.transaction_id:
        failures.append((_INVALID, "transaction_id is empty"))
    if not c.kind:
        failures.append((_INVALID, "kind is empty"))
    if not 2 <= len(legs) <= MAX_LEGS:
        failures.append((_INVALID, f"a transaction needs 2..{MAX_LEGS} legs, got {len(legs)}"))
    if c.metadata and len({k for k, _ in c.metadata}) != len(c.metadata):
        failures.append((_INVALID, "metadata keys are not unique"))
    terms = terms_of(c.metadata) if c.metadata else STRICT
    if type(terms) is str:
        failures.append((_INVALID, terms))
    for index, leg in enumerate(legs):
        amount = leg.amount
        if not leg.account_id:
            failures.append((_INVALID, f"leg {index}: account_id is empty"))
        if amount == 0:
            failures.append((Rejection.INVALID_AMOUNT, f"leg {index}: amount is zero"))
        elif amount > MAX_ABS_AMOUNT or amount < -MAX_ABS_AMOUNT:
            failures.append((Rejection.AMOUNT_OUT_OF_RANGE, f"leg {index}: amount beyond 2**127-1"))
        if leg.hold_id is not None and (amount > 0 or not leg.hold_id):
            failures.append((_INVALID, f"leg {index}: only a debit leg may name a (non-empty) hold"))
    return failures


def _judge_transaction_rules(state: StateReader, c: PostTransaction, currencies: CurrencyRegistry,
                             check_rate: bool = True) -> _Judgement:
    """The general rules for any transaction, in stages following the precedence of Rejection. check_rate:
    judge the rate snapshot it names (a reversal carries its original's, however old, and is not judged)."""
    legs = c.legs
    # Stage 1: shape and amounts (invalid_command, invalid_amount, amount_out_of_range).
    failures: list[_Failure] = transaction_shape_failures(c)
    if failures:
        return min(failures)
    terms = terms_of(c.metadata) if c.metadata else STRICT

    # Stage 2: every account exists and matches the currency a leg asserts.
    accounts: dict[str, Account] = {}
    for index, leg in enumerate(legs):
        account_id = leg.account_id
        account = accounts.get(account_id)
        if account is None:
            account = state.account(account_id)
            if account is None:
                failures.append((Rejection.UNKNOWN_ACCOUNT, f"account {account_id} does not exist"))
                continue
            accounts[account_id] = account
        if leg.currency is not None and leg.currency != account.currency:
            failures.append((Rejection.CURRENCY_MISMATCH,
                             f"leg {index}: {leg.currency} on {account.currency} account {account_id}"))
    if failures:
        return min(failures)

    # Stage 2b: the FX rate snapshot it names was recorded here, is fresh and is for its currencies (fail closed).
    snapshot = None
    if check_rate and c.rate_snapshot_id is not None:
        snapshot = state.rate(c.rate_snapshot_id)
        stale = judge_snapshot(snapshot, c.rate_snapshot_id, c.at_ms, (accounts[leg.account_id].currency for leg in legs))
        if stale is not None:
            return stale

    # Stage 3: each currency's legs sum to zero; per-account changes (several legs of one account combine).
    sums: dict[str, int] = {}
    posted_delta: dict[str, int] = {}
    held_delta: dict[str, int] = {}
    captures: dict[str, int] = {}
    for leg in legs:
        account_id = leg.account_id
        amount = leg.amount
        currency = accounts[account_id].currency
        sums[currency] = sums.get(currency, 0) + amount
        posted_delta[account_id] = posted_delta.get(account_id, 0) + amount
        if amount < 0:
            if leg.hold_id is not None:
                held_delta[account_id] = held_delta.get(account_id, 0) + amount
                captures[leg.hold_id] = captures.get(leg.hold_id, 0) - amount
    for currency, total in sums.items():
        if total:
            failures.append((Rejection.UNBALANCED, f"legs in {currency} sum to {total}"))
    if failures:
        return min(failures)

    # Stage 3b: a conversion's amounts follow the rate of the snapshot it names (streams/core/fx.py).
    if snapshot is not None:
        scales = {code: currencies.get(code).scale for code in (snapshot.base, snapshot.quote)}
        off = judge_conversion(snapshot, scales, [(leg.account_id, accounts[leg.account_id].currency, leg.amount)
                                                  for leg in legs])
        if off is not None:
            return off

    # Stage 4: holds, funds, limits and account status; the lowest reason wins.
    at_ms = c.at_ms
    late: set[str] = set()  # holds this transaction settles late (settlement.py): ended, settled anyway
    late_debit: dict[str, int] = {}  # account -> its late captures (negative): no funds or frozen check
    if captures:
        hold_accounts = {leg.hold_id: leg.account_id for leg in legs if leg.hold_id is not None}
        for hold_id, taken in captures.items():
            judged = judge_capture(hold_id, state.hold(hold_id), hold_accounts[hold_id], taken, terms, at_ms)
            if type(judged) is tuple:
                failures.append(judged)
            elif judged:
                late.add(hold_id)
        for leg in legs:
            if leg.hold_id is not None and leg.hold_id in late:  # no longer reserved: a debit of available
                held_delta[leg.account_id] -= leg.amount
                late_debit[leg.account_id] = late_debit.get(leg.account_id, 0) + leg.amount
    debited = {leg.account_id for leg in legs if leg.amount < 0 and (leg.hold_id is None or leg.hold_id not in late)}
    for account_id, delta in posted_delta.items():
        account = accounts[account_id]
        status = account.status
        if status is not _OPEN:
            if status is _CLOSED:
                failures.append((Rejection.ACCOUNT_CLOSED, f"account {account_id} is closed"))
            elif account_id in debited:
                failures.append((Rejection.ACCOUNT_FROZEN, f"account {account_id} is frozen"))
        posted = account.posted + delta
        if posted > MAX_ABS_AMOUNT or posted < -MAX_ABS_AMOUNT:
            failures.append((Rejection.AMOUNT_OUT_OF_RANGE, f"account {account_id}: posted beyond 2**127-1"))
        policy = account.policy
        # Captures move posted and held together, so only the other legs change available. A late settlement
        # was made outside already: it is never the reason for insufficient_funds (what available cannot cover
        # of it goes to the owner's receivable, below).
        late_part = late_debit.get(account_id, 0)
        available_delta = delta - held_delta.get(account_id, 0) - late_part
        if available_delta < 0 and not policy.allow_negative:
            available = posted - account.held - held_delta.get(account_id, 0) - late_part
            if available < -policy.overdraft_limit:
                failures.append((Rejection.INSUFFICIENT_FUNDS,
                                 f"account {account_id}: available would be {available}"))
        if delta > 0 and policy.max_balance is not None and posted > policy.max_balance:
            failures.append((Rejection.BALANCE_LIMIT_EXCEEDED,
                             f"account {account_id}: posted would be {posted} > {policy.max_balance}"))
    if failures:
        return min(failures)

    assert not any(sums.values()), "double entry: an accepted transaction must balance per currency"
    opened: tuple[Event, ...] = ()
    if late_debit:
        overdraw = _overdraw_to_receivables(state, accounts, legs, posted_delta, held_delta, late_debit, at_ms)
        if type(overdraw[0]) is Rejection:
            return overdraw
        opened, legs = overdraw
    return (*opened, TransactionPosted(
        transaction_id=c.transaction_id, legs=legs, kind=c.kind, reference=c.reference, links=c.links,
        metadata=c.metadata, occurred_at_ms=c.occurred_at_ms, rate_snapshot_id=c.rate_snapshot_id, at_ms=at_ms,
        client_id=c.client_id,
    ))


def _judge_reverse(state: StateReader, c: ReverseTransaction, currencies: CurrencyRegistry) -> _Judgement:
    """The original must be known here, posted by the same client and not reversed yet; then its mirrored legs
    are judged like any transaction (funds, status, limits), so a spent deposit is insufficient_funds."""
    if not c.transaction_id or not c.reverses:
        return (_INVALID, "transaction_id and reverses must not be empty")
    if c.transaction_id == c.reverses:
        return (_INVALID, "a transaction cannot reverse itself")
    original = state.transaction(c.reverses)
    if original is None:
        return (Rejection.UNKNOWN_TRANSACTION, f"transaction {c.reverses} was not posted in this partition")
    if original.client_id != c.client_id:
        return (Rejection.CLIENT_MISMATCH, f"transaction {c.reverses} was posted by another client")
    if original.reversed_by is not None:
        return (Rejection.ALREADY_REVERSED, f"transaction {c.reverses} was reversed by {original.reversed_by}")
    if original.returns is not None:
        return (Rejection.NOT_REVERSIBLE, f"transaction {c.reverses} is a return of {original.returns}: "
                                          f"its money went back to the payer; pay it again instead")
    if original.returned:
        return (Rejection.EXCEEDS_UNRETURNED, f"{original.returned} of transaction {c.reverses} was returned "
                                              f"already: return the rest instead")
    if state.transaction(c.transaction_id) is not None:
        return (_INVALID, f"transaction id {c.transaction_id} is taken")
    mirror = reversal_of(original, transaction_id=c.transaction_id, command_id=c.command_id,
                         client_id=c.client_id, at_ms=c.at_ms, reference=c.reference,
                         occurred_at_ms=c.occurred_at_ms)
    judged = _judge_transaction_rules(state, mirror, currencies, check_rate=False)
    if type(judged[0]) is Rejection:
        return judged
    return (*judged, TransactionReversed(transaction_id=c.reverses, reversed_by=c.transaction_id, at_ms=c.at_ms))


def _judge_return(state: StateReader, c: PostTransaction, currencies: CurrencyRegistry) -> _Judgement:
    """A return or chargeback (streams/core/returns.py): checked against the payment it names, then what the
    payee's available cannot cover is taken from its receivable, and the legs are judged like any transaction."""
    judged = judge_named(c.transaction_id, c.metadata, c.client_id, c.legs, c.links, state.transaction)
    if type(judged[0]) is Rejection:
        return judged
    payer, payee, amount, counted = judged
    if state.transaction(c.transaction_id) is not None:
        return (_INVALID, f"transaction id {c.transaction_id} is taken")
    reader: StateReader = state
    opened: tuple[Event, ...] = ()
    legs = c.legs
    account = state.account(payee)
    if account is not None:
        take = covered(account, amount)
        if take < amount:  # the money is spent: the rest becomes what the payee owes
            receivable = receivable_of(account.routing_key, account.currency)
            if state.account(receivable) is None:
                opened = (AccountOpened(account_id=receivable, currency=account.currency,
                                        routing_key=account.routing_key, policy=SYSTEM_POLICY, at_ms=c.at_ms),)
                reader = WithAccounts(state, {receivable: Account(receivable, account.currency, account.routing_key,
                                                                  SYSTEM_POLICY, _OPEN, 0, 0, 0, None, c.at_ms)})
            debit = next(leg for leg in legs if leg.account_id == payee)
            credit = next(leg for leg in legs if leg.account_id == payer)
            legs = ((Leg(payee, -take, None, debit.currency),) if take else ()) + (
                Leg(receivable, take - amount), credit)
    posted = _judge_transaction_rules(reader, c.with_legs(legs), currencies)
    if type(posted[0]) is Rejection:
        return posted
    # Every step of the payment counts the return (the payment named first: the return records it as what it
    # returns), so no step's money is returned again through another flow or on its own (returns.py).
    return (*opened, *posted, *_counted(c, Returned(payer, payee, amount, counted)))


def _counted(c: PostTransaction, returned: Returned) -> tuple[TransactionReturned, ...]:
    return tuple(TransactionReturned(transaction_id=step, returned_by=c.transaction_id, amount=returned.amount,
                                     at_ms=c.at_ms) for step in returned.counted)


def _overdraw_to_receivables(state: StateReader, accounts: dict[str, Account], legs: tuple[Leg, ...],
                             posted_delta: dict[str, int], held_delta: dict[str, int],
                             late_debit: dict[str, int], at_ms: int) -> "tuple[tuple[Event, ...], tuple[Leg, ...]] | _Failure":
    """A late settlement keeps P2: what an account's available cannot cover of its late captures is debited
    from its owner's receivable instead (opened here on first use), on a leg naming the same hold. A receivable
    an operator closed cannot take it (account_closed): the one refusal a late settlement can meet."""
    shortfall: dict[str, int] = {}
    for account_id, late_part in late_debit.items():
        account = accounts[account_id]
        if account.policy.allow_negative:
            continue
        available = account.posted + posted_delta[account_id] - account.held - held_delta.get(account_id, 0)
        short = min(-account.policy.overdraft_limit - available, -late_part)
        if short > 0:
            shortfall[account_id] = short
    if not shortfall:
        return (), legs
    opened: list[AccountOpened] = []
    out: list[Leg] = []
    for leg in legs:
        short = shortfall.get(leg.account_id, 0)
        hold = state.hold(leg.hold_id) if short and leg.hold_id is not None else None
        if hold is None or not ended(hold):
            out.append(leg)
            continue
        moved = min(short, -leg.amount)
        shortfall[leg.account_id] = short - moved
        account = accounts[leg.account_id]
        receivable = receivable_of(account.routing_key, account.currency)
        existing = state.account(receivable)
        if existing is not None and existing.status is _CLOSED:
            return (Rejection.ACCOUNT_CLOSED, f"receivable {receivable} is closed")
        if existing is None and all(e.account_id != receivable for e in opened):
            opened.append(AccountOpened(account_id=receivable, currency=account.currency,
                                        routing_key=account.routing_key, policy=SYSTEM_POLICY, at_ms=at_ms))
        if leg.amount + moved:
            out.append(Leg(leg.account_id, leg.amount + moved, leg.hold_id, leg.currency))
        out.append(Leg(receivable, -moved, leg.hold_id, leg.currency))
    return tuple(opened), tuple(out)


def _settles_late(state: StateReader, c: PostTransaction) -> bool:
    """An accepted transaction captured from a hold that had ended (only an external settlement may)."""
    for leg in c.legs:
        if leg.hold_id is not None:
            hold = state.hold(leg.hold_id)
            if hold is not None and ended(hold):
                return True
    return False


# ------------------------------------------------------------------------------------------------------- holds


def _judge_place(state: StateReader, c: PlaceHold, currencies: CurrencyRegistry) -> _Judgement:
    failures: list[_Failure] = []
    amount = c.amount
    if not c.hold_id:
        failures.append((_INVALID, "hold_id is empty"))
    if not c.account_id:
        failures.append((_INVALID, "account_id is empty"))
    if c.expires_at_ms is not None and c.expires_at_ms <= c.at_ms:
        failures.append((_INVALID, f"expires_at_ms {c.expires_at_ms} is not after at_ms {c.at_ms}"))
    if amount <= 0:
        failures.append((Rejection.INVALID_AMOUNT, f"hold amount must be positive, got {amount}"))
    elif amount > MAX_ABS_AMOUNT:
        failures.append((Rejection.AMOUNT_OUT_OF_RANGE, "hold amount beyond 2**127-1"))
    if failures:
        return min(failures)
    if state.hold(c.hold_id) is not None:
        failures.append((Rejection.HOLD_EXISTS, f"hold {c.hold_id} already exists"))
    account = state.account(c.account_id)
    if account is None:
        failures.append((Rejection.UNKNOWN_ACCOUNT, f"account {c.account_id} does not exist"))
    if failures:
        return min(failures)
    assert account is not None
    if account.status is _CLOSED:
        failures.append((Rejection.ACCOUNT_CLOSED, f"account {account.id} is closed"))
    elif account.status is _FROZEN:
        failures.append((Rejection.ACCOUNT_FROZEN, f"account {account.id} is frozen"))
    held = account.held + amount
    if held > MAX_ABS_AMOUNT:
        failures.append((Rejection.AMOUNT_OUT_OF_RANGE, f"account {account.id}: held beyond 2**127-1"))
    policy = account.policy
    if not policy.allow_negative and account.posted - held < -policy.overdraft_limit:
        failures.append((Rejection.INSUFFICIENT_FUNDS,
                         f"account {account.id}: available {account.available} cannot hold {amount}"))
    if failures:
        return min(failures)
    return (HoldPlaced(hold_id=c.hold_id, account_id=account.id, amount=amount, expires_at_ms=c.expires_at_ms,
                       at_ms=c.at_ms),)


def _open_hold(state: StateReader, hold_id: str):
    if not hold_id:
        return (_INVALID, "hold_id is empty")
    hold = state.hold(hold_id)
    if hold is None:
        return (Rejection.UNKNOWN_HOLD, f"hold {hold_id} does not exist")
    if hold.status is not HoldStatus.OPEN:
        return (Rejection.HOLD_NOT_OPEN, f"hold {hold_id} is {hold.status.value}")
    assert state.account(hold.account_id) is not None, f"hold {hold_id} on a missing account"
    return hold


def _judge_release(state: StateReader, c: ReleaseHold, currencies: CurrencyRegistry) -> _Judgement:
    hold = _open_hold(state, c.hold_id)
    if type(hold) is tuple:
        return hold
    return (HoldReleased(hold_id=hold.id, account_id=hold.account_id, amount=hold.remaining, at_ms=c.at_ms),)


def _judge_expire(state: StateReader, c: ExpireHold, currencies: CurrencyRegistry) -> _Judgement:
    hold = _open_hold(state, c.hold_id)
    if type(hold) is tuple:
        return hold
    if hold.expires_at_ms is None or c.at_ms < hold.expires_at_ms:
        return (Rejection.HOLD_NOT_EXPIRED, f"hold {hold.id} expires at {hold.expires_at_ms}, now {c.at_ms}")
    return (HoldExpired(hold_id=hold.id, account_id=hold.account_id, amount=hold.remaining, at_ms=c.at_ms),)


# -------------------------------------------------------------------------------------------------- currencies


def _judge_register(state: StateReader, c: RegisterCurrency, currencies: CurrencyRegistry) -> _Judgement:
    """A new code with a scale in range; the same code again is currency_exists, with another scale
    currency_conflict (a scale never changes)."""
    if not valid_code(c.currency):
        return (_INVALID, f"currency code {c.currency[:40]!r}: 1-16 of A-Z a-z 0-9 _ . -")
    if not 0 <= c.scale <= MAX_SCALE:
        return (_INVALID, f"scale {c.scale} outside 0..{MAX_SCALE}")
    known = currencies.get(c.currency)
    if known is not None:
        if known.scale != c.scale:
            return (Rejection.CURRENCY_CONFLICT, f"{c.currency} is registered with scale {known.scale}")
        return (Rejection.CURRENCY_EXISTS, f"{c.currency} is registered with scale {known.scale} already")
    return (CurrencyRegistered(currency=c.currency, scale=c.scale, at_ms=c.at_ms),)


def _judge_record_rate(state: StateReader, c: RecordRate, currencies: CurrencyRegistry) -> _Judgement:
    """A snapshot of a known pair with a positive exact rate that expires after it is recorded; the same id
    again is a no-op answered rate_exists (with other content too: a snapshot never changes)."""
    if not c.snapshot_id:
        return (_INVALID, "snapshot_id is empty")
    if c.base == c.quote:
        return (_INVALID, "a rate needs two currencies")
    if not valid_rate(c.rate):
        return (Rejection.INVALID_AMOUNT, f"rate {c.rate[:40]!r} is not a positive decimal string")
    if c.expires_at_ms <= c.at_ms:
        return (_INVALID, f"expires_at_ms {c.expires_at_ms} is not after at_ms {c.at_ms}")
    for code in (c.base, c.quote):
        if currencies.get(code) is None:
            return (Rejection.UNKNOWN_CURRENCY, f"currency {code} is not registered")
    if state.rate(c.snapshot_id) is not None:
        return (Rejection.RATE_EXISTS, f"rate snapshot {c.snapshot_id} was recorded already")
    return (RateRecorded(snapshot=RateSnapshot(c.snapshot_id, c.base, c.quote, c.rate, c.at_ms, c.expires_at_ms)),)


# ---------------------------------------------------------------------------------------------------- dispatch

_JUDGES = {
    OpenAccount: _judge_open,
    FreezeAccount: _judge_freeze,
    UnfreezeAccount: _judge_unfreeze,
    CloseAccount: _judge_close,
    PostTransaction: _judge_transaction,
    PlaceHold: _judge_place,
    ReleaseHold: _judge_release,
    ExpireHold: _judge_expire,
    ReverseTransaction: _judge_reverse,
    RegisterCurrency: _judge_register,
    RecordRate: _judge_record_rate,
}


def _decide(state: StateReader, command: Command, currencies: CurrencyRegistry,
            fingerprint: str | None = None, judge=None) -> tuple[Result, str | None]:
    """Steps 1-3: the result and the fingerprint to remember (None = remember nothing). judge: the rules
    to judge it by, when not its type's (a share of a transaction decided across partitions)."""
    judge = judge or _JUDGES.get(type(command))
    if judge is None:
        raise TypeError(f"not a command: {command!r}")
    command_id = command.command_id
    client_id = command.client_id
    if not command_id or not client_id:
        return Result(command_id, client_id, REJECTED, _INVALID, "command_id and client_id must not be empty",
                      ()), None
    if fingerprint is None:
        fingerprint = command.fingerprint()
    seen = state.processed((client_id, command_id))
    if seen is not None:
        if seen.fingerprint == fingerprint:
            return dataclasses.replace(seen.result, duplicate=True), None
        return Result(command_id, client_id, REJECTED, Rejection.ID_CONFLICT,
                      f"command {command_id} of {client_id} was already used with another payload", ()), None
    judged = judge(state, command, currencies)
    if type(judged[0]) is Rejection:
        return Result(command_id, client_id, REJECTED, judged[0], judged[1], ()), fingerprint
    if type(command) is PostTransaction and command.metadata and _settles_late(state, command):
        return Result(command_id, client_id, ACCEPTED, None, "a hold it captures had ended: settled late",
                      judged, notice=LATE_SETTLEMENT), fingerprint
    return Result(command_id, client_id, ACCEPTED, None, "", judged), fingerprint


def decide(state: StateReader, command: Command, currencies: CurrencyRegistry = DEFAULT_CURRENCIES) -> Result:
    """What command does against state: accepted with events, rejected with a reason, or a duplicate."""
    return _decide(state, command, currencies)[0]


def execute(
    state: StateReader, command: Command, currencies: CurrencyRegistry = DEFAULT_CURRENCIES,
    fingerprint: str | None = None,
) -> tuple[Result, Changes]:
    """decide + apply: the result and every record it writes (steps 1-5), ready for one atomic batch.

    Duplicate or id_conflict -> no changes at all. Rejected -> only the inbox entry (so a retry gets the same
    answer). Accepted -> new accounts, holds, history entries and the inbox entry.
    fingerprint: the payload fingerprint to compare and remember, when the caller rewrote the command it was
    sent (the engine routes system accounts to shards) and a retry must match the original; default: this
    command's own.
    """
    result, fingerprint = _decide(state, command, currencies, fingerprint)
    if fingerprint is None:
        return result, no_changes()
    return result, _changes(state, result, fingerprint)


def _changes(state: StateReader, result: Result, fingerprint: str) -> Changes:
    """Steps 4-5 of a decided command: every record it writes."""
    processed = ((result.client_id, result.command_id), Processed(fingerprint, result))
    if not result.events:
        return Changes({}, {}, (), processed)
    changes = apply(state, result.events)
    assert_changes_balanced({aid: state.account(aid) for aid in changes.accounts}, changes.accounts.values())
    return Changes(changes.accounts, changes.holds, changes.history, processed, changes.transactions,
                   changes.currencies, changes.rates)


def execute_share(state: StateReader, share: PostTransaction, owner: str,
                  currencies: CurrencyRegistry = DEFAULT_CURRENCIES, returned: Returned | None = None,
                  fingerprint: str | None = None) -> tuple[Result, Changes]:
    """execute for one partition's share of a transaction decided across partitions (streams/spanning.py),
    posted by the engine (the share's client) once every partition reserved its legs, judged by the general
    rules. Its record is the transaction's client's, ``owner``: only that client may return or reverse it,
    as in one partition. returned: for a share of a return, what it returns of the payment's share here, as
    judged at the reservation (returns.judge_named); the share's decision counts it on that payment."""

    def judge(state: StateReader, c: PostTransaction, currencies: CurrencyRegistry) -> _Judgement:
        # A share of a return names the payment in its metadata: judged by the general rules, not again
        # as a return (its reservation was).
        judged = _judge_transaction(state, c, currencies) if returned is None else \
            _judge_transaction_rules(state, c, currencies)
        if type(judged[0]) is Rejection:
            return judged
        events = tuple(dataclasses.replace(e, client_id=owner) if type(e) is TransactionPosted else e
                       for e in judged)
        return events if returned is None else (*events, *_counted(c, returned))

    result, fingerprint = _decide(state, share, currencies, fingerprint, judge)
    if fingerprint is None:
        return result, no_changes()
    return result, _changes(state, result, fingerprint)
