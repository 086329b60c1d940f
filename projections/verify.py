"""The oracles of DESIGN.md §2, checked over the topics at a quiescent point (`ledger verify`).

Every check reads only what the ledger published (commands, results, history, balances, dead letters),
never the workers' state, so it can judge any run: a test, a fault-injection soak or production.
Re-emitted records (a command redone after a crash) are recognised by their ids and must be byte-identical.

`verify(settings)` reads the topics; `check(streams)` judges what was read and needs no broker. Each oracle is
one function below (`check_*`), fed by a few pure derivations (`_sent`, `_decisions`, `_distinct`) and the
read side's one fold of history and of hold states (`projections.fold`);
every violation names the account, transaction, hold or command concerned. `verify` also names every partition
where a transaction stays open (`open_transaction`): what was committed after it is hidden from every
read_committed reader, this check's own included (projections/ends.py). A record verify cannot read (bytes
that do not decode, or an amount that is not an integer) is skipped, counted as `unreadable.<topic>` and listed
in the report's notes: it is not itself a broken promise, but whatever it hid shows up in the oracles (a lost
result leaves its command unanswered, a lost history entry leaves a gap).
"""
from __future__ import annotations

from collections import Counter, defaultdict
import sys
import time
import uuid
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Callable, Iterable, Sequence, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from projections.ends import describe, open_transactions
from projections.fold import Balance, fold_holds, fold_journal, journals as journals_of, remaining, walk
from projections.topics import SCHEMA_OF_TOPIC, TopicRecord, latest_per_account, read_topic
from schemas.codec import DecodeError, codec
from streams import names, routing, seal
from streams.config import Settings
from streams.core.rejections import NOT_A_DECISION, Rejection
from streams.core.settlement import RECEIVABLE_MARK
from streams.kafka_errors import SETTLE_WAIT_S, asking_again, error_of, passing, timeout_within
from streams.limits import echo_ids

ENGINE_CLIENT = routing.ENGINE_CLIENT  # the client id of engine steps (follow-ups between partitions)
MAX_MESSAGES = 200  # violations (and notes) kept in a report; the counts go on
OPEN_SETTLE_S = 5.0  # a worker's transaction lasts well under a second

CommandKey = tuple[str, str]  # (client_id, command_id)
T = TypeVar("T")


@dataclass
class Report:
    counts: Counter = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    sums: dict[str, int] = field(default_factory=dict)  # currency -> sum of posted over all accounts
    notes: list[str] = field(default_factory=list)  # records skipped as unreadable (not violations)

    @property
    def ok(self) -> bool:
        return not self.violations

    def fail(self, oracle: str, message: str) -> None:
        self.counts[f"violations.{oracle}"] += 1
        if len(self.violations) < MAX_MESSAGES:
            self.violations.append(f"{oracle}: {message}")

    def note(self, message: str) -> None:
        if len(self.notes) < MAX_MESSAGES:
            self.notes.append(message)


@dataclass(frozen=True)
class Streams:
    """Everything verify judges: each topic's records up to a quiescent end, in order within a partition.
    Commands as `read_topic` yields them (one per item of a CommandBatch, value None when undecodable)."""
    commands: Sequence[TopicRecord] = ()
    results: Sequence[TopicRecord] = ()
    history: Sequence[TopicRecord] = ()
    balances: Sequence[TopicRecord] = ()
    dead_letters: Sequence[TopicRecord] = ()


def _with_records(settings: Settings, topic: str, starts: dict[int, int], until: float) -> set[int]:
    """The partitions in which a read_committed reader finds a record at or after the given offset (by the
    monotonic time until, partitions not read to their end count as with records)."""
    if not starts:
        return set()
    consumer = Consumer(settings.bounded_reader_config(f"quiescent-{uuid.uuid4()}"))
    found: set[int] = set()
    open_ = set(starts)
    try:
        # The partitions' leaders first: assigned a partition whose leader it does not know yet, librdkafka
        # starts fetching only after a metadata round, up to a second later.
        consumer.list_topics(topic, timeout=timeout_within(until, 10))
        consumer.assign([TopicPartition(topic, p, offset) for p, offset in starts.items()])
        deadline = min(time.monotonic() + 30, until)
        while open_ and time.monotonic() < deadline:
            # consume() waits for the whole count or the timeout: a short one, as the last call waits all of it.
            for msg in consumer.consume(100, timeout=0.02):
                p = msg.partition()
                if msg.error() is None:
                    found.add(p)
                    open_.discard(p)
                elif msg.error().code() == KafkaError._PARTITION_EOF:
                    open_.discard(p)
        return found | open_
    finally:
        consumer.close()


def _covered(settings: Settings, until: float) -> dict[int, int]:
    """Per partition, the commands offset the engine's committed changelog covers (its last covered mark, see
    streams/engine.py): every record below it is decided and published, whatever offset Faust has committed
    for the group (Faust may lag behind, e.g. where transaction markers leave gaps in the offsets). Read by
    the monotonic time until (a partition not read by then is left out)."""
    topic = settings.topic("changelog")
    consumer = Consumer(settings.bounded_reader_config(f"quiescent-{uuid.uuid4()}"))
    covered: dict[int, int] = {}
    try:
        for partition in range(settings.partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition),
                                                       timeout=timeout_within(until, 10))
            window = 64
            while high > low and partition not in covered:
                start = max(low, high - window)
                consumer.assign([TopicPartition(topic, partition, start)])
                done = False
                deadline = min(time.monotonic() + 30, until)
                while not done and time.monotonic() < deadline:
                    for msg in consumer.consume(1000, timeout=0.02):  # (short: as in _with_records)
                        if msg.error():
                            done = done or msg.error().code() == KafkaError._PARTITION_EOF
                        elif msg.key() == b"m/covered":
                            covered[partition] = int(msg.value())
                if start == low:
                    break
                window *= 8
    finally:
        consumer.close()
    return covered


@dataclass(frozen=True)
class Look:
    """One look at the commands topic: its end offsets, then how far the workers have decided it (per
    partition: the group's committed offset or the changelog's covered mark, a partition left with only
    transaction markers counted as decided), then its end offsets again."""
    ends: Sequence[int]
    decided: Sequence[int]
    ends_after: Sequence[int]

    @property
    def quiet(self) -> bool:
        """Every command decided at one instant: nothing was appended while the look was taken, and what was
        there had all been decided. Transactions commit a batch's outputs and follow-ups with its offsets, so
        nothing of it is still to come. Records appended after the look (a worker's tick, streams/ticks.py,
        every LEDGER_TICK_S while a hold is due) do not undo it: the ledger writes its own commands, so
        "nothing appended for a while" may never hold."""
        return list(self.ends) == list(self.decided) == list(self.ends_after)


def wait_for_quiet(look: Callable[[], Look | None], deadline: float, settle_s: float,
                   on_state: Callable[[int, int], None] | None = None) -> Look | None:
    """Take looks settle_s apart until one is quiet (returned) or the monotonic deadline passes (None). A
    look of None (Kafka could not answer it for now) is looked again."""
    while time.monotonic() < deadline:
        seen = look()
        if seen is not None and on_state is not None:
            on_state(sum(seen.decided), sum(seen.ends_after))
        if seen is not None and seen.quiet:
            return seen
        time.sleep(min(settle_s, max(0.0, deadline - time.monotonic())))
    return None


def quiet_look(settings: Settings, timeout_s: float = 120.0, settle_s: float = 1.5,
               on_state: Callable[[int, int], None] | None = None) -> Look | None:
    """Wait until the workers have decided every command, follow-ups included, at one instant (Look.quiet);
    that look, or None at timeout_s.

    on_state(decided, end): the commands offsets decided so far and the end, summed over partitions, at
    each look (for a progress bar).

    An error that passes (streams/kafka_errors.py: a partition's leader or the group's coordinator moving after
    a broker fault, a broker not answering for now) makes it look again; at timeout_s it returns None and
    says on stderr what it saw last, that error included. Any other Kafka error is raised.
    """
    group = f"{settings.prefix}workers"
    consumer = Consumer({**settings.kafka_config(), "group.id": group, "enable.auto.commit": False})
    topic = settings.topic("commands")
    partitions = [TopicPartition(topic, p) for p in range(settings.partitions)]
    deadline = time.monotonic() + timeout_s
    last: Look | None = None
    last_error: str | None = None  # the latest error that passed, for the verdict

    def ends() -> list[int]:
        return [consumer.get_watermark_offsets(tp, timeout=timeout_within(deadline, 10))[1] for tp in partitions]

    def look() -> Look | None:
        nonlocal last, last_error
        try:
            before = ends()
            covered = _covered(settings, deadline)
            committed, last_error = [], None
            for tp in consumer.committed(partitions, timeout=timeout_within(deadline, 10)):
                if tp.error is not None:  # this partition's offset unknown for now: not caught up
                    last_error = f"{tp.error.str()} (committed offset of partition {tp.partition})"
                committed.append(max(tp.offset, 0, covered.get(tp.partition, 0)))
            # Below the end but with nothing to read there: only transaction markers (or aborted records)
            # are left, which take offsets and are no commands.
            lagging = {p: c for p, (c, end) in enumerate(zip(committed, before)) if c < end}
            busy = _with_records(settings, topic, lagging, deadline)
            decided = [end if p in lagging and p not in busy else c
                       for p, (c, end) in enumerate(zip(committed, before))]
            last = Look(before, decided, ends())
        except KafkaException as exc:
            error = error_of(exc)
            if error is None or not passing(error):
                raise
            # Leadership or the group coordinator still moving (after a broker fault): look again.
            last_error = error.str()
            return None
        return last

    try:
        quiet = wait_for_quiet(look, deadline, settle_s, on_state)
        if quiet is None:
            seen = "no look answered" if last is None else \
                f"commands ends {list(last.ends_after)}, decided up to {list(last.decided)}"
            print(f"not quiescent within {timeout_s:g} s: {seen}"
                  + (f"; last Kafka error: {last_error}" if last_error else ""), file=sys.stderr)
        return quiet
    finally:
        consumer.close()


def wait_quiescent(settings: Settings, timeout_s: float = 120.0, settle_s: float = 1.5,
                   on_state: Callable[[int, int], None] | None = None) -> bool:
    """Whether the workers decided every command at one instant within timeout_s (quiet_look)."""
    return quiet_look(settings, timeout_s, settle_s, on_state) is not None


def commands_ends(settings: Settings, settle_s: float = SETTLE_WAIT_S) -> list[int]:
    """The commands topic's end offsets now (asking again through leadership moving for up to settle_s)."""
    consumer = Consumer(settings.bounded_reader_config(f"quiescent-{uuid.uuid4()}"))
    deadline = time.monotonic() + settle_s
    try:
        return [asking_again(lambda: consumer.get_watermark_offsets(
                    TopicPartition(settings.topic("commands"), p), timeout=timeout_within(deadline, 10))[1], deadline)
                for p in range(settings.partitions)]
    finally:
        consumer.close()


def at_a_quiet_point(settings: Settings, read: Callable[[], T], timeout_s: float = 120.0, settle_s: float = 1.5,
                     on_state: Callable[[int, int], None] | None = None) -> tuple[bool, T]:
    """read() the topics as they stood at a quiet look (quiet_look), and whether it was one; see read_still."""
    deadline = time.monotonic() + timeout_s
    return read_still(lambda: quiet_look(settings, max(0.0, deadline - time.monotonic()), settle_s, on_state),
                      lambda: commands_ends(settings), read, deadline)


def read_still(quiet: Callable[[], Look | None], ends_now: Callable[[], list[int]], read: Callable[[], T],
               deadline: float) -> tuple[bool, T]:
    """read() after a quiet look, again until the commands topic did not move while it read; (True, that read),
    or (False, the last read) when none held still by the monotonic deadline.

    The ledger writes commands of its own (a tick while a hold is due), so more may be appended and decided
    after the look while read() runs, and one topic could then be read with their effects and another
    without. Nothing is decided that was not appended: commands ends equal to the look's after read() mean
    the read saw the topics as they stood at the look."""
    while True:
        look = quiet()
        result = read()
        if look is not None and list(ends_now()) == list(look.ends_after):
            return True, result
        if time.monotonic() >= deadline:
            return False, result


def read_streams(settings: Settings, counted: Callable[[str, Iterable], Iterable] | None = None) -> Streams:
    """Every topic verify judges; counted(topic, records) wraps each topic's reading (a progress bar)."""
    def read(name: str) -> list[TopicRecord]:
        records = read_topic(settings, name)
        return list(counted(f"reading {name}", records) if counted else records)

    return Streams(commands=read("commands"), results=read("results"), history=read("history"),
                   balances=read("balances"), dead_letters=read("dlq"))


def verify(settings: Settings, counted: Callable[[str, Iterable], Iterable] | None = None,
           settle_s: float = OPEN_SETTLE_S) -> Report:
    """Read the ledger's topics and check every oracle over them; then that no transaction stays open in them
    (projections/ends.py), which would hide from every read_committed reader what was committed after it
    (settle_s: how long an open transaction's last stable offset must stay put to count)."""
    report = check(read_streams(settings, counted))
    for end in open_transactions(settings, settle_s):
        report.fail("open_transaction", describe(end, settle_s))
    return report


def check(streams: Streams) -> Report:
    """Every oracle over records already read (pure: no broker)."""
    report = Report()
    report.counts.update(commands=len(streams.commands), results=len(streams.results), history=len(streams.history),
                         balances=len(streams.balances), dead_letters=len(streams.dead_letters))
    results = _readable(report, "results", streams.results)
    history = _readable(report, "history", streams.history)
    balances = _readable(report, "balances", streams.balances)
    _readable(report, "dlq", streams.dead_letters)  # counted only: a dead letter answers by its key

    sent = _sent(report, streams.commands)
    decisions = _decisions(results)
    accepted = {key for key, raws in decisions.items() if len(raws) == 1 and next(iter(raws.values())) == "accepted"}
    entries = _distinct(history)
    report.counts["history.distinct"] = len(entries)
    journals = journals_of(e.value for e in entries.values())
    fold = {account: fold_journal(items) for account, items in journals.items()}

    check_every_command_answered(report, streams.commands, decisions, results, streams.dead_letters)  # P8
    check_one_decision_per_command(report, decisions)  # P4
    check_reemissions_identical(report, history)  # P4
    check_accepted_changed_books_once(report, sent, accepted, entries, results)  # P4
    check_seq_and_posted_after(report, journals)  # P3
    check_no_overdraft(report, journals, _floors(sent, accepted))  # P2
    check_balances_are_the_fold(report, balances, fold)  # fold
    check_double_entry(report, entries, fold)  # P1
    check_clearing_empty(report, fold)  # P6
    check_holds_settle_once(report, results, fold)  # P5
    return report


# Reading what can be read ------------------------------------------------------------------------------------

# Fields parsed as integers, per topic: a record whose money does not parse is unreadable, not a crash.
_INTEGER_FIELDS = {"history": ("amount", "posted_after", "held_after"), "balances": ("posted", "held"),
                   "results": (), "dlq": ()}
_HOLD_INTEGER_FIELDS = ("amount", "captured", "released")


def _readable(report: Report, topic: str, records: Iterable[TopicRecord]) -> list[TopicRecord]:
    """The records of a topic verify can read; the others are counted and noted by place and key."""
    readable = []
    for record in records:
        why = _unreadable(topic, record)
        if why is None:
            readable.append(record)
            continue
        report.counts[f"unreadable.{topic}"] += 1
        report.note(f"unreadable {topic} record at {record.partition}/{record.offset} (key {_key(record)}): {why}")
    return readable


def _unreadable(topic: str, record: TopicRecord) -> str | None:
    value = record.value
    if value is None:
        try:
            codec().decode(SCHEMA_OF_TOPIC[topic], record.raw)
        except DecodeError as exc:
            return str(exc)
        return "not decoded"
    names = list(_INTEGER_FIELDS[topic])
    numbers = [(name, value[name]) for name in names]
    if topic == "results":
        numbers += [(f"hold {h['hold_id']} {name}", h[name]) for h in value["holds"] for name in _HOLD_INTEGER_FIELDS]
    for name, text in numbers:
        try:
            int(text)
        except ValueError:
            return f"{name} {text!r} is not an integer"
    return None


def _key(record: TopicRecord) -> str:
    if record.key is None:
        return "none"
    return record.key.decode(errors="backslashreplace")


def _body(record: TopicRecord) -> tuple[str, dict]:
    name, body = record.value["body"]
    return name.rsplit(".", 1)[-1], body


def _where(record: TopicRecord) -> str:
    """A command's place in the log, as its dead letter is keyed: partition/offset[/index in its batch]."""
    return f"{record.partition}/{record.offset}" + ("" if record.index is None else f"/{record.index}")


# Derivations (no judgement) ----------------------------------------------------------------------------------

def _sent(report: Report, commands: Iterable[TopicRecord]) -> dict[CommandKey, list[TopicRecord]]:
    """Decodable commands by (client_id, command_id), every delivery of an id in log order."""
    sent: dict[CommandKey, list[TopicRecord]] = defaultdict(list)
    for cmd in commands:
        if cmd.value is None:
            report.counts["commands.undecodable"] += 1
            continue
        key = (cmd.value["client_id"], cmd.value["command_id"])
        if key[0] != ENGINE_CLIENT:
            report.counts["commands.from_clients"] += 1  # records: placed copies and retries count each
            report.counts["commands.distinct_from_clients"] += key not in sent
        sent[key].append(cmd)
    return sent


def _decisions(results: Iterable[TopicRecord]) -> dict[CommandKey, dict[bytes, str]]:
    """The decisions published per command id (result bytes -> outcome); retries and id conflicts aside."""
    decisions: dict[CommandKey, dict[bytes, str]] = defaultdict(dict)
    for r in results:
        v = r.value
        if not v["duplicate"] and v["reason"] not in NOT_A_DECISION \
                and not seal.is_unsealed_refusal(v["reason"], v["detail"]):
            decisions[(v["client_id"], v["command_id"])][r.raw] = v["outcome"]
    return decisions


def _distinct(history: Iterable[TopicRecord]) -> dict[str, TopicRecord]:
    """History deduplicated by entry id (the first publication of each)."""
    entries: dict[str, TopicRecord] = {}
    for h in history:
        entries.setdefault(h.value["entry_id"], h)
    return entries


def _floors(sent: dict[CommandKey, list[TopicRecord]], accepted: set[CommandKey]) -> dict[str, int]:
    """Floor of available per account opened (accepted) with allow_negative false; system shards have none."""
    floors = {}
    for key, cmds in sent.items():
        if key not in accepted:
            continue
        kind, body = _body(cmds[0])
        if kind == "OpenAccount" and not body["allow_negative"]:
            try:
                floors.setdefault(body["account_id"], -int(body["overdraft_limit"]))
            except ValueError:
                pass  # an accepted open has an integer limit; the other oracles judge a forged one
    return floors


# The oracles ---------------------------------------------------------------------------------------------------

def check_every_command_answered(report: Report, commands: Iterable[TopicRecord],
                                 decisions: dict[CommandKey, dict[bytes, str]], results: Iterable[TopicRecord],
                                 dead_letters: Iterable[TopicRecord]) -> None:
    """P8: each command has a result deciding its id (a retry's duplicate or an id_conflict answers a later
    delivery, never the first), or a dead letter keyed by its place in the log (partition/offset, plus /index for
    an item of a CommandBatch). A linked batch's copy is not a command sent: the producer placed it so the
    partition reserves in order, and the coordinator's record carries the commands (written as a copy only,
    they were never sent whole, and nothing answers them: docs/wallet-operations.md)."""
    dead_at = {d.key for d in dead_letters}
    replied: set[CommandKey] = set()
    # answered, never decided: a record its client did not sign, an engine step without the engine's seal, a
    # linked batch that cannot be linked (its commands may be decided later, sent otherwise)
    unauthenticated: set[CommandKey] = set()
    for r in results:
        replied.add((r.value["client_id"], r.value["command_id"]))
        if r.value["reason"] in (Rejection.NOT_AUTHENTICATED.code, Rejection.LINKED_SPANS_PARTITIONS.code) or \
                seal.is_unsealed_refusal(r.value["reason"], r.value["detail"]):
            unauthenticated.add((r.value["client_id"], r.value["command_id"]))
    judged: set[CommandKey] = set()
    for cmd in commands:
        if cmd.copy:
            continue
        if cmd.value is None:
            if _where(cmd).encode() not in dead_at:
                report.fail("P8", f"undecodable command at {_where(cmd)} has no dead letter")
            continue
        # A command whose ids are too long to echo is answered under shortened ids (streams/limits.py).
        key = echo_ids(cmd.value["client_id"], cmd.value["command_id"])
        if key in judged or decisions.get(key) or key in unauthenticated:
            continue
        judged.add(key)  # once per command id, however often it was sent
        if key in replied:
            report.fail("P8", f"command {key} at {_where(cmd)} was answered only as a retry or a conflict, "
                              "never decided")
        else:
            report.fail("P8", f"command {key} at {_where(cmd)} has no result")


def check_one_decision_per_command(report: Report, decisions: dict[CommandKey, dict[bytes, str]]) -> None:
    """P4: one decision per command id; a re-emitted result is byte-identical to the first."""
    for key, raws in decisions.items():
        if len(raws) > 1:
            outcomes = sorted(set(raws.values()))
            report.fail("P4", f"command {key} got {len(raws)} different decisions ({', '.join(outcomes)})")


def check_reemissions_identical(report: Report, history: Iterable[TopicRecord]) -> None:
    """P4: a history entry published again (a command redone after a crash) is byte-identical."""
    first: dict[str, bytes] = {}
    for h in history:
        entry_id = h.value["entry_id"]
        seen = first.setdefault(entry_id, h.raw)
        if seen != h.raw:
            report.fail("P4", f"history entry {entry_id} (command {h.value['command_id']} of {h.value['client_id']}) "
                              "published with two different contents")


def _shares(legs: list[dict]) -> int:
    """The entries a multi-partition transaction's commits post outside clearing (streams/spanning.py)."""
    return len({(leg["account_id"], leg["hold_id"] or "", leg["amount"].startswith("-")) if
                not routing.is_system(leg["account_id"]) else (leg["account_id"], str(i), True)
                for i, leg in enumerate(legs)})


def _fewest_shares(legs: list[dict]) -> int:
    """The fewest entries a transaction's commits across partitions post outside clearing: as _shares, but an
    account's plain legs (no hold) net to one entry, or to none when they net to nothing (streams/spanning.py:
    an account's legs net within its share; before, they posted as _shares counts)."""
    net: dict[str, Decimal] = defaultdict(Decimal)
    others = set()
    for i, leg in enumerate(legs):
        if routing.is_system(leg["account_id"]):
            others.add((leg["account_id"], str(i)))
        elif leg["hold_id"]:
            others.add((leg["account_id"], leg["hold_id"]))
        else:
            net[leg["account_id"]] += Decimal(leg["amount"])
    return len(others) + sum(1 for amount in net.values() if amount)


def check_accepted_changed_books_once(report: Report, sent: dict[CommandKey, list[TopicRecord]],
                                      accepted: set[CommandKey], entries: dict[str, TopicRecord],
                                      results: Iterable[TopicRecord]) -> None:
    """P4: an accepted client command changed the books exactly once: one history entry per leg of a
    transaction, one for any other change. A transaction whose legs live in several partitions posts each
    partition's share under an engine id (its decide step ``<client>/<command>~decide~<p>``; ``~commit~<p>``
    in older logs): one entry per reserved debit (plain debits of an account together, captures of a hold
    together), per credited account and per leg on a system account, besides the clearing legs; none under
    its own id; an account's plain debits and credits net to one entry, or none. Each transaction of a linked
    batch across partitions (streams/spanning_linked.py) posts its shares so too, one entry per leg (its shares
    are not netted)."""
    per_command = Counter((e.value["client_id"], e.value["command_id"]) for e in entries.values())
    spanning = {names.begun(r.value["command_id"]) for r in results if r.value["client_id"] == ENGINE_CLIENT} - {None}
    committed: Counter = Counter()  # transaction key -> entries its commits posted, clearing legs left out
    overdrawn: Counter = Counter()  # transaction key -> receivable legs its commits posted
    for e in entries.values():
        share_of = names.committed(e.value["command_id"]) if e.value["client_id"] == ENGINE_CLIENT else None
        if share_of is None or names.is_clearing(e.value["account_id"]):
            continue
        if f":{RECEIVABLE_MARK}" in e.value["account_id"]:  # a late settlement's overdraw (below)
            overdrawn[share_of] += e.value["kind"] != "account_opened"
        else:
            committed[share_of] += 1
    # A reversal posts one leg per leg of the transaction it mirrors (decided in one partition).
    per_transaction = Counter(e.value["transaction_id"] for e in entries.values() if e.value["transaction_id"])
    # A late settlement's overdraw adds entries on its owner's receivable, an account the command does not name:
    # its opening the first time, and a debit leg that takes all or part of a late capture's leg (which is then
    # left out when nothing of it is left: streams/core/settlement.py).
    receivable: dict[CommandKey, list[tuple[str, bool]]] = defaultdict(list)
    for e in entries.values():
        if f":{RECEIVABLE_MARK}" in e.value["account_id"]:
            receivable[(e.value["client_id"], e.value["command_id"])].append(
                (e.value["account_id"], e.value["kind"] != "account_opened"))
    def mismatch(key: CommandKey, kind: str, body: dict) -> str | None:
        """Why the accepted command (kind, body) did not change the books exactly once; None if it did."""
        expected = len(body["legs"]) if kind == "PostTransaction" else \
            per_transaction[body["reverses"]] if kind == "ReverseTransaction" else \
            0 if kind in ("RegisterCurrency", "RecordRate") else 1  # a currency or a rate changes no account
        if kind == "PostTransaction" and key in receivable:
            named = {leg["account_id"] for leg in body["legs"]}
            added = [is_leg for account, is_leg in receivable[key] if account not in named]
            if expected + len(added) - sum(added) <= per_command[key] <= expected + len(added):
                return None
        share = names.transaction_key(*key)
        if share in spanning or committed[share]:  # begun alone, or a transaction of a linked batch across them
            # A late capture's leg is left out when the receivable took all of it.
            most = _shares(body["legs"]) if share in spanning else expected
            fewest = _fewest_shares(body["legs"]) if share in spanning else expected
            if per_command[key] or not fewest - overdrawn[share] <= committed[share] <= most:
                return (f"command {key} has {per_command[key]} history entries under its own id and "
                        f"{committed[share]} under its commits, expected 0 and {most}")
            return None
        if per_command[key] != expected:
            return f"command {key} has {per_command[key]} history entries, expected {expected}"
        return None

    for key, cmds in sent.items():
        if key not in accepted or key[0] == ENGINE_CLIENT:
            continue
        # Records under one id with different payloads: one was decided, the others were answered
        # id_conflict or not_authenticated (someone else wrote them) and changed nothing. The accepted one
        # is whichever of them the books agree with.
        payloads = list({repr(_body(cmd)): _body(cmd) for cmd in cmds}.values())
        why = [mismatch(key, kind, body) for kind, body in payloads]
        if all(why):
            report.fail("P4", why[0])


def check_seq_and_posted_after(report: Report, journals: dict[str, list[dict]]) -> None:
    """P3: each account's seqs are 1..n (no gap, no repeat) and each posted_after is the fold so far."""
    for account, items in journals.items():
        seqs = [v["seq"] for v in items]
        if seqs != list(range(1, len(seqs) + 1)):
            report.fail("P3", f"{account} seqs are not 1..n: {_gaps(seqs)}")
        for v, folded in walk(items):
            if folded.posted != int(v["posted_after"]):
                report.fail("P3", f"{account}#{v['seq']} posted_after {v['posted_after']} != fold {folded.posted}")


def check_no_overdraft(report: Report, journals: dict[str, list[dict]], floors: dict[str, int]) -> None:
    """P2: along the fold of its history, an account without allow_negative keeps posted - held >= its floor."""
    for account, floor in floors.items():
        for v, folded in walk(journals.get(account, ())):
            if folded.available < floor:
                report.fail("P2", f"{account}#{v['seq']} available {folded.available} below {floor}")


def check_balances_are_the_fold(report: Report, balances: Iterable[TopicRecord], fold: dict[str, Balance]) -> None:
    """The balances topic's latest view of each account equals the fold of its history (posted, held, seq),
    and every account with history has one."""
    latest = {account: r.value for account, r in latest_per_account(balances).items()}
    report.counts["accounts"] = len(latest)
    for account, v in latest.items():
        folded = fold.get(account)
        if folded is None or (int(v["posted"]), int(v["held"]), v["seq"]) != (folded.posted, folded.held, folded.seq):
            report.fail("fold", f"balance of {account} {v['posted']}/{v['held']}#{v['seq']} != history "
                                f"{'none' if folded is None else f'{folded.posted}/{folded.held}#{folded.seq}'}")
    for account in fold.keys() - latest.keys():
        report.fail("fold", f"{account} has history up to #{fold[account].seq} but no balance")


def check_double_entry(report: Report, entries: dict[str, TopicRecord], fold: dict[str, Balance]) -> None:
    """P1: every transaction's legs sum to zero per currency; every currency sums to zero over all accounts."""
    tx_sums: dict[tuple[str, str, str], int] = defaultdict(int)
    for e in entries.values():
        v = e.value
        if v["transaction_id"] is not None:
            tx_sums[(v["client_id"], v["transaction_id"], v["currency"])] += int(v["amount"])
    report.counts["transactions"] = len({(client, tx) for client, tx, _ in tx_sums})
    for (client, tx, currency), total in tx_sums.items():
        if total:
            report.fail("P1", f"transaction {tx} of {client} sums to {total} in {currency}")
    sums: dict[str, int] = defaultdict(int)
    for folded in fold.values():
        sums[folded.currency] += folded.posted
    report.sums = dict(sums)
    for currency, total in sums.items():
        if total:
            report.fail("P1", f"{currency} sums to {total} over all accounts")


def check_clearing_empty(report: Report, fold: dict[str, Balance]) -> None:
    """P6: once quiescent, the clearing shards of each currency sum to zero (money in flight has landed)."""
    clearing: dict[str, dict[str, int]] = defaultdict(dict)
    for account, folded in fold.items():
        if names.is_clearing(account) and folded.posted:
            clearing[folded.currency][account] = folded.posted
    for currency, shards in clearing.items():
        total = sum(shards.values())
        if total:
            detail = ", ".join(f"{account} {posted}" for account, posted in sorted(shards.items()))
            report.fail("P6", f"{total} {currency} still in clearing ({detail})")


def check_holds_settle_once(report: Report, results: Iterable[TopicRecord], fold: dict[str, Balance]) -> None:
    """P5: each hold, in its most settled published state, ends with captured + released = amount, or is open
    with something remaining; each account's held equals the remainders of its open holds."""
    holds = fold_holds(r.value for r in results)
    report.counts["holds"] = len(holds)
    open_remaining: dict[str, int] = defaultdict(int)
    for hold_id, h in holds.items():
        amount, done = int(h["amount"]), int(h["captured"]) + int(h["released"])
        if h["status"] == "open":
            open_remaining[h["account_id"]] += remaining(h)
            if done >= amount:
                report.fail("P5", f"hold {hold_id} on {h['account_id']} is open with nothing remaining")
        elif done != amount:
            report.fail("P5", f"hold {hold_id} on {h['account_id']} ended {h['status']} with captured+released "
                              f"{done} != {amount}")
    for account, folded in fold.items():
        if folded.held != open_remaining.get(account, 0):
            report.fail("P5", f"{account} holds {folded.held} but its open holds total "
                              f"{open_remaining.get(account, 0)}")


def _gaps(seqs: list[int]) -> str:
    return str(seqs[:10]) + ("..." if len(seqs) > 10 else "")


def format_report(report: Report) -> str:
    lines = [f"{'OK' if report.ok else 'VIOLATIONS'}"]
    lines += [f"  {k:28} {v}" for k, v in sorted(report.counts.items())]
    lines += [f"  sum {cur:24} {total}" for cur, total in sorted(report.sums.items())]
    lines += [f"  ? {n}" for n in report.notes]
    lines += [f"  ! {v}" for v in report.violations]
    return "\n".join(lines)
