"""The worker caps glibc's malloc arenas and fixes its mmap threshold (streams/malloc_arenas.py). No broker:
this is about the process."""
from __future__ import annotations

import ctypes
import ctypes.util

from streams.malloc_arenas import cap_malloc_arenas, fix_mmap_threshold


def test_the_cap_is_set_through_glibc(monkeypatch):
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    assert cap_malloc_arenas(2) is True  # the workers' platform (Debian) has glibc's mallopt


def test_zero_keeps_glibc_default_and_the_environment_wins(monkeypatch):
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    assert cap_malloc_arenas(0) is False
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert cap_malloc_arenas(2) is False


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def _mapped_blocks() -> int:
    """Blocks glibc gave a mapping of their own (mallinfo2's hblks), alive now."""
    call = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallinfo2
    call.restype = _MallInfo2
    return call().hblks


def test_a_large_block_freed_does_not_send_the_next_ones_to_the_heap(monkeypatch):
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    assert fix_mmap_threshold(128) is True
    chunk = bytes(512 << 10)  # a snapshot chunk's size: mapped apart
    del chunk  # freed: glibc's dynamic threshold would now rise to 512 KiB
    before = _mapped_blocks()
    chunks = [bytes(512 << 10) for _ in range(4)]
    # Fixed, the threshold keeps them apart too, each returned to the system when freed; risen, they would come
    # from the heap between small objects, which then keeps their space.
    assert _mapped_blocks() - before == len(chunks)


def test_zero_keeps_glibc_dynamic_threshold_and_the_environment_wins(monkeypatch):
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    assert fix_mmap_threshold(0) is False
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")
    assert fix_mmap_threshold(128) is False
