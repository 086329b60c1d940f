"""Time moves on quiet partitions: every LEDGER_TICK_S seconds (default 10; 0 turns it off) a worker writes a
tick into each commands partition it owns where a hold is due by its clock (the earliest expiry it has
indexed has passed), or a copy's reservation whose wait for its coordinator's Reserve has ended
(streams/spanning.py, COPY_WAIT_MS). A partition with nothing due gets no tick, so an idle ledger's log stays
still.

A hold's expiry is decided by log time, when its partition reads a record (DESIGN.md P7: the record's
timestamp is the only clock, so a replay expires the same holds at the same place). Without traffic a due
hold would stay open and ``available`` understated until the next client command reached that partition.
The tick is that record: it is in the log, so replay stays deterministic.

A tick is a CommandBatch with no commands, sealed by the worker (streams/seal.py). No new schema: an engine
that does not know ticks dead-letters it harmlessly; an unsealed empty batch (anyone else's) is still
dead-lettered as ``empty``. The partition answers nothing for it and remembers nothing: it expires the holds
due by the tick's timestamp, each ExpireHold under its deterministic id, as any record would.
"""
from __future__ import annotations

import os

from schemas.codec import codec

INTERVAL_S = float(os.environ.get("LEDGER_TICK_S", "10"))
KEY = b"tick"


def value() -> bytes:
    """The bytes of a tick: an empty CommandBatch (the same every time; the seal binds it to its partition)."""
    return codec().encode("command_batch", {"commands": []})
