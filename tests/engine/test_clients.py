"""Client round trips against the real broker: sync and asyncio, typed validation errors, timeouts."""
from __future__ import annotations

import asyncio

import pytest

from connectors.aioclient import AsyncLedgerClient
from connectors.client import ClientValidationError, LedgerClient, Leg, ResultTimeout


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
