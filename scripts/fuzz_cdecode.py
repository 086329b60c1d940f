"""`make fuzz-decode`: the compiled Avro decoders (schemas/cdecode.py) and the replay loader's common case
(projections/fastload.pyx) under AddressSanitizer, fed hostile bytes.

Builds every schema's Cython decoder (the ledger's current schemas and the generic test schema of
tests/helpers/avro.py, which has a recursive record) with `-fsanitize=address` into a temporary directory, then
runs, in a Python started with libasan preloaded and PYTHONMALLOC=malloc (every bytes object its own
allocation with red zones around it), seeded random, truncated, mutated and spliced bytes through each compiled
decoder and through the generated Python decoder, the reference. Every case must give the same outcome: the
same (value, end offset), or the same exception type and message. An out-of-bounds read or write aborts the run
with AddressSanitizer's report; a crash of the interpreter is a non-zero exit too. Prints the cases run per
schema and per kind of input; exit status 0 only when no case differed and nothing crashed.

    .venv/bin/python scripts/fuzz_cdecode.py [--cases N] [--seed N] [--only state,command]
"""
from __future__ import annotations

import argparse
import collections
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1
_CHILD = "LEDGER_FUZZ_DECODE_DIR"


def schemas() -> dict:
    from schemas.codec import SCHEMA_NAMES
    from tests.helpers.avro import GENERIC, raw

    return {**{name: raw(name) for name in SCHEMA_NAMES}, "generic": GENERIC}


def compiled() -> dict:
    from schemas.fastcodec import compile_schema

    return {name: compile_schema(schema, native=False) for name, schema in schemas().items()}


def build(directory: Path) -> None:
    """Compile every decoder, and the replay loader's common case (projections/fastload.pyx), with
    AddressSanitizer (setuptools takes CFLAGS and LDFLAGS from the environment)."""
    from schemas import cdecode

    cdecode.build([c.native_source for c in compiled().values()] + [p.read_text() for p in cdecode.HAND_WRITTEN],
                  directory)


# ------------------------------------------------------------------------------------------ the cases
def zz(n: int) -> bytes:
    from schemas.fastcodec import _varint

    return _varint((n << 1) ^ (n >> 63) if n < 0 else n << 1)


_HOSTILE = [zz(n) for n in (0, 1, -1, 2, -2, 63, 64, -65, 2**31 - 1, -(2**31), 2**31, 2**32, 2**62, -(2**62),
                            LONG_MAX, LONG_MIN, LONG_MAX - 1, LONG_MIN + 1, 2**40, -(2**40))]
_HOSTILE += [b"\xff" * 9 + b"\x01", b"\xff" * 9 + b"\x02", b"\xff" * 9 + b"\x7f", b"\x80" * 9 + b"\x01",
             b"\xff" * 10 + b"\x01", b"\xff" * 11, b"\x80" * 10 + b"\x00", b"\xff" * 9 + b"\x81\x00",
             b"\x80", b"\xff", b"\x01", b"\x7f", b"\xc3\xa9", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe2\x82"]
_BYTES = [0x00, 0x01, 0x02, 0x03, 0x04, 0x7E, 0x7F, 0x80, 0x81, 0xFE, 0xFF]


def _byte(rng: random.Random) -> int:
    return rng.choice(_BYTES) if rng.random() < 0.5 else rng.randrange(256)


def mutate(rng: random.Random, data: bytes, seeds: list[bytes]) -> tuple[str, bytes]:
    """One hostile variant of a valid encoding, and the name of what was done to it."""
    out = bytearray(data)
    kind = rng.choice(("flip", "hostile-varint", "delete", "duplicate", "splice", "truncate", "insert"))
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        pos = rng.randrange(len(out) + 1)
        if kind == "flip" and out:
            out[min(pos, len(out) - 1)] = _byte(rng)
        elif kind == "hostile-varint":
            cut = rng.randrange(0, 11)
            out[pos:pos + cut] = rng.choice(_HOSTILE)
        elif kind == "delete":
            del out[pos:pos + rng.randrange(1, 12)]
        elif kind == "duplicate":
            end = min(len(out), pos + rng.randrange(1, 40))
            out[pos:pos] = out[pos:end]
        elif kind == "splice":
            other = rng.choice(seeds)
            out = out[:pos] + other[rng.randrange(len(other) + 1):]
        elif kind == "truncate":
            out = out[:pos]
        else:
            out[pos:pos] = bytes(_byte(rng) for _ in range(rng.randrange(1, 6)))
    return kind, bytes(out)


def small(schema, named: dict, rng: random.Random, depth: int = 0):
    """A small random value of `schema` (fastavro-parsed): short strings, 0-3 items, the edge longs; dense in
    structure (lengths, counts, indexes), where fastavro's generated records are mostly long strings."""
    if isinstance(schema, str):
        if schema == "null":
            return None
        if schema == "boolean":
            return rng.random() < 0.5
        if schema in ("int", "long"):
            edges = (0, -1, 1, 63, -64, 64, -65, 2**31 - 1, -(2**31))
            edges += (LONG_MAX, LONG_MIN, 1_715_000_000_123) if schema == "long" else ()
            return rng.choice(edges) if rng.random() < 0.7 else rng.randrange(-(2**31), 2**31)
        if schema == "string":
            return rng.choice(("", "a", "é", "€", "🙂", "user:42:USD", "x" * rng.randrange(70)))
        if schema == "bytes":
            return bytes(rng.randrange(256) for _ in range(rng.choice((0, 1, 3, 70))))
        return small(named[schema], named, rng, depth)
    if isinstance(schema, list):
        branches = schema
        if depth > 3 and "null" in schema:
            branches = ["null"]
        branch = rng.choice(branches)
        value = small(branch, named, rng, depth + 1)
        resolved = named.get(branch, branch) if isinstance(branch, str) else branch
        if isinstance(resolved, dict) and resolved["type"] in ("record", "enum") and (
                isinstance(branch, str) or resolved["type"] == "record"):
            return (resolved["name"], value)
        return value
    t = schema["type"]
    if isinstance(t, (dict, list)) or t in ("null", "boolean", "int", "long", "string", "bytes"):
        return small(t, named, rng, depth)
    if t == "record":
        return {f["name"]: small(f["type"], named, rng, depth + 1) for f in schema["fields"]}
    if t == "enum":
        return rng.choice(schema["symbols"])
    count = rng.choice((0, 0, 1, 1, 2, 3)) if depth < 6 else 0
    if t == "array":
        return [small(schema["items"], named, rng, depth + 1) for _ in range(count)]
    return {small("string", named, rng): small(schema["values"], named, rng, depth + 1) for _ in range(count)}


def case(rng: random.Random, seeds: list[bytes]) -> tuple[str, bytes, int]:
    """(kind, data, offset) of one case."""
    r = rng.random()
    if r < 0.1:
        kind, data = "random", bytes(_byte(rng) for _ in range(rng.choice((rng.randrange(12),
                                                                             rng.randrange(400)))))
    elif r < 0.2:
        data = rng.choice(seeds)
        kind, data = "truncated", data[:rng.randrange(len(data) + 1)]
    elif r < 0.25:
        kind, data = "valid", rng.choice(seeds)
    else:
        kind, data = mutate(rng, rng.choice(seeds), seeds)
    offset = 0
    r = rng.random()
    if r < 0.05:  # at an offset, after other bytes (a header)
        junk = bytes(_byte(rng) for _ in range(rng.randrange(1, 12)))
        data, offset = junk + data, len(junk)
    elif r < 0.07:
        offset = rng.randrange(len(data) + 4)
    return kind, data, offset


def outcome(decode, data, offset):
    try:
        value, end = decode(data, offset)
    except Exception as exc:  # the type and message are what is compared
        return ("raised", type(exc).__name__, str(exc))
    return ("decoded", value, end)


def show(o) -> str:
    try:
        return str(o)[:300]
    except RecursionError:
        return f"{o[0]} (a value nested too deep to print)"


def deep(name: str, depth: int) -> bytes | None:
    """A record of the generic schema whose recursive Node nests `depth` deep (hostile: no writer would)."""
    if name != "generic":
        return None
    node = zz(1) + b"n" + zz(1)  # label "n", next: the union's Node branch
    return zz(0) + zz(0) + zz(0) + node * depth + zz(1) + b"n" + zz(0) + zz(0) + zz(0) + zz(0) + zz(0)


def fuzz(directory: Path, cases: int, seed: int, only: list[str]) -> int:
    import fastavro
    from fastavro.utils import generate_many

    from schemas import cdecode

    failures = 0
    total = 0
    started = time.monotonic()
    for name, c in compiled().items():
        if only and name not in only:
            continue
        native = cdecode.load(c.native_source, directory)
        if native is None:
            print(f"{name}: no compiled decoder in {directory}", file=sys.stderr)
            return 2
        python = c.python_decode_at
        rng = random.Random(f"{seed}:{name}")
        named: dict = {}
        parsed = fastavro.parse_schema(schemas()[name], named_schemas=named, _write_hint=False)
        random.seed(f"{seed}:{name}")  # fastavro's generator draws from the global one
        seeds = [c.encode(r) for r in generate_many(fastavro.parse_schema(schemas()[name]), 100)]
        seeds += [c.encode(small(parsed, named, rng)) for _ in range(400)]
        by_kind: collections.Counter = collections.Counter()
        outcomes: collections.Counter = collections.Counter()
        extra = [(f"deep-{d}", data, 0) for d in (10, 5_000, 200_000) if (data := deep(name, d))]
        for i in range(cases + len(extra)):
            kind, data, offset = extra[i - cases] if i >= cases else case(rng, seeds)
            expected = outcome(python, data, offset)
            buffer = data
            if i % 50 == 7:  # the compiled decoder also takes other buffers (copied to bytes)
                buffer = bytearray(data) if i % 100 == 7 else memoryview(data)
            got = outcome(native, buffer, offset)
            by_kind[kind] += 1
            outcomes[expected[0] if expected[0] == "decoded" else expected[1]] += 1
            if got != expected:
                failures += 1
                if failures <= 20:
                    print(f"DIFFERS {name} {kind} offset={offset} data={data.hex()[:400]}\n"
                          f"  python: {show(expected)}\n  native: {show(got)}", flush=True)
            if offset == 0 and i % 97 == 0:  # a negative offset is refused, never read before the buffer
                got = outcome(native, data, -1 - rng.randrange(1 << rng.randrange(63)))
                if got[:2] != ("raised", "IndexError"):
                    failures += 1
                    print(f"DIFFERS {name} negative offset: {got}", flush=True)
        total += sum(by_kind.values())
        print(f"{name}: {sum(by_kind.values()):,} cases ({', '.join(f'{k} {v:,}' for k, v in sorted(by_kind.items()))});"
              f" outcomes: {', '.join(f'{k} {v:,}' for k, v in outcomes.most_common())}", flush=True)
    print(f"{total:,} cases in {time.monotonic() - started:.0f} s, {failures} differing from the Python decoder; "
          f"no AddressSanitizer report", flush=True)
    return 1 if failures else 0


def _common(name: str, rng: random.Random) -> dict:
    """A record of the kind the fast path takes: ASCII text, plain integer amounts, no links, metadata or holds
    (mostly: the edges around each are in too)."""
    def text() -> str:
        return rng.choice(("", "a", "user:42:USD", "x" * rng.randrange(70), "tx-" + str(rng.randrange(10**9))))

    def amount() -> str:
        return rng.choice((str(rng.randrange(-10**18 + 1, 10**18)), "0", "-0", "007", str(2**63 - 1), "9" * 19,
                           "-" + "9" * 18, str(rng.randrange(1000))))

    def maybe():
        return None if rng.random() < 0.5 else text()

    if name == "history":
        return {"entry_id": text(), "account_id": text(), "currency": text(), "seq": rng.choice((1, 2, 2**40)),
                "amount": amount(), "posted_after": amount(), "held_after": amount(), "transaction_id": maybe(),
                "kind": text(), "reference": maybe(), "hold_id": maybe(),
                "occurred_at_ms": rng.choice((0, 1_715_000_000_123, -1, 2**62)), "at_ms": rng.randrange(2**41),
                "command_id": text(), "client_id": text(), "links": [] if rng.random() < 0.9 else [text()],
                "metadata": {} if rng.random() < 0.9 else {text(): text()}, "rate_snapshot_id": maybe()}
    if name == "balance":
        return {"account_id": text(), "currency": text(), "status": text(), "posted": amount(), "held": amount(),
                "available": amount(), "seq": rng.choice((0, 1, 2**40, -1)), "last_transaction_id": maybe(),
                "updated_at_ms": rng.randrange(2**41), "account_type": maybe()}
    return {"command_id": text(), "client_id": text(), "outcome": rng.choice(("accepted", "rejected")),
            "reason": maybe(), "detail": text(), "duplicate": rng.random() < 0.2, "transaction_id": maybe(),
            "at_ms": rng.randrange(2**41), "holds": [] if rng.random() < 0.9 else [
                {"hold_id": text(), "account_id": text(), "amount": amount(), "captured": "0", "released": "0",
                 "status": "open", "expires_at_ms": None}]}


def fuzz_loader(directory: Path, cases: int, seed: int) -> int:
    """The replay loader's common case (projections/fastload.pyx) fed the same kinds of hostile records, one
    at a time with a fresh state, making rows (as for PostgreSQL) and inserting them into SQLite directly. A
    record it takes must be one the Python loop takes the same way: it decodes, can be folded, and gives the
    same row; anything else it must hand back untouched."""
    import sqlite3

    import fastavro

    from projections import bulk, fastload
    from projections.fold import unfoldable
    from projections.store import SCHEMA_TABLES
    from schemas import cdecode
    from schemas.codec import codec
    from tests.helpers.stub_consumer import Message
    from tests.helpers.pgcopy import rows_of

    module = cdecode.load_module(fastload.SOURCE, directory)
    if module is None or not module.bind_library(next(
            line.split()[-1] for line in open("/proc/self/maps") if "/libsqlite3" in line).encode()):
        print(f"fastload: no module built in {directory}, or no shared SQLite", file=sys.stderr)
        return 2
    c = codec()
    failures = total = 0
    conn = sqlite3.connect(":memory:", isolation_level=None)
    conn.executescript(SCHEMA_TABLES)
    for name, topic in (("history", "history"), ("result", "results"), ("balance", "balances")):
        rng = random.Random(f"{seed}:fastload:{name}")
        named: dict = {}
        parsed = fastavro.parse_schema(schemas()[name], named_schemas=named, _write_hint=False)
        body = compiled()[name]
        plain = [body.encode(small(parsed, named, rng)) for _ in range(100)]
        plain += [body.encode(_common(name, rng)) for _ in range(300)]  # what the fast path takes
        header = c.header(name)
        taken = 0
        for i in range(cases):
            kind, data, _ = case(rng, plain)
            value = header + data
            direct = i % 2 == 1
            rows: dict[str, list] = {"history": [], "results": []}
            state = {"remaining": {(topic, 0): 1}, "offsets": {}, "seen": {}, "refold": set(), "keys": set(),
                     "balances": {}}
            batch = module.Batch(conn if direct else None, fastload._insert("history", fastload.HISTORY_BIND),
                                 fastload._insert("results", fastload.RESULT_BIND), {topic: topic},
                                 state["remaining"], state["offsets"], state["seen"], state["refold"], state["keys"],
                                 state["balances"], c.header("history"), c.header("result"), c.header("balance"),
                                 c.body_decoder("balance"))
            if direct:
                conn.execute("BEGIN")
            at = batch.run([Message(topic, 0, 0, value)], 0)
            if i % 4 == 0:  # a PostgreSQL loader's kept history rows handed over in parts (one row each here)
                parts = list(iter(lambda: batch.history_part(1), None))
                if parts:
                    rows["history"] += rows_of(b"".join(parts), bulk.PgSink.TYPES["history"])
            batch.flush()  # (a history row taken is written here: into SQLite, or into the COPY stream)
            for table, data in ([] if direct else batch.copies()):  # a PostgreSQL loader's rows, read back
                rows[table] += rows_of(data, bulk.PgSink.TYPES[table])
            batch.close()  # (a balance record taken is decoded into `balances` here)
            if topic == "balances":
                got = [state["balances"]] if state["balances"] else []
            elif direct:
                got = [tuple(r) for r in conn.execute(f"SELECT * FROM {topic}")]
            else:
                got = rows[topic]
            if direct:
                conn.execute("ROLLBACK")
            total += 1
            if at == 0:
                if got or state["offsets"] or batch.applied:
                    failures += 1
                    print(f"CHANGED {name} {kind}: handed back after applying: {value.hex()[:300]}", flush=True)
                continue
            taken += 1
            try:
                v = c.decode(name, value)
                why = unfoldable(topic, v)
            except Exception as exc:
                v, why = None, f"{type(exc).__name__}: {exc}"
            if topic == "history":
                expected = [] if why else [bulk.history_row(v, int(v["amount"]), v["held_after"])]
            elif topic == "balances":
                expected = [] if why else [{v["account_id"]: v}]
            else:
                expected = [] if why or v["duplicate"] else [bulk.result_row(v)]
            if why or got != expected or batch.applied != 1:
                failures += 1
                if failures <= 20:
                    print(f"DIFFERS {name} {kind} direct={direct}: {value.hex()[:300]}\n  python: {why or expected}"
                          f"\n  fast:   {got}", flush=True)
        print(f"fastload {name}: {cases:,} records, {taken:,} taken by the fast path, the rest handed back",
              flush=True)
    parts = _fuzz_history_parts(module, c, cases, seed)
    failures += parts
    print(f"fastload: {total:,} records, {failures} differing from the Python loop; no AddressSanitizer report",
          flush=True)
    return 1 if failures else 0


def _fuzz_history_parts(module, c, cases: int, seed: int) -> int:
    """A PostgreSQL loader's kept history rows handed over in parts (Batch.history_part) resume row after row
    and account after account: batches of up to 60 entries over 4 accounts, handed over in parts of one byte
    (one row each) and of 300 bytes, each against the same records' rows made whole (flush, copies). The
    number of batches whose rows differ."""
    from projections import bulk, fastload
    from tests.helpers.pgcopy import rows_of
    from tests.helpers.stub_consumer import Message

    rng = random.Random(f"{seed}:fastload:parts")
    body, header, differing, rows_total = compiled()["history"], c.header("history"), 0, 0

    def batch():
        return module.Batch(None, fastload._insert("history", fastload.HISTORY_BIND),
                            fastload._insert("results", fastload.RESULT_BIND), {"history": "history"},
                            {("history", 0): 1 << 40}, {}, {}, set(), set(), {}, c.header("history"),
                            c.header("result"), c.header("balance"), c.body_decoder("balance"))

    for _ in range(max(1, cases // 100)):
        accounts = [f"user:{rng.randrange(10**6)}:USD" for _ in range(4)]
        seqs = dict.fromkeys(accounts, 0)
        values = []
        for offset in range(rng.randrange(1, 61)):
            account = rng.choice(accounts)
            seqs[account] += 1
            v = _common("history", rng)
            v.update(account_id=account, seq=seqs[account], occurred_at_ms=offset, at_ms=offset)
            values.append(header + body.encode(v))
        made = []
        for size in (1, 300, None):
            b = batch()
            for offset, value in enumerate(values):
                b.run([Message("history", 0, offset, value)], 0)  # (a record handed back is left as it was)
            streams = []
            if size is not None:
                streams.append(b"".join(iter(lambda: b.history_part(size), None)))
            b.flush()
            streams += [data for table, data in b.copies() if table == "history"]
            b.close()
            made.append([row for data in streams if data for row in rows_of(data, bulk.PgSink.TYPES["history"])])
        rows_total += len(made[-1])
        if made[0] != made[2] or made[1] != made[2]:
            differing += 1
            print(f"DIFFERS history parts: {len(made[0])}, {len(made[1])} rows in parts, {len(made[2])} whole",
                  flush=True)
    print(f"fastload history parts: {max(1, cases // 100):,} batches, {rows_total:,} rows handed over in parts",
          flush=True)
    return differing


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=100_000, help="random cases per schema")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--only", default="", help="comma-separated schema names (default: all)")
    args = parser.parse_args()
    only = [s for s in args.only.split(",") if s]
    if os.environ.get(_CHILD):
        status = fuzz(Path(os.environ[_CHILD]), args.cases, args.seed, only)
        if not only or "fastload" in only:
            status = max(status, fuzz_loader(Path(os.environ[_CHILD]), args.cases, args.seed))
        return status
    libasan = subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True, text=True,
                             check=True).stdout.strip()
    if not os.path.isabs(libasan):
        print("fuzz_cdecode: gcc has no libasan.so (AddressSanitizer); install it (e.g. libasan8)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="ledger-asan-") as tmp:
        flags = {"CFLAGS": "-fsanitize=address -fno-omit-frame-pointer -O1 -g",
                 "LDFLAGS": "-fsanitize=address"}
        subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; "
                        "sys.path.insert(0, sys.argv[1]); import scripts.fuzz_cdecode as f; f.build(Path(sys.argv[2]))",
                        str(ROOT), tmp], env={**os.environ, **flags}, check=True, cwd=ROOT)
        env = {**os.environ, _CHILD: tmp, "LD_PRELOAD": libasan, "PYTHONMALLOC": "malloc",
               "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1:halt_on_error=1"}
        status = subprocess.run([sys.executable, __file__, *sys.argv[1:]], env=env, cwd=ROOT).returncode
    if status < 0 or status > 2:
        print(f"fuzz_cdecode: the fuzzing interpreter died (status {status}): a crash of a compiled decoder",
              file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
