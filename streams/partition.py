"""The partition state machine: one partition's state and what each command does to it.

No Kafka here: a PartitionProcessor takes records (offset, timestamp, key, value) in partition order and
returns the messages to emit, while staging its state writes. streams/engine.py owns the commit path
(emit, then changelog, then one RocksDB WriteBatch) and the restore.

Per record (DESIGN.md §4): decode -> inbox check -> due hold expiries -> route (system-account shards; a
transaction whose legs live in several partitions to the two-phase protocol, streams/spanning.py, which
drives this processor through its public methods) -> core.execute (pure) -> stage writes -> outputs.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any, Callable

import msgspec

from schemas.codec import DecodeError, codec
from streams import core, limits, names, placement, routing
from streams.due import DueIndex
from streams.routing import ENGINE_CLIENT
from streams.core import Account, Changes, Hold, HoldStatus, Leg, Processed, Rejection, Result
from streams.seal import DEVELOPMENT, UNSEALED, Headers, Seal
from streams.authn import Clients
from streams.core.policy import judge as judge_policy
from streams.core.rejections import NOT_A_DECISION
from streams.linking import Linking
from streams.spanning import SPANNING_KINDS, Spanning
from streams.spanning_linked import LINKED_STEP_KINDS, LinkedSpanning
from streams.inflight import COPY_DUE, parse_copy_due
from streams.waiting import WAITING_ENTRY, WaitingIndex, parse_waiting_key
from streams.store import KeyValueStore
from streams.wire import (
    WireError,
    account_from_record,
    account_to_record,
    balance_to_wire,
    command_from_wire,
    command_to_wire,
    history_to_wire,
    hold_from_record,
    hold_to_record,
    rejection_to_wire,
    result_to_wire,
    rate_from_record,
    rate_to_record,
    transaction_from_record,
    transaction_to_record,
)

CHANGELOG_OFFSET_KEY = b"m/changelog"
# The highest offset of the commands topic whose effects the state holds (the source_offset of its StateChanges).
APPLIED_OFFSET_KEY = b"m/applied"
# Decoded account, hold, transaction and engine records kept between batches, per partition, at most (commit,
# record()): about 300 bytes a decoded hold and 130 an engine record, so 8 partitions keep tens of MiB.
DECODED_CACHE_LIMIT = int(os.environ.get("LEDGER_DECODED_CACHE", "25000"))
log = logging.getLogger("ledger.partition")


@dataclass(frozen=True)
class Route:
    """Where a client command is decided (PartitionProcessor.route): here, as `command` (system accounts
    rewritten to their local shards, which `shards` names), in another partition (`elsewhere`), in two
    phases across `spans`, or nowhere (`refusal`)."""
    command: core.Command | None = None
    shards: tuple[str, ...] = ()
    elsewhere: int | None = None
    spans: tuple[int, ...] = ()
    refusal: tuple[Rejection, str] | None = None


class OutputTooLarge(RuntimeError):
    """A decision would write a record larger than the topics accept (limits.OUTPUT_RECORD_BYTES). The
    limits make this unreachable; if it happens anyway, the command is rolled back and rejected."""


@dataclass(frozen=True, slots=True)
class Output:
    topic: str  # logical name: results, history, balances, commands, dlq
    key: bytes
    value: bytes
    partition: int
    timestamp_ms: int
    # A result's client: the engine also copies the result to that client's own results topic when it has
    # one (streams/engine.py, docs/security.md). None for every other output.
    client_id: str | None = None




def result_key(client_id: str, command_id: str, reason: str | None) -> bytes:
    """The results topic's key: client_id/command_id. An id_conflict answers another payload sent under a
    used id, a not_authenticated a record the named client may not have written, and a linked_spans_partitions
    a batch that could not be linked (the command may be decided later), so they go under their own key
    (…/command_id#id_conflict, …#not_authenticated, …#linked_spans_partitions): a reader that keeps the latest
    result per key (compaction, a table) keeps the command's decision, never the refusal of an impostor or of
    an envelope."""
    key = f"{client_id}/{command_id}"
    return (key + "#" + reason if reason in NOT_A_DECISION else key).encode()


def _inbox_key(client_id: str, command_id: str) -> bytes:
    return b"i/" + client_id.encode() + b"\x00" + command_id.encode()


def _expiry_key(hold: Hold) -> bytes:
    return f"x/{hold.expires_at_ms:020d}/".encode() + hold.id.encode()


# Every state record's JSON (compact, keys in insertion order): msgspec's, not the standard library's, which cost
# about 8.6 µs to encode and 5.7 to decode a reservation record against 0.9 and 2.3 (docs/engine.md, "Throughput").
# Same bytes as json.dumps(separators=(",", ":")) for printable ASCII text; other text is written as UTF-8, not
# \u escapes (either reads back as the same values). Amounts may exceed 64 bits (a leg up to 2**127-1): msgspec
# keeps them.
_dumps = msgspec.json.Encoder().encode
_loads = msgspec.json.Decoder().decode


class StoreFailure(RuntimeError):
    """The partition's store failed to read (an I/O error): infrastructure, never the command's fault. It
    ends the worker (streams/app.py), unlike any other exception while deciding a command."""


_MISSING = object()


class PartitionState:
    """StateReader over one partition's store, with the writes of the current batch staged on top."""

    def __init__(self, store: KeyValueStore):
        self.store = store
        # Staged writes. Account and hold records stay dicts until commit: hot accounts (system shards) change
        # many times in a batch and only their last version is written, so it is encoded once.
        self._puts: dict[bytes, bytes | dict] = {}
        self._deletes: set[bytes] = set()
        # Decoded records (committed or staged). Dropped whole with the staged writes on discard().
        self._accounts: dict[str, Account | None] = {}
        self._holds: dict[str, Hold | None] = {}
        self._transactions: dict[str, core.PostedTransaction | None] = {}
        # Decoded engine records (record()): read on every command (the copies' timeouts, the waiting queue,
        # locks), so decoded once until written. Callers never change what they get: they build new values.
        self._records: dict[str, Any] = {}
        # Open holds with an expiry, by expires_at_ms (the x/ index keys, committed and staged).
        self.expiries = DueIndex()
        self._load_expiries()
        # The producers' copies whose reservations wait for their coordinator's Reserve, by transaction key and
        # due time (the COPY_DUE engine records, committed and staged).
        self.copy_dues = DueIndex()
        self._load_copy_dues()
        # The commands waiting for transactions in flight, in arrival order (the WAITING_ENTRY engine records,
        # committed and staged; streams/waiting.py).
        self.waiting = WaitingIndex()
        self._load_waiting()
        # Currencies registered in this partition (RegisterCurrency), committed and staged: code -> scale.
        # currencies_epoch moves whenever they may have changed, so the processor rebuilds its registry.
        self.registered: dict[str, int] = {}
        self.currencies_epoch = 0
        self._load_currencies()
        # The last inbox key found absent; any staged inbox entry clears it (a one-entry negative cache).
        self._not_in_inbox: tuple[str, str] | None = None
        # Undo log of the command being decided: (key, staged value before or _MISSING, was a staged delete).
        # A command that fails part way is rolled back to its start (rollback), so it leaves nothing staged.
        self._journal: list[tuple[bytes, Any, bool]] = []
        # For memos of judgements over the state (Spanning's waiting commands): how many times each key was
        # written, and the keys read while watched (watch, watched). A memo keeps the version of every key its
        # judgement read and holds while none was written since; generation moves when staged writes are
        # undone or dropped, or the versions are forgotten, and makes every memo stale.
        self.versions: dict[bytes, int] = {}
        self.generation = 0
        self._watched: set[bytes] | None = None

    def _load_currencies(self) -> None:
        """The registered currencies as committed, with the staged ones on top (c/<code> records)."""
        try:
            found = {key[2:].decode(): json.loads(value)["scale"] for key, value in self.store.scan(b"c/")}
        except Exception as exc:  # noqa: BLE001 - whatever the store raises is an I/O failure
            raise StoreFailure(f"scanning the currencies: {exc}") from exc
        for key, value in self._puts.items():
            if key.startswith(b"c/"):
                found[key[2:].decode()] = value["scale"]
        self.registered = found
        self.currencies_epoch += 1

    def _load_expiries(self) -> None:
        try:
            keys = [key for key, _ in self.store.scan(b"x/") if key not in self._deletes]
        except Exception as exc:  # noqa: BLE001 - whatever the store raises is an I/O failure
            raise StoreFailure(f"scanning the expiry index: {exc}") from exc
        keys += [key for key in self._puts if key.startswith(b"x/")]
        pairs = []
        for key in keys:
            _, at, hold_id = key.decode().split("/", 2)
            pairs.append((hold_id, int(at)))
        self.expiries = DueIndex(pairs)

    def _load_copy_dues(self) -> None:
        prefix = b"e/" + COPY_DUE.encode()
        try:
            keys = [key for key, _ in self.store.scan(prefix) if key not in self._deletes]
        except Exception as exc:  # noqa: BLE001 - whatever the store raises is an I/O failure
            raise StoreFailure(f"scanning the copies' timeouts: {exc}") from exc
        keys += [key for key in self._puts if key.startswith(prefix)]
        pairs = []
        for key in keys:
            due, transaction = parse_copy_due(key[2:].decode())
            pairs.append((transaction, due))
        self.copy_dues = DueIndex(pairs)

    def _load_waiting(self) -> None:
        prefix = b"e/" + WAITING_ENTRY.encode()
        try:
            found = {key: value for key, value in self.store.scan(prefix) if key not in self._deletes}
        except Exception as exc:  # noqa: BLE001 - whatever the store raises is an I/O failure
            raise StoreFailure(f"scanning the waiting commands: {exc}") from exc
        found.update((key, value) for key, value in self._puts.items() if key.startswith(prefix))
        self.waiting = WaitingIndex((parse_waiting_key(key[2:].decode()), _loads(value))
                                    for key, value in found.items())

    def _index_copy_due(self, record_key: str, present: bool) -> None:
        due, transaction = parse_copy_due(record_key)
        if present:
            self.copy_dues.put(transaction, due)
        else:
            self.copy_dues.drop(transaction, due)

    def _get(self, key: bytes) -> bytes | None:
        if key in self._puts:
            value = self._puts[key]
            return _dumps(value) if value.__class__ is dict else value
        if key in self._deletes:
            return None
        try:
            return self.store.get(key)
        except Exception as exc:  # noqa: BLE001 - whatever the store raises is an I/O failure
            raise StoreFailure(f"reading {key[:80]!r}: {exc}") from exc

    # Undo of one command -----------------------------------------------------------------------------------
    def begin_command(self) -> None:
        """Start the undo log of one command (the previous one's is dropped: it stays staged)."""
        self._journal = []

    def _touch(self, key: bytes) -> None:
        self._journal.append((key, self._puts.get(key, _MISSING), key in self._deletes))
        self.versions[key] = self.versions.get(key, 0) + 1

    def _forget_versions(self) -> None:
        self.versions = {}
        self.generation += 1

    def watch(self) -> None:
        """Start recording the keys the StateReader methods and record() read (see versions)."""
        self._watched = set()

    def watched(self) -> set[bytes]:
        """Stop recording; the keys read since watch()."""
        keys, self._watched = self._watched or set(), None
        return keys

    def rollback(self) -> None:
        """Undo every write staged since begin_command(): the command had no effect at all."""
        for key, value, deleted in reversed(self._journal):
            if value is _MISSING:
                self._puts.pop(key, None)
            else:
                self._puts[key] = value
            if deleted:
                self._deletes.add(key)
            else:
                self._deletes.discard(key)
        self._journal = []
        self._forget_versions()
        self._accounts.clear()  # caches: reloaded from the staged writes and the store
        self._holds.clear()
        self._transactions.clear()
        self._records.clear()
        self._not_in_inbox = None
        self._load_currencies()
        # The due indexes as committed and staged now (entries the command took or added are restored).
        self._load_copy_dues()
        self._load_expiries()
        self._load_waiting()

    # StateReader -------------------------------------------------------------------------------------------
    def account(self, account_id: str) -> Account | None:
        if self._watched is not None:
            self._watched.add(b"a/" + account_id.encode())
        try:
            return self._accounts[account_id]
        except KeyError:
            raw = self._get(b"a/" + account_id.encode())
            value = None if raw is None else account_from_record(_loads(raw))
            self._accounts[account_id] = value
            return value

    def hold(self, hold_id: str) -> Hold | None:
        if self._watched is not None:
            self._watched.add(b"h/" + hold_id.encode())
        try:
            return self._holds[hold_id]
        except KeyError:
            raw = self._get(b"h/" + hold_id.encode())
            value = None if raw is None else hold_from_record(_loads(raw))
            self._holds[hold_id] = value
            return value

    def transaction(self, transaction_id: str) -> core.PostedTransaction | None:
        if self._watched is not None:
            self._watched.add(b"t/" + transaction_id.encode())
        try:
            return self._transactions[transaction_id]
        except KeyError:
            raw = self._get(b"t/" + transaction_id.encode())
            value = None if raw is None else transaction_from_record(_loads(raw))
            self._transactions[transaction_id] = value
            return value

    def rate(self, snapshot_id: str) -> core.RateSnapshot | None:
        if self._watched is not None:
            self._watched.add(b"r/" + snapshot_id.encode())
        raw = self._get(b"r/" + snapshot_id.encode())  # rare (conversions only): not cached
        return None if raw is None else rate_from_record(_loads(raw))

    def processed(self, key: tuple[str, str]) -> Processed | None:
        if self._watched is not None:
            self._watched.add(_inbox_key(*key))
        if key == self._not_in_inbox:  # the engine looked it up just before the core asks
            return None
        change = self.change_record(*key)
        if change is None:
            return None
        wire = codec().decode("result", change["result"])
        accepted = wire["outcome"] == "accepted"  # an accepted result's reason is a notice, not a rejection
        reason = None if wire["reason"] is None or accepted else Rejection[wire["reason"].upper()]
        return Processed(change["fingerprint"], Result(
            wire["command_id"], wire["client_id"], wire["outcome"], reason, wire["detail"], (),
            notice=wire["reason"] if accepted else None))

    # Engine side -------------------------------------------------------------------------------------------
    def change_record(self, client_id: str, command_id: str) -> dict[str, Any] | None:
        """The stored StateChange of a decided command (the inbox entry), or None."""
        if self._watched is not None:
            self._watched.add(_inbox_key(client_id, command_id))
        raw = self._get(_inbox_key(client_id, command_id))
        if raw is None:
            self._not_in_inbox = (client_id, command_id)
            return None
        return codec().decode("state", raw)

    def stage(self, change: dict[str, Any], encoded: bytes, accounts: list[Account] | None = None,
              holds: list[Hold] | None = None) -> None:
        """Stage every write of one StateChange record (restore passes only the record; the live path also
        passes the decoded accounts and holds it already has, in the record's order)."""
        puts, touch = self._puts, self._touch
        if change["source_offset"] > self.applied_offset():
            touch(APPLIED_OFFSET_KEY)
            puts[APPLIED_OFFSET_KEY] = str(change["source_offset"]).encode()
        for i, record in enumerate(change["accounts"]):
            account = accounts[i] if accounts is not None else account_from_record(record)
            self._accounts[account.id] = account
            key = b"a/" + account.id.encode()
            touch(key)
            puts[key] = record
        for i, record in enumerate(change["holds"]):
            hold = holds[i] if holds is not None else hold_from_record(record)
            self._holds[hold.id] = hold
            key = b"h/" + hold.id.encode()
            touch(key)
            puts[key] = record
            if hold.expires_at_ms is not None:
                key = _expiry_key(hold)
                touch(key)
                if hold.status is HoldStatus.OPEN:
                    puts[key] = b""
                    self._deletes.discard(key)
                    self.expiries.put(hold.id, hold.expires_at_ms)
                else:
                    puts.pop(key, None)
                    self._deletes.add(key)
                    self.expiries.drop(hold.id)
        for record in change.get("rates", ()):
            key = b"r/" + record["snapshot_id"].encode()
            touch(key)
            puts[key] = dict(record)
            self._deletes.discard(key)
        for record in change.get("currencies", ()):
            key = b"c/" + record["currency"].encode()
            touch(key)
            puts[key] = dict(record)
            self._deletes.discard(key)
            self.registered[record["currency"]] = record["scale"]
            self.currencies_epoch += 1
        for record in change.get("transactions", ()):
            key = b"t/" + record["transaction_id"].encode()
            self._transactions.pop(record["transaction_id"], None)  # decoded again when read
            touch(key)
            puts[key] = record
            self._deletes.discard(key)
        for record in change.get("records", ()):
            name = record["key"]
            self._records.pop(name, None)
            key = b"e/" + name.encode()
            touch(key)
            if record["value"] is None:
                puts.pop(key, None)
                self._deletes.add(key)
            else:
                puts[key] = record["value"]
                self._deletes.discard(key)
            if name.startswith(COPY_DUE):
                self._index_copy_due(name, record["value"] is not None)
            elif name.startswith(WAITING_ENTRY):
                if record["value"] is None:
                    self.waiting.drop(parse_waiting_key(name))
                else:
                    self.waiting.put(parse_waiting_key(name), _loads(record["value"]))
        key = _inbox_key(change["client_id"], change["command_id"])
        touch(key)
        puts[key] = encoded
        self._not_in_inbox = None

    def record(self, key: str) -> Any:
        """An engine record (multi-partition transaction state, hold locks), or None. Shared: not to be
        changed in place."""
        if self._watched is not None:
            self._watched.add(b"e/" + key.encode())
        try:
            return self._records[key]
        except KeyError:
            raw = self._get(b"e/" + key.encode())
            value = None if raw is None else _loads(raw)
            if len(self._records) > DECODED_CACHE_LIMIT:
                self._records.clear()
            self._records[key] = value
            return value

    def staged_accounts(self) -> list[Account]:
        """The latest staged version of every account written since the last commit (undone commands
        leave none: their writes are no longer staged)."""
        return [self.account(key[2:].decode()) for key in self._puts if key[:2] == b"a/"]

    @property
    def has_staged(self) -> bool:
        return bool(self._puts or self._deletes)

    def commit(self, changelog_next_offset: int, meta: dict[bytes, bytes] | None = None) -> None:
        """Write everything staged, and the changelog position it corresponds to, in one atomic batch.
        meta: more of the engine's bookkeeping (m/... keys) written in the same batch."""
        puts = {key: _dumps(value) if value.__class__ is dict else value for key, value in self._puts.items()}
        puts[CHANGELOG_OFFSET_KEY] = str(changelog_next_offset).encode()
        puts.update(meta or {})
        self.store.write(puts, self._deletes)
        self._puts = {}
        self._deletes = set()
        self._journal = []
        if len(self.versions) > DECODED_CACHE_LIMIT:  # bounded: memos made before are stale, not wrong
            self._forget_versions()
        if len(self._accounts) + len(self._holds) + len(self._transactions) > DECODED_CACHE_LIMIT:
            # The decoded records are a cache of the store, and nothing is staged now: dropping them keeps a
            # long-running worker's memory to its working set instead of every hold and transaction it met.
            self._accounts.clear()
            self._holds.clear()
            self._transactions.clear()

    def discard(self) -> None:
        """Forget everything staged (the batch will be redone after a restore)."""
        self._puts = {}
        self._deletes = set()
        self._journal = []
        self._forget_versions()
        self._accounts.clear()
        self._holds.clear()
        self._transactions.clear()
        self._records.clear()
        self._not_in_inbox = None
        self._load_expiries()
        self._load_currencies()
        self._load_copy_dues()
        self._load_waiting()

    def applied_offset(self) -> int:
        """The highest commands offset whose effects are staged or stored (-1: none)."""
        value = self._get(APPLIED_OFFSET_KEY)
        return -1 if value is None else int(value)

    def changelog_offset(self) -> int:
        raw = self.store.get(CHANGELOG_OFFSET_KEY)
        return 0 if raw is None else int(raw)


class PartitionProcessor:
    """Applies commands of one partition in order; collects outputs and changelog records."""

    def __init__(self, partition: int, partitions: int, store: KeyValueStore,
                 currencies: core.CurrencyRegistry = core.DEFAULT_CURRENCIES, seal: Seal = DEVELOPMENT,
                 commands_topic: str = "commands", clients: Clients | None = None):
        self.partition = partition
        self.partitions = partitions
        # The currencies every partition starts with; those registered here (RegisterCurrency) are added by
        # the currencies property, from this partition's state.
        self.base_currencies = currencies
        self._registry: tuple[int, core.CurrencyRegistry] = (-1, currencies)
        # Engine steps are taken only from records sealed by a worker for this topic and partition (seal.py).
        self.seal = seal
        self.commands_topic = commands_topic
        self._raw: tuple[bytes | None, Headers] = (None, None)
        self._sealed: bool | None = None  # whether the record being decided is sealed; computed when asked
        # Client authentication (streams/authn.py): None runs open. _signer: (client id, "") or (None, why)
        # for the record being decided, computed once per record (a batch has one signature).
        self.clients = clients
        self._signer: tuple[str | None, str] | None = None
        self.state = PartitionState(store)
        self.outputs: list[Output] = []
        self.changelog: list[bytes] = []  # encoded StateChange records of the batch, in order
        self.codec = codec()
        # Where the command being decided sits in the log: "<offset>" or "<offset>.<index in its batch>";
        # unique per command, so ids derived from it are too.
        self.position = ""
        # The log time of the record being decided (its Kafka timestamp): a linked batch, which cannot wait,
        # counts only credits copies reserved within COPIED_CREDIT_WAIT_MS of it (Spanning._awaits_credit).
        self.now_ms = 0
        self._homes: dict[str, int | None] = {}
        # The fingerprints of the last few commands asked about, by identity (each kept with its command, so an
        # id is not reused meanwhile): a transaction's steps ask for its fingerprint several times.
        self._fingerprints: dict[int, tuple[core.Command, str]] = {}
        self.spanning = Spanning(self)
        self.linking = Linking(self)
        self.linked_spanning = LinkedSpanning(self)
        # (command kind, outcome, reason) -> count of results emitted; read and reset by the engine (metrics).
        self.tally: Counter = Counter()
        self.kind = "unknown"
        self._offset = 0  # offset of the record being decided (the source of what it stages)
        # Money in this partition's clearing shards per currency, for the in-flight gauge.
        self.clearing: dict[str, int] = {}

    @property
    def currencies(self) -> core.CurrencyRegistry:
        """The base currencies and those registered in this partition (as committed and staged)."""
        epoch, registry = self._registry
        if epoch != self.state.currencies_epoch:
            registry = self.base_currencies
            for code, scale in sorted(self.state.registered.items()):
                registry = registry.with_currency(core.Currency(code, scale))
            self._registry = (self.state.currencies_epoch, registry)
        return registry

    # One record ------------------------------------------------------------------------------------------
    def sealed_headers(self, partition: int, value: bytes) -> list[tuple[str, bytes]]:
        """The headers a worker puts on a commands record it produces for `partition` (the engine's seal)."""
        return self.seal.headers(self.commands_topic, partition, value)

    def _is_sealed(self) -> bool:
        if self._sealed is None:
            value, headers = self._raw
            self._sealed = self.seal.verify(self.commands_topic, self.partition, value, headers)
        return self._sealed

    def handle(self, offset: int, timestamp_ms: int, key: bytes | None, value: bytes | None,
               headers: Headers = None) -> None:
        """One record of the commands topic: a command, or a CommandBatch whose commands are decided in order
        exactly as if each had been a record of its own (with this record's time). headers: the record's
        Kafka headers (the engine's seal, if a worker wrote it)."""
        self._raw, self._sealed, self._signer = (value, headers), None, None
        self.now_ms = timestamp_ms
        if self.codec.is_a("command_batch", value):
            try:
                batch = self.codec.decode("command_batch", value)
            except DecodeError as exc:
                self.dead_letter(offset, timestamp_ms, key, value, exc.reason, exc.detail)
                return
            items = batch["commands"]
            if items and batch["linked"]:  # all or nothing (streams/linking.py)
                self.linking.handle(offset, timestamp_ms, key, items, batch.get("coordinator"))
                return
            if not items:
                if self._is_sealed():  # a worker's tick (streams/ticks.py): log time moves, due holds expire
                    self._tick(offset, timestamp_ms)
                    return
                # nothing to answer, but the sender should hear that it sent nothing
                self.dead_letter(offset, timestamp_ms, key, value, "empty", "a CommandBatch without commands")
                return
            for index, item in enumerate(items):
                self.position = f"{offset}.{index}"
                self._handle_command(offset, timestamp_ms, key, item, index)
            return
        self.position = str(offset)
        self._handle_command(offset, timestamp_ms, key, value, None)

    def _tick(self, offset: int, timestamp_ms: int) -> None:
        """A sealed tick: nothing to decide or answer, only the holds due by its log time expire."""
        self.position, self._offset, self.kind = str(offset), offset, "tick"
        self.state.begin_command()
        self.expire_due(offset, timestamp_ms)

    def _handle_command(self, offset: int, timestamp_ms: int, key: bytes | None, value: bytes | None,
                        index: int | None) -> None:
        try:
            record = self.codec.decode("command", value)
        except DecodeError as exc:
            where = "" if index is None else f"command {index} of the batch: "
            self.dead_letter(offset, timestamp_ms, key, value, exc.reason, where + exc.detail, index)
            return
        client_id, command_id = record["client_id"], record["command_id"]
        kind = self.kind = record["body"][0].rsplit(".", 1)[-1]
        self.guarded(offset, f"command {command_id[:200]!r} of {client_id[:200]!r}",
                     lambda: self._decide_record(record, kind, len(value), offset, timestamp_ms),
                     lambda why: self._refuse_record(record, kind, offset, timestamp_ms, why))

    def _refuse_record(self, record: dict[str, Any], kind: str, offset: int, timestamp_ms: int, why: str) -> None:
        """A record that failed part way (undone): rejected. A Reserve is also remembered and answered with a
        vote against, so its transaction ends (aborted) instead of waiting for a vote that never comes."""
        if kind == "Reserve" and record["client_id"] == ENGINE_CLIENT and self._is_sealed() and \
                self.spanning.refuse_reserve(record, offset, timestamp_ms, why):
            return
        self.reject(record["command_id"], record["client_id"], timestamp_ms, Rejection.INVALID_COMMAND, why)

    def guarded(self, offset: int, what: str, decide: Callable[[], None], refuse: Callable[[str], None]) -> None:
        """decide() the commands of one record, or, if it fails part way, undo all it staged and refuse(why).
        Nothing a producer writes may stop the worker; only the store's I/O failures (and running out of
        memory) end the process."""
        outputs, changelog, tally = len(self.outputs), len(self.changelog), dict(self.tally)
        self._offset = offset
        self.state.begin_command()
        try:
            decide()
        except (StoreFailure, MemoryError):
            raise
        except Exception as exc:  # noqa: BLE001 - see above
            log.exception("%s at %d/%s failed part way; undone and rejected", what, self.partition, self.position)
            self.state.rollback()
            del self.outputs[outputs:]
            del self.changelog[changelog:]
            self.tally = Counter(tally)
            refuse(f"unprocessable: {type(exc).__name__}: {exc}")

    def _decide_record(self, record: dict[str, Any], kind: str, size: int, offset: int, timestamp_ms: int) -> None:
        if kind in SPANNING_KINDS and record["client_id"] == ENGINE_CLIENT and self._is_sealed():
            self.spanning.handle(kind, record, offset, timestamp_ms)
            return
        if kind in LINKED_STEP_KINDS and record["client_id"] == ENGINE_CLIENT and self._is_sealed():
            self.linked_spanning.handle(kind, record, offset, timestamp_ms)
            return
        command = self.admit(record, kind, size, timestamp_ms)
        if isinstance(command, Rejection):
            return
        if isinstance(command, core.PostTransaction) and self.spanning.is_copy(command):
            if self.not_permitted(command) is not None:
                return  # nothing to reserve: the coordinator judges the same command and answers it
            self.expire_due(offset, timestamp_ms)
            self.judge(command, offset)
            return
        if self._answer_if_seen(command):
            return
        if not isinstance(command, core.PostTransaction) and self.refused_for_ids_in_flight(command):
            return  # before the policy: a refusal remembered under those ids would be the transaction's decision
        # A retry of a transaction under way was judged, its client's policy included, when it began: it is
        # answered when decided (judge). Judged again under a policy changed since, it was refused and that
        # refusal remembered while the transaction went on, and the aborts sent for it could reach a
        # participant before its vote.
        retry = self.spanning.under_way(command) or self.linked_spanning.in_flight(command)
        refusal = None if retry else self.not_permitted(command)
        if refusal is not None:
            self.reject_command(command, Rejection.NOT_PERMITTED, refusal)
            return
        self.expire_due(offset, timestamp_ms)
        self.judge(command, offset, seen_checked=True)

    def admit(self, record: dict[str, Any], kind: str, size: int, timestamp_ms: int) -> core.Command | Rejection:
        """The client command a decoded record carries, once it passed the checks every client command
        passes (the engine's seal on engine steps, client authentication, size limits, readable fields);
        when it did not, the reason it was answered with."""
        client_id, command_id = record["client_id"], record["command_id"]
        steps = kind in SPANNING_KINDS or kind in LINKED_STEP_KINDS
        if (client_id == ENGINE_CLIENT or steps) and not self._is_sealed():
            self.reject(command_id, client_id, timestamp_ms, Rejection.INVALID_COMMAND,
                         f"{UNSEALED}: a {kind} as client {client_id!r} is taken only from a record "
                         f"a ledger worker sealed (streams/seal.py); this record has no valid seal")
            return Rejection.INVALID_COMMAND
        if self.clients is not None and client_id != ENGINE_CLIENT and not self._is_sealed():
            refusal = self._unauthenticated(client_id)  # client authentication (streams/authn.py)
            if refusal is not None:
                self.reject(command_id, client_id, timestamp_ms, Rejection.NOT_AUTHENTICATED, refusal)
                return Rejection.NOT_AUTHENTICATED
        if client_id != ENGINE_CLIENT:  # the engine's own commands derive from commands checked here
            try:
                limits.check_command(record, size)
            except limits.LimitExceeded as exc:
                self.reject(command_id, client_id, timestamp_ms, Rejection.INVALID_COMMAND, exc.detail)
                return Rejection.INVALID_COMMAND
        if steps:
            self.reject(command_id, client_id, timestamp_ms, Rejection.INVALID_COMMAND,
                         f"{kind} is issued by the ledger itself")
            return Rejection.INVALID_COMMAND
        try:
            return command_from_wire(record, timestamp_ms)
        except WireError as exc:
            self._refuse_unreadable(record, kind, timestamp_ms, exc.reason, exc.detail)
            return exc.reason
        except (TypeError, ValueError) as exc:  # a field the core refuses (e.g. empty id in a Leg)
            self._refuse_unreadable(record, kind, timestamp_ms, Rejection.INVALID_COMMAND, str(exc))
            return Rejection.INVALID_COMMAND

    # Client authentication and policy (streams/authn.py, streams/core/policy.py) ----------------------------
    def _unauthenticated(self, client_id: str) -> str | None:
        """Why a command of client_id in this unsealed record is not taken as that client's, or None."""
        if self._signer is None:
            value, headers = self._raw
            self._signer = self.clients.authenticate(self.commands_topic, self.partition, value, headers)
        signer, why = self._signer
        if signer is None:
            return why
        if signer != client_id:
            return f"client_mismatch: a record signed by {signer[:200]!r} carries a command of {client_id[:200]!r}"
        return None

    def not_permitted(self, command: core.Command) -> str | None:
        """The refusal detail when the (authenticated) client's policy does not allow this command, which it
        wrote itself; None when it does, when the ledger runs open, and for the engine's sealed records
        (forwarded or derived from a command judged where it arrived)."""
        if self.clients is None or command.client_id == ENGINE_CLIENT or self._is_sealed():
            return None
        hold = self.state.hold(command.hold_id) if isinstance(command, (core.ReleaseHold, core.ExpireHold)) else None
        return judge_policy(self.clients.policy(command.client_id), command,
                            None if hold is None else hold.account_id)

    def judge(self, command: core.Command, offset: int, seen_checked: bool = False, woken: bool = False) -> None:
        """A readable client command, in its place: a producer's copy of a multi-partition transaction
        reserves here; a retry of a transaction under way is answered when decided; a command that must wait
        for a transaction in flight waits (spanning.waits); anything else is judged and routed. woken: it
        waited and its turn has come (spanning.drain), so it waits no more."""
        if isinstance(command, core.PostTransaction) and self.spanning.is_copy(command):
            if not woken and self.spanning.waits(command):
                self.spanning.wait(command, offset)
            else:
                self.spanning.copy(command, offset)
            return
        if not seen_checked and self._answer_if_seen(command):
            return
        if not isinstance(command, core.PostTransaction) and self.refused_for_ids_in_flight(command):
            return
        if self.linked_spanning.in_flight(command):  # a retry: answered when its linked batch is decided
            self.linked_spanning.retry(command, offset, alone=True)
            return
        if self.spanning.under_way(command):  # a retry of a transaction in flight: answered when decided
            # Straight to the transaction's own record, which compares payloads: routed afresh, another payload
            # under the same ids (local, or elsewhere) was executed as a command of its own.
            self.spanning.begin(command, offset)
            return
        if not woken and self.spanning.waits(command):
            self.spanning.wait(command, offset)
            return
        refusal = self.spanning.refusal(command)
        if refusal is not None:
            self.reject_command(command, *refusal)
            return
        self._route_and_execute(command, offset)

    def refused_for_ids_in_flight(self, command: core.Command) -> bool:
        """A command whose ids name a transaction in flight here (begun by this partition, or of a linked batch)
        and that is not that transaction sent again: answered id_conflict, not remembered, and True. Its ids'
        decision is the transaction's (the final vote reads it under those ids), so it is never decided on its
        own, alone or in a batch."""
        return self._ids_in_flight_refused(command.client_id, command.command_id, command.at_ms)

    def _ids_in_flight_refused(self, client_id: str, command_id: str, at_ms: int) -> bool:
        key = names.transaction_key(client_id, command_id)
        if not (self.spanning.ids_in_flight(key) or self.linked_spanning.ids_in_flight(key)):
            return False
        self.reject(command_id, client_id, at_ms, Rejection.ID_CONFLICT,
                    f"command {command_id} of {client_id} names a transaction in flight")
        return True

    def _refuse_unreadable(self, record: dict[str, Any], kind: str, at_ms: int, reason: Rejection,
                           detail: str) -> None:
        """A command whose fields cannot be read (its ids can: the limits were checked) is rejected and
        remembered like any decision, under a fingerprint of its record: the same bytes sent again get the
        same answer (a duplicate), another payload under the id gets id_conflict."""
        client_id, command_id = record["client_id"], record["command_id"]
        fingerprint = "unreadable:" + hashlib.sha256(repr((kind, record["body"][1])).encode()).hexdigest()
        stored = self.state.change_record(client_id, command_id)
        if stored is not None:
            if stored["fingerprint"] == fingerprint:
                self.answer_again(stored)
            else:
                self.reject(command_id, client_id, at_ms, Rejection.ID_CONFLICT,
                             f"command {command_id} of {client_id} was already used with another payload")
            return
        if self._ids_in_flight_refused(client_id, command_id, at_ms):
            return  # remembered under those ids, this refusal would be the transaction's decision
        self.commit_change(client_id, command_id, fingerprint, self._offset,
                           rejection_to_wire(command_id, client_id, at_ms, reason, limits.clip(detail)))

    def _answer_if_seen(self, command: core.Command) -> bool:
        """Inbox check: a decided command id gets its original result (or id_conflict) and nothing else."""
        stored = self.state.change_record(command.client_id, command.command_id)
        if stored is None:
            return False
        if stored["fingerprint"] == self.fingerprint(command):
            self.answer_again(stored)
        else:
            self.reject(command.command_id, command.client_id, command.at_ms, Rejection.ID_CONFLICT,
                         f"command {command.command_id} of {command.client_id} was already used with another payload")
        return True

    def expire_due(self, offset: int, now_ms: int) -> None:
        """Expire every open hold whose expires_at_ms has passed in log time (deterministic: P7), and drop the
        reservations of copies whose coordinator never confirmed them (spanning.expire_copies). Not for a
        record delivered again whose effects the state holds already: it was read once, and what fell due
        then was expired then; its time must not move expiries after a crash (a later record of earlier log
        time decided them the first time)."""
        if offset < self.state.applied_offset():  # (the same offset: the other commands of one batch record)
            return
        due = self.spanning.expire_copies(offset, now_ms)
        for key in due:
            self.linked_spanning.expire_copy(key, offset, now_ms)
        # A linked copy's drop may have queued commands (its mark stays until they were drained: after a crash
        # between the two, the record delivered again drains them).
        woken = self.linked_spanning.wake_due()
        # Waiting debits whose wait for copied credits ends by now: recorded over, and judged again.
        ended = self.state.waiting.dues.take_due(now_ms)
        if ended:
            self.spanning.end_copied_waits([int(seq) for _, seq in ended], offset)
        if due or woken or ended:
            self.spanning.drain(offset)
        if woken:
            self.linked_spanning.woken(offset, now_ms)
        for _, hold_id in self.state.expiries.take_due(now_ms):
            hold = self.state.hold(hold_id)
            if hold is None or hold.status is not HoldStatus.OPEN:
                continue  # ended since it was indexed
            if self.spanning.locked(hold_id):
                continue  # reserved by a transaction in flight; re-indexed when it is decided
            self.execute(core.ExpireHold(command_id=f"expire:{hold_id}", client_id=ENGINE_CLIENT,
                                          at_ms=now_ms, hold_id=hold_id), offset)

    # Routing -----------------------------------------------------------------------------------------------
    def home(self, account_id: str) -> int | None:
        """The partition of an ordinary account; None for a system account (it has a shard everywhere)."""
        try:
            return self._homes[account_id]
        except KeyError:
            home = None if routing.is_system(account_id) else routing.partition_of_account(account_id, self.partitions)
            if len(self._homes) > 100_000:  # bounded: a cache, not a registry
                self._homes.clear()
            self._homes[account_id] = home
            return home

    def local(self, account_id: str) -> str:
        return routing.shard_of(account_id, self.partition) if routing.is_system(account_id) else account_id

    def route(self, command: core.Command) -> "Route":
        """Where a readable client command is decided, as the engine routes it (facts, not judgement)."""
        if isinstance(command, core.OpenAccount) and routing.is_system(command.account_id):
            return Route(refusal=(Rejection.INVALID_COMMAND, "system accounts (sys:...) open themselves on first use"))
        if isinstance(command, core.PostTransaction):
            # In one step when every leg lives here (streams/placement.py); by its coordinator in two phases
            # when its legs live in several partitions; forwarded, unchanged, when it belongs elsewhere.
            where = self.spanning.plan(command)
            if where.coordinator is not None and where.coordinator != self.partition:
                return Route(elsewhere=where.coordinator)
            if where.spans:
                return Route(spans=where.participants)
            legs: list[Leg] = []
            for leg in command.legs:
                if routing.is_system(leg.account_id):
                    if routing.SHARD_MARK in leg.account_id:
                        return Route(refusal=(Rejection.INVALID_COMMAND, "shard ids (sys:...@n) are internal"))
                    legs.append(Leg(self.local(leg.account_id), leg.amount, leg.hold_id, leg.currency))
                else:
                    legs.append(leg)
            return Route(command.with_legs(tuple(legs)),
                         tuple(leg.account_id for leg in command.legs if routing.is_system(leg.account_id)))
        if isinstance(command, core.ReverseTransaction) and self.home(command.account_id) in (None, self.partition):
            original = self.state.transaction(command.reverses)
            if original is not None and any(names.is_clearing(leg.account_id) for leg in original.legs):
                return Route(refusal=(Rejection.NOT_REVERSIBLE,
                                      f"transaction {command.reverses} moved money through clearing to or from "
                                      f"another partition: post a compensating transaction instead"))
        account_id = getattr(command, "account_id", None)
        if account_id is not None:
            home = self.home(account_id)
            if home is not None and home != self.partition:
                return Route(elsewhere=home)
            if routing.is_system(account_id):
                return Route(replace(command, account_id=self.local(account_id)), (account_id,))
        return Route(command)

    def _route_and_execute(self, command: core.Command, offset: int) -> None:
        route = self.route(command)
        if route.refusal is not None:
            self.reject_command(command, *route.refusal)
        elif route.elsewhere is not None:
            self._forward(command, route.elsewhere)
        elif route.spans:
            self.spanning.begin(command, offset)
        elif self.open_shards(list(route.shards), command, offset):
            self.execute(route.command, offset, command)

    def open_shards(self, system_ids: list[str], command: core.Command, offset: int) -> bool:
        """Open the local shard of each system account on first use; False (rejected) for an unknown currency."""
        for account_id in dict.fromkeys(system_ids):
            shard = self.local(account_id)
            if self.state.account(shard) is not None:
                continue
            currency = routing.system_currency(account_id)
            if self.currencies.get(currency) is None:
                self.reject_command(command, Rejection.UNKNOWN_CURRENCY,
                                     f"system account {account_id} names unknown currency {currency}")
                return False
            self.execute(core.OpenAccount(command_id=f"open:{shard}", client_id=ENGINE_CLIENT, at_ms=command.at_ms,
                                           account_id=shard, currency=currency, policy=core.SYSTEM_POLICY), offset)
        return True

    # Cross-partition follow-ups ----------------------------------------------------------------------------
    def _forward(self, command: core.Command, home: int) -> None:
        """A command sent to the wrong partition goes, unchanged, to the one that owns its account."""
        account = getattr(command, "account_id", None) or placement.account_in(
            [(leg.account_id, leg.amount) for leg in command.legs], home, self.home)
        self._send_command(command, routing.routing_key_for(account), home)

    def _send_command(self, command: core.Command, key: str, partition: int) -> None:
        self.send_wire(command_to_wire(command), key, partition, command.at_ms)

    def send_wire(self, record: dict[str, Any], key: str, partition: int, at_ms: int) -> None:
        """A command to a partition, stamped with the log time of the command that caused it (P7)."""
        self._output(Output("commands", key.encode(), self.codec.encode("command", record), partition, at_ms))

    def _output(self, output: Output) -> None:
        if len(output.key) + len(output.value) > limits.OUTPUT_RECORD_BYTES:
            raise OutputTooLarge(f"a {output.topic} record of {len(output.key) + len(output.value)} bytes, "
                                 f"the limit is {limits.OUTPUT_RECORD_BYTES}")
        self.outputs.append(output)

    def fingerprint(self, command: core.Command) -> str:
        """command.fingerprint() (commands are frozen values: computed once for the last few asked about)."""
        known = self._fingerprints.get(id(command))
        if known is None or known[0] is not command:
            if len(self._fingerprints) >= 16:
                self._fingerprints.clear()
            known = self._fingerprints[id(command)] = (command, command.fingerprint())
        return known[1]

    # Execution and outputs ---------------------------------------------------------------------------------
    def execute(self, command: core.Command, offset: int, as_sent: core.Command | None = None,
                records: list[tuple[str, Any]] = ()) -> Result:
        """Decide and stage one command. as_sent: the command as the client sent it, before routing
        rewrote system accounts to their shards; its fingerprint is the one a retry is compared with.
        records: engine records written in the same StateChange (see commit_change)."""
        fingerprint = self.fingerprint(as_sent or command)
        result, changes = core.execute(self.state, command, self.currencies, fingerprint)
        if changes.processed is None:  # duplicate or conflict found by the core itself
            self.emit_result(result_to_wire(result, command.at_ms, None, []))
            return result
        self.record_decision(command, result, changes, offset, fingerprint, records)
        return result

    def record_decision(self, command: core.Command, result: Result, changes: Changes, offset: int,
                fingerprint: str, records: list[tuple[str, Any]] = ()) -> None:
        transaction_id = command.transaction_id if isinstance(command, core.PostTransaction) and \
            result.outcome == "accepted" else None
        holds = list(changes.holds.values())
        wire_result = result_to_wire(result, command.at_ms, transaction_id, holds)
        self.commit_change(command.client_id, command.command_id, fingerprint, offset, wire_result,
                           list(changes.accounts.values()), holds, changes.history,
                           records, transactions=list(changes.transactions.values()),
                           currencies=changes.currencies, rates=changes.rates)

    def commit_change(self, client_id: str, command_id: str, fingerprint: str, offset: int,
                      wire_result: dict[str, Any], accounts: list[Account] = (), holds: list[Hold] = (),
                      history: tuple = (), records: list[tuple[str, Any]] = (),
                      transactions: list[core.PostedTransaction] = (),
                      currencies: tuple[core.Currency, ...] = (),
                      rates: tuple[core.RateSnapshot, ...] = ()) -> None:
        """Stage one decided command (its StateChange) and queue its outputs: the result, one history entry
        per change (the new balance of each changed account is queued once per batch, by take()). records:
        engine records (key, JSON value or None to delete) written in the same StateChange."""
        encoded_result = self.codec.encode("result", wire_result)
        self.tally[(self.kind, wire_result["outcome"], wire_result["reason"])] += 1
        for account in accounts:
            if names.is_clearing(account.id):
                self.clearing[account.currency] = account.posted
        change = {
            "client_id": client_id,
            "command_id": command_id,
            "fingerprint": fingerprint,
            "source_partition": self.partition,
            "source_offset": offset,
            "accounts": [account_to_record(a) for a in accounts],
            "holds": [hold_to_record(h) for h in holds],
            "result": encoded_result,
            "records": [{"key": k, "value": None if v is None else _dumps(v)} for k, v in records],
            "transactions": [transaction_to_record(t) for t in transactions],
            "currencies": [{"currency": c.code, "scale": c.scale} for c in currencies],
            "rates": [rate_to_record(r) for r in rates],
        }
        encoded_change = self.codec.encode("state", change)
        if len(encoded_change) > limits.OUTPUT_RECORD_BYTES:
            raise OutputTooLarge(f"a changelog record of {len(encoded_change)} bytes, "
                                 f"the limit is {limits.OUTPUT_RECORD_BYTES}")
        self.state.stage(change, encoded_change, accounts, holds)
        self.changelog.append(encoded_change)
        at = wire_result["at_ms"]
        self._output(Output("results", result_key(client_id, command_id, wire_result["reason"]),
                            encoded_result, self.partition, at, client_id))
        currency = {a.id: a.currency for a in accounts}
        for entry in history:
            value = self.codec.encode("history", history_to_wire(entry, currency[entry.account_id], command_id,
                                                                  client_id))
            self._output(Output("history", entry.account_id.encode(), value, self.partition, at))

    def answer_again(self, stored: dict[str, Any]) -> None:
        """A command already in the inbox (its StateChange): its original result, flagged as a duplicate."""
        self.emit_result({**self.codec.decode("result", stored["result"]), "duplicate": True})

    def emit_result(self, wire_result: dict[str, Any]) -> None:
        self.tally[(self.kind, wire_result["outcome"], wire_result["reason"])] += 1
        key = result_key(wire_result["client_id"], wire_result["command_id"], wire_result["reason"])
        self._output(Output("results", key, self.codec.encode("result", wire_result), self.partition,
                            wire_result["at_ms"], wire_result["client_id"]))

    def reject(self, command_id: str, client_id: str, at_ms: int, reason: Rejection, detail: str) -> None:
        """A rejection decided before the core (unreadable fields, routing): answered, not remembered. It
        stays small whatever the command: ids too long to echo whole are shortened (limits.echo_ids) and
        the detail clipped."""
        client_id, command_id = limits.echo_ids(client_id, command_id)
        self.emit_result(rejection_to_wire(command_id, client_id, at_ms, reason, limits.clip(detail)))

    def reject_command(self, command: core.Command, reason: Rejection, detail: str) -> None:
        """A judgement of a readable command outside the core (routing, names the ledger keeps to itself,
        contention with transactions in flight): a decision like the core's, so it is remembered (P4). The
        command is given as sent: its fingerprint is what a retry is compared with."""
        wire = rejection_to_wire(command.command_id, command.client_id, command.at_ms, reason, limits.clip(detail))
        self.commit_change(command.client_id, command.command_id, self.fingerprint(command), self._offset, wire)
        if isinstance(command, core.PostTransaction) and command.client_id != ENGINE_CLIENT and \
                placement.is_placed(command.metadata):
            self.spanning.cancel_copies(command)

    def dead_letter(self, offset: int, timestamp_ms: int, key: bytes | None, value: bytes | None,
                     reason: str, detail: str, index: int | None = None) -> None:
        """value: the bytes that could not be decoded (a batch item's own bytes); the key says which."""
        self.tally[("dead_letter", "dead_letter", reason)] += 1
        detail = limits.clip(detail, limits.DEAD_LETTER_DETAIL_CHARS)
        # Kept whole when it fits a record (always, for what a producer with default settings can write);
        # else its beginning, and the detail says where the whole record is.
        if value is not None and len(value) > limits.DEAD_LETTER_VALUE_BYTES:
            detail += (f" [value truncated to its first {limits.DEAD_LETTER_VALUE_BYTES} of {len(value)} bytes; "
                       f"the whole record is commands {self.partition}/{offset}]")
            value = value[:limits.DEAD_LETTER_VALUE_BYTES]
        if key is not None and len(key) > limits.DEAD_LETTER_KEY_BYTES:
            detail += f" [key truncated to {limits.DEAD_LETTER_KEY_BYTES} of {len(key)} bytes]"
            key = key[:limits.DEAD_LETTER_KEY_BYTES]
        record = {"reason": reason, "detail": detail, "topic": "commands", "partition": self.partition,
                  "offset": offset, "timestamp_ms": timestamp_ms, "key": key, "value": value}
        where = f"{self.partition}/{offset}" if index is None else f"{self.partition}/{offset}/{index}"
        self._output(Output("dlq", where.encode(),
                            self.codec.encode("dead_letter", record), self.partition, timestamp_ms))

    # Batch boundaries --------------------------------------------------------------------------------------
    def take(self) -> tuple[list[Output], list[bytes]]:
        """The batch's outputs and changelog records, emptied for the next batch. The balances topic gets
        one record per account the batch changed, its latest version: the topic is compacted to the latest
        view per account anyway, and history keeps every change. Which intermediate versions a reader could
        have seen depends on where batches were cut (like the grouping of follow-up commands); the last one
        of a batch always equals the fold of history at its seq."""
        for account in self.state.staged_accounts():
            self.outputs.append(Output("balances", account.id.encode(),
                                       self.codec.encode("balance", balance_to_wire(account)), self.partition,
                                       account.updated_at_ms))
        outputs, changelog = self.outputs, self.changelog
        self.outputs, self.changelog = [], []
        return outputs, changelog

    def restore(self, records: list[bytes], next_offset: int, meta: dict[bytes, bytes] | None = None) -> int:
        """Apply changelog records not yet in the store (skipping commands the inbox already has)."""
        applied = 0
        for encoded in records:
            change = self.codec.decode("state", encoded)
            if self.state.change_record(change["client_id"], change["command_id"]) is not None:
                continue  # a record written twice (e.g. by a paused worker after the partition moved)
            self.state.begin_command()  # nothing to undo here: keep the undo log from growing
            self.state.stage(change, encoded)
            applied += 1
        self.state.commit(next_offset, meta)
        self.state.discard()  # rebuild caches and the expiry heap from the store
        return applied
