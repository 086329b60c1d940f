"""The Schema Registry option at the codec boundary, against confluent-kafka's in-process registry (mock://):
no Confluent-compatible registry server can be started on these machines (docs/ecosystem.md says why).

The published topics' records are in the Confluent wire format and a stock AvroDeserializer, knowing nothing
of the ledger, reads them; commands and the changelog keep single-object framing; the codec reads both
framings and gives the same machine-readable reasons for bad bytes; an evolution the subject's compatibility
level forbids stops the codec before it writes anything, and the real evolution of the ledger's schemas
(schemas/versions) passes; the engine, unchanged, publishes registry-framed outputs."""
from __future__ import annotations

import json
import os
import struct

import pytest

if not os.environ.get("CI"):  # make install (and so CI) installs the registry extra; elsewhere it may be missing
    pytest.importorskip("avro.compatibility", reason="needs the registry extra: pip install -e '.[registry]'")

from confluent_kafka.schema_registry import Schema, SchemaRegistryClient  # noqa: E402
from confluent_kafka.schema_registry.avro import AvroDeserializer  # noqa: E402
from confluent_kafka.serialization import MessageField, SerializationContext  # noqa: E402

from schemas import codec as codec_module  # noqa: E402
from schemas.codec import MARKER, SCHEMA_DIR, Codec, DecodeError  # noqa: E402
from schemas.registry import FRAMED, IncompatibleSchema, RegistryCodec, incompatibilities  # noqa: E402

BALANCE = {"account_id": "user:ann:USD", "currency": "USD", "status": "open", "posted": "1500", "held": "200",
           "available": "1300", "seq": 3, "last_transaction_id": "t-1", "updated_at_ms": 1_700_000_000_000}


def mock() -> SchemaRegistryClient:
    return SchemaRegistryClient.new_client({"url": "mock://ledger-tests"})


def full(record: dict, name: str) -> dict:
    """record with the current schema's defaults for fields it does not give (what a decode returns)."""
    fields = json.loads((SCHEMA_DIR / f"{name}.avsc").read_text())["fields"]
    return {f["name"]: record.get(f["name"], f.get("default")) for f in fields}


def test_published_records_use_the_confluent_wire_format_and_stock_readers_read_them():
    client = mock()
    c = RegistryCodec("mock://ledger-tests", client=client)
    data = c.encode("balance", BALANCE)
    assert data[0] == 0 and struct.unpack(">I", data[1:5])[0] == c.ids["balance"]
    assert client.get_schema(c.ids["balance"]).schema_str == (SCHEMA_DIR / "balance.avsc").read_text().strip()
    assert c.subjects == {"result": "ledger.Result", "history": "ledger.HistoryEntry",
                          "balance": "ledger.Balance", "dead_letter": "ledger.DeadLetter"}
    # A consumer with no schema of its own (Connect, ksqlDB, kcat -s avro do the same): writer schema by id.
    stock = AvroDeserializer(client)
    assert stock(data, SerializationContext("ledger.balances", MessageField.VALUE)) == full(BALANCE, "balance")
    assert c.decode("balance", data) == full(BALANCE, "balance")


def test_commands_and_state_keep_single_object_framing_and_both_framings_decode():
    c = RegistryCodec("mock://ledger-tests", client=mock())
    plain = Codec()
    for name in ("command", "command_batch", "state"):
        assert name not in FRAMED and c.header(name) == plain.header(name) and c.header(name)[:2] == MARKER
    # A balance written before the registry was turned on (single-object) still reads.
    old = plain.encode("balance", BALANCE)
    assert old[:2] == MARKER and c.decode("balance", old) == plain.decode("balance", old)


def test_bad_registry_framed_bytes_get_the_same_machine_readable_reasons():
    c = RegistryCodec("mock://ledger-tests", client=mock())
    data = c.encode("balance", BALANCE)
    cases = [(b"\x00" + struct.pack(">I", 999) + data[5:], "unknown_schema"),
             (data, "wrong_schema", "result"),
             (data[:3], "corrupt"),
             (data[:12], "corrupt")]
    for case in cases:
        raw, reason = case[0], case[1]
        name = case[2] if len(case) > 2 else "balance"
        with pytest.raises(DecodeError) as err:
            c.decode(name, raw)
        assert err.value.reason == reason, (case, err.value)


def test_an_incompatible_evolution_is_refused_before_anything_is_written():
    client = mock()
    current = json.loads((SCHEMA_DIR / "balance.avsc").read_text())
    # An older Balance without `currency`: a reader of today's schema (no default for it) cannot read it.
    older = {**current, "fields": [f for f in current["fields"] if f["name"] != "currency"]}
    client.register_schema("ledger.Balance", Schema(json.dumps(older), "AVRO"))
    with pytest.raises(IncompatibleSchema) as err:
        RegistryCodec("mock://ledger-tests", client=client)
    assert "ledger.Balance is not BACKWARD_TRANSITIVE compatible with version 1" in str(err.value)
    assert "currency" in str(err.value)
    assert client.get_versions("ledger.Balance") == [1]  # nothing registered
    # NONE turns the check off (the operator's decision, as on a registry).
    RegistryCodec("mock://ledger-tests", client=client, level="NONE")
    assert sorted(client.get_versions("ledger.Balance")) == [1, 2]


def test_the_ledgers_own_schema_history_is_backward_compatible():
    versions = sorted((SCHEMA_DIR / "versions").glob("*.avsc"))
    assert versions
    for path in versions:
        name = path.stem.split(".")[0]
        current = (SCHEMA_DIR / f"{name}.avsc").read_text()
        assert incompatibilities(current, path.read_text(), "BACKWARD") == [], path.name
    # Registered in order under a shared registry, the current schemas pass the transitive check.
    client = mock()
    for path in versions:
        name = path.stem.split(".")[0]
        if name in FRAMED:
            subject = RegistryCodec._full_name(json.loads(path.read_text()))
            client.register_schema(subject, Schema(path.read_text(), "AVRO"))
    RegistryCodec("mock://ledger-tests", client=client)


def test_the_engine_publishes_registry_framed_outputs(monkeypatch):
    """The engine is untouched: a partition processor asks codec() as ever, and gets the registry's codec."""
    from streams import routing
    from streams.partition import PartitionProcessor
    from streams.store import MemoryStore
    from tests.helpers import records as r

    monkeypatch.setenv("SCHEMA_REGISTRY_URL", "mock://engine")
    monkeypatch.setattr(codec_module, "_codec", None)
    try:
        registry = codec_module.codec()
        assert isinstance(registry, RegistryCodec)
        account = "user:reg:USD"
        partition = routing.partition_of_account(account, r.N)
        proc = PartitionProcessor(partition, r.N, MemoryStore())
        key = routing.routing_key_for(account).encode()
        for offset, value in enumerate([r.open_account(account),
                                        r.transfer("dep-1", ("sys:world:USD", -700), (account, 700)), b"junk"]):
            proc.handle(offset, 1_700_000_000_000 + offset, key, value, None)
        outputs, _ = proc.take()
        published = [o for o in outputs if o.topic in ("results", "history", "balances", "dlq")]
        assert {o.topic for o in published} == {"results", "history", "balances", "dlq"}
        assert all(o.value[0] == 0 for o in published)  # magic byte 0, then the schema id
        stock = AvroDeserializer(registry.client)
        decoded = [stock(o.value, SerializationContext(o.topic, MessageField.VALUE)) for o in published]
        assert any(d["account_id"] == account and d["posted"] == "700"
                   for d, o in zip(decoded, published) if o.topic == "balances")
        assert any(d.get("outcome") == "accepted" and d.get("command_id") == "dep-1" for d in decoded)
        assert any(d.get("reason") == "not_avro" for d in decoded)  # the dead letter
    finally:
        monkeypatch.setattr(codec_module, "_codec", None)
