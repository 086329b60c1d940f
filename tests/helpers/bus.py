"""Eight PartitionProcessors wired together without Kafka: a commands log per partition, the commit path of
streams/engine.py, and control over the order of delivery, redeliveries and crashes.

What it models, and from where:

- **The commands topic.** One append-only log per partition. A client's command is stamped with its send
  time (the Kafka record timestamp); a follow-up command keeps the log time of the command that caused it
  (``Output.timestamp_ms``), as the engine produces it. Each partition's records are delivered in log order
  (FIFO, as Kafka does); which partition delivers next is up to the caller, or to a seeded scheduler.
- **The commit path** (streams/engine.py, steps 2-6) for a batch of one or more records of one partition:
  decide them all (writes staged), emit the outputs, append the changelog records, write the staged state
  and the changelog position, then commit the consumer offset (Faust commits acked offsets later, so the
  committed offset may lag behind).
- **Transactions** (changelog_cuts="transaction", the engine's path today): outputs, changelog records and
  the covered mark of a batch become visible together or never; records already covered are skipped.
- **A crash** at any point of that path: after deciding, after a prefix of the outputs, after all the
  outputs and a prefix of the changelog, after the changelog, or after the state but before the offset
  commit. The processor loses what it staged; outputs already emitted stay out (so they can appear twice
  downstream, byte-identical when redone); the partition restarts as engine.restore does (a new processor
  over the same store, which applies the changelog past its stored position, or over a fresh store
  rebuilt from the whole changelog) and its records are delivered again from the committed offset.

``run()`` keeps the old deterministic behaviour (round-robin, one record per commit, no crash): the rules'
scenarios and the first multi-partition tests use it. ``run_random`` / ``tick`` take a ``random.Random``.
"""
from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from schemas.codec import codec
from streams import placement, routing
from streams.engine import FOLLOW_UP_RECORD_BYTES, FOLLOW_UPS_PER_RECORD
from streams.partition import Output, PartitionProcessor
from streams.store import MemoryStore
from tests.helpers.records import N

C = codec()
START_MS = 1_700_000_000_000

# Where a crash interrupts the commit path of a batch (see the module docstring).
CRASH_POINTS = ("decided", "outputs", "changelog", "state", "offset")


@dataclass(frozen=True, slots=True)
class Record:
    timestamp_ms: int
    key: bytes
    value: bytes
    headers: tuple = ()  # a worker's follow-ups carry the engine's seal (streams/seal.py)


@dataclass(frozen=True, slots=True)
class Crash:
    """Crash the worker at `point`; for "outputs" and "changelog", after the first `count` of them were
    written (outputs of the batch in the order the processor queued them). A RocksDB store survives a
    crash whole or not at all for a batch (one WriteBatch), so the kept store never holds half a batch."""
    point: str
    count: int = 0
    fresh_store: bool = False  # the restarted worker has no store of its own (restores the whole changelog)

    def __post_init__(self):
        assert self.point in CRASH_POINTS, self.point


@dataclass(frozen=True, slots=True)
class EmittedResult:
    key: bytes  # client_id/command_id
    value: bytes  # the encoded result, as on the results topic
    result: dict
    remembered: bool  # the decision stored in the inbox (the batch's changelog has this very result)
    partition: int


class Bus:
    def __init__(self, duplicate_engine_commands: bool = False, batch_follow_ups: bool = False,
                 partitions: int = N, changelog_cuts: str = "anywhere"):
        """changelog_cuts: where a crash may cut the changelog of a batch: "anywhere" (any prefix of its
        records, as Kafka may have appended when the worker died) or "between_records" (only between the
        changelog records of two command records: each record's redo records all or none) or "transaction"
        (the engine's commit path: a batch's outputs, redo records and covered mark in one Kafka transaction, so
        a crash before its commit leaves none of them and one after leaves all; a record the committed
        changelog covers is skipped when delivered again, without a new result)."""
        assert changelog_cuts in ("anywhere", "between_records", "transaction"), changelog_cuts
        self.changelog_cuts = changelog_cuts
        self.n = partitions
        self.stores = {p: MemoryStore() for p in range(partitions)}
        self.procs = {p: PartitionProcessor(p, partitions, self.stores[p]) for p in range(partitions)}
        self.logs: dict[int, list[Record]] = {p: [] for p in range(partitions)}
        self.position = {p: 0 for p in range(partitions)}  # next offset the running worker decides
        self.committed = {p: 0 for p in range(partitions)}  # the consumer group's offset: a restart starts here
        self.changelogs: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
        # "transaction": the next commands offset each partition's committed changelog covers (its marks).
        self.covered = {p: 0 for p in range(partitions)}
        self.results: list[dict] = []  # every result emitted, copies included, in emission order
        self.emitted: list[EmittedResult] = []  # the same, with keys, bytes and whether it is a decision
        self.history: list[dict] = []  # every history entry emitted, copies included
        self.history_bytes: list[tuple[bytes, bytes]] = []  # (record key: the account id, encoded entry)
        self.dead_letters: list[dict] = []
        self.duplicate = duplicate_engine_commands
        self.batch_follow_ups = batch_follow_ups
        self.clock = START_MS
        self.crashes = 0
        self.trace: list[str] = []  # what happened, for failure messages

    # --- producing ------------------------------------------------------------------------------------------
    def send(self, value: bytes, account: str, at_ms: int | None = None) -> int:
        """A client's record, keyed by the account's routing key; returns its partition."""
        partition = routing.partition_of_account(account, self.n)
        self.send_to(partition, value, at_ms, routing.routing_key_for(account).encode())
        return partition

    def send_placed(self, value: bytes, account: str, at_ms: int | None = None) -> list[int]:
        """As LedgerClient sends: a transaction whose legs live in several partitions goes to its
        coordinator and, marked, to each other partition it touches, all at one send time
        (streams.placement.placements). Returns the partitions written."""
        record = C.decode("command", value)
        placed, partitions = placement.placements(record, account, self.n)
        return self._send_all(C.encode("command", placed), partitions, account, at_ms)

    def send_linked_placed(self, value: bytes, account: str, at_ms: int | None = None) -> list[int]:
        """As LedgerClient sends a linked batch: to its coordinator and, as a copy naming it, to each other
        partition its transactions touch, all at one send time (streams.placement.linked_placements). Returns
        the partitions written, the coordinator first."""
        batch = C.decode("command_batch", value)
        records = [C.decode("command", item) for item in batch["commands"]]
        coordinator, partitions = placement.linked_placements(records, account, self.n)
        encoded = C.encode("command_batch", {**batch, "coordinator": coordinator if len(partitions) > 1 else None})
        return self._send_all(encoded, partitions, account, at_ms)

    def _send_all(self, value: bytes, partitions: list[int], account: str, at_ms: int | None) -> list[int]:
        """The same record to each partition, at one send time, keyed by the account's routing key."""
        if at_ms is None:
            self.clock += 1
            at_ms = self.clock
        for partition in partitions:
            self.send_to(partition, value, at_ms, routing.routing_key_for(account).encode())
        return partitions

    def send_to(self, partition: int, value: bytes, at_ms: int | None = None, key: bytes = b"k") -> None:
        if at_ms is None:
            self.clock += 1
            at_ms = self.clock
        else:
            self.clock = max(self.clock, at_ms)
        self.logs[partition].append(Record(at_ms, key, value))

    # --- delivering -----------------------------------------------------------------------------------------
    def pending(self, partition: int) -> int:
        """Records of the partition the running worker has not decided yet."""
        return len(self.logs[partition]) - self.position[partition]

    @property
    def quiet(self) -> bool:
        return not any(self.pending(p) for p in range(self.n))

    def step(self, partition: int, records: int = 1, crash: Crash | None = None,
             commit_offset: bool = True) -> None:
        """One batch of up to `records` records of the partition through the commit path; `crash` stops it
        part way and restarts the partition. commit_offset=False: the consumer offset is not committed yet
        (Faust commits later), so a crash before the next commit delivers these records again."""
        proc = self.procs[partition]
        start = self.position[partition]
        batch = self.logs[partition][start:start + records]
        assert batch, f"partition {partition} has nothing to deliver"
        self.trace.append(f"p{partition}@{start}+{len(batch)}" + (f" crash:{crash.point}/{crash.count}" if crash else ""))
        boundaries = [0]  # changelog records staged after each record of the batch
        transactional = self.changelog_cuts == "transaction"
        for i, record in enumerate(batch):  # 2. decide; writes are staged
            if transactional and start + i < self.covered[partition]:
                continue  # committed before: skipped, no new result
            proc.handle(start + i, record.timestamp_ms, record.key, record.value, record.headers)
            boundaries.append(len(proc.changelog))
        outputs, changelog = proc.take()
        if crash is not None and crash.point == "decided":
            return self._restart(partition, crash.fresh_store)
        if transactional and crash is not None and crash.point in ("outputs", "changelog"):
            return self._restart(partition, crash.fresh_store)  # the open transaction is aborted: nothing seen
        decisions = {}
        for encoded in changelog:
            change = C.decode("state", encoded)
            decisions[f"{change['client_id']}/{change['command_id']}".encode()] = change["result"]
        emit = outputs[:crash.count] if crash is not None and crash.point == "outputs" else outputs
        self._emit(partition, emit, decisions)  # 3. outputs
        if crash is not None and crash.point == "outputs":
            return self._restart(partition, crash.fresh_store)
        written = changelog
        if crash is not None and crash.point == "changelog":
            cut = crash.count
            if self.changelog_cuts == "between_records":
                cut = max(b for b in boundaries if b <= cut)
            written = changelog[:cut]
        self.changelogs[partition].extend(written)  # 4. changelog
        if transactional:  # the transaction commits: outputs, redo records and the covered mark at once
            # Never below the mark before: a batch of records all covered already decides nothing, and the
            # engine then moves no mark (it covers only what it decided).
            self.covered[partition] = max(self.covered[partition], start + len(batch))
        if crash is not None and crash.point == "changelog":
            return self._restart(partition, crash.fresh_store)
        if proc.state.has_staged:  # 5. state and changelog position, atomically
            proc.state.commit(len(self.changelogs[partition]))
        self.position[partition] = start + len(batch)
        if crash is not None and crash.point == "state":
            return self._restart(partition, crash.fresh_store)
        if commit_offset:  # 6. (Faust, later) the consumer offset
            self.committed[partition] = self.position[partition]
        if crash is not None and crash.point == "offset":
            return self._restart(partition, crash.fresh_store)

    def crash_restore(self, partition: int, fresh_store: bool = False) -> None:
        """Kill the partition's worker between batches and restart it (from the committed offset)."""
        self.trace.append(f"p{partition} restart" + (" fresh" if fresh_store else ""))
        self._restart(partition, fresh_store)

    def _restart(self, partition: int, fresh_store: bool = False) -> None:
        self.crashes += 1
        if fresh_store:  # a new worker elsewhere: nothing but the changelog
            self.stores[partition] = MemoryStore()
        proc = PartitionProcessor(partition, self.n, self.stores[partition])
        changelog = self.changelogs[partition]
        proc.restore(changelog[proc.state.changelog_offset():], len(changelog))
        self.procs[partition] = proc
        self.position[partition] = self.committed[partition]

    def _emit(self, partition: int, outputs: list[Output], decisions: dict[bytes, bytes]) -> None:
        follow_ups: dict[int, list[Output]] = {}
        for o in outputs:
            if o.topic == "commands":
                for _ in range(2 if self.duplicate else 1):
                    if self.batch_follow_ups:
                        self._follow_up(follow_ups, o)
                    else:
                        self.logs[o.partition].append(Record(o.timestamp_ms, o.key, o.value,
                                                             self._seal(o.partition, o.value)))
            elif o.topic == "results":
                result = C.decode("result", o.value)
                self.results.append(result)
                self.emitted.append(EmittedResult(o.key, o.value, result, decisions.get(o.key) == o.value,
                                                  partition))
            elif o.topic == "history":
                self.history.append(C.decode("history", o.value))
                self.history_bytes.append((o.key, o.value))
            elif o.topic == "dlq":
                self.dead_letters.append(C.decode("dead_letter", o.value))
        for run in follow_ups.values():
            self._append_run(run)

    def _follow_up(self, runs: dict[int, list[Output]], o: Output) -> None:
        """As engine._send: follow-ups for one partition with one log time travel as one CommandBatch."""
        run = runs.setdefault(o.partition, [])
        if run and (run[0].timestamp_ms != o.timestamp_ms or len(run) >= FOLLOW_UPS_PER_RECORD
                    or sum(len(x.value) for x in run) + len(o.value) > FOLLOW_UP_RECORD_BYTES):
            self._append_run(run)
            run.clear()
        run.append(o)

    def _append_run(self, run: list[Output]) -> None:
        if not run:
            return
        first = run[0]
        value = first.value if len(run) == 1 else C.encode("command_batch", {"commands": [o.value for o in run]})
        self.logs[first.partition].append(Record(first.timestamp_ms, first.key, value,
                                                 self._seal(first.partition, value)))

    def _seal(self, partition: int, value: bytes) -> tuple:
        """The headers the engine puts on a follow-up record it produces (engine._send_commands)."""
        return tuple(self.procs[partition].sealed_headers(partition, value))

    # --- schedules ------------------------------------------------------------------------------------------
    def run(self) -> None:
        """Deterministic: round-robin over the partitions, one record per commit, no crash, until quiet."""
        while not self.quiet:
            for p in range(self.n):
                if self.pending(p):
                    self.step(p)

    def tick(self, rng: random.Random, max_records: int = 3, crash_rate: float = 0.0,
             fresh_store_rate: float = 0.3, offset_commit_rate: float = 0.7, restart_rate: float = 0.0) -> bool:
        """One random batch: a random partition with records to deliver, 1..max_records of them, a crash at a
        random point with probability crash_rate; with probability restart_rate first a restart of a random
        partition between batches. False if there was nothing to deliver."""
        ready = [p for p in range(self.n) if self.pending(p)]
        if not ready:
            return False
        if rng.random() < restart_rate:
            self.crash_restore(rng.randrange(self.n), fresh_store=rng.random() < fresh_store_rate)
            ready = [p for p in range(self.n) if self.pending(p)]
        p = rng.choice(ready)
        records = rng.randint(1, max_records)
        crash = None
        if rng.random() < crash_rate:
            crash = Crash(rng.choice(CRASH_POINTS), rng.randint(0, 6), rng.random() < fresh_store_rate)
        self.step(p, records, crash, commit_offset=rng.random() < offset_commit_rate)
        return True

    def run_random(self, rng: random.Random, after_step: Callable[[], None] | None = None,
                   max_steps: int = 200_000, **tick_options) -> int:
        """Random ticks until quiet; after_step (an invariant check) runs after each. Returns the ticks."""
        steps = 0
        while self.tick(rng, **tick_options):
            steps += 1
            if after_step is not None:
                after_step()
            assert steps < max_steps, "the bus never became quiet"
        return steps

    # --- reading --------------------------------------------------------------------------------------------
    def result(self, command_id: str) -> dict:
        return next(r for r in self.results if r["command_id"] == command_id and not r["duplicate"])

    def account(self, account_id: str):
        """(posted, held) of an account; a system account summed over its shards."""
        if routing.is_system(account_id):
            shards = [self.procs[p].state.account(routing.shard_of(account_id, p)) for p in range(self.n)]
            return sum(a.posted for a in shards if a), sum(a.held for a in shards if a)
        a = self.procs[routing.partition_of_account(account_id, self.n)].state.account(account_id)
        return a.posted, a.held

    def hold(self, hold_id: str, account_id: str):
        return self.procs[routing.partition_of_account(account_id, self.n)].state.hold(hold_id)

    def stored(self, partition: int, prefix: bytes) -> list[tuple[bytes, bytes]]:
        """Committed records of a partition's store under a key prefix."""
        return list(self.stores[partition].scan(prefix))


def assert_books_balance(bus: Bus, currencies: tuple[str, ...] = ("USDT", "BTC")) -> None:
    """Once quiet: every currency sums to zero (P1), clearing is empty (P6), no engine record is left."""
    import json

    from streams.wire import account_from_record
    for currency in currencies:
        total = sum(account_from_record(json.loads(v)).posted for p in range(bus.n) for _, v in bus.stored(p, b"a/")
                    if account_from_record(json.loads(v)).currency == currency)
        assert total == 0, f"{currency} sums to {total}"
        clearing = bus.account(f"sys:clearing:{currency}")
        assert clearing == (0, 0), f"{currency} left in clearing: {clearing}"
    for p in range(bus.n):
        assert not bus.stored(p, b"e/"), f"engine records left behind in partition {p}"
