"""Rebuilding a fresh read store at the speed of the log (`ledger replay`): partitions in parallel, rows in bulk.

The projector (projections/projector.py) applies small batches to a live store: one transaction per batch,
reading back what each batch touches. A rebuild writes a *fresh* store up to fixed end offsets, so it can do
less, and do it in several processes:

1. The work is split into shares, one per loader process (the first share is loaded in this process, the
   others in processes spawned first thing). History and results go to different loaders (`shares`): they
   fill different tables, so each table has one writer; balance records, which only fill memory, go where
   they even out the work. Every key is partition-local (history by account, results by command, balances
   by account), so shares never collide.
2. A loader consumes its partitions to the end offsets, decodes each record once, and keeps in memory only
   what is small: per account the seq ranges seen (a re-emitted entry is dropped there, exactly as the
   store's `ON CONFLICT DO NOTHING` would), the running folds by time (`fold.by_time`) and the latest balance
   record; the most settled state of each hold. History, link and result rows go out in bulk: SQLite into a
   file of the loader's own (the first loader's is the store itself), PostgreSQL by COPY into the store's
   tables (one connection per loader, the server working on them side by side).
   A result whose key was seen before in the share (a retry answered again and not marked duplicate) is
   kept aside and applied at the end with the projector's statements, in log order: the row kept is the
   one the projector keeps (the last decision, never an id_conflict over a decision). Then the loader
   recomputes the folds by time of its accounts whose entries came out of order, commits, and builds the
   secondary indexes of the tables no other loader writes, while the others go on (PostgreSQL: through a
   queue the loaders share, IndexWork, so one done with its own tables builds another's).
3. Every other loader hands its state (balances, holds, offsets) to this process once its records are read
   and its rows written, before it commits and indexes; this process writes what is per account from the
   states (balance rows, summed views, currency sums, the holds) while the last loaders still index
   (PostgreSQL: as soon as its own share is written, if every state is in by then; SQLite: once its own share
   is committed and indexed). At the end it copies the other loaders' SQLite files into the store (into an
   empty table with the same indexes SQLite transfers the records and index entries in key order, with no
   decoding and no sort), builds the indexes of any table several loaders wrote, and writes the offsets and
   the store version last. `Loaded.timeline` says when each of these phases ended (the benchmark prints it).

The result is the store the projector builds from the same records (replay's hash proves it; so do the
tests, which compare a rebuild with a store caught up batch by batch). What is not the same is how it gets
there, so an interrupted rebuild is not resumed: a SQLite rebuild is written to `<target>.partial-*`
(journal off: nothing to recover) and renamed to the target when complete; an interrupted PostgreSQL rebuild
leaves a schema with no offsets, which a projector would fill from offset 0 (re-applying is harmless), or
which is dropped.
"""
from __future__ import annotations

import gc
import json
import logging
import multiprocessing as mp
import multiprocessing.sharedctypes  # noqa: F401  ctx.Array's (and ctypes): with this module, not 14-24 ms into the first rebuild
import os
import sqlite3
import tempfile
import time
import uuid
from bisect import bisect_right
from collections import defaultdict
from dataclasses import dataclass, field, replace
from functools import partial
from operator import itemgetter
from pathlib import Path
from queue import Empty
from typing import Callable, Iterable

from confluent_kafka import Consumer, TopicPartition

from projections import db, fastload
from projections.fold import extend_by_time, newer_hold, sum_shards, unfoldable
from projections.store import (ACCOUNT_COLUMNS, ADVANCE_OFFSET, HISTORY_COLUMNS, HISTORY_FIELDS, HOLD_COLUMNS,
                               INSERT_LINK, KEEP_RESULT, PRIMARY_KEYS, REPLACE_ACCOUNT, REPLACE_HOLD, REPLACE_META,
                               REPLACE_RESULT, REPLACE_SUM, REPLACE_VIEW, RESULT_COLUMNS, SCHEMA_INDEXES,
                               SCHEMA_TABLES, VIEW_COLUMNS, add_primary_key, history_detail, link_rows,
                               refold_by_time, tables_without_keys)
from schemas.codec import DecodeError, codec
from streams import routing
from streams.config import Settings
from streams.core.rejections import NOT_A_DECISION

log = logging.getLogger("ledger.replay")

Key = tuple[str, int]  # (logical topic, partition)
SCHEMA_OF = {"balances": "balance", "history": "history", "results": "result"}
CONSUME_BATCH = 10_000
# A PostgreSQL loader sends history's key-ordered rows in parts of this size, each made while the server reads
# the one before; no larger than psycopg's own bound on a write (MAX_BUFFER_SIZE), above which it copies the
# buffer into slices.
COPY_PART = 128 * 1024
_history_row = itemgetter(*HISTORY_FIELDS)
INSERT_HISTORY_ROWS = f"INSERT INTO history ({', '.join(HISTORY_COLUMNS)}) VALUES ({', '.join('?' * len(HISTORY_COLUMNS))})"
INSERT_RESULT_ROWS = f"INSERT INTO results ({', '.join(RESULT_COLUMNS)}) VALUES ({', '.join('?' * len(RESULT_COLUMNS))})"


def history_row(v: dict, posted_by_time: int | str, held_by_time: str) -> tuple:
    """A decoded history record as a row of HISTORY_COLUMNS, with its prefix folds by time."""
    return _history_row(v) + (str(posted_by_time), held_by_time) + history_detail(v)


def result_row(v: dict) -> tuple:
    """A decoded result record as a row of RESULT_COLUMNS (its hold states as canonical JSON)."""
    hold_states = v["holds"]
    return (v["client_id"], v["command_id"], v["outcome"], v["reason"], v["detail"], v["transaction_id"], v["at_ms"],
            json.dumps(hold_states, sort_keys=True) if hold_states else "[]")


@dataclass
class Loaded:
    """What a loader hands back besides its rows: small, per account or per hold."""

    applied: int = 0
    skipped: int = 0
    offsets: dict[Key, int] = field(default_factory=dict)  # next offset per partition read
    balances: dict[str, dict] = field(default_factory=dict)  # latest balance record per account (highest seq)
    holds: dict[str, dict] = field(default_factory=dict)  # most settled state per hold
    refold: set[str] = field(default_factory=set)  # accounts whose entries came out of order (SQLite: merged later)
    # (phase, seconds since the rebuild began), in the order they ended: where a rebuild's time went. Wall
    # clock (time.time) because loaders are processes of their own; only printed, never part of the store.
    timeline: list[tuple[str, float]] = field(default_factory=list)
    loaders: int = 1  # how many loaded the rebuild


# --- sinks: where a loader's history and result rows go ----------------------------------------------------
class SqliteSink:
    """A SQLite file with the store's tables, written without a journal (a rebuild is thrown away, not
    recovered, when interrupted)."""

    def __init__(self, path: str, create: bool = True):
        self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False,
                                    factory=db.SqliteConnection)
        self.conn.row_factory = sqlite3.Row
        for pragma in (f"page_size={db.SQLITE_PAGE_SIZE}", "journal_mode=OFF", "synchronous=OFF", "cache_size=-65536",
                       "temp_store=MEMORY"):
            self.conn.execute(f"PRAGMA {pragma}")
        if create:
            db.create_tables(self.conn, SCHEMA_TABLES)
        # One transaction for the whole share: in autocommit every row of an executemany is a transaction of
        # its own (four times the cost of the insert itself). Nothing is lost by it: an interrupted rebuild
        # is thrown away, not recovered.
        self.conn.execute("BEGIN")

    def history(self, rows: list[tuple]) -> None:
        self.conn.executemany(INSERT_HISTORY_ROWS, rows)

    def links(self, rows: list[tuple[str, str]]) -> None:
        self.conn.executemany(INSERT_LINK, rows)

    def results(self, rows: list[tuple]) -> None:
        self.conn.executemany(INSERT_RESULT_ROWS, rows)

    def finish(self, late_results: list[tuple[bool, tuple]], refold: set[str], indexes: str) -> None:
        for conflict, row in late_results:
            self.conn.execute(KEEP_RESULT if conflict else REPLACE_RESULT, row)
        # An account's entries are all in one partition, so all in this share: its folds are recomputed here.
        refold_by_time(self.conn, sorted(refold))
        self.conn.execute("COMMIT")
        if indexes:
            db.create_tables(self.conn, indexes)

    def close(self) -> None:
        self.conn.close()


class IndexWork:
    """The secondary index builds of a PostgreSQL rebuild, shared by its loaders: each queues its tables' (once
    their rows, primary keys, late results and refolds are in) and then builds from the queue until it is
    empty, so a loader done with its own tables takes builds of a table another loader is still indexing.
    CREATE INDEX takes a SHARE lock, which does not conflict with itself: builds on one table run side by
    side. No loader waits for another to queue: one that finds the queue empty is done."""

    def __init__(self, ctx) -> None:
        self.queue = ctx.SimpleQueue()  # put writes to the pipe at once: queued before `add` returns
        self.lock = ctx.Lock()  # the check and the take, together

    def add(self, statements: list[str]) -> None:
        for statement in statements:
            self.queue.put(statement)

    def take(self) -> str | None:
        with self.lock:
            return None if self.queue.empty() else self.queue.get()


class PgSink:
    """COPY into the store's tables in PostgreSQL (a connection per loader). work: the rebuild's shared index
    builds (None: this loader builds its tables' indexes itself)."""

    HISTORY_TYPES = db.copy_types(SCHEMA_TABLES, "history", HISTORY_COLUMNS)
    RESULT_TYPES = db.copy_types(SCHEMA_TABLES, "results", RESULT_COLUMNS)
    COLUMNS = {"history": HISTORY_COLUMNS, "results": RESULT_COLUMNS}  # of the tables the loaders copy
    TYPES = {"history": HISTORY_TYPES, "results": RESULT_TYPES}

    def __init__(self, target: str, work: IndexWork | None = None):
        self.conn = db.connect(target)
        self.work = work
        # No parallel workers for this connection's index builds: a rebuild already runs a loader per idle core,
        # and the loaders build side by side (IndexWork); the server's workers for one build only competed
        # with them (and cost a process start and a shared sort each). Whole rebuilds of the benchmark,
        # alternated: median 0.582 s against 0.610, and 0.659 against 0.724 (docs/read-side.md, "eighth session").
        self.conn.execute("SET max_parallel_maintenance_workers = 0")

    def history(self, rows: list[tuple]) -> None:
        self.conn.copy_rows("history", HISTORY_COLUMNS, rows, self.HISTORY_TYPES)

    def links(self, rows: list[tuple[str, str]]) -> None:  # few, and shares may hold the same (not COPY)
        self.conn.executemany(INSERT_LINK, rows)

    def results(self, rows: list[tuple]) -> None:
        self.conn.copy_rows("results", RESULT_COLUMNS, rows, self.RESULT_TYPES)

    def copy(self, table: str, data: bytes | Iterable[bytes]) -> None:
        """A whole COPY stream in the binary format of the rows the fast path took (fastload.Batch.copies),
        or its parts (fastload.Batch.history_part)."""
        self.conn.copy_stream(table, self.COLUMNS[table], data)

    def finish(self, late_results: list[tuple[bool, tuple]], refold: set[str], indexes: str) -> None:
        # The primary keys left out while copying first: the late results and the refold write by key.
        statements = [st for st in indexes.split(";\n") if st.strip()]
        for st in statements:
            if st.startswith("ALTER TABLE"):
                self.conn.execute(st)
        with db.transaction(self.conn):
            for conflict, row in late_results:
                self.conn.execute(KEEP_RESULT if conflict else REPLACE_RESULT, row)
            refold_by_time(self.conn, sorted(refold))
        rest = [f"{st};\n" for st in statements if not st.startswith("ALTER TABLE")]
        if self.work is None:  # built by the server while the other loaders go on
            db.create_tables(self.conn, "".join(rest))
            return
        self.work.add(rest)
        while (statement := self.work.take()) is not None:  # this loader's, then any other's still queued
            db.create_tables(self.conn, statement)

    def close(self) -> None:
        self.conn.close()


# --- a loader -------------------------------------------------------------------------------------------------
def _contains(ranges: list[list[int]], seq: int) -> bool:
    i = bisect_right(ranges, [seq, float("inf")]) - 1
    return i >= 0 and ranges[i][0] <= seq <= ranges[i][1]


def _add(ranges: list[list[int]], seq: int) -> None:
    """Add seq (not in ranges) to the sorted disjoint ranges."""
    i = bisect_right(ranges, [seq, float("inf")])
    ranges.insert(i, [seq, seq])
    if i + 1 < len(ranges) and ranges[i + 1][0] == seq + 1:
        ranges[i][1] = ranges.pop(i + 1)[1]
    if i > 0 and ranges[i - 1][1] == seq - 1:
        ranges[i - 1][1] = ranges.pop(i)[1]


def reading_config(settings: Settings, client_id: str) -> dict:
    """A consumer that reads assigned partitions to fixed ends in large fetches and commits nothing: a
    loader's, and the raw reads a replay is measured against. client_id: its group and client id, unique."""
    return {**settings.kafka_config(), "group.id": client_id, "client.id": client_id, "enable.auto.commit": False,
            "enable.auto.offset.store": False, "isolation.level": "read_committed",
            "fetch.max.bytes": 64 * 1024 * 1024, "queued.max.messages.kbytes": 256 * 1024}


def load(settings: Settings, keys: dict[Key, tuple[int, int]], sink, progress: Callable[[int], None],
         indexes: str = "", origin: float | None = None, name: str = "loader 0",
         read: Callable[[Loaded], None] | None = None) -> Loaded:
    """Consume keys {(topic, partition): (start, until)} into the sink, then build `indexes` (the secondary
    indexes of the tables no other loader writes); returns the small state. `origin`: the rebuild's start
    (time.time()), for the timeline. `read` is given the state once it is whole (every record read and its
    rows written), before the share commits and indexes: it does not change after that, but for its
    timeline."""
    out = Loaded()
    origin = time.time() if origin is None else origin

    def mark(phase: str) -> None:
        # with the CPU time of the loader's process so far: a loader waiting for a core shows here
        out.timeline.append((f"{name}: {phase} (CPU {time.process_time():.2f} s)", time.time() - origin))

    c = codec()
    names = {settings.topic(t): t for t in SCHEMA_OF}
    # Per topic: its name, the header of its current schema and that schema's generated decoder. A record
    # with that header is decoded here directly; any other (an older version, a foreign or corrupt one)
    # goes through codec.decode, which resolves it or says why not.
    fast = {settings.topic(t): (t, c.header(SCHEMA_OF[t]), c.body_decoder(SCHEMA_OF[t])) for t in SCHEMA_OF}
    client_id = f"ledger-replay-{uuid.uuid4()}"  # unique: fastload.reader checks the handle by it
    consumer = Consumer(reading_config(settings, client_id))
    remaining = {k: until for k, (start, until) in keys.items() if until > start}
    fast_path = reader = None
    # No cyclic garbage collection while loading: every consume() allocates its batch of messages (objects the
    # collector tracks), which set off a collection every 700 of them, and the older generations' collections
    # walk everything the process holds. A profile of a rebuild put 8% of the loaders' CPU there; with the
    # collector off while loading, a rebuild used 0.27 s less CPU of 3.3 (docs/read-side.md). Reference
    # counting frees every batch, and loading makes no cycles (20,000 undecodable records left 16 objects to
    # the collector); as a safety net, a batch that skipped records (the path that raises and catches per
    # record) has whatever cycles it made collected at its end.
    collecting = gc.isenabled()
    try:
        gc.disable()
        first = True
        seen: dict[str, list] = {}  # account -> [seq ranges, its prefix folds by time (fold.Tail)]
        refold = out.refold
        result_keys: set[int] = set()
        late_results: list[tuple[bool, tuple]] = []
        balances, holds, offsets = out.balances, out.holds, out.offsets
        decode = c.decode
        # The common records in C, straight to SQLite or to the rows copied (fastload.py says when it
        # serves); the loop below takes each record it hands back, and every record when it does not serve.
        fast_path = fastload.batch(sink.conn if isinstance(sink, SqliteSink) else None, c, names, remaining,
                                   offsets, seen, refold, result_keys, balances)
        copying = fast_path is not None and not isinstance(sink, SqliteSink)

        def send_copies() -> None:  # the rows the fast path took for PostgreSQL, already in COPY's format
            for table, data in fast_path.copies():
                sink.copy(table, data)
        if remaining:
            # With the fast path, the records are read in C as well (before the partitions are assigned).
            reader = fastload.reader(consumer, client_id, [(settings.topic(t), p) for t, p in remaining]) \
                if fast_path is not None else None
            consumer.assign([TopicPartition(settings.topic(t), p, keys[(t, p)][0]) for t, p in remaining])
        mark("consumer created and assigned")
        done = skipped = 0
        waited = 0.0  # reading records: fetching, or this process waiting for a core
        while remaining:
            history_rows, result_rows, links = [], [], []
            asked = time.perf_counter()  # (with the reader, drain times its own reading)
            # No more than are left: consume() waits out its timeout for a batch it cannot fill, which
            # cost every loader 0.5 s at its end. (Transaction markers take offsets, so `left` can be
            # more than the records left: then the short timeout bounds the wait.)
            left = sum(until - offsets.get(k, keys[k][0]) for k, until in remaining.items())
            if reader is not None:  # read and applied in C; `messages`: those it left to this loop
                count, messages = fast_path.drain(reader, max(1, min(CONSUME_BATCH, left)), 100)
                _serve_consumer_queue(consumer, reader, name)
            else:
                messages = consumer.consume(max(1, min(CONSUME_BATCH, left)), timeout=0.1)
                count = len(messages)
                waited += time.perf_counter() - asked
            if first and count:
                mark("first records")
                first = False
            i, handed = 0, len(messages)
            while i < handed:
                if fast_path is not None:
                    i = fast_path.run(messages, i)
                    if i == handed:
                        break
                msg = messages[i]
                i += 1
                if msg.error():
                    continue
                topic, header, body = fast[msg.topic()]
                key = (topic, msg.partition())
                offset = msg.offset()
                if offset >= remaining.get(key, -1):
                    continue
                offsets[key] = offset + 1
                data = msg.value()
                try:
                    v, end = body(data, 10) if data[:10] == header else (None, -1)
                    if end != len(data):
                        v = decode(SCHEMA_OF[topic], data)
                except Exception:
                    try:
                        v = decode(SCHEMA_OF[topic], data)  # the same failure, as a DecodeError
                    except DecodeError as exc:
                        out.skipped += 1
                        log.error("skipping undecodable %s record at %d/%d: %s", topic, key[1], offset, exc)
                        continue
                why = unfoldable(topic, v)
                if why is not None:  # as the projector does (projections/fold.py)
                    out.skipped += 1
                    log.error("skipping %s record at %d/%d that cannot be folded: %s", topic, key[1], offset, why)
                    continue
                out.applied += 1
                if topic == "history":
                    account, seq = v["account_id"], v["seq"]
                    state = seen.get(account)
                    if state is None:
                        tail = extend_by_time(None, v)
                        seen[account] = [[[seq, seq]], tail]
                        history_rows.append(history_row(v, tail[2], v["held_after"]))
                        if v.get("links"):
                            links += link_rows(v)
                        continue
                    ranges = state[0]
                    last = ranges[-1]
                    if seq > last[1]:
                        if seq == last[1] + 1:
                            last[1] = seq
                        else:
                            ranges.append([seq, seq])
                        tail = None if account in refold else extend_by_time(state[1], v)
                        if tail is not None:
                            state[1] = tail
                            history_rows.append(history_row(v, tail[2], v["held_after"]))
                            if v.get("links"):
                                links += link_rows(v)
                            continue
                    elif _contains(ranges, seq):
                        continue  # a re-emitted entry: the store keeps the first
                    else:
                        _add(ranges, seq)
                    refold.add(account)  # out of order: its folds by time are recomputed at the end
                    history_rows.append(history_row(v, "0", "0"))
                    if v.get("links"):
                        links += link_rows(v)
                elif topic == "results":
                    if v["duplicate"]:
                        continue  # answers an original decision that is earlier in the log
                    row = result_row(v)
                    # A 64-bit hash of the key: a collision only sends a row down the exact (slower) path.
                    h = hash((row[0], row[1]))
                    if h in result_keys:
                        late_results.append((v["reason"] in NOT_A_DECISION, row))
                    else:
                        result_keys.add(h)
                        result_rows.append(row)
                    for hs in v["holds"]:
                        hold_id = hs["hold_id"]
                        holds[hold_id] = newer_hold(holds.get(hold_id), {**hs, "updated_at_ms": v["at_ms"]})
                else:
                    old = balances.get(v["account_id"])
                    if old is None or v["seq"] > old["seq"]:
                        balances[v["account_id"]] = v
            if history_rows:
                sink.history(history_rows)
            if links:
                sink.links(links)
            if result_rows:
                sink.results(result_rows)
            if copying:
                send_copies()
            done += count
            progress(done)
            if out.skipped != skipped:
                skipped = out.skipped
                gc.collect(0)
            # Done with a partition at its end offset, or when only control records (transaction markers)
            # are left before it: the consumer's position says so.
            finished = [k for k, until in remaining.items() if offsets.get(k, 0) >= until]
            if not count or len(finished) < len(remaining):
                positions = consumer.position([TopicPartition(settings.topic(t), p) for t, p in remaining])
                finished += [(names[tp.topic], tp.partition) for tp in positions
                             if tp.offset >= remaining[(names[tp.topic], tp.partition)]]
            finished = set(finished)
            if finished:
                consumer.incremental_unassign([TopicPartition(settings.topic(t), p) for t, p in finished])
                for k in finished:
                    remaining.pop(k, None)
        # Done with Kafka: the reader's queue, then the consumer (its threads joined: 1-5 ms), now rather
        # than at the end of the share, where the rebuild waits for its last loader.
        _stop_reading(reader, consumer)
        if fast_path is not None:
            out.applied += fast_path.applied
            waited += fast_path.reading
            mark("every record read (the rows the fast path kept are written next, in key order)")
            if copying:  # history's rows kept, in key order, made part by part while the server reads
                sink.copy("history", iter(partial(fast_path.history_part, COPY_PART), None))
            fast_path.flush()  # the rows it kept, in key order (for PostgreSQL: the results')
            if copying:
                send_copies()
            fast_path.close()  # its statements, before the connection commits and closes
        mark(f"{out.applied} records consumed and written, {waited:.2f} s of it reading"
             + (" (the common ones in C" + (", read in C too)" if reader is not None else ")")
                if fast_path is not None else ""))
        if read is not None:
            read(out)
        sink.finish(late_results, refold, indexes)
        shared = " (queued with the other loaders', built by whichever was free)" \
            if getattr(sink, "work", None) is not None else ""
        mark(f"committed, {len(refold)} accounts refolded" + (f", indexes of {', '.join(_tables(keys))} built{shared}"
                                                               if indexes else ""))
        return out
    finally:
        if collecting:
            gc.enable()
        try:
            if fast_path is not None:  # its statements, whatever happened, before the sink closes the connection
                fast_path.close()
        finally:
            _stop_reading(reader, consumer)  # (closed already unless the share failed: both may close twice)


def _stop_reading(reader, consumer: Consumer) -> None:
    try:
        if reader is not None:  # its queue, before the consumer's handle goes
            reader.close()
    finally:
        consumer.close()


def _serve_consumer_queue(consumer: Consumer, reader, name: str) -> None:
    """With the records read in C (fastload.Reader), the consumer's own queue still gets librdkafka's events
    that are not about a partition (logs, errors): served here between batches, by confluent-kafka, as its
    `consume()` would. No record can be there (every partition of the loader is forwarded to the reader): one
    that were would be lost, so it stops the rebuild. Errors the reader read are logged here too."""
    msg = consumer.poll(0)
    if msg is not None and not msg.error():
        raise RuntimeError(f"{name}: a record of {msg.topic()}/{msg.partition()} reached the consumer's own queue")
    if reader.errors != reader.reported:
        log.warning("%s: librdkafka reported %d error(s) on its partitions, the last: %s", name,
                    reader.errors - reader.reported, reader.last_error)
        reader.reported = reader.errors


def _child(settings: Settings, keys: dict[Key, tuple[int, int]], target: str, part: str | None, index: int,
           indexes: str, counters, queue, origin: float, work: IndexWork | None = None,
           accounts: bool = False) -> None:
    """A loader process: its share into its own SQLite file (part) or into the PostgreSQL store. It tells the
    parent twice: its state once every record is read and written ("read"), then that its share is committed
    and indexed ("done", with the rest of its timeline). `accounts` (PostgreSQL): its share has every balance
    record and result, so it writes the per-account tables itself once its records are read
    (`_accounts_share`); else the parent writes them."""
    started = (f"loader {index}: running (process start, imports)", time.time() - origin)
    # Never collected: the process exits once its share is loaded. (Re-enabled at the end of the share, the
    # collector's first pass walked everything the share had kept, 8 ms before the parent heard from it.)
    gc.disable()
    sent = 0
    try:
        sink = SqliteSink(part) if part is not None else PgSink(target, work)
        try:
            def progress(n: int) -> None:
                counters[index] = n

            def read(state: Loaded) -> None:
                nonlocal sent
                if accounts:  # on its own connection while the other loaders go on
                    _write_accounts(sink.conn, state, lambda phase: mark(state, phase))
                sent = len(state.timeline)  # (the state is not changed after this, but for its timeline)
                # (its balances and holds are in the tables already when it wrote them: the parent needs
                # only the offsets and counts then)
                queue.put((index, "read", replace(state, timeline=[started, *state.timeline],
                                                  **({"balances": {}, "holds": {}} if accounts else {}))))

            def mark(state: Loaded, phase: str) -> None:
                state.timeline.append((f"loader {index}: {phase}", time.time() - origin))

            loaded = load(settings, keys, sink, progress, indexes, origin=origin, name=f"loader {index}",
                          read=read)
        finally:
            sink.close()
        queue.put((index, "done", loaded.timeline[sent:]))
    except BaseException as exc:  # reported to the parent, which raises it
        queue.put((index, "error", f"{type(exc).__name__}: {exc}"))
        raise


# --- the rebuild ------------------------------------------------------------------------------------------------
# How the work is split. History rows and result rows go to different tables, so a loader of history and a
# loader of results never write the same table: each builds its table whole, secondary indexes included,
# while the other works, and SQLite's merge copies a table into an empty one record by record in key order
# (its transfer optimisation) instead of inserting and indexing it row by row. Balance records only fill
# memory (the latest per account), so they go wherever they even out the loaders' work. Every key stays in one
# partition number (an account's entries and balances, a command's results), whichever way it is split.
# What a record costs a loader, relatively: read + decode + insert per record on one core, as the benchmark
# measures them apart (docs/read-side.md, Figures): a history record 2.4 + 19.4 + 13.5 µs, a result
# 2.4 + 12.5 + 4.5, a balance 2.4 + 5.9. (Weights of 17/11/10 left the history loader finishing 0.4-2 s
# after the other in every 2-loader rebuild.)
COST = {"history": 35, "results": 19, "balances": 8}


def _cost(keys: dict[Key, tuple[int, int]]) -> int:
    return sum(COST[t] * (until - start) for (t, _), (start, until) in keys.items())


def _partitions(keys: dict[Key, tuple[int, int]], n: int) -> list[dict[Key, tuple[int, int]]]:
    """Split into up to n shares of about equal cost, all topics of a partition number together."""
    sizes: dict[int, int] = defaultdict(int)
    for (t, p), (start, until) in keys.items():
        sizes[p] += COST[t] * (until - start)
    bins: list[tuple[int, list[int]]] = [(0, []) for _ in range(max(1, min(n, len(sizes) or 1)))]
    for p in sorted(sizes, key=lambda p: -sizes[p]):
        i = min(range(len(bins)), key=lambda i: bins[i][0])
        bins[i] = (bins[i][0] + sizes[p], bins[i][1] + [p])
    return [{k: v for k, v in keys.items() if k[1] in set(ps)} for _, ps in bins if ps]


def shares(keys: dict[Key, tuple[int, int]], workers: int) -> list[dict[Key, tuple[int, int]]]:
    """Split the work into up to `workers` shares: history and results apart, each by partition, with the
    balances spread to even out the cost; the costliest share first (it is loaded at once, in this process,
    while the others start)."""
    keys = {k: v for k, v in keys.items() if v[1] > v[0]}
    tables = {t: {k: v for k, v in keys.items() if k[0] == t} for t in ("history", "results")}
    live = sorted((t for t in tables if tables[t]), key=lambda t: -_cost(tables[t]))
    balances = {k: v for k, v in keys.items() if k[0] == "balances"}
    if workers < 2 or not live:
        return _partitions(keys, workers) or [{}]
    loaders = {t: 1 for t in live}
    for _ in range(workers - len(live)):  # each further loader to the table with the most work per loader
        loaders[max(live, key=lambda t: _cost(tables[t]) / loaders[t])] += 1
    split = [share for t in live for share in _partitions(tables[t], loaders[t])]
    costs = [_cost(share) for share in split]
    for k, (start, until) in sorted(balances.items(), key=lambda kv: kv[1][0] - kv[1][1]):  # biggest first
        i = min(range(len(split)), key=costs.__getitem__)
        split[i][k] = (start, until)
        costs[i] += COST["balances"] * (until - start)
    first = max(range(len(split)), key=costs.__getitem__)
    return [split[first]] + split[:first] + split[first + 1:]


TABLES = ("history", "transaction_links", "results")  # what loaders write (the rest is written at the end)


def _accounts_share(split: list[dict[Key, tuple[int, int]]]) -> int | None:
    """The share that has every balance record and every result, if one has (the usual split of two loaders:
    history in one, results and balances in the other), else None. The per-account tables come from those
    records only (balances from the balance records, holds from the results), so in PostgreSQL that share's
    loader writes them itself as soon as it has read its records, rather than the replaying process once
    every loader's state is in (often after its own indexes, one core idle meanwhile): whole rebuilds 2-5%
    faster (docs/read-side.md, "eighth session"). Not in SQLite: there its rows would be copied from the
    loader's file by the store's one writer, and measured so they saved nothing."""
    having = [i for i, share in enumerate(split) if any(t in ("balances", "results") for t, _ in share)]
    return having[0] if len(having) == 1 else None


def _tables(keys: dict[Key, tuple[int, int]]) -> list[str]:
    """The tables a share writes (balances are kept in memory until the end)."""
    tables = [t for t in ("history", "results") if any(k[0] == t for k in keys)]
    return tables + ["transaction_links"] if "history" in tables else tables


def indexes_of(tables: list[str], keys: list[str] = ()) -> str:
    """The secondary indexes (SCHEMA_INDEXES' statements) of these tables, after the primary keys of `keys`."""
    return "".join(f"{add_primary_key(t)};\n" for t in keys) + "".join(
        f"{st};\n" for st in SCHEMA_INDEXES.split(";\n") if any(f" ON {t} (" in st for t in tables))


def _cpu_ticks() -> tuple[int, int] | None:
    """(idle, total) CPU ticks of the machine so far (Linux's /proc/stat), None where unknown."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:9]]  # user nice system idle iowait irq softirq steal
        return ticks[3] + ticks[4], sum(ticks)
    except (OSError, ValueError):
        return None


class CoreSample:
    """How many cores are idle, from the CPU ticks between its creation and `idle_cores` (which waits for the
    rest of `least_s` if less has passed).

    Take it before the rebuild asks the broker for anything: overlapping the offsets query, it counted the
    query's own work (this process, and the broker when it shares the machine) as busy and saw about one core
    fewer than there was (2026-12-01, a quiet 2-core machine: 1.62 and 1.90 cores idle alone, 0.77 and 0.91
    overlapping the query), so rebuilds got one loader where two were 1.35-2.05x faster.

    This process's own CPU time during the sample counts as idle: it is the rebuild's own preparation (the
    loaders' codec, built while the sample runs instead of the sample only sleeping, `prepare`), not work the
    loaders would compete with."""

    def __init__(self, least_s: float = 0.1):
        self.started, self.ticks, self.least_s = time.monotonic(), _cpu_ticks(), least_s
        self.own = time.process_time()

    def idle_cores(self) -> float | None:
        time.sleep(max(0.0, self.started + self.least_s - time.monotonic()))
        now = _cpu_ticks()
        own = (time.process_time() - self.own) * os.sysconf("SC_CLK_TCK")  # in the kernel's ticks
        if self.ticks is None or now is None or now[1] <= self.ticks[1]:
            return None
        cores = os.cpu_count() or 1
        return min(cores, (now[0] - self.ticks[0] + own) / (now[1] - self.ticks[1]) * cores)


def prepare() -> None:
    """What every loader needs first, made once in this process before the loaders are forked (they inherit
    it): the codec, whose generated decoders take 80-100 ms to build. Built in each loader after the fork, it
    cost the first rebuild of a process 0.1-0.2 s of two cores (docs/read-side.md)."""
    codec()


def loaders(idle: float | None) -> int:
    """The default number of loaders given the idle cores (CoreSample): one per idle core (at least one). A
    loader without a core of its own only adds its start (a process, its imports) and the merge of its file:
    on the shared 2-core machine, with the cores busy, one loader rebuilt 300,000 records in 4.1-5.2 s and two
    in 4.5-8.3 s (docs/read-side.md)."""
    cores = os.cpu_count() or 1
    return cores if idle is None else max(1, min(cores, int(idle + 0.5)))


def start_method() -> str:
    """How loader processes start: forked when this process runs one thread, else spawned. A forked child
    starts in milliseconds with everything imported; a spawned one pays its interpreter and imports (0.3-0.5 s
    of CPU, while the first loader works). But a fork copies only the thread that forks: another thread's
    locks (librdkafka's, of a client still open in this process; a progress bar's) would stay held in the
    child for good, so with any other thread running (counted by the kernel: librdkafka's threads are not
    Python's) the child is spawned. `ledger replay` and the benchmark fork: their Kafka clients are closed
    (their threads joined) before the rebuild, and the progress bar refreshes from the loaders' progress
    instead of a thread of its own."""
    threads = 0
    # A thread just joined (a client just closed) can still be listed for a moment: the kernel wakes the
    # joining thread before it removes the exiting one's entry. So a second look, briefly, before spawning.
    for wait in (0.0, 0.002, 0.01):
        time.sleep(wait)
        try:
            threads = len(os.listdir("/proc/self/task"))
        except OSError:
            return "spawn"
        if threads == 1:
            break
    return "fork" if threads == 1 and "fork" in mp.get_all_start_methods() else "spawn"


def rebuild(settings: Settings, target: str, keys: dict[Key, tuple[int, int]], *, workers: int | None = None,
            progress: Callable[[int], None] | None = None, idle: float | None = None) -> Loaded:
    """Load the fresh store `target` from the partitions {(topic, partition): (start, until)}; returns the
    totals (applied, skipped, offsets). `workers` loader processes (default: one per idle core, `loaders`)."""
    origin = time.time()
    timeline: list[tuple[str, float]] = []

    def mark(phase: str) -> None:
        timeline.append((phase, time.time() - origin))

    sampled = ""
    if not workers:
        idle = CoreSample().idle_cores() if idle is None else idle
        workers = loaders(idle)
        sampled = f" ({'unknown' if idle is None else f'{idle:.2f}'} cores idle)"
    split = shares(keys, workers)
    mark(f"{len(split)} loader{'s' if len(split) > 1 else ''} asked for {workers}{sampled}")
    # A table only one share writes is indexed by that share's loader (in its file, or on its connection).
    writers = {t: [i for i, share in enumerate(split) if t in _tables(share)] for t in TABLES}
    indexed = [[t for t in _tables(share) if writers[t] == [i]] for i, share in enumerate(split)]
    postgres = db.is_postgres(target)
    # PostgreSQL: a table one loader copies gets its primary key after its rows (one sort, where a key present
    # while copying took a B-tree insert per row: 0.22-0.25 s of the server's CPU for 100,000 history rows
    # against 0.39-0.43, docs/read-side.md). The loader adds it before anything that writes by key.
    deferred = [t for t in PRIMARY_KEYS if len(writers[t]) == 1] if postgres else []
    loader_indexes = [indexes_of(tables, [t for t in tables if t in deferred]) for tables in indexed]
    accounts_by = _accounts_share(split) if postgres else None  # its loader writes the per-account tables
    prepare()  # before the loaders fork (a no-op when replay made it while it sampled the cores)
    tmp = tempfile.mkdtemp(prefix="ledger-rebuild-")
    main_path = None
    sink = conn = None
    method = start_method()
    ctx = mp.get_context(method)
    counters = ctx.Array("q", len(split))
    queue = ctx.Queue()
    work = IndexWork(ctx) if postgres and len(split) > 1 else None
    children = []
    parts: list[tuple[str, list[str]]] = []  # SQLite: (a loader's file, the tables indexed in it)

    def start_children() -> None:
        for i, share in enumerate(split[1:], start=1):
            part = None if postgres else os.path.join(tmp, f"part-{i}.db")
            if part:
                parts.append((part, indexed[i]))
            child = ctx.Process(target=_child, args=(settings, share, target, part, i, loader_indexes[i],
                                                     counters, queue, origin, work, accounts_by == i),
                                name=f"replay-loader-{i}", daemon=True)
            child.start()
            children.append(child)

    try:
        if postgres:  # the tables first: the loaders COPY into them
            conn = db.connect(target)
            db.create_tables(conn, tables_without_keys(deferred))
            start_children()
            sink = PgSink(target, work)
        else:  # the loaders first: a process takes long to start, and each has a file of its own
            start_children()
            main_path = f"{target}.partial-{uuid.uuid4().hex[:8]}"
            sink = SqliteSink(main_path)
            conn = sink.conn

        def report(n: int) -> None:
            counters[0] = n
            if progress is not None:
                progress(sum(counters[:]))

        mark(f"store created, loaders started ({method})" if children else "store created")
        states: dict[int, Loaded] = {}  # every loader's, once its records are read (the others send theirs)
        done: set[int] = set()
        total = None

        def receive(enough: Callable[[], bool], wait: bool = True) -> None:
            while not enough():
                try:
                    index, what, payload = queue.get(timeout=0.2) if wait else queue.get_nowait()
                except Empty:  # report progress, check the children are alive
                    if not wait:
                        return
                    if progress is not None:
                        progress(sum(counters[:]))
                    dead = [c for c in children if c.exitcode not in (None, 0)]
                    if dead:
                        raise RuntimeError(f"replay loader {dead[0].name} exited with {dead[0].exitcode}")
                    # A loader exits once its messages are in the pipe (its queue's feeder thread is joined
                    # first), so one that exited with none left to read lost its word (the feeder drops
                    # what it cannot pickle, printing only): waiting for it would never end.
                    silent = [c for i, c in enumerate(children, start=1) if c.exitcode == 0 and i not in done]
                    if silent and queue.empty():
                        raise RuntimeError(f"replay loader {silent[0].name} exited without reporting its share done")
                    continue
                if what == "error":
                    raise RuntimeError(f"replay loader {index}: {payload}")
                if what == "read":
                    states[index] = payload
                else:  # "done" (after its "read": one queue, in the order put)
                    states[index].timeline.extend(payload)
                    done.add(index)

        def write_accounts(wait: bool) -> None:
            """The per-account tables, from every loader's state (unless a loader writes them: accounts_by):
            at once if every state is here (or wait for them). Not after the last loader: there they took
            30-45 ms, one core idle (docs/read-side.md)."""
            nonlocal total
            receive(lambda: len(states) == len(split), wait)
            if total is None and len(states) == len(split):
                total = _merge([states[i] for i in range(len(split))])
                if not accounts_by:
                    _write_accounts(conn, total, mark)

        def read(state: Loaded) -> None:  # this process's share is read and written: before its indexes
            states[0] = state
            write_accounts(wait=False)

        # (SQLite: the share's transaction is still open when it is read; the tables after it commits)
        states[0] = load(settings, split[0], sink, report, loader_indexes[0], origin=origin,
                         read=read if postgres else None)
        write_accounts(wait=True)
        receive(lambda: len(done) == len(children))
        mark("every loader done")
        if postgres:
            sink.close()
        _finish(conn, settings, total, parts, indexes_of([t for t in TABLES if len(writers[t]) != 1]), mark)
        if not postgres:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.close()
            if os.path.exists(target):
                raise FileExistsError(f"{target} appeared during the rebuild")
            os.rename(main_path, target)
            main_path = None
        else:
            conn.close()
        mark("closed (SQLite: renamed to the target)")
        for child in children:  # each has handed its result over and is exiting (no need to wait for that earlier)
            child.join(10)
        total.loaders = len(split)
        total.timeline = sorted([*timeline, *(t for part in states.values() for t in part.timeline)],
                                key=itemgetter(1))
        return total
    finally:
        for child in children:
            if child.is_alive():
                child.kill()
        if main_path is not None and sink is not None:
            try:
                sink.close()
            except Exception:
                pass
            for suffix in ("", "-wal", "-shm"):
                Path(main_path + suffix).unlink(missing_ok=True)
        for part, _ in parts:
            Path(part).unlink(missing_ok=True)
        os.rmdir(tmp) if os.path.isdir(tmp) and not os.listdir(tmp) else None


def _merge(loaded: list[Loaded]) -> Loaded:
    """The loaders' states in one."""
    total = Loaded()
    for part_result in loaded:
        total.applied += part_result.applied
        total.skipped += part_result.skipped
        total.offsets.update(part_result.offsets)
        total.balances.update(part_result.balances)  # accounts are partition-local: no key in two shares
        for hold_id, h in part_result.holds.items():
            total.holds[hold_id] = newer_hold(total.holds.get(hold_id), h)
        total.refold |= part_result.refold
    return total


VERSION = 1  # the batch version a rebuild's rows carry


def _write_accounts(conn, total: Loaded, mark: Callable[[str], None]) -> None:
    """The tables written from the loaders' states: balance rows, views, currency sums, holds; their indexes."""
    accounts, sums = [], defaultdict(int)
    groups: dict[str, list[dict]] = defaultdict(list)
    for account_id, v in sorted(total.balances.items()):
        base = routing.unsharded(account_id)
        accounts.append((account_id, base, v["currency"], v["status"], v["posted"], v["held"], v["available"],
                         v["seq"], v["last_transaction_id"], v["updated_at_ms"], VERSION, v.get("account_type")))
        sums[v["currency"]] += int(v["posted"])
        groups[base].append(v)
    views = []
    for base, rows in sorted(groups.items()):
        view = sum_shards(rows)
        since = view["updated_at_ms"] if view["posted"] != 0 else None
        views.append((base, view["currency"], view["status"], str(view["posted"]), str(view["held"]),
                      str(view["available"]), view["seq"], view["shards"], view["last_transaction_id"],
                      view["updated_at_ms"], since, VERSION))
    holds = [tuple(h[c] if c != "hold_id" else hold_id for c in HOLD_COLUMNS)
             for hold_id, h in sorted(total.holds.items())]
    tables = (("accounts", REPLACE_ACCOUNT, ACCOUNT_COLUMNS, accounts),
              ("account_views", REPLACE_VIEW, VIEW_COLUMNS, views),
              ("currency_sums", REPLACE_SUM, ("currency", "posted"), [(c, str(s)) for c, s in sorted(sums.items())]),
              ("holds", REPLACE_HOLD, HOLD_COLUMNS, holds))
    with db.transaction(conn):
        for table, upsert, columns, rows in tables:
            if conn.postgres:  # empty tables, one row per key: COPY (a statement per row took 0.26 s for 4,000)
                conn.copy_rows(table, columns, rows, db.copy_types(SCHEMA_TABLES, table, columns))
            else:
                conn.executemany(upsert, rows)
    db.create_tables(conn, indexes_of([table for table, *_ in tables]))
    mark(f"{len(accounts)} balance rows, {len(views)} views, {len(holds)} holds written and indexed")


def _finish(conn, settings: Settings, total: Loaded, parts: list[tuple[str, list[str]]], indexes: str,
            mark: Callable[[str], None]) -> None:
    """Once every loader is done: merge the loaders' SQLite files; build `indexes` (those of the tables several
    loaders wrote, or of none); then write the offsets and the version."""
    for part, indexed in parts:  # SQLite: the other loaders' files, copied by SQLite itself
        conn.execute("ATTACH DATABASE ? AS part", (part,))
        for table in TABLES:
            if conn.execute(f"SELECT 1 FROM part.{table} LIMIT 1").fetchone() is None:
                if table in indexed:  # its loader's indexes, of a table that stays empty
                    db.create_tables(conn, indexes_of([table]))
                continue
            if table in indexed and conn.execute(f"SELECT 1 FROM main.{table} LIMIT 1").fetchone() is None:
                # Into an empty table with the same indexes as the file's: SQLite copies the table and its
                # indexes record by record in key order (the transfer optimisation: no decoding, no sort).
                db.create_tables(conn, indexes_of([table]))
                conn.execute(f"INSERT INTO main.{table} SELECT * FROM part.{table}")
            else:  # keys are partition-local, so never in two shares; were one there, the first share's stays
                conn.execute(f"INSERT INTO main.{table} SELECT * FROM part.{table} WHERE true "
                             "ON CONFLICT DO NOTHING")
        conn.execute("DETACH DATABASE part")
    mark("loaders' files merged")
    if indexes:
        db.create_tables(conn, indexes)
        mark("secondary indexes of the tables several loaders wrote built")
    # Last: a store with offsets is complete (an interrupted rebuild leaves none).
    with db.transaction(conn):
        conn.execute(REPLACE_META, ("prefix", settings.prefix))
        conn.execute(REPLACE_META, ("version", str(VERSION)))
        conn.executemany(ADVANCE_OFFSET, [(t, p, o) for (t, p), o in sorted(total.offsets.items())])
    mark("offsets and version written")
