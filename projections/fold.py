"""The read side's folds, in one place: history -> balance views, results -> hold states, kinds -> status,
shards -> the reported view of a system account, a transaction's entries and results -> its status.

Pure: no database, no Kafka, no clock. `rebuild-balances` (projections/rebuild.py), the oracles
(projections/verify.py), the read store and its bulk rebuild (projections/store.py, bulk.py), the API, the
drift check, the open-holds listing (connectors/holds.py) and the demo (connectors/demo.py) all call these, so
"the balance history says" and "the state of a hold" mean one thing everywhere.

Records are the decoded wire dicts of the history, balances and results topics (amounts as decimal strings)
or the read store's rows of the same fields.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping

from streams import names, routing
from streams.core.apply import KIND_ACCOUNT_OPENED, KIND_STATUS
from streams.core.accounting import ACCOUNT_TYPE_KEY, default_account_type

# The account status a history entry's kind sets; every other kind (a leg, a hold change) leaves it.
STATUS_OF_KIND = {KIND_ACCOUNT_OPENED: "open", **{kind: status.value for status, kind in KIND_STATUS.items()}}


# --- what a fold needs of a record -----------------------------------------------------------------------------
# The amounts each topic's records carry as decimal strings, which the folds add up. The workers write them
# with str(int); a record whose amount is no integer at all (a corrupt or forged record on a ledger topic)
# cannot be folded, so the projector and a rebuild skip it and count it, as they skip a record that does not
# decode, instead of failing on it again at every restart.
AMOUNT_FIELDS = {"history": ("amount", "posted_after", "held_after"), "balances": ("posted", "held", "available")}
HOLD_AMOUNT_FIELDS = ("amount", "captured", "released")


def unfoldable(topic: str, record: Mapping[str, Any]) -> str | None:
    """Why a decoded record of the history, balances or results topic cannot be folded (None: it can)."""
    values = [(name, record[name]) for name in AMOUNT_FIELDS.get(topic, ())]
    if topic == "results":
        values += [(f"holds[{i}].{name}", hold[name]) for i, hold in enumerate(record["holds"])
                   for name in HOLD_AMOUNT_FIELDS]
    for name, value in values:
        try:
            int(value)
        except (TypeError, ValueError):
            return f"{name} {str(value)[:40]!r} is not an integer"
    return None


# --- history -> balance views -------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Balance:
    """An account as its journal says it is after some entry: posted is the sum of the amounts so far (the
    fold P2 and P3 speak of), held the held_after of the last entry, status from the status-changing kinds."""

    account_id: str
    currency: str
    status: str
    posted: int
    held: int
    seq: int
    last_transaction_id: str | None
    updated_at_ms: int
    account_type: str  # recorded on its account_opened entry; by its name when the entry predates types

    @property
    def available(self) -> int:
        return self.posted - self.held

    def record(self) -> dict[str, Any]:
        """The Balance record the worker publishes for this state (amounts as decimal strings)."""
        return {"account_id": self.account_id, "currency": self.currency, "status": self.status,
                "posted": str(self.posted), "held": str(self.held), "available": str(self.available),
                "seq": self.seq, "last_transaction_id": self.last_transaction_id,
                "updated_at_ms": self.updated_at_ms, "account_type": self.account_type}


def step(before: Balance | None, entry: Mapping[str, Any]) -> Balance:
    """The account after one more history entry (before: None for its first entry)."""
    if before is None:
        recorded = (entry.get("metadata") or {}).get(ACCOUNT_TYPE_KEY)
        before = Balance(entry["account_id"], entry["currency"], "open", 0, 0, 0, None, entry["at_ms"],
                         recorded or default_account_type(entry["account_id"]).value)
    return Balance(entry["account_id"], entry["currency"], STATUS_OF_KIND.get(entry["kind"], before.status),
                   before.posted + int(entry["amount"]), int(entry["held_after"]), entry["seq"],
                   entry["transaction_id"] or before.last_transaction_id, entry["at_ms"], before.account_type)


def walk(journal: Iterable[Mapping[str, Any]]) -> Iterator[tuple[Mapping[str, Any], Balance]]:
    """Each entry of one account's journal (in seq order) with the account as it stands after it."""
    state = None
    for entry in journal:
        state = step(state, entry)
        yield entry, state


def fold_journal(journal: Iterable[Mapping[str, Any]]) -> Balance:
    """The account after the last entry of its journal (in seq order, at least one entry)."""
    state = None
    for _, state in walk(journal):
        pass
    assert state is not None, "an empty journal has no balance"
    return state


def journals(history: Iterable[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """Each account's entries in seq order, each entry once (by entry id, its first publication: a worker
    re-emits identical entries after a crash)."""
    seen: set[str] = set()
    by_account: dict[str, list[Mapping[str, Any]]] = {}
    for entry in history:
        if entry["entry_id"] in seen:
            continue
        seen.add(entry["entry_id"])
        by_account.setdefault(entry["account_id"], []).append(entry)
    for items in by_account.values():
        items.sort(key=lambda v: v["seq"])
    return by_account


def fold_history(history: Iterable[Mapping[str, Any]]) -> dict[str, Balance]:
    """The latest balance of every account with history."""
    return {account: fold_journal(items) for account, items in journals(history).items()}


# --- history -> balances as of a time -----------------------------------------------------------------------
def as_of_ms(journal: Iterable[Mapping[str, Any]], at_ms: int) -> tuple[int, int]:
    """(posted, held) of one account at a time, from its journal (any order, each entry once): posted is the
    sum of the amounts whose business time `occurred_at_ms` is at or before it (back-dated entries count where
    they belong); held, having no business time, is the held_after of the last entry (by seq) recorded by then
    (log time `at_ms`), 0 before the first. The definition the read store's indexed answer is checked against."""
    posted, last_seq, held = 0, None, 0
    for e in journal:
        if e["occurred_at_ms"] <= at_ms:
            posted += int(e["amount"])
        if e["at_ms"] <= at_ms and (last_seq is None or e["seq"] > last_seq):
            last_seq, held = e["seq"], int(e["held_after"])
    return posted, held


def by_time(journal: Iterable[Mapping[str, Any]]) -> dict[int, tuple[int, int]]:
    """seq -> (posted_by_time, held_by_time) for one account's journal (each entry once): the prefix folds
    the read store keeps on every history row so that `as_of_ms` is one index lookup.
    - posted_by_time: Σ amounts of the entries at or before this one in business-time order
      (occurred_at_ms, seq): as_of_ms's posted is the value of the last entry with occurred_at_ms <= T;
    - held_by_time: held_after of the highest seq among the entries at or before this one in log-time order
      (at_ms, seq): as_of_ms's held is the value of the last entry with at_ms <= T."""
    entries = list(journal)
    out: dict[int, list] = {e["seq"]: [0, 0] for e in entries}
    posted = 0
    for e in sorted(entries, key=lambda e: (e["occurred_at_ms"], e["seq"])):
        posted += int(e["amount"])
        out[e["seq"]][0] = posted
    best_seq, held = None, 0
    for e in sorted(entries, key=lambda e: (e["at_ms"], e["seq"])):
        if best_seq is None or e["seq"] > best_seq:
            best_seq, held = e["seq"], int(e["held_after"])
        out[e["seq"]][1] = held
    return {seq: (p, h) for seq, (p, h) in out.items()}


# An account's prefix folds by time as of its last entries, to extend them entry by entry: (highest seq,
# (occurred_at_ms, seq) of its last entry in business time, that entry's posted_by_time, (at_ms, seq) of its
# last entry in log time).
Tail = tuple[int, tuple[int, int], int, tuple[int, int]]


def extend_by_time(tail: Tail | None, entry: Mapping[str, Any]) -> Tail | None:
    """The tail after one more entry (tail None: the account's first), when the entry comes after everything
    the tail covers in seq, business time and log time: `by_time` then gives it posted_by_time = the new
    tail's posted and held_by_time = its own held_after, without reading the journal. None when it does not
    (back-dated, or a seq filled late): the account's folds must be recomputed with `by_time`."""
    seq = entry["seq"]
    occurred, at = (entry["occurred_at_ms"], seq), (entry["at_ms"], seq)
    if tail is None:
        return seq, occurred, int(entry["amount"]), at
    if seq <= tail[0] or occurred < tail[1] or at < tail[3]:
        return None
    return seq, occurred, tail[2] + int(entry["amount"]), at


# --- results -> hold states ---------------------------------------------------------------------------------
def hold_progress(hold: Mapping[str, Any]) -> tuple[bool, int, int]:
    """How far a hold has got: ended beats open, then more captured + released, then the later result. A
    total order on the states of one hold, so the state kept does not depend on the order results are read
    in (they are keyed by command, so one hold's states may sit in different partitions)."""
    return hold["status"] != "open", int(hold["captured"]) + int(hold["released"]), hold["updated_at_ms"]


def newer_hold(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> Mapping[str, Any]:
    """The more settled of two states of one hold (new on a tie)."""
    return new if old is None or hold_progress(new) >= hold_progress(old) else old


def fold_holds(results: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """The most settled state of each hold the results mention, with `updated_at_ms` = the log time of the
    result that carried it. Duplicates (a retry answered again) are skipped: they repeat an earlier state."""
    holds: dict[str, dict[str, Any]] = {}
    for result in results:
        if result["duplicate"]:
            continue
        for h in result["holds"]:
            holds[h["hold_id"]] = newer_hold(holds.get(h["hold_id"]), {**h, "updated_at_ms": result["at_ms"]})
    return holds


def remaining(hold: Mapping[str, Any]) -> int:
    return int(hold["amount"]) - int(hold["captured"]) - int(hold["released"])


# --- shards -> the reported view ----------------------------------------------------------------------------
def sum_shards(shards: list[Mapping[str, Any]]) -> dict[str, Any]:
    """An account as users see it from its balance rows: one row for a user account, one per shard for a
    system account (summed; its seq is the sum of the shards' seqs, so it still grows by one per change).
    The newest shard (by update time, then seq) gives the currency, last transaction and update time."""
    assert shards, "a view needs at least one balance row"
    newest = max(shards, key=lambda s: (s["updated_at_ms"], s["seq"]))
    return {"currency": newest["currency"], "status": newest["status"] if len(shards) == 1 else "open",
            "posted": sum(int(s["posted"]) for s in shards), "held": sum(int(s["held"]) for s in shards),
            "available": sum(int(s["available"]) for s in shards), "seq": sum(s["seq"] for s in shards),
            "shards": len(shards), "last_transaction_id": newest["last_transaction_id"],
            "updated_at_ms": newest["updated_at_ms"]}


def group_shards(rows: Iterable[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """Balance rows grouped by the account users see (a shard `sys:x:CUR@n` under `sys:x:CUR`)."""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        groups.setdefault(routing.unsharded(row["account_id"]), []).append(row)
    return groups


# --- a transaction's status ---------------------------------------------------------------------------------
def in_clearing(entries: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Money a transaction's entries left in clearing, per currency (0 once every credit landed)."""
    sums: dict[str, int] = {}
    for e in entries:
        if names.is_clearing(e["account_id"]):
            sums[e["currency"]] = sums.get(e["currency"], 0) + int(e["amount"])
    return sums


def transaction_status(entries: list[Mapping[str, Any]], results: list[Mapping[str, Any]]) -> str:
    """posted (every leg posted), in_flight (accepted, and a partition's share not posted yet: money still in
    clearing), rejected, or pending (not decided yet), from the transaction's history entries and the results
    under its id (engine steps included). A transaction whose legs live in several partitions is decided once
    every partition reserved its legs (streams/spanning.py): accepted means every leg will post."""
    client = [r for r in results if r["client_id"] != routing.ENGINE_CLIENT]
    moved = [e for e in entries if e["amount"] != "0"]
    if moved or any(r["outcome"] == "accepted" for r in client):
        return "in_flight" if not moved or any(in_clearing(moved).values()) else "posted"
    return "rejected" if any(r["outcome"] == "rejected" for r in client) else "pending"
