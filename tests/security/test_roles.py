"""The ACL model on a secured broker: every role can do what it may, each forbidden action fails with the
broker's authorization error and changes nothing, and the books still verify afterwards.

One worker (principal `worker`, SASL_SSL through Faust) serves the whole module; tests run in file order and the
last one runs `ledger verify` as the auditor.
"""
from __future__ import annotations

import asyncio
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from connectors.client import LedgerClient, Leg, ResultsNotAuthorized
from projections.topics import latest_per_account, read_topic
from streams import kafka_security
from streams.engine import transactional_id
from tests.security.conftest import ledger_cli

USERS = ("user:ann:USD", "user:bob:USD")


def _committed_keys(settings, topic: str) -> set[bytes]:
    """Every key a read_committed reader finds in the topic (read as a principal that may)."""
    consumer = Consumer({**settings.kafka_config(), "group.id": f"quiescent-{uuid.uuid4()}",
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         "enable.partition.eof": True})
    keys: set[bytes] = set()
    try:
        parts = range(settings.partitions)
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        open_ = set(parts)
        while open_:
            for msg in consumer.consume(500, timeout=1.0):
                if msg.error() is None:
                    keys.add(msg.key())
                elif msg.error().code() == KafkaError._PARTITION_EOF:
                    open_.discard(msg.partition())
                else:
                    raise KafkaException(msg.error())
    finally:
        consumer.close()
    return keys


def _read_error(settings, topic: str, group: str | None = None) -> KafkaError | None:
    """The error a consumer of this principal gets subscribing to the topic (None if it may read it)."""
    consumer = Consumer({**settings.kafka_config(), "group.id": group or f"client-{uuid.uuid4()}",
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         "auto.offset.reset": "earliest"})
    try:
        consumer.subscribe([topic])
        for _ in range(30):
            for msg in consumer.consume(10, timeout=1.0):
                if msg.error() is not None and msg.error().code() != KafkaError._PARTITION_EOF:
                    return msg.error()
                if msg.error() is None or msg.error().code() == KafkaError._PARTITION_EOF:
                    return None
        return None
    finally:
        consumer.close()


def _produce_error(settings, topic: str, key: bytes) -> KafkaError | None:
    errors: list = []
    producer = Producer({**settings.kafka_config(), "message.timeout.ms": 20000})
    producer.produce(topic, b"forged", key, partition=0, on_delivery=lambda err, msg: errors.append(err))
    producer.flush(30)
    assert errors, "no delivery report"
    return errors[0]


def test_a_producer_sends_commands_and_reads_its_own_results(secured_ledger, as_principal):
    settings = as_principal("app-a")
    client = LedgerClient(settings, "app-a")
    assert client.results_topic == settings.client_results_topic("app-a")
    ids = [client.open_account(a, "USD") for a in USERS]
    ids.append(client.post("dep-ann", [Leg("sys:world:USD", -10_000), Leg("user:ann:USD", 10_000)], kind="deposit"))
    ids.append(client.post("ann-bob", [Leg("user:ann:USD", -2_500), Leg("user:bob:USD", 2_500)]))
    results = client.wait(ids, timeout_s=180)
    assert [results[i]["outcome"] for i in ids] == ["accepted"] * 4
    client.close()


def test_a_client_over_mtls_reads_its_own_results(secured_ledger, as_principal):
    settings = as_principal("app-b", mtls=True)
    assert settings.security["security.protocol"] == "SSL"
    client = LedgerClient(settings, "app-b")
    assert client.results_topic == settings.client_results_topic("app-b")
    ids = [client.open_account("user:cat:USD", "USD"),
           client.post("dep-cat", [Leg("sys:world:USD", -700), Leg("user:cat:USD", 700)], kind="deposit")]
    results = client.wait(ids, timeout_s=180)
    assert [results[i]["outcome"] for i in ids] == ["accepted"] * 2
    client.close()


def test_each_clients_topic_holds_only_its_results_and_the_shared_topic_all(secured_ledger, as_principal):
    admin = as_principal("admin")
    mine = _committed_keys(admin, admin.client_results_topic("app-a"))
    theirs = _committed_keys(admin, admin.client_results_topic("app-b"))
    shared = _committed_keys(admin, admin.topic("results"))
    assert mine and all(k.startswith(b"app-a/") for k in mine)
    assert theirs and all(k.startswith(b"app-b/") for k in theirs)
    assert mine | theirs <= shared


def test_a_reader_reads_balances_and_history(secured_ledger, as_principal):
    reader = as_principal("reader")
    balances = {a: r.value for a, r in latest_per_account(read_topic(reader, "balances")).items()}
    assert balances["user:ann:USD"]["posted"] == "7500"
    assert balances["user:bob:USD"]["posted"] == "2500"
    history = [r.value for r in read_topic(reader, "history") if r.value["account_id"] == "user:ann:USD"]
    assert [h["posted_after"] for h in history] == ["0", "10000", "7500"]


@pytest.mark.parametrize("principal,topic", [("app-a", "history"), ("app-a", "changelog"), ("app-a", "balances"),
                                             ("app-a", "results"), ("reader", "balances"), ("reader", "commands")])
def test_writing_an_output_is_refused_and_changes_nothing(secured_ledger, as_principal, principal, topic):
    settings = as_principal(principal)
    key = f"forged-{uuid.uuid4()}".encode()
    error = _produce_error(settings, settings.topic(topic), key)
    assert error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, error
    assert key not in _committed_keys(as_principal("admin"), settings.topic(topic))


def test_a_producer_cannot_read_another_clients_results_nor_the_shared_ones(secured_ledger, as_principal):
    settings = as_principal("app-a")
    for topic in (settings.client_results_topic("app-b"), settings.topic("results"), settings.topic("commands")):
        error = _read_error(settings, topic)
        assert error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, (topic, error)
    with pytest.raises(ResultsNotAuthorized, match="not authorized to read"):
        LedgerClient(settings, "app-b")  # claiming another client id does not open its results


def test_a_producer_can_neither_join_the_workers_group_nor_take_their_transactional_ids(secured_ledger,
                                                                                           as_principal):
    settings = as_principal("app-a")
    error = _read_error(settings, settings.topic("commands"), group=f"{settings.prefix}workers")
    assert error is not None and error.code() in (KafkaError.GROUP_AUTHORIZATION_FAILED,
                                                  KafkaError.TOPIC_AUTHORIZATION_FAILED), error
    thief = Producer({**settings.kafka_config(), "transactional.id": transactional_id(settings, 0)})
    with pytest.raises(KafkaException) as refused:
        thief.init_transactions(30)  # would fence the worker of partition 0 if it were allowed
    assert refused.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    # The worker was not fenced: it still decides app-a's commands.
    client = LedgerClient(settings, "app-a")
    assert client.wait([client.post("after-thief", [Leg("user:bob:USD", -1), Leg("user:ann:USD", 1)])],
                       timeout_s=180)["after-thief"]["outcome"] == "accepted"
    client.close()


def test_a_worker_with_a_wrong_password_is_refused(secured_ledger, as_principal):
    env = {**as_principal.env("worker"), "KAFKA_SASL_PASSWORD": "wrong", "LEDGER_CONNECT_TIMEOUT_S": "5"}
    worker = ledger_cli(env, "worker")
    assert worker.returncode == 69, worker.stderr
    assert "authentication failed" in worker.stderr, worker.stderr
    # Faust's own consumer (aiokafka), given the same settings, cannot connect either (aiokafka reports only
    # that it could not bootstrap; the process above has already said why).
    settings = as_principal("worker", KAFKA_SASL_PASSWORD="wrong")
    with pytest.raises(Exception):
        asyncio.run(_aiokafka_topics(settings))


@pytest.mark.parametrize("mtls", [False, True], ids=["scram", "mtls"])
def test_the_faust_consumer_authenticates_like_every_other_client(secured_ledger, as_principal, mtls):
    settings = as_principal("worker", mtls=mtls)
    topics = asyncio.run(_aiokafka_topics(settings))
    assert settings.topic("commands") in topics
    assert settings.client_results_topic("app-a") in topics  # DESCRIBE: it writes there
    assert settings.topic("balances") in topics


async def _aiokafka_topics(settings) -> set[str]:
    from aiokafka import AIOKafkaConsumer
    from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

    auth = credentials_to_aiokafka_auth(kafka_security.faust_credentials(settings.security))
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.bootstrap, request_timeout_ms=15000, **auth)
    try:
        await consumer.start()
        return await consumer.topics()
    finally:
        await consumer.stop()


def test_verify_holds_afterwards_as_the_auditor(secured_ledger, as_principal):
    assert secured_ledger.alive and not secured_ledger.crashed(), secured_ledger.tail()
    verified = ledger_cli(as_principal.env("auditor"), "verify", "--wait", "60")
    assert verified.returncode == 0, verified.stdout + verified.stderr
