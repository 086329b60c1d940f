"""Key-value storage of one partition's state, with atomic batches.

Two adapters behind one small port (get / scan a prefix / write a batch atomically): RocksDB through
rocksdict for the workers, and a dict for tests. tests/engine/test_store.py runs the same
contract against both. One RocksDB per partition, so a partition's state moves, restores and is deleted
as a unit, and one WriteBatch holds every write of a batch of commands (crash-atomic: after kill -9
RocksDB recovers from its write-ahead log with the whole batch or none of it).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator, Protocol

from rocksdict import (BlockBasedOptions, Cache, IngestExternalFileOptions, Options, Rdict, ReadOptions, SstFileWriter,
                       WriteBatch, WriteBufferManager)

# One memory budget for every partition's RocksDB in a worker: the block cache and the memtables are charged to
# one cache, so RocksDB's memory stays near LEDGER_ROCKSDB_MEMORY_MB however many partitions the worker serves
# (by default each database would take an 8 MiB block cache and up to two 64 MiB memtables; 0 keeps that).
ROCKSDB_MEMORY_BYTES = int(os.environ.get("LEDGER_ROCKSDB_MEMORY_MB", "256")) << 20
# Per database; the shared budget's half for memtables flushes them sooner when reached. 8 MiB cost about 20% more
# worker CPU per command than 32 in benchmarks/engine_core_bench.py (more flushes and compactions).
MEMTABLE_BYTES = int(os.environ.get("LEDGER_ROCKSDB_MEMTABLE_MB", "32")) << 20
# Bits per key of each SST file's Bloom filter (0: none). Most look-ups of a new command miss: its inbox entry, its
# transaction's records. Without a filter a miss reads a data block of every level-0 file and of each deeper level
# whose key range covers it, once the data has outgrown the memtables (the inbox keeps every command id, P4, so a
# long-running worker's does). 10 bits: about 1% false positives, 1.25 bytes a key in the block cache. With the
# shared budget only: LEDGER_ROCKSDB_MEMORY_MB=0 keeps RocksDB's own defaults, which have no filter.
BLOOM_BITS_PER_KEY = float(os.environ.get("LEDGER_ROCKSDB_BLOOM_BITS", "10"))
_budget: tuple[Cache, WriteBufferManager] | None = None


def _shared_budget() -> tuple[Cache, WriteBufferManager]:
    global _budget
    if _budget is None:
        cache = Cache(ROCKSDB_MEMORY_BYTES)
        _budget = cache, WriteBufferManager.new_write_buffer_manager_with_cache(ROCKSDB_MEMORY_BYTES // 2, False,
                                                                                cache)
    return _budget


class KeyValueStore(Protocol):
    def get(self, key: bytes) -> bytes | None: ...

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]: ...

    def write(self, puts: dict[bytes, bytes], deletes: set[bytes]) -> None:
        """Apply all puts and deletes atomically."""

    def close(self) -> None: ...


class MemoryStore:
    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}

    def get(self, key: bytes) -> bytes | None:
        return self.data.get(key)

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        for key in sorted(k for k in self.data if k.startswith(prefix)):
            yield key, self.data[key]

    def write(self, puts: dict[bytes, bytes], deletes: set[bytes]) -> None:
        for key in deletes:
            self.data.pop(key, None)
        self.data.update(puts)

    def close(self) -> None:
        pass


def _options() -> Options:
    """A partition database's options, also those of the table files a snapshot writes (streams/snapshot.py), so
    an ingested snapshot has the same Bloom filters as files RocksDB writes itself."""
    options = Options(raw_mode=True)
    if ROCKSDB_MEMORY_BYTES:  # 0: RocksDB's own defaults, per database (to compare against)
        cache, memtables = _shared_budget()
        table = BlockBasedOptions()
        table.set_block_cache(cache)
        # The SST files' index and filter blocks in the same cache, instead of held by each file's table
        # reader outside it: they grow with the data on disk, which grows with history (the inbox keeps
        # every command id, P4), so outside the cache they were a worker's memory that grew without bound
        # (rocksdb.estimate-table-readers-mem; docs/engine.md, Memory). Level 0's, read by every lookup
        # that misses the memtables, stay pinned while their file is in level 0.
        table.set_cache_index_and_filter_blocks(True)
        table.set_pin_l0_filter_and_index_blocks_in_cache(True)
        if BLOOM_BITS_PER_KEY > 0:  # a full filter per file (not one per block); files without one still read
            table.set_bloom_filter(BLOOM_BITS_PER_KEY, False)
        options.set_block_based_table_factory(table)
        options.set_write_buffer_manager(memtables)
        options.set_write_buffer_size(MEMTABLE_BYTES)
    return options


class RocksStore:
    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        options = _options()
        options.create_if_missing(True)
        self._db = Rdict(str(path), options)

    def get(self, key: bytes) -> bytes | None:
        return self._db.get(key)

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        read = ReadOptions()
        # A scan of the whole store is a snapshot's (streams/snapshot.py): read once, so its blocks would only
        # push the working set (accounts, recent inbox entries) out of the block cache.
        read.fill_cache(bool(prefix))
        it = self._db.iter(read)
        it.seek(prefix)
        while it.valid():
            key = it.key()
            if not key.startswith(prefix):
                break
            yield key, it.value()
            it.next()

    def write(self, puts: dict[bytes, bytes], deletes: set[bytes]) -> None:
        batch = WriteBatch(raw_mode=True)
        for key in deletes:
            batch.delete(key)
        for key, value in puts.items():
            batch.put(key, value)
        self._db.write(batch)

    def export_table(self, path: Path, skip: bytes) -> int:
        """Every pair but those whose key starts with `skip`, in key order, as one RocksDB table file (SST) at
        `path`: a snapshot's content (streams/snapshot.py). Returns the number of pairs; with none, no file."""
        writer, count = None, 0
        for key, value in self.scan(b""):
            if key.startswith(skip):
                continue
            if writer is None:
                writer = SstFileWriter(_options())
                writer.open(str(path))
            writer[key] = value
            count += 1
        if writer is not None:
            writer.finish()
        return count

    def ingest_table(self, path: Path) -> None:
        """A table file written by export_table, moved into the store as it is: no pair passes through Python."""
        options = IngestExternalFileOptions()
        options.set_move_files(True)
        self._db.ingest_external_file([str(path)], options)

    def close(self) -> None:
        self._db.close()
