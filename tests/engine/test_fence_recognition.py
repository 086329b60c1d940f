"""A fence is recognised however confluent-kafka hands it back, from whichever call of steps 3-4 (broker-free).

A fatal error (the fence) raised from inside Producer.flush() comes out wrapped in a SystemError when
librdkafka logs a line in the same call: the Python log callback runs with the KafkaException pending and
CPython reports "<built-in method flush ...> returned a result with an exception set", the KafkaException as
its __cause__. The commit path must still name it a fence and end the batch unacknowledged (DeliveryFailed),
not crash with a SystemError."""
from __future__ import annotations

import logging

import pytest
from confluent_kafka import KafkaError, KafkaException

from streams.config import Settings
from streams.engine import DeliveryFailed, Engine

NO_BROKER = Settings(bootstrap="127.0.0.1:1", prefix="unit.", security={"log_level": "0"})
FENCED = "Failed to flush: Local: This instance has been fenced by a newer instance"


def _fence() -> KafkaException:
    return KafkaException(KafkaError(KafkaError._FENCED, FENCED, fatal=True))


def _wrapped(cause: BaseException | None) -> SystemError:
    """A SystemError as CPython makes it when a C function returns with an exception set (its __cause__)."""
    try:
        raise SystemError("<built-in method flush of cimpl.Producer object at 0x7f00> returned a result with an "
                          "exception set") from cause
    except SystemError as exc:
        return exc


def _commit_raising(tmp_path, exc: BaseException) -> Engine:
    eng = Engine(NO_BROKER, tmp_path)

    def commit_transaction(changelogs, upto, last):
        raise exc

    eng._commit_transaction = commit_transaction  # the Kafka side: what flush() raised
    return eng


def _step_4(eng: Engine) -> None:
    """Step 4 of a batch of partition 3, as Engine.commit runs it."""
    with eng._failing_as_delivery([3]):
        eng._commit_transaction({3: []}, {3: 10}, {})


@pytest.mark.parametrize("raised", [_fence(), _wrapped(_fence())], ids=["plain", "wrapped-in-SystemError"])
def test_a_fence_ends_the_batch_unacknowledged(tmp_path, caplog, raised):
    eng = _commit_raising(tmp_path, raised)
    with caplog.at_level(logging.WARNING), pytest.raises(DeliveryFailed, match=r"partitions \[3\]: transaction failed"):
        _step_4(eng)
    assert any("transaction fenced" in r.getMessage() for r in caplog.records), caplog.text


@pytest.mark.parametrize("code", [KafkaError.ILLEGAL_GENERATION, KafkaError.UNKNOWN_MEMBER_ID])
def test_offsets_refused_for_an_out_of_date_membership_are_a_fence(tmp_path, caplog, code):
    """The group coordinator refuses the transaction's commands offsets from a worker that lost its partitions
    (a later generation, or no longer a member): an abortable error of send_offsets_to_transaction, named a
    fence, and the batch ends unacknowledged."""
    refused = KafkaException(KafkaError(code, "Failed to commit offsets to transaction: Broker: Specified group "
                                              "generation id is not valid", txn_requires_abort=True))
    eng = _commit_raising(tmp_path, refused)
    with caplog.at_level(logging.WARNING), pytest.raises(DeliveryFailed, match=r"partitions \[3\]"):
        _step_4(eng)
    assert any("partition 3: transaction fenced" in r.getMessage() for r in caplog.records), caplog.text


def test_a_system_error_without_a_kafka_cause_is_not_taken_for_a_fence(tmp_path):
    eng = _commit_raising(tmp_path, _wrapped(None))
    with pytest.raises(SystemError):
        _step_4(eng)


def test_a_send_refused_after_the_producer_became_fatal_is_named_by_the_fatal_error_it_reported(tmp_path, caplog):
    """A producer fenced in an earlier call refuses every later send with a bare _FATAL ("Unable to produce
    message: Local: Fatal error"); the fence it reported then (error_cb) names it."""
    bare = KafkaException(KafkaError(KafkaError._FATAL, "Unable to produce message: Local: Fatal error", fatal=True))
    eng = _commit_raising(tmp_path, bare)
    eng._fatal["error"] = KafkaError(KafkaError._FATAL, "Fatal error: Local: This instance has been fenced by a newer "
                                                  "instance: Producer fenced", fatal=True)
    with caplog.at_level(logging.WARNING), pytest.raises(DeliveryFailed, match=r"partitions \[3\]: transaction failed"):
        _step_4(eng)
    assert any("transaction fenced" in r.getMessage() for r in caplog.records), caplog.text
    # Without such a report, a bare _FATAL is not taken for a fence.
    caplog.clear()
    eng._fatal.clear()
    with caplog.at_level(logging.WARNING), pytest.raises(DeliveryFailed):
        _step_4(eng)
    assert not any("transaction fenced" in r.getMessage() for r in caplog.records)


class _FencedWhileSending:
    """A transactional producer fenced after its transaction began: every send is refused with the fence, as
    librdkafka refuses them once another worker has the partition's transactional id."""

    def __init__(self):
        self.sent = 0

    def begin_transaction(self):
        pass

    def produce(self, *args, **kwargs):
        self.sent += 1
        raise _fence()

    def __len__(self):
        return 0


@pytest.mark.parametrize("snapshot_due", [True, False], ids=["sending-a-snapshot", "sending-outputs"])
def test_a_fence_while_step_3_sends_ends_the_batch_unacknowledged(tmp_path, caplog, monkeypatch, snapshot_due):
    """Step 3 sends a snapshot's chunks and the batch's outputs into the open transaction; a fence refusing
    those sends is named and ends the batch like one at the commit, not as a bare KafkaException."""
    from streams import engine as engine_module
    monkeypatch.setattr(engine_module, "SNAPSHOT_EVERY", 1 if snapshot_due else 0)
    eng = Engine(NO_BROKER, tmp_path)
    proc = eng.processor(3)
    proc.state.store.write({b"a/x": b"{}"}, set())  # something to snapshot
    proc.dead_letter(0, 0, b"k", b"\x00", "undecodable", "a record to send")  # an output
    producer = eng.producer = _FencedWhileSending()
    with caplog.at_level(logging.WARNING), pytest.raises(DeliveryFailed, match=r"partitions \[3\]: transaction failed"):
        eng.commit({3: 5}, {3: 1})
    assert producer.sent == 1
    assert any("transaction fenced" in r.getMessage() for r in caplog.records), caplog.text


def test_a_send_refused_before_the_fence_was_reported_is_named_by_it_once_served(tmp_path, caplog):
    """The producer turned fatal in librdkafka's thread and refused the send with a bare _FATAL before any poll
    served its error callback (a paused worker woken after the survivor fenced it): the callback is served
    then, and the fence it reports names the failure."""
    bare = KafkaException(KafkaError(KafkaError._FATAL, "Unable to produce message: Local: Fatal error", fatal=True))
    eng = _commit_raising(tmp_path, bare)
    fence = KafkaError(KafkaError._FATAL, "Fatal error: Local: This instance has been fenced by a newer instance",
                       fatal=True)

    class Reporting:
        def poll(self, timeout):  # what the error callback registered by Engine._fence does when served
            eng._fatal["error"] = fence
            return 0

    eng.producer = Reporting()
    with caplog.at_level(logging.WARNING), pytest.raises(DeliveryFailed, match="fenced by a newer instance"):
        _step_4(eng)
    assert any("transaction fenced" in r.getMessage() for r in caplog.records), caplog.text
