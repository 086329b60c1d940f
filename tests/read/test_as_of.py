"""Balances as of a time (`Store.balance_as_of_ms`, two index lookups per shard) against the fold of history
(`fold.as_of_ms`), in both databases, without a broker: the store is built from crafted history and balance
records applied in batches of random size and order, with back-dated business times, log times that go
backwards, seq gaps filled late and re-emitted entries, so every path of the prefix folds is taken."""
from __future__ import annotations

import random

import pytest

from projections import fold
from projections.store import Record, Store, refold_by_time

ACCOUNTS = ("user:a:USD", "user:b:USD", "sys:fees:USD@0", "sys:fees:USD@1", "sys:fees:USD@2")


def journal(rng: random.Random, account_id: str, n: int, in_order: bool) -> list[dict]:
    """An account's entries; unless in_order, log time sometimes steps back and business times are back-dated."""
    entries, held, at = [], 0, 1_000_000
    for seq in range(1, n + 1):
        at += rng.choice((0, 1, 7, 1000, 3 if in_order or rng.random() > 0.1 else -500))
        occurred = at if in_order or rng.random() < 0.7 else at - rng.randrange(0, 200_000)
        amount = rng.choice((0, rng.randrange(-10**20, 10**20), rng.randrange(-500, 500)))
        held = max(0, held + rng.choice((0, 0, 100, -100)))
        entries.append({"entry_id": f"{account_id}#{seq}", "account_id": account_id, "currency": "USD",
                        "seq": seq, "amount": str(amount), "posted_after": "0", "held_after": str(held),
                        "transaction_id": f"t{seq}", "kind": "deposit", "reference": None, "hold_id": None,
                        "occurred_at_ms": occurred, "at_ms": at, "command_id": f"c{seq}", "client_id": "x"})
    return entries


def balance(entries: list[dict]) -> dict:
    b = fold.fold_journal(entries)
    return b.record()


def build(target: str, journals: dict[str, list[dict]], rng: random.Random) -> Store:
    """Apply the journals in batches: first half with some entries held back and applied late (a gap filled
    out of order) and some applied twice (a worker's re-emission), then the rest in seq order, so the last
    entries of the in-order accounts are only ever extended in place."""
    pending = []
    for entries in journals.values():
        head = entries[:len(entries) // 2]
        late = [e for e in head if rng.random() < 0.1]
        pending += [e for e in head if e not in late] + late + rng.sample(head, k=len(head) // 5)
    rng.shuffle(pending)
    tails = [e for entries in journals.values() for e in entries[len(entries) // 2:]]
    pending += sorted(tails, key=lambda e: (e["seq"], rng.random()))  # accounts interleaved, each in seq order
    store = Store(target, "asof.")
    offset = 0
    while pending:
        size = rng.randint(1, 40)
        batch, pending = pending[:size], pending[size:]
        records = [Record("history", 0, offset + i, e) for i, e in enumerate(batch)]
        offset += len(batch)
        store.apply(records, {("history", 0): offset})
    store.apply([Record("balances", 0, offset, balance(e)) for e in journals.values()], {("balances", 0): 1})
    return store


@pytest.mark.parametrize("seed", range(4))
def test_as_of_answers_equal_the_fold_of_history(backend, new_store, seed):
    rng = random.Random(seed)
    journals = {a: journal(rng, a, rng.randint(1, 120), in_order=i % 2 == 1) for i, a in enumerate(ACCOUNTS)}
    store = build(new_store(f"asof{seed}"), journals, rng)
    try:
        times = sorted({e[k] for es in journals.values() for e in es for k in ("occurred_at_ms", "at_ms")})
        probes = [times[0] - 1, times[-1] + 1] + [t + d for t in rng.sample(times, 60) for d in (-1, 0, 1)]
        for t in probes:
            for account_id, entries in journals.items():
                assert store.balance_as_of_ms(account_id, t) == fold.as_of_ms(entries, t), (account_id, t)
            # A system account is the sum of its shards.
            shards = [e for a, es in journals.items() if a.startswith("sys:fees:USD@") for e in es]
            want = [fold.as_of_ms([e for e in shards if e["account_id"] == a], t) for a in ACCOUNTS[2:]]
            assert store.balance_as_of_ms("sys:fees:USD", t) == tuple(map(sum, zip(*want)))
        # Nothing was left for a full recomputation to fix: the incremental folds were already right.
        assert refold_by_time(store.conn, ACCOUNTS) == 0
    finally:
        store.close()
