"""The JSON of the workers' state records (streams/partition.py, `_dumps` / `_loads`, msgspec): amounts of any
size the ledger allows come back exact, records written by the earlier encoder (the standard library's, with
`\\u` escapes) read back as the same values, and printable ASCII is written byte for byte as it was, so the
changelogs of the same log stay identical (P7). No broker."""
from __future__ import annotations

import json

from hypothesis import given, strategies as st

from streams.core.money import MAX_ABS_AMOUNT
from streams.partition import _dumps, _loads

EARLIER = json.JSONEncoder(separators=(",", ":"))  # the encoder of the records written before msgspec

amounts = st.integers(min_value=-MAX_ABS_AMOUNT, max_value=MAX_ABS_AMOUNT)
texts = st.text(max_size=30)
values = st.recursive(
    st.none() | st.booleans() | amounts | texts,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=20)


@given(st.dictionaries(texts, values, max_size=6))
def test_a_record_reads_back_as_written_and_as_the_earlier_encoder_wrote_it(record):
    assert _loads(_dumps(record)) == record
    assert _loads(EARLIER.encode(record).encode()) == record


@given(st.dictionaries(st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7e), max_size=20),
                       st.recursive(st.none() | st.booleans() | amounts |
                                    st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7e), max_size=20),
                                    lambda inner: st.lists(inner, max_size=4), max_leaves=12),
                       max_size=6))
def test_printable_ascii_is_written_byte_for_byte_as_before(record):
    assert _dumps(record) == EARLIER.encode(record).encode()


def test_the_largest_amounts_and_escaped_text_of_earlier_records():
    record = {"credits": [["user:ü:USD", MAX_ABS_AMOUNT]], "debit": -MAX_ABS_AMOUNT, "note": "a\x01b\U0001f600"}
    written_before = EARLIER.encode(record).encode()  # "\u00fc", "\ud83d\ude00": escaped, ASCII only
    assert written_before.isascii()
    assert _loads(written_before) == record == _loads(_dumps(record))
