"""Which Kafka errors pass on their own, and asking again until they do (or a deadline passes).

confluent-kafka's `KafkaError.retriable()` is set only for errors librdkafka hands over as error objects
(transactions, the admin API). An error raised from a plain call (`get_watermark_offsets`, `committed`,
`list_topics`) is built from its code alone and says `retriable() == False` whatever the code: after a broker
fault a reader gets NOT_LEADER_FOR_PARTITION or NOT_COORDINATOR "not retriable" for as long as leadership
moves. So the code decides here.
"""
from __future__ import annotations

import time
from typing import Callable, TypeVar

from confluent_kafka import KafkaError, KafkaException

T = TypeVar("T")

# The cluster answers, but a partition's leader or a group's coordinator is moving or not elected yet: the
# same question gets an answer later.
SETTLING = frozenset({
    KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, KafkaError.REPLICA_NOT_AVAILABLE,
    KafkaError.FENCED_LEADER_EPOCH, KafkaError.UNKNOWN_LEADER_EPOCH, KafkaError.OFFSET_NOT_AVAILABLE,
    KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError._WAIT_COORD, KafkaError.KAFKA_STORAGE_ERROR,
})
# The broker asked does not know the topic or partition: a topic created a moment ago whose metadata has not
# spread yet, or one that does not exist (librdkafka answers both at once with the same code). Not in
# `passing`: a reader of a missing topic must not wait; a new client waits for it within its connect timeout.
NOT_KNOWN_YET = frozenset({KafkaError._UNKNOWN_PARTITION, KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC})
# No answer in time: a broker paused, restarting or unreachable for now.
SILENT = frozenset({
    KafkaError._TIMED_OUT, KafkaError.REQUEST_TIMED_OUT, KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN,
    KafkaError.NETWORK_EXCEPTION,
})
# How long a reader of the ledger's topics keeps asking through such errors (a paused or restarted broker's
# partitions moved back and forth for over two minutes on a loaded 3-node cluster).
SETTLE_WAIT_S = 180.0


def error_of(exc: BaseException) -> KafkaError | None:
    """The KafkaError an exception carries (a KafkaException's first argument), else None."""
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return exc.args[0]
    return None


def passing(error: KafkaError) -> bool:
    """Whether asking the same question again later can succeed: a settling cluster, a silent broker, or an
    error librdkafka itself marks retriable (and not fatal)."""
    if error.fatal():
        return False
    return error.code() in SETTLING or error.code() in SILENT or error.retriable()


def asking_again(call: Callable[[], T], deadline: float, pause_s: float = 0.5,
                 on_error: Callable[[KafkaError], None] | None = None) -> T:
    """call(), asked again after an error that passes (see passing) until the monotonic deadline; then the last
    such error is raised. Any other error is raised at once. on_error(error): each error that passes."""
    while True:
        try:
            return call()
        except KafkaException as exc:
            error = error_of(exc)
            if error is None or not passing(error) or time.monotonic() + pause_s > deadline:
                raise
            if on_error is not None:
                on_error(error)
            time.sleep(pause_s)


def timeout_within(deadline: float, cap_s: float, floor_s: float = 0.1) -> float:
    """A single call's timeout: at most cap_s, never past the deadline (floor_s at the least)."""
    return max(floor_s, min(cap_s, deadline - time.monotonic()))
