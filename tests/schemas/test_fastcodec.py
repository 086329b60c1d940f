"""schemas.fastcodec must write exactly fastavro's bytes and read back exactly fastavro's values.

No Kafka needed. Every schema the ledger writes is checked with generated records (fastavro's own
generator and Hypothesis strategies derived from the schema), hand-written edge cases, type errors,
and decoding of hostile bytes (random, truncated, mutated, absurd lengths).
"""
from __future__ import annotations

import io
import json
import shutil
import struct

import fastavro
import pytest
from fastavro.utils import generate_many
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas.codec import MARKER, SCHEMA_DIR, SCHEMA_NAMES, Codec, DecodeError, _fingerprint
from schemas.fastcodec import compile_schema
from tests.helpers.avro import GENERIC, INT_MAX, INT_MIN, LONG_MAX, LONG_MIN, PARSED, STRATEGIES, fill, raw, zz

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


COMPILED = {name: compile_schema(raw(name)) for name in SCHEMA_NAMES}


def fa_write(parsed, record) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, parsed, record)
    return out.getvalue()


def fa_read(parsed, data: bytes):
    buf = io.BytesIO(data)
    value = fastavro.schemaless_reader(buf, parsed, None, return_record_name=True)
    assert buf.tell() == len(data)
    return value


def check_same(name: str, record) -> bytes:
    """Compiled encode == fastavro encode; compiled decode == fastavro decode; returns the bytes."""
    parsed, compiled = PARSED[name], COMPILED[name]
    record = fill(name, record)
    expected = fa_write(parsed, record)
    assert compiled.encode(record) == expected
    value, end = compiled.decode(expected, 0)
    assert end == len(expected)
    assert value == fa_read(parsed, expected)
    # Also with a prefix before the value (the codec decodes at offset 10).
    assert compiled.decode(b"0123456789" + expected, 10) == (value, len(expected) + 10)
    return expected


# ------------------------------------------------------------------------------ equivalence tests
@pytest.mark.parametrize("name", SCHEMA_NAMES)
def test_fastavro_generated_records(name):
    for record in generate_many(PARSED[name], 150):
        # generate_many gives union-of-record values as bare dicts (fastavro's best match; the
        # compiled encoder delegates those to fastavro) ...
        data = check_same(name, record)
        # ... and the tuple notation our callers use, taken from the decoded value.
        check_same(name, fa_read(PARSED[name], data))


@pytest.mark.parametrize("name", SCHEMA_NAMES)
def test_hypothesis_records(name):
    @FAST
    @given(STRATEGIES[name])
    def run(record):
        check_same(name, record)

    run()


AT = 1_715_000_000_123
LEG = {"account_id": "alice-EUR", "amount": "-1500", "hold_id": None, "currency": None}
POST = {"transaction_id": "tx", "legs": [LEG], "kind": "transfer", "reference": None, "links": [],
        "metadata": {}, "occurred_at_ms": None, "rate_snapshot_id": None}
BODIES = [
    ("ledger.OpenAccount", {"account_id": "a", "currency": "EUR", "allow_negative": True, "overdraft_limit": "0",
                            "max_balance": "10", "routing_key": None}),
    ("ledger.FreezeAccount", {"account_id": ""}),
    ("ledger.UnfreezeAccount", {"account_id": "ünïcødé 🙂"}),
    ("ledger.CloseAccount", {"account_id": "x" * 5000}),
    ("ledger.PostTransaction", POST),
    ("ledger.PostTransaction", {**POST, "legs": [LEG, {**LEG, "hold_id": "h", "currency": "EUR"}] * 70,
                                "links": ["", "l2"], "metadata": {"": "", "k": "日本"}, "occurred_at_ms": LONG_MIN,
                                "reference": "r", "rate_snapshot_id": "s"}),
    ("ledger.PlaceHold", {"hold_id": "h", "account_id": "a", "amount": "1", "expires_at_ms": LONG_MAX}),
    ("ledger.PlaceHold", {"hold_id": "h", "account_id": "a", "amount": "1", "expires_at_ms": -1}),
    ("ledger.ReleaseHold", {"hold_id": "h"}),
    ("ledger.ExpireHold", {"hold_id": "h"}),
]


@pytest.mark.parametrize("body", BODIES, ids=lambda b: b[0])
def test_every_command_branch(body):
    check_same("command", {"command_id": "c", "client_id": "", "body": body})


def test_edge_cases_other_schemas():
    hold = {"hold_id": "h", "account_id": "a", "amount": "-1", "captured": "0", "released": "0", "status": "open",
            "expires_at_ms": None}
    for outcome in ("accepted", "rejected"):
        check_same("result", {"command_id": "", "client_id": "€", "outcome": outcome, "reason": "r" * 200,
                              "detail": "", "duplicate": True, "transaction_id": None, "at_ms": 0,
                              "holds": [hold, {**hold, "expires_at_ms": 2**62}]})
    for value in (LONG_MIN, LONG_MAX, -64, -65, 63, 64, 0, AT, -AT):
        check_same("history", {"entry_id": "e", "account_id": "a", "currency": "", "seq": value, "amount": "0",
                               "posted_after": "0", "held_after": "0", "transaction_id": None, "kind": "k",
                               "reference": "", "hold_id": "h", "occurred_at_ms": value, "at_ms": value,
                               "command_id": "c", "client_id": "c"})
        check_same("balance", {"account_id": "a", "currency": "EUR", "status": "open", "posted": "1", "held": "0",
                               "available": "1", "seq": value, "last_transaction_id": None, "updated_at_ms": value})
    for part in (INT_MIN, INT_MAX, 0, -1):
        for key, value in ((None, None), (b"", b""), (b"\x00\xff", bytearray(b"x" * 3000))):
            check_same("dead_letter", {"reason": "corrupt", "detail": "d", "topic": "t", "partition": part,
                                       "offset": LONG_MAX, "timestamp_ms": LONG_MIN, "key": key, "value": value})
    account = {"account_id": "a", "currency": "EUR", "routing_key": "a", "allow_negative": False,
               "overdraft_limit": "0", "max_balance": None, "status": "open", "posted": "0", "held": "0", "seq": 1,
               "last_transaction_id": "t", "updated_at_ms": AT}
    state_hold = {**hold, "capture_transaction_ids": ["t1", ""]}
    check_same("state", {"client_id": "c", "command_id": "c", "fingerprint": "f", "source_partition": 0,
                         "source_offset": 0, "accounts": [], "holds": [], "result": b""})
    check_same("state", {"client_id": "c", "command_id": "c", "fingerprint": "f", "source_partition": 7,
                         "source_offset": 2**40, "accounts": [account] * 3, "holds": (state_hold,),
                         "result": bytes(range(256)) * 10})


# ------------------------------------------------------------------------------ encode type errors
HISTORY = {"entry_id": "e", "account_id": "a", "currency": "EUR", "seq": 1, "amount": "0", "posted_after": "0",
           "held_after": "0", "transaction_id": None, "kind": "k", "reference": None, "hold_id": None,
           "occurred_at_ms": AT, "at_ms": AT, "command_id": "c", "client_id": "c"}


@pytest.mark.parametrize("field,value", [
    ("entry_id", 5), ("entry_id", None), ("entry_id", b"bytes"), ("seq", "1"), ("seq", 1.0), ("seq", None),
    ("seq", 2**63), ("at_ms", -(2**63) - 1), ("transaction_id", 5), ("transaction_id", b"x"),
    ("reference", ("long", 5)), ("hold_id", ("nope", "x")),
])
def test_type_errors_raise(field, value):
    with pytest.raises((TypeError, ValueError, OverflowError)):
        COMPILED["history"].encode(fill("history", {**HISTORY, field: value}))


def test_missing_field_raises():
    record = fill("history", HISTORY)
    del record["kind"]
    with pytest.raises(KeyError):
        COMPILED["history"].encode(record)


def test_more_type_errors_raise():
    result = {"command_id": "c", "client_id": "c", "outcome": "accepted", "reason": None, "detail": "",
              "duplicate": False, "transaction_id": None, "at_ms": 0, "holds": []}
    for field, value in (("outcome", "maybe"), ("outcome", 0), ("duplicate", 1), ("duplicate", None),
                         ("holds", "ab"), ("holds", None), ("holds", [{"hold_id": "h"}])):
        with pytest.raises((TypeError, ValueError, KeyError)):
            COMPILED["result"].encode(fill("result", {**result, field: value}))
    dead = {"reason": "r", "detail": "d", "topic": "t", "partition": 2**31, "offset": 0, "timestamp_ms": 0,
            "key": None, "value": None}
    with pytest.raises(OverflowError):
        COMPILED["dead_letter"].encode(fill("dead_letter", dead))
    with pytest.raises(ValueError):
        COMPILED["dead_letter"].encode(fill("dead_letter", {**dead, "partition": 0, "key": "str"}))
    with pytest.raises(ValueError):  # a record type that is not a branch of the union
        COMPILED["command"].encode({"command_id": "c", "client_id": "c", "body": ("ledger.Leg", LEG)})
    with pytest.raises(TypeError):
        COMPILED["command"].encode({"command_id": "c", "client_id": "c",
                                    "body": ("ledger.PostTransaction", {**POST, "metadata": {"k": 1}})})


# ------------------------------------------------------------------------------- hostile decoding
def _safe_decode(name: str, data: bytes):
    """Compiled decode of data: must return (value, end) or raise an ordinary exception."""
    try:
        value, end = COMPILED[name].decode(data, 0)
    except (ValueError, IndexError, TypeError, OverflowError) as exc:  # UnicodeDecodeError is a ValueError
        return exc
    assert 0 <= end <= len(data)
    return value, end


@pytest.mark.parametrize("name", SCHEMA_NAMES)
def test_every_truncation_raises(name):
    for record in generate_many(PARSED[name], 15):
        data = fa_write(PARSED[name], record)
        step = max(1, len(data) // 150)  # bounded: every cut near both ends, a sample in between
        cuts = set(range(0, min(len(data), 40))) | set(range(max(0, len(data) - 40), len(data)))
        for cut in sorted(cuts | set(range(0, len(data), step))):
            assert isinstance(_safe_decode(name, data[:cut]), Exception), (name, cut)


@pytest.mark.parametrize("name", SCHEMA_NAMES)
def test_random_bytes(name):
    @settings(max_examples=150, deadline=None)
    @given(st.binary(max_size=300))
    def run(data):
        _safe_decode(name, data)

    run()


@pytest.mark.parametrize("name", SCHEMA_NAMES)
def test_mutated_records_agree_with_fastavro(name):
    samples = [fa_write(PARSED[name], r) for r in generate_many(PARSED[name], 10)]

    @settings(max_examples=150, deadline=None)
    @given(st.sampled_from(samples), st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=3))
    def run(data, flips):
        mutated = bytearray(data)
        for pos, byte in flips:
            mutated[pos % len(mutated)] = byte
        mutated = bytes(mutated)
        ours = _safe_decode(name, mutated)
        if isinstance(ours, Exception):
            return
        value, end = ours
        try:
            buf = io.BytesIO(mutated)
            theirs = fastavro.schemaless_reader(buf, PARSED[name], None, return_record_name=True)
        except Exception:
            return  # fastavro refuses what we accept (e.g. a boolean byte 2): allowed
        assert (value, end) == (theirs, buf.tell())

    run()


@pytest.mark.parametrize("data", [
    zz(2**62) + b"abc",                      # string length far beyond the data
    zz(-5) + b"abc",                          # negative length
    b"\xff" * 11 + b"\x01",                     # varint longer than 10 bytes
    b"\xff" * 30,                               # unterminated varint
    zz(1) + b"a" + zz(1) + b"b" + zz(2),    # a string longer than the data left
    zz(1) + b"\xff" + zz(0) + zz(0),        # invalid UTF-8 in a string
])
def test_hostile_balance_prefixes(data):
    assert isinstance(_safe_decode("balance", data), Exception)


def test_absurd_counts_and_indexes():
    base = zz(1) + b"c" + zz(1) + b"c" + zz(1) + b"f" + zz(0) + zz(0)  # state up to source_offset
    for tail in (zz(2**40), zz(-(2**40)) + zz(5), zz(LONG_MAX)):     # accounts block count
        assert isinstance(_safe_decode("state", base + tail + b"\x00" * 50), Exception)
    command = zz(1) + b"c" + zz(1) + b"c"
    for index in (8, 9, -1, 2**40):
        assert isinstance(_safe_decode("command", command + zz(index) + zz(1) + b"h"), Exception)
    result = command + zz(2)  # enum index 2 of [accepted, rejected]
    assert isinstance(_safe_decode("result", result + b"\x00" * 20), Exception)
    assert isinstance(_safe_decode("result", command + zz(-1) + b"\x00" * 20), Exception)


def test_multi_block_arrays_and_maps_decode():
    """Other writers may split arrays/maps in several blocks, with negative counts and byte sizes."""
    legs = [{"account_id": f"a{i}", "amount": str(i), "hold_id": None, "currency": None} for i in range(3)]
    leg_bytes = [fa_write(fastavro.parse_schema({"type": "record", "name": "L", "fields": [
        {"name": "account_id", "type": "string"}, {"name": "amount", "type": "string"},
        {"name": "hold_id", "type": ["null", "string"]}, {"name": "currency", "type": ["null", "string"]}]}), leg)
        for leg in legs]
    body = (zz(1) + b"t"
            + zz(1) + leg_bytes[0] + zz(-2) + zz(len(leg_bytes[1] + leg_bytes[2])) + leg_bytes[1] + leg_bytes[2]
            + zz(0)
            + zz(1) + b"k" + zz(0)
            + zz(1) + zz(1) + b"l" + zz(0)
            + zz(1) + zz(1) + b"a" + zz(1) + b"1" + zz(-1) + zz(4) + zz(1) + b"b" + zz(1) + b"2" + zz(0)
            + zz(0) + zz(0))
    data = zz(1) + b"c" + zz(1) + b"d" + zz(4) + body
    value, end = COMPILED["command"].decode(data, 0)
    assert end == len(data)
    assert value == fa_read(PARSED["command"], data)
    assert value["body"][1]["legs"] == legs and value["body"][1]["metadata"] == {"a": "1", "b": "2"}


# ------------------------------------------------------------------- generic schema features
def test_generic_schema_features():
    parsed = fastavro.parse_schema(GENERIC)
    compiled = compile_schema(GENERIC)
    chain = {"label": "a", "next": {"label": "b", "next": {"label": "", "next": None}}}
    base = {"kind": "A", "again": "C", "maybe_kind": None, "node": chain, "nodes": {"k": [chain, chain], "e": []},
            "prims": None, "matrix": [[1, -2], [], [LONG_MAX]],
            "choice": None}
    records = [base, {**base, "maybe_kind": "B", "choice": ("x.y.Node", chain), "prims": True},
               {**base, "choice": ("z.Other", {"n": -7}), "prims": 5},
               {**base, "prims": "s"}, {**base, "prims": b"b"}, {**base, "prims": LONG_MAX},
               {**base, "prims": ("long", 3)}, {**base, "prims": ("int", 3)}]
    records += list(generate_many(parsed, 50))
    for record in records:
        expected = fa_write(parsed, record)
        assert compiled.encode(record) == expected, record
        value, end = compiled.decode(memoryview(expected), 0)
        assert end == len(expected)
        assert value == fa_read(parsed, expected)


@pytest.mark.parametrize("schema", [
    {"type": "long", "logicalType": "timestamp-millis"},
    {"type": "record", "name": "R", "fields": [
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}}]},
    {"type": "record", "name": "R", "fields": [{"name": "amount", "type": ["null", {
        "type": "bytes", "logicalType": "decimal", "precision": 38, "scale": 2}]}]},
    {"type": "array", "items": {"type": "string", "logicalType": "uuid"}},
    {"type": "map", "values": {"type": "int", "logicalType": "date"}},
    "double", {"type": "record", "name": "R", "fields": [{"name": "f", "type": "float"}]},
    {"type": "fixed", "name": "F", "size": 4}, {"type": "error", "name": "E", "fields": []},
])
def test_logical_types_and_types_the_ledger_does_not_use_are_refused(schema):
    """A logical type would be written as its underlying type without fastavro's conversion (a datetime, a
    Decimal): refused at compile time rather than encoded differently from fastavro."""
    with pytest.raises(ValueError, match="not supported"):
        compile_schema(schema)



@pytest.mark.parametrize("schema", [
    {"type": "array", "items": "null"},
    {"type": "record", "name": "R", "fields": [{"name": "many", "type": {"type": "array", "items": {
        "type": "record", "name": "Empty", "fields": []}}}]},
    {"type": "record", "name": "R", "fields": [{"name": "x", "type": ["null", {"type": "array", "items": {
        "type": "record", "name": "Nulls", "fields": [{"name": "a", "type": "null"}]}}]}]},
    {"type": "map", "values": {"type": "array", "items": "null"}},
])
def test_arrays_of_items_that_take_no_bytes_are_refused(schema):
    """A block count of such items costs nothing to write: a few bytes could make a decoder build billions."""
    with pytest.raises(ValueError, match="may take no bytes"):
        compile_schema(schema)


def test_arrays_of_items_that_take_a_byte_compile():
    for items in ("boolean", "string", ["null", "string"], {"type": "record", "name": "One", "fields": [
            {"name": "a", "type": "null"}, {"name": "b", "type": "int"}]},
                  {"type": "record", "name": "Node", "fields": [{"name": "next", "type": ["null", "Node"]}]}):
        compiled = compile_schema({"type": "array", "items": items})
        assert compiled.decode(compiled.encode([]), 0) == ([], 1)

def test_every_ledger_schema_compiles():
    """The refusal above never hits a schema the ledger reads or writes (current and older versions)."""
    for path in sorted(SCHEMA_DIR.glob("*.avsc")) + sorted((SCHEMA_DIR / "versions").glob("*.avsc")):
        compile_schema(json.loads(path.read_text()))


def test_prefix_and_primitive_top_level():
    c = compile_schema({"type": "array", "items": "string"}, prefix=b"\x01\x02")
    assert c.encode(["a"]) == b"\x01\x02" + fa_write(fastavro.parse_schema({"type": "array", "items": "string"}),
                                                      ["a"])
    assert c.decode(b"\x02\x02a\x00", 0) == (["a"], 4)
    s = compile_schema("long")
    assert s.encode(-3) == b"\x05" and s.decode(b"\x05", 0) == (-3, 1)


# ---------------------------------------------------------------------------------- Codec level
def test_codec_roundtrip_and_errors():
    c = Codec()
    record = fill("command", {"command_id": "c", "client_id": "d", "body": BODIES[4]})
    data = c.encode("command", record)
    assert data[:10] == c.current["command"].header
    assert data[10:] == fa_write(PARSED["command"], record)
    assert c.decode("command", data) == record
    assert c.decode("command", memoryview(data)) == record
    cases = [(b"", "empty"), (None, "empty"), (b"xx" + data[2:], "not_avro"), (data[:5], "not_avro"),
             (MARKER + b"\x00" * 8 + data[10:], "unknown_schema"), (data + b"\x00", "corrupt"),
             (data[:-1], "corrupt"), (data[:10], "corrupt")]
    for bad, reason in cases:
        with pytest.raises(DecodeError) as err:
            c.decode("command", bad)
        assert err.value.reason == reason
    with pytest.raises(DecodeError) as err:
        c.decode("result", data)
    assert err.value.reason == "wrong_schema"
    with pytest.raises(DecodeError, match="trailing"):
        c.decode("command", data + b"\x00\x00")


def test_codec_decodes_older_versions_with_fastavro(tmp_path):
    """A message of an older writer schema (schemas/versions/) still resolves into the current one."""
    for name in SCHEMA_NAMES:
        shutil.copy(SCHEMA_DIR / f"{name}.avsc", tmp_path / f"{name}.avsc")
    old = raw("balance")
    old["fields"] = [f for f in old["fields"] if f["name"] != "last_transaction_id"]
    (tmp_path / "versions").mkdir()
    (tmp_path / "versions" / "balance.v1.avsc").write_text(json.dumps(old))
    c = Codec(tmp_path)
    record = {"account_id": "a", "currency": "EUR", "status": "open", "posted": "1", "held": "0", "available": "1",
              "seq": 3, "updated_at_ms": AT}
    header = MARKER + _fingerprint(fastavro.parse_schema(old, _write_hint=False))
    data = header + fa_write(fastavro.parse_schema(old), record)
    assert c.decode("balance", data) == fill("balance", {**record, "last_transaction_id": None})
    with pytest.raises(DecodeError) as err:
        c.decode("balance", data[:-1])
    assert err.value.reason == "corrupt"
    assert struct.unpack("<Q", header[2:])[0] != struct.unpack("<Q", c.current["balance"].header[2:])[0]


def test_a_field_with_a_default_may_be_left_out_as_fastavro_allows():
    """A producer written before a field existed (an OpenAccount without account_type) still encodes."""
    old = {"command_id": "c", "client_id": "x", "body": ("ledger.OpenAccount", {
        "account_id": "a", "currency": "EUR", "allow_negative": False, "overdraft_limit": "0", "max_balance": None,
        "routing_key": None})}
    new = {**old, "body": ("ledger.OpenAccount", {**old["body"][1], "account_type": None})}
    assert COMPILED["command"].encode(old) == fa_write(PARSED["command"], old) == COMPILED["command"].encode(new)
