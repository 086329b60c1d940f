"""A small scenario language for the business-event rules, run through real partition processors.

    (Scenario().users("alice", "bob")
        .deposit("d1", "alice", "USDT", "40000")
        .order_placed("bid-1", "alice", "buy", "0.5", "60000")
        .assert_balances({"alice:USDT": ("40000", "30000")}))

Each step builds a business event, turns it into commands with ``connectors.rules.plan`` and sends every
command through the in-memory ``Bus`` of tests/helpers/bus.py (eight PartitionProcessors, no
Kafka), so rule output goes through the same engine as any transaction, multi-partition protocol included.
Each step expects an outcome (``"accepted"`` unless told a rejection reason) and, once the bus is quiet,
checks that every currency sums to zero, clearing is empty and no transaction is left in flight.
Amounts are decimal strings in major units; ``"alice:USDT"`` names ``user:alice:USDT``.
"""
from __future__ import annotations

import json
from collections import defaultdict

from connectors import rules
from connectors.rules import (
    Context,
    DepositChargedBack,
    DepositConfirmed,
    DepositFailed,
    DepositFronted,
    DepositInitiated,
    DepositReturned,
    DepositSettled,
    FxConverted,
    InternalTransfer,
    OrderClosed,
    OrderPlaced,
    Party,
    ReversalRequested,
    TradeExecuted,
    TransferReturned,
    WithdrawalCompleted,
    WithdrawalFailed,
    WithdrawalRequested,
)
from schemas.codec import codec
from streams import routing
from streams.core import DEFAULT_CURRENCIES, format_amount, parse_amount
from streams.wire import account_from_record
from tests.helpers.bus import Bus
from tests.helpers.records import N

C = codec()
BASE, QUOTE = "BTC", "USDT"


def account_name(short: str) -> str:
    return short if short.startswith(("sys:", "user:")) else f"user:{short}"


def minor(text: str | int, currency: str) -> int:
    if type(text) is int:
        return text
    value = parse_amount(text, DEFAULT_CURRENCIES.get(currency))
    assert type(value) is int, f"bad amount in the scenario: {text!r} {currency}"
    return value


def party(spec) -> Party:
    """"bot" -> the exchange's bot; ("alice", "bid-1") -> alice's order bid-1."""
    return Party(None) if spec == "bot" else Party(*spec)


class Scenario:
    def __init__(self, ctx: Context = rules.DEFAULT_CONTEXT, currencies=("USDT", "BTC")):
        self.bus = Bus()
        self.ctx = ctx
        self.currencies = currencies
        self.last: list[dict] = []  # the results of the last step, one per command
        self.last_plan: rules.Plan | None = None

    # --- plumbing -----------------------------------------------------------------------------------------
    def deliver(self, routed: list[rules.Routed]) -> list[dict]:
        start = len(self.bus.results)
        for r in routed:
            self.bus.send(C.encode("command", r.record), r.routing_account)
        self.bus.run()
        new = self.bus.results[start:]
        out = []
        for r in routed:
            mine = [x for x in new if x["command_id"] == r.command_id and x["client_id"] == r.record["client_id"]]
            assert len(mine) == 1, f"{r.command_id}: expected one result, got {mine}"
            out.append(mine[0])
        self.check_books()
        return out

    def send(self, event, expect: str = "accepted", duplicate: bool | None = None) -> "Scenario":
        """Plan the event, deliver its commands, check each result: 'accepted' or a rejection reason."""
        self.last_plan = rules.plan(event, self.ctx)
        self.last = self.deliver(list(self.last_plan))
        for result in self.last:
            # accepted, a rejection reason, or the notice of an acceptance ("late_settlement")
            got = result["reason"] or result["outcome"]
            assert got == expect, f"{result['command_id']}: expected {expect}, got {got} ({result['detail']})"
            if duplicate is not None:
                assert result["duplicate"] is duplicate, result
        return self

    def check_books(self) -> None:
        """Once quiet: each currency sums to zero (P1), clearing is empty (P6), nothing in flight."""
        totals: dict[str, int] = defaultdict(int)
        clearing: dict[str, int] = defaultdict(int)  # summed over its shards (one per partition)
        for proc in self.bus.procs.values():
            for _, value in proc.state.store.scan(b"a/"):
                a = account_from_record(json.loads(value))
                totals[a.currency] += a.posted
                if a.id.startswith("sys:clearing:"):
                    clearing[a.currency] += a.posted
                    assert a.held == 0, f"money held in {a.id}"
            assert not [k for k in proc.state.store.data if k.startswith(b"e/")], "a transaction is in flight"
        assert all(v == 0 for v in totals.values()), f"books do not balance: {dict(totals)}"
        assert all(v == 0 for v in clearing.values()), f"money left in clearing: {dict(clearing)}"

    # --- events -------------------------------------------------------------------------------------------
    def users(self, *names: str) -> "Scenario":
        for name in names:
            for result in self.deliver([rules.open_user_account(name, c, self.ctx) for c in self.currencies]):
                assert result["outcome"] == "accepted", result
        return self

    def deposit(self, deposit_id, user, currency, amount, **kw) -> "Scenario":
        expect = kw.pop("expect", "accepted")
        dup = kw.pop("duplicate", None)
        return self.send(DepositConfirmed(deposit_id, user, currency, amount, **kw), expect, dup)

    def withdrawal_requested(self, wid, user, currency, amount, fee="0", expect="accepted", **kw) -> "Scenario":
        return self.send(WithdrawalRequested(wid, user, currency, amount, fee, **kw), expect)

    def withdrawal_completed(self, wid, user, currency, amount, fee="0", expect="accepted", duplicate=None,
                             **kw) -> "Scenario":
        return self.send(WithdrawalCompleted(wid, user, currency, amount, fee, **kw), expect, duplicate)

    def withdrawal_failed(self, wid, user, currency, expect="accepted", duplicate=None, **kw) -> "Scenario":
        return self.send(WithdrawalFailed(wid, user, currency, **kw), expect, duplicate)

    def order_placed(self, order_id, user, side, qty, limit_price=None, expect="accepted", **kw) -> "Scenario":
        return self.send(OrderPlaced(order_id, user, side, BASE, QUOTE, qty, limit_price, **kw), expect)

    def trade(self, trade_id, qty, price, *, buyer, seller, maker="seller", fees=("0", "0"), expect="accepted",
              duplicate=None, **kw) -> "Scenario":
        """fees = (maker rate, taker rate); buyer / seller = (user, order id) or "bot"."""
        event = TradeExecuted(trade_id, BASE, QUOTE, qty, price, party(buyer), party(seller), maker,
                              fees[0], fees[1], **kw)
        return self.send(event, expect, duplicate)

    def order_closed(self, order_id, user, side, expect="accepted", **kw) -> "Scenario":
        return self.send(OrderClosed(order_id, user, side, BASE, QUOTE, **kw), expect)

    def fx(self, conversion_id, user, source, target, amount, rate, snapshot, expect="accepted",
           **kw) -> "Scenario":
        return self.send(FxConverted(conversion_id, user, source, target, amount, rate, snapshot, **kw), expect)

    def transfer(self, transfer_id, src, dst, currency, amount, expect="accepted", **kw) -> "Scenario":
        return self.send(InternalTransfer(transfer_id, src, dst, currency, amount, **kw), expect)

    def rate_snapshot(self, snapshot_id: str, base: str, quote: str, rate: str,
                      expires_at_ms: int = 2**62, expect: str = "accepted") -> "Scenario":
        """What a rates producer does: one RecordRate per partition (LedgerClient.record_rate)."""
        start = len(self.bus.results)
        for p in range(N):
            self.bus.send_to(p, C.encode("command", {
                "command_id": f"rate:{snapshot_id}@{p}", "client_id": "rates", "body": ("ledger.RecordRate", {
                    "snapshot_id": snapshot_id, "base": base, "quote": quote, "rate": rate,
                    "expires_at_ms": expires_at_ms})}))
        self.bus.run()
        got = [r["outcome"] if r["outcome"] == "accepted" else r["reason"] for r in self.bus.results[start:]]
        assert got == [expect] * N, got
        return self

    def reversal(self, reversal_id, transaction_id, user, currency, expect="accepted", duplicate=None,
                 **kw) -> "Scenario":
        return self.send(ReversalRequested(reversal_id, transaction_id, user, currency, **kw), expect, duplicate)

    def deposit_returned(self, return_id, transaction_id, user, currency, amount, expect="accepted", duplicate=None,
                         **kw) -> "Scenario":
        return self.send(DepositReturned(return_id, transaction_id, user, currency, amount, **kw), expect, duplicate)

    def transfer_returned(self, return_id, transaction_id, src, dst, currency, amount, expect="accepted",
                          duplicate=None, **kw) -> "Scenario":
        return self.send(TransferReturned(return_id, transaction_id, src, dst, currency, amount, **kw), expect,
                         duplicate)

    def deposit_initiated(self, deposit_id, user, currency, amount, fronted="0", expect="accepted", **kw):
        return self.send(DepositInitiated(deposit_id, user, currency, amount, fronted, **kw), expect)

    def deposit_fronted(self, deposit_id, user, currency, amount, expect="accepted", duplicate=None, **kw):
        return self.send(DepositFronted(deposit_id, user, currency, amount, **kw), expect, duplicate)

    def deposit_settled(self, deposit_id, user, currency, amount, fronted="0", expect="accepted", **kw):
        return self.send(DepositSettled(deposit_id, user, currency, amount, fronted, **kw), expect)

    def deposit_failed(self, deposit_id, user, currency, amount, fronted="0", expect="accepted", **kw):
        return self.send(DepositFailed(deposit_id, user, currency, amount, fronted, **kw), expect)

    def deposit_charged_back(self, deposit_id, user, currency, amount, fronted="0", expect="accepted",
                             duplicate=None, **kw) -> "Scenario":
        return self.send(DepositChargedBack(deposit_id, user, currency, amount, fronted, **kw), expect, duplicate)

    def at(self, ms: int) -> "Scenario":
        """Move log time on: the next records are written at ms (+1 each). Holds due by then expire when their
        partition reads its next record (a tick, or any command)."""
        assert ms >= self.bus.clock, "log time only moves on"
        self.bus.clock = ms - 1
        return self

    def tick(self, user: str, sealed: bool = True) -> "Scenario":
        """A worker's tick (streams/ticks.py) into the partition of the user's accounts, at the next log time;
        sealed=False writes the same bytes as anyone else could (it must change nothing)."""
        from streams import ticks
        from tests.helpers.bus import Record
        partition = routing.partition_of_account(account_name(f"{user}:{QUOTE}"), self.bus.n)
        value = ticks.value()
        self.bus.clock += 1
        headers = self.bus._seal(partition, value) if sealed else ()
        self.bus.logs[partition].append(Record(self.bus.clock, ticks.KEY, value, headers))
        self.bus.run()
        self.check_books()
        return self

    # --- assertions ---------------------------------------------------------------------------------------
    def balance(self, short: str) -> tuple[int, int]:
        """(posted, held) in minor units; system accounts summed over their shards."""
        return self.bus.account(account_name(short))

    def assert_balances(self, expected: dict[str, str | tuple[str, str]]) -> "Scenario":
        """{"alice:USDT": "28020"} (posted, nothing held) or {"alice:USDT": ("40000", "30000")} (posted, held)."""
        for short, want in expected.items():
            account = account_name(short)
            # user:<u>:<CUR>, or a receivable user:<u>:receivable.<CUR>
            currency = routing.system_currency(account) if routing.is_system(account) else \
                account.rsplit(":")[-1].rsplit(".")[-1]
            posted, held = want if isinstance(want, tuple) else (want, "0")
            got = self.balance(short)
            cur = DEFAULT_CURRENCIES.get(currency)
            assert got == (minor(posted, currency), minor(held, currency)), (
                f"{account}: posted/held {format_amount(got[0], cur)}/{format_amount(got[1], cur)}, "
                f"expected {posted}/{held}")
        return self

    def assert_hold(self, hold_id: str, short: str, status: str, remaining: str | None = None) -> "Scenario":
        hold = self.bus.hold(hold_id, account_name(short))
        assert hold is not None and hold.status.value == status, hold
        if remaining is not None:
            assert hold.remaining == minor(remaining, account_name(short).rsplit(":")[-1]), hold
        return self

    def history(self, transaction_id: str | None = None, kind: str | None = None, hold_id: str | None = None):
        return [h for h in self.bus.history
                if (transaction_id is None or h["transaction_id"] == transaction_id)
                and (kind is None or h["kind"] == kind) and (hold_id is None or h["hold_id"] == hold_id)]


def in_different_partitions(*users: str) -> bool:
    parts = {routing.partition_of_account(f"user:{u}:USDT", N) for u in users}
    return len(parts) == len(users)
