"""Guards for programmer errors (never for users' mistakes, which are Rejection values).

Money is an int of minor units. A float, a bool or a Decimal reaching the core means the caller skipped
parsing at the edge, so we fail loudly instead of guessing a rounding.
"""

from __future__ import annotations


def require_int(value: object, name: str) -> None:
    """Raise TypeError unless value is exactly an int (bool is an int subclass and is refused too)."""
    if type(value) is not int:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}: {value!r}")


def require_optional_int(value: object, name: str) -> None:
    """Like require_int, but None is allowed (optional times and limits)."""
    if value is not None and type(value) is not int:
        raise TypeError(f"{name} must be an int or None, got {type(value).__name__}: {value!r}")


def require_str(value: object, name: str) -> None:
    """Raise TypeError unless value is a str (ids and codes)."""
    if type(value) is not str:
        raise TypeError(f"{name} must be a str, got {type(value).__name__}: {value!r}")


def require_optional_str(value: object, name: str) -> None:
    """Like require_str, but None is allowed."""
    if value is not None and type(value) is not str:
        raise TypeError(f"{name} must be a str or None, got {type(value).__name__}: {value!r}")
