"""glibc's malloc tuned for the worker process: arenas capped (LEDGER_MALLOC_ARENAS, default 2; 0 keeps glibc's
own) and the mmap threshold fixed (LEDGER_MALLOC_MMAP_THRESHOLD_KIB, default 128; 0 keeps glibc's dynamic one).

glibc gives each thread that allocates under contention an arena of its own, up to 8 per core, and keeps what is
freed in them for reuse instead of returning it to the system. A worker's native threads (RocksDB's background
threads, librdkafka's for every transactional producer) made that most of its RSS in a long run, growing after
the rest had levelled off (docs/engine.md, Memory). The cap applies to arenas created after it, so it is set
before the engine opens RocksDB or starts a producer. MALLOC_ARENA_MAX in the environment is the same setting,
read by glibc at start: when it is set, it is left alone.

Blocks of at least the mmap threshold get a mapping of their own, returned to the system when freed. glibc
raises the threshold to the size of each such block freed (up to 32 MiB), so after the first snapshot chunk
(512 KiB, streams/snapshot.py) every later one came from the heap, between small objects that outlive it: each
round of snapshots left the heap with tens of MiB it could neither reuse for the small objects nor return (a
step of about 120 MiB of RSS at the first round, in process: docs/engine.md, Memory). A fixed threshold turns
that dynamic raise off. MALLOC_MMAP_THRESHOLD_ in the environment is the same setting and wins.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os

M_ARENA_MAX = -8  # glibc's malloc.h
M_MMAP_THRESHOLD = -3
ARENAS = int(os.environ.get("LEDGER_MALLOC_ARENAS", "2"))
MMAP_THRESHOLD_KIB = int(os.environ.get("LEDGER_MALLOC_MMAP_THRESHOLD_KIB", "128"))


def _mallopt():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return None


def cap_malloc_arenas(arenas: int = ARENAS) -> bool:
    """True if this call capped the arenas; False when told not to, when MALLOC_ARENA_MAX already did, or
    where the C library has no glibc mallopt (another libc: its allocator is its own business)."""
    if arenas <= 0 or "MALLOC_ARENA_MAX" in os.environ:
        return False
    mallopt = _mallopt()
    return mallopt is not None and mallopt(M_ARENA_MAX, arenas) == 1


def fix_mmap_threshold(kib: int = MMAP_THRESHOLD_KIB) -> bool:
    """True if this call fixed the mmap threshold; False when told not to, when MALLOC_MMAP_THRESHOLD_ already
    did, or without glibc's mallopt."""
    if kib <= 0 or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    mallopt = _mallopt()
    return mallopt is not None and mallopt(M_MMAP_THRESHOLD, kib << 10) == 1
