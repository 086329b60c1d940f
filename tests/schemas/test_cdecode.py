"""The compiled decoders (schemas.cdecode) must answer exactly as the generated Python decoders do.

Same value and end offset for every valid record; for corrupt, truncated or hostile bytes the same exception
type and message (a dead letter's detail names it), and never a crash of the process. The Python decoder is the
reference (tests/schemas/test_fastcodec.py checks it against fastavro). When the decoders were not built by
`make install`, they are built here into a temporary directory, so these tests always run the C code.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import fastavro
import pytest
from fastavro.utils import generate_many
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas import cdecode
from schemas.codec import SCHEMA_NAMES, Codec
from schemas.fastcodec import compile_schema
from tests.helpers.avro import GENERIC, LONG_MAX, LONG_MIN, STRATEGIES, fill, raw, zz

FAST = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SCHEMAS = {**{name: raw(name) for name in SCHEMA_NAMES}, "generic": GENERIC}


@pytest.fixture(scope="module")
def native_dirs(tmp_path_factory):
    """name -> the directory of its compiled decoder: make install's, or one built here when it is not there."""
    dirs = {}
    built_here = None
    for name, schema in SCHEMAS.items():
        c = compile_schema(schema)
        if c.native:
            dirs[name] = cdecode.NATIVE_DIR
        else:
            built_here = built_here or tmp_path_factory.mktemp("native")
            cdecode.build([c.native_source], built_here)
            dirs[name] = built_here
    return dirs


@pytest.fixture(scope="module")
def pairs(native_dirs):
    """name -> (Python decoder, compiled decoder, encoder)."""
    out = {}
    for name, schema in SCHEMAS.items():
        c = compile_schema(schema, native=False)
        native = cdecode.load(c.native_source, native_dirs[name])
        assert native is not None and native is not c.python_decode_at, name
        out[name] = (c.python_decode_at, native, c.encode)
    return out


def outcome(decode, data, offset=0):
    try:
        value, end = decode(data, offset)
    except Exception as exc:  # the type and message are what is compared
        return ("raised", type(exc).__name__, str(exc))
    return ("decoded", value, end)


def same(pairs, name, data, offset=0):
    python, native, _ = pairs[name]
    expected = outcome(python, data, offset)
    assert outcome(native, data, offset) == expected, (name, data.hex() if isinstance(data, bytes) else data)
    return expected


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_generated_records_decode_the_same(pairs, name):
    parsed = fastavro.parse_schema(SCHEMAS[name])
    for record in generate_many(parsed, 120):
        data = pairs[name][2](record)
        assert same(pairs, name, data)[0] == "decoded"
        assert same(pairs, name, b"0123456789" + data, 10)[0] == "decoded"


@pytest.mark.parametrize("name", SCHEMA_NAMES)
def test_hypothesis_records_decode_the_same(pairs, name):
    @FAST
    @given(STRATEGIES[name])
    def run(record):
        data = pairs[name][2](fill(name, record))
        assert same(pairs, name, data)[0] == "decoded"

    run()


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_every_truncation_fails_the_same(pairs, name):
    parsed = fastavro.parse_schema(SCHEMAS[name])
    for record in generate_many(parsed, 12):
        data = pairs[name][2](record)
        step = max(1, len(data) // 300)  # bounded: every cut near both ends, a sample in between
        cuts = set(range(min(len(data), 60))) | set(range(max(0, len(data) - 60), len(data)))
        for cut in sorted(cuts | set(range(0, len(data), step))):
            assert same(pairs, name, data[:cut])[0] == "raised"


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_random_and_mutated_bytes_answer_the_same(pairs, name):
    parsed = fastavro.parse_schema(SCHEMAS[name])
    samples = [pairs[name][2](r) for r in generate_many(parsed, 10)]

    @settings(max_examples=200, deadline=None)
    @given(st.binary(max_size=300) | st.builds(
        lambda data, flips: bytes(_flip(data, flips)), st.sampled_from(samples),
        st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=4)))
    def run(data):
        same(pairs, name, data)

    run()


def _flip(data: bytes, flips) -> bytearray:
    out = bytearray(data)
    for pos, byte in flips:
        out[pos % len(out)] = byte
    return out


@pytest.mark.parametrize("data", [
    b"",
    zz(2**62) + b"abc",                                      # a length far beyond the data
    zz(-5) + b"abc",                                          # a negative length
    zz(40) + b"abc",                                          # a one-byte length beyond the data
    b"\xff" * 11 + b"\x01",                                     # a varint longer than 10 bytes
    b"\xff" * 9 + b"\x01",                                      # ten bytes, within 64 bits
    b"\xff" * 9 + b"\x02",                                      # ten bytes, beyond 64 bits
    b"\xff" * 9 + b"\x7f",
    b"\xff" * 9 + b"\x81\x00",                                  # an eleventh byte
    b"\x80" * 9 + b"\x01",
    b"\xff" * 30,                                               # unterminated
    zz(1) + b"\xff" + zz(0),                                  # invalid UTF-8
    zz(3) + b"a\xe2\x82",                                      # a multi-byte character cut short
])
def test_hostile_prefixes_fail_the_same(pairs, data):
    for name in SCHEMAS:
        same(pairs, name, data)
        same(pairs, name, data + b"\x00" * 40)


def test_absurd_counts_and_indexes_fail_the_same(pairs):
    base = zz(1) + b"c" + zz(1) + b"c" + zz(1) + b"f" + zz(0) + zz(0)  # state up to its accounts
    for tail in (zz(2**40), zz(-(2**40)) + zz(5), zz(LONG_MAX), zz(LONG_MIN) + zz(1), zz(LONG_MIN)):
        assert same(pairs, "state", base + tail + b"\x00" * 50)[0] == "raised"
    for tail in (zz(-1) + zz(0), zz(-1), zz(-3) + zz(LONG_MIN)):  # a negative count: its byte size follows
        same(pairs, "state", base + tail + b"\x00" * 50)
        same(pairs, "state", base + tail)
    command = zz(1) + b"c" + zz(1) + b"c"
    for index in (8, 9, -1, 2**40, LONG_MIN, LONG_MAX):
        assert same(pairs, "command", command + zz(index) + zz(1) + b"h")[0] == "raised"
    for index in (2, -1, LONG_MIN, 2**33):  # enum index of [accepted, rejected]
        assert same(pairs, "result", command + zz(index) + b"\x00" * 20)[0] == "raised"


def test_multi_block_arrays_and_maps_decode_the_same(pairs):
    """Blocks with negative counts and byte sizes, as other writers may split arrays and maps."""
    leg = zz(1) + b"a" + zz(1) + b"1" + zz(0) + zz(0)
    body = (zz(1) + b"t"
            + zz(1) + leg + zz(-2) + zz(len(leg) * 2) + leg + leg + zz(0)
            + zz(1) + b"k" + zz(0)
            + zz(1) + zz(1) + b"l" + zz(0)
            + zz(1) + zz(1) + b"a" + zz(1) + b"1" + zz(-1) + zz(4) + zz(1) + b"b" + zz(1) + b"2" + zz(0)
            + zz(0) + zz(0))
    data = zz(1) + b"c" + zz(1) + b"d" + zz(4) + body
    kind, value, end = same(pairs, "command", data)
    assert kind == "decoded" and end == len(data) and len(value["body"][1]["legs"]) == 3


def test_buffers_that_are_not_bytes(pairs):
    python, native, encode = pairs["balance"]
    data = encode(generate_many(fastavro.parse_schema(SCHEMAS["balance"]), 1).__next__())
    for view in (bytearray(data), memoryview(data)):
        assert outcome(native, view) == outcome(python, bytes(view))
    assert outcome(native, data, -1)[0] == "raised"
    assert outcome(native, data, len(data) + 5)[0] == "raised"


def test_the_codec_uses_the_compiled_decoders_when_built_and_python_when_asked(pairs, monkeypatch):
    built = Codec()
    monkeypatch.setenv("LEDGER_CODEC", "python")
    forced = Codec()
    assert not any(c.native for c in forced._compiled.values())
    for name in SCHEMA_NAMES:
        record = next(generate_many(fastavro.parse_schema(SCHEMAS[name]), 1))
        data = built.encode(name, record)
        assert built.decode(name, data) == forced.decode(name, data)


def nested(depth: int) -> bytes:
    """A record of the generic schema whose recursive Node nests `depth` deep (no writer would; a hostile one may)."""
    node = zz(1) + b"n" + zz(1)  # label "n", then the union's Node branch
    return zz(0) + zz(0) + zz(0) + node * depth + zz(1) + b"n" + zz(0) + zz(0) * 4


_DEEP = """
import sys
from pathlib import Path
from schemas import cdecode
from schemas.fastcodec import compile_schema
from tests.helpers.avro import GENERIC
from tests.schemas.test_cdecode import nested

c = compile_schema(GENERIC, native=False)
native = cdecode.load(c.native_source, Path(sys.argv[1]))
assert native is not None
for decode in (c.python_decode_at, native):
    try:
        value, end = decode(nested(int(sys.argv[2])), 0)
        print("decoded", end, flush=True)
    except Exception as exc:
        print("raised", type(exc).__name__, exc, flush=True)
"""


def test_a_record_nested_without_end_raises_recursion_error_and_never_crashes(native_dirs):
    """A recursive schema fed a nesting far beyond the recursion limit: the Python decoder raises RecursionError,
    and so must the compiled one, where recursing in C would overflow the stack and kill the process (so the
    decoding runs in a child process: a crash fails this test, not the whole run)."""
    root = Path(__file__).resolve().parents[2]
    run = subprocess.run([sys.executable, "-c", _DEEP, str(native_dirs["generic"]), "200000"], cwd=root,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    python, native = run.stdout.splitlines()
    assert python == native == "raised RecursionError maximum recursion depth exceeded"


@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="from 3.12 C calls have a recursion limit of their own")
def test_nesting_near_the_recursion_limit_answers_as_python(pairs):
    """The compiled decoder counts a level of recursion per record as the Python decoder spends a frame per record:
    at every depth around the limit both decode, or both raise RecursionError."""
    python, native, _ = pairs["generic"]

    def shallow(decode, depth):  # the outcome without comparing values nested near the limit
        try:
            return ("decoded", decode(nested(depth), 0)[1])
        except RecursionError as exc:
            return ("raised", str(exc))

    assert shallow(python, 20) == shallow(native, 20) == ("decoded", len(nested(20)))
    low, high = 1, sys.getrecursionlimit()  # the deepest nesting the Python decoder takes here
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if shallow(python, mid)[0] == "decoded" else (low, mid - 1)
    for depth in range(low - 3, low + 4):
        assert shallow(native, depth) == shallow(python, depth), depth


def test_enum_symbols_are_not_rebindable_module_attributes(pairs):
    """An enum's symbols are read by an index checked once, without a second bounds check: they are a C global of
    the module, not an attribute a caller could rebind to a shorter tuple (or a non-tuple)."""
    for name, schema in SCHEMAS.items():
        module = sys.modules[cdecode.module_name(compile_schema(schema, native=False).native_source)]
        assert not [a for a in dir(module) if a.startswith("_SYM")], name
    python, native, _ = pairs["result"]
    data = zz(1) + b"c" + zz(1) + b"c" + zz(1) + zz(0) + zz(0) + zz(0) + zz(0) + zz(0) + zz(0)
    assert outcome(native, data) == outcome(python, data) and outcome(native, data)[1]["outcome"] == "rejected"
