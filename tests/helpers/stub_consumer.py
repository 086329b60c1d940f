"""A stand-in for confluent-kafka's Consumer and its messages, for the replay loader without a broker
(projections/bulk.load takes its Consumer class from its module, so a test patches it there): what
`consume()` returns, in batches, then the positions at each partition's end."""
from __future__ import annotations

from typing import Any


class Message:
    __slots__ = ("_topic", "_partition", "_offset", "_value", "_error")

    def __init__(self, topic: str, partition: int, offset: int, value: bytes | None, error: Any = None):
        self._topic, self._partition, self._offset, self._value, self._error = topic, partition, offset, value, error

    def error(self) -> Any:
        return self._error

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def value(self) -> bytes | None:
        return self._value


class _Position:
    def __init__(self, topic: str, partition: int, offset: int):
        self.topic, self.partition, self.offset = topic, partition, offset


def consumer_of(messages: list[Message], ends: dict[tuple[str, int], int], batch: int = 10_000) -> type:
    """A Consumer class handing out `messages` in order, at most `batch` per consume(); once all are out, every
    partition's position is its end offset (ends: {(topic, partition): next offset})."""

    class Consumer:
        def __init__(self, _config: dict):
            self.at = 0

        def assign(self, _partitions: list) -> None:
            pass

        def consume(self, n: int, timeout: float = 0) -> list[Message]:
            out = messages[self.at:self.at + min(n, batch)]
            self.at += len(out)
            return out

        def position(self, tps: list) -> list[_Position]:
            done = self.at >= len(messages)
            return [_Position(tp.topic, tp.partition, ends[(tp.topic, tp.partition)] if done else 0) for tp in tps]

        def incremental_unassign(self, _partitions: list) -> None:
            pass

        def close(self) -> None:
            pass

    return Consumer
