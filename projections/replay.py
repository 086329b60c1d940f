"""Replay: rebuild a read store from the topics and prove it equals the live one (`ledger replay`, P7).

A rebuild starts from offset 0 (or given offsets, or the offsets of a timestamp) and stops at fixed end
offsets, so the result is a function of a fixed prefix of the log. To compare with a live store that keeps
moving, replay first reads the live store's offsets and digests in one read transaction (one snapshot:
rows and offsets of the same instant), then rebuilds up to exactly those offsets and compares canonical
hashes. The hash covers every table readers read (balance rows, account views, currency sums, history,
transaction links, results, holds; `projections.store.HASHED` says which columns and why the bookkeeping is
left out). On a mismatch it names the first difference: an account, a currency, a link, a command's result
or a hold. The stores
may be SQLite or PostgreSQL, even one of each: the hash covers values, not the database.

Caveat: balances is a compacted topic. Compaction only removes a record after a newer one of the same key
(min.compaction.lag.ms 60 s), so a rebuild reaching the live offsets sees the same latest rows, unless the
newer record lies beyond the live offsets; the comparison then names that account. Compare a caught-up store.
"""
from __future__ import annotations

import tempfile
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from projections import bulk, db
from projections.projector import Projector, TopicPartitionKey
from projections.store import TOPICS, DigestKey, Store, digests, digests_hash, first_difference, projection_hash
from streams.config import Settings


@dataclass(frozen=True, slots=True)
class ReplayResult:
    records: int
    seconds: float
    hash: str
    offsets: dict[TopicPartitionKey, int]
    timeline: tuple[tuple[str, float], ...] = ()  # a bulk rebuild's phases: (what ended, seconds since start)
    loaders: int = 1  # a bulk rebuild's loader processes

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds if self.seconds else 0.0


@dataclass(frozen=True, slots=True)
class Comparison:
    live_hash: str
    rebuilt_hash: str
    first_difference: DigestKey | None  # (account, currency, link, result or hold; its id), None when equal

    @property
    def equal(self) -> bool:
        return self.live_hash == self.rebuilt_hash


def _consumer(settings: Settings) -> Consumer:
    return Consumer({**settings.kafka_config(), "group.id": f"replay-{uuid.uuid4()}", "enable.auto.commit": False,
                     "isolation.level": "read_committed"})


def watermarks(settings: Settings) -> dict[TopicPartitionKey, tuple[int, int]]:
    """(low, high) of every partition of the read topics."""
    consumer = _consumer(settings)
    try:
        return {(t, p): consumer.get_watermark_offsets(TopicPartition(settings.topic(t), p), timeout=10)
                for t in TOPICS for p in range(settings.partitions)}
    finally:
        consumer.close()


def offsets_for_time(settings: Settings, at_ms: int) -> dict[TopicPartitionKey, int]:
    """The first offset at or after a timestamp per partition (the end when there is none)."""
    consumer = _consumer(settings)
    try:
        query = [TopicPartition(settings.topic(t), p, at_ms) for t in TOPICS for p in range(settings.partitions)]
        found = consumer.offsets_for_times(query, timeout=10)
        names = {settings.topic(t): t for t in TOPICS}
        result = {}
        for tp in found:
            key = (names[tp.topic], tp.partition)
            # -1: no record at or after the time, so start at the end (nothing to replay there).
            result[key] = tp.offset if tp.offset >= 0 else consumer.get_watermark_offsets(
                TopicPartition(tp.topic, tp.partition), timeout=10)[1]
        return result
    finally:
        consumer.close()


def parse_time_ms(text: str) -> int:
    """Milliseconds since the epoch, or an ISO 8601 time (naive times are UTC)."""
    if text.lstrip("-").isdigit():
        return int(text)
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        from datetime import timezone
        moment = moment.replace(tzinfo=timezone.utc)
    return int(moment.timestamp() * 1000)


def parse_offsets(text: str) -> dict[TopicPartitionKey, int]:
    """`history:0=120,history:1=98,balances:*=0` -> start offsets (unnamed partitions start at 0)."""
    result: dict[TopicPartitionKey, int] = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        where, _, offset = item.partition("=")
        topic, _, partition = where.partition(":")
        if topic not in TOPICS or not offset.isdigit():
            raise ValueError(f"bad offset {item!r}: want topic:partition=offset with topic in {TOPICS}")
        parts = range(64) if partition == "*" else [int(partition)]
        for p in parts:
            result[(topic, p)] = int(offset)
    return result


def rebuild(settings: Settings, target: str | Path, *, start: dict[TopicPartitionKey, int] | None = None,
            until: dict[TopicPartitionKey, int] | None = None, progress: bool = True,
            batch_size: int = 10000, workers: int | None = None, incremental: bool = False) -> ReplayResult:
    """Project the topics into a fresh store, from `start` (default: the beginning) up to `until`
    (default: the end offsets now). The store must not exist (no SQLite file, no tables in the PostgreSQL
    schema): a rebuild never mixes with old rows. By default the bulk loader (projections/bulk.py, `workers`
    processes, default one per idle core); incremental=True applies batches as the projector does (the slow
    path the bulk loader is checked against)."""
    if db.exists(target):
        raise FileExistsError(f"{db.display(target)} exists; a replay writes a fresh store")
    # Idle cores (for the number of loaders) before asking the broker for anything (bulk.CoreSample says why);
    # the loaders' codec is built while the cores are sampled.
    idle = None
    if not incremental and not workers:
        sample = bulk.CoreSample()
        bulk.prepare()
        idle = sample.idle_cores()
    marks = watermarks(settings)
    until = {k: high for k, (_, high) in marks.items()} if until is None else until
    begin = {k: max(low, (start or {}).get(k, 0)) for k, (low, _) in marks.items()}
    total = sum(max(until.get(k, 0) - begin[k], 0) for k in marks)
    if not incremental:
        return _bulk(settings, str(target), {k: (begin[k], until.get(k, 0)) for k in marks}, total, progress,
                     workers, idle)
    store = Store(target, settings.prefix)
    projector = Projector(settings, store, start={k: begin[k] for k in marks}, until=until, batch_size=batch_size)
    t0 = time.perf_counter()
    try:
        bar = _bar(progress)
        with bar:
            task = bar.add_task("replay", total=total or 1)
            done = 0
            while not projector.reached(until):
                projector.step(timeout_s=0.1)
                pos = projector.positions()
                now = sum(max(min(pos.get(k, begin[k]), until.get(k, 0)) - begin[k], 0) for k in marks)
                bar.update(task, advance=now - done)
                done = now
        seconds = time.perf_counter() - t0
        return ReplayResult(projector.progress.applied, seconds, projection_hash(store.conn), store.offsets())
    finally:
        projector.close()
        store.close()


def _bulk(settings: Settings, target: str, keys: dict[TopicPartitionKey, tuple[int, int]], total: int,
          progress: bool, workers: int | None, idle: float | None = None) -> ReplayResult:
    t0 = time.perf_counter()
    with _bar(progress) as bar:
        task = bar.add_task("replay", total=total or 1)
        loaded = bulk.rebuild(settings, target, keys, workers=workers, idle=idle,
                              progress=lambda n: bar.update(task, completed=n, refresh=True))
    seconds = time.perf_counter() - t0
    store = Store(target, readonly=True)
    try:
        return ReplayResult(loaded.applied, seconds, projection_hash(store.conn), store.offsets(),
                            tuple(loaded.timeline), loaded.loaders)
    finally:
        store.close()


def _bar(enabled: bool):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    # Refreshed by the updates, not by a thread of its own: with no other thread running, the loaders fork
    # (bulk.start_method).
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeRemainingColumn(), disable=not enabled, auto_refresh=False)


def snapshot(live: str | Path) -> tuple[dict[TopicPartitionKey, int], dict[DigestKey, str]]:
    """The offsets and digests of a live store at one instant (one read transaction), while the
    projector goes on writing."""
    store = Store(live, readonly=True)
    try:
        with db.transaction(store.conn, snapshot=True):
            return store.offsets(), dict(digests(store.conn))
    finally:
        store.close()


def compare(live: dict[DigestKey, str], rebuilt: str | Path) -> Comparison:
    """The live digests (from `snapshot`) against a rebuilt store."""
    store = Store(rebuilt, readonly=True)
    try:
        ours = dict(digests(store.conn))
    finally:
        store.close()
    live_hash, rebuilt_hash = digests_hash(sorted(live.items())), digests_hash(sorted(ours.items()))
    return Comparison(live_hash, rebuilt_hash, None if live_hash == rebuilt_hash else first_difference(live, ours))


def replay_against(settings: Settings, live: str | Path, into: str | Path,
                   progress: bool = True) -> tuple[ReplayResult, Comparison]:
    """Rebuild from offset 0 up to a snapshot of the live store's offsets and compare the two."""
    offsets, digests = snapshot(live)
    # A partition the live store never read is at 0 there: the rebuild reads nothing from it either.
    until = {(t, p): offsets.get((t, p), 0) for t in TOPICS for p in range(settings.partitions)}
    result = rebuild(settings, into, until=until, progress=progress)
    return result, compare(digests, into)


def raw_consume_rate(settings: Settings) -> tuple[int, float]:
    """(records, seconds) for a bare confluent-kafka consumer reading the read topics to their ends:
    the ceiling a replay is measured against, in the same run on the same machine."""
    marks = watermarks(settings)
    consumer = Consumer(bulk.reading_config(settings, f"raw-{uuid.uuid4()}"))
    remaining = {settings.topic(t) + f"/{p}": high for (t, p), (low, high) in marks.items() if high > low}
    consumer.assign([TopicPartition(settings.topic(t), p, low) for (t, p), (low, high) in marks.items()
                     if high > low])
    count = 0
    total = sum(high - low for low, high in marks.values())
    t0 = time.perf_counter()
    try:
        while remaining:
            # No more than are left (as a loader asks): consume() waits out its timeout for a batch it cannot
            # fill, which added 0.5 s to every read whose count was not a multiple of the batch.
            for msg in consumer.consume(max(1, min(10000, total - count)), timeout=0.1):
                if msg.error():
                    continue
                count += 1
                key = f"{msg.topic()}/{msg.partition()}"
                if msg.offset() + 1 >= remaining.get(key, 0):
                    remaining.pop(key, None)
        return count, time.perf_counter() - t0
    finally:
        consumer.close()


def run_cli(settings: Settings, into: str | None, against: str | None, from_offsets: str | None,
            from_time: str | None, progress: bool = True) -> int:
    """`ledger replay`: 0 when the rebuilt projection equals the live one (or no comparison was asked),
    1 on a mismatch (naming the first difference), 2 on bad arguments."""
    from rich.console import Console

    console = Console(stderr=True)
    if into is None:
        # Next to a PostgreSQL live store: a new schema of the same database; else a temporary SQLite file.
        into = (db.with_schema(against, f"replay_{time.strftime('%Y%m%d_%H%M%S')}_{uuid.uuid4().hex[:4]}")
                if against and db.is_postgres(against) else
                str(Path(tempfile.mkdtemp(prefix="ledger-replay-")) / "rebuilt.db"))
    if db.exists(into):
        console.print(f"[red]error:[/] {db.display(into)} exists; give a fresh store (a new path, or a new schema)")
        return 2
    start = None
    try:
        if from_offsets:
            start = parse_offsets(from_offsets)
        if from_time:
            start = offsets_for_time(settings, parse_time_ms(from_time))
    except ValueError as exc:
        console.print(f"[red]error:[/] {exc}")
        return 2
    if against and start is not None:
        console.print("[red]error:[/] a comparison needs a rebuild from the beginning (no --from-*)")
        return 2
    if against:
        result, cmp = replay_against(settings, against, into, progress)
    else:
        result, cmp = rebuild(settings, into, start=start, progress=progress), None
    console.print(f"rebuilt {db.display(into)}: {result.records} records in {result.seconds:.2f} s "
                  f"({result.records_per_s:,.0f} rec/s)")
    console.print(f"hash {result.hash}")
    if cmp is None:
        return 0
    if cmp.equal:
        console.print(f"[green]OK[/]: rebuilt projection equals {db.display(against)} ({cmp.live_hash})")
        return 0
    console.print(f"[red]MISMATCH[/]: live {cmp.live_hash} != rebuilt {cmp.rebuilt_hash}; "
                  "first differing {}: {}".format(*cmp.first_difference))
    return 1
