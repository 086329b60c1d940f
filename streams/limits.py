"""Every size limit of the ledger's input, in one place, and the check that applies them.

Why these numbers (docs/engine.md, "Trust boundary", has the full derivation):

- Kafka. The workers produce with librdkafka, whose ``message.max.bytes`` (default 1,000,000) refuses any
  single record larger than that, uncompressed, at produce time (MSG_SIZE_TOO_LARGE): such a failure in
  step 3 or 4 of the commit path ends the worker. The broker's ``message.max.bytes`` and each topic's
  ``max.message.bytes`` (default 1,048,588) bound a compressed record batch and are larger. So the real bound
  is the producer's 1,000,000 bytes per record, key and headers included; ``OUTPUT_RECORD_BYTES`` keeps
  100,000 bytes of it for Kafka's framing and headers. ``connectors/admin.py`` creates the topics with the
  broker default, and the worker refuses to start against a topic configured below ``TOPIC_MIN_BYTES``.
- Outputs. The largest record one decision writes is the redo record (StateChange) of the first step of a
  multi-partition transaction: it holds the transaction as JSON, where a control character of a string takes
  six bytes (``\\u0001``). A command of at most ``MAX_COMMAND_BYTES`` encoded (32 KiB) therefore yields
  at most ~200 KB there; results, history entries, balances and follow-up commands are smaller. The
  in-flight records of the two-phase protocol, which grow with the number of transactions in flight on an
  account, are capped separately (``IN_FLIGHT_RECORD_BYTES``: beyond it a reservation fails ``in_flight``).
  ``tests/engine/test_edge.py`` builds the worst command these limits allow and measures every output.
- Fields. Ids are bounded in UTF-8 bytes, generously for real use (a command id has room for a prefix and
  an account id, as the client's ``open:<account>`` ids do), far below what would strain a record.

A command over a limit is rejected ``invalid_command`` with the limit in the detail, before the inbox and
the core (like any command that cannot be read: answered, not remembered). The check is a pure function
of the record, so the same record always gets the same answer (P7).
"""
from __future__ import annotations

import hashlib
from typing import Any

# --- Kafka's bounds (librdkafka / broker defaults) --------------------------------------------------------
PRODUCER_MESSAGE_MAX_BYTES = 1_000_000  # librdkafka message.max.bytes default: one record, uncompressed
TOPIC_MAX_MESSAGE_BYTES = 1_048_588  # broker message.max.bytes / topic max.message.bytes default
OUTPUT_RECORD_BYTES = 900_000  # key + value of any record a decision produces
TOPIC_MIN_BYTES = OUTPUT_RECORD_BYTES + 100_000  # a topic configured below this would refuse our outputs

# --- input records ----------------------------------------------------------------------------------------
# A record value above this is dead-lettered `too_large` unread: no producer with default settings can write
# it (only one that raised its own limit), and a dead letter keeps the first DEAD_LETTER_VALUE_BYTES of it.
MAX_RECORD_BYTES = PRODUCER_MESSAGE_MAX_BYTES
DEAD_LETTER_VALUE_BYTES = 800_000
DEAD_LETTER_KEY_BYTES = 1_024
DEAD_LETTER_DETAIL_CHARS = 1_024

# --- one command --------------------------------------------------------------------------------------------
MAX_COMMAND_BYTES = 32 * 1024  # the command's single-object encoding
MAX_CLIENT_ID_BYTES = 256
MAX_COMMAND_ID_BYTES = 1_024
MAX_ACCOUNT_ID_BYTES = 256  # account ids and routing keys
MAX_ID_BYTES = 512  # transaction, hold, reference, link and rate snapshot ids
MAX_CODE_BYTES = 64  # currency codes and transaction kinds
MAX_AMOUNT_CHARS = 41  # a sign and 39 digits hold the signed 128-bit range; more is never a valid amount
MAX_LEGS = 128
MAX_LINKS = 64
MAX_METADATA_ENTRIES = 64
MAX_METADATA_KEY_BYTES = 256
MAX_METADATA_VALUE_BYTES = 1_024

# --- answers ------------------------------------------------------------------------------------------------
MAX_DETAIL_CHARS = 1_024  # a result's detail (engine text, possibly quoting a field)
# A rejection echoes client_id and command_id whole when together they take at most this many bytes (the
# result's key and value each hold them once: 2 x 400,000 fits OUTPUT_RECORD_BYTES); beyond, each id over
# its limit is echoed as a prefix, a marker and a digest (echo_id), longer than any valid id.
ECHO_BYTES = 400_000

# --- the two-phase protocol -----------------------------------------------------------------------------------
IN_FLIGHT_RECORD_BYTES = 256 * 1024  # in-flight records (JSON) one reservation may write in total


class LimitExceeded(ValueError):
    """A command over a limit; the detail names the field, its size and the limit (machine-readable)."""

    def __init__(self, field: str, size: int, limit: int, unit: str = "bytes"):
        self.detail = f"too_large: {field} has {size} {unit}, the limit is {limit}"
        super().__init__(self.detail)


def _bytes(text: str) -> int:
    # Cheap for the common case: a str of n chars has at least n and at most 4n UTF-8 bytes.
    n = len(text)
    return n if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _text(field: str, value: Any, limit: int) -> None:
    if value is None:
        return
    size = _bytes(value)
    if size > limit:
        raise LimitExceeded(field, size, limit)


def _amount(field: str, value: str) -> None:
    if len(value) > MAX_AMOUNT_CHARS:
        raise LimitExceeded(field, len(value), MAX_AMOUNT_CHARS, "characters")


def check_command(record: dict[str, Any], encoded_bytes: int) -> None:
    """Raise LimitExceeded when a decoded client command breaks a limit. Pure: the record and its size."""
    if encoded_bytes > MAX_COMMAND_BYTES:
        raise LimitExceeded("the command", encoded_bytes, MAX_COMMAND_BYTES)
    _text("client_id", record["client_id"], MAX_CLIENT_ID_BYTES)
    _text("command_id", record["command_id"], MAX_COMMAND_ID_BYTES)
    name, body = record["body"]
    kind = name.rsplit(".", 1)[-1]
    if kind == "PostTransaction":
        _transaction(body, "")
    elif kind == "Reserve":  # only ever taken from a sealed record; bounded here all the same
        _transaction(body["transaction"], "transaction.")
    for field in ("account_id", "routing_key"):
        if field in body:
            _text(field, body[field], MAX_ACCOUNT_ID_BYTES)
    for field in ("hold_id", "transaction_client_id", "transaction_command_id"):
        if field in body:
            _text(field, body[field], MAX_COMMAND_ID_BYTES if field != "hold_id" else MAX_ID_BYTES)
    if "currency" in body:
        _text("currency", body["currency"], MAX_CODE_BYTES)
    for field in ("amount", "overdraft_limit", "max_balance"):
        if body.get(field) is not None:
            _amount(field, body[field])
    if "detail" in body:
        _text("detail", body["detail"], MAX_DETAIL_CHARS)


def _transaction(body: dict[str, Any], where: str) -> None:
    legs = body["legs"]
    if len(legs) > MAX_LEGS:
        raise LimitExceeded(f"{where}legs", len(legs), MAX_LEGS, "legs")
    for i, leg in enumerate(legs):
        _text(f"{where}legs[{i}].account_id", leg["account_id"], MAX_ACCOUNT_ID_BYTES)
        _amount(f"{where}legs[{i}].amount", leg["amount"])
        _text(f"{where}legs[{i}].hold_id", leg["hold_id"], MAX_ID_BYTES)
        _text(f"{where}legs[{i}].currency", leg["currency"], MAX_CODE_BYTES)
    _text(f"{where}transaction_id", body["transaction_id"], MAX_ID_BYTES)
    _text(f"{where}kind", body["kind"], MAX_CODE_BYTES)
    _text(f"{where}reference", body["reference"], MAX_ID_BYTES)
    _text(f"{where}rate_snapshot_id", body["rate_snapshot_id"], MAX_ID_BYTES)
    if len(body["links"]) > MAX_LINKS:
        raise LimitExceeded(f"{where}links", len(body["links"]), MAX_LINKS, "links")
    for i, link in enumerate(body["links"]):
        _text(f"{where}links[{i}]", link, MAX_ID_BYTES)
    metadata = body["metadata"]
    if len(metadata) > MAX_METADATA_ENTRIES:
        raise LimitExceeded(f"{where}metadata", len(metadata), MAX_METADATA_ENTRIES, "entries")
    for key, value in metadata.items():
        _text(f"{where}metadata key", key, MAX_METADATA_KEY_BYTES)
        _text(f"{where}metadata[{key[:40]!r}]", value, MAX_METADATA_VALUE_BYTES)


# --- answers --------------------------------------------------------------------------------------------------

def echo_id(text: str, limit: int) -> str:
    """An id as a rejection echoes it when the ids are too long to echo whole: its first `limit` bytes (the
    id's own limit), a marker and a digest of the whole id. Longer than the limit, so it never names a
    command that could be accepted, and distinct for distinct ids."""
    raw = text.encode("utf-8", "surrogatepass")
    prefix = raw[:limit].decode("utf-8", "ignore")
    digest = hashlib.sha256(raw).hexdigest()[:32]
    return f"{prefix}…[{len(raw)} bytes, sha256 {digest}]"


def echo_ids(client_id: str, command_id: str) -> tuple[str, str]:
    """(client_id, command_id) as a rejection echoes them: whole when they fit ECHO_BYTES together, else
    each id over its own limit shortened by echo_id. verify (P8) matches a command to its answer with this."""
    if _bytes(client_id) + _bytes(command_id) <= ECHO_BYTES:
        return client_id, command_id
    if _bytes(client_id) > MAX_CLIENT_ID_BYTES:
        client_id = echo_id(client_id, MAX_CLIENT_ID_BYTES)
    if _bytes(command_id) > MAX_COMMAND_ID_BYTES:
        command_id = echo_id(command_id, MAX_COMMAND_ID_BYTES)
    return client_id, command_id


def clip(text: str, limit: int = MAX_DETAIL_CHARS) -> str:
    """A detail shortened to `limit` characters (marked), so an answer stays small whatever it quotes."""
    return text if len(text) <= limit else text[:limit - 1] + "…"
