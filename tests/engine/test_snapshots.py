"""Snapshots: a worker that lost its local state restores the latest snapshot of each partition and replays only
the changelog's tail after it (streams/snapshot.py, streams/engine.py); a forged or torn snapshot is refused."""
from __future__ import annotations

import random
import re
import shutil
import struct

import pytest
from confluent_kafka import Producer

from connectors.client import LedgerClient
from connectors.loadgen import LoadGenerator, Mix
from streams import snapshot
from streams.store import RocksStore
from tests.harness import assert_books_ok, assert_exactly_once, changelog_ends

LOADED = re.compile(r"partition (\d+): loaded the snapshot at changelog offset (\d+)")
RESTORED = re.compile(r"partition (\d+) restored: (\d+) changelog records from offset (\d+)")


# --- the encoding, no broker -----------------------------------------------------------------------------------
def _pairs(n: int, suffix: bytes = b"") -> list[tuple[bytes, bytes]]:
    # Values that do not compress: the table file compresses its blocks, and the test wants several chunks.
    return [(f"a/{i:06d}".encode(), random.Random(i).randbytes(i % 700) + suffix) for i in range(n)]


def _table(tmp_path, pairs, name: str = "t") -> tuple[snapshot.Manifest, list[bytes]]:
    """A store holding `pairs` and the engine's m/ bookkeeping, written as a snapshot's table file and chunks."""
    store = RocksStore(tmp_path / f"store-{name}")
    store.write({**dict(pairs), b"m/changelog": b"12", b"m/covered": b"7"}, set())
    count = store.export_table(tmp_path / f"{name}.sst", skip=snapshot.META_PREFIX)
    store.close()
    digest = snapshot.Digest()
    chunks = [digest.add(c) for c in snapshot.file_chunks(tmp_path / f"{name}.sst")]
    return snapshot.Manifest(40, 33, digest.chunks, count, digest.hexdigest(), first_offset=0), chunks


def _received(tmp_path, manifest, numbered: list[tuple[int, bytes]]) -> list[tuple[bytes, bytes]]:
    """What a restore does with a table snapshot's chunks: write them as they come, verify, ingest."""
    table = snapshot.TableWriter(snapshot.Manifest.decode(manifest.encode()), tmp_path / "in.sst")
    try:
        for n, chunk in numbered:
            table.add(n, chunk)
        store = RocksStore(tmp_path / "restored")
        store.ingest_table(table.verify())
        return list(store.scan(b""))
    finally:
        table.discard()


def test_a_snapshot_reads_back_the_store_without_the_engine_bookkeeping(tmp_path):
    manifest, chunks = _table(tmp_path, _pairs(5000))
    assert manifest.chunks == len(chunks) > 1, "a store larger than one chunk is split"
    assert all(len(c) <= snapshot.CHUNK_BYTES for c in chunks)
    assert (manifest.changelog_offset, manifest.covered, manifest.pairs) == (40, 33, 5000)
    assert _received(tmp_path, manifest, list(enumerate(chunks))) == sorted(_pairs(5000))


@pytest.mark.parametrize("damage", ["missing chunk", "changed byte", "chunk of another snapshot", "out of order",
                                    "extra chunk"])
def test_a_torn_or_mixed_snapshot_is_refused(tmp_path, damage):
    manifest, chunks = _table(tmp_path, _pairs(3000))
    _, other = _table(tmp_path, _pairs(3000, b"!"), "other")  # same keys, later values
    numbered = list(enumerate(chunks))
    if damage == "missing chunk":
        del numbered[-1]
    elif damage == "changed byte":
        numbered[0] = (0, chunks[0][:-1] + bytes([chunks[0][-1] ^ 1]))
    elif damage == "chunk of another snapshot":
        numbered[0] = (0, other[0])
    elif damage == "out of order":
        numbered[0], numbered[1] = numbered[1], numbered[0]
    else:
        numbered.append((len(chunks), other[-1]))
    with pytest.raises(snapshot.SnapshotError):
        _received(tmp_path, manifest, numbered)
    assert not (tmp_path / "in.sst").exists(), "a refused snapshot's table file is removed"


def test_a_manifest_of_another_format_is_refused(tmp_path):
    manifest, _ = _table(tmp_path, _pairs(3))
    for raw in (manifest.encode().replace(b'"format": 2', b'"format": 99'),
                manifest.encode().replace(b'"first_offset": 0', b'"first_offset": null')):
        with pytest.raises(snapshot.SnapshotError):
            snapshot.Manifest.decode(raw)


def _framed(pairs) -> tuple[snapshot.Manifest, list[bytes]]:
    """A format 1 snapshot, as earlier workers wrote them: framed pairs, one chunk here."""
    chunk = b"".join(struct.pack(">I", len(k)) + k + struct.pack(">I", len(v)) + v for k, v in pairs)
    digest = snapshot.Digest()
    digest.add(chunk)
    return snapshot.Manifest(40, 33, 1, len(pairs), digest.hexdigest(), format=snapshot.FRAMED), [chunk]


def test_an_earlier_workers_framed_snapshot_still_reads():
    manifest, chunks = _framed(_pairs(300))
    back = snapshot.decode_framed(snapshot.Manifest.decode(manifest.encode()), dict(enumerate(chunks)))
    assert list(back) == _pairs(300)
    with pytest.raises(snapshot.SnapshotError):
        list(snapshot.decode_framed(manifest, {0: chunks[0][:-1] + b"?"}))


class _Delivered:
    def __init__(self, offset):
        self._offset = offset

    def offset(self):
        return self._offset


class _Queue:
    """librdkafka's local queue as the snapshot writer sees it: what was produced and not yet acknowledged;
    each poll acknowledges one record, calling its delivery callback with its offset (offsets from 1000)."""

    def __init__(self):
        self.sent: list[tuple[bytes, bytes | None]] = []
        self.pending: list = []
        self.most = 0

    def produce(self, topic, value=None, key=None, partition=-1, on_delivery=None):
        self.sent.append((key, value))
        self.pending.append((1000 + len(self.sent) - 1, on_delivery))
        self.most = max(self.most, len(self.pending))

    def poll(self, timeout=0):
        if self.pending:
            offset, callback = self.pending.pop(0)
            if callback is not None:
                callback(None, _Delivered(offset))
        return 1

    def __len__(self):
        return len(self.pending)


def test_a_worker_queues_a_few_chunks_of_a_snapshot_not_the_snapshot(tmp_path):
    """A snapshot is the whole state, which grows with history: the worker waits for acknowledgements while it
    writes one, so librdkafka holds at most SNAPSHOT_CHUNKS_QUEUED chunks (and the one just sent) at a time. Its
    manifest names the offset chunk 0 was delivered at, and the chunks load back into an empty store."""
    from streams import engine as engine_module
    from streams.config import Settings

    engine = engine_module.Engine(Settings(bootstrap="127.0.0.1:1", prefix="snapq.", partitions=1), tmp_path)
    try:
        store = engine.processor(0).state.store
        store.write({f"i/{n:06d}".encode(): random.Random(n).randbytes(600) for n in range(20_000)}, set())
        queue = _Queue()
        engine._send_snapshot(0, queue, 123)
        chunks = [(snapshot.chunk_number(k), v) for k, v in queue.sent if k.startswith(snapshot.CHUNK_PREFIX)]
        manifest = snapshot.Manifest.decode(dict(queue.sent)[snapshot.MANIFEST_KEY])
        assert manifest.chunks == len(chunks) > 2 * engine_module.SNAPSHOT_CHUNKS_QUEUED
        assert (manifest.first_offset, manifest.changelog_offset, manifest.pairs) == (1000, 123, 20_000)
        assert queue.most <= engine_module.SNAPSHOT_CHUNKS_QUEUED + 1
        assert _received(tmp_path, manifest, chunks) == list(store.scan(b""))
        assert not list((tmp_path / "snapshot-tables").iterdir()), "the table file is removed once sent"
    finally:
        engine.close()


# --- a worker that lost its state, on the broker -------------------------------------------------------------------
def test_a_worker_without_state_restores_one_snapshot_and_the_tail(settings, start_worker):
    worker = start_worker(extra_env={"LEDGER_SNAPSHOT_EVERY": "60"})
    client = LedgerClient(settings, "snap")
    gen = LoadGenerator(client, seed=5, mix=Mix(users=40), run_id="s")
    opened = gen.open_accounts()
    client.wait(opened, 60)
    sent = list(gen.paced(900, 400))
    client.flush()
    client.wait(sent, 120)
    assert "snapshot at changelog offset" in worker.log_since_start(), "the worker wrote snapshots"

    worker.kill9()
    for p in worker.data_dir.glob("p*"):
        shutil.rmtree(p)
    # A forged manifest for partition 0 that claims more than the changelog holds: refused, not loaded.
    ends = changelog_ends(settings)
    forged = snapshot.Manifest(ends[0] + 1000, 0, 0, 0, snapshot.Digest().hexdigest())
    producer = Producer(settings.kafka_config())
    producer.produce(settings.topic("snapshots"), forged.encode(), snapshot.MANIFEST_KEY, partition=0)
    producer.flush(10)

    worker.start()
    more = list(gen.paced(200, 400))
    client.flush()
    client.wait(more, 120)
    log = worker.log_since_start()
    assert "partition 0: refused a snapshot that claims changelog offset" in log
    loaded = {int(p): int(offset) for p, offset in LOADED.findall(log)}
    assert len(loaded) >= 4 and 0 not in loaded, f"partitions restored from a snapshot: {loaded}"
    for p, read, start in RESTORED.findall(log):
        p, read, start = int(p), int(read), int(start)
        if p in loaded:
            # One snapshot, then only the tail after it: fewer changelog records than the snapshot covers.
            assert start == loaded[p] and read < start, (p, read, start)
    assert_books_ok(settings)
    assert_exactly_once(settings, "snap", opened + sent + more)
    client.close()


# --- the engine's restore from snapshots written by hand, on the broker --------------------------------------------
def _restore_with(settings, tmp_path, records: list[tuple[bytes, bytes]], aborted: int = 0):
    """Three changelog records in partition 0, then `records` in its snapshots partition (a plain producer:
    read_committed readers see them), then `aborted` records of an aborted transaction after them. Returns what
    a fresh engine restores: partition 0's pairs under zz/ (a prefix the state never uses) and the number of
    snapshots it loaded."""
    from streams.engine import COVERED_MARK, Engine

    producer = Producer(settings.kafka_config())
    for _ in range(3):
        producer.produce(settings.topic("changelog"), b"0", COVERED_MARK, partition=0)
    for key, value in records:
        producer.produce(settings.topic("snapshots"), value, key, partition=0)
    producer.flush(10)
    if aborted:
        other = Producer({**settings.kafka_config(), "transactional.id": f"{settings.prefix}snapshot-test"})
        other.init_transactions(30)
        other.begin_transaction()
        for n in range(aborted):
            other.produce(settings.topic("snapshots"), b"never", snapshot.chunk_key(n), partition=0)
        other.abort_transaction(30)
    engine = Engine(settings, tmp_path / "engine")
    try:
        engine.restore(0)
        return list(engine.processors[0].state.store.scan(b"zz/")), engine.snapshot_loads
    finally:
        engine.close()


def _state(n: int) -> list[tuple[bytes, bytes]]:
    return [(f"zz/{i:05d}".encode(), random.Random(i).randbytes(900)) for i in range(n)]


def test_a_restore_reads_the_latest_table_snapshot_behind_an_aborted_one(settings, tmp_path):
    """Two snapshots, then a third's chunks in an aborted transaction (more records than the first window the
    restore reads back from the end): the second is loaded, read from its first chunk's offset."""
    old_manifest, old_chunks = _table(tmp_path, _state(100), "old")
    manifest, chunks = _table(tmp_path, _state(1500), "new")
    old = [(snapshot.chunk_key(n), c) for n, c in enumerate(old_chunks)]
    old.append((snapshot.MANIFEST_KEY, snapshot.Manifest(2, 0, len(old_chunks), 100, old_manifest.sha256,
                                                         first_offset=0).encode()))
    new = [(snapshot.chunk_key(n), c) for n, c in enumerate(chunks)]
    new.append((snapshot.MANIFEST_KEY, snapshot.Manifest(3, 0, len(chunks), 1500, manifest.sha256,
                                                         first_offset=len(old)).encode()))
    assert len(chunks) > 1
    pairs, loads = _restore_with(settings, tmp_path, old + new, aborted=200)
    assert loads == 1
    assert pairs == _state(1500)


def test_a_restore_still_loads_an_earlier_workers_framed_snapshot(settings, tmp_path):
    manifest, chunks = _framed(_state(200))
    manifest = snapshot.Manifest(3, 0, 1, 200, manifest.sha256, format=snapshot.FRAMED)
    records = [(snapshot.chunk_key(0), b"stale"), (snapshot.chunk_key(0), chunks[0]),
               (snapshot.MANIFEST_KEY, manifest.encode())]
    pairs, loads = _restore_with(settings, tmp_path, records)
    assert loads == 1
    assert pairs == _state(200)


def test_a_table_snapshot_whose_chunks_do_not_match_is_refused(settings, tmp_path):
    """Its first chunk's offset points at another snapshot's chunks: the digest refuses it, and the restore
    replays the changelog instead, with nothing of the snapshot in the store."""
    manifest, chunks = _table(tmp_path, _state(100), "a")
    other, _ = _table(tmp_path, _state(100)[:-1], "b")
    records = [(snapshot.chunk_key(n), c) for n, c in enumerate(chunks)]
    records.append((snapshot.MANIFEST_KEY, snapshot.Manifest(3, 0, len(chunks), 99, other.sha256,
                                                             first_offset=0).encode()))
    pairs, loads = _restore_with(settings, tmp_path, records)
    assert (pairs, loads) == ([], 0)
