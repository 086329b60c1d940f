"""The worker caps glibc's malloc arenas (streams/malloc_arenas.py). No broker: this is about the process."""
from __future__ import annotations

from streams.malloc_arenas import cap_malloc_arenas


def test_the_cap_is_set_through_glibc(monkeypatch):
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    assert cap_malloc_arenas(2) is True  # the workers' platform (Debian) has glibc's mallopt


def test_zero_keeps_glibc_default_and_the_environment_wins(monkeypatch):
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    assert cap_malloc_arenas(0) is False
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert cap_malloc_arenas(2) is False
