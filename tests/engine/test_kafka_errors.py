"""Asking Kafka again through errors that pass (streams/kafka_errors.py), broker-free.

confluent-kafka raises the errors of plain calls (get_watermark_offsets, committed, list_topics) as KafkaErrors
built from their code alone, with retriable() False whatever the code; after a broker fault the readers of the
ledger's topics got NOT_LEADER_FOR_PARTITION and NOT_COORDINATOR that way for minutes, and gave up."""
from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from projections.verify import wait_quiescent
from streams.config import Settings
from streams.kafka_errors import asking_again, passing

# An address nobody listens on; librdkafka's connection-refused logs kept quiet.
NO_BROKER = Settings(bootstrap="127.0.0.1:1", prefix="unit.", connect_timeout_s=1.0, security={"log_level": "0"})


def _raised_by_a_plain_call() -> KafkaError:
    consumer = Consumer({**NO_BROKER.kafka_config(), "group.id": "unit"})
    try:
        with pytest.raises(KafkaException) as raised:
            consumer.get_watermark_offsets(TopicPartition("unit.commands", 0), timeout=0.5)
        return raised.value.args[0]
    finally:
        consumer.close()


def test_an_error_of_a_plain_call_passes_by_its_code_not_its_retriable_flag():
    silent = _raised_by_a_plain_call()
    assert not silent.retriable()  # what confluent-kafka says of it
    assert passing(silent)
    # As confluent-kafka builds them from a failed call's code: retriable() False.
    for code in (KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.NOT_COORDINATOR, KafkaError.LEADER_NOT_AVAILABLE,
                 KafkaError.COORDINATOR_LOAD_IN_PROGRESS):
        error = KafkaError(code)
        assert not error.retriable() and passing(error), error.name()
    for code in (KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.GROUP_AUTHORIZATION_FAILED,
                 KafkaError._UNKNOWN_PARTITION):  # (a missing topic: a reader must not wait for it)
        assert not passing(KafkaError(code)), KafkaError(code).name()
    assert not passing(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION, fatal=True))


def test_asking_again_answers_once_leadership_has_settled():
    errors = [KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION), KafkaError(KafkaError.NOT_COORDINATOR)]
    seen = []

    def call():
        if errors:
            raise KafkaException(errors.pop(0))
        return (0, 42)

    assert asking_again(call, time.monotonic() + 60, pause_s=0.01, on_error=seen.append) == (0, 42)
    assert [e.code() for e in seen] == [KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.NOT_COORDINATOR]


def test_asking_again_raises_an_error_that_does_not_pass_at_once():
    calls = []

    def call():
        calls.append(1)
        raise KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))

    with pytest.raises(KafkaException, match="TOPIC_AUTHORIZATION_FAILED"):
        asking_again(call, time.monotonic() + 60, pause_s=0.01)
    assert len(calls) == 1


def test_asking_again_raises_the_last_error_past_its_deadline():
    def call():
        raise KafkaException(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION))

    with pytest.raises(KafkaException, match="NOT_LEADER_FOR_PARTITION"):
        asking_again(call, time.monotonic() + 0.2, pause_s=0.05)


def test_quiescence_asks_again_until_its_deadline_then_says_what_it_saw(capsys):
    """Errors that pass (here: no broker answers) make wait_quiescent look again, not raise; at its deadline
    it answers False and names the last error."""
    assert wait_quiescent(NO_BROKER, timeout_s=3, settle_s=0.5) is False
    said = capsys.readouterr().err
    assert "not quiescent within 3 s" in said and "last Kafka error" in said, said
