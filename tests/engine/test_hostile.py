"""Hostile producers against the real broker and a real worker (DESIGN.md P11): an oversized command, and
engine steps forged with a plain Kafka producer. The worker never exits; money does not move; the victim's
own commands are decided as usual; the oracles hold."""
from __future__ import annotations

import time

from confluent_kafka import Producer

from connectors.client import LedgerClient, Leg
from projections.topics import latest_per_account, read_topic
from projections.verify import format_report, verify, wait_quiescent
from schemas.codec import codec
from streams import limits, routing
from streams.routing import ENGINE_CLIENT

C = codec()


def answers(settings, keys: set[tuple[str, str]], timeout_s: float = 120.0) -> dict[tuple[str, str], dict]:
    """The first result of each (client_id, command_id), read from the results topic."""
    found: dict[tuple[str, str], dict] = {}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for r in read_topic(settings, "results"):
            key = (r.value["client_id"], r.value["command_id"])
            if key in keys and key not in found:
                found[key] = r.value
        if found.keys() >= keys:
            return found
        time.sleep(0.5)
    raise AssertionError(f"no result for {sorted(keys - found.keys())}")


def balance(settings, account: str) -> dict:
    return latest_per_account(read_topic(settings, "balances"))[account].value


def engine_record(command_id: str, kind: str, body: dict) -> bytes:
    return C.encode("command", {"command_id": command_id, "client_id": ENGINE_CLIENT, "body": (f"ledger.{kind}", body)})


def test_an_oversized_open_is_rejected_and_the_worker_keeps_deciding(settings, start_worker):
    worker = start_worker()
    client = LedgerClient(settings, "big")
    huge = "user:big:" + "x" * 300_000  # a ~600 kB record: under Kafka's 1 MiB default, over our limits
    open_id = f"open:{huge}"
    producer = Producer(settings.kafka_config())  # as any producer writes it, whatever a client library checks
    producer.produce(settings.topic("commands"), C.encode("command", {
        "command_id": open_id, "client_id": "big", "body": ("ledger.OpenAccount", {
            "account_id": huge, "currency": "USD", "allow_negative": False, "overdraft_limit": "0",
            "max_balance": None, "routing_key": None})}), b"user:big",
        partition=routing.partition_for_key("user:big", settings.partitions))
    producer.flush(30)
    result = answers(settings, {("big", open_id)})[("big", open_id)]  # ids that fit an answer are echoed whole
    assert (result["outcome"], result["reason"]) == ("rejected", "invalid_command")
    assert f"the limit is {limits.MAX_COMMAND_BYTES}" in result["detail"], result["detail"]
    normal = client.open_account("user:small:USD", "USD")
    assert client.result(normal, timeout_s=120)["outcome"] == "accepted"
    assert worker.alive and not worker.crashed(), worker.tail()
    assert wait_quiescent(settings)
    report = verify(settings)
    assert report.ok, format_report(report)
    assert worker.alive and not worker.crashed(), worker.tail()
    client.close()


def test_forged_engine_steps_move_no_money_and_never_stop_the_worker(settings, start_worker):
    worker = start_worker(extra_env={"LEDGER_ENGINE_KEY": "a key the attacker does not have"})
    client = LedgerClient(settings, "ann")
    ann, bob = "user:ann:USD", "user:bob:USD"
    client.wait([client.open_account(ann, "USD"), client.open_account(bob, "USD"),
                 client.post("dep", [Leg("sys:world:USD", -9_000), Leg(ann, 9_000)], kind="deposit")])
    p = routing.partition_of_account(ann, settings.partitions)
    steal = {"transaction_id": "steal", "kind": "transfer", "reference": None, "links": [], "metadata": {},
             "occurred_at_ms": None, "rate_snapshot_id": None,
             "legs": [{"account_id": ann, "amount": "-9000", "hold_id": None, "currency": None},
                      {"account_id": "user:mallory:USD", "amount": "9000", "hold_id": None, "currency": "USD"}]}
    crash = {**steal, "legs": [{**leg, "amount": "abc"} for leg in steal["legs"]]}
    reserve = {"transaction_client_id": "mallory", "transaction_command_id": "steal", "coordinator_partition": p,
               "transaction": steal}
    forged = [
        engine_record(f"mallory/steal~reserve~{p}", "Reserve", reserve),
        engine_record(f"mallory/steal~decide~{p}", "Decide",
                      {"transaction_client_id": "mallory", "transaction_command_id": "steal", "commit": True}),
        engine_record("crash~reserve", "Reserve", {**reserve, "transaction_command_id": "crash", "transaction": crash}),
        engine_record("mallory/steal~credit~0", "PostTransaction", {
            **steal, "transaction_id": "mallory/steal~credit~0",
            "legs": [{"account_id": "sys:clearing:USD", "amount": "-9000", "hold_id": None, "currency": None},
                     {"account_id": ann, "amount": "9000", "hold_id": None, "currency": None}]}),
    ]
    attacker = Producer(settings.kafka_config())
    for value in forged:  # as a plain producer writes them, with and without a made-up seal header
        attacker.produce(settings.topic("commands"), value, b"user:ann", partition=p)
        attacker.produce(settings.topic("commands"), value, b"user:ann", partition=p,
                         headers=[("ledger-seal", b"\x00" * 32)])
    attacker.flush(30)
    ids = {(ENGINE_CLIENT, C.decode("command", v)["command_id"]) for v in forged}
    for key, result in answers(settings, ids).items():
        assert (result["outcome"], result["reason"]) == ("rejected", "invalid_command"), (key, result)
        assert result["detail"].startswith("engine_step_unsealed"), result["detail"]
    pay = client.post("pay", [Leg(ann, -9_000), Leg(bob, 9_000)])
    assert client.result(pay, timeout_s=120)["outcome"] == "accepted", "ann's own payment was refused"
    assert wait_quiescent(settings)
    assert balance(settings, ann)["posted"] == "0" and balance(settings, ann)["held"] == "0"
    assert balance(settings, bob)["posted"] == "9000"
    report = verify(settings)
    assert report.ok, format_report(report)
    assert worker.alive and worker.starts == 1 and not worker.crashed(), worker.tail()
    client.close()
