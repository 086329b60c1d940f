"""Schema-specialised Avro binary encoder/decoder, generated as Python source once per schema.

`compile_schema(schema)` turns an Avro schema (raw JSON or fastavro-parsed) into a `Compiled` with

* `encode(record) -> bytes`: byte-for-byte what `fastavro.schemaless_writer` writes for a valid record
  (zig-zag varints, length-prefixed UTF-8 strings and bytes, unions as branch index + value, arrays and
  maps as one block + terminating 0, enums as index). Stricter than fastavro on type errors: a float for
  a long, an int for a boolean, a str for an array, a long out of 64-bit (int out of 32-bit) range raise
  instead of being truncated or coerced.
* `decode(data, offset) -> (record, end_offset)`: what `fastavro.schemaless_reader(...,
  return_record_name=True)` returns (union branches that are records as `(fullname, dict)` tuples).
  Hostile input raises (IndexError, ValueError, UnicodeDecodeError, ...): every length and count is
  checked against the bytes that remain before anything is allocated or looped over.

Supported types: the ones the ledger's schemas use, no more: null, boolean, int, long, bytes, string,
record, enum, array, map, unions, named-type references, namespaces, except an array whose items may
take no bytes (null, a record of nulls): see _refuse_items_of_no_bytes. Anything else (float, double,
fixed, error, a logicalType) is refused when the schema is compiled: ValueError, never a silent
approximation (a logical type would need its own conversions, as fastavro applies them). Each named
record gets its own generated encode/decode function, so recursive types work. Generated source is kept
on `Compiled.source` for inspection.
"""
from __future__ import annotations

import io
from typing import Any, Callable

import fastavro

from schemas import cdecode

__all__ = ["Compiled", "compile_schema"]

_PRIMITIVES = ("null", "boolean", "int", "long", "bytes", "string")
_NAMED = ("record", "enum")
_LONG_MIN, _LONG_MAX = -(1 << 63), (1 << 63) - 1
_INT_MIN, _INT_MAX = -(1 << 31), (1 << 31) - 1
_TABLE = 1024  # lengths below this have a precomputed header


# ---------------------------------------------------------------------------------------------- helpers
def _varint(n: int) -> bytes:
    """Unsigned varint of n >= 0 (already zig-zagged)."""
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


# _ZZ[i]: zig-zag varint of the non-negative i (a length or count); _UZ: same preceded by union index 1.
_ZZ = [_varint(i << 1) for i in range(_TABLE)]
_ZZ1 = [b"\x02" + z for z in _ZZ]
_SMALL = {i: _varint((i << 1) ^ (i >> 63)) for i in range(-64, 64)}
_LCACHE: dict[int, bytes] = {}  # recently written longs (timestamps repeat across a command's outputs)


def _as_int(n: Any) -> int:
    # bool and IntEnum are ints (fastavro writes them as such); float, str, None are not.
    if isinstance(n, int):
        return int(n)
    raise TypeError(f"an integer is required, got {type(n).__name__}")


def _wlong(n: Any) -> bytes:
    if n.__class__ is not int:
        n = _as_int(n)
        cache = False
    else:
        b = _LCACHE.get(n)
        if b is not None:
            return b
        cache = True
    if not _LONG_MIN <= n <= _LONG_MAX:
        raise OverflowError(f"{n} is out of range for an Avro long")
    b = _varint((n << 1) ^ (n >> 63))
    if cache:
        if len(_LCACHE) >= 4096:
            _LCACHE.clear()
        _LCACHE[n] = b
    return b


def _wint(n: Any) -> bytes:
    if n.__class__ is not int:
        n = _as_int(n)
    b = _SMALL.get(n)
    if b is not None:
        return b
    if not _INT_MIN <= n <= _INT_MAX:
        raise OverflowError(f"{n} is out of range for an Avro int")
    return _varint((n << 1) ^ (n >> 63))


def _len(n: int) -> bytes:
    return _ZZ[n] if n < _TABLE else _varint(n << 1)


def _wstr(v: Any) -> bytes:
    v = str.encode(v)  # TypeError unless a str
    n = len(v)
    return (_ZZ[n] if n < _TABLE else _varint(n << 1)) + v


def _to_bytes(v: Any) -> bytes:
    if v.__class__ is bytes:
        return v
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v)
    raise TypeError(f"a bytes-like object is required, got {type(v).__name__}")


def _wbytes(v: Any) -> bytes:
    v = _to_bytes(v)
    n = len(v)
    return (_ZZ[n] if n < _TABLE else _varint(n << 1)) + v


def _wbool(v: Any) -> bytes:
    if v is True:
        return b"\x01"
    if v is False:
        return b"\x00"
    raise TypeError(f"a boolean is required, got {type(v).__name__}")


def _wnull(v: Any) -> bytes:
    if v is not None:
        raise TypeError(f"None is required, got {type(v).__name__}")
    return b""


def _as_seq(v: Any) -> Any:
    if isinstance(v, (str, bytes, bytearray, memoryview, dict)) or not hasattr(v, "__len__"):
        raise TypeError(f"an array (list or tuple) is required, got {type(v).__name__}")
    return list(v)


def _as_map(v: Any) -> Any:
    if not hasattr(v, "items"):
        raise TypeError(f"a map (dict) is required, got {type(v).__name__}")
    return v


def _bad_union(v: Any, branches: Any) -> None:
    raise ValueError(f"{v!r} (type {type(v).__name__}) does not match any branch of {branches}")


def _bad_name(name: Any, branches: Any) -> None:
    raise ValueError(f"union branch name {name!r} not found in {branches}")


def _read_varint(d: bytes, p: int) -> tuple[int, int]:
    """Zig-zag varint at d[p]: (value, next position). At most 10 bytes, within 64 bits."""
    b = d[p]
    n = b & 0x7F
    shift = 7
    p += 1
    while b & 0x80:
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")
        b = d[p]
        p += 1
        n |= (b & 0x7F) << shift
        shift += 7
    if n >> 64:
        raise ValueError("varint beyond 64 bits")
    return (n >> 1) ^ -(n & 1), p


def _read_len(d: bytes, p: int) -> tuple[int, int]:
    n, p = _read_varint(d, p)
    if n < 0:
        raise ValueError(f"negative length {n}")
    if n > len(d) - p:
        raise ValueError(f"length {n} exceeds the {len(d) - p} remaining bytes")
    return n, p


def _read_count(d: bytes, p: int) -> tuple[int, int]:
    """Block count of an array/map; a negative count is followed by the block's byte size."""
    n, p = _read_varint(d, p)
    if n < 0:
        n = -n
        _, p = _read_varint(d, p)
    if n > len(d) - p:
        # Every item takes at least one byte for our types; refuse absurd counts before looping.
        raise ValueError(f"block count {n} exceeds the {len(d) - p} remaining bytes")
    return n, p


def _truncated() -> None:
    raise ValueError("truncated data")


def _bad_index(i: int, what: str) -> None:
    raise ValueError(f"invalid {what} index {i}")


# _SL[b]: the length a one-byte varint b stands for, -1 when b is negative or not a whole varint.
_SL = [b >> 1 if b < 0x80 and not b & 1 else -1 for b in range(256)]

_HELPERS = {
    "_SL": _SL,
    "_ZZ": _ZZ, "_ZZ1": _ZZ1, "_LC": _LCACHE, "_varint": _varint, "_wlong": _wlong, "_wint": _wint,
    "_len": _len, "_wstr": _wstr, "_wbytes": _wbytes, "_to_bytes": _to_bytes, "_wbool": _wbool,
    "_wnull": _wnull, "_as_seq": _as_seq, "_as_map": _as_map,
    "_bad_union": _bad_union, "_bad_name": _bad_name, "_rv": _read_varint, "_rlen": _read_len,
    "_rcount": _read_count, "_trunc": _truncated, "_badi": _bad_index, "_se": str.encode,
    "_TABLE": _TABLE,
}


# ------------------------------------------------------------------------------------------- generator
def _type_of(schema: Any) -> str:
    if isinstance(schema, list):
        return "union"
    if isinstance(schema, dict):
        return schema["type"] if isinstance(schema["type"], str) else _type_of(schema["type"])
    return schema


class _Gen:
    def __init__(self, parsed: Any, named: dict[str, Any]):
        self.named = named
        self.consts: dict[str, Any] = {}
        self.funcs: list[str] = []
        self.enc_names: dict[str, str] = {}  # record fullname -> encode function
        self.dec_names: dict[str, str] = {}
        self.tail: list[str] = []  # module-level statements after every function
        self.n = 0

    # -- shared
    def tmp(self, prefix: str = "t") -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    def const(self, value: Any, prefix: str = "_K") -> str:
        name = self.tmp(prefix)
        self.consts[name] = value
        return name

    def resolve(self, schema: Any) -> Any:
        """A named reference (string) to its definition; a {"type": {...}} wrapper to its content."""
        while True:
            if isinstance(schema, str) and schema not in _PRIMITIVES:
                schema = self.named[schema]
            elif isinstance(schema, dict) and not isinstance(schema["type"], str):
                schema = schema["type"]
            else:
                return schema

    def branch_name(self, schema: Any) -> str:
        """The name fastavro's tuple notation uses for a union branch."""
        if isinstance(schema, str):
            return schema  # primitive or fullname of a named type
        t = _type_of(schema)
        return schema["name"] if t in _NAMED else t

    # -- encoder ---------------------------------------------------------------------------------
    def enc_record_func(self, schema: dict, prefix: bytes = b"") -> str:
        name = schema["name"]
        if prefix:  # a top-level copy that also writes the prefix (no concatenation afterwards)
            fname = self.tmp("_enctop_")
        elif name in self.enc_names:
            return self.enc_names[name]
        else:
            fname = self.tmp("_enc_")
            self.enc_names[name] = fname
        lines = [f"def {fname}(r):"]
        parts: list[str] = [repr(prefix)] if prefix else []
        for field in schema["fields"]:
            # A field with a default may be left out, as fastavro's writer allows: a producer written before
            # the field existed keeps working (schemas gain fields with defaults over time).
            value = f"r[{field['name']!r}]" if "default" not in field else \
                f"r.get({field['name']!r}, {self.const(field['default'])})"
            stmts, fparts = self.enc(field["type"], value)
            lines += ["    " + s for s in stmts]
            parts += fparts
        if not parts:
            lines.append("    return b''")
        elif len(parts) == 1:
            lines.append(f"    return {parts[0]}")
        else:
            lines.append(f"    return b''.join(({', '.join(parts)},))")
        self.funcs.append("\n".join(lines))
        return fname

    def enc_func(self, schema: Any) -> str:
        """A function value -> bytes for any schema (used for items of arrays/maps)."""
        schema = self.resolve(schema)
        t = _type_of(schema)
        simple = {"string": "_wstr", "long": "_wlong", "int": "_wint", "bytes": "_wbytes", "boolean": "_wbool",
                  "null": "_wnull"}
        if t in simple:
            return simple[t]
        if t == "record":
            return self.enc_record_func(schema)
        fname = self.tmp("_encv_")
        stmts, parts = self.enc(schema, "v")
        lines = [f"def {fname}(v):"] + ["    " + s for s in stmts]
        lines.append(f"    return b''.join(({', '.join(parts)},))" if parts else "    return b''")
        self.funcs.append("\n".join(lines))
        return fname

    def enc(self, schema: Any, expr: str) -> tuple[list[str], list[str]]:
        """Statements to run and byte-expressions to join for writing `expr` of type `schema`."""
        schema = self.resolve(schema)
        t = _type_of(schema)
        if t == "string":
            v, n = self.tmp("v"), self.tmp("n")
            return ([f"{v} = _se({expr}); {n} = len({v})"],
                    [f"_ZZ[{n}] if {n} < _TABLE else _varint({n} << 1)", v])
        if t == "long":
            v, h = self.tmp("v"), self.tmp("h")
            return ([f"{v} = {expr}",
                     f"{h} = _LC.get({v}) if {v}.__class__ is int else None",
                     f"if {h} is None: {h} = _wlong({v})"], [h])
        if t == "int":
            return [], [f"_wint({expr})"]
        if t == "boolean":
            return [], [f"_wbool({expr})"]
        if t == "null":
            return [f"_wnull({expr})"], []
        if t == "bytes":
            v, n = self.tmp("v"), self.tmp("n")
            return ([f"{v} = _to_bytes({expr}); {n} = len({v})"],
                    [f"_ZZ[{n}] if {n} < _TABLE else _varint({n} << 1)", v])
        if t == "enum":
            table = self.const({s: _ZZ[i] if i < _TABLE else _varint(i << 1)
                                for i, s in enumerate(schema["symbols"])}, "_ENUM")
            v, h = self.tmp("v"), self.tmp("h")
            return ([f"{v} = {expr}",
                     f"{h} = {table}.get({v}) if {v}.__class__ is str else None",
                     f"if {h} is None: raise ValueError(f'{{{v}!r}} is not a symbol of enum {schema['name']}')"],
                    [h])
        if t == "record":
            return [], [f"{self.enc_record_func(schema)}({expr})"]
        if t == "array":
            item = self.enc_func(schema["items"])
            v, x = self.tmp("v"), self.tmp("x")
            return ([f"{v} = {expr}",
                     f"if {v}.__class__ is not list and {v}.__class__ is not tuple: {v} = _as_seq({v})",
                     f"{x} = b''.join((_len(len({v})), *[{item}(i) for i in {v}], b'\\x00')) if {v} else b'\\x00'"],
                    [x])
        if t == "map":
            item = self.enc_func(schema["values"])
            v, x = self.tmp("v"), self.tmp("x")
            return ([f"{v} = _as_map({expr})",
                     f"{x} = b''.join((_len(len({v})), *[_wstr(k) + {item}(i) for k, i in {v}.items()], b'\\x00'))"
                     f" if {v} else b'\\x00'"],
                    [x])
        if t == "union":
            return self.enc_union(schema, expr)
        raise ValueError(f"unsupported Avro type {t!r}")

    def enc_union(self, branches: list, expr: str) -> tuple[list[str], list[str]]:
        types = [_type_of(self.resolve(b)) for b in branches]
        v, h, x = self.tmp("v"), self.tmp("h"), self.tmp("x")
        names = {}
        for i, b in enumerate(branches):
            names.setdefault(self.branch_name(b), (i, self.enc_func(b)))
        names_c = self.tmp("_UN")  # defined after the functions it refers to
        self.tail.append(f"{names_c} = {{{', '.join(f'{k!r}: ({_ZZ[i]!r}, {f})' for k, (i, f) in names.items())}}}")
        branches_c = self.const(branches, "_UB")
        # Tuple notation ("name", value) first, as fastavro does.
        lines = [f"{v} = {expr}",
                 f"if {v}.__class__ is tuple:",
                 f"    {h}, {v} = {v}",
                 f"    {x} = {names_c}.get({h})",
                 f"    if {x} is None: _bad_name({h}, {branches_c})",
                 f"    {h} = {x}[0]; {x} = {x}[1]({v})"]
        if not all(t in _PRIMITIVES for t in types):
            # A bare value for a union of complex types: fastavro's best-match rules, via fastavro itself.
            fallback = self.const(_union_fallback(branches, self.named), "_UF")
            lines += [f"else: {h} = b''; {x} = {fallback}({v})"]
            return lines, [h, x]
        # Union of primitives: the first branch whose type the value has (fastavro's validate rules).
        checks = {
            "null": f"{v} is None",
            "boolean": f"{v}.__class__ is bool",
            "string": f"isinstance({v}, str)",
            "bytes": f"isinstance({v}, (bytes, bytearray))",
            "long": f"isinstance({v}, int) and {v}.__class__ is not bool and {_LONG_MIN} <= {v} <= {_LONG_MAX}",
            "int": f"isinstance({v}, int) and {v}.__class__ is not bool and {_INT_MIN} <= {v} <= {_INT_MAX}",
        }
        kw = "elif"
        for i, t in enumerate(types):
            if t == "_skip" or t in types[:i]:
                continue
            idx = _ZZ[i]
            if t == "null":
                lines.append(f"{kw} {checks[t]}: {h} = {idx!r}; {x} = b''")
            elif t == "string":
                # Inline: the common nullable string.
                n = self.tmp("n")
                lines += [f"{kw} {checks[t]}:",
                          f"    {x} = _se({v}); {n} = len({x})",
                          f"    {h} = _ZZ1[{n}] if {n} < _TABLE else {idx!r} + _varint({n} << 1)" if i == 1 else
                          f"    {h} = {idx!r} + _len({n})"]
            else:
                lines.append(f"{kw} {checks[t]}: {h} = {idx!r}; {x} = {self.enc_func(t)}({v})")
        lines.append(f"else: _bad_union({v}, {branches_c})")
        return lines, [h, x]

    # -- decoder ---------------------------------------------------------------------------------
    def dec_record_func(self, schema: dict) -> str:
        name = schema["name"]
        if name in self.dec_names:
            return self.dec_names[name]
        fname = self.tmp("_dec_")
        self.dec_names[name] = fname
        lines = [f"def {fname}(d, p):", "    ln = len(d)"]
        items = []
        for field in schema["fields"]:
            v = self.tmp("f")
            lines += self.dec(field["type"], v, "    ")
            items.append(f"{field['name']!r}: {v}")
        lines.append(f"    return {{{', '.join(items)}}}, p")
        self.funcs.append("\n".join(lines))
        return fname

    def dec_func(self, schema: Any) -> str:
        """A function (d, p) -> (value, p) for any schema."""
        schema = self.resolve(schema)
        if _type_of(schema) == "record":
            return self.dec_record_func(schema)
        fname = self.tmp("_decv_")
        lines = [f"def {fname}(d, p):", "    ln = len(d)"] + self.dec(schema, "v", "    ") + ["    return v, p"]
        self.funcs.append("\n".join(lines))
        return fname

    def dec(self, schema: Any, target: str, ind: str) -> list[str]:
        """Statements reading one value of `schema` at d[p] into `target`, advancing p."""
        raw = schema
        schema = self.resolve(schema)
        t = _type_of(schema)
        if t in ("long", "int"):
            b = self.tmp("b")
            return [f"{ind}{b} = d[p]",
                    f"{ind}if {b} < 0x80: {target} = ({b} >> 1) ^ -({b} & 1); p += 1",
                    f"{ind}else: {target}, p = _rv(d, p)"]
        if t in ("string", "bytes"):
            n, e = self.tmp("n"), self.tmp("e")
            conv = ".decode()" if t == "string" else ""
            return [f"{ind}{n} = _SL[d[p]]",
                    f"{ind}if {n} < 0: {n}, p = _rlen(d, p)",
                    f"{ind}else: p += 1",
                    f"{ind}{e} = p + {n}",
                    f"{ind}if {e} > ln: _trunc()",
                    f"{ind}{target} = d[p:{e}]{conv}; p = {e}"]
        if t == "boolean":
            return [f"{ind}{target} = d[p] != 0; p += 1"]
        if t == "null":
            return [f"{ind}{target} = None"]
        if t == "enum":
            syms = self.const(tuple(schema["symbols"]), "_SYM")
            i = self.tmp("i")
            return [f"{ind}{i}, p = _rv(d, p)",
                    f"{ind}if not 0 <= {i} < {len(schema['symbols'])}: _badi({i}, 'enum')",
                    f"{ind}{target} = {syms}[{i}]"]
        if t == "record":
            return [f"{ind}{target}, p = {self.dec_record_func(schema)}(d, p)"]
        if t in ("array", "map"):
            n, ap, it = self.tmp("n"), self.tmp("ap"), self.tmp("it")
            lines = [f"{ind}{target} = {'[]' if t == 'array' else '{}'}"]
            if t == "array":
                lines.append(f"{ind}{ap} = {target}.append")
            lines += [f"{ind}{n} = _SL[d[p]]",
                      f"{ind}if {n} == 0: p += 1",  # the usual empty array/map
                      f"{ind}else: {n}, p = _rcount(d, p)",
                      f"{ind}while {n}:",
                      f"{ind}    for _ in range({n}):"]
            if t == "array":
                lines += self.dec(schema["items"], it, ind + "        ")
                lines.append(f"{ind}        {ap}({it})")
            else:
                k = self.tmp("k")
                lines += self.dec("string", k, ind + "        ")
                lines += self.dec(schema["values"], it, ind + "        ")
                lines.append(f"{ind}        {target}[{k}] = {it}")
            lines.append(f"{ind}    {n}, p = _rcount(d, p)")
            return lines
        if t == "union":
            return self.dec_union(schema, target, ind)
        raise ValueError(f"unsupported Avro type {t!r} ({raw!r})")

    def dec_union(self, branches: list, target: str, ind: str) -> list[str]:
        i = self.tmp("i")
        lines = [f"{ind}{i} = d[p]",
                 f"{ind}if {i} < 0x80 and not {i} & 1: {i} >>= 1; p += 1",
                 f"{ind}else: {i}, p = _rv(d, p)"]  # a negative index matches no branch
        kw = "if"
        for idx, b in enumerate(branches):
            lines.append(f"{ind}{kw} {i} == {idx}:")
            inner = ind + "    "
            rb = self.resolve(b)
            if (isinstance(b, str) and b not in _PRIMITIVES) or _type_of(b) == "record":
                # As fastavro with return_record_name=True: an inline record branch, or a reference to
                # any named type (record, enum), comes back as (fullname, value).
                r = self.tmp("r")
                lines += self.dec(rb, r, inner)
                lines.append(f"{inner}{target} = ({rb['name']!r}, {r})")
            else:
                lines += self.dec(b, target, inner)
            kw = "elif"
        lines.append(f"{ind}else: _badi({i}, 'union')")
        return lines


def _reference_form(schema: Any) -> Any:
    """The schema with every named type replaced by its fullname (so it can be parsed standalone)."""
    if isinstance(schema, list):
        return [_reference_form(s) for s in schema]
    if isinstance(schema, dict):
        t = schema["type"]
        if not isinstance(t, str):
            return _reference_form(t)
        if t in _NAMED:
            return schema["name"]
        if t == "array":
            return {"type": "array", "items": _reference_form(schema["items"])}
        if t == "map":
            return {"type": "map", "values": _reference_form(schema["values"])}
        return t
    return schema


def _union_fallback(branches: list, named: dict[str, Any]) -> Callable[[Any], bytes]:
    """Encodes a bare value for a union with complex branches by fastavro's rules (slow, rare path)."""
    wrapper = {"type": "record", "name": "__fastcodec_union__",
               "fields": [{"name": "v", "type": _reference_form(branches)}]}
    parsed = fastavro.parse_schema(wrapper, named_schemas=dict(named))

    def write(value: Any) -> bytes:
        out = io.BytesIO()
        fastavro.schemaless_writer(out, parsed, {"v": value})
        return out.getvalue()

    return write


class Compiled:
    """The generated encoder and decoder of one schema.

    `decode_at` is the decoder compiled to C by schemas.cdecode when a build of this schema's `native_source`
    is found, else the generated Python one; `python_decode_at` is always the Python one (the reference the
    compiled one is tested against). Both return the same values and raise the same errors."""

    __slots__ = ("schema", "encode", "decode_at", "source", "python_decode_at", "native_source")

    def __init__(self, schema: Any, encode: Callable[[Any], bytes],
                 decode_at: Callable[[bytes, int], tuple[Any, int]], source: str,
                 python_decode_at: Callable[[bytes, int], tuple[Any, int]] | None = None, native_source: str = ""):
        self.schema = schema
        self.encode = encode
        self.decode_at = decode_at
        self.source = source
        self.python_decode_at = python_decode_at or decode_at
        self.native_source = native_source

    @property
    def native(self) -> bool:
        """Whether decode_at is the compiled decoder."""
        return self.decode_at is not self.python_decode_at

    def decode(self, data: bytes | bytearray | memoryview, offset: int = 0) -> tuple[Any, int]:
        """(value, end offset) of the value at data[offset:]; raises on corrupt or truncated data."""
        if data.__class__ is not bytes:
            data = bytes(data)
        return self.decode_at(data, offset)


def compile_schema(schema: Any, prefix: bytes = b"", native: bool = True) -> Compiled:
    """Compile an Avro schema (JSON-parsed dict/list/str, or fastavro-parsed) into an encoder/decoder.

    `prefix` (e.g. a single-object header) is written before every encoded value; the decoder does
    not read it (pass the offset after it). `native`: use the compiled decoder when one is built.
    """
    _refuse_unsupported(_strip_hints(schema))
    named: dict[str, Any] = {}
    parsed = fastavro.parse_schema(_strip_hints(schema), named_schemas=named, _write_hint=False)
    gen = _Gen(parsed, named)
    _refuse_items_of_no_bytes(gen, parsed)
    if prefix and _type_of(gen.resolve(parsed)) == "record":
        enc = gen.enc_record_func(gen.resolve(parsed), prefix)
    elif prefix:
        inner = gen.enc_func(parsed)
        enc = gen.tmp("_enctop_")
        gen.funcs.append(f"def {enc}(v):\n    return {prefix!r} + {inner}(v)")
    else:
        enc = gen.enc_func(parsed)
    dec = gen.dec_func(parsed)
    source = "\n\n".join(gen.funcs) + "\n\n" + "\n".join(gen.tail) + "\n"
    namespace: dict[str, Any] = dict(_HELPERS)
    namespace.update(gen.consts)
    exec(compile(source, f"<fastcodec {_describe(parsed)}>", "exec"), namespace)
    native_source = cdecode.source(gen, parsed)
    compiled = cdecode.load(native_source) if native else None
    return Compiled(parsed, namespace[enc], compiled or namespace[dec], source, namespace[dec], native_source)


def _refuse_unsupported(schema: Any, where: str = "schema") -> None:
    """ValueError for anything outside the supported types (module docstring), wherever it is nested."""
    if isinstance(schema, list):
        for i, branch in enumerate(schema):
            _refuse_unsupported(branch, f"{where}[{i}]")
        return
    if isinstance(schema, str):
        if schema in ("float", "double", "fixed", "error"):
            raise ValueError(f"{where}: Avro type {schema!r} is not supported by the generated codec")
        return
    if "logicalType" in schema:
        raise ValueError(f"{where}: logical type {schema['logicalType']!r} is not supported by the generated codec "
                         f"(it would be encoded as its underlying type, without the conversion)")
    kind = schema.get("type")
    if isinstance(kind, (list, dict)):
        _refuse_unsupported(kind, where)
        return
    if kind in ("float", "double", "fixed", "error"):
        raise ValueError(f"{where}: Avro type {kind!r} is not supported by the generated codec")
    for field in schema.get("fields", ()):
        _refuse_unsupported(field["type"], f"{where}.{field['name']}")
    for key in ("items", "values"):
        if key in schema:
            _refuse_unsupported(schema[key], f"{where}.{key}")


def _min_bytes(gen: _Gen, schema: Any, open_records: frozenset = frozenset()) -> int:
    """The fewest bytes a value of `schema` takes (a record still being measured counts 1: it can only
    recur through a union, whose index takes a byte)."""
    schema = gen.resolve(schema)
    t = _type_of(schema)
    if t == "null":
        return 0
    if t == "record":
        if schema["name"] in open_records:
            return 1
        inner = open_records | {schema["name"]}
        return sum(_min_bytes(gen, f["type"], inner) for f in schema["fields"])
    return 1  # a varint, a length, a union's index, a block count: one byte at least


def _refuse_items_of_no_bytes(gen: _Gen, schema: Any, seen: set | None = None) -> None:
    """ValueError for an array whose items may take no bytes (null, a record of nulls or of no fields): a
    hostile block count could then make a decoder build that many items from a few bytes, block after block,
    quadratic in the record's size. Each item of every other array takes a byte at least, so a count beyond
    the bytes left is refused before anything is built. Map entries always have a key (a length byte)."""
    seen = set() if seen is None else seen
    schema = gen.resolve(schema)
    t = _type_of(schema)
    if t == "record":
        if schema["name"] in seen:
            return
        seen.add(schema["name"])
        for field in schema["fields"]:
            _refuse_items_of_no_bytes(gen, field["type"], seen)
    elif t == "union":
        for branch in schema:
            _refuse_items_of_no_bytes(gen, branch, seen)
    elif t == "array":
        if _min_bytes(gen, schema["items"]) == 0:
            raise ValueError(f"an array of {schema['items']!r}, whose items may take no bytes, is not supported "
                             f"by the generated codec")
        _refuse_items_of_no_bytes(gen, schema["items"], seen)
    elif t == "map":
        _refuse_items_of_no_bytes(gen, schema["values"], seen)


def _strip_hints(schema: Any) -> Any:
    if isinstance(schema, dict) and "__fastavro_parsed" in schema:
        return {k: v for k, v in schema.items() if k not in ("__fastavro_parsed", "__named_schemas")}
    return schema


def _describe(parsed: Any) -> str:
    return parsed.get("name", parsed["type"]) if isinstance(parsed, dict) else str(parsed)[:40]
