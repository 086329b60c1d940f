"""Reading back a COPY ... (FORMAT BINARY) stream (PostgreSQL's format: a signature, rows of length-prefixed
big-endian fields, a trailer) into the tuples the replay loader's Python loop makes: how the tests and `make
fuzz-decode` hold the rows the fast path makes for a PostgreSQL loader to the loop's."""
from __future__ import annotations

import struct

SIGNATURE = b"PGCOPY\n\xff\r\n\0" + b"\0" * 8
TRAILER = b"\xff\xff"


def rows_of(data: bytes, types: tuple[str, ...]) -> list[tuple]:
    """The rows of a whole stream whose columns have these types (text or int8)."""
    assert data[:len(SIGNATURE)] == SIGNATURE, "no COPY signature"
    assert data[-2:] == TRAILER, "no COPY trailer"
    rows, at, end = [], len(SIGNATURE), len(data) - 2
    while at < end:
        (count,) = struct.unpack_from(">h", data, at)
        assert count == len(types), f"a row of {count} fields, {len(types)} columns"
        at += 2
        row = []
        for kind in types:
            (length,) = struct.unpack_from(">i", data, at)
            at += 4
            if length < 0:
                row.append(None)
                continue
            field = data[at:at + length]
            assert len(field) == length, "a field past the stream's end"
            at += length
            if kind == "int8":
                assert length == 8
                row.append(struct.unpack(">q", field)[0])
            else:
                assert kind == "text", kind
                row.append(field.decode("utf-8"))
        rows.append(tuple(row))
    assert at == end, "bytes left after the last row"
    return rows
