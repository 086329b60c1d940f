"""The commands waiting for transactions in flight (streams/spanning.py, "Order across partitions" in
docs/engine.md), indexed in memory.

Each waiting command is one engine record ``wq/<seq, 20 digits>``, written by the StateChange that queues it and
deleted by the one that takes it off, so queueing and waking cost one small record each whatever the queue's
length. seq orders the queue (arrival order): a new entry takes one more than the highest waiting, a function
of the state, so a redo or a replay numbers it the same. (Earlier versions kept the whole queue in one record
``w``, rewritten by every wait and every wake and read whole by every command: its cost grew with the queue.
That record is still read until it empties.)

The partition state keeps the entries in arrival order and counts what they hold back (their keys, see
Spanning._keys), so asking whether a command names something a waiting command holds is a look-up per key.
"""
from __future__ import annotations

from typing import Any, Iterable

WAITING_ENTRY = "wq/"


def waiting_key(seq: int) -> str:
    """The engine record key of the waiting command numbered seq."""
    return f"{WAITING_ENTRY}{seq:020d}"


def parse_waiting_key(record_key: str) -> int:
    return int(record_key[len(WAITING_ENTRY):])


class WaitingIndex:
    """Waiting entries ({"keys", "command", "at_ms"}) by seq, in arrival order, with the count of waiting
    entries holding each key."""

    def __init__(self, pairs: Iterable[tuple[int, dict[str, Any]]] = ()):
        self.entries: dict[int, dict[str, Any]] = {}
        self.held: dict[str, int] = {}
        for seq, entry in sorted(pairs, key=lambda pair: pair[0]):
            self.put(seq, entry)

    def put(self, seq: int, entry: dict[str, Any]) -> None:
        self.drop(seq)
        last = next(reversed(self.entries), -1)
        self.entries[seq] = entry
        if seq < last:  # only when staged writes are loaded over the store's: kept in seq order
            self.entries = dict(sorted(self.entries.items()))
        held = self.held
        for key in entry["keys"]:
            held[key] = held.get(key, 0) + 1

    def drop(self, seq: int) -> None:
        entry = self.entries.pop(seq, None)
        if entry is None:
            return
        held = self.held
        for key in entry["keys"]:
            left = held[key] - 1
            if left:
                held[key] = left
            else:
                del held[key]

    def next_seq(self) -> int:
        return next(reversed(self.entries), -1) + 1

    def holds_any(self, keys: Iterable[str]) -> bool:
        held = self.held
        return any(key in held for key in keys)

    def __len__(self) -> int:
        return len(self.entries)
