"""Micro-benchmark of the Avro codec: fastavro (the former path) vs the compiled schemas.fastcodec.

Run: .venv/bin/python benchmarks/codec_bench.py [--n 20000] [--repeat 5]

For each message kind prints the best-of-repeat µs per encode and per decode, both through the
single-object header as schemas.codec does it (header + body, fingerprint check, trailing-byte check).
"""

from __future__ import annotations

import argparse
import io
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import fastavro  # noqa: E402

from schemas.codec import codec  # noqa: E402

AT = 1_715_000_000_123

COMMAND = {
    "command_id": "cmd-000123", "client_id": "client-a",
    "body": ("ledger.PostTransaction", {
        "transaction_id": "tx-000123",
        "legs": [
            {"account_id": "alice-EUR", "amount": "-1500", "hold_id": None, "currency": None},
            {"account_id": "bob-EUR", "amount": "1500", "hold_id": None, "currency": "EUR"},
        ],
        "kind": "transfer", "reference": "invoice 42", "links": [], "metadata": {"channel": "api"},
        "occurred_at_ms": None, "rate_snapshot_id": None,
    }),
}
RESULT = {
    "command_id": "cmd-000123", "client_id": "client-a", "outcome": "accepted", "reason": None, "detail": "",
    "duplicate": False, "transaction_id": "tx-000123", "at_ms": AT, "holds": [],
}
HISTORY = {
    "entry_id": "alice-EUR#42", "account_id": "alice-EUR", "currency": "EUR", "seq": 42, "amount": "-1500",
    "posted_after": "98500", "held_after": "0", "transaction_id": "tx-000123", "kind": "transfer",
    "reference": "invoice 42", "hold_id": None, "occurred_at_ms": AT, "at_ms": AT,
    "command_id": "cmd-000123", "client_id": "client-a",
}
BALANCE = {
    "account_id": "alice-EUR", "currency": "EUR", "status": "open", "posted": "98500", "held": "0",
    "available": "98500", "seq": 42, "last_transaction_id": "tx-000123", "updated_at_ms": AT,
}


def _account(name: str, posted: str) -> dict:
    return {"account_id": name, "currency": "EUR", "routing_key": name, "allow_negative": False,
            "overdraft_limit": "0", "max_balance": None, "status": "open", "posted": posted, "held": "0",
            "seq": 42, "last_transaction_id": "tx-000123", "updated_at_ms": AT}


CASES = {
    "command": COMMAND,
    "result": RESULT,
    "history": HISTORY,
    "balance": BALANCE,
    "state": {
        "client_id": "client-a", "command_id": "cmd-000123", "fingerprint": "9f2c4e1a7b3d5f60",
        "source_partition": 3, "source_offset": 123456,
        "accounts": [_account("alice-EUR", "98500"), _account("bob-EUR", "1500")], "holds": [],
        "result": codec().encode("result", RESULT),
    },
}


def _best(fn, arg, n: int, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(n):
            fn(arg)
        best = min(best, time.perf_counter() - t0)
    return best / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    c = codec()
    print(f"{'message':10} {'bytes':>5} | {'encode fastavro':>15} {'compiled':>9} {'x':>5} | "
          f"{'decode fastavro':>15} {'compiled':>9} {'x':>5}   (µs per call)")
    for name, record in CASES.items():
        schema = c.current[name]
        # Top-level fields added since this script was written take their defaults.
        record = {f["name"]: record.get(f["name"], f.get("default")) for f in schema.parsed["fields"]}

        def fa_encode(r, schema=schema):
            out = io.BytesIO()
            out.write(schema.header)
            fastavro.schemaless_writer(out, schema.parsed, r)
            return out.getvalue()

        def fa_decode(data, schema=schema):
            buf = io.BytesIO(data)
            buf.seek(10)
            record = fastavro.schemaless_reader(buf, schema.parsed, None, return_record_name=True)
            assert buf.tell() == len(data)
            return record

        def fast_decode(data, name=name):
            return c.decode(name, data)

        def fast_encode(r, name=name):
            return c.encode(name, r)

        data = fa_encode(record)
        assert fast_encode(record) == data and fast_decode(data) == fa_decode(data), name
        e_fa, e_fast = _best(fa_encode, record, args.n, args.repeat), _best(fast_encode, record, args.n, args.repeat)
        d_fa, d_fast = _best(fa_decode, data, args.n, args.repeat), _best(fast_decode, data, args.n, args.repeat)
        print(f"{name:10} {len(data):5} | {e_fa:15.2f} {e_fast:9.2f} {e_fa / e_fast:5.1f} | "
              f"{d_fa:15.2f} {d_fast:9.2f} {d_fa / d_fast:5.1f}")


if __name__ == "__main__":
    main()
