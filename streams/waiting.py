"""The commands waiting for transactions in flight (streams/spanning.py, "Order across partitions" in
docs/engine.md), indexed in memory.

Each waiting command is one engine record ``wq/<seq, 20 digits>``, written by the StateChange that queues it and
deleted by the one that takes it off, so queueing and waking cost one small record each whatever the queue's
length. seq orders the queue (arrival order): a new entry takes one more than the highest waiting, a function
of the state, so a redo or a replay numbers it the same. (Earlier versions kept the whole queue in one record
``w``, rewritten by every wait and every wake and read whole by every command: its cost grew with the queue.
That record is still read until it empties.)

The partition state keeps the entries in arrival order and counts what they hold back (their keys, see
Spanning._keys), so asking whether a command names something a waiting command holds is a look-up per key,
and indexes them by when their wait for credits only a producer's copy reserved ends (COPIED_CREDIT_WAIT_MS).
"""
from __future__ import annotations

from typing import Any, Iterable

from streams.due import DueIndex

WAITING_ENTRY = "wq/"
# How long, in log time from its own, a debit waits for credits in flight that only a producer's copy has
# reserved (the copy's coordinator has not begun the transaction). Such a credit depends on a command in
# another partition's log, which may itself wait for this partition: two payments each waiting for the
# other's incoming money would wait for each other until the copies are dropped (COPY_WAIT_MS, minutes).
# A credit the coordinator has begun (its Reserve reserved it) is decided whatever waits anywhere, and is
# waited for without a bound. docs/engine.md, "Order across partitions", step 7.
COPIED_CREDIT_WAIT_MS = 3_000
# The entry field that records, in the queue's own record, that the wait for copied credits is over: set by
# the first command whose log time reaches the entry's time + COPIED_CREDIT_WAIT_MS (Spanning.end_copied_waits),
# so whether a waiting debit still counts copied credits is part of the state, whatever the log time of the
# step that drains it (an engine step carries its transaction's time) and whatever restarts came between.
COPIED_WAIT_OVER = "copied_wait_over"
# Commands that may debit: only they wait for credits (Spanning._awaits_credit), so only they are indexed by
# the end of that wait.
_MAY_DEBIT = ("ledger.PostTransaction", "ledger.PlaceHold")


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
        # Debits still counting copied credits, by the end of that wait (their time + COPIED_CREDIT_WAIT_MS):
        # then it is recorded over and a drain is due (PartitionProcessor.expire_due), and a quiet partition gets
        # a tick (Engine._due).
        self.dues = DueIndex()
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
        if not entry.get(COPIED_WAIT_OVER) and entry["command"]["body"][0] in _MAY_DEBIT:
            self.dues.put(str(seq), entry["at_ms"] + COPIED_CREDIT_WAIT_MS)
        else:
            self.dues.drop(str(seq))

    def drop(self, seq: int) -> None:
        entry = self.entries.pop(seq, None)
        if entry is None:
            return
        self.dues.drop(str(seq))
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
