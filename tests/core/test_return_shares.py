"""The core's part of a return whose payee and payer live in different partitions (pure, no engine): each
partition judges its share of the return against the payment's share there with returns.judge_named, counting
the returns in flight, and posts its share with execute_share, which keeps the client and counts the return.
The engine's protocol around it is tested in tests/engine/test_spanning_returns.py."""
from __future__ import annotations

from streams.core import SYSTEM_POLICY, Leg, MemoryState, OpenAccount, PostTransaction, Rejection, execute, \
    execute_share
from streams.core.model import DEFAULT_POLICY
from streams.core.returns import RETURNS_KEY, Returned, covered, judge_named

T0 = 1_700_000_000_000
CLEARING = "sys:clearing:USD@1"  # the payee's partition's clearing shard


def payee_partition() -> MemoryState:
    """The payee's partition after a payment of 100.00 from another partition: its share, clearing -> bo,
    posted by the engine for the client "gateway"."""
    state = MemoryState()
    for account, policy in (("user:bo:USD", DEFAULT_POLICY), (CLEARING, SYSTEM_POLICY)):
        state.commit(execute(state, OpenAccount(command_id=f"open:{account}", client_id="engine", at_ms=T0,
                                                account_id=account, currency="USD", policy=policy))[1])
    share = PostTransaction(command_id="gateway/pay~decide~1", client_id="engine", at_ms=T0, transaction_id="pay",
                            legs=(Leg(CLEARING, -100_00), Leg("user:bo:USD", 100_00)))
    result, changes = execute_share(state, share, "gateway")
    assert result.accepted
    state.commit(changes)
    return state


RETURN_SHARE = (Leg("user:bo:USD", -60_00), Leg(CLEARING, 60_00))  # the mirror of the payment's share


def judged(state: MemoryState, client: str = "gateway", in_flight: int = 0):
    return judge_named("ret", ((RETURNS_KEY, "pay"),), client, RETURN_SHARE, ("pay",), state.transaction,
                       lambda paid: in_flight if paid == "pay" else 0)


def test_a_share_posted_by_the_engine_is_the_clients_record():
    state = payee_partition()
    assert state.transaction("pay").client_id == "gateway"
    assert judged(state) == Returned(CLEARING, "user:bo:USD", 60_00, ("pay",))
    assert judged(state, client="other")[0] is Rejection.CLIENT_MISMATCH


def test_returns_in_flight_count_against_what_remains_unreturned():
    state = payee_partition()
    assert judged(state, in_flight=40_00) == Returned(CLEARING, "user:bo:USD", 60_00, ("pay",))
    refused = judged(state, in_flight=40_01)
    assert refused == (Rejection.EXCEEDS_UNRETURNED,
                       "return of 6000 exceeds the 5999 unreturned of pay "
                       "(4001 of 10000 returned already, 4001 of it by returns in flight)")


def test_a_return_share_counts_the_return_on_the_payment_share_and_says_what_it_returns():
    state = payee_partition()
    returned = judged(state)
    share = PostTransaction(command_id="gateway/ret~decide~1", client_id="engine", at_ms=T0 + 1,
                            transaction_id="ret", kind="return", links=("pay",), metadata=((RETURNS_KEY, "pay"),),
                            legs=RETURN_SHARE)
    result, changes = execute_share(state, share, "gateway", returned=returned)
    assert result.accepted
    state.commit(changes)
    assert (state.transaction("pay").returned, state.transaction("ret").returns) == (60_00, "pay")
    assert state.transaction("ret").client_id == "gateway"
    assert judged(state) == (Rejection.EXCEEDS_UNRETURNED, "return of 6000 exceeds the 4000 unreturned of pay "
                                                           "(6000 of 10000 returned already)")


def test_what_the_payees_available_covers():
    state = payee_partition()
    bo = state.account("user:bo:USD")
    assert (covered(bo, 60_00), covered(bo, 100_00), covered(bo, 130_00)) == (60_00, 100_00, 100_00)
    assert covered(state.account(CLEARING), 130_00) == 130_00, "a system payee takes it all"
