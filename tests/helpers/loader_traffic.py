"""Seeded mixes of the records a replay loader reads, ordinary, irregular and corrupt, as confluent-kafka's
messages (tests.helpers.stub_consumer.Message): for the tests that hold the loader's fast path (in C) to its
Python loop, with a stand-in consumer or written to a real broker."""
from __future__ import annotations

import random

import pytest

from projections import bulk, fastload
from schemas import cdecode
from schemas.codec import codec
from streams import config
from tests.helpers.stub_consumer import Message

BUILT = cdecode.load_module(fastload.SOURCE) is not None
needs_build = pytest.mark.skipif(not BUILT, reason="the fast path is not built on this machine (no C compiler)")


def history(account, seq, rng, **over):
    at = 1_000_000 + seq * 10 + rng.randrange(3)
    v = {"entry_id": f"{account}#{seq}", "account_id": account, "currency": "USD", "seq": seq,
         "amount": str(rng.randrange(-500, 500)), "posted_after": str(seq), "held_after": str(rng.randrange(3)),
         "transaction_id": rng.choice([None, f"t{seq}{account}"]), "kind": rng.choice(["deposit", "transfer"]),
         "reference": rng.choice([None, "ref"]), "hold_id": rng.choice([None, "h1"]), "occurred_at_ms": at,
         "at_ms": at, "command_id": f"c{seq}", "client_id": "app", "links": [], "metadata": {},
         "rate_snapshot_id": rng.choice([None, "fx1"])}
    v.update(over)
    return v


def result(n, rng, **over):
    v = {"command_id": f"cmd{n}", "client_id": rng.choice(["app", "other"]),
         "outcome": rng.choice(["accepted", "rejected"]), "reason": rng.choice([None, "insufficient_funds"]),
         "detail": rng.choice(["", "why"]), "duplicate": False, "transaction_id": rng.choice([None, f"t{n}"]),
         "at_ms": 2_000_000 + n, "holds": []}
    v.update(over)
    return v


def balance(account, seq):
    return {"account_id": account, "currency": "USD", "status": "open", "posted": str(seq), "held": "0",
            "available": str(seq), "seq": seq, "last_transaction_id": None, "updated_at_ms": 3_000_000 + seq}


def irregular_history(account, seq, rng):
    """A history entry the fast path must hand back (or take exactly as the loop would)."""
    case = rng.randrange(13)
    if case == 0:
        return history(account, seq, rng, links=["x1", "x2"])
    if case == 1:
        return history(account, seq, rng, metadata={"rule": "fee", "a": "b"})
    if case == 2:
        return history(account, seq, rng, kind="dépôt")
    if case == 3:
        return history(account, seq, rng, amount="12345678901234567890")  # beyond 64 bits
    if case == 4:
        return history(account, seq, rng, amount=rng.choice(["007", "-0", "+5", " 5", "1_000",
                                                               "-999999999999999999"]))
    if case == 5:
        return history(account, seq, rng, amount="9223372036854775807")  # the sum overflows 64 bits next
    if case == 6:
        return history(account, seq, rng, occurred_at_ms=1)  # back-dated
    if case == 7:
        return history(account, seq, rng, at_ms=1, occurred_at_ms=1)
    if case == 8:
        return history(account, seq, rng, occurred_at_ms=1_000_000 + seq * 10)  # a tie in business time
    if case == 9:
        return history(account, seq, rng, reference="réf")
    if case == 10:
        return history(account, seq, rng, amount="99999999999999999")
    if case == 11:
        return history(account, seq, rng, **rng.choice([{"amount": "abc"}, {"held_after": "x"},
                                                          {"posted_after": ""}, {"amount": "1" * 5000}]))
    return history(account, seq, rng, currency="EUR", held_after="-7")


def corrupt(value: bytes, rng) -> bytes | None:
    case = rng.randrange(7)
    if case == 0:
        return value[:rng.randrange(len(value))]
    if case == 1:
        return value + b"\x00"
    if case == 2:
        i = rng.randrange(10, len(value))
        return value[:i] + bytes([rng.randrange(256)]) + value[i + 1:]
    if case == 3:
        return None
    if case == 4:
        return b"\xc3\x01" + bytes(rng.randrange(256) for _ in range(rng.randrange(30)))
    if case == 5:
        return value[:12] + b"\xff\xfe" + value[14:]
    return value[:10] + b"\x80" * 12


def traffic(seed: int, count: int = 600):
    """(messages, ends, keys) of one seeded mix over 4 partitions of each topic."""
    rng = random.Random(seed)
    c = codec()
    settings = config.load().with_prefix("fastload-test.")
    accounts = [f"user:{i}:USD" for i in range(12)] + ["user:é:USD"]
    seqs = {a: 0 for a in accounts}
    offsets: dict[tuple[str, int], int] = {}
    messages = []

    def put(logical, partition, value, error=None):
        topic = settings.topic(logical)
        offset = offsets.get((topic, partition), 0)
        offsets[(topic, partition)] = offset + 1
        messages.append(Message(topic, partition, offset, value, error))

    results_seen = []
    for n in range(count):
        kind = rng.random()
        account = rng.choice(accounts)
        partition = accounts.index(account) % 4
        if kind < 0.5:
            roll = rng.random()
            if roll < 0.7 or seqs[account] == 0:
                seqs[account] += 1
                seq = seqs[account]
                v = history(account, seq, rng) if rng.random() < 0.8 else irregular_history(account, seq, rng)
            elif roll < 0.8:
                seq = rng.randrange(1, seqs[account] + 1)  # a re-emission
                v = history(account, seq, rng)
            elif roll < 0.9:
                seqs[account] += 2  # a gap, filled later (or never)
                v = history(account, seqs[account], rng)
            else:
                v = history(account, rng.randrange(1, seqs[account] + 3), rng)
            value = c.encode("history", v)
            if rng.random() < 0.05:
                value = corrupt(value, rng)
            put("history", partition, value)
        elif kind < 0.8:
            roll = rng.random()
            if roll < 0.15 and results_seen:
                v = dict(rng.choice(results_seen), duplicate=rng.random() < 0.5, outcome="rejected",
                         reason=rng.choice(["id_conflict", "insufficient_funds"]))  # a retry answered again
            elif roll < 0.25:
                v = result(n, rng, holds=[{"hold_id": f"h{n % 5}", "account_id": account, "amount": "10",
                                            "captured": rng.choice([str(rng.randrange(5))] * 9 + ["?"]),
                                            "released": "0",
                                            "status": rng.choice(["open", "captured"]), "expires_at_ms": None}])
            elif roll < 0.3:
                v = result(n, rng, detail="naïve")
            else:
                v = result(n, rng, duplicate=rng.random() < 0.1)
            results_seen.append(v)
            value = c.encode("result", v)
            if rng.random() < 0.05:
                value = corrupt(value, rng)
            put("results", rng.randrange(4), value)
        elif kind < 0.97:
            b = balance(account, rng.randrange(1, 20))
            if rng.random() < 0.03:
                b["held"] = "1e3"  # no integer: skipped by both (fold.unfoldable)
            value = c.encode("balance", b)
            if rng.random() < 0.05:
                value = corrupt(value, rng)
            put("balances", partition, value)
        else:
            put(rng.choice(["history", "results"]), rng.randrange(4), b"x", error="a consumer error")
    names = {settings.topic(t): t for t in bulk.SCHEMA_OF}
    # Some partitions end before their last records (a rebuild to given offsets): those are not loaded.
    keys = {(names[t], p): (0, end - (1 if rng.random() < 0.3 else 0)) for (t, p), end in offsets.items()}
    return settings, messages, offsets, keys
