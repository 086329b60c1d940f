"""Every table file of a partition's RocksDB carries a Bloom filter (streams/store.py): those RocksDB writes when it
flushes and compacts, and those a snapshot writes and a restore ingests. Most look-ups of a new command miss (its
inbox entry, its transaction's records); without a filter each miss reads a data block of every file whose key
range covers it. No broker; RocksDB's own table properties."""
from __future__ import annotations

import re

from streams.store import RocksStore

VALUE = bytes(range(40))


def _filtered_entries(store: RocksStore) -> tuple[int, int]:
    """(entries in the store's table files, entries their filters cover), from RocksDB's table properties."""
    properties = store._db.property_value("rocksdb.aggregated-table-properties")
    entries = int(re.search(r"# entries=(\d+)", properties).group(1))
    filtered = int(re.search(r"# entries for filter=(\d+)", properties).group(1))
    return entries, filtered


def test_flushed_and_ingested_tables_carry_bloom_filters(tmp_path):
    written, restored = RocksStore(tmp_path / "written"), RocksStore(tmp_path / "restored")
    try:
        written.write({f"i/bench\x00{n:09d}".encode(): VALUE for n in range(30_000)}, set())
        written._db.flush()
        assert _filtered_entries(written) == (30_000, 30_000)
        assert written.export_table(tmp_path / "snapshot.sst", skip=b"s/") == 30_000
        restored.ingest_table(tmp_path / "snapshot.sst")
        assert _filtered_entries(restored) == (30_000, 30_000)
        assert restored.get(b"i/bench\x00000012345") == VALUE and restored.get(b"i/bench\x00x") is None
    finally:
        written.close()
        restored.close()
