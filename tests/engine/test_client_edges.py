"""What a client or a CLI command does at the edges, against the real broker: foreign bytes on the results
topic, an id reused with another payload, and no broker at all."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest
from confluent_kafka import Producer

from connectors.admin import BrokerUnreachable, TopicNotReady
from connectors.aioclient import AsyncLedgerClient
from connectors.client import LedgerClient, Leg
from projections.topics import read_topic
from streams.config import Settings
from tests.harness import ROOT


def foreign_records_on_results(settings, value: bytes = b"not avro") -> None:
    """What any producer with write access can put on the results topic: one record per partition."""
    producer = Producer(settings.kafka_config())
    for p in range(settings.partitions):
        producer.produce(settings.topic("results"), value, b"x", partition=p)
    assert producer.flush(10) == 0


def deposit(amount: int, account: str = "user:ida:USD") -> list[Leg]:
    return [Leg("sys:world:USD", -amount), Leg(account, amount)]


def test_a_foreign_record_on_results_is_skipped_and_counted(settings, start_worker):
    start_worker()
    client = LedgerClient(settings, "edge")
    foreign_records_on_results(settings)
    foreign_records_on_results(settings, b"\xc3\x01" + b"\x00" * 8 + b"from a newer writer")
    assert client.result(client.open_account("user:ida:USD", "USD"))["outcome"] == "accepted"
    assert client.unreadable == 2 * settings.partitions

    async def with_the_asyncio_client():
        async with AsyncLedgerClient(settings, "edge-aio") as ledger:
            foreign_records_on_results(settings)
            first = await ledger.post("aio-dep-1", deposit(5), kind="deposit")
            foreign_records_on_results(settings)
            second = await ledger.post("aio-dep-2", deposit(7), kind="deposit")
            return first, second

    first, second = asyncio.run(with_the_asyncio_client())
    assert first["outcome"] == second["outcome"] == "accepted", (first, second)
    client.close()


def test_a_reused_id_is_answered_id_conflict_and_never_displaces_the_decision(settings, start_worker):
    start_worker()
    client = LedgerClient(settings, "reuse")
    client.result(client.open_account("user:ida:USD", "USD"))
    first = client.result(client.post("dep-1", deposit(100), kind="deposit"))
    assert (first["outcome"], first["duplicate"]) == ("accepted", False)
    # The same id with another payload: the answer to that send is the refusal, not the cached decision.
    other = client.result(client.post("dep-1", deposit(999), kind="deposit"))
    assert (other["outcome"], other["reason"]) == ("rejected", "id_conflict")
    # The original payload again: the decision, repeated.
    again = client.result(client.post("dep-1", deposit(100), kind="deposit"))
    assert (again["outcome"], again["reason"], again["duplicate"]) == ("accepted", None, True)
    # A reader that keeps the latest result per key still sees the decision.
    latest = {}
    for r in read_topic(settings, "results"):
        latest[r.key] = r.value
    assert latest[b"reuse/dep-1"]["outcome"] == "accepted"
    assert latest[b"reuse/dep-1#id_conflict"]["reason"] == "id_conflict"
    client.close()


def test_no_broker_fails_fast_with_one_line():
    settings = Settings(bootstrap="127.0.0.1:1", prefix="nobroker.", connect_timeout_s=1.0)
    with pytest.raises(BrokerUnreachable, match="cannot reach Kafka at 127.0.0.1:1"):
        LedgerClient(settings, "c")
    env = {**os.environ, "KAFKA_BOOTSTRAP": "127.0.0.1:1", "LEDGER_CONNECT_TIMEOUT_S": "1"}
    for args in (["open", "user:1:USD", "USD"], ["verify"], ["topics", "create"], ["tail"], ["worker"],
                 ["submit", str(ROOT / "examples/commands.jsonl")], ["rebuild-balances"], ["loadgen", "--count", "1"]):
        done = subprocess.run([sys.executable, "-m", "connectors.cli", *args], capture_output=True, text=True,
                              env=env, cwd=ROOT, timeout=120)
        assert done.returncode == BrokerUnreachable.EXIT_STATUS, (args, done.stdout, done.stderr)
        assert done.stderr.strip().splitlines()[-1:] == ["error: cannot reach Kafka at 127.0.0.1:1 within 1 s "
                                                         "(Failed to get metadata: Local: Broker transport failure)"], \
            (args, done.stderr)
        assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) <= 2, (args, done.stderr)


def test_a_topic_the_cluster_does_not_know_is_not_called_unreachable(kafka_bootstrap):
    """The cluster answers but does not know the results topic (not created, or created a moment ago and not
    known to the broker asked yet): the client waits for it within its connect timeout, then says so, not
    "cannot reach Kafka"; the CLI ends with the same line and EX_UNAVAILABLE."""
    prefix = f"absent{uuid.uuid4().hex[:8]}."
    settings = Settings(bootstrap=kafka_bootstrap, prefix=prefix, connect_timeout_s=2.0)
    with pytest.raises(TopicNotReady, match=rf"answers, but within 2 s it did not serve {prefix}results\[0\]: "
                                            r"the topic is not known to the cluster yet"):
        LedgerClient(settings, "c")
    env = {**os.environ, "KAFKA_BOOTSTRAP": kafka_bootstrap, "LEDGER_TOPIC_PREFIX": prefix,
           "LEDGER_CONNECT_TIMEOUT_S": "2"}
    done = subprocess.run([sys.executable, "-m", "connectors.cli", "open", "user:1:USD", "USD"], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=120)
    assert done.returncode == TopicNotReady.EXIT_STATUS, (done.stdout, done.stderr)
    assert "the topic is not known to the cluster yet" in done.stderr and "Traceback" not in done.stderr, \
        done.stderr


def test_a_bad_setting_is_one_line_not_a_traceback():
    env = {**os.environ, "LEDGER_PARTITIONS": "eight"}
    done = subprocess.run([sys.executable, "-m", "connectors.cli", "verify"], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=60)
    assert done.returncode == 2 and done.stderr.strip() == "error: LEDGER_PARTITIONS='eight' is not an integer"


def test_tail_skips_what_it_cannot_read(settings, start_worker):
    start_worker()
    client = LedgerClient(settings, "tailed")
    foreign_records_on_results(settings)
    client.result(client.open_account("user:ida:USD", "USD"))
    env = {**os.environ, "KAFKA_BOOTSTRAP": settings.bootstrap, "LEDGER_TOPIC_PREFIX": settings.prefix}
    tail = subprocess.Popen([sys.executable, "-m", "connectors.cli", "tail", "--from-start"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    errors: list[str] = []
    readers = [threading.Thread(target=lambda: lines.extend(tail.stdout), daemon=True),
               threading.Thread(target=lambda: errors.extend(tail.stderr), daemon=True)]
    for reader in readers:
        reader.start()
    try:
        # Until the answer and a skip per partition are shown: tail reads the partitions side by side, so the
        # answer can come before another partition's foreign record.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (
                any("tailed/open:user:ida:USD: accepted" in line for line in lines)
                and sum("skipped an unreadable record" in line for line in errors) >= settings.partitions):
            time.sleep(0.2)
        tail.send_signal(signal.SIGINT)
        tail.wait(30)
        for reader in readers:
            reader.join(10)
    finally:
        tail.kill()  # never left running past the test, whatever failed
    out, err = "".join(lines), "".join(errors)
    assert "tailed/open:user:ida:USD: accepted" in out, (out, err)
    assert err.count("skipped an unreadable record") == settings.partitions, err
    assert "Traceback" not in err
    client.close()


def test_a_command_the_cluster_refuses_is_named_not_dropped(settings):
    """A record the broker will not take (here: timestamped two hours ahead, past the broker's
    log.message.timestamp.after.max.ms) never reaches the log; the sender is told which command and why instead
    of waiting out a timeout for a result that cannot come."""
    from connectors.client import CommandsNotDelivered

    client = LedgerClient(settings, "far-ahead")
    record = {"command_id": "open:late", "client_id": "far-ahead", "body": ("ledger.OpenAccount", {
        "account_id": "user:late:USD", "currency": "USD", "allow_negative": False, "overdraft_limit": "0",
        "max_balance": None, "routing_key": None})}
    client.send_dated(record, "user:late:USD", int(time.time() * 1000) + 2 * 3600 * 1000)
    with pytest.raises(CommandsNotDelivered) as refused:
        client.wait(["open:late"], 60)
    assert list(refused.value.failures) == ["open:late"], refused.value.failures
    assert "timestamp" in refused.value.failures["open:late"].lower(), refused.value.failures
    client.open_account("user:ok:USD", "USD")  # the client goes on: the next command is sent and answered
    client.flush()
    client.close()
