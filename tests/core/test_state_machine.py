"""Hypothesis stateful test: random commands against a deliberately simple reference model.

The model keeps plain dicts and decides each command by listing every rule it breaks and taking the one with the
lowest precedence value; the core decides in stages. They must agree on every outcome and every balance, and
after every step the promises P1-P6 and P9 are checked on the core's own state and history.
"""

from __future__ import annotations

import dataclasses

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from streams.core import (
    DEFAULT_CURRENCIES,
    AccountPolicy,
    AccountStatus,
    CloseAccount,
    ExpireHold,
    FreezeAccount,
    HoldStatus,
    Leg,
    MemoryState,
    OpenAccount,
    PlaceHold,
    PostTransaction,
    Rejection as R,
    ReleaseHold,
    TransactionPosted,
    UnfreezeAccount,
    check_account,
    check_hold,
    execute,
    format_amount,
    parse_amount,
)
from tests.core.budget import examples

ACCOUNTS = ["u1:USD", "u2:USD", "sys:USD", "u1:BTC", "sys:BTC", "u3:JPY", "ghost"]
HOLDS = ["h1", "h2", "h3", "h4", "ghost-hold"]
CURRENCIES = ["USD", "USD", "BTC", "JPY", "XXX"]
CLIENTS = ["alice", "bob"]

account_ids = st.sampled_from(ACCOUNTS)
amounts = st.integers(min_value=-5, max_value=700)
positive = st.integers(min_value=1, max_value=400)


class LedgerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = MemoryState()
        self.clock = 1_000
        self.counter = 0
        # reference model: plain dicts, no shared code with the decision logic
        self.accounts: dict[str, dict] = {}
        self.holds: dict[str, dict] = {}
        self.inbox: dict[tuple[str, str], tuple[object, object]] = {}  # key -> (command without at_ms, result)
        self.sent: list = []  # every command sent, for redeliveries and conflicts
        # P4, counted from what the core wrote, for every send (redeliveries and conflicts included): how many
        # sends of each command key changed an account, a hold or the history; and the history entries of each
        # transaction the core accepted.
        self.effects: dict[tuple[str, str], int] = {}
        self.entries_by_tx: dict[str, int] = {}

    # ----------------------------------------------------------------------------------------------- model
    def _expected(self, cmd) -> R | None:
        """None = accepted; else the lowest-precedence rule the command breaks (reference model)."""
        broken: list[R] = []
        if isinstance(cmd, OpenAccount):
            if cmd.currency not in ("USD", "BTC", "JPY"):
                broken.append(R.UNKNOWN_CURRENCY)
            if cmd.account_id in self.accounts:
                broken.append(R.ACCOUNT_EXISTS)
        elif isinstance(cmd, (FreezeAccount, UnfreezeAccount, CloseAccount)):
            a = self.accounts.get(cmd.account_id)
            if a is None:
                broken.append(R.UNKNOWN_ACCOUNT)
            elif a["status"] == "closed":
                broken.append(R.ACCOUNT_CLOSED)
            elif isinstance(cmd, FreezeAccount) and a["status"] == "frozen":
                broken.append(R.ACCOUNT_FROZEN)
            elif isinstance(cmd, UnfreezeAccount) and a["status"] != "frozen":
                broken.append(R.ACCOUNT_NOT_FROZEN)
            elif isinstance(cmd, CloseAccount) and (a["posted"] or a["held"]):
                broken.append(R.ACCOUNT_NOT_EMPTY)
        elif isinstance(cmd, PlaceHold):
            if cmd.expires_at_ms is not None and cmd.expires_at_ms <= cmd.at_ms:
                broken.append(R.INVALID_COMMAND)
            if cmd.amount <= 0:
                broken.append(R.INVALID_AMOUNT)
            if cmd.hold_id in self.holds:
                broken.append(R.HOLD_EXISTS)
            a = self.accounts.get(cmd.account_id)
            if a is None:
                broken.append(R.UNKNOWN_ACCOUNT)
            else:
                if a["status"] == "closed":
                    broken.append(R.ACCOUNT_CLOSED)
                if a["status"] == "frozen":
                    broken.append(R.ACCOUNT_FROZEN)
                if not a["neg"] and a["posted"] - a["held"] - cmd.amount < -a["overdraft"]:
                    broken.append(R.INSUFFICIENT_FUNDS)
        elif isinstance(cmd, (ReleaseHold, ExpireHold)):
            h = self.holds.get(cmd.hold_id)
            if h is None:
                broken.append(R.UNKNOWN_HOLD)
            elif h["status"] != "open":
                broken.append(R.HOLD_NOT_OPEN)
            elif isinstance(cmd, ExpireHold) and (h["expires"] is None or cmd.at_ms < h["expires"]):
                broken.append(R.HOLD_NOT_EXPIRED)
        elif isinstance(cmd, PostTransaction):
            if len(cmd.legs) < 2:
                broken.append(R.INVALID_COMMAND)
            for leg in cmd.legs:
                if leg.amount == 0:
                    broken.append(R.INVALID_AMOUNT)
                if leg.hold_id is not None and leg.amount > 0:
                    broken.append(R.INVALID_COMMAND)
                if leg.account_id not in self.accounts:
                    broken.append(R.UNKNOWN_ACCOUNT)
            known = all(leg.account_id in self.accounts for leg in cmd.legs)
            if known:
                per_currency: dict[str, int] = {}
                for leg in cmd.legs:
                    cur = self.accounts[leg.account_id]["currency"]
                    per_currency[cur] = per_currency.get(cur, 0) + leg.amount
                if any(per_currency.values()):
                    broken.append(R.UNBALANCED)
                taken: dict[str, int] = {}
                for leg in cmd.legs:
                    if leg.hold_id is None or leg.amount > 0:
                        continue
                    h = self.holds.get(leg.hold_id)
                    if h is None or h["account"] != leg.account_id:
                        broken.append(R.UNKNOWN_HOLD)
                    elif h["status"] != "open":
                        broken.append(R.HOLD_NOT_OPEN)
                    elif h["expires"] is not None and h["expires"] <= cmd.at_ms:
                        broken.append(R.HOLD_EXPIRED)
                    else:
                        taken[leg.hold_id] = taken.get(leg.hold_id, 0) - leg.amount
                for hold_id, total in taken.items():
                    h = self.holds[hold_id]
                    if total > h["amount"] - h["captured"] - h["released"]:
                        broken.append(R.CAPTURE_EXCEEDS_HOLD)
                for account_id in {leg.account_id for leg in cmd.legs}:
                    a = self.accounts[account_id]
                    mine = [leg for leg in cmd.legs if leg.account_id == account_id]
                    if a["status"] == "closed":
                        broken.append(R.ACCOUNT_CLOSED)
                    if a["status"] == "frozen" and any(leg.amount < 0 for leg in mine):
                        broken.append(R.ACCOUNT_FROZEN)
                    spend = sum(leg.amount for leg in mine if leg.hold_id is None)
                    if spend < 0 and not a["neg"] and a["posted"] - a["held"] + spend < -a["overdraft"]:
                        broken.append(R.INSUFFICIENT_FUNDS)
        return min(broken) if broken else None

    def _model_apply(self, cmd) -> None:
        if isinstance(cmd, OpenAccount):
            self.accounts[cmd.account_id] = dict(
                currency=cmd.currency, neg=cmd.policy.allow_negative, overdraft=cmd.policy.overdraft_limit,
                status="open", posted=0, held=0)
        elif isinstance(cmd, FreezeAccount):
            self.accounts[cmd.account_id]["status"] = "frozen"
        elif isinstance(cmd, UnfreezeAccount):
            self.accounts[cmd.account_id]["status"] = "open"
        elif isinstance(cmd, CloseAccount):
            self.accounts[cmd.account_id]["status"] = "closed"
        elif isinstance(cmd, PlaceHold):
            self.holds[cmd.hold_id] = dict(account=cmd.account_id, amount=cmd.amount, captured=0, released=0,
                                           status="open", expires=cmd.expires_at_ms)
            self.accounts[cmd.account_id]["held"] += cmd.amount
        elif isinstance(cmd, (ReleaseHold, ExpireHold)):
            h = self.holds[cmd.hold_id]
            rest = h["amount"] - h["captured"] - h["released"]
            h["released"] += rest
            h["status"] = "released" if isinstance(cmd, ReleaseHold) else "expired"
            self.accounts[h["account"]]["held"] -= rest
        elif isinstance(cmd, PostTransaction):
            for leg in cmd.legs:
                a = self.accounts[leg.account_id]
                a["posted"] += leg.amount
                if leg.hold_id is not None:
                    h = self.holds[leg.hold_id]
                    h["captured"] -= leg.amount
                    a["held"] += leg.amount
                    if h["captured"] + h["released"] == h["amount"]:
                        h["status"] = "captured"

    # ------------------------------------------------------------------------------------------- sending
    def _send(self, cmd) -> None:
        key = (cmd.client_id, cmd.command_id)
        payload = dataclasses.replace(cmd, at_ms=0)
        seen = self.inbox.get(key)
        before = dict(self.state.accounts)
        result, changes = execute(self.state, cmd, DEFAULT_CURRENCIES)
        self.state.commit(changes)
        wrote = bool(changes.accounts or changes.holds or changes.history)
        self.effects[key] = self.effects.get(key, 0) + wrote
        if seen is not None:
            original_payload, original = seen
            assert changes.is_empty and self.state.accounts == before
            if original_payload == payload:  # P4: a retry gets the original result, no second effect
                assert result.duplicate and dataclasses.replace(result, duplicate=False) == original
            else:  # same id, other payload: conflict, nothing changes
                assert result.reason is R.ID_CONFLICT and not result.duplicate
            return
        expected = self._expected(cmd)
        got = None if result.accepted else result.reason
        assert got == expected, f"{cmd}: core says {got}, model says {expected} ({result.detail})"
        assert not result.duplicate
        self.inbox[key] = (payload, result)
        if result.accepted:
            self._model_apply(cmd)
            for event in result.events:
                if isinstance(event, TransactionPosted):  # P1 per transaction, P6 all legs posted
                    totals: dict[str, int] = {}
                    for leg in event.legs:
                        cur = self.state.accounts[leg.account_id].currency
                        totals[cur] = totals.get(cur, 0) + leg.amount
                    assert not any(totals.values())
                    posted = [e for e in changes.history if e.transaction_id == event.transaction_id]
                    assert len(posted) == len(event.legs)
                    self.entries_by_tx[event.transaction_id] = len(posted)
        else:
            assert not changes.accounts and not changes.holds and not changes.history
        self.sent.append(cmd)

    def _next(self, client: str | None = None) -> dict:
        self.counter += 1
        return dict(command_id=f"c{self.counter}", client_id=client or CLIENTS[self.counter % 2], at_ms=self.clock)

    # ---------------------------------------------------------------------------------------------- rules
    @initialize()
    def funded_accounts(self) -> None:
        for account_id, currency in (("sys:USD", "USD"), ("sys:BTC", "BTC")):
            self._send(OpenAccount(**self._next(), account_id=account_id, currency=currency,
                                   policy=AccountPolicy(allow_negative=True)))
        for account_id, currency in (("u1:USD", "USD"), ("u2:USD", "USD"), ("u1:BTC", "BTC")):
            self._send(OpenAccount(**self._next(), account_id=account_id, currency=currency))
            self._send(PostTransaction(**self._next(), transaction_id=f"fund-{account_id}", kind="deposit",
                                       legs=(Leg(f"sys:{currency}", -1000), Leg(account_id, 1000))))

    def _some_hold(self, pick: int) -> str:
        """Mostly an existing hold (open ones first), sometimes one that does not exist."""
        if not self.holds or pick % 7 == 0:
            return HOLDS[pick % len(HOLDS)]
        open_ids = sorted(h for h, v in self.holds.items() if v["status"] == "open")
        pool = open_ids if open_ids and pick % 3 else sorted(self.holds)
        return pool[pick % len(pool)]

    @rule(ms=st.integers(0, 3_000))
    def time_passes(self, ms: int) -> None:
        self.clock += ms

    @rule(account_id=account_ids, currency=st.sampled_from(CURRENCIES), neg=st.booleans(),
          overdraft=st.sampled_from([0, 0, 50]))
    def open_account(self, account_id: str, currency: str, neg: bool, overdraft: int) -> None:
        self._send(OpenAccount(**self._next(), account_id=account_id, currency=currency,
                               policy=AccountPolicy(allow_negative=neg, overdraft_limit=overdraft)))

    @rule(source=account_ids, dest=account_ids, amount=positive, edge=st.sampled_from([None, None, -1, 0, 1]))
    def transfer(self, source: str, dest: str, amount: int, edge: int | None) -> None:
        model = self.accounts.get(source)
        if edge is not None and model is not None:  # aim at the floor: available + overdraft + edge
            amount = max(1, model["posted"] - model["held"] + model["overdraft"] + edge)
        self._send(PostTransaction(**self._next(), transaction_id=f"t{self.counter + 1}",
                                   legs=(Leg(source, -amount), Leg(dest, amount))))

    @rule(legs=st.lists(st.tuples(account_ids, amounts), min_size=1, max_size=4), balance=st.booleans())
    def transaction(self, legs: list[tuple[str, int]], balance: bool) -> None:
        built = [Leg(a, n) for a, n in legs]
        if balance and sum(n for _, n in legs):
            built.append(Leg(legs[0][0], -sum(n for _, n in legs)))
        self._send(PostTransaction(**self._next(), transaction_id=f"t{self.counter + 1}", legs=tuple(built),
                                   kind="mixed"))

    @rule(reuse=st.booleans(), pick=st.integers(0, 1000), account_id=account_ids, amount=amounts,
          expires=st.one_of(st.none(), st.integers(-100, 5_000)))
    def place_hold(self, reuse: bool, pick: int, account_id: str, amount: int, expires: int | None) -> None:
        hold_id = self._some_hold(pick) if reuse else f"h{self.counter + 1}"
        model = self.accounts.get(account_id)
        if model is not None and pick % 4 == 0:  # aim at available + overdraft, -1 / 0 / +1
            amount = max(1, model["posted"] - model["held"] + model["overdraft"] + pick % 3 - 1)
        self._send(PlaceHold(**self._next(), hold_id=hold_id, account_id=account_id, amount=amount,
                             expires_at_ms=None if expires is None else self.clock + expires))

    @rule(pick=st.integers(0, 1000), dest=account_ids, amount=positive, split=st.booleans(),
          wrong_account=st.integers(0, 9))
    def capture(self, pick: int, dest: str, amount: int, split: bool, wrong_account: int) -> None:
        hold_id = self._some_hold(pick)
        hold = self.state.holds.get(hold_id)
        if hold is not None and wrong_account in (1, 2, 3):  # aim at the hold's remaining: -1, 0, +1
            amount = max(1, hold.remaining + wrong_account - 2)
        wrong_account = wrong_account == 0
        source = "u1:USD" if hold is None or wrong_account else hold.account_id
        if split and amount > 1:
            legs = (Leg(source, -(amount // 2), hold_id), Leg(source, -(amount - amount // 2), hold_id),
                    Leg(dest, amount))
        else:
            legs = (Leg(source, -amount, hold_id), Leg(dest, amount))
        self._send(PostTransaction(**self._next(), transaction_id=f"t{self.counter + 1}", legs=legs,
                                   kind="capture"))

    @rule(pick=st.integers(0, 1000))
    def release(self, pick: int) -> None:
        self._send(ReleaseHold(**self._next(), hold_id=self._some_hold(pick)))

    @rule(pick=st.integers(0, 1000))
    def expire(self, pick: int) -> None:
        self._send(ExpireHold(**self._next(), hold_id=self._some_hold(pick)))

    @rule(account_id=account_ids, action=st.sampled_from([FreezeAccount, UnfreezeAccount, CloseAccount]))
    def lifecycle(self, account_id: str, action) -> None:
        self._send(action(**self._next(), account_id=account_id))

    @precondition(lambda self: self.sent)
    @rule(index=st.integers(0, 10**6), later=st.integers(0, 10_000))
    def redeliver(self, index: int, later: int) -> None:
        original = self.sent[index % len(self.sent)]
        self._send(dataclasses.replace(original, at_ms=original.at_ms + later))

    @precondition(lambda self: self.sent)
    @rule(index=st.integers(0, 10**6))
    def reuse_id_with_other_payload(self, index: int) -> None:
        original = self.sent[index % len(self.sent)]
        self._send(ReleaseHold(command_id=original.command_id, client_id=original.client_id, at_ms=self.clock,
                               hold_id="conflicting-" + original.command_id))

    # ------------------------------------------------------------------------------------------ promises
    @invariant()
    def p1_books_balance_per_currency(self) -> None:
        totals: dict[str, int] = {}
        for account in self.state.accounts.values():
            totals[account.currency] = totals.get(account.currency, 0) + account.posted
        assert not any(totals.values()), totals

    @invariant()
    def p2_no_overdraft_counting_holds(self) -> None:
        for account in self.state.accounts.values():
            check_account(account)
            if not account.policy.allow_negative:
                assert account.posted - account.held >= -account.policy.overdraft_limit

    @invariant()
    def p3_seq_gapless_per_account(self) -> None:
        last: dict[str, int] = {}
        for entry in self.state.history:
            assert entry.seq == last.get(entry.account_id, 0) + 1
            last[entry.account_id] = entry.seq
        assert last == {a.id: a.seq for a in self.state.accounts.values()}

    @invariant()
    def p4_each_command_takes_effect_at_most_once(self) -> None:
        # At most one send per key changed anything, and exactly the accepted commands did.
        assert all(count <= 1 for count in self.effects.values()), self.effects
        accepted = {key for key, (_, result) in self.inbox.items() if result.accepted}
        assert {key for key, count in self.effects.items() if count} == accepted
        # The whole history holds each accepted transaction's legs once, and nothing of any other transaction.
        legs_by_tx: dict[str, int] = {}
        for entry in self.state.history:
            if entry.transaction_id is not None:
                legs_by_tx[entry.transaction_id] = legs_by_tx.get(entry.transaction_id, 0) + 1
        assert legs_by_tx == self.entries_by_tx
        assert set(self.state.inbox) == set(self.inbox)

    @invariant()
    def p5_holds_settle_exactly_once(self) -> None:
        held: dict[str, int] = {}
        for hold in self.state.holds.values():
            check_hold(hold)
            model = self.holds[hold.id]
            assert (hold.status.value, hold.captured, hold.released) == (
                model["status"], model["captured"], model["released"])
            if hold.status is HoldStatus.OPEN:
                held[hold.account_id] = held.get(hold.account_id, 0) + hold.remaining
            else:
                assert hold.captured + hold.released == hold.amount
        for account in self.state.accounts.values():
            assert account.held == held.get(account.id, 0)

    @invariant()
    def model_agrees(self) -> None:
        assert set(self.state.accounts) == set(self.accounts)
        for account_id, model in self.accounts.items():
            account = self.state.accounts[account_id]
            assert (account.posted, account.held, account.status.value) == (
                model["posted"], model["held"], model["status"])
            assert account.status is not AccountStatus.CLOSED or (account.posted, account.held) == (0, 0)

    @invariant()
    def p9_balances_round_trip_as_decimal(self) -> None:
        for account in self.state.accounts.values():
            currency = DEFAULT_CURRENCIES.get(account.currency)
            for minor in (account.posted, account.held):
                assert parse_amount(format_amount(minor, currency), currency) == minor


LedgerMachine.TestCase.settings = settings(max_examples=examples(300), stateful_step_count=40, deadline=None)
TestLedgerMachine = LedgerMachine.TestCase
