"""The background drift check: every published balance equals the fold of its account's history (P7, P2).

`ledger verify` and `rebuild-balances` prove it over whole topics at a quiescent point; this checks it
continuously in the read API's process, over the read store, a slice of accounts at a time, so an operator
hears of a drifting account (a worker bug, a corrupted store, a hand-edited topic) while the ledger runs.

A balance row says: "after the entry of seq s, the account is (posted, held, status, ...)". The check folds the
account's journal up to seq s (projections.fold, the same fold the oracles and rebuild-balances use) and
compares the balance record it gives with the row. The projector applies balances and history as separate
topics, so a row may be ahead of its history in the store for a moment: such an account is not judged on that
pass (counted as `behind`), never called drifting. Each account's verified fold is remembered (seq and
state), so the next pass folds only the entries after it: after the first pass, a pass costs the new
entries, not the whole history.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from projections.fold import Balance, step
from projections.store import Store

log = logging.getLogger("ledger.drift")

CHECK_EVERY_S = 5.0  # between two slices
SLICE = 500  # accounts per slice
COMPARED = ("currency", "status", "posted", "held", "available", "seq", "last_transaction_id", "updated_at_ms")


@dataclass
class Drift:
    account_id: str
    field: str
    published: Any
    folded: Any

    def as_dict(self) -> dict[str, Any]:
        return {"account_id": self.account_id, "field": self.field, "published": str(self.published),
                "folded": str(self.folded)}


@dataclass
class DriftChecker:
    """Walks the store's balance rows in id order, SLICE at a time, wrapping around: a pass is one walk."""

    slice_size: int = SLICE
    folded: dict[str, Balance] = field(default_factory=dict)  # the last verified fold of each account
    cursor: str = ""  # the last account id checked in the current pass
    passes: int = 0  # complete passes
    checked: int = 0  # account checks made (all passes)
    pass_drifts: dict[str, Drift] = field(default_factory=dict)  # found in the current pass so far
    drifts: dict[str, Drift] = field(default_factory=dict)  # found in the last complete pass
    behind: int = 0  # accounts skipped in the last complete pass (history not yet projected to their seq)
    _pass_behind: int = 0
    last_pass_at: float | None = None  # wall clock, seconds
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def check_slice(self, store: Store) -> int:
        """Check the next slice of accounts; returns how many were checked."""
        rows = store.balance_rows(self.cursor, self.slice_size)
        for row in rows:
            self._check(store, row)
        with self._lock:
            self.checked += len(rows)
            if len(rows) < self.slice_size:  # the walk reached the end: a pass is complete
                self.passes += 1
                self.drifts, self.pass_drifts = self.pass_drifts, {}
                self.behind, self._pass_behind = self._pass_behind, 0
                self.cursor = ""
                self.last_pass_at = time.time()
            else:
                self.cursor = rows[-1]["account_id"]
        return len(rows)

    def check_all(self, store: Store) -> None:
        """One complete pass from wherever the walk stands (tests, `ledger` commands)."""
        passes = self.passes
        while self.passes == passes:
            self.check_slice(store)

    def _check(self, store: Store, row) -> None:
        account_id, seq = row["account_id"], row["seq"]
        known = self.folded.get(account_id)
        if known is not None and known.seq > seq:
            known = None  # the store was rebuilt under us: fold from the start
        state = known
        entries = store.journal(account_id, known.seq if known else 0, seq)
        for entry in entries:
            state = step(state, _as_entry(entry))
        if state is None or state.seq != seq:
            self._pass_behind += 1  # the history of this seq is not in the store yet
            return
        published = {k: row[k] for k in COMPARED}
        for k in ("posted", "held", "available"):
            published[k] = int(published[k])
        folded = state.record()
        for k in ("posted", "held", "available"):
            folded[k] = int(folded[k])
        for k in COMPARED:
            if published[k] != folded[k]:
                drift = Drift(account_id, k, published[k], folded[k])
                if account_id not in self.drifts:
                    log.error("balance drift: %s %s is %s on the balances topic, %s by the fold of its history",
                              account_id, k, published[k], folded[k], extra={"account_id": account_id,
                                                                              "field": k})
                self.pass_drifts[account_id] = drift
                self.folded.pop(account_id, None)
                return
        self.folded[account_id] = state

    def report(self) -> dict[str, Any]:
        with self._lock:
            return {"passes": self.passes, "checked": self.checked, "behind": self.behind,
                    "last_pass_at": self.last_pass_at,
                    "drifting": [d.as_dict() for _, d in sorted(self.drifts.items())]}


def _as_entry(row) -> dict[str, Any]:
    """A history row of the store as the fold takes entries: a mapping, its metadata decoded (a JSON text
    column in the store, a map on the wire)."""
    entry = dict(row)
    if isinstance(entry.get("metadata"), str):
        entry["metadata"] = json.loads(entry["metadata"])
    return entry


def run(checker: DriftChecker, target: str, stop: threading.Event, every_s: float = CHECK_EVERY_S) -> None:
    """The checker's thread: a slice every `every_s` (at once again while a pass has more to do) until stop."""
    store = Store(target, readonly=True)
    try:
        while not stop.is_set():
            try:
                full = checker.check_slice(store) == checker.slice_size
            except Exception:  # the database went away for a moment: try again later
                log.exception("drift check failed; retrying")
                full = False
            stop.wait(0.05 if full else every_s)
    finally:
        store.close()
