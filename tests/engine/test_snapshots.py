"""Snapshots: a worker that lost its local state restores the latest snapshot of each partition and replays only
the changelog's tail after it (streams/snapshot.py, streams/engine.py); a forged or torn snapshot is refused."""
from __future__ import annotations

import re
import shutil

import pytest
from confluent_kafka import Producer

from connectors.client import LedgerClient
from connectors.loadgen import LoadGenerator, Mix
from streams import snapshot
from tests.harness import assert_books_ok, assert_exactly_once, changelog_ends

LOADED = re.compile(r"partition (\d+): loaded the snapshot at changelog offset (\d+)")
RESTORED = re.compile(r"partition (\d+) restored: (\d+) changelog records from offset (\d+)")


# --- the encoding, no broker -----------------------------------------------------------------------------------
def _pairs(n: int) -> list[tuple[bytes, bytes]]:
    return [(f"a/{i:06d}".encode(), bytes([i % 251]) * (i % 700)) for i in range(n)]


def test_a_snapshot_reads_back_the_store_without_the_engine_bookkeeping():
    pairs = _pairs(5000) + [(b"m/changelog", b"12"), (b"m/covered", b"7")]
    manifest, chunks = snapshot.encode(sorted(pairs), changelog_offset=40, covered=33)
    assert manifest.chunks == len(chunks) > 1, "a store larger than one chunk is split"
    assert all(len(c) <= snapshot.CHUNK_BYTES for c in chunks)
    assert (manifest.changelog_offset, manifest.covered, manifest.pairs) == (40, 33, 5000)
    back = list(snapshot.decode(snapshot.Manifest.decode(manifest.encode()), dict(enumerate(chunks))))
    assert back == sorted(_pairs(5000))


@pytest.mark.parametrize("damage", ["missing chunk", "changed byte", "chunk of another snapshot"])
def test_a_torn_or_mixed_snapshot_is_refused(damage):
    manifest, chunks = snapshot.encode(_pairs(3000), 10, 5)
    _, other = snapshot.encode([(k, v + b"!") for k, v in _pairs(3000)], 9, 5)  # same keys, later values
    read = dict(enumerate(chunks))
    if damage == "missing chunk":
        del read[1]
    elif damage == "changed byte":
        read[0] = read[0][:-1] + bytes([read[0][-1] ^ 1])
    else:
        read[0] = other[0]
    with pytest.raises(snapshot.SnapshotError):
        list(snapshot.decode(manifest, read))


def test_a_manifest_of_another_format_is_refused():
    manifest, _ = snapshot.encode(_pairs(3), 1, 1)
    raw = manifest.encode().replace(b'"format": 1', b'"format": 99')
    with pytest.raises(snapshot.SnapshotError):
        snapshot.Manifest.decode(raw)


def test_a_snapshot_is_written_one_chunk_at_a_time():
    """The writer holds one chunk, never the snapshot: it has read only the first chunk's pairs (and the one
    that did not fit) when it hands the first chunk on, and its manifest is the one of the whole."""
    read = []

    def store():
        for pair in _pairs(5000):
            read.append(pair)
            yield pair

    chunker = snapshot.Chunker(store())
    chunks = iter(chunker)
    first = next(chunks)
    assert len(read) < 5000 and sum(8 + len(k) + len(v) for k, v in read[:-1]) == len(first)
    rest = list(chunks)
    manifest, whole = snapshot.encode(_pairs(5000), 40, 33)
    assert [first, *rest] == whole and chunker.manifest(40, 33) == manifest


class _Queue:
    """librdkafka's local queue as the snapshot writer sees it: what was produced and not yet acknowledged;
    each poll acknowledges one record."""

    def __init__(self):
        self.sent: list[tuple[bytes, bytes | None]] = []
        self.unacknowledged = 0
        self.most = 0

    def produce(self, topic, value=None, key=None, partition=-1, **kwargs):
        self.sent.append((key, value))
        self.unacknowledged += 1
        self.most = max(self.most, self.unacknowledged)

    def poll(self, timeout=0):
        self.unacknowledged = max(0, self.unacknowledged - 1)
        return 1

    def __len__(self):
        return self.unacknowledged


def test_a_worker_queues_a_few_chunks_of_a_snapshot_not_the_snapshot(tmp_path):
    """A snapshot is the whole state, which grows with history: the worker waits for acknowledgements while it
    writes one, so librdkafka holds at most SNAPSHOT_CHUNKS_QUEUED chunks (and the one just sent) at a time."""
    from streams import engine as engine_module
    from streams.config import Settings

    engine = engine_module.Engine(Settings(bootstrap="127.0.0.1:1", prefix="snapq.", partitions=1), tmp_path)
    try:
        store = engine.processor(0).state.store
        store.write({f"i/{n:06d}".encode(): bytes([n % 251]) * 600 for n in range(20_000)}, set())
        queue = _Queue()
        engine._send_snapshot(0, queue, 123)
        chunks = {int(k[len(snapshot.CHUNK_PREFIX):]): v for k, v in queue.sent if k.startswith(snapshot.CHUNK_PREFIX)}
        manifest = snapshot.Manifest.decode(dict(queue.sent)[snapshot.MANIFEST_KEY])
        assert manifest.chunks == len(chunks) > 2 * engine_module.SNAPSHOT_CHUNKS_QUEUED
        assert queue.most <= engine_module.SNAPSHOT_CHUNKS_QUEUED + 1
        assert dict(snapshot.decode(manifest, chunks)) == dict(store.scan(b""))
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
    forged = snapshot.Manifest(ends[0] + 1000, 0, 0, 0, snapshot.encode([], 0, 0)[0].sha256)
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
