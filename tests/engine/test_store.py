"""The one small port a partition's state is kept behind (streams/store.py): the same contract for RocksDB (the
workers' store, with its shared memory budget) and the in-memory store the pure tests use."""
from __future__ import annotations

import pytest

from streams import store as store_module
from streams.store import MemoryStore, RocksStore


@pytest.fixture(params=["memory", "rocksdb"])
def stores(request, tmp_path, monkeypatch):
    """Two stores of the kind under test (two RocksDB databases share one memory budget in a worker: a small
    one here, so that the data below outgrows it)."""
    monkeypatch.setattr(store_module, "ROCKSDB_MEMORY_BYTES", 16 << 20)
    monkeypatch.setattr(store_module, "MEMTABLE_BYTES", 4 << 20)
    monkeypatch.setattr(store_module, "_budget", None)
    made = [MemoryStore(), MemoryStore()] if request.param == "memory" else \
        [RocksStore(tmp_path / "p0"), RocksStore(tmp_path / "p1")]
    yield made
    for store in made:
        store.close()


def test_writes_deletes_and_prefix_scans(stores):
    store, other = stores
    store.write({b"a/1": b"one", b"a/2": b"two", b"b/1": b"bee", b"a/": b"empty suffix"}, set())
    assert store.get(b"a/1") == b"one" and store.get(b"missing") is None
    assert list(store.scan(b"a/")) == [(b"a/", b"empty suffix"), (b"a/1", b"one"), (b"a/2", b"two")]
    store.write({b"a/3": b"three", b"a/1": b"uno"}, {b"a/2", b"never-written"})
    assert list(store.scan(b"a/")) == [(b"a/", b"empty suffix"), (b"a/1", b"uno"), (b"a/3", b"three")]
    assert list(store.scan(b"")) == [(b"a/", b"empty suffix"), (b"a/1", b"uno"), (b"a/3", b"three"),
                                     (b"b/1", b"bee")]
    assert list(other.scan(b"")) == [], "partitions' stores are apart"


def test_a_store_larger_than_its_memory_budget_reads_back_whole(stores):
    store, other = stores
    value = bytes(range(256)) * 16  # 4 KiB
    for start in range(0, 10_000, 2_500):  # 80 MiB across both stores, five times the budget
        store.write({f"k/{i:06d}".encode(): value for i in range(start, start + 2_500)}, set())
        other.write({f"k/{i:06d}".encode(): value[::-1] for i in range(start, start + 2_500)}, set())
    assert sum(1 for _ in store.scan(b"k/")) == 10_000
    assert store.get(b"k/009999") == value and other.get(b"k/000000") == value[::-1]
