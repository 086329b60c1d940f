"""What a partition's RocksDB keeps in memory stays within the worker's shared budget (streams/store.py), whatever
the history on disk: the SST files' index blocks are in the shared cache, not held by each file's table reader,
and the whole-store scan a snapshot makes does not fill the cache. No broker; RocksDB's own figures."""
from __future__ import annotations

import pytest

from streams import store as store_module
from streams.store import RocksStore

VALUE = bytes(range(40))


@pytest.fixture
def small_budget(monkeypatch):
    monkeypatch.setattr(store_module, "ROCKSDB_MEMORY_BYTES", 16 << 20)
    monkeypatch.setattr(store_module, "MEMTABLE_BYTES", 4 << 20)
    monkeypatch.setattr(store_module, "_budget", None)
    return store_module


def _one_table(store: RocksStore, keys: int) -> None:
    """keys inbox-like pairs, flushed and compacted into the database's files on disk."""
    for first in range(0, keys, 20_000):
        store.write({f"i/bench/{n:09d}".encode(): VALUE for n in range(first, min(first + 20_000, keys))}, set())
    store._db.flush()
    store._db.compact_range(None, None)


def _readers_bytes(store: RocksStore) -> int:
    return store._db.property_int_value("rocksdb.estimate-table-readers-mem")


def _files(store: RocksStore) -> int:
    return sum(int(store._db.property_value(f"rocksdb.num-files-at-level{level}")) for level in range(7))


def test_memory_outside_the_cache_does_not_grow_with_the_data_on_disk(small_budget, tmp_path):
    small, large = RocksStore(tmp_path / "small"), RocksStore(tmp_path / "large")
    try:
        _one_table(small, 20_000)
        _one_table(large, 400_000)  # 20 times the keys: several files, each with more index blocks than small's
        per_file = [_readers_bytes(store) / _files(store) for store in (small, large)]
        # Each table reader keeps a small fixed part (its file's properties, about 2 KiB); the index, which
        # grows with the data in the file, is in the shared cache. Held by the readers (RocksDB's default),
        # it made the large store's readers hold about 23 KiB per file against the small one's 9.
        assert per_file[1] <= per_file[0] * 1.1, per_file
    finally:
        small.close()
        large.close()


def test_a_whole_store_scan_leaves_the_block_cache_as_it_was(small_budget, tmp_path):
    store = RocksStore(tmp_path / "p0")
    try:
        _one_table(store, 400_000)  # about 20 MiB of pairs on disk: more than the 16 MiB budget
        cache, _ = store_module._shared_budget()
        before = cache.get_usage()
        assert sum(1 for _ in store.scan(b"")) == 400_000
        assert cache.get_usage() <= before, "the snapshot's scan filled the cache"
        # A prefix scan (the engine's indexes: expiries, currencies, copies' timeouts) does use the cache.
        assert sum(1 for _ in store.scan(b"i/")) == 400_000
        assert cache.get_usage() > before
    finally:
        store.close()
