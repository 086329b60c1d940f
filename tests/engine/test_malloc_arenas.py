"""The worker caps glibc's malloc arenas and fixes its mmap threshold (streams/malloc_arenas.py). No broker:
this is about the process."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from streams.malloc_arenas import cap_malloc_arenas, fix_mmap_threshold


def test_the_cap_is_set_through_glibc(monkeypatch):
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    assert cap_malloc_arenas(2) is True  # the workers' platform (Debian) has glibc's mallopt


def test_zero_keeps_glibc_default_and_the_environment_wins(monkeypatch):
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    assert cap_malloc_arenas(0) is False
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert cap_malloc_arenas(2) is False


# In a fresh interpreter (the threshold is the process's, and other tests' threads allocate beside this one):
# one block of a snapshot chunk's size freed, then four more alive; prints how many of the four got a mapping of
# their own (mallinfo2's hblks).
_CHUNKS_MAPPED = """
import ctypes, ctypes.util, sys
from streams.malloc_arenas import fix_mmap_threshold
if sys.argv[1] == "fixed":
    assert fix_mmap_threshold(128)
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]
mallinfo2 = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallinfo2
mallinfo2.restype = Info
chunk = bytes(512 << 10)
del chunk
before = mallinfo2().hblks
chunks = [bytes(512 << 10) for _ in range(4)]
print(mallinfo2().hblks - before)
"""


def _chunks_mapped(mode: str) -> int:
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
    out = subprocess.run([sys.executable, "-c", _CHUNKS_MAPPED, mode], capture_output=True, text=True, env=env,
                         cwd=Path(__file__).resolve().parents[2], check=True)
    return int(out.stdout)


def test_a_large_block_freed_does_not_send_the_next_ones_to_the_heap():
    # glibc's own threshold rises to 512 KiB when the first chunk is freed: the next ones come from the heap,
    # between small objects that then keep their space. Fixed, each gets a mapping returned when it is freed.
    assert _chunks_mapped("glibc") == 0
    assert _chunks_mapped("fixed") == 4


def test_zero_keeps_glibc_dynamic_threshold_and_the_environment_wins(monkeypatch):
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    assert fix_mmap_threshold(0) is False
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")
    assert fix_mmap_threshold(128) is False
