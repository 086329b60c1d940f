"""Snapshots of a partition's state, so that a restore reads one snapshot and the changelog's tail.

Without them a worker that has lost its local store replays the partition's whole changelog, and restore time
grows with history. Every LEDGER_SNAPSHOT_EVERY changelog records a worker writes the partition's RocksDB
content (everything but the engine's m/ bookkeeping) to the compacted snapshots topic, in the partition of the
same number, inside that partition's Kafka transaction (streams/engine.py): a snapshot is visible to
read_committed readers exactly when the transaction that wrote it committed, and a fenced worker cannot write one.

Records of one snapshot, all keyed so compaction keeps the latest snapshot only:
  chunk/<n>   pairs of the store, framed (below), at most CHUNK_BYTES each, n = 0 .. chunks-1
  chunk/<n>   tombstones for the previous snapshot's chunks beyond this one's count
  manifest    JSON: the changelog offset and covered commands offset the state corresponds to, the number of
              chunks and pairs, and the SHA-256 of the chunks; written last, in the same transaction
A reader keeps the last value of each key up to the partition's end: the manifest and the chunks of the latest
committed snapshot. The digest refuses anything else (a torn or mixed read).

Framing of a chunk: repeated [key length u32][key][value length u32][value], big-endian. It is internal to the
workers, versioned by the manifest's "format".
"""
from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import asdict, dataclass
from typing import Iterable, Iterator

CHUNK_BYTES = 512 * 1024  # far below the 1 MiB record limit every ledger topic allows (streams/limits.py)
MANIFEST_KEY = b"manifest"
CHUNK_PREFIX = b"chunk/"
META_PREFIX = b"m/"  # the engine's bookkeeping in a partition's store: carried by the manifest instead
FORMAT = 1
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

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes) -> "Manifest":
        try:
            fields = json.loads(raw)
            manifest = cls(**fields)
        except (ValueError, TypeError) as exc:
            raise SnapshotError(f"unreadable manifest: {exc}") from exc
        if manifest.format != FORMAT:
            raise SnapshotError(f"snapshot format {manifest.format}, this worker reads {FORMAT}")
        return manifest


def chunk_key(n: int) -> bytes:
    return CHUNK_PREFIX + str(n).encode()


class Chunker:
    """The store's pairs (m/ keys left out) as chunks, one at a time: iterate it, then ask for the manifest.
    A snapshot is the partition's whole state, which grows with history (the inbox keeps every command id), so
    the writer holds one chunk, never the snapshot (streams/engine.py sends each chunk as it comes)."""

    def __init__(self, pairs: Iterable[tuple[bytes, bytes]]):
        self._pairs = pairs
        self._digest = hashlib.sha256()
        self.chunks = 0
        self.pairs = 0
        self.done = False

    def __iter__(self) -> Iterator[bytes]:
        current = bytearray()
        for key, value in self._pairs:
            if key.startswith(META_PREFIX):
                continue
            framed = _LEN.pack(len(key)) + key + _LEN.pack(len(value)) + value
            if current and len(current) + len(framed) > CHUNK_BYTES:
                yield self._counted(bytes(current))
                current = bytearray()
            current += framed
            self.pairs += 1
        if current:
            yield self._counted(bytes(current))
        self.done = True

    def _counted(self, chunk: bytes) -> bytes:
        self._digest.update(_LEN.pack(len(chunk)))
        self._digest.update(chunk)
        self.chunks += 1
        return chunk

    def manifest(self, changelog_offset: int, covered: int) -> Manifest:
        assert self.done, "the manifest covers every chunk: iterate them all first"
        return Manifest(changelog_offset, covered, self.chunks, self.pairs, self._digest.hexdigest())


def encode(pairs: Iterable[tuple[bytes, bytes]], changelog_offset: int, covered: int) -> tuple[Manifest, list[bytes]]:
    """The store's pairs (m/ keys left out) as chunks, and their manifest, all at once (small stores, tests)."""
    chunker = Chunker(pairs)
    chunks = list(chunker)
    return chunker.manifest(changelog_offset, covered), chunks


def decode(manifest: Manifest, chunks: dict[int, bytes]) -> Iterator[tuple[bytes, bytes]]:
    """The pairs of a snapshot read back, after checking that its chunks are the manifest's."""
    ordered = [chunks.get(n) for n in range(manifest.chunks)]
    if any(c is None for c in ordered):
        raise SnapshotError(f"snapshot at changelog offset {manifest.changelog_offset}: chunks missing")
    if _digest(ordered) != manifest.sha256:
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


def _digest(chunks: list[bytes]) -> str:
    h = hashlib.sha256()
    for chunk in chunks:
        h.update(_LEN.pack(len(chunk)))
        h.update(chunk)
    return h.hexdigest()
