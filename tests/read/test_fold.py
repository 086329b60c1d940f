"""The read side's one fold (projections/fold.py), without a broker: status from kinds, re-emissions folded once,
hold states independent of the order results are read in, system shards summed."""
from __future__ import annotations

import itertools

from projections import fold

ACCOUNT = "user:f:USD"


def entry(seq: int, amount: int, posted_after: int, held_after: int = 0, kind: str = "deposit",
          transaction_id: str | None = None) -> dict:
    return {"account_id": ACCOUNT, "seq": seq, "entry_id": f"{ACCOUNT}#{seq}", "currency": "USD",
            "amount": str(amount), "posted_after": str(posted_after), "held_after": str(held_after),
            "transaction_id": transaction_id, "kind": kind, "at_ms": 1000 + seq}


def test_history_folds_into_the_published_balance_record():
    journal = [entry(1, 0, 0, kind="account_opened"), entry(2, 500, 500, transaction_id="t1"),
               entry(3, 0, 500, held_after=200, kind="hold_placed"), entry(4, 0, 500, 200, kind="account_frozen")]
    reemitted = journal[1]
    views = fold.fold_history([journal[3], journal[0], reemitted, journal[2], journal[1]])  # any order, twice
    assert views[ACCOUNT].record() == {
        "account_id": ACCOUNT, "currency": "USD", "status": "frozen", "posted": "500", "held": "200",
        "available": "300", "seq": 4, "last_transaction_id": "t1", "updated_at_ms": 1004,
        "account_type": "liability"}  # by its name: the history entry predates types
    assert [(v["seq"], b.status, b.available) for v, b in fold.walk(journal)] == [
        (1, "open", 0), (2, "open", 500), (3, "open", 300), (4, "frozen", 300)]


def test_posted_is_the_sum_of_the_amounts_not_the_recorded_posted_after():
    """The fold P3 compares posted_after with: a wrong posted_after does not move it."""
    journal = [entry(1, 0, 0, kind="account_opened"), entry(2, 500, 999)]
    assert fold.fold_journal(journal).posted == 500


def test_the_hold_kept_does_not_depend_on_the_order_results_are_read_in():
    def result(at_ms: int, status: str, captured: int, released: int = 0, duplicate: bool = False) -> dict:
        return {"at_ms": at_ms, "duplicate": duplicate, "holds": [
            {"hold_id": "h", "account_id": ACCOUNT, "amount": "100", "captured": str(captured),
             "released": str(released), "status": status, "expires_at_ms": None}]}

    results = [result(1, "open", 0), result(2, "open", 30), result(3, "open", 30), result(4, "released", 30, 70),
               result(9, "open", 0, duplicate=True)]
    kept = {str(fold.fold_holds(order)["h"]) for order in itertools.permutations(results)}
    assert len(kept) == 1
    (hold,) = fold.fold_holds(results).values()
    assert (hold["status"], hold["updated_at_ms"], fold.remaining(hold)) == ("released", 4, 0)
    # Equally settled states: the later result's (whichever is read first).
    assert fold.fold_holds([results[2], results[1]])["h"]["updated_at_ms"] == 3


def test_system_shards_sum_into_one_view():
    shards = [{"account_id": f"sys:fees:USD@{p}", "currency": "USD", "status": "open", "posted": str(p * 10),
               "held": "0", "available": str(p * 10), "seq": p, "last_transaction_id": f"t{p}",
               "updated_at_ms": 100 - p} for p in (1, 2, 3)]
    (name, rows), = fold.group_shards(shards).items()
    view = fold.sum_shards(rows)
    assert name == "sys:fees:USD"
    assert (view["posted"], view["seq"], view["shards"], view["last_transaction_id"]) == (60, 6, 3, "t1")


def test_extending_the_folds_by_time_entry_by_entry_agrees_with_folding_the_journal():
    """The projector and the bulk rebuild extend an account's prefix folds by time one entry at a time; for
    entries in order that is by_time's answer, and an entry out of order (back-dated, or a seq seen before)
    says the journal must be folded again."""
    journal = [{**entry(seq, amount, 0, held), "occurred_at_ms": 1000 + seq}
               for seq, amount, held in ((1, 0, 0), (2, 500, 0), (3, -200, 100), (4, 50, 0))]
    folds, tail = fold.by_time(journal), None
    for e in journal:
        tail = fold.extend_by_time(tail, e)
        assert (tail[2], int(e["held_after"])) == folds[e["seq"]]
    assert fold.extend_by_time(tail, {**entry(5, 1, 0), "occurred_at_ms": 1000}) is None  # back-dated
    assert fold.extend_by_time(tail, {**entry(4, 50, 0), "occurred_at_ms": 1004}) is None  # seen before
    assert fold.extend_by_time(tail, {**entry(5, 1, 0), "occurred_at_ms": 2000, "at_ms": 0}) is None  # log time
