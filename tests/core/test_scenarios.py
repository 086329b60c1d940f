"""Table-driven scenarios: one line per command with its expected result and balances (see ledger_dsl)."""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.core import (
    AccountType,
    FreezeAccount,
    HoldStatus,
    Leg,
    OpenAccount,
    PostTransaction,
    Rejection,
    TransactionPosted,
    execute,
    reversal_of,
)
from streams.core.fx import judge_conversion
from streams.core.model import RateSnapshot

from .ledger_dsl import Ledger, run

EXCHANGE = """
open world:USDT USDT neg           | ok
open world:BTC BTC neg             | ok
open fees:USDT USDT neg            | ok
open fees:BTC BTC neg              | ok
open buyer:USDT USDT               | ok
open buyer:BTC BTC                 | ok
open seller:USDT USDT              | ok
open seller:BTC BTC                | ok
transfer dep1 world:USDT->buyer:USDT 40000 kind=deposit | ok | buyer:USDT=40000/0
transfer dep2 world:BTC->seller:BTC 0.2 kind=deposit    | ok | seller:BTC=0.2/0
"""


def test_worked_example_design_section_8() -> None:
    ledger = run(EXCHANGE + """
# limit buy 0.5 BTC at 60,000 USDT: hold 30,000 USDT; the resting ask holds its 0.2 BTC
hold buy1 buyer:USDT 30000          | ok | buyer:USDT=40000/30000
hold ask1 seller:BTC 0.2            | ok | seller:BTC=0.2/0.2
# fill 0.2 BTC at 59,900 = 11,980 USDT; maker fee 0.1% = 11.98 USDT; taker fee 0.2% = 0.0004 BTC
tx fill1 buyer:USDT@buy1=-11980 seller:USDT=11968.02 fees:USDT=11.98 seller:BTC@ask1=-0.2 buyer:BTC=0.1996 fees:BTC=0.0004 kind=trade ref=buy1 | ok | buyer:USDT=28020/18020 seller:USDT=11968.02/0 fees:USDT=11.98 buyer:BTC=0.1996/0 seller:BTC=0/0 fees:BTC=0.0004
# the user cancels the rest: 18,020 USDT come back
release buy1                        | ok | buyer:USDT=28020/0
""")
    buyer = ledger.state.accounts["buyer:USDT"]
    assert buyer.available == 28_020_000000 and buyer.held == 0
    hold = ledger.state.holds["buy1"]
    assert (hold.status, hold.captured, hold.released) == (HoldStatus.RELEASED, 11_980_000000, 18_020_000000)
    assert hold.capture_transaction_ids == ("fill1",)
    assert ledger.state.holds["ask1"].status is HoldStatus.CAPTURED
    assert ledger.results[-1].events[0].amount == 18_020_000000  # HoldReleased returns 18,020 USDT


def test_market_maker_counterparty_is_still_double_entry() -> None:
    run(EXCHANGE + """
open liquidity:USDT USDT neg       | ok
open liquidity:BTC BTC neg         | ok
hold buy1 buyer:USDT 30000         | ok
tx fill1 buyer:USDT@buy1=-11980 liquidity:USDT=11980 liquidity:BTC=-0.2 buyer:BTC=0.2 kind=trade | ok | buyer:USDT=28020/18020 buyer:BTC=0.2 liquidity:USDT=11980
""")


def test_two_withdrawals_exactly_one_succeeds() -> None:
    run(EXCHANGE + """
transfer w1 buyer:USDT->world:USDT 30000 kind=withdrawal | ok                 | buyer:USDT=10000/0
transfer w2 buyer:USDT->world:USDT 30000 kind=withdrawal | insufficient_funds | buyer:USDT=10000/0
""")


def test_duplicate_delivery_has_one_effect() -> None:
    ledger = run(EXCHANGE + """
transfer t1 buyer:USDT->seller:USDT 100 id=cmd-1           | ok       | buyer:USDT=39900 seller:USDT=100
transfer t1 buyer:USDT->seller:USDT 100 id=cmd-1 at=999999 | ok dup   | buyer:USDT=39900 seller:USDT=100
transfer t2 buyer:USDT->seller:USDT 99999 id=cmd-2         | insufficient_funds
transfer t2 buyer:USDT->seller:USDT 99999 id=cmd-2         | insufficient_funds dup
# the same command id from another client is another command
transfer t3 buyer:USDT->seller:USDT 100 id=cmd-1 client=other | ok   | buyer:USDT=39800 seller:USDT=200
""")
    first, again = ledger.results[10], ledger.results[11]
    assert again.events == first.events and again.duplicate and not first.duplicate


def test_duplicate_and_conflict_produce_no_changes() -> None:
    ledger = run(EXCHANGE)
    command = ledger._command(50, "transfer t1 buyer:USDT->seller:USDT 5 id=x")
    result, changes = execute(ledger.state, command)
    ledger.state.commit(changes)
    again, nothing = execute(ledger.state, command)
    assert again.duplicate and again.events == result.events and nothing.is_empty
    other = ledger._command(51, "transfer t1 buyer:USDT->seller:USDT 6 id=x")
    conflict, nothing = execute(ledger.state, other)
    assert conflict.reason is Rejection.ID_CONFLICT and nothing.is_empty
    assert conflict.events == () and (conflict.command_id, conflict.client_id) == ("x", "test")


def test_id_conflict_changes_nothing() -> None:
    run(EXCHANGE + """
transfer t1 buyer:USDT->seller:USDT 100 id=k  | ok          | buyer:USDT=39900 seller:USDT=100
transfer t1 buyer:USDT->seller:USDT 101 id=k  | id_conflict | buyer:USDT=39900 seller:USDT=100
hold h1 buyer:USDT 1 id=k                     | id_conflict | buyer:USDT=39900/0
# the original is still answered as before
transfer t1 buyer:USDT->seller:USDT 100 id=k  | ok dup      | buyer:USDT=39900
""")


def test_double_release() -> None:
    run(EXCHANGE + """
hold h1 buyer:USDT 500     | ok            | buyer:USDT=40000/500
release h1                 | ok            | buyer:USDT=40000/0
release h1                 | hold_not_open | buyer:USDT=40000/0
capture c1 h1 buyer:USDT->seller:USDT 1 | hold_not_open
release nope               | unknown_hold
""")


def test_capture_above_the_hold() -> None:
    ledger = run(EXCHANGE + """
hold h1 buyer:USDT 300                          | ok                   | buyer:USDT=40000/300
capture c1 h1 buyer:USDT->seller:USDT 301       | capture_exceeds_hold | buyer:USDT=40000/300
capture c2 h1 buyer:USDT->seller:USDT 100       | ok                   | buyer:USDT=39900/200 seller:USDT=100
capture c3 h1 buyer:USDT->seller:USDT 201       | capture_exceeds_hold | buyer:USDT=39900/200
# two legs on one hold in one transaction are added up
tx c4 buyer:USDT@h1=-150 buyer:USDT@h1=-51 seller:USDT=201 | capture_exceeds_hold
tx c5 buyer:USDT@h1=-150 buyer:USDT@h1=-50 seller:USDT=200 | ok | buyer:USDT=39700/0 seller:USDT=300
capture c6 h1 buyer:USDT->seller:USDT 1         | hold_not_open
""")
    hold = ledger.state.holds["h1"]
    assert hold.status is HoldStatus.CAPTURED and hold.capture_transaction_ids == ("c2", "c5")


def test_limit_bid_filled_below_limit_price_returns_the_difference() -> None:
    run(EXCHANGE + """
transfer dep3 world:BTC->seller:BTC 0.8 kind=deposit | ok | seller:BTC=1
# buy 1 BTC with limit 31,000: hold 31,000 USDT; it fills in two parts at 30,000 and 30,500
hold bid1 buyer:USDT 31000 | ok | buyer:USDT=40000/31000
tx f1 buyer:USDT@bid1=-15000 seller:USDT=15000 seller:BTC=-0.5 buyer:BTC=0.5 kind=trade | ok | buyer:USDT=25000/16000
tx f2 buyer:USDT@bid1=-15250 seller:USDT=15250 seller:BTC=-0.5 buyer:BTC=0.5 kind=trade | ok | buyer:USDT=9750/750
# the order is complete: closing it releases the 750 USDT price improvement
release bid1 | ok | buyer:USDT=9750/0 buyer:BTC=1 seller:USDT=30250
""")


def test_frozen_and_closed_accounts() -> None:
    run(EXCHANGE + """
freeze buyer:USDT                                   | ok
freeze buyer:USDT                                   | account_frozen
transfer t1 buyer:USDT->seller:USDT 1               | account_frozen     | buyer:USDT=40000
hold h1 buyer:USDT 1                                | account_frozen
transfer t2 world:USDT->buyer:USDT 5 kind=deposit   | ok                 | buyer:USDT=40005
unfreeze buyer:USDT                                 | ok
unfreeze buyer:USDT                                 | account_not_frozen
hold h2 buyer:USDT 5                                | ok                 | buyer:USDT=40005/5
close buyer:USDT                                    | account_not_empty
release h2                                          | ok
close buyer:USDT                                    | account_not_empty
transfer t3 buyer:USDT->world:USDT 40005            | ok                 | buyer:USDT=0/0
close buyer:USDT                                    | ok
transfer t4 world:USDT->buyer:USDT 1                | account_closed
# a closed account is empty, and insufficient_funds outranks account_closed (DESIGN.md §3 order)
hold h3 buyer:USDT 1                                | insufficient_funds
transfer t5 buyer:USDT->world:USDT 1                | insufficient_funds
freeze buyer:USDT                                   | account_closed
unfreeze buyer:USDT                                 | account_closed
close buyer:USDT                                    | account_closed
open buyer:USDT USDT                                | account_exists
# a frozen account with no money can be closed
freeze seller:USDT                                  | ok
close seller:USDT                                   | ok
""")


def test_eighteen_decimal_asset_beyond_int64() -> None:
    ledger = run("""
open world:ETH ETH neg  | ok
open whale:ETH ETH      | ok
open other:ETH ETH      | ok
transfer e1 world:ETH->whale:ETH 123456789.123456789123456789 | ok | whale:ETH=123456789.123456789123456789
transfer e2 whale:ETH->other:ETH 0.000000000000000001         | ok | other:ETH=0.000000000000000001
""")
    too_big = ledger._command(99, "tx e3 world:ETH=-1 whale:ETH=1")
    too_big = dataclasses.replace(too_big, legs=(Leg("world:ETH", -(2**127)), Leg("whale:ETH", 2**127)))
    assert execute(ledger.state, too_big)[0].reason is Rejection.AMOUNT_OUT_OF_RANGE
    # a balance may not leave the 128-bit range either
    near = dataclasses.replace(too_big, legs=(Leg("world:ETH", -(2**127 - 1)), Leg("whale:ETH", 2**127 - 1)))
    assert execute(ledger.state, near)[0].reason is Rejection.AMOUNT_OUT_OF_RANGE
    whale = ledger.state.accounts["whale:ETH"]
    assert whale.posted > 2**63 and whale.posted == 123456789_123456789123456789 - 1
    assert ledger.state.accounts["world:ETH"].posted < -(2**63)


def test_a_leg_beyond_128_bits_is_refused_even_where_every_balance_would_stay_in_range() -> None:
    """The leg itself is out of range (P9), whatever the balances: a +2**127 leg onto an account 10 below zero
    and a -2**127 leg off one 10 above would leave both balances inside the range."""
    ledger = run("""
open a:ETH ETH neg | ok
open b:ETH ETH neg | ok
transfer e1 a:ETH->b:ETH 0.00000000000000001 | ok
""")
    leg = 2**127
    beyond = dataclasses.replace(ledger._command(99, "tx e2 b:ETH=-1 a:ETH=1"),
                                 legs=(Leg("b:ETH", -leg), Leg("a:ETH", leg)))
    assert execute(ledger.state, beyond)[0].reason is Rejection.AMOUNT_OUT_OF_RANGE
    # The largest amount itself is in range: a leg of exactly 2**127-1 is accepted (three legs: the general
    # rules, not the two-leg fast path).
    largest = dataclasses.replace(beyond, legs=(Leg("a:ETH", leg - 1), Leg("b:ETH", -(leg - 2)), Leg("b:ETH", -1)))
    assert execute(ledger.state, largest)[0].accepted
    # and so is a debit leg of exactly -(2**127-1)
    largest_debit = dataclasses.replace(beyond, legs=(Leg("b:ETH", -(leg - 1)), Leg("a:ETH", leg - 2),
                                                      Leg("a:ETH", 1)))
    assert execute(ledger.state, largest_debit)[0].accepted


def test_a_hold_may_use_the_overdraft_limit_and_no_more() -> None:
    run("""
open world:USD USD neg                  | ok
open od:USD USD overdraft=100.00        | ok
transfer d1 world:USD->od:USD 20.00     | ok | od:USD=20.00
hold h1 od:USD 70.00                    | ok | od:USD=20.00/70.00
hold h2 od:USD 50.00                    | ok | od:USD=20.00/120.00
hold h3 od:USD 0.01                     | insufficient_funds | od:USD=20.00/120.00
""")


def test_an_account_keeps_its_type_through_a_freeze() -> None:
    ledger = Ledger()
    ledger.state.commit(execute(ledger.state, OpenAccount(command_id="o", client_id="c", at_ms=1,
                                                          account_id="ops:costs:USD", currency="USD",
                                                          account_type=AccountType.EXPENSE))[1])
    ledger.state.commit(execute(ledger.state, FreezeAccount(command_id="f", client_id="c", at_ms=2,
                                                            account_id="ops:costs:USD"))[1])
    account = ledger.state.accounts["ops:costs:USD"]
    assert (account.status.value, account.account_type) == ("frozen", AccountType.EXPENSE)


def test_back_dated_entry_keeps_its_business_time() -> None:
    ledger = run("""
open world:USD USD neg | ok
open shop:USD USD      | ok
transfer t1 world:USD->shop:USD 100.00 at=10000                          | ok | shop:USD=100.00
transfer t2 world:USD->shop:USD 50.00 at=20000 occurred=5000 kind=adjustment | ok | shop:USD=150.00
transfer t3 shop:USD->world:USD 30.00 at=30000                           | ok | shop:USD=120.00
""")
    # by seq: 1 = opened, 2 = t1, 3 = t2 (back-dated to 5000), 4 = t3; the read side's balance as of a time
    # counts t2 from its business time (projections/fold.as_of_ms, tests/read/test_as_of.py)
    assert [(e.seq, e.amount, e.occurred_at_ms) for e in ledger.state.history_of("shop:USD")] == [
        (1, 0, None), (2, 10_000, None), (3, 5_000, 5_000), (4, -3_000, None)]
    shop = ledger.state.accounts["shop:USD"]
    assert (shop.posted, shop.held, shop.available, shop.seq, shop.last_transaction_id, shop.updated_at_ms) == (
        12_000, 0, 12_000, 4, "t3", 30_000)


def test_hold_expiry_is_judged_by_log_time() -> None:
    run(EXCHANGE + """
hold h1 buyer:USDT 100 at=10000 expires=20000          | ok                | buyer:USDT=40000/100
expire h1 at=19999                                     | hold_not_expired  | buyer:USDT=40000/100
capture c1 h1 buyer:USDT->seller:USDT 10 at=19999      | ok                | buyer:USDT=39990/90
capture c2 h1 buyer:USDT->seller:USDT 10 at=20000      | hold_expired      | buyer:USDT=39990/90
expire h1 at=20000                                     | ok                | buyer:USDT=39990/0
expire h1 at=20001                                     | hold_not_open
release h1                                             | hold_not_open
hold h2 buyer:USDT 1                                   | ok
expire h2 at=999999999                                 | hold_not_expired
hold h3 buyer:USDT 1 at=5000 expires=5000              | invalid_command
hold h2 buyer:USDT 1                                   | hold_exists
""")


def test_overdraft_and_balance_limits() -> None:
    run("""
open world:USD USD neg                     | ok
open a:USD USD overdraft=10.00             | ok
open b:USD USD max=100.00                  | ok
transfer t1 a:USD->world:USD 10.00         | ok                     | a:USD=-10.00
transfer t2 a:USD->world:USD 0.01          | insufficient_funds     | a:USD=-10.00
hold h1 a:USD 0.01                         | insufficient_funds
transfer t3 world:USD->b:USD 100.00        | ok                     | b:USD=100.00
transfer t4 world:USD->b:USD 0.01          | balance_limit_exceeded | b:USD=100.00
transfer t5 b:USD->world:USD 0.01          | ok                     | b:USD=99.99
""")


def test_transaction_shape_and_precedence() -> None:
    run(EXCHANGE + """
tx t1 buyer:USDT=-1                                    | invalid_command
tx t2 buyer:USDT=0 seller:USDT=0                       | invalid_amount
tx t3 buyer:USDT=-1 nobody:USDT=1                      | unknown_account
tx t4 buyer:USDT=-1:BTC seller:USDT=1                  | currency_mismatch
tx t5 buyer:USDT=-1 seller:USDT=2                      | unbalanced
tx t6 buyer:USDT=-1 seller:BTC=1                       | unbalanced
tx t7 buyer:USDT@nohold=-1 seller:USDT=1               | unknown_hold
tx t8 seller:USDT@x=1 buyer:USDT=-1                    | invalid_command
# unknown_account outranks unbalanced, unbalanced outranks insufficient_funds
tx t9 buyer:USDT=-99999999 nobody:USDT=1               | unknown_account
tx t10 buyer:USDT=-99999999 seller:USDT=1              | unbalanced
# insufficient_funds outranks account_closed (DESIGN.md §3 order)
freeze seller:USDT                                     | ok
tx t11 buyer:USDT=-99999 seller:USDT=99999             | insufficient_funds
transfer t12 seller:USDT->buyer:USDT 0.000001          | insufficient_funds
tx t13 buyer:USDT=-1 world:USDT=1 meta=a:1 meta=a:2    | invalid_command
tx t14 buyer:USDT=-1 world:USDT=1 meta=a:1 meta=b:2 link=t0 ref=x | ok | buyer:USDT=39999
tx t15 buyer:USDT=-1 world:USDT=1 rate=r1                         | unknown_rate
open x:FOO FOO                                         | unknown_currency
""")


def test_several_legs_of_one_account_combine() -> None:
    run(EXCHANGE + """
# -40,000 and +10,000 on the same account net to -30,000: allowed
tx t1 buyer:USDT=-40000 buyer:USDT=10000 seller:USDT=30000      | ok | buyer:USDT=10000 seller:USDT=30000
tx t2 buyer:USDT=-30000 buyer:USDT=10000.000001 seller:USDT=19999.999999 | insufficient_funds
""")


def test_fx_in_one_transaction_with_rate_snapshot() -> None:
    ledger = run("""
open world:USD USD neg   | ok
open sys:fx:USD USD neg      | ok
open sys:fx:EUR EUR neg      | ok
open u:USD USD           | ok
open u:EUR EUR           | ok
transfer d1 world:USD->u:USD 100.00 kind=deposit                          | ok
rate snap-7 USD EUR 0.925 expires=100000                                   | ok
tx fx1 u:USD=-100.00 sys:fx:USD=100.00 sys:fx:EUR=-92.50 u:EUR=92.50 kind=fx rate=snap-7 | ok | u:USD=0 u:EUR=92.50
tx fx2 u:EUR=-1.00 sys:fx:USD=1.00 kind=fx                                      | unbalanced
""")
    posted = ledger.results[7].events[0]
    assert isinstance(posted, TransactionPosted) and posted.rate_snapshot_id == "snap-7"
    # every account's history entry of the conversion names the rate it used (the audit trail of each leg)
    entries = [h for h in ledger.state.history if h.transaction_id == "fx1"]
    assert len(entries) == 4 and {h.rate_snapshot_id for h in entries} == {"snap-7"}


def test_reversal_mirrors_and_links() -> None:
    ledger = run(EXCHANGE + """
transfer t1 buyer:USDT->seller:USDT 100 ref=order-9 | ok | buyer:USDT=39900 seller:USDT=100
""")
    original = ledger.results[-1].events[0]
    reversal = reversal_of(original, transaction_id="r1", command_id="r1", client_id="test", at_ms=10**6)
    assert reversal.kind == "reversal" and reversal.links == ("t1",) and reversal.reference == "order-9"
    assert [(leg.account_id, leg.amount) for leg in reversal.legs] == [
        ("buyer:USDT", 100_000000), ("seller:USDT", -100_000000)]
    result, changes = execute(ledger.state, reversal)
    ledger.state.commit(changes)
    assert result.accepted and ledger.state.accounts["buyer:USDT"].posted == 40_000_000000


def test_seq_counts_every_change_and_history_has_no_gaps() -> None:
    ledger = run(EXCHANGE + """
hold h1 buyer:USDT 10                         | ok
capture c1 h1 buyer:USDT->seller:USDT 4       | ok
release h1                                    | ok
freeze buyer:USDT                             | ok
""")
    entries = ledger.state.history_of("buyer:USDT")
    assert [e.seq for e in entries] == list(range(1, 7))
    assert [e.kind for e in entries] == [
        "account_opened", "deposit", "hold_placed", "transfer", "hold_released", "account_frozen"]
    assert [(e.posted_after, e.held_after) for e in entries[2:5]] == [
        (40_000_000000, 10_000000), (39_996_000000, 6_000000), (39_996_000000, 0)]
    assert ledger.state.accounts["buyer:USDT"].seq == 6


@pytest.mark.parametrize("reason", list(Rejection))
def test_every_rejection_has_a_snake_code(reason: Rejection) -> None:
    assert reason.code == reason.name.lower() and Rejection.from_code(reason.code) is reason


def test_precedence_follows_design_partial_order() -> None:
    order = ["unknown_account", "currency_mismatch", "unbalanced", "insufficient_funds", "account_closed",
             "hold_not_open", "capture_exceeds_hold", "id_conflict"]
    values = [Rejection.from_code(code) for code in order]
    assert values == sorted(values)


def test_a_transaction_failing_in_several_stages_is_answered_by_its_earliest_stage() -> None:
    """transaction_urgency is the order in which the rules judge a transaction's stages (the shell picks one
    answer among several partitions' with it): shape and accounts, then the rate snapshot, then the balance per
    currency, then the amounts against the rate, then funds, status and limits."""
    from streams.core import transaction_urgency

    stages = [Rejection.CURRENCY_MISMATCH, Rejection.UNKNOWN_RATE, Rejection.UNBALANCED, Rejection.AMOUNT_OFF_RATE,
              Rejection.INSUFFICIENT_FUNDS]
    assert sorted(reversed(stages), key=transaction_urgency) == stages
    # the rules answer the same: unbalanced and naming an unknown snapshot is unknown_rate
    run(FX + """
tx x1 u:USD=-10.00 sys:fx:USD=10.00 sys:fx:EUR=-9.00 u:EUR=9.25 kind=fx rate=nope | unknown_rate | u:USD=100.00
""")


def test_replaying_events_rebuilds_identical_state() -> None:
    """P7: apply() over the accepted events, in order, rebuilds the same records and history."""
    from streams.core import MemoryState, apply

    ledger = run(EXCHANGE + """
hold buy1 buyer:USDT 30000 expires=999999 | ok
tx fill1 buyer:USDT@buy1=-11980 seller:USDT=11980 seller:BTC=-0.2 buyer:BTC=0.2 kind=trade | ok
freeze seller:USDT | ok
release buy1 | ok
""")
    rebuilt = MemoryState()
    for result in ledger.results:
        if result.accepted and not result.duplicate:
            rebuilt.commit(apply(rebuilt, result.events))
    assert rebuilt.accounts == ledger.state.accounts
    assert rebuilt.holds == ledger.state.holds
    assert rebuilt.history == ledger.state.history


def test_fingerprint_ignores_log_time_and_keys_are_scoped_by_client() -> None:
    from streams.core import OpenAccount, PlaceHold, accounts_touched, routing_key_for

    hold = PlaceHold(command_id="c1", client_id="a", at_ms=1, hold_id="h", account_id="user:7:USD", amount=5)
    later = dataclasses.replace(hold, at_ms=2)
    assert hold.fingerprint() == later.fingerprint() and len(hold.fingerprint()) == 64
    assert hold.fingerprint() != dataclasses.replace(hold, amount=6).fingerprint()
    assert hold.fingerprint() != dataclasses.replace(hold, client_id="b").fingerprint()
    assert hold.key == ("a", "c1")
    assert accounts_touched(hold) == ("user:7:USD",)
    opened = OpenAccount(command_id="c2", client_id="a", at_ms=1, account_id="x", currency="USD")
    assert accounts_touched(opened) == ("x",)
    assert routing_key_for("user:42:USDT") == "user:42"
    assert routing_key_for("world") == "world"
    assert routing_key_for(":odd") == ":odd"


def test_empty_ids_are_invalid_and_not_remembered() -> None:
    from streams.core import MemoryState, ReleaseHold

    state = MemoryState()
    result, changes = execute(state, ReleaseHold(command_id="", client_id="a", at_ms=1, hold_id="h"))
    assert result.reason is Rejection.INVALID_COMMAND and changes.is_empty
    # still answered to the client that sent it, under the id it gave, with no events
    assert (result.command_id, result.client_id, result.events) == ("", "a", ())
    assert result.detail == "command_id and client_id must not be empty"
    assert result.outcome == "rejected" and not result.accepted
    result, changes = execute(state, ReleaseHold(command_id="c", client_id="a", at_ms=1, hold_id="h"))
    assert result.reason is Rejection.UNKNOWN_HOLD and changes.processed is not None
    assert not changes.accounts and not changes.holds and not changes.history


def test_with_legs_is_replace_of_the_legs_and_nothing_else() -> None:
    """The engine's fast copy must carry every field, including any added later."""
    tx = PostTransaction(command_id="c", client_id="k", at_ms=5, transaction_id="t",
                         legs=(Leg("a:USD", -1), Leg("b:USD", 1)), kind="trade", reference="r", links=("x",),
                         metadata=(("m", "v"),), occurred_at_ms=3, rate_snapshot_id="s")
    legs = (Leg("a:USD", -1), Leg("sys:clearing:USD@2", 1))
    assert tx.with_legs(legs) == dataclasses.replace(tx, legs=legs)
    assert {f.name for f in dataclasses.fields(PostTransaction)} == {
        "command_id", "client_id", "at_ms", "transaction_id", "legs", "kind", "reference", "links", "metadata",
        "occurred_at_ms", "rate_snapshot_id"}, "a new field: add it to PostTransaction.with_legs"


# Money an open hold reserves cannot be spent by a plain transfer (P2, P5). One script per decision path: the fast
# path takes plain two-leg transfers; metadata, a third leg or a leg currency send a transaction through the
# general rules. Each script also pins the floor: spending exactly the available amount is accepted.
HELD = """
open world:USD USD neg               | ok
open a:USD USD                       | ok
open b:USD USD                       | ok
open c:USD USD                       | ok
transfer d1 world:USD->a:USD 100     | ok | a:USD=100/0
hold h1 a:USD 60                     | ok | a:USD=100/60
"""


@pytest.mark.parametrize("spend", [
    pytest.param("transfer t1 a:USD->b:USD {}", id="fast-path"),
    pytest.param("transfer t1 a:USD->b:USD {} meta=desk:7", id="general-metadata"),
    pytest.param("tx t1 a:USD=-{} b:USD=10 c:USD={}", id="general-three-legs"),
    pytest.param("tx t1 a:USD=-{}:USD b:USD={}", id="general-leg-currency"),
])
def test_a_transfer_cannot_spend_money_an_open_hold_reserves(spend: str) -> None:
    def line(amount: int) -> str:
        credit = amount - 10 if "c:USD" in spend else amount
        return spend.format(amount, credit)
    run(HELD + f"""
{line(50)}                           | insufficient_funds | a:USD=100/60
{line(41)}                           | insufficient_funds | a:USD=100/60
{line(40)} id=c-exact                | ok                 | a:USD=60/60
release h1                           | ok                 | a:USD=60/0
{line(50).replace("t1", "t2")}       | ok                 | a:USD=10/0
""")


@pytest.mark.parametrize("spend", [
    pytest.param("transfer t1 o:USD->b:USD {}", id="fast-path"),
    pytest.param("tx t1 o:USD=-{} b:USD=10 c:USD={}", id="general-three-legs"),
])
def test_the_overdraft_limit_counts_held_money(spend: str) -> None:
    """available = posted - held >= -overdraft_limit: with 100 posted, 60 held and a 10 overdraft, 50 can go."""
    def line(amount: int) -> str:
        return spend.format(amount, amount - 10)
    run(HELD + f"""
open o:USD USD overdraft=10          | ok
transfer d2 world:USD->o:USD 100     | ok | o:USD=100/0
hold h2 o:USD 60                     | ok | o:USD=100/60
{line(51)}                           | insufficient_funds | o:USD=100/60
{line(50)}                           | ok                 | o:USD=50/60
hold h3 o:USD 1                      | insufficient_funds | o:USD=50/60
""")


# --- reversals ------------------------------------------------------------------------------------------------

REVERSALS = EXCHANGE + """
transfer t1 buyer:USDT->seller:USDT 100 id=pay-1 kind=payment | ok | buyer:USDT=39900 seller:USDT=100
"""


def test_a_reversal_mirrors_the_legs_once_and_links_to_the_original() -> None:
    ledger = run(REVERSALS + """
reverse r1 t1 buyer:USDT id=rev-1          | ok               | buyer:USDT=40000 seller:USDT=0
reverse r2 t1 buyer:USDT                   | already_reversed | buyer:USDT=40000 seller:USDT=0
# the same reversal command delivered again is a duplicate, not a second reversal
reverse r1 t1 buyer:USDT id=rev-1          | ok dup           | buyer:USDT=40000 seller:USDT=0
""")
    posted, reversed_ = ledger.results[11].events
    assert [(leg.account_id, leg.amount) for leg in posted.legs] == [("buyer:USDT", 100_000000),
                                                                     ("seller:USDT", -100_000000)]
    assert (posted.kind, posted.links, posted.transaction_id) == ("reversal", ("t1",), "r1")
    assert (reversed_.transaction_id, reversed_.reversed_by) == ("t1", "r1")
    assert ledger.state.transactions["t1"].reversed_by == "r1"
    assert ledger.state.transactions["r1"].reversed_by is None and ledger.state.transactions["r1"].kind == "reversal"
    assert [e.kind for e in ledger.state.history_of("seller:USDT")][-1] == "reversal"


def test_a_reversal_carries_the_reference_and_business_time_its_command_gives() -> None:
    """A correction says why and when (ref, occurred); without a ref it keeps its original's."""
    ledger = run(REVERSALS + """
transfer t2 buyer:USDT->seller:USDT 1 kind=payment ref=order-2 | ok
reverse r1 t1 buyer:USDT ref=refund-7 occurred=1234 | ok
reverse r2 t2 buyer:USDT                            | ok
""")
    first, second = (ledger.results[i].events[0] for i in (-2, -1))
    assert (first.reference, first.occurred_at_ms) == ("refund-7", 1234)
    assert (second.reference, second.occurred_at_ms) == ("order-2", None)
    entry = [h for h in ledger.state.history if h.transaction_id == "r1"][0]
    assert (entry.reference, entry.occurred_at_ms) == ("refund-7", 1234)


def test_a_reversal_is_refused_for_an_unknown_transaction_another_client_or_itself() -> None:
    run(REVERSALS + """
reverse r1 nope buyer:USDT                 | unknown_transaction
reverse r2 t1 buyer:USDT client=intruder   | client_mismatch  | buyer:USDT=39900 seller:USDT=100
reverse t1 t1 buyer:USDT                   | invalid_command
reverse dep1 t1 buyer:USDT                 | invalid_command
""")


def test_reversing_a_spent_deposit_is_insufficient_funds_and_leaves_it_reversible() -> None:
    run(REVERSALS + """
transfer t2 seller:USDT->buyer:USDT 60 | ok | seller:USDT=40
reverse r1 t1 buyer:USDT               | insufficient_funds | seller:USDT=40 buyer:USDT=39960
transfer t3 buyer:USDT->seller:USDT 60 | ok | seller:USDT=100
reverse r2 t1 buyer:USDT               | ok | seller:USDT=0 buyer:USDT=40000
""")


def test_a_reversal_of_a_capture_returns_the_money_to_available_not_to_the_ended_hold() -> None:
    run(EXCHANGE + """
hold h1 buyer:USDT 300                                 | ok | buyer:USDT=40000/300
capture fill1 h1 buyer:USDT->seller:USDT 300           | ok | buyer:USDT=39700/0 seller:USDT=300
reverse r1 fill1 buyer:USDT occurred=5                 | ok | buyer:USDT=40000/0 seller:USDT=0
release h1                                             | hold_not_open
""")


# --- currencies registered at runtime -------------------------------------------------------------------------


def test_a_currency_is_refused_until_registered_then_exact_at_its_scale() -> None:
    ledger = run("""
open vault:XAU XAU neg             | unknown_currency
register XAU 3                     | ok
open vault:XAU XAU neg             | ok
open ann:XAU XAU                   | ok
tx d1 vault:XAU=-1.250 ann:XAU=1.25 | ok | ann:XAU=1.25 vault:XAU=-1.25
register XAU 3                     | currency_exists
register XAU 4                     | currency_conflict
register USD 2                     | currency_exists
register JPY 2                     | currency_conflict
register XA:U 2                    | invalid_command
register BIG 37                    | invalid_command
register XJP 0                     | ok
register XAG 3 id=r-xag            | ok
register XAG 3 id=r-xag            | ok dup
""")
    assert ledger.currencies.get("XAU").scale == 3
    assert ledger.state.accounts["ann:XAU"].posted == 1250  # minor units of a 3-decimal currency


# --- FX rate snapshots ----------------------------------------------------------------------------------------

FX = """
open world:USD USD neg   | ok
open sys:fx:USD USD neg      | ok
open sys:fx:EUR EUR neg      | ok
open u:USD USD           | ok
open u:EUR EUR           | ok
transfer d1 world:USD->u:USD 100.00 kind=deposit | ok
"""


def test_a_conversion_fails_closed_on_an_unknown_stale_or_foreign_rate_snapshot() -> None:
    ledger = run(FX + """
tx x1 u:USD=-10.00 sys:fx:USD=10.00 sys:fx:EUR=-9.25 u:EUR=9.25 kind=fx rate=snap-1          | unknown_rate  | u:USD=100.00
rate snap-1 USD EUR 0.925 expires=20000 id=rate-1                                      | ok
rate snap-1 USD EUR 0.93 expires=20000                                                 | rate_exists
rate snap-2 USD XYZ 1 expires=20000                                                    | unknown_currency
rate snap-3 USD EUR 0 expires=20000                                                    | invalid_amount
rate snap-4 USD EUR 1e3 expires=20000                                                  | invalid_amount
rate snap-5 USD EUR 1.1 expires=5                                                      | invalid_command
rate snap-6 USD JPY 150.25 expires=20000                                               | ok
tx x2 u:USD=-10.00 sys:fx:USD=10.00 sys:fx:EUR=-9.25 u:EUR=9.25 kind=fx rate=snap-1          | ok            | u:USD=90.00 u:EUR=9.25
tx x3 u:USD=-10.00 sys:fx:USD=10.00 sys:fx:EUR=-9.25 u:EUR=9.25 kind=fx rate=snap-6          | rate_mismatch | u:USD=90.00
# log time 20,000 and later: snap-1 is stale, for transfers naming it too (the fast path cannot skip it)
tx x4 u:USD=-10.00 sys:fx:USD=10.00 sys:fx:EUR=-9.25 u:EUR=9.25 kind=fx rate=snap-1 at=20000 | stale_rate    | u:USD=90.00
transfer x5 u:USD->sys:fx:USD 1.00 rate=snap-1 at=20001                                    | stale_rate
# a reversal carries its original's snapshot and is not refused for its age
reverse r2 x2 u:USD at=50000                                                           | ok            | u:USD=100.00 u:EUR=0
""")
    snapshot = ledger.state.rates["snap-1"]
    assert (snapshot.base, snapshot.quote, snapshot.rate, snapshot.expires_at_ms) == ("USD", "EUR", "0.925", 20000)
    reversal = ledger.results[-1].events[0]
    assert reversal.rate_snapshot_id == "snap-1" and reversal.links == ("x2",)


def test_a_conversion_follows_the_rate_of_its_snapshot_within_one_minor_unit() -> None:
    """What the FX desk (sys:fx:<CUR>) pays out is what it took times the rate (or divided by it, the snapshot
    read the other way), rounded either way to a whole minor unit; a minor unit further is amount_off_rate."""
    run(FX + """
open sys:fx:JPY JPY neg | ok
open u:JPY JPY          | ok
open sys:fees:USD USD neg | ok
open v:USD USD          | ok
open v:EUR EUR neg      | ok
rate s1 USD EUR 0.925 | ok
rate s2 USD JPY 150.25 | ok
# exact: 10.00 USD x 0.925 = 9.25 EUR, nothing else
tx a1 u:USD=-10.00 sys:fx:USD=10.00 sys:fx:EUR=-9.24 u:EUR=9.24 kind=fx rate=s1 | amount_off_rate | u:USD=100.00
tx a2 u:USD=-10.00 sys:fx:USD=10.00 sys:fx:EUR=-9.26 u:EUR=9.26 kind=fx rate=s1 | amount_off_rate | u:USD=100.00
tx a3 u:USD=-10.00 sys:fx:USD=10.00 sys:fx:EUR=-9.25 u:EUR=9.25 kind=fx rate=s1 | ok              | u:USD=90.00 u:EUR=9.25
# 10.00 USD x 150.25 = 1502.5 JPY: 1502 (down) or 1503 (up)
tx b1 u:USD=-10.00 sys:fx:USD=10.00 sys:fx:JPY=-1501 u:JPY=1501 kind=fx rate=s2 | amount_off_rate | u:USD=90.00
tx b2 u:USD=-10.00 sys:fx:USD=10.00 sys:fx:JPY=-1504 u:JPY=1504 kind=fx rate=s2 | amount_off_rate | u:USD=90.00
tx b3 u:USD=-10.00 sys:fx:USD=10.00 sys:fx:JPY=-1502 u:JPY=1502 kind=fx rate=s2 | ok              | u:USD=80.00 u:JPY=1502
tx b4 u:USD=-10.00 sys:fx:USD=10.00 sys:fx:JPY=-1503 u:JPY=1503 kind=fx rate=s2 | ok              | u:USD=70.00 u:JPY=3005
# the other way with the same snapshot: 1503 JPY / 150.25 = 10.0033 USD: 10.00 or 10.01
tx c1 u:JPY=-1503 sys:fx:JPY=1503 sys:fx:USD=-10.02 u:USD=10.02 kind=fx rate=s2 | amount_off_rate | u:USD=70.00
tx c2 u:JPY=-1503 sys:fx:JPY=1503 sys:fx:USD=-10.01 u:USD=10.01 kind=fx rate=s2 | ok              | u:USD=80.01 u:JPY=1502
# a fee outside the desk is not part of the conversion
tx d1 u:USD=-10.10 sys:fx:USD=10.00 sys:fees:USD=0.10 sys:fx:EUR=-9.25 u:EUR=9.25 kind=fx rate=s1 | ok | u:USD=69.91 sys:fees:USD=0.10
# a swap between two customers naming a snapshot moves nothing through the desk: it fails closed
tx e1 u:USD=-10.00 v:USD=10.00 v:EUR=-9.25 u:EUR=9.25 kind=fx rate=s1               | amount_off_rate | u:USD=69.91
# the desk taking in both currencies is no conversion either
tx e3 u:USD=-1.00 sys:fx:USD=1.00 u:EUR=-0.92 sys:fx:EUR=0.92 kind=fx rate=s1         | amount_off_rate | u:USD=69.91
# precedence: unbalanced before the rate, the rate before funds
tx f1 u:USD=-10.00 sys:fx:USD=10.00 sys:fx:EUR=-9.00 u:EUR=9.25 kind=fx rate=s1       | unbalanced
tx f2 u:USD=-900.00 sys:fx:USD=900.00 sys:fx:EUR=-9.25 u:EUR=9.25 kind=fx rate=s1     | amount_off_rate
tx f3 u:USD=-900.00 sys:fx:USD=900.00 sys:fx:EUR=-832.50 u:EUR=832.50 kind=fx rate=s1 | insufficient_funds
# a reversal mirrors its original's legs: the desk pays back what it took, and it is not judged again
reverse r1 c2 u:JPY | ok | u:USD=59.90 u:JPY=3005
""")


@given(taken=st.integers(1, 10**30), num=st.integers(1, 10**12), digits=st.integers(0, 12),
       base_scale=st.integers(0, 18), quote_scale=st.integers(0, 18), delta=st.integers(-2, 2),
       forward=st.booleans())
def test_the_conversion_check_is_floor_or_ceil_of_the_exact_rational(taken, num, digits, base_scale, quote_scale,
                                                                     delta, forward) -> None:
    """judge_conversion against Fraction (allowed in tests, never in the core)."""
    whole, fraction = divmod(num, 10**digits)
    rate = f"{whole}.{fraction:0{digits}d}" if digits else str(num)
    exact = Fraction(taken * num * 10**quote_scale, 10**digits * 10**base_scale) if forward else \
        Fraction(taken * 10**digits * 10**base_scale, num * 10**quote_scale)
    paid = (math.floor(exact) if delta <= 0 else math.ceil(exact)) + delta
    snapshot = RateSnapshot("s", "B", "Q", rate, 0, 1)
    legs = [("sys:fx:B@1", taken, "B"), ("sys:fx:Q@1", -paid, "Q")] if forward else \
        [("sys:fx:Q", taken, "Q"), ("sys:fx:B", -paid, "B")]
    judged = judge_conversion(snapshot, {"B": base_scale, "Q": quote_scale},
                              [(account, currency, amount) for account, amount, currency in legs])
    follows = paid > 0 and math.floor(exact) <= paid <= math.ceil(exact)
    if paid <= 0:
        assert judged is not None
    else:
        assert (judged is None) == follows, (judged, exact, paid)


# --- returns and chargebacks ------------------------------------------------------------------------------------

RETURNS = """
open world:USD USD neg   | ok
open shop:USD USD neg    | ok
open u:USD USD           | ok
open v:USD USD           | ok
transfer d1 world:USD->u:USD 100.00 kind=deposit | ok | u:USD=100.00
transfer p1 u:USD->v:USD 10.00 kind=payment     | ok | u:USD=90.00 v:USD=10.00
"""
R = "meta=ledger.returns:"


def test_returns_and_chargebacks_take_back_part_of_a_payment_and_overdraw_the_spent_rest_into_a_receivable() -> None:
    ledger = run(RETURNS + f"""
# a partial return of the deposit while the money is there: linked to it, limited to what remains unreturned
tx r1 u:USD=-30.00 world:USD=30.00 kind=return {R}d1 link=d1              | ok                 | u:USD=60.00
tx r2 u:USD=-70.01 world:USD=70.01 kind=return {R}d1                      | exceeds_unreturned | u:USD=60.00
# the user spends; a chargeback of the remaining 70.00 takes the 55.00 left and the 15.00 spent from the receivable
transfer s1 u:USD->shop:USD 5.00 kind=purchase                            | ok                 | u:USD=55.00
tx c1 u:USD=-70.00 world:USD=70.00 kind=chargeback {R}d1                  | ok | u:USD=0 u:receivable.USD=-15.00 world:USD=0
tx c2 u:USD=-0.01 world:USD=0.01 kind=chargeback {R}d1                    | exceeds_unreturned
# what is not a return of a known payment, by this client, from its payee back to its payer
tx x1 u:USD=-1.00 world:USD=1.00 kind=return {R}nope                      | unknown_transaction
tx x2 u:USD=-1.00 world:USD=1.00 kind=return {R}d1 client=other           | client_mismatch
tx x3 world:USD=-1.00 u:USD=1.00 kind=return {R}d1                        | not_returnable
tx x4 v:USD=-1.00 u:USD=1.00 kind=return {R}d1                            | not_returnable
tx x9 u:USD=-1.00 v:USD=1.00 kind=return {R}d1                            | not_returnable
tx xa v:USD=-1.00 world:USD=1.00 kind=return {R}d1                        | not_returnable
tx x5 v:USD=-1.00 u:USD=0.50 world:USD=0.50 kind=return {R}p1             | not_returnable
tx x6 v:USD=-1.00 u:USD=1.00 kind=return {R}c1                            | not_returnable
tx x7 v:USD=-1.00 u:USD=1.00 kind=return {R}x7                            | invalid_command
# a payment partly returned is not reversed (return the rest), a return is not reversed, nor returned again
tx r3 v:USD=-4.00 u:USD=4.00 kind=return {R}p1                            | ok                 | u:USD=4.00 v:USD=6.00
reverse rv1 p1 u:USD                                                      | exceeds_unreturned
reverse rv2 r3 v:USD                                                      | not_reversible
# a reversed payment is not returned
transfer p2 v:USD->u:USD 1.00                                             | ok
reverse rv3 p2 v:USD                                                      | ok                 | v:USD=6.00
tx x8 u:USD=-1.00 v:USD=1.00 kind=return {R}p2                            | already_reversed
# the rest of p1, while the payee still has it: nothing owed
tx r4 v:USD=-6.00 u:USD=6.00 kind=return {R}p1                            | ok                 | v:USD=0 u:USD=10.00
""")
    deposit = ledger.state.transactions["d1"]
    assert (deposit.returned, ledger.state.transactions["c1"].returns) == (10_000, "d1")
    (chargeback,) = [r.events for r in ledger.results
                     if any(getattr(e, "transaction_id", None) == "c1" for e in r.events)]
    assert [type(e).__name__ for e in chargeback] == ["AccountOpened", "TransactionPosted", "TransactionReturned"]
    assert chargeback[1].legs == (Leg("u:USD", -5_500), Leg("u:receivable.USD", -1_500), Leg("world:USD", 7_000))
    assert ledger.state.transactions["p1"].returned == 1_000


def test_a_late_settlement_that_also_captures_an_open_hold_books_only_the_shortfall_on_the_receivable() -> None:
    """h1 was released and the money spent; one settlement captures h1 late and the open h2 in full. What u's
    available cannot cover after both (50) goes to its receivable; u ends at zero, never below (P2)."""
    ledger = run("""
open world:USD USD neg | ok
open u:USD USD | ok
transfer d1 world:USD->u:USD 100.00 | ok
hold h1 u:USD 60.00 | ok
hold h2 u:USD 30.00 | ok
release h1 | ok | u:USD=100.00/30.00
transfer t1 u:USD->world:USD 60.00 | ok | u:USD=40.00/30.00
tx s1 u:USD@h1=-60.00:USD u:USD@h2=-30.00 world:USD=90.00 meta=ledger.settlement:external | ok | u:USD=0/0 u:receivable.USD=-50.00
""")
    (posted,) = [e for e in ledger.results[-1].events if isinstance(e, TransactionPosted)]
    assert [(leg.account_id, leg.amount, leg.hold_id, leg.currency) for leg in posted.legs if leg.hold_id == "h1"] == [
        ("u:USD", -1000, "h1", "USD"), ("u:receivable.USD", -5000, "h1", "USD")]


def test_a_return_that_passes_its_own_checks_is_still_judged_by_the_ordinary_rules() -> None:
    """A return is a transaction: its payee's account frozen, it is refused account_frozen like any debit of
    it, and nothing moves: no receivable is opened for what the payee spent, the payment is not marked
    returned."""
    ledger = run(RETURNS + f"""
transfer s1 v:USD->shop:USD 6.00                          | ok             | v:USD=4.00
freeze v:USD                                              | ok
tx r1 v:USD=-4.00 u:USD=4.00 kind=return {R}p1            | account_frozen | v:USD=4.00 u:USD=90.00
tx r2 v:USD=-10.00 u:USD=10.00 kind=return {R}p1          | account_frozen | v:USD=4.00 u:USD=90.00
""")
    assert ledger.state.transactions["p1"].returned == 0 and "v:receivable.USD" not in ledger.state.accounts


def test_a_payee_that_may_go_negative_returns_from_its_own_account_and_a_return_is_never_returned() -> None:
    """Only an account held to its floor overdraws a return into a receivable: one that may go negative (a
    merchant's settlement account here) pays it all itself. A return (two legs, payee back to payer) is not a
    payment: it cannot be returned in turn."""
    ledger = run(RETURNS + f"""
transfer p2 u:USD->shop:USD 20.00 kind=payment                 | ok | u:USD=70.00 shop:USD=20.00
transfer s1 shop:USD->world:USD 50.00                          | ok | shop:USD=-30.00
tx r1 shop:USD=-20.00 u:USD=20.00 kind=return {R}p2            | ok | shop:USD=-50.00 u:USD=90.00
tx r2 v:USD=-4.00 u:USD=4.00 kind=return {R}p1                 | ok | v:USD=6.00 u:USD=94.00
tx x1 u:USD=-4.00 v:USD=4.00 kind=return {R}r2                 | not_returnable | v:USD=6.00 u:USD=94.00
""")
    assert "shop:receivable.USD" not in ledger.state.accounts
    assert ledger.results[-1].detail == "transaction r2 is not a payment from one account to another (it is a return)"


def test_a_return_overdrawn_into_the_receivable_keeps_the_currency_its_legs_state() -> None:
    ledger = run(RETURNS + f"""
transfer s1 v:USD->world:USD 6.00                                      | ok | v:USD=4.00
tx r1 v:USD=-10.00:USD u:USD=10.00:USD kind=return {R}p1               | ok | v:USD=0 v:receivable.USD=-6.00
""")
    (posted,) = [e for e in ledger.results[-1].events if isinstance(e, TransactionPosted)]
    stated = {leg.account_id: (leg.amount, leg.currency) for leg in posted.legs}
    assert (stated["v:USD"], stated["u:USD"]) == ((-400, "USD"), (1000, "USD"))
    # each leg keeps what its own sender stated: here the payer's leg states it, the payee's does not
    ledger = run(RETURNS + f"""
transfer s1 v:USD->world:USD 6.00                                      | ok | v:USD=4.00
tx r1 v:USD=-10.00 u:USD=10.00:USD kind=return {R}p1                   | ok | v:USD=0 v:receivable.USD=-6.00
""")
    posted, returned = [e for e in ledger.results[-1].events if type(e).__name__ in ("TransactionPosted",
                                                                                       "TransactionReturned")]
    stated = {leg.account_id: leg.currency for leg in posted.legs}
    assert (stated["v:USD"], stated["u:USD"]) == (None, "USD")
    # the payment is marked returned at the return's log time
    assert (returned.transaction_id, returned.returned_by, returned.amount) == ("p1", "r1", 1000)
    assert returned.at_ms == posted.at_ms and type(returned.at_ms) is int


def test_only_a_debit_leg_may_name_a_hold_even_the_smallest_credit() -> None:
    """A credit of one minor unit naming a hold is refused like any credit that names one (invalid_command)."""
    run("""
open world:USD USD neg                      | ok
open u:USD USD                              | ok
open v:USD USD                              | ok
transfer d1 world:USD->u:USD 10.00          | ok
hold h1 u:USD 5.00                          | ok
tx t1 u:USD=-0.01 v:USD@h1=0.01             | invalid_command | u:USD=10.00/5.00 v:USD=0
tx t2 u:USD=-0.02 v:USD@h1=0.01 v:USD=0.01  | invalid_command | u:USD=10.00/5.00 v:USD=0
""")


# --- a payment made in steps: a deposit in transit, fronted, settled, then charged back --------------------------

IN_TRANSIT = """
open custody:USD USD neg    | ok
open transit:USD USD neg    | ok
open shop:USD USD neg       | ok
open u:pending.USD USD      | ok
open u:USD USD              | ok
# initiated 500 (the rails owe it), 200 of it fronted, then settled: the user got 200 early and 300 now
transfer i1 transit:USD->u:pending.USD 500.00 kind=deposit_initiated          | ok | u:pending.USD=500.00
transfer f1 u:pending.USD->u:USD 200.00 kind=deposit_fronted                  | ok | u:pending.USD=300.00 u:USD=200.00
tx s1 custody:USD=-500.00 transit:USD=500.00 u:pending.USD=-300.00 u:USD=300.00 kind=deposit link=i1| ok | u:USD=500.00 u:pending.USD=0 transit:USD=0
transfer buy u:USD->shop:USD 450.00 kind=purchase                             | ok | u:USD=50.00
"""
CB = "kind=chargeback meta=ledger.returns:s1"


def test_a_chargeback_of_a_fronted_then_settled_deposit_returns_its_whole_flow_once() -> None:
    """The settlement alone is four legs, not a payment; with its steps (linked by the chargeback) it nets to
    custody paying the user 500, so up to 500 goes back: the 50 the user has, 450 on the receivable. Every
    step counts the chargeback, so the fronting is not returned again on its own and no step is reversed."""
    ledger = run(IN_TRANSIT + f"""
tx cb0 u:USD=-1.00 custody:USD=1.00 {CB} id=cb0                               | not_returnable
tx cb1 u:USD=-1.00 custody:USD=1.00 {CB} link=i1 id=cb1                       | not_returnable
tx cb2 u:USD=-1.00 custody:USD=1.00 {CB} link=f1 id=cb2                       | not_returnable
tx cb3 u:USD=-1.00 custody:USD=1.00 {CB} link=i1 link=f1 link=nope id=cb3     | unknown_transaction
tx cb4 u:USD=-1.00 transit:USD=1.00 {CB} link=i1 link=f1 id=cb4               | not_returnable
tx cb5 u:USD=-500.01 custody:USD=500.01 {CB} link=i1 link=f1 id=cb5           | exceeds_unreturned
tx cb6 u:USD=-500.00 custody:USD=500.00 {CB} link=s1 link=i1 link=f1 link=i1 id=cb6| ok | u:USD=0 u:receivable.USD=-450.00 custody:USD=0
tx cb7 u:USD=-0.01 custody:USD=0.01 {CB} link=i1 link=f1 id=cb7               | exceeds_unreturned
tx r1 u:USD=-0.01 u:pending.USD=0.01 kind=return meta=ledger.returns:f1       | exceeds_unreturned
tx r2 u:pending.USD=-0.01 transit:USD=0.01 kind=return meta=ledger.returns:i1 | exceeds_unreturned
reverse v1 f1 u:USD                                                           | exceeds_unreturned
reverse v2 s1 u:USD                                                           | exceeds_unreturned
reverse v3 cb6 u:USD                                                          | not_reversible
""")
    records = ledger.state.transactions
    assert [records[t].returned for t in ("s1", "i1", "f1")] == [50_000] * 3
    assert records["cb6"].returns == "s1"
    results = {r.command_id: r for r in ledger.results}
    assert results["cb7"].detail == "return of 1 exceeds the 0 unreturned of s1 (50000 of 50000 returned already)"
    assert results["cb1"].detail == ("s1, i1 do not net to one payment that the return's two legs move back from "
                                    "its payee to its payer")
    (posted,) = [e for e in results["cb6"].events if isinstance(e, TransactionPosted)]
    assert posted.legs == (Leg("u:USD", -5_000), Leg("u:receivable.USD", -45_000), Leg("custody:USD", 50_000))
    assert [(e.transaction_id, e.amount) for e in results["cb6"].events if type(e).__name__ ==
            "TransactionReturned"] == [("s1", 50_000), ("i1", 50_000), ("f1", 50_000)]


def test_a_partial_chargeback_leaves_the_rest_and_a_fronting_clawed_back_earlier_is_not_charged_back_twice() -> None:
    """What remains unreturned of a flow is its net amount minus the most any step counts: 120 charged back
    leaves 380; a fronting returned on its own (60 of 200, to pending) counts on that step only, and the flow's
    next return sees 500 - 180 = 320 left."""
    run(IN_TRANSIT + f"""
tx cb1 u:USD=-120.00 custody:USD=120.00 {CB} link=i1 link=f1 id=cb1           | ok | u:USD=0 u:receivable.USD=-70.00
tx r1 u:USD=-60.00 u:pending.USD=60.00 kind=return meta=ledger.returns:f1     | ok | u:receivable.USD=-130.00 u:pending.USD=60.00
tx cb2 u:USD=-320.01 custody:USD=320.01 {CB} link=i1 link=f1 id=cb2           | exceeds_unreturned
tx cb3 u:USD=-320.00 custody:USD=320.00 {CB} link=i1 link=f1 id=cb3           | ok | u:receivable.USD=-450.00 custody:USD=-60.00
tx r2 u:USD=-0.01 u:pending.USD=0.01 kind=return meta=ledger.returns:f1       | exceeds_unreturned
""")


def test_a_wholly_fronted_deposit_settles_in_two_legs_and_is_charged_back_through_its_steps() -> None:
    """All 100 fronted: the settlement moves custody to transit only (a two-leg payment, not to the user),
    so the chargeback's legs do not match it alone and its steps decide."""
    run(f"""
open custody:USD USD neg    | ok
open transit:USD USD neg    | ok
open u:pending.USD USD      | ok
open u:USD USD              | ok
transfer i1 transit:USD->u:pending.USD 100.00                                 | ok
transfer f1 u:pending.USD->u:USD 100.00                                       | ok
transfer s1 custody:USD->transit:USD 100.00 link=i1                           | ok | transit:USD=0 u:USD=100.00
tx cb0 u:USD=-100.00 custody:USD=100.00 {CB} id=cb0                          | not_returnable
tx cb1 u:USD=-100.00 custody:USD=100.00 {CB} link=i1 link=f1 id=cb1           | ok | u:USD=0 custody:USD=0
""")


def test_every_step_of_a_flow_is_the_clients_own_stands_and_is_no_return() -> None:
    """A step posted by another client, a reversed one or a return is refused as it would be named alone."""
    ledger = run(IN_TRANSIT + f"""
transfer f2 u:pending.USD->u:USD 0.01 client=other                            | insufficient_funds
transfer o1 shop:USD->u:USD 1.00 client=other                                 | ok
tx cb1 u:USD=-1.00 custody:USD=1.00 {CB} link=i1 link=f1 link=o1 id=cb1       | client_mismatch
transfer p1 shop:USD->u:USD 1.00                                              | ok
reverse v1 p1 u:USD                                                           | ok
tx cb2 u:USD=-1.00 custody:USD=1.00 {CB} link=i1 link=f1 link=p1 id=cb2       | already_reversed
transfer p2 custody:USD->u:USD 2.00                                           | ok
tx r1 u:USD=-1.00 custody:USD=1.00 kind=return meta=ledger.returns:p2         | ok
tx cb3 u:USD=-1.00 custody:USD=1.00 {CB} link=i1 link=f1 link=r1 id=cb3       | not_returnable
""")
    # with the return r1 the steps would net to custody paying u 499.00: a return is never a step all the same
    assert ledger.results[-1].detail == "transaction r1 is a return, not a step of s1"


_STEP_OPS = st.one_of(
    st.tuples(st.just("flow"), st.integers(1, 12_000)),      # a chargeback of the whole flow
    st.tuples(st.just("fronting"), st.integers(1, 12_000)),  # the fronting returned on its own, to pending
    st.tuples(st.just("initiation"), st.integers(1, 12_000)),  # the initiation returned on its own
    st.tuples(st.sampled_from(["reverse i1", "reverse f1", "reverse s1"]), st.just(0)),
)


@given(amount=st.integers(1, 10_000), fronted=st.integers(0, 10_000), spent=st.integers(0, 10_000),
       ops=st.lists(_STEP_OPS, max_size=8))
def test_no_mix_of_returns_of_a_flow_and_of_its_steps_takes_back_more_than_the_deposit(amount, fronted, spent,
                                                                                         ops) -> None:
    """Whatever mix of chargebacks of a settled deposit's flow, returns of its fronting or initiation alone and
    reversals of its steps: the user loses at most the deposit through returns (flow + initiation; a fronting
    returned to pending stays the user's), at most the deposit leaves the user's account through them (flow +
    fronting), each step counts exactly the returns that named it or its flow, and nothing is returned through
    a reversed step, nor a step reversed once returned."""
    fronted, spent = min(fronted, amount), min(spent, amount)
    cents = lambda minor: f"{minor // 100}.{minor % 100:02d}"  # noqa: E731
    settle = [f"custody:USD=-{cents(amount)}", f"transit:USD={cents(amount)}"]
    if amount > fronted:
        settle += [f"u:pending.USD=-{cents(amount - fronted)}", f"u:USD={cents(amount - fronted)}"]
    ledger = run("""
open custody:USD USD neg | ok
open transit:USD USD neg | ok
open shop:USD USD neg    | ok
open u:pending.USD USD   | ok
open u:USD USD           | ok
""" + f"transfer i1 transit:USD->u:pending.USD {cents(amount)} | ok\n"
        + (f"transfer f1 u:pending.USD->u:USD {cents(fronted)} | ok\n" if fronted else "")
        + f"tx s1 {' '.join(settle)} | ok\n"
        + (f"transfer buy u:USD->shop:USD {cents(spent)} | ok\n" if spent else ""))
    steps = ["s1", "i1"] + (["f1"] if fronted else [])
    links = " ".join(f"link={step}" for step in steps)
    lines = {"flow": f"u:USD=-{{x}} custody:USD={{x}} kind=chargeback meta=ledger.returns:s1 {links}",
             "fronting": "u:USD=-{x} u:pending.USD={x} kind=return meta=ledger.returns:f1",
             "initiation": "u:pending.USD=-{x} transit:USD={x} kind=return meta=ledger.returns:i1"}
    taken = {"flow": 0, "fronting": 0, "initiation": 0}
    counted = dict.fromkeys(steps, 0)
    reversed_steps: set[str] = set()
    for number, (op, x) in enumerate(ops, start=100):
        if op in lines:
            result = ledger.attempt(number, f"tx o{number} " + lines[op].format(x=cents(x)) + f" id=o{number}")
            named = steps if op == "flow" else [{"fronting": "f1", "initiation": "i1"}[op]]
            if result.accepted:
                assert not reversed_steps.intersection(named), (op, reversed_steps)
                taken[op] += x
                for step in named:
                    counted[step] += x
        else:
            step = op.split()[1]
            result = ledger.attempt(number, f"reverse o{number} {step} u:USD id=o{number}")
            if result.accepted:
                assert counted.get(step, 0) == 0, (step, counted)
                reversed_steps.add(step)
    assert taken["flow"] + taken["initiation"] <= amount
    assert taken["flow"] + taken["fronting"] <= amount
    records = ledger.state.transactions
    assert {step: records[step].returned for step in steps} == counted
