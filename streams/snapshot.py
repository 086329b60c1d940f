"""Snapshots of a partition's state, so that a restore reads one snapshot and the changelog's tail.

Without them a worker that has lost its local store replays the partition's whole changelog, and restore time
grows with history. Every LEDGER_SNAPSHOT_EVERY changelog records a worker writes the partition's RocksDB
content (everything but the engine's m/ bookkeeping) to the compacted snapshots topic, in the partition of the
same number, inside that partition's Kafka transaction (streams/engine.py): a snapshot is visible to
read_committed readers exactly when the transaction that wrote it committed, and a fenced worker cannot write one.

Records of one snapshot, all keyed so compaction keeps the latest snapshot only, written in this order:
  chunk/<n>   the snapshot's bytes, at most CHUNK_BYTES each, n = 0 .. chunks-1
  chunk/<n>   tombstones for the previous snapshot's chunks beyond this one's count
  manifest    JSON: the changelog offset and covered commands offset the state corresponds to, the number of
              chunks and pairs, the SHA-256 of the chunks, and the offset of chunk/0 in the snapshots partition;
              written last, in the same transaction
Only the partition's owner writes there, in its transactions, so a committed snapshot's chunks are the committed
records from chunk/0's offset to its manifest. A restore finds the latest manifest near the partition's end and
reads only those (streams/engine.py), not every older snapshot compaction has not removed yet. The digest
refuses anything else (a torn or mixed read).

Format 2 (written): the chunks are one RocksDB table file (SST) of the pairs in key order, written by RocksDB's
SstFileWriter and loaded by ingesting the file, with no per-pair work in Python at either end of a restore
(docs/engine.md, Snapshots: ten times faster to load than format 1). RocksDB's table format is its stable on-disk
format, read by every later RocksDB. Format 1 (still read, from earlier workers): the chunks are framed pairs,
repeated [key length u32][key][value length u32][value], big-endian, and the manifest has no chunk offset.
"""
from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

CHUNK_BYTES = 512 * 1024  # far below the 1 MiB record limit every ledger topic allows (streams/limits.py)
MANIFEST_KEY = b"manifest"
CHUNK_PREFIX = b"chunk/"
META_PREFIX = b"m/"  # the engine's bookkeeping in a partition's store: carried by the manifest instead
FORMAT = 2  # a RocksDB table file
FRAMED = 1  # framed pairs, written by earlier workers
_LEN = struct.Struct(">I")


class SnapshotError(ValueError):
    """A snapshot that cannot be used: torn, of an unknown format, or claiming more than the changelog holds."""


@dataclass(frozen=True, slots=True)
class Manifest:
    changelog_offset: int  # the next changelog offset: the state holds every changelog record below it
    covered: int  # the next commands offset not covered by a committed transaction, as of that state
    chunks: int
    pairs: int
    sha256: str
    format: int = FORMAT
    first_offset: int | None = None  # chunk/0's offset in the snapshots partition (format 2 with chunks)

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes) -> "Manifest":
        try:
            fields = json.loads(raw)
            manifest = cls(**fields)
        except (ValueError, TypeError) as exc:
            raise SnapshotError(f"unreadable manifest: {exc}") from exc
        if manifest.format not in (FORMAT, FRAMED):
            raise SnapshotError(f"snapshot format {manifest.format}, this worker reads {FRAMED} and {FORMAT}")
        if manifest.format == FORMAT and manifest.chunks and manifest.first_offset is None:
            raise SnapshotError("a format 2 manifest without its first chunk's offset")
        return manifest


def chunk_key(n: int) -> bytes:
    return CHUNK_PREFIX + str(n).encode()


def chunk_number(key: bytes | None) -> int | None:
    """n of a chunk/<n> key, None for any other key."""
    number = (key or b"")[len(CHUNK_PREFIX):]
    return int(number) if (key or b"").startswith(CHUNK_PREFIX) and number.isdigit() else None


class Digest:
    """The chunks' count and SHA-256, as the writer sends them and as a reader receives them."""

    def __init__(self) -> None:
        self._sha = hashlib.sha256()
        self.chunks = 0

    def add(self, chunk: bytes) -> bytes:
        self._sha.update(_LEN.pack(len(chunk)))
        self._sha.update(chunk)
        self.chunks += 1
        return chunk

    def hexdigest(self) -> str:
        return self._sha.hexdigest()


def file_chunks(path: Path) -> Iterator[bytes]:
    """A table file's bytes in chunks, read one at a time: the writer holds one chunk, never the snapshot (a
    snapshot is the partition's whole state, which grows with history: the inbox keeps every command id)."""
    with open(path, "rb") as table:
        while chunk := table.read(CHUNK_BYTES):
            yield chunk


class TableWriter:
    """A format 2 snapshot's chunks, received in order, into a table file to ingest; `verify` checks them against
    the manifest before the file is used."""

    def __init__(self, manifest: Manifest, path: Path):
        self.manifest, self.path = manifest, path
        self._digest = Digest()
        self._file = open(path, "wb")

    def add(self, n: int, chunk: bytes) -> None:
        if n != self._digest.chunks or n >= self.manifest.chunks:
            raise SnapshotError(f"snapshot at changelog offset {self.manifest.changelog_offset}: chunk {n} where "
                                f"chunk {self._digest.chunks} of {self.manifest.chunks} was due")
        self._file.write(self._digest.add(chunk))

    def verify(self) -> Path:
        self._file.close()
        if self._digest.chunks != self.manifest.chunks:
            raise SnapshotError(f"snapshot at changelog offset {self.manifest.changelog_offset}: "
                                f"{self._digest.chunks} chunks of {self.manifest.chunks}")
        if self._digest.hexdigest() != self.manifest.sha256:
            raise SnapshotError(f"snapshot at changelog offset {self.manifest.changelog_offset}: digest mismatch")
        return self.path

    def discard(self) -> None:
        self._file.close()
        self.path.unlink(missing_ok=True)


def decode_framed(manifest: Manifest, chunks: dict[int, bytes]) -> Iterator[tuple[bytes, bytes]]:
    """The pairs of a format 1 snapshot read back, after checking that its chunks are the manifest's."""
    ordered = [chunks.get(n) for n in range(manifest.chunks)]
    if any(c is None for c in ordered):
        raise SnapshotError(f"snapshot at changelog offset {manifest.changelog_offset}: chunks missing")
    digest = Digest()
    for chunk in ordered:
        digest.add(chunk)
    if digest.hexdigest() != manifest.sha256:
        raise SnapshotError(f"snapshot at changelog offset {manifest.changelog_offset}: digest mismatch")
    count = 0
    for chunk in ordered:
        view, at = memoryview(chunk), 0
        while at < len(view):
            (n,) = _LEN.unpack_from(view, at)
            key = bytes(view[at + 4:at + 4 + n])
            at += 4 + n
            (n,) = _LEN.unpack_from(view, at)
            value = bytes(view[at + 4:at + 4 + n])
            at += 4 + n
            count += 1
            yield key, value
    if count != manifest.pairs:
        raise SnapshotError(f"snapshot at changelog offset {manifest.changelog_offset}: {count} pairs, "
                            f"manifest says {manifest.pairs}")
