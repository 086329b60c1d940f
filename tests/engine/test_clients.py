"""Client round trips against the real broker: sync and asyncio, typed validation errors, timeouts."""
from __future__ import annotations

import asyncio

import pytest

from connectors.aioclient import AsyncLedgerClient
from connectors.client import ClientValidationError, LedgerClient, Leg, ResultTimeout
from projections.topics import latest_per_account, read_topic
from projections.verify import format_report, verify, wait_quiescent
from streams import routing


def test_client_side_validation_errors_are_typed(settings):
    client = LedgerClient(settings, "val")
    with pytest.raises(ClientValidationError, match="int of minor units"):
        client.post("t", [Leg("a:USD", -1.5), Leg("b:USD", 1.5)])
    with pytest.raises(ClientValidationError, match="two legs"):
        client.post("t", [Leg("a:USD", 1)])
    with pytest.raises(ClientValidationError, match="positive int"):
        client.place_hold("h", "a:USD", 0)
    with pytest.raises(ClientValidationError, match="command_id"):
        client.post("", [Leg("a:USD", -1), Leg("b:USD", 1)])
    client.close()


def test_a_timeout_hands_back_the_command_id(settings):
    client = LedgerClient(settings, "nobody-listens")  # no worker is running in this test
    command_id = client.open_account("user:tim:USD", "USD")
    with pytest.raises(ResultTimeout) as raised:
        client.result(command_id, timeout_s=1.0)
    assert raised.value.missing == [command_id]
    client.close()


def _written(payer: str, payee: str, partitions: int) -> int:
    """Records a client writes for a payment: one, and a copy when the payee lives in another partition
    (streams/placement.py: each participant reads it at the producer's position)."""
    return 1 if routing.partition_of_account(payer, partitions) == routing.partition_of_account(payee, partitions) \
        else 2


def test_asyncio_client_round_trip_with_many_commands_in_flight(settings, start_worker):
    start_worker()

    async def scenario():
        async with AsyncLedgerClient(settings, "aio", max_in_flight=200) as ledger:
            opened = await asyncio.gather(*[ledger.open_account(f"user:a{i}:USD", "USD") for i in range(20)])
            assert {r["outcome"] for r in opened} == {"accepted"}
            deposits = await asyncio.gather(*[
                ledger.post(f"dep-{i}", [Leg("sys:world:USD", -100), Leg(f"user:a{i}:USD", 100)], kind="deposit")
                for i in range(20)])
            assert {r["outcome"] for r in deposits} == {"accepted"}
            moves = await asyncio.gather(*[
                ledger.post(f"mv-{i}", [Leg(f"user:a{i}:USD", -60), Leg(f"user:a{(i + 1) % 20}:USD", 60)])
                for i in range(20)])
            assert {r["outcome"] for r in moves} == {"accepted"}
            again = await ledger.post("mv-0", [Leg("user:a0:USD", -60), Leg("user:a1:USD", 60)])
            assert again["outcome"] == "accepted" and again["duplicate"]  # the original result, flagged

    asyncio.run(scenario())
    # Commands awaited together went out together: CommandBatch records, except where a partition had one.
    commands = [r for r in read_topic(settings, "commands") if r.value and r.value["client_id"] == "aio"]
    n = settings.partitions
    moves = [_written(f"user:a{i}:USD", f"user:a{(i + 1) % 20}:USD", n) for i in range(20)]
    assert len(commands) == 40 + sum(moves) + moves[0]
    assert sum(r.index is not None for r in commands) > 40, "concurrent commands were not batched"


def test_batched_commands_each_get_their_own_decision_in_fewer_records(settings, start_worker):
    """client.batch() packs commands into CommandBatch records; the worker decides each as if sent alone
    (same accounts, overdraft rejected, duplicate answered, poison dead-lettered) and the oracles hold."""
    start_worker()
    client = LedgerClient(settings, "batcher")
    users = [f"user:b{i}:USD" for i in range(24)]
    with client.batch(max_commands=10):
        ids = [client.open_account(u, "USD") for u in users]
        ids += [client.post(f"dep-{i}", [Leg("sys:world:USD", -100), Leg(u, 100)], kind="deposit")
                for i, u in enumerate(users)]
        # Around the ring: most credits live in another partition (two phases, a copy placed there).
        ids += [client.post(f"mv-{i}", [Leg(u, -70), Leg(users[(i + 1) % len(users)], 70)])
                for i, u in enumerate(users)]
        ids.append(client.post("too-much", [Leg(users[0], -10_000), Leg(users[1], 10_000)]))
        client.send_raw(b"\x00not a command", users[2])
        ids.append(client.post("mv-0", [Leg(users[0], -70), Leg(users[1], 70)]))  # a retry
    results = client.wait(ids[:-1], 60)
    assert [r["outcome"] for r in results.values()].count("accepted") == 3 * len(users)
    assert results["too-much"]["reason"] == "insufficient_funds"
    assert wait_quiescent(settings)
    report = verify(settings)
    assert report.ok, format_report(report)
    assert report.counts["dead_letters"] == 1
    balances = {a: r.value for a, r in latest_per_account(read_topic(settings, "balances")).items()}
    assert all(balances[u]["posted"] == "100" for u in users), "each user received 70 and sent 70"
    records = sum(1 for r in read_topic(settings, "commands") if r.value and r.value["client_id"] == "batcher")
    raw_records = {(r.partition, r.offset) for r in read_topic(settings, "commands")
                   if r.index is not None}
    n = settings.partitions
    written = 2 * len(users) + sum(_written(u, users[(i + 1) % len(users)], n) for i, u in enumerate(users)) + \
        2 * _written(users[0], users[1], n)  # too-much and the retry
    # Up to 10 per record; copies spread a batch's commands over more partitions, so some records are short.
    assert records == written and len(raw_records) < written / 3, "commands did not travel in batches"
    client.close()
