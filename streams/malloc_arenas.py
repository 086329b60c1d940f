"""glibc's malloc arenas capped for the worker process (LEDGER_MALLOC_ARENAS, default 2; 0 keeps glibc's own).

glibc gives each thread that allocates under contention an arena of its own, up to 8 per core, and keeps what is
freed in them for reuse instead of returning it to the system. A worker's native threads (RocksDB's background
threads, librdkafka's for every transactional producer) made that most of its RSS in a long run, growing after
the rest had levelled off (docs/engine.md, Memory). The cap applies to arenas created after it, so it is set
before the engine opens RocksDB or starts a producer. MALLOC_ARENA_MAX in the environment is the same setting,
read by glibc at start: when it is set, it is left alone.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os

M_ARENA_MAX = -8  # glibc's malloc.h
ARENAS = int(os.environ.get("LEDGER_MALLOC_ARENAS", "2"))


def cap_malloc_arenas(arenas: int = ARENAS) -> bool:
    """True if this call capped the arenas; False when told not to, when MALLOC_ARENA_MAX already did, or
    where the C library has no glibc mallopt (another libc: its allocator is its own business)."""
    if arenas <= 0 or "MALLOC_ARENA_MAX" in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    return mallopt(M_ARENA_MAX, arenas) == 1
