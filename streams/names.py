"""The names the ledger gives its own money, holds and steps: one home for the worker and the read side.

- Clearing: ``sys:clearing:<CUR>``, a system account (sharded per partition like every system account,
  routing.shard_of) through which a transaction whose legs live in several partitions moves money between
  them; it sums to zero once every share has posted (P6).
- Internal holds: ``~<T>~<account>``, the reservation of a plain debit in flight (streams/spanning.py).
- Engine steps: the commands and records the engine issues for a client's transaction ``T`` (its key,
  ``<client_id>/<command_id>``) are named ``T~<step>`` or ``T~<step>~<where>`` (a partition, a position, an
  account): unique ledger-wide, and the same on every redo, so the inbox answers a repeated step.
"""
from __future__ import annotations

from streams.routing import unsharded

CLEARING_PREFIX = "sys:clearing:"
INTERNAL_HOLD_MARK = "~"
STEP_MARK = "~"
BEGIN = "begin"  # the coordinator recorded the transaction in flight
DECIDE = "decide"  # a partition's step once the transaction is decided: it posts its share when committed
COMMIT = "commit"  # a partition posted its share (a step of its own before shares posted as their decide step)


def clearing(currency: str) -> str:
    return f"{CLEARING_PREFIX}{currency}"


def is_clearing(account_id: str) -> bool:
    """Clearing or one of its shards."""
    return unsharded(account_id).startswith(CLEARING_PREFIX)


def transaction_key(client_id: str, command_id: str) -> str:
    return f"{client_id}/{command_id}"


def step_id(key: str, step: str, where: object = None) -> str:
    return f"{key}{STEP_MARK}{step}" if where is None else f"{key}{STEP_MARK}{step}{STEP_MARK}{where}"


def internal_hold(key: str, account_id: str, tag: str = "") -> str:
    return f"{INTERNAL_HOLD_MARK}{key}{tag}{STEP_MARK}{account_id}"


def begun(command_id: str) -> str | None:
    """The transaction key of a begin step's id, else None."""
    suffix = f"{STEP_MARK}{BEGIN}"
    return command_id[:-len(suffix)] if command_id.endswith(suffix) else None


def committed(command_id: str) -> str | None:
    """The transaction key of the id a partition's share posts under, ``T~decide~<p>`` (in older logs a commit
    step of its own, ``T~commit~<p>``), else None. Read from the end: a client's command id may hold the mark
    and a step's name (``pay~decide~x``), and other steps of its transaction end in their own names."""
    head, mark, where = command_id.rpartition(STEP_MARK)
    if not mark or not where.isdigit():
        return None
    key, mark, step = head.rpartition(STEP_MARK)
    return key if mark and step in (DECIDE, COMMIT) else None


def owner(client_id: str, command_id: str, engine_client: str) -> str:
    """The client a row belongs to: its own, or for an engine step the client of the transaction it serves."""
    if client_id != engine_client:
        return client_id
    key, slash, _ = command_id.partition("/")
    return key if slash else client_id

