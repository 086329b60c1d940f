"""The read side's operations checks without a broker, in both databases: the background drift check finds a
published balance that is not the fold of its history (and only that), and the transfers in clearing are
listed per transaction, oldest first, so the clearing age names the stuck one and resets when it lands."""
from __future__ import annotations

import time

from projections import fold
from projections.drift import DriftChecker
from projections.metrics import ReadSideCollector, StatsCache, transfers_older_than
from projections.store import Record, Store


def entry(account_id: str, seq: int, amount: int, tx: str, at_ms: int, currency: str = "USD") -> dict:
    return {"entry_id": f"{account_id}#{seq}", "account_id": account_id, "currency": currency, "seq": seq,
            "amount": str(amount), "posted_after": "0", "held_after": "0", "transaction_id": tx, "kind": "transfer",
            "reference": None, "hold_id": None, "occurred_at_ms": at_ms, "at_ms": at_ms, "command_id": tx,
            "client_id": "x"}


def apply(store: Store, topic: str, values: list[dict], offset: list[int]) -> None:
    records = [Record(topic, 0, offset[0] + i, v) for i, v in enumerate(values)]
    offset[0] += len(values)
    store.apply(records, {(topic, 0): offset[0]})


def test_drift_check_names_the_account_whose_balance_is_not_its_history(new_store):
    store = Store(new_store("drift"), "drift.")
    offset = [0]
    journals = {f"user:{i}:USD": [entry(f"user:{i}:USD", s, 100 * s, f"t{i}-{s}", 1000 + s) for s in range(1, 4)]
                for i in range(7)}
    apply(store, "history", [e for j in journals.values() for e in j], offset)
    published = {a: fold.fold_journal(j).record() for a, j in journals.items()}
    published["user:3:USD"] = {**published["user:3:USD"], "posted": "601", "available": "601"}  # one unit off
    apply(store, "balances", list(published.values()), offset)
    # A balance whose history is not projected yet is not judged (the projector applies topics apart).
    late = entry("user:5:USD", 4, 1, "t5-4", 2000)
    apply(store, "balances", [fold.fold_journal(journals["user:5:USD"] + [late]).record()], offset)

    checker = DriftChecker(slice_size=3)  # several slices per pass
    checker.check_all(store)
    report = checker.report()
    assert [(d["account_id"], d["field"], d["published"], d["folded"]) for d in report["drifting"]] == \
        [("user:3:USD", "posted", "601", "600")]
    assert report["behind"] == 1 and report["passes"] == 1

    # The next pass folds only new entries (remembered state) and still agrees; the fixed account clears.
    apply(store, "history", [late], offset)
    fixed = fold.fold_journal(journals["user:3:USD"]).record()
    apply(store, "balances", [{**fixed, "seq": 3}], offset)  # same seq: the store keeps the first row
    checker.check_all(store)
    assert checker.report()["behind"] == 0
    assert [d["account_id"] for d in checker.report()["drifting"]] == ["user:3:USD"]

    stats = StatsCache(Store(store.target, readonly=True), drift=checker)
    metrics = {m.name: m for m in ReadSideCollector(stats).collect()}
    assert metrics["ledger_drift_accounts"].samples[0].value == 1
    store.close()


def _drifting_store(new_store, name: str) -> Store:
    """Seven accounts of three entries each, one of them published a unit off."""
    store = Store(new_store(name), f"{name}.")
    offset = [0]
    journals = {f"user:{i}:USD": [entry(f"user:{i}:USD", s, 100 * s, f"t{i}-{s}", 1000 + s) for s in range(1, 4)]
                for i in range(7)}
    apply(store, "history", [e for j in journals.values() for e in j], offset)
    published = {a: fold.fold_journal(j).record() for a, j in journals.items()}
    published["user:3:USD"] = {**published["user:3:USD"], "posted": "601", "available": "601"}
    apply(store, "balances", list(published.values()), offset)
    return store


def test_a_pass_in_bursts_of_one_account_finds_what_a_whole_pass_finds(new_store):
    """The API's thread checks in bursts bounded in time (at least one account each): a burst too short for a
    second account still walks the whole store, once per pass, and finds the same drift."""
    store = _drifting_store(new_store, "bursts")
    whole = DriftChecker(slice_size=3)
    whole.check_all(store)
    bursts = DriftChecker(slice_size=3)
    calls = 0
    while bursts.passes == 0:
        assert bursts.check_slice(store, budget_s=0.0) == 1
        calls += 1
    assert calls == 7 and bursts.checked == 7
    assert bursts.report()["drifting"] == whole.report()["drifting"] != []
    store.close()


def test_the_drift_thread_keeps_to_its_share_of_a_core(new_store, monkeypatch):
    """While a pass has more to do, each burst is followed by a sleep that keeps the thread's CPU time at its
    share (a burst of 2 ms at 5%: 38 ms); between passes it sleeps `every_s`. (The clock is the test's.)"""
    from projections import drift

    store = _drifting_store(new_store, "share")
    clock = iter(x * 0.002 for x in range(100))  # each burst costs 2 ms of the thread's CPU
    monkeypatch.setattr(drift.time, "thread_time", lambda: next(clock))
    waits = []

    class Stop:
        def is_set(self):
            return len(waits) >= 9

        def wait(self, seconds):
            waits.append(round(seconds, 6))

    checker = DriftChecker(slice_size=3)
    monkeypatch.setattr(checker, "check_slice", lambda st, budget_s: DriftChecker.check_slice(checker, st, 0.0))
    drift.run(checker, store.target, Stop(), every_s=5.0, share=0.05, burst_s=0.002)
    assert waits == [0.038] * 6 + [5.0] + [0.038] * 2
    assert checker.passes == 1
    store.close()


def test_transfers_in_clearing_are_listed_per_transaction_oldest_first(new_store):
    store = Store(new_store("clearing"), "clr.")
    offset = [0]
    now = int(time.time() * 1000)
    old, recent = now - 600_000, now - 1_000
    apply(store, "history", [
        # t-old: reserved in partition 1's clearing shard 10 min ago, never credited: stuck.
        entry("sys:clearing:USD@1", 1, 500, "t-old", old),
        # t-done: reserved and credited: nothing left in clearing.
        entry("sys:clearing:USD@1", 2, 70, "t-done", old + 5),
        entry("sys:clearing:USD@2", 1, -70, "t-done", old + 9),
        # t-new: in flight for a second, in EUR.
        entry("sys:clearing:EUR@3", 1, 2 * 10**30, "t-new", recent, "EUR"),
        # Not clearing: ignored.
        entry("user:a:USD", 1, -500, "t-old", old),
    ], offset)
    views = [fold.fold_journal([e]).record() for e in (
        entry("sys:clearing:USD@1", 2, 570, "t-done", old + 5), entry("sys:clearing:USD@2", 1, -70, "t-done", old + 9),
        entry("sys:clearing:EUR@3", 1, 2 * 10**30, "t-new", recent, "EUR"))]
    apply(store, "balances", views, offset)

    listed = store.transfers_in_clearing()
    assert [(t["transaction_id"], t["currency"], t["amount"]) for t in listed] == \
        [("t-old", "USD", 500), ("t-new", "EUR", 2 * 10**30)]
    assert [t["transaction_id"] for t in transfers_older_than(store, 60)] == ["t-old"]

    stats = StatsCache(Store(store.target, readonly=True), stuck_after_s=60)
    s = stats.get()
    usd = next(c for c in s["clearing"] if c["currency"] == "USD")
    assert usd["oldest_transaction_id"] == "t-old" and usd["age_s"] >= 600 and usd["stuck"] == 1
    metrics = {m.name: m for m in ReadSideCollector(stats).collect()}
    named = {(x.labels["currency"], x.labels["transaction_id"]) for x in
             metrics["ledger_clearing_oldest_transfer_seconds"].samples}
    assert named == {("USD", "t-old"), ("EUR", "t-new")}

    # The stuck transfer lands: the USD age resets (nothing of USD left in clearing).
    apply(store, "history", [entry("sys:clearing:USD@4", 1, -500, "t-old", now)], offset)
    assert [t["transaction_id"] for t in store.transfers_in_clearing()] == ["t-new"]
    store.close()


def test_served_processes_divide_the_drift_checks_share_among_them(tmp_path, monkeypatch):
    """`ledger api` serves one process per core, each with its own drift check: together they keep to the
    share one process takes (LEDGER_API_PROCESSES, set by `serve` and the benchmark)."""
    from fastapi.testclient import TestClient

    from projections import api, drift
    from streams import logs

    shares = []
    monkeypatch.setattr(api, "run_drift", lambda checker, target, stop, every_s, share: shares.append(share))
    monkeypatch.setattr(logs, "setup", lambda: None)
    monkeypatch.setenv("LEDGER_API_TARGET", str(tmp_path / "read.db"))
    for processes, expected in (("2", drift.CPU_SHARE / 2), ("1", drift.CPU_SHARE)):
        monkeypatch.setenv("LEDGER_API_PROCESSES", processes)
        with TestClient(api.app_from_env()):
            pass
        assert shares.pop() == expected
