"""Differential: one transfer decided along every path gives one decision (broker-free).

For a generated state (a payer and a payee with policies, balances, holds open, released or expiring, and a
status open, frozen or closed; or not opened at all) and a transfer of a generated amount, the decision is
made along four paths, each on its own in-memory bus (tests/helpers/bus.py) built by the same commands at
the same log times:

- ``fast``: both accounts in one partition, a plain two-leg transfer (streams/core/decide.py takes its fast
  path whenever it can accept);
- ``general``: the same, with metadata, so decide.py skips the fast path and the general rules decide;
- ``spanning``: the payer and the payee in one partition, plus a debit of a healthy, funded account in
  another partition and its credit to a fee account: debits in two partitions, so the reserve / vote /
  decide protocol of streams/spanning.py runs (placed as LedgerClient places it), on a seeded random order;
- ``remote``: the plain two-leg transfer with the payee in another partition (two phases: the payer's partition
  coordinates, the payee's votes on the credit).

Every path must give the same outcome and reason, and, when accepted, the same balances of the payer and
the payee. The core itself is compared too: the fast path and the general rules on the same stored state.

Every path must give the same outcome and reason; on the two-phase paths every participant judges its own
legs and the coordinator answers with the most urgent failure, so a credit the payee's partition refuses
(closed, unknown, over its max_balance) is refused for the sender as in one partition, and nothing moves. A
spanning transaction balanced overall but not per currency is refused unbalanced before anything is
reserved (``test_a_spanning_transaction_unbalanced_per_currency_...``); payees in another currency are left
out of the spanning path of the property for that reason.
"""
from __future__ import annotations

import importlib
import os
import random
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from schemas.codec import codec
from streams import routing
from streams.core.commands import PostTransaction
from streams.core.model import Leg
from tests.core.budget import examples
from tests.helpers.bus import START_MS, Bus, assert_books_balance
from tests.helpers.records import N, command, place_hold, tx

C = codec()
core_decide = importlib.import_module("streams.core.decide")  # the package exports decide()
TX_AT = START_MS + 1_000  # the transfer's log time; the setup runs before it
EXPIRED_AT = START_MS + 500  # a hold that expires before the transfer (the engine expires it first)
LATER_AT = START_MS + 100_000  # a hold still open at the transfer


def _users(partition: int, count: int, skip: int = 0) -> list[int]:
    found = [i for i in range(10_000) if routing.partition_of_account(f"user:{i}:USD", N) == partition]
    return found[skip:skip + count]


P, Q = 0, 5  # two partitions
PAYER, PAYEE, HELPER = _users(P, 3)  # fast, general and spanning: all three users in P (the helper moves to Q)
HELPER_Q = _users(Q, 1)[0]
PAYEE_Q = _users(Q, 2)[1]  # the remote path's payee


def acct(user: int, currency: str = "USD") -> str:
    return f"user:{user}:{currency}"


@dataclass(frozen=True)
class Side:
    """One account of the transfer, as the setup builds it."""
    exists: bool
    currency: str
    allow_negative: bool
    overdraft: int
    max_balance: int | None
    deposit: int
    holds: tuple[tuple[int, str], ...]  # (amount, "open" | "released" | "expired" | "expiring_later")
    status: str  # "open" | "frozen" | "closed" (closed: emptied first)


def sides(payer: bool) -> st.SearchStrategy[Side]:
    return st.builds(
        Side,
        exists=st.sampled_from([True, True, True, True, False]),
        currency=st.just("USD") if payer else st.sampled_from(["USD", "USD", "USD", "EUR"]),
        allow_negative=st.sampled_from([False, False, True]),
        overdraft=st.sampled_from([0, 0, 50]),
        max_balance=st.sampled_from([None, None, 150, 400]),
        deposit=st.sampled_from([0, 40, 100, 200]),
        holds=st.lists(st.tuples(st.sampled_from([10, 60, 150]),
                                 st.sampled_from(["open", "released", "expired", "expiring_later"])),
                       max_size=2).map(tuple),
        status=st.sampled_from(["open", "open", "open", "frozen", "closed"]),
    )


def _open(account: str, side: Side) -> bytes:
    return command(f"open:{account}", "OpenAccount", {
        "account_id": account, "currency": side.currency, "allow_negative": side.allow_negative,
        "overdraft_limit": str(side.overdraft),
        "max_balance": None if side.max_balance is None else str(side.max_balance), "routing_key": None})


def _setup(bus: Bus, account: str, side: Side, tag: str, clock: list[int]) -> None:
    """The same commands at the same log times on every bus (only the account's placement differs)."""
    def send(value: bytes) -> None:
        clock[0] += 1
        bus.send(value, account, clock[0])
    if not side.exists:
        return
    send(_open(account, side))
    if side.deposit:
        send(tx(f"dep:{tag}", [(f"sys:world:{side.currency}", -side.deposit, None, None),
                               (account, side.deposit, None, None)]))
    for i, (amount, kind) in enumerate(side.holds):
        expires = {"expired": EXPIRED_AT, "expiring_later": LATER_AT}.get(kind)
        send(place_hold(f"h:{tag}:{i}", account, amount, expires))
        if kind == "released":
            send(command(f"rel:{tag}:{i}", "ReleaseHold", {"hold_id": f"h:{tag}:{i}"}))
    if side.status == "frozen":
        send(command(f"freeze:{tag}", "FreezeAccount", {"account_id": account}))
    elif side.status == "closed":
        for i, _ in enumerate(side.holds):  # release whatever is still held (a rejection is fine)
            send(command(f"rel2:{tag}:{i}", "ReleaseHold", {"hold_id": f"h:{tag}:{i}"}))
        if side.deposit:
            send(tx(f"wd:{tag}", [(account, -side.deposit, None, None),
                                  (f"sys:world:{side.currency}", side.deposit, None, None)]))
        send(command(f"close:{tag}", "CloseAccount", {"account_id": account}))


def _transfer(tx_id: str, legs: list[tuple[str, int]], metadata: dict | None = None) -> bytes:
    return command(tx_id, "PostTransaction", {
        "transaction_id": tx_id, "kind": "transfer", "reference": None, "links": [], "metadata": metadata or {},
        "occurred_at_ms": None, "rate_snapshot_id": None,
        "legs": [{"account_id": a, "amount": str(x), "hold_id": None, "currency": None} for a, x in legs]})


def _balance(bus: Bus, account: str):
    a = bus.procs[routing.partition_of_account(account, N)].state.account(account)
    return None if a is None else (a.posted, a.held, a.status.value)


@dataclass
class Outcome:
    outcome: str
    reason: str | None
    payer: tuple | None
    payee: tuple | None
    payer_before: tuple | None
    payee_before: tuple | None


def _run(path: str, payer: Side, payee: Side, amount: int, rng: random.Random) -> Outcome:
    bus = Bus()
    a = acct(PAYER)
    b = acct(PAYEE_Q if path == "remote" else PAYEE, payee.currency)
    clock = [START_MS]
    _setup(bus, a, payer, "a", clock)
    _setup(bus, b, payee, "b", clock)
    if path == "spanning":
        helper = acct(HELPER_Q)
        bus.send(_open(helper, Side(True, "USD", False, 0, None, 0, (), "open")), helper, clock[0] + 1)
        bus.send(tx("dep:c", [("sys:world:USD", -1_000, None, None), (helper, 1_000, None, None)]), helper,
                 clock[0] + 2)
    bus.run()
    before = _balance(bus, a), _balance(bus, b)
    legs = [(a, -amount), (b, amount)]
    if path == "fast" or path == "remote":
        bus.send(_transfer("T", legs), a, TX_AT)
    elif path == "general":
        bus.send(_transfer("T", legs, {"path": "general"}), a, TX_AT)
    else:
        spanning = [(a, -amount), (acct(HELPER_Q), -1), (b, amount), ("sys:fees:USD", 1)]
        assert len(bus.send_placed(_transfer("T", spanning), a, TX_AT)) == 2
    bus.run_random(rng, max_records=3)
    assert_books_balance(bus, ("USD", "EUR"))
    result = bus.result("T")
    if path == "spanning":
        assert _balance(bus, acct(HELPER_Q))[:2] == ((999 if result["outcome"] == "accepted" else 1_000), 0)
    return Outcome(result["outcome"], result["reason"], _balance(bus, a), _balance(bus, b), *before)


def _posted(*balances) -> tuple:
    """Posted amounts only: held may change before the transfer (holds expire at its log time)."""
    return tuple(None if b is None else b[0] for b in balances)


def _core_paths_agree(payer: Side, payee: Side, amount: int) -> None:
    """The fast path and the general rules of the core, on the very state the engine stored."""
    bus = Bus()
    a, b = acct(PAYER), acct(PAYEE, payee.currency)
    clock = [START_MS]
    _setup(bus, a, payer, "a", clock)
    _setup(bus, b, payee, "b", clock)
    bus.run()
    state = bus.procs[P].state
    command = PostTransaction(command_id="T", client_id="t", at_ms=TX_AT, transaction_id="T", kind="transfer",
                              legs=(Leg(a, -amount), Leg(b, amount)))
    fast = core_decide._judge_transaction(state, command, core_decide.DEFAULT_CURRENCIES)
    general = core_decide._judge_transaction_rules(state, command, core_decide.DEFAULT_CURRENCIES)
    assert fast == general


def healthy(currency: str) -> Side:
    """A payee that takes any credit: open, no limit."""
    return Side(True, currency, False, 0, None, 0, (), "open")


AMOUNTS = st.sampled_from([1, 30, 60, 100, 150, 199, 200, 250, 400])


@settings(max_examples=examples(int(os.environ.get("DIFFERENTIAL_EXAMPLES", "60"))), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(payer=sides(payer=True), payee=sides(payer=False), amount=AMOUNTS, seed=st.integers(0, 2**16))
@example(payer=Side(True, "USD", False, 0, None, 100, (), "open"),
         payee=Side(True, "USD", False, 0, None, 0, (), "open"), amount=100, seed=0)  # accepted everywhere
@example(payer=Side(True, "USD", False, 0, None, 100, ((60, "open"),), "frozen"),
         payee=Side(True, "USD", False, 0, 150, 100, (), "closed"), amount=100, seed=1)  # three reasons at once
@example(payer=Side(True, "USD", False, 0, None, 100, ((60, "expired"),), "open"),
         payee=Side(True, "USD", False, 0, None, 0, (), "open"), amount=100, seed=2)  # an expired hold frees funds
def test_every_path_gives_the_same_decision_and_reason(payer, payee, amount, seed):
    _core_paths_agree(payer, payee, amount)
    fast = _run("fast", payer, payee, amount, random.Random(seed))
    general = _run("general", payer, payee, amount, random.Random(seed))
    assert (general.outcome, general.reason) == (fast.outcome, fast.reason)
    assert (general.payer, general.payee) == (fast.payer, fast.payee)
    if fast.outcome == "accepted":
        assert fast.payer[0] == fast.payer_before[0] - amount and fast.payee[0] == fast.payee_before[0] + amount
    else:
        assert _posted(fast.payer, fast.payee) == _posted(fast.payer_before, fast.payee_before)

    # Across partitions every participant judges its own legs and the coordinator answers with the most
    # urgent failure: the same decision, for the same reason, as in one partition.
    if payee.currency == payer.currency:  # other currencies: test_a_spanning_transaction_unbalanced_per_currency...
        spanning = _run("spanning", payer, payee, amount, random.Random(seed))
        assert (spanning.outcome, spanning.reason) == (fast.outcome, fast.reason)
        if fast.outcome == "accepted":
            assert (spanning.payer, spanning.payee) == (fast.payer, fast.payee)
        else:
            assert _posted(spanning.payer, spanning.payee) == _posted(spanning.payer_before, spanning.payee_before)

    # The remote path: the payer's partition coordinates, the payee's votes on the credit.
    remote = _run("remote", payer, payee, amount, random.Random(seed))
    assert remote.payer_before == fast.payer_before
    assert (remote.outcome, remote.reason) == (fast.outcome, fast.reason)
    if fast.outcome == "accepted":
        assert remote.payer == fast.payer
        if fast.payee is not None:
            assert remote.payee[0] - remote.payee_before[0] == fast.payee[0] - fast.payee_before[0]
    else:  # nothing moved, nothing stays held
        assert _posted(remote.payer, remote.payee) == _posted(remote.payer_before, remote.payee_before)


@pytest.mark.parametrize("payee", [
    Side(True, "USD", False, 0, None, 0, (), "closed"),
    Side(False, "USD", False, 0, None, 0, (), "open"),
    Side(True, "USD", False, 0, 50, 0, (), "open"),
], ids=["closed", "unknown", "over_max_balance"])
def test_a_refused_remote_credit_is_answered_as_in_one_partition(payee):
    payer = Side(True, "USD", False, 0, None, 100, (), "open")
    fast = _run("fast", payer, payee, 100, random.Random(0))
    remote = _run("remote", payer, payee, 100, random.Random(0))
    assert fast.outcome == "rejected"
    assert (remote.outcome, remote.reason) == (fast.outcome, fast.reason)


@pytest.mark.parametrize("path", ["spanning", "remote"])
def test_reasons_across_partitions_follow_the_precedence_of_one_partition(path):
    payer = Side(True, "USD", False, 0, None, 100, (), "frozen")
    payee = Side(False, "USD", False, 0, None, 0, (), "open")
    fast = _run("fast", payer, payee, 30, random.Random(0))
    assert (fast.outcome, fast.reason) == ("rejected", "unknown_account")
    other = _run(path, payer, payee, 30, random.Random(0))
    assert (other.outcome, other.reason) == (fast.outcome, fast.reason)


def test_a_spanning_transaction_unbalanced_per_currency_is_rejected():
    """Debits in two partitions that sum to zero overall but not per currency (USD debits, a EUR credit) are
    refused unbalanced before anything is reserved, as in one partition (clearing was left at +1 USD and
    -1 EUR for good when the coordinator did not check)."""
    payer = Side(True, "USD", False, 0, None, 40, (), "open")
    payee = healthy("EUR")
    fast = _run("fast", payer, payee, 1, random.Random(0))
    assert (fast.outcome, fast.reason) == ("rejected", "unbalanced")
    spanning = _run("spanning", payer, payee, 1, random.Random(0))  # assert_books_balance fails inside
    assert (spanning.outcome, spanning.reason) == (fast.outcome, fast.reason)
