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

CHECK_EVERY_S = 5.0  # between two passes
SLICE = 500  # accounts read per query
# The check shares the API's process and its interpreter lock with the requests it serves, so it runs in short
# bursts at a share of a core: a burst holds the lock about BURST_S at most (a request that arrives meanwhile
# waits that long at worst), then the thread sleeps long enough to keep its CPU at CPU_SHARE. Run flat out, the
# first pass over a 1M-entry store took half a core from serving for minutes and a lookup cost the server 3x
# its CPU (docs/read-side.md). A quarter of a core folds about 20,000 entries a second on the benchmark's
# machine (12.7 µs each): a pass keeps up with a ledger writing less than that, and the first pass over 1M
# entries takes about a minute (LedgerDriftCheckStalled waits 15).
BURST_S = 0.002
CPU_SHARE = 0.25
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
    # Balance rows read but not checked yet (a burst checks a few of a slice), and whether that slice was the
    # walk's last: read once per slice, not once per burst.
    _pending: list = field(default_factory=list)
    _last_slice: bool = False

    def check_slice(self, store: Store, budget_s: float | None = None) -> int:
        """Check the rest of the current slice of accounts (the next slice when none is left), or with
        budget_s only as many as fit in about that long (at least one); returns how many were checked."""
        if not self._pending:
            self._pending = list(store.balance_rows(self.cursor, self.slice_size))
            self._last_slice = len(self._pending) < self.slice_size
        rows = self._pending
        until = None if budget_s is None else time.perf_counter() + budget_s
        done = 0
        for row in rows:
            self._check(store, row)
            done += 1
            if until is not None and done < len(rows) and time.perf_counter() >= until:
                break
        last = rows[done - 1]["account_id"] if done else self.cursor
        del rows[:done]
        with self._lock:
            self.checked += done
            if not rows and self._last_slice:  # the walk reached the end: a pass is complete
                self.passes += 1
                self.drifts, self.pass_drifts = self.pass_drifts, {}
                self.behind, self._pass_behind = self._pass_behind, 0
                self.cursor = ""
                self.last_pass_at = time.time()
            else:
                self.cursor = last  # the next slice is read after it
        return done

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


def run(checker: DriftChecker, target: str, stop: threading.Event, every_s: float = CHECK_EVERY_S,
        share: float = CPU_SHARE, burst_s: float = BURST_S) -> None:
    """The checker's thread until stop: bursts of about burst_s, each followed by a sleep that keeps the
    thread's CPU time at `share` of a core while a pass has more to do, and `every_s` between passes."""
    store = Store(target, readonly=True)
    try:
        while not stop.is_set():
            passes = checker.passes
            cpu = time.thread_time()
            try:
                checker.check_slice(store, burst_s)
                more = checker.passes == passes
            except Exception:  # the database went away for a moment: try again later
                log.exception("drift check failed; retrying")
                more = False
            spent = time.thread_time() - cpu
            stop.wait(max(spent * (1 / share - 1), 0.001) if more else every_s)
    finally:
        store.close()
