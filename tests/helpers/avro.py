"""Avro test material shared by the codec tests: the ledger's schemas as fastavro parses them, Hypothesis
strategies derived from a schema, a generic schema using every feature the generated codec supports, and a
zig-zag varint writer for hand-made hostile bytes."""
from __future__ import annotations

import json

import fastavro
from hypothesis import strategies as st

from schemas.codec import SCHEMA_DIR, SCHEMA_NAMES
from schemas.fastcodec import _varint

LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1
INT_MIN, INT_MAX = -(2**31), 2**31 - 1


def raw(name: str) -> dict:
    return json.loads((SCHEMA_DIR / f"{name}.avsc").read_text())


PARSED = {name: fastavro.parse_schema(raw(name)) for name in SCHEMA_NAMES}


def fill(name: str, record: dict) -> dict:
    """The record with the defaults of top-level fields it lacks (schemas gain fields over time)."""
    return {f["name"]: record[f["name"]] if f["name"] in record else f["default"]
            for f in PARSED[name]["fields"]}


# ------------------------------------------------------------------------ strategies from a schema
def strategy(schema, named: dict):
    """Records of `schema` (fastavro-parsed form) in the notation our callers use."""
    if isinstance(schema, str):
        prim = {
            "null": st.none(), "boolean": st.booleans(),
            "int": st.integers(INT_MIN, INT_MAX) | st.sampled_from([INT_MIN, INT_MAX, 0, -1, 63, -64, 64, -65]),
            "long": st.integers(LONG_MIN, LONG_MAX)
            | st.sampled_from([LONG_MIN, LONG_MAX, LONG_MIN + 1, LONG_MAX - 1, 0, -1, 1_715_000_000_123]),
            "string": st.text(max_size=20) | st.sampled_from(["", "é", "€", "日本語", "🙂", "a" * 300]),
            "bytes": st.binary(max_size=20) | st.just(b"\x00" * 200),
        }
        if schema in prim:
            return prim[schema]
        return st.deferred(lambda: strategy(named[schema], named))
    if isinstance(schema, list):
        options = []
        for branch in schema:
            inner = strategy(branch, named)
            resolved = named.get(branch, branch) if isinstance(branch, str) else branch
            if isinstance(resolved, dict) and resolved["type"] == "record":
                options.append(inner.map(lambda v, n=resolved["name"]: (n, v)))
            else:
                options.append(inner)
        return st.one_of(options)
    t = schema["type"]
    if t == "record":
        return st.fixed_dictionaries({f["name"]: strategy(f["type"], named) for f in schema["fields"]})
    if t == "enum":
        return st.sampled_from(schema["symbols"])
    if t == "array":
        return st.lists(strategy(schema["items"], named), max_size=3)
    if t == "map":
        return st.dictionaries(st.text(max_size=5), strategy(schema["values"], named), max_size=3)
    return strategy(t, named)


def named_types(name: str) -> dict:
    named: dict = {}
    fastavro.parse_schema(raw(name), named_schemas=named, _write_hint=False)
    return named


STRATEGIES = {name: strategy(fastavro.parse_schema(raw(name), _write_hint=False), named_types(name))
              for name in SCHEMA_NAMES}


def zz(n: int) -> bytes:
    """The zig-zag varint of any n in a long's range (also beyond it, for hostile bytes: 2**63 and more)."""
    return _varint((n << 1) ^ (n >> 63) if n < 0 else n << 1)


GENERIC = {
    "type": "record", "name": "Outer", "namespace": "x.y",
    "fields": [
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "namespace": "other", "symbols": ["A", "B", "C"]}},
        {"name": "again", "type": "other.Kind"},
        {"name": "maybe_kind", "type": ["null", "other.Kind"]},
        {"name": "node", "type": {"type": "record", "name": "Node", "fields": [
            {"name": "label", "type": "string"},
            {"name": "next", "type": ["null", "Node"]}]}},
        {"name": "nodes", "type": {"type": "map", "values": {"type": "array", "items": "x.y.Node"}}},
        {"name": "prims", "type": ["null", "boolean", "int", "string", "bytes", "long"]},
        {"name": "matrix", "type": {"type": "array", "items": {"type": "array", "items": "long"}}},
        {"name": "choice", "type": ["null", "Node", {"type": "record", "name": "Other", "namespace": "z",
                                                      "fields": [{"name": "n", "type": "int"}]}]},
    ],
}
