"""Key-value storage of one partition's state, with atomic batches.

Two adapters behind one small port (get / scan a prefix / write a batch atomically): RocksDB through
rocksdict for the workers, and a dict for tests. tests/engine/test_store_contract.py runs the same
contract against both. One RocksDB per partition, so a partition's state moves, restores and is deleted
as a unit, and one WriteBatch holds every write of a batch of commands (crash-atomic: after kill -9
RocksDB recovers from its write-ahead log with the whole batch or none of it).
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator, Protocol

from rocksdict import Options, Rdict, ReadOptions, WriteBatch


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


class RocksStore:
    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        self._db = Rdict(str(path), options)

    def get(self, key: bytes) -> bytes | None:
        return self._db.get(key)

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        it = self._db.iter(ReadOptions())
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

    def close(self) -> None:
        self._db.close()
