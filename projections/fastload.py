"""The replay loader's common case in C, for a SQLite store (projections/fastload.pyx).

`bulk.load` spends most of a history record's time in its own Python: the loop, a dict per decoded record, a
tuple per row, and `executemany` binding twenty Python values (docs/read-side.md). `fastload.pyx` takes the
common records from their bytes straight to SQLite's prepared statements (for PostgreSQL, to the rows the
loader copies, without the decoded dicts) and hands anything else back to
`bulk.load`'s Python loop, which stays the source of truth (a differential test compares the two on hostile
and irregular records as well as ordinary ones).

It is used only when all of these hold, else the Python loop does everything:
- the module is built (`make install` runs `python -m schemas.cdecode build`, which compiles it with the
  decoders; a module built from another version of the source is not used);
- for SQLite: the interpreter's sqlite3 module uses SQLite as a shared library, whose functions the module
  takes (no header or link-time dependency of its own), and the connection's handle is the one that opened
  the file;
- the current history and result schemas are the ones the module reads (their fingerprints, below);
- `LEDGER_LOADER` is not `python`.
"""
from __future__ import annotations

import logging
import os
import sqlite3
from pathlib import Path
from typing import Any

from projections.fold import unfoldable
from projections.store import HISTORY_COLUMNS, RESULT_COLUMNS
from schemas import cdecode

log = logging.getLogger("ledger.replay")

SOURCE = (Path(__file__).resolve().parent / "fastload.pyx").read_text()
# The schema versions whose field layout fastload.pyx reads, as their single-object headers (marker and
# CRC-64-AVRO fingerprint). A new version of either schema switches the fast path off until the module
# reads it too (tests/projections/test_fastload.py fails until then).
SCHEMA_HEADERS = {"history": "c301941619ff31575083", "result": "c3013dbc46ee55b2348f"}
# The columns in the order fastload.pyx binds them.
HISTORY_BIND = ("account_id", "seq", "entry_id", "currency", "amount", "posted_after", "held_after",
                "transaction_id", "kind", "reference", "hold_id", "occurred_at_ms", "at_ms", "command_id",
                "client_id", "posted_by_time", "held_by_time", "links", "metadata", "rate_snapshot_id")
RESULT_BIND = ("client_id", "command_id", "outcome", "reason", "detail", "transaction_id", "at_ms", "holds")

_library: bool | None = None


def _insert(table: str, columns: tuple[str, ...]) -> str:
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"


def _sqlite_library() -> bool:
    """Whether the module has SQLite's functions from the library the sqlite3 module loaded (once)."""
    global _library
    if _library is None:
        module = cdecode.load_module(SOURCE)
        path = None
        try:
            with open("/proc/self/maps") as maps:
                for line in maps:
                    name = line.rstrip("\n").split(" ")[-1]
                    if "/libsqlite3" in name:
                        path = name
                        break
        except OSError:
            pass
        _library = bool(module is not None and path and module.bind_library(path.encode()))
    return _library


def unavailable(codec: Any) -> str | None:
    """Why the fast path cannot serve in this process (None when it can)."""
    if os.environ.get("LEDGER_LOADER") == "python":
        return "LEDGER_LOADER=python"
    if cdecode.load_module(SOURCE) is None:
        return "the module is not built (python -m schemas.cdecode build)"
    changed = [n for n, h in SCHEMA_HEADERS.items() if codec.header(n).hex() != h]
    if changed:
        return f"the current {' and '.join(changed)} schema is not the one fastload.pyx reads"
    if HISTORY_BIND != HISTORY_COLUMNS or RESULT_BIND != RESULT_COLUMNS:
        return "the store's columns are not the ones fastload.pyx makes rows of"
    return None


def batch(conn: sqlite3.Connection | None, codec: Any, topics: dict[str, str], remaining: dict, offsets: dict,
          seen: dict, refold: set, result_keys: set, balances: dict) -> Any:
    """The fast path over bulk.load's state (topics: physical name -> logical), or None (then the Python loop
    does everything). conn: the SQLite connection its rows go to; None: it hands rows (tuples) back to the
    loop's lists, as the loop makes them (a PostgreSQL loader copies them)."""
    why = unavailable(codec)
    module = cdecode.load_module(SOURCE)
    if why is None and conn is not None and not _sqlite_library():
        why = "the sqlite3 module's SQLite is not a shared library of this process"
    if why is None and conn is not None:
        file = next((row[2] for row in conn.execute("PRAGMA database_list") if row[1] == "main"), None)
        if not file or module.handle_file(conn) != file:
            why = "the connection's handle is not the one that opened its file"
    if why is not None:
        log.info("replay loader: the Python loop serves every record (%s)", why)
        return None
    return module.Batch(conn, _insert("history", HISTORY_BIND), _insert("results", RESULT_BIND), topics, remaining,
                        offsets, seen, refold, result_keys, balances, codec.header("history"),
                        codec.header("result"), codec.header("balance"), codec.body_decoder("balance"), unfoldable)
