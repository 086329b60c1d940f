"""Rebuilding a fresh read store at the speed of the log (`ledger replay`): partitions in parallel, rows in bulk.

The projector (projections/projector.py) applies small batches to a live store: one transaction per batch,
reading back what each batch touches. A rebuild writes a *fresh* store up to fixed end offsets, so it can do
less, and do it in several processes:

1. The partitions are split into shares, one per loader process (the first share is loaded in this
   process). Every key is partition-local: history is keyed by account, results by command, balances by
   account, so a share's rows never collide with another share's.
2. A loader consumes its partitions to the end offsets, decodes each record once, and keeps in memory only
   what is small: per account the seq ranges seen (a re-emitted entry is dropped there, exactly as the
   store's `ON CONFLICT DO NOTHING` would), the running folds by time (`fold.by_time`) and the latest balance
   record; the most settled state of each hold. History and result rows go out in bulk: SQLite into a file
   of the loader's own (no lock shared with anyone), PostgreSQL by COPY into the store's tables (one
   connection per loader, the server working on them side by side).
   A result whose key was seen before in the share (a retry answered again and not marked duplicate) is
   kept aside and applied at the end with the projector's statements, in log order: the row kept is the
   one the projector keeps (the last decision, never an id_conflict over a decision).
3. At the end this process merges the loaders' SQLite files (INSERT ... SELECT, no Python per row),
   recomputes the folds by time of the accounts whose entries came out of order, and writes in one
   transaction what is per account (balance rows, summed views, currency sums), the holds, the offsets and
   the store version; then it builds the secondary indexes (one sort each instead of an update per row).

The result is the store the projector builds from the same records (replay's hash proves it; so do the
tests, which compare a rebuild with a store caught up batch by batch). What is not the same is how it gets
there, so an interrupted rebuild is not resumed: a SQLite rebuild is written to `<target>.partial-*`
(journal off: nothing to recover) and renamed to the target when complete; an interrupted PostgreSQL rebuild
leaves a schema with no offsets, which a projector would fill from offset 0 (re-applying is harmless), or
which is dropped.
"""
from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
import sqlite3
import tempfile
import time
import uuid
import zlib
from bisect import bisect_right
from collections import defaultdict
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path
from typing import Any, Callable

from confluent_kafka import Consumer, TopicPartition

from projections import db
from projections.fold import extend_by_time, newer_hold, sum_shards
from projections.store import (ADVANCE_OFFSET, HISTORY_COLUMNS, HISTORY_FIELDS, HOLD_COLUMNS, KEEP_RESULT,
                               REPLACE_ACCOUNT, REPLACE_HOLD, REPLACE_META, REPLACE_RESULT, REPLACE_SUM,
                               REPLACE_VIEW, RESULT_COLUMNS, SCHEMA_INDEXES, SCHEMA_TABLES, history_detail,
                               index_links, refold_by_time)
from schemas.codec import DecodeError, codec
from streams import routing
from streams.config import Settings
from streams.core.rejections import NOT_A_DECISION

log = logging.getLogger("ledger.replay")

Key = tuple[str, int]  # (logical topic, partition)
SCHEMA_OF = {"balances": "balance", "history": "history", "results": "result"}
CONSUME_BATCH = 10_000
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


# --- sinks: where a loader's history and result rows go ----------------------------------------------------
class SqliteSink:
    """A SQLite file with the store's tables, written without a journal (a rebuild is thrown away, not
    recovered, when interrupted)."""

    def __init__(self, path: str, create: bool = True):
        self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False,
                                    factory=db.SqliteConnection)
        self.conn.row_factory = sqlite3.Row
        for pragma in ("journal_mode=OFF", "synchronous=OFF", "cache_size=-65536", "temp_store=MEMORY"):
            self.conn.execute(f"PRAGMA {pragma}")
        if create:
            db.create_tables(self.conn, SCHEMA_TABLES)
        # One transaction for the whole share: in autocommit every row of an executemany is a transaction of
        # its own (four times the cost of the insert itself). Nothing is lost by it: an interrupted rebuild
        # is thrown away, not recovered.
        self.conn.execute("BEGIN")

    def history(self, rows: list[tuple]) -> None:
        self.conn.executemany(INSERT_HISTORY_ROWS, rows)

    def results(self, rows: list[tuple]) -> None:
        self.conn.executemany(INSERT_RESULT_ROWS, rows)

    def finish(self, late_results: list[tuple[bool, tuple]], refold: set[str], merged_later: bool) -> None:
        for conflict, row in late_results:
            self.conn.execute(KEEP_RESULT if conflict else REPLACE_RESULT, row)
        if not merged_later:
            refold_by_time(self.conn, sorted(refold))
        self.conn.execute("COMMIT")

    def close(self) -> None:
        self.conn.close()


class PgSink:
    """COPY into the store's tables in PostgreSQL (a connection per loader)."""

    HISTORY_TYPES = db.copy_types(SCHEMA_TABLES, "history", HISTORY_COLUMNS)
    RESULT_TYPES = db.copy_types(SCHEMA_TABLES, "results", RESULT_COLUMNS)

    def __init__(self, target: str):
        self.conn = db.connect(target)

    def history(self, rows: list[tuple]) -> None:
        self.conn.copy_rows("history", HISTORY_COLUMNS, rows, self.HISTORY_TYPES)

    def results(self, rows: list[tuple]) -> None:
        self.conn.copy_rows("results", RESULT_COLUMNS, rows, self.RESULT_TYPES)

    def finish(self, late_results: list[tuple[bool, tuple]], refold: set[str], merged_later: bool) -> None:
        with db.transaction(self.conn):
            for conflict, row in late_results:
                self.conn.execute(KEEP_RESULT if conflict else REPLACE_RESULT, row)
            refold_by_time(self.conn, sorted(refold))

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


def load(settings: Settings, keys: dict[Key, tuple[int, int]], sink, progress: Callable[[int], None],
         merged_later: bool) -> Loaded:
    """Consume keys {(topic, partition): (start, until)} into the sink; returns the small state."""
    out = Loaded()
    c = codec()
    names = {settings.topic(t): t for t in SCHEMA_OF}
    # Per topic: its name, the header of its current schema and that schema's generated decoder. A record
    # with that header is decoded here directly; any other (an older version, a foreign or corrupt one)
    # goes through codec.decode, which resolves it or says why not.
    fast = {settings.topic(t): (t, c.header(SCHEMA_OF[t]), c.body_decoder(SCHEMA_OF[t])) for t in SCHEMA_OF}
    consumer = Consumer({**settings.kafka_config(), "group.id": f"replay-{uuid.uuid4()}", "enable.auto.commit": False,
                         "enable.auto.offset.store": False, "isolation.level": "read_committed",
                         "fetch.max.bytes": 64 * 1024 * 1024, "queued.max.messages.kbytes": 256 * 1024})
    remaining = {k: until for k, (start, until) in keys.items() if until > start}
    try:
        if remaining:
            consumer.assign([TopicPartition(settings.topic(t), p, keys[(t, p)][0]) for t, p in remaining])
        seen: dict[str, list] = {}  # account -> [seq ranges, its prefix folds by time (fold.Tail)]
        refold = out.refold
        result_keys: set[int] = set()
        late_results: list[tuple[bool, tuple]] = []
        balances, holds, offsets = out.balances, out.holds, out.offsets
        decode = c.decode
        done = 0
        while remaining:
            history_rows, result_rows = [], []
            messages = consumer.consume(CONSUME_BATCH, timeout=0.5)
            for msg in messages:
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
                out.applied += 1
                if topic == "history":
                    account, seq = v["account_id"], v["seq"]
                    state = seen.get(account)
                    if state is None:
                        tail = extend_by_time(None, v)
                        seen[account] = [[[seq, seq]], tail]
                        history_rows.append(history_row(v, tail[2], v["held_after"]))
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
                            continue
                    elif _contains(ranges, seq):
                        continue  # a re-emitted entry: the store keeps the first
                    else:
                        _add(ranges, seq)
                    refold.add(account)  # out of order: its folds by time are recomputed at the end
                    history_rows.append(history_row(v, "0", "0"))
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
            if result_rows:
                sink.results(result_rows)
            done += len(messages)
            progress(done)
            # Done with a partition at its end offset, or when only control records (transaction markers)
            # are left before it: the consumer's position says so.
            finished = [k for k, until in remaining.items() if offsets.get(k, 0) >= until]
            if not messages or len(finished) < len(remaining):
                positions = consumer.position([TopicPartition(settings.topic(t), p) for t, p in remaining])
                finished += [(names[tp.topic], tp.partition) for tp in positions
                             if tp.offset >= remaining[(names[tp.topic], tp.partition)]]
            finished = set(finished)
            if finished:
                consumer.incremental_unassign([TopicPartition(settings.topic(t), p) for t, p in finished])
                for k in finished:
                    remaining.pop(k, None)
        sink.finish(late_results, refold, merged_later)
        return out
    finally:
        consumer.close()


def _child(settings: Settings, keys: dict[Key, tuple[int, int]], target: str, part: str | None, index: int,
           counters, queue) -> None:
    """A loader process: its share into its own SQLite file (part) or into the PostgreSQL store."""
    try:
        sink = SqliteSink(part) if part is not None else PgSink(target)
        try:
            def progress(n: int) -> None:
                counters[index] = n

            queue.put((index, load(settings, keys, sink, progress, merged_later=part is not None), None))
        finally:
            sink.close()
    except BaseException as exc:  # reported to the parent, which raises it
        queue.put((index, None, f"{type(exc).__name__}: {exc}"))
        raise


# --- the rebuild ------------------------------------------------------------------------------------------------
def shares(keys: dict[Key, tuple[int, int]], workers: int) -> list[dict[Key, tuple[int, int]]]:
    """Split the partitions into up to `workers` shares of about equal record counts (all topics of a
    partition number together)."""
    sizes: dict[int, int] = defaultdict(int)
    for (t, p), (start, until) in keys.items():
        sizes[p] += max(until - start, 0)
    bins: list[tuple[int, list[int]]] = [(0, []) for _ in range(max(1, min(workers, len(sizes) or 1)))]
    for p in sorted(sizes, key=lambda p: -sizes[p]):
        i = min(range(len(bins)), key=lambda i: bins[i][0])
        bins[i] = (bins[i][0] + sizes[p], bins[i][1] + [p])
    return [{k: v for k, v in keys.items() if k[1] in set(ps)} for _, ps in bins if ps] or [{}]


def rebuild(settings: Settings, target: str, keys: dict[Key, tuple[int, int]], *, workers: int | None = None,
            progress: Callable[[int], None] | None = None) -> Loaded:
    """Load the fresh store `target` from the partitions {(topic, partition): (start, until)}; returns the
    totals (applied, skipped, offsets). `workers` loader processes (default: the CPU count)."""
    workers = workers or os.cpu_count() or 1
    split = shares(keys, workers)
    postgres = db.is_postgres(target)
    tmp = tempfile.mkdtemp(prefix="ledger-rebuild-")
    main_path = None
    if postgres:
        conn = db.connect(target)
        db.create_tables(conn, SCHEMA_TABLES)
        sink = PgSink(target)
    else:
        main_path = f"{target}.partial-{uuid.uuid4().hex[:8]}"
        sink = SqliteSink(main_path)
        conn = sink.conn
    ctx = mp.get_context("spawn")  # librdkafka's threads do not survive a fork
    counters = ctx.Array("q", len(split))
    queue = ctx.Queue()
    children = []
    parts: list[str] = []
    try:
        for i, share in enumerate(split[1:], start=1):
            part = None if postgres else os.path.join(tmp, f"part-{i}.db")
            if part:
                parts.append(part)
            child = ctx.Process(target=_child, args=(settings, share, target, part, i, counters, queue),
                                name=f"replay-loader-{i}", daemon=True)
            child.start()
            children.append(child)

        def report(n: int) -> None:
            counters[0] = n
            if progress is not None:
                progress(sum(counters[:]))

        loaded = [load(settings, split[0], sink, report, merged_later=not postgres)]
        pending = len(children)
        while pending:
            try:
                index, result, error = queue.get(timeout=0.2)
            except Exception:  # queue.Empty: report progress, check the children are alive
                if progress is not None:
                    progress(sum(counters[:]))
                dead = [c for c in children if c.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(f"replay loader {dead[0].name} exited with {dead[0].exitcode}")
                continue
            if error is not None:
                raise RuntimeError(f"replay loader {index}: {error}")
            loaded.append(result)
            pending -= 1
        for child in children:
            child.join(10)
        if postgres:
            sink.close()
        total = _finish(conn, settings, loaded, parts)
        if not postgres:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.close()
            if os.path.exists(target):
                raise FileExistsError(f"{target} appeared during the rebuild")
            os.rename(main_path, target)
            main_path = None
        else:
            conn.close()
        return total
    finally:
        for child in children:
            if child.is_alive():
                child.kill()
        if main_path is not None:
            try:
                sink.close()
            except Exception:
                pass
            for suffix in ("", "-wal", "-shm"):
                Path(main_path + suffix).unlink(missing_ok=True)
        for part in parts:
            Path(part).unlink(missing_ok=True)
        os.rmdir(tmp) if os.path.isdir(tmp) and not os.listdir(tmp) else None


def _finish(conn, settings: Settings, loaded: list[Loaded], parts: list[str]) -> Loaded:
    """Merge the loaders' rows and state; write the per-account tables, holds, offsets, version; index."""
    total = Loaded()
    refold: set[str] = set()
    for part_result in loaded:
        total.applied += part_result.applied
        total.skipped += part_result.skipped
        total.offsets.update(part_result.offsets)
        total.balances.update(part_result.balances)  # accounts are partition-local: no key in two shares
        for hold_id, h in part_result.holds.items():
            total.holds[hold_id] = newer_hold(total.holds.get(hold_id), h)
        refold |= part_result.refold
    for part in parts:  # SQLite: the other loaders' files, copied by SQLite itself
        conn.execute("ATTACH DATABASE ? AS part", (part,))
        conn.execute("INSERT INTO history SELECT * FROM part.history WHERE true ON CONFLICT DO NOTHING")
        conn.execute("INSERT INTO results SELECT * FROM part.results WHERE true ON CONFLICT DO NOTHING")
        conn.execute("DETACH DATABASE part")
    if not conn.postgres:
        with db.transaction(conn):
            refold_by_time(conn, sorted(refold))
    with db.transaction(conn):
        index_links(conn)
    version = 1
    accounts, sums = [], defaultdict(int)
    groups: dict[str, list[dict]] = defaultdict(list)
    for account_id, v in sorted(total.balances.items()):
        base = routing.unsharded(account_id)
        accounts.append((account_id, base, v["currency"], v["status"], v["posted"], v["held"], v["available"],
                         v["seq"], v["last_transaction_id"], v["updated_at_ms"], version, v.get("account_type")))
        sums[v["currency"]] += int(v["posted"])
        groups[base].append(v)
    views = []
    for base, rows in sorted(groups.items()):
        view = sum_shards(rows)
        since = view["updated_at_ms"] if view["posted"] != 0 else None
        views.append((base, view["currency"], view["status"], str(view["posted"]), str(view["held"]),
                      str(view["available"]), view["seq"], view["shards"], view["last_transaction_id"],
                      view["updated_at_ms"], since, version))
    holds = [tuple(h[c] if c != "hold_id" else hold_id for c in HOLD_COLUMNS)
             for hold_id, h in sorted(total.holds.items())]
    with db.transaction(conn):
        conn.execute(REPLACE_META, ("prefix", settings.prefix))
        conn.execute(REPLACE_META, ("version", str(version)))
        conn.executemany(REPLACE_ACCOUNT, accounts)
        conn.executemany(REPLACE_VIEW, views)
        conn.executemany(REPLACE_SUM, [(c, str(s)) for c, s in sorted(sums.items())])
        conn.executemany(REPLACE_HOLD, holds)
        conn.executemany(ADVANCE_OFFSET, [(t, p, o) for (t, p), o in sorted(total.offsets.items())])
    db.create_tables(conn, SCHEMA_INDEXES)
    return total
