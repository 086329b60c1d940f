"""Where the ledger's topics end, per partition, and the transactions that stay open there.

A `read_committed` reader (the read API's projector, replay, `ledger verify`, the workers' restore) reads a
partition up to its last stable offset (LSO): the first record of the earliest transaction still open there.
The high watermark (HWM) is where the log ends. LSO < HWM while a worker's transaction is open, for well under
a second; an LSO below the HWM that does not move is a transaction nobody is finishing, and every reader
stops there, whatever was committed after it. Kafka can leave one so when a broker is killed and loses a
transaction's marker (docs/reliability.md, "Hazards still open"); the transaction's producer heals it with its
next transaction to that partition, or an operator by aborting it (`kafka-transactions.sh`). `ledger verify`
reports it (`open_transactions`), since the oracles it checks would otherwise fail for records they cannot see.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from confluent_kafka import Consumer, TopicPartition

from streams.config import Settings
from streams.kafka_errors import timeout_within

# The topics the ledger's readers read (`ledger verify` among them), and with the workers' changelog (read by
# their restores, and not by every reader's principal: docs/security.md).
READ_TOPICS = ("commands", "results", "history", "balances", "dlq")
TOPICS = READ_TOPICS + ("changelog",)


@dataclass(frozen=True)
class End:
    topic: str  # logical name (settings.topic gives the broker's)
    partition: int
    first: int  # the log start offset
    lso: int  # last stable offset: where a read_committed reader stops
    hwm: int  # high watermark: where the log ends

    @property
    def open(self) -> bool:
        """A transaction is open here (or its marker lost)."""
        return self.lso < self.hwm


@dataclass(frozen=True)
class Unreadable:
    topic: str
    partition: int
    error: str


class Ends:
    """Two consumers that ask the broker where partitions end: one read_committed (the LSO), one
    read_uncommitted (the HWM)."""

    def __init__(self, settings: Settings):
        self.settings = settings
        config = settings.kafka_config()
        self._committed = Consumer({**config, "group.id": f"ends-{uuid.uuid4()}", "isolation.level": "read_committed"})
        self._uncommitted = Consumer({**config, "group.id": f"ends-{uuid.uuid4()}",
                                      "isolation.level": "read_uncommitted"})

    def __enter__(self) -> "Ends":
        return self

    def __exit__(self, *exc) -> None:
        self._committed.close()
        self._uncommitted.close()

    def end(self, topic: str, partition: int, timeout_s: float = 10.0) -> End | Unreadable:
        tp = TopicPartition(self.settings.topic(topic), partition)
        try:
            first, lso = self._committed.get_watermark_offsets(tp, timeout=timeout_s)
            hwm = self._uncommitted.get_watermark_offsets(tp, timeout=timeout_s)[1]
        except Exception as exc:  # noqa: BLE001 - whatever the broker says is reported, not raised
            return Unreadable(topic, partition, str(exc))
        return End(topic, partition, first, lso, hwm)

    def all(self, topics: tuple[str, ...] = TOPICS, deadline: float | None = None) -> list[End | Unreadable]:
        deadline = time.monotonic() + 30 if deadline is None else deadline
        return [self.end(topic, p, timeout_within(deadline, 10))
                for topic in topics for p in range(self.settings.partitions)]


def stuck(ends: Ends, open_ends: list[End], settle_s: float, deadline: float) -> list[End]:
    """Of partitions found with a transaction open, those whose LSO has not moved settle_s later: a worker's
    transaction lasts well under a second, so one that did not move is a transaction nobody is finishing."""
    if not open_ends:
        return []
    time.sleep(settle_s)
    found = []
    for was in open_ends:
        now = ends.end(was.topic, was.partition, timeout_within(deadline, 10))
        if isinstance(now, End) and now.lso == was.lso and now.open:
            found.append(now)
    return found


def open_transactions(settings: Settings, settle_s: float = 5.0, timeout_s: float = 60.0,
                      topics: tuple[str, ...] = READ_TOPICS) -> list[End]:
    """Every partition of the topics where a transaction stays open: the LSO below the HWM and not moved in
    settle_s (only waited for when some partition has a transaction open)."""
    deadline = time.monotonic() + timeout_s
    with Ends(settings) as ends:
        found = [e for e in ends.all(topics, deadline) if isinstance(e, End) and e.open]
        return stuck(ends, found, settle_s, deadline)


def describe(end: End, settle_s: float) -> str:
    return (f"{end.topic}[{end.partition}]: a transaction stays open at offset {end.lso} (the log ends at "
            f"{end.hwm}; the last stable offset did not move in {settle_s:g} s): read_committed readers see "
            f"nothing committed after it")
