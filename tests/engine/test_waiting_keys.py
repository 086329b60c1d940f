"""What keeps its place behind a waiting command: a command naming an account (or hold) a waiting command names.
A system account is everyone's: a deposit waiting behind a user's freeze must not hold back every other deposit
of the partition through the world's shard they share. Broker-free, through eight partition processors."""
from __future__ import annotations

from tests.helpers.bus import Bus, assert_books_balance
from tests.helpers.records import command, local_users, open_account, transfer

X1 = local_users(1, partition=0)[0]
Y1, Y2 = local_users(2, partition=1)


def answered(bus: Bus, command_id: str) -> list[tuple]:
    return [(r["outcome"], r["reason"]) for r in bus.results if r["command_id"] == command_id]


def test_a_deposit_waiting_behind_a_freeze_does_not_hold_back_another_account_s_deposit():
    bus = Bus()
    for account in (X1, Y1, Y2):
        bus.send(open_account(account), account)
    bus.send(transfer("dep", ("sys:world:USD", -1_000), (X1, 1_000)), X1)
    bus.run()
    bus.send_placed(transfer("in", (X1, -100), (Y1, 100)), X1)
    bus.send(command("fz", "FreezeAccount", {"account_id": Y1}), Y1)
    bus.send(transfer("dep-y1", ("sys:world:USD", -5), (Y1, 5)), Y1)
    bus.send(transfer("dep-y2", ("sys:world:USD", -7), (Y2, 7)), Y2)
    for _ in range(4):
        bus.step(1)  # the copy reserves Y1's credit; the freeze waits; Y1's deposit keeps its place behind it
    assert not answered(bus, "fz") and not answered(bus, "dep-y1")
    assert answered(bus, "dep-y2") == [("accepted", None)], "held back by a waiting deposit to someone else"
    bus.run()
    assert [answered(bus, i) for i in ("in", "fz", "dep-y1")] == [[("accepted", None)]] * 3
    assert bus.account(Y1) == (105, 0) and bus.account(Y2) == (7, 0)
    assert_books_balance(bus, ("USD",))


def test_a_payment_naming_a_system_shard_whose_freeze_waits_keeps_its_place_behind_it():
    """The freeze of the fees' shard waits (a transaction in flight posts to it); a refund out of the fees sent
    after it is decided after it: refused, the shard frozen."""
    bus = Bus()
    for account in (X1, Y1):
        bus.send(open_account(account), account)
    bus.send(transfer("dep", ("sys:world:USD", -1_000), (X1, 1_000)), X1)
    bus.send(transfer("dep-y", ("sys:world:USD", -50), (Y1, 50)), Y1)
    bus.run()
    bus.send_placed(transfer("in", (X1, -100), (Y1, 95), ("sys:fees:USD", 5)), X1)
    bus.step(0)  # begun: partition 0's share (X1 and the fees' shard there) reserved
    bus.send_to(0, command("fz", "FreezeAccount", {"account_id": "sys:fees:USD"}))
    bus.send(transfer("fee", ("sys:fees:USD", -1), (X1, 1)), X1)
    bus.step(0)
    bus.step(0)
    assert not answered(bus, "fz") and not answered(bus, "fee")
    bus.run()
    assert answered(bus, "fz") == [("accepted", None)]
    assert answered(bus, "fee") == [("rejected", "account_frozen")]
