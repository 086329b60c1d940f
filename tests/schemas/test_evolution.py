"""Schemas evolve without breaking old messages: every earlier version stays readable by the current one."""
from __future__ import annotations

import io
import json
from pathlib import Path

import fastavro
import pytest
from fastavro.utils import generate_many

from schemas.codec import MARKER, SCHEMA_DIR, Codec, _fingerprint

VERSIONS = sorted((SCHEMA_DIR / "versions").glob("*.avsc"))


def _encode_with(schema_path: Path, record: dict) -> bytes:
    raw = json.loads(schema_path.read_text())
    parsed = fastavro.parse_schema(raw)
    out = io.BytesIO()
    out.write(MARKER + _fingerprint(fastavro.parse_schema(raw, _write_hint=False)))
    fastavro.schemaless_writer(out, parsed, record)
    return out.getvalue()


@pytest.mark.parametrize("path", VERSIONS, ids=lambda p: p.name)
def test_messages_of_an_earlier_version_decode_with_the_current_schema(path):
    codec = Codec()
    name = path.name.split(".")[0]
    old = fastavro.parse_schema(json.loads(path.read_text()))
    current_fields = {f["name"] for f in json.loads((SCHEMA_DIR / f"{name}.avsc").read_text())["fields"]}
    for record in generate_many(old, 30):
        decoded = codec.decode(name, _encode_with(path, record))
        assert set(decoded) == current_fields
        for field, value in record.items():
            if field in current_fields and not isinstance(value, (dict, tuple, list)):
                assert decoded[field] == value


def test_every_current_schema_is_registered_so_changes_keep_their_history():
    codec = Codec()
    registered = {}
    for line in (SCHEMA_DIR / "versions/CURRENT").read_text().splitlines():
        if line and not line.startswith("#"):
            name, fingerprint = line.split()
            registered[name] = fingerprint
    changed = {name: s.header[2:].hex() for name, s in codec.current.items() if registered.get(name) != s.header[2:].hex()}
    assert not changed, (
        f"schemas changed: {sorted(changed)}. Copy each previous version into schemas/versions/<name>.v<N>.avsc "
        f"(the compatibility test then proves old messages still decode) and update schemas/versions/CURRENT.")
