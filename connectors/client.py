"""Producer client: build commands, route them to their partition, and await their results.

Every command is keyed by the routing key of the account it debits (or opens) and produced to the
partition Kafka's default partitioner would pick for that key (streams.routing), whatever the client
library's own default. The result of a command is awaited on the results topic, which holds it in the
same partition as the command.

A sender with many commands at once (an import, a gateway under load) wraps them in `with
client.batch():` and they travel as CommandBatch records, one per partition, instead of one record each:
the worker's cost per Kafka record is then paid once per batch (docs/engine.md, "Command batches").
"""
from __future__ import annotations

import logging
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Sequence

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from connectors.admin import BrokerUnreachable, TopicNotReady, require_broker
from connectors.answers import Answers
from schemas.codec import DecodeError, codec
from streams import placement, routing
from streams.authn import Signer
from streams.core.rejections import Rejection
from streams.core.returns import RETURNS_KEY
from streams.config import Settings
from streams.kafka_errors import NOT_KNOWN_YET, SETTLING, error_of, timeout_within
from streams.producing import produce
from streams.wire import command_record


log = logging.getLogger("ledger.client")

# Kafka's default record size limit is 1 MiB; a batch stays well below it whatever its commands hold.
BATCH_MAX_BYTES = 512 * 1024


class ClientValidationError(ValueError):
    """A command the client refuses to send (it could never be accepted): the message says why."""


def _require_id(value: str, name: str) -> None:
    if not isinstance(value, str) or not value:
        raise ClientValidationError(f"{name} must be a non-empty string")


@dataclass(frozen=True, slots=True)
class Leg:
    account_id: str
    amount_minor: int  # negative debits, positive credits
    hold_id: str | None = None
    currency: str | None = None

    def wire(self) -> dict[str, Any]:
        if type(self.amount_minor) is not int:
            raise ClientValidationError(f"amount of {self.account_id} must be an int of minor units, "
                                        f"got {type(self.amount_minor).__name__}")
        if self.amount_minor == 0:
            raise ClientValidationError(f"leg on {self.account_id} moves no money")
        return {"account_id": self.account_id, "amount": str(self.amount_minor), "hold_id": self.hold_id,
                "currency": self.currency}


class ResultsNotAuthorized(PermissionError):
    """The cluster does not let this client's principal read the results topic it would wait on: the shared
    one is for workers and auditors only on a secured cluster, and each client reads its own."""

    def __init__(self, topic: str):
        super().__init__(f"not authorized to read {topic}: a client reads its own results topic, made by "
                         f"`ledger acl apply` for its principal (docs/security.md)")
        self.topic = topic


class ResultTimeout(TimeoutError):
    """No result within the timeout. The command may still be applied: retry with the same command ids."""

    def __init__(self, missing: list[str]):
        super().__init__(f"no result yet for {len(missing)} command(s): {missing[:5]}")
        self.missing = missing


class CommandsNotDelivered(ConnectionError):
    """The cluster refused or never acknowledged the records of these commands (a record timestamp too far
    ahead, a record too large, the delivery timeout): they are not on the log and will get no result.
    Sending them again with the same ids is safe."""

    def __init__(self, failures: dict[str, str]):
        shown = "; ".join(f"{command_id}: {why}" for command_id, why in list(failures.items())[:5])
        super().__init__(f"{len(failures)} command(s) not delivered: {shown}")
        self.failures = failures


@dataclass
class LedgerClient:
    settings: Settings
    client_id: str = "client"
    # This client's key: every commands record it produces is signed with it (streams/authn.py). None: the
    # key of LEDGER_CLIENT_KEY / LEDGER_CLIENT_KEY_FILE if set, else records go unsigned (an open ledger).
    key: str | bytes | None = field(default=None, repr=False)
    _producer: Producer = field(init=False)
    _consumer: Consumer = field(init=False)
    _answers: Answers = field(init=False, default_factory=Answers)
    # Results topic records this client could not read (foreign bytes, an unknown writer schema): skipped.
    unreadable: int = field(init=False, default=0)
    # While batching: (key, encoded command) per partition not yet produced, and their total size.
    _pending: dict[int, list[tuple[bytes, bytes]]] | None = field(init=False, default=None)
    _pending_bytes: dict[int, int] = field(init=False, default_factory=dict)
    _batch_max: int = field(init=False, default=0)
    # Inside linked(): (command record, routing account) of each command sent, in order; sent at the end.
    _linking: list[tuple[dict[str, Any], str]] | None = field(init=False, default=None)
    # Commands whose records the cluster did not take, with why: raised by the next flush() or wait().
    _undelivered: dict[str, str] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self._codec = codec()
        self._signer = Signer.for_client(self.client_id, self.key)
        self._producer = Producer({**self.settings.kafka_config(), "enable.idempotence": True, "acks": "all",
                                   "linger.ms": 2, "on_delivery": self._delivered,
                                   "delivery.report.only.error": True})
        self._consumer = Consumer({**self.settings.kafka_config(), "group.id": f"client-{uuid.uuid4()}",
                                   "enable.auto.commit": False, "isolation.level": "read_committed"})
        # Fail fast: without a cluster that answers, give up within the connect timeout (BrokerUnreachable).
        require_broker(self.settings, self._consumer)
        topic = self.results_topic = self._results_topic()
        # Results of commands sent from now on: start every partition at its current end.
        deadline = time.monotonic() + self.settings.connect_timeout_s
        assignment = []
        for p in range(self.settings.partitions):
            assignment.append(TopicPartition(topic, p, self._end_offset(topic, p, deadline)))
        self._consumer.assign(assignment)

    def _results_topic(self) -> str:
        """This client's own results topic when it has one (`ledger acl apply` makes it, and only this
        client's principal may read it: docs/security.md), else the shared results topic."""
        own = self.settings.client_results_topic(self.client_id)
        topics = self._consumer.list_topics(timeout=self.settings.connect_timeout_s).topics
        topic = own if own in topics and topics[own].error is None else self.settings.topic("results")
        # A topic this principal may not describe is absent from the listing above, whatever it holds: ask.
        known = self._consumer.list_topics(topic, timeout=self.settings.connect_timeout_s).topics.get(topic)
        if known is not None and known.error is not None \
                and known.error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
            raise ResultsNotAuthorized(topic)
        return topic

    def _end_offset(self, topic: str, partition: int, deadline: float) -> int:
        """The partition's end offset, asked again until the deadline: a topic created a moment ago may be
        unknown to the broker asked, and a partition's leadership may be settling (after a broker fault)."""
        while True:
            try:
                timeout = timeout_within(deadline, self.settings.connect_timeout_s)
                return self._consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout)[1]
            except KafkaException as exc:
                code = exc.args[0].code()
                if code == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                    raise ResultsNotAuthorized(topic) from None
                if time.monotonic() > deadline:
                    raise self._not_served(topic, partition, exc) from None
                time.sleep(0.1)

    def _not_served(self, topic: str, partition: int, exc: KafkaException) -> ConnectionError:
        """What to say when a partition's offsets did not come within the connect timeout, by what is true."""
        error = error_of(exc)
        code = error.code() if error is not None else None
        if code in NOT_KNOWN_YET:
            return TopicNotReady(self.settings, topic, partition, "the topic is not known to the cluster yet "
                                 "(not created, or created a moment ago)", exc)
        if code in SETTLING:
            return TopicNotReady(self.settings, topic, partition, "its leadership is still settling", exc)
        try:  # no answer about the partition: does the cluster answer at all?
            self._consumer.list_topics(topic, timeout=1)
        except KafkaException:
            return BrokerUnreachable(self.settings, f"no offsets for {topic}[{partition}]: {exc}")
        return TopicNotReady(self.settings, topic, partition, "its leader did not answer", exc)

    # --- sending --------------------------------------------------------------------------------------------
    def send(self, command_id: str, body_name: str, body: dict[str, Any], routing_account: str) -> str:
        _require_id(command_id, "command_id")
        self._send_record(command_record(self.client_id, command_id, body_name, body), routing_account)
        return command_id

    def _send_record(self, record: dict[str, Any], routing_account: str, timestamp_ms: int | None = None) -> None:
        """A command where it must go: a transaction whose legs live in several partitions to its
        coordinator and a copy to each other partition it touches (placement.placements), so that every
        partition decides it in this client's order (P10). Inside linked(), kept for the linked batch."""
        if self._linking is not None:
            if timestamp_ms is not None:
                raise RuntimeError("dated commands are not linked")
            self._linking.append((record, routing_account))
            return
        record, partitions = placement.placements(record, routing_account, self.settings.partitions)
        encoded = self._codec.encode("command", record)
        for partition in partitions:
            self.send_raw(encoded, routing_account, partition, timestamp_ms)
        self._answers.sent(record["command_id"], encoded)

    def send_dated(self, record: dict[str, Any], routing_account: str, timestamp_ms: int) -> None:
        """A command record whose log time is timestamp_ms, not now (an import keeping original times: the
        record timestamp is the command's at_ms). Never batched: a batch has one timestamp."""
        if self._pending is not None:
            raise RuntimeError("dated commands are not batched")
        self._send_record(record, routing_account, timestamp_ms)

    def send_raw(self, value: bytes, routing_account: str, partition: int | None = None,
                 timestamp_ms: int | None = None) -> None:
        """Produce one encoded command (in order with everything this client sent) to the routing
        account's partition, or to `partition`; with timestamp_ms, as the record's timestamp."""
        if self._linking is not None:
            raise RuntimeError("a command for a chosen partition cannot join a linked batch")
        routing_key = routing.routing_key_for(routing.unsharded(routing_account))
        if partition is None:
            partition = routing.partition_for_key(routing_key, self.settings.partitions)
        key = routing_key.encode()
        if timestamp_ms is not None:
            self._produce(value, key, partition, timestamp_ms)
            self._producer.poll(0)
            return
        if self._pending is not None:
            if self._pending_bytes.get(partition, 0) + len(value) > BATCH_MAX_BYTES and self._pending.get(partition):
                self._send_batch(partition)  # this command would take the batch over the size limit
            self._pending.setdefault(partition, []).append((key, value))
            self._pending_bytes[partition] = self._pending_bytes.get(partition, 0) + len(value)
            if len(self._pending[partition]) >= self._batch_max:
                self._send_batch(partition)
            return
        self._produce(value, key, partition)
        self._producer.poll(0)

    def _produce(self, value: bytes, key: bytes, partition: int, timestamp_ms: int | None = None) -> None:
        topic = self.settings.topic("commands")
        headers = None if self._signer is None else self._signer.headers(topic, partition, value)
        dated = {} if timestamp_ms is None else {"timestamp": timestamp_ms}
        produce(self._producer, topic, value, key, partition=partition, headers=headers, **dated)

    @contextmanager
    def batch(self, max_commands: int = 500) -> Iterator["LedgerClient"]:
        """Commands sent inside the block share Kafka records: one CommandBatch per partition, produced when
        it holds max_commands (or BATCH_MAX_BYTES), at flush() and when the block ends (even by an
        exception: what was sent is sent). Each command is still decided on its own, in the order sent
        within its partition, and gets its own result."""
        self.start_batching(max_commands)
        try:
            yield self
        finally:
            self.stop_batching()

    def start_batching(self, max_commands: int = 500) -> None:
        """From now on commands wait in per-partition batches until send_pending() (see batch())."""
        if self._pending is not None:
            raise RuntimeError("already batching")
        if max_commands < 1:
            raise ClientValidationError("max_commands must be at least 1")
        self._pending, self._batch_max = {}, max_commands

    def stop_batching(self) -> None:
        """Send what waits and go back to one record per command."""
        self.send_pending()
        self._pending = None

    def send_pending(self) -> None:
        """Produce every partially filled batch now (inside client.batch(); a no-op outside)."""
        for partition in list(self._pending or ()):
            self._send_batch(partition)

    def _send_batch(self, partition: int) -> None:
        items = self._pending[partition]
        # A lone command needs no envelope.
        value = items[0][1] if len(items) == 1 else \
            self._codec.encode("command_batch", {"commands": [v for _, v in items]})
        self._produce(value, items[0][0], partition)
        # Forgotten only once produced: if produce raises, the commands still wait (and are sent on retry).
        del self._pending[partition]
        self._pending_bytes.pop(partition, None)
        self._producer.poll(0)

    @contextmanager
    def linked(self) -> Iterator["LedgerClient"]:
        """Commands sent inside the block take effect all together or not at all (streams/linking.py): they
        travel as one linked CommandBatch to the partition of the first, which decides them in order. One
        refused: none takes effect, it keeps its reason and every other is refused linked_failed naming it.
        Transactions may touch other partitions: the batch is then one unit of the two-phase protocol
        (streams/spanning_linked.py), written to its coordinator and as a copy to each other partition they
        touch, so each reserves at this client's position (P10); any other command must live in that
        partition (else every command is refused linked_spans_partitions). Sent when the block ends; an
        exception sends nothing. Each command gets its own result, as usual (wait())."""
        if self._linking is not None:
            raise RuntimeError("already linking")
        self._linking = []
        try:
            yield self
            items = self._linking
        finally:
            self._linking = None
        if items:
            self._send_linked(items)

    def _send_linked(self, items: list[tuple[dict[str, Any], str]]) -> None:
        encoded = [self._codec.encode("command", record) for record, _ in items]
        # Written to its coordinator and, as a copy naming it, to every other partition its transactions touch,
        # so each reserves its share at this client's position there (placement.linked_placements).
        coordinator, partitions = placement.linked_placements([record for record, _ in items], items[0][1],
                                                              self.settings.partitions)
        value = self._codec.encode("command_batch", {"commands": encoded, "linked": True,
                                                     "coordinator": coordinator if len(partitions) > 1 else None})
        if len(value) > BATCH_MAX_BYTES:
            raise ClientValidationError(f"a linked batch of {len(value)} bytes; the limit is {BATCH_MAX_BYTES}")
        routing_key = routing.routing_key_for(routing.unsharded(items[0][1]))
        self.send_pending()  # what this client sent before goes first (P10)
        for partition in partitions:
            self._produce(value, routing_key.encode(), partition)
        self._producer.poll(0)
        for (record, _), item in zip(items, encoded):
            self._answers.sent(record["command_id"], item)

    def submit(self, plan) -> list[str]:
        """Send every command of a business-event rule's plan (connectors.rules); returns their ids. A
        signing client sends them as its own: the plan must be built for its client id (rules.Context)."""
        if self._signer is not None:
            foreign = {record["client_id"] for _, record in plan} - {self.client_id}
            if foreign:
                raise ClientValidationError(f"a plan for client ids {sorted(foreign)} cannot be signed by "
                                            f"{self.client_id!r}: build it with Context(client_id={self.client_id!r})")
        for routing_account, record in plan:
            self._send_record(record, routing_account)
        return list(plan.command_ids)

    def poll(self) -> None:
        """Serve delivery reports (frees room in the producer's queue) without waiting."""
        self._producer.poll(0)

    def flush(self) -> None:
        """Send everything sent so far (including batches being filled) and wait for the broker's acks.
        Raises CommandsNotDelivered for the commands whose records the cluster did not take."""
        self.send_pending()
        self._producer.flush(30)
        if self._undelivered:
            failures, self._undelivered = self._undelivered, {}
            raise CommandsNotDelivered(failures)

    def _delivered(self, err, msg) -> None:
        """librdkafka's report of a record it could not deliver (only errors are reported): name its commands."""
        if err is None:
            return
        value = msg.value() or b""
        try:
            ids = [self._codec.decode("command", value)["command_id"]]
        except DecodeError:
            try:
                ids = [self._codec.decode("command", item)["command_id"]
                       for item in self._codec.decode("command_batch", value)["commands"]]
            except DecodeError:
                ids = [f"<record for partition {msg.partition()}>"]
        for command_id in ids:
            self._undelivered[command_id] = err.str()

    def open_account(self, account_id: str, currency: str, *, command_id: str | None = None,
                     allow_negative: bool = False, overdraft_limit: int = 0, max_balance: int | None = None,
                     account_type: str | None = None) -> str:
        """account_type: asset, liability, equity, revenue or expense (None: by its name; a customer account
        is a liability). The ledger refuses another word (invalid_command)."""
        body = {"account_id": account_id, "currency": currency, "allow_negative": allow_negative,
                "overdraft_limit": str(overdraft_limit),
                "max_balance": None if max_balance is None else str(max_balance), "routing_key": None,
                "account_type": account_type}
        return self.send(command_id or f"open:{account_id}", "OpenAccount", body, account_id)

    def post(self, transaction_id: str, legs: Iterable[Leg], *, kind: str = "transfer",
             reference: str | None = None, links: Iterable[str] = (), metadata: dict[str, str] | None = None,
             occurred_at_ms: int | None = None, command_id: str | None = None) -> str:
        legs = list(legs)
        if len(legs) < 2:
            raise ClientValidationError("a transaction needs at least two legs")
        body = {"transaction_id": transaction_id, "legs": [leg.wire() for leg in legs], "kind": kind,
                "reference": reference, "links": list(links), "metadata": dict(metadata or {}),
                "occurred_at_ms": occurred_at_ms, "rate_snapshot_id": None}
        debtor = next((l.account_id for l in legs if l.amount_minor < 0 and not routing.is_system(l.account_id)),
                      next((l.account_id for l in legs if not routing.is_system(l.account_id)), legs[0].account_id))
        return self.send(command_id or transaction_id, "PostTransaction", body, debtor)

    def place_hold(self, hold_id: str, account_id: str, amount_minor: int, *, expires_at_ms: int | None = None,
                   command_id: str | None = None) -> str:
        if type(amount_minor) is not int or amount_minor <= 0:
            raise ClientValidationError(f"a hold amount must be a positive int of minor units, got {amount_minor!r}")
        body = {"hold_id": hold_id, "account_id": account_id, "amount": str(amount_minor),
                "expires_at_ms": expires_at_ms}
        return self.send(command_id or f"hold:{hold_id}", "PlaceHold", body, account_id)

    def release_hold(self, hold_id: str, account_id: str, *, command_id: str | None = None) -> str:
        return self.send(command_id or f"release:{hold_id}", "ReleaseHold", {"hold_id": hold_id}, account_id)

    def reverse(self, transaction_id: str, reverses: str, account_id: str, *, reference: str | None = None,
                occurred_at_ms: int | None = None, command_id: str | None = None) -> str:
        """Undo transaction `reverses` (posted by this client) with a new transaction `transaction_id` that
        mirrors its legs. account_id: the account the original was routed by (its debited customer account,
        or the credited one of a deposit), so the reversal is decided where the original was."""
        _require_id(reverses, "reverses")
        _require_id(account_id, "account_id")
        body = {"transaction_id": transaction_id, "reverses": reverses, "account_id": account_id,
                "reference": reference, "occurred_at_ms": occurred_at_ms}
        return self.send(command_id or transaction_id, "ReverseTransaction", body, account_id)

    def return_payment(self, transaction_id: str, returns: str, payee: str, payer: str, amount_minor: int, *,
                       kind: str = "return", reference: str | None = None, command_id: str | None = None,
                       steps: Sequence[str] = ()) -> str:
        """Return (kind "return", a bank's returned deposit) or charge back (kind "chargeback") amount_minor of
        the payment `returns`, from its payee back to its payer, linked to it. Decided where the payment was
        (routed by its customer account; a payment between customers of two partitions is returned through
        both, each judging its share of it); refused unknown_transaction, client_mismatch, already_reversed,
        not_returnable or exceeds_unreturned (more than what remains unreturned). What the payee has spent
        is taken from its receivable (streams/core/returns.py, docs/wallet-operations.md). steps: the other
        transactions of a payment made in steps (a deposit initiated and fronted, `returns` naming its
        settlement), linked too: the ledger judges the return against what they pay together."""
        if type(amount_minor) is not int or amount_minor <= 0:
            raise ClientValidationError(f"a return amount must be a positive int of minor units, got {amount_minor!r}")
        _require_id(returns, "returns")
        if isinstance(steps, str):
            raise ClientValidationError("steps must be a list of transaction ids, not one string")
        for step in steps:
            _require_id(step, "steps")
        return self.post(transaction_id, [Leg(payee, -amount_minor), Leg(payer, amount_minor)], kind=kind,
                         reference=reference, links=[returns, *steps], metadata={RETURNS_KEY: returns},
                         command_id=command_id)

    def register_currency(self, code: str, scale: int, *, command_id: str | None = None) -> list[str]:
        """Register a currency in every partition: one RegisterCurrency per partition, ids `<id>@<partition>`
        (default id `currency:<code>`), each decided by its partition's single writer. Returns their ids: the
        currency is usable in a partition once its copy is accepted (or answered currency_exists)."""
        if type(scale) is not int:
            raise ClientValidationError(f"a scale is an int, got {scale!r}")
        _require_id(code, "code")
        return self._to_every_partition(command_id or f"currency:{code}", "RegisterCurrency",
                                        {"currency": code, "scale": scale})

    def record_rate(self, snapshot_id: str, base: str, quote: str, rate: str, expires_at_ms: int, *,
                    command_id: str | None = None) -> list[str]:
        """Record an FX rate snapshot in every partition (what a rates producer does): one RecordRate per
        partition, ids `<id>@<partition>` (default id `rate:<snapshot_id>`). rate: units of quote per unit of
        base as an exact decimal string; from expires_at_ms (log time) on, a transaction naming it is
        stale_rate, and one naming a snapshot its partition never recorded is unknown_rate."""
        _require_id(snapshot_id, "snapshot_id")
        if not isinstance(rate, str):
            raise ClientValidationError(f"a rate is an exact decimal string, got {type(rate).__name__}")
        return self._to_every_partition(command_id or f"rate:{snapshot_id}", "RecordRate", {
            "snapshot_id": snapshot_id, "base": base, "quote": quote, "rate": rate, "expires_at_ms": expires_at_ms})

    def _to_every_partition(self, base_id: str, name: str, body: dict[str, Any]) -> list[str]:
        """One copy of a command in each partition, each under its own id, decided by that partition."""
        ids = []
        for partition in range(self.settings.partitions):
            record = command_record(self.client_id, f"{base_id}@{partition}", name, body)
            encoded = self._codec.encode("command", record)
            self.send_raw(encoded, base_id, partition)
            self._answers.sent(record["command_id"], encoded)
            ids.append(record["command_id"])
        return ids

    def account_command(self, name: str, account_id: str, *, command_id: str | None = None) -> str:
        """FreezeAccount, UnfreezeAccount or CloseAccount."""
        return self.send(command_id or f"{name}:{account_id}", name, {"account_id": account_id}, account_id)

    # --- results --------------------------------------------------------------------------------------------
    def wait(self, command_ids: Iterable[str], timeout_s: float = 30.0) -> dict[str, dict]:
        """The answer to the latest send of each of these commands (connectors/answers.py): the decision
        for the payload first sent under the id, `id_conflict` for a send that reused it with another."""
        self.flush()
        wanted = list(dict.fromkeys(command_ids))
        deadline = time.monotonic() + timeout_s
        while True:
            answers = {c: self._answers.answer(c) for c in wanted}
            missing = [c for c, a in answers.items() if a is None]
            if not missing:
                return answers
            if time.monotonic() > deadline:
                raise ResultTimeout(missing)
            for result in self.read_results(timeout_s=0.02):
                self._answers.received(result)

    def read_results(self, timeout_s: float) -> list[dict]:
        """This client's results published since the last call (waiting up to timeout_s for some). Records
        it cannot read are skipped, counted in `unreadable` and logged, never raised: one foreign record on
        the results topic must not stop a client."""
        mine = []
        for msg in self._consumer.consume(1000, timeout=timeout_s):
            if msg.error():
                if msg.error().code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                    raise ResultsNotAuthorized(msg.topic())
                continue
            try:
                result = self._codec.decode("result", msg.value())
            except DecodeError as exc:
                self.unreadable += 1
                log.warning("skipping an unreadable record on %s[%d] at offset %d: %s",
                            msg.topic(), msg.partition(), msg.offset(), exc)
                continue
            if result["client_id"] != self.client_id:
                continue
            if result["reason"] == Rejection.NOT_AUTHENTICATED.code and self._signer is not None:
                self._not_mine(result)
                continue
            mine.append(result)
        return mine

    def _not_mine(self, result: dict) -> None:
        """A signing client's records are authentic: a not_authenticated answer under its id answers a record
        someone else wrote as this client (or this client's key is wrong). Taking it as the answer to a send
        could make the caller give up a command that was, or will be, accepted, and send it again under a new
        id; so it is logged and never answers (a wrong key shows as ResultTimeout and these warnings)."""
        log.warning("a record written as client %r was not authenticated (%s): a wrong key, or another "
                    "writer using this client id; not taken as the answer to %r",
                    self.client_id, result["detail"][:120], result["command_id"][:120])

    def result(self, command_id: str, timeout_s: float = 30.0) -> dict:
        return self.wait([command_id], timeout_s)[command_id]

    def close(self) -> None:
        self.flush()
        self._consumer.close()
