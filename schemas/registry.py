"""The Schema Registry option: the topics the ledger publishes for others in the Confluent wire format.

With SCHEMA_REGISTRY_URL set (any Confluent-compatible registry: Confluent's, Apicurio's /apis/ccompat/v7,
Redpanda's, Karapace; `mock://NAME` is confluent-kafka's in-process registry), results, history, balances and
dead letters are written as magic byte 0, the 4-byte big-endian schema id, then the Avro body, by
confluent-kafka's own AvroSerializer, so Kafka Connect, ksqlDB, Kafka UI, `kcat -s value=avro`, Flink and
Spark read them with their stock deserializers, and a reader on an older schema resolves newer records.

Subjects are named by record (RecordNameStrategy, e.g. `ledger.Result`): one subject per type whatever the
topic prefix, which is also what a topic carrying several types needs. Before anything is written, each
current schema is checked against every version already registered under its subject, in the direction
LEDGER_SCHEMA_COMPATIBILITY says (default BACKWARD_TRANSITIVE: a reader on the new schema reads everything
written before), with Apache Avro's own compatibility checker, and the subject's level is set on the
registry, which checks it again when the schema is registered. An incompatible schema stops the process
with one line naming the subject and the problem, before it writes a record.

What stays single-object encoded (schemas/codec.py), and why: the commands topic (written by LedgerClient,
which knows the schemas, and read on the engine's hot path by a fixed 10-byte header test that tells a
CommandBatch from a Command) and the workers' changelog (internal). Both are still decoded in either
framing: a command framed by a registry is decided like any other. docs/ecosystem.md says why single-object
encoding stays the default.
"""
from __future__ import annotations

import json
import os
import struct
from typing import Any

from schemas.codec import Codec, DecodeError, SCHEMA_DIR
from streams.config import ConfigError

# The schemas written in the registry's framing: what the ledger publishes for other systems to read.
FRAMED = ("result", "history", "balance", "dead_letter")
MAGIC = 0
LEVELS = ("BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FORWARD_TRANSITIVE", "FULL", "FULL_TRANSITIVE", "NONE")


class IncompatibleSchema(ConfigError):
    """A current schema the registry's history of its subject does not allow (one line: subject, reason)."""


def compatibility_level(env: dict[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    level = (env.get("LEDGER_SCHEMA_COMPATIBILITY") or "BACKWARD_TRANSITIVE").strip().upper()
    if level not in LEVELS:
        raise ConfigError(f"LEDGER_SCHEMA_COMPATIBILITY={level!r} is not one of {', '.join(LEVELS)}")
    return level


def incompatibilities(new: str, old: str, level: str) -> list[str]:
    """Why `new` may not follow `old` under `level` (empty: it may), by Apache Avro's checker."""
    from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType
    from avro.schema import parse

    new_s, old_s = parse(new), parse(old)
    pairs = []
    if level.startswith(("BACKWARD", "FULL")):
        pairs.append(("a reader of the new schema cannot read records written with an older one", new_s, old_s))
    if level.startswith(("FORWARD", "FULL")):
        pairs.append(("a reader of an older schema cannot read records written with the new one", old_s, new_s))
    problems = []
    for what, reader, writer in pairs:
        result = ReaderWriterCompatibilityChecker().get_compatibility(reader, writer)
        if result.compatibility is not SchemaCompatibilityType.compatible:
            details = "; ".join(f"{'/'.join(loc) or '/'}: {msg}" for msg, loc in
                                zip(result.messages, result.locations))
            problems.append(f"{what} ({details})")
    return problems


class RegistryCodec(Codec):
    """Codec whose FRAMED schemas go through the registry; every other name, and any record in single-object
    framing, as Codec does. Same interface, so the engine and the readers do not know which they have."""

    def __init__(self, url: str, schema_dir=SCHEMA_DIR, level: str | None = None, conf: dict[str, Any] | None = None,
                 client: Any = None):
        """conf: more settings of confluent-kafka's SchemaRegistryClient (basic.auth.user.info, ssl.ca.location);
        client: a registry client to share (tests share one mock registry between codecs)."""
        super().__init__(schema_dir)
        from confluent_kafka.schema_registry import SchemaRegistryClient
        from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer

        self.level = level or compatibility_level()
        auth = os.environ.get("SCHEMA_REGISTRY_BASIC_AUTH_USER_INFO")  # user:password, when the registry asks
        self.client = client or SchemaRegistryClient.new_client(
            {"url": url, **({"basic.auth.user.info": auth} if auth else {}), **(conf or {})})
        self.subjects: dict[str, str] = {}
        self.ids: dict[str, int] = {}
        self._serializers: dict[str, Any] = {}
        self._deserializers: dict[str, Any] = {}
        self._writer_names: dict[int, str | None] = {}  # schema id -> record full name (None: unknown id)
        for name in FRAMED:
            text = (schema_dir / f"{name}.avsc").read_text().strip()  # as AvroSerializer keeps it
            subject = self._full_name(json.loads(text))
            self.subjects[name] = subject
            self.ids[name] = self._check_and_register(subject, text)
            self._writer_names[self.ids[name]] = subject
            self._serializers[name] = AvroSerializer(self.client, text, conf={
                "auto.register.schemas": False, "use.latest.version": False, "normalize.schemas": False,
                "subject.name.strategy": lambda ctx, record_name, subject=subject: subject})
            self._deserializers[name] = AvroDeserializer(self.client, text, return_record_name=True)
        from confluent_kafka.serialization import MessageField, SerializationContext

        self._contexts = {name: SerializationContext(name, MessageField.VALUE) for name in FRAMED}

    @staticmethod
    def _full_name(schema: dict) -> str:
        name = schema["name"]
        return name if "." in name or not schema.get("namespace") else f"{schema['namespace']}.{name}"

    def _is_mock(self) -> bool:
        from confluent_kafka.schema_registry._sync.mock_schema_registry_client import MockSchemaRegistryClient

        return isinstance(self.client, MockSchemaRegistryClient)

    def _check_and_register(self, subject: str, text: str) -> int:
        from confluent_kafka.schema_registry import Schema
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            versions = sorted(self.client.get_versions(subject))
        except SchemaRegistryError as exc:
            if exc.http_status_code != 404:
                raise
            versions = []
        if self.level != "NONE":
            # Transitive levels: every version; the others: the latest only.
            for version in (versions if self.level.endswith("TRANSITIVE") else versions[-1:]):
                old = self.client.get_version(subject, version).schema.schema_str
                problems = incompatibilities(text, old, self.level)
                if problems:
                    raise IncompatibleSchema(f"schema registry: {subject} is not {self.level} compatible with "
                                             f"version {version}: {'; '.join(problems)}")
        if not self._is_mock():  # the in-process mock keeps no levels; a real registry checks again on register
            self.client.set_compatibility(subject, self.level)
        try:
            return self.client.register_schema(subject, Schema(text, "AVRO"))
        except SchemaRegistryError as exc:
            raise IncompatibleSchema(f"schema registry refused {subject}: {exc}") from None

    def encode(self, name: str, record: dict) -> bytes:
        serializer = self._serializers.get(name)
        if serializer is None:
            return super().encode(name, record)
        return serializer(record, self._contexts[name])

    def decode(self, name: str, data: bytes | None) -> dict:
        if not data or data[0] != MAGIC:
            return super().decode(name, data)  # single-object framing (or empty): as ever
        if len(data) < 5:
            raise DecodeError("corrupt", "a registry-framed message shorter than its 5-byte header")
        schema_id = struct.unpack(">I", bytes(data[1:5]))[0]
        writer = self._writer_name(schema_id)
        if writer is None:
            raise DecodeError("unknown_schema", f"the schema registry has no schema id {schema_id}")
        deserializer = self._deserializers.get(name)
        if deserializer is None or writer != self.subjects[name]:
            expected = self.subjects.get(name, name)
            raise DecodeError("wrong_schema", f"expected a {expected} message, got {writer} (id {schema_id})")
        try:
            record = deserializer(bytes(data), self._contexts[name])
        except Exception as exc:  # the deserializer raises several types for corrupt bodies
            raise DecodeError("corrupt", f"{type(exc).__name__}: {exc}") from None
        if isinstance(record, tuple):  # return_record_name on a record schema: (name, fields)
            record = record[1]
        return record

    def _writer_name(self, schema_id: int) -> str | None:
        """The record full name of a registered schema id (cached; None when the registry has no such id)."""
        if schema_id not in self._writer_names:
            from confluent_kafka.schema_registry.error import SchemaRegistryError

            try:
                schema = self.client.get_schema(schema_id)
                self._writer_names[schema_id] = self._full_name(json.loads(schema.schema_str))
            except (SchemaRegistryError, KeyError, ValueError, TypeError):
                return None  # not cached: the id may be registered later
        return self._writer_names[schema_id]
