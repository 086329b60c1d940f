"""What falls due by log time: one index for the partition's hold expiries and its copies' waits.

Both are checked before every command (streams/partition.py, expire_due), so the check must look at the earliest
due time only, and both change as commands are decided (a hold ends, a copy is confirmed). So: a map of each live
item to its due time, and a heap by due time whose entries that are no longer live (ended, or due at another time
since) are skipped when they come up, and thrown away when they outnumber the live ones.
"""
from __future__ import annotations

import heapq
from typing import Iterable


class DueIndex:
    """Items (hold ids, transaction keys) by due time in ms of log time."""

    def __init__(self, pairs: Iterable[tuple[str, int]] = ()):
        self.live: dict[str, int] = dict(pairs)  # item -> due time
        self._heap: list[tuple[int, str]] = []
        self._rebuild()

    def _rebuild(self) -> None:
        self._heap = [(due, item) for item, due in self.live.items()]
        heapq.heapify(self._heap)

    def _compact(self) -> None:
        if len(self._heap) > 2 * len(self.live) + 64:  # mostly entries ended or indexed again since: rebuilt
            self._rebuild()

    def put(self, item: str, due: int) -> None:
        """Index item at due (again: an item taken while it could not be acted on comes up once more)."""
        self.live[item] = due
        heapq.heappush(self._heap, (due, item))
        self._compact()

    def drop(self, item: str, due: int | None = None) -> None:
        """The item is no longer due (only if it was due at `due`, when given)."""
        if item in self.live and (due is None or self.live[item] == due):
            del self.live[item]
            self._compact()

    def get(self, item: str) -> int | None:
        return self.live.get(item)

    def take_due(self, now_ms: int) -> list[tuple[int, str]]:
        """(due, item) of the live items due by now_ms, earliest first, each once: taken off the heap (the item
        stays live until dropped, and put again comes up again). Looks at the earliest only when none is due."""
        heap, live, due = self._heap, self.live, []
        while heap and heap[0][0] <= now_ms:
            entry = heapq.heappop(heap)
            if live.get(entry[1]) == entry[0] and (not due or due[-1] != entry):
                due.append(entry)
        return due

    def due_by(self, now_ms: int) -> bool:
        """Whether an entry is due by now_ms (one ended since counts too: the caller's check skips it). Safe to ask
        from another thread while the index changes: one slice, never an index into a heap being popped."""
        first = self._heap[:1]
        return bool(first) and first[0][0] <= now_ms

    def __len__(self) -> int:
        return len(self.live)

    @property
    def queued(self) -> int:
        """Entries on the heap, live or stale: what the index holds in memory (at most about twice the live)."""
        return len(self._heap)
