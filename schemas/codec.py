"""Avro codec for every message the ledger reads or writes.

Each message is Avro single-object encoded: the two marker bytes C3 01, the 8-byte little-endian
CRC-64-AVRO fingerprint of the writer schema's canonical form, then the binary body. A reader looks the
fingerprint up among the current schemas and the previous versions kept in schemas/versions/, so
messages written by older producers stay readable after a schema evolves (Avro schema resolution).
"""
from __future__ import annotations

import io
import json
import struct
from dataclasses import dataclass
from pathlib import Path

import fastavro
from fastavro.schema import fingerprint, to_parsing_canonical_form

SCHEMA_DIR = Path(__file__).resolve().parent
MARKER = b"\xc3\x01"
# File name (without .avsc) of each schema the ledger writes.
SCHEMA_NAMES = ("command", "result", "history", "balance", "dead_letter", "state")


class DecodeError(ValueError):
    """Bytes that are not a message of a known schema; the reason is machine-readable."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def _fingerprint(parsed: dict) -> bytes:
    hex_digits = fingerprint(to_parsing_canonical_form(parsed), "CRC-64-AVRO")
    return struct.pack("<Q", int(hex_digits, 16))


@dataclass(frozen=True, slots=True)
class _Schema:
    name: str
    parsed: dict
    header: bytes  # MARKER + fingerprint


def _load(path: Path) -> _Schema:
    raw = json.loads(path.read_text())
    canonical = fastavro.parse_schema(raw, _write_hint=False)
    # The hinted parse is what fastavro recognises as already parsed (otherwise it re-parses per call).
    return _Schema(path.stem.split(".")[0], fastavro.parse_schema(raw), MARKER + _fingerprint(canonical))


class Codec:
    """Encodes with the current schema of a name; decodes any known version into the current one."""

    def __init__(self, schema_dir: Path = SCHEMA_DIR):
        self.current = {name: _load(schema_dir / f"{name}.avsc") for name in SCHEMA_NAMES}
        # Writer schemas by fingerprint: current and previous versions.
        self._writers: dict[bytes, _Schema] = {s.header: s for s in self.current.values()}
        for path in sorted((schema_dir / "versions").glob("*.avsc")):
            old = _load(path)
            self._writers.setdefault(old.header, old)

    def encode(self, name: str, record: dict) -> bytes:
        schema = self.current[name]
        out = io.BytesIO()
        out.write(schema.header)
        fastavro.schemaless_writer(out, schema.parsed, record)
        return out.getvalue()

    def decode(self, name: str, data: bytes | None) -> dict:
        """Decode bytes into a record of the current schema `name`; DecodeError when impossible."""
        if not data:
            raise DecodeError("empty", "the message has no value")
        header = bytes(data[:10])
        if header[:2] != MARKER or len(data) < 10:
            raise DecodeError("not_avro", "missing the Avro single-object marker C3 01")
        writer = self._writers.get(header)
        if writer is None:
            raise DecodeError("unknown_schema", f"no known schema has fingerprint {header[2:].hex()}")
        if writer.name != name:
            raise DecodeError("wrong_schema", f"expected a {name} message, got {writer.name}")
        try:
            buf = io.BytesIO(data)
            buf.seek(10)
            # Resolution only when an older writer schema differs from the current one: it is slow.
            reader = None if writer is self.current[name] else self.current[name].parsed
            record = fastavro.schemaless_reader(buf, writer.parsed, reader, return_record_name=True)
        except Exception as exc:  # fastavro raises many types for corrupt bodies
            raise DecodeError("corrupt", f"{type(exc).__name__}: {exc}") from None
        if buf.tell() != len(data):
            raise DecodeError("corrupt", f"{len(data) - buf.tell()} trailing bytes after the record")
        return record


_codec: Codec | None = None


def codec() -> Codec:
    """The process-wide codec (schemas parsed once)."""
    global _codec
    if _codec is None:
        _codec = Codec()
    return _codec
