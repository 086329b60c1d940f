"""The replay loader's common case in C (projections/fastload.pyx).

`bulk.load` spends most of a history record's time in its own Python: the loop, a dict per decoded record, a
tuple per row, and `executemany` binding twenty Python values (docs/read-side.md). `fastload.pyx` takes the
common records from their bytes straight to SQLite's prepared statements, or for PostgreSQL into COPY's binary
format, without the decoded dicts, and hands anything else back to `bulk.load`'s Python loop, which stays the
source of truth (a differential test compares the two on hostile and irregular records as well as ordinary
ones).

It serves when the module is built (`make install` runs `python -m schemas.cdecode build`, which compiles it
with the decoders; a module built from another version of the source is not used), the current history and
result schemas are the ones it reads (their fingerprints, below), and `LEDGER_LOADER` is not `python`; else
the Python loop does everything. Its rows go straight to SQLite when the interpreter is CPython 3.11-3.13
(whose sqlite3.Connection begins with its handle), its sqlite3 module uses SQLite as a shared library (whose
functions the module takes: no header or link-time dependency of its own) and SQLite says that handle opened
the connection's file; otherwise it does not serve a SQLite loader (logged). A PostgreSQL loader's rows need
no handle: the loader copies the streams it makes.

When it serves, the loader's records are read in C as well (`reader`, `Batch.drain`: librdkafka's messages,
no Python object per record) where confluent-kafka's consumer and its librdkafka are the ones this module
knows how to reach; `LEDGER_LOADER=consume` keeps the fast path but reads with `consume()`.
"""
from __future__ import annotations

import logging
import os
import sqlite3
import sys
from pathlib import Path
from typing import Any

import confluent_kafka

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

_libraries: dict[str, bool] = {}  # a shared library's path fragment -> whether the module took its functions


def _insert(table: str, columns: tuple[str, ...]) -> str:
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"


def _bound(fragment: str, bind: str) -> bool:
    """Whether the module has the functions of the shared library whose path contains fragment (SQLite's, which
    the sqlite3 module loaded; librdkafka's, which confluent-kafka loaded), taken once by its function `bind`.
    Only if the process has exactly one: with two (another package's own), which one owns the handles the
    module is given cannot be told from here."""
    if fragment not in _libraries:
        module = cdecode.load_module(SOURCE)
        paths = _loaded(fragment)
        _libraries[fragment] = bool(module is not None and len(paths) == 1
                                    and getattr(module, bind)(paths.pop().encode()))
    return _libraries[fragment]


# The interpreters whose sqlite3.Connection begins with its SQLite handle (Modules/_sqlite/connection.h); on
# any other the handle is not read at all.
HANDLE_FIRST = ((3, 11), (3, 12), (3, 13))


def _direct(module: Any, conn: sqlite3.Connection) -> str | None:
    """Why rows cannot go straight to SQLite through this connection's handle (None: they can)."""
    if sys.implementation.name != "cpython" or sys.version_info[:2] not in HANDLE_FIRST:
        return f"{sys.implementation.name} {sys.version_info[0]}.{sys.version_info[1]}'s sqlite3 connection layout " \
               "is not known here"
    if not isinstance(conn, sqlite3.Connection):
        return f"{type(conn).__name__} is not a sqlite3 connection"
    if not _bound("/libsqlite3", "bind_library"):
        return "the sqlite3 module's SQLite is not the one shared library of SQLite in this process"
    file = next((row[2] for row in conn.execute("PRAGMA database_list") if row[1] == "main"), None)
    if not file or module.handle_file(conn) != file:
        return "the connection's handle is not the one that opened its file"
    return None


def reader(consumer: Any, client_id: str, partitions: list[tuple[str, int]]) -> Any:
    """A reader of the loader's partitions straight from librdkafka (fastload.Reader; its records go to
    `Batch.drain`), or None: then the loader reads with `consume()`. Made before the consumer is assigned
    the partitions; client_id: the consumer's `client.id`, unique to it. Why it pays: `consume()` makes a
    Python object per record and copies its value, 0.8 µs of the reading thread per record against 0.2
    read this way (docs/read-side.md)."""
    module = cdecode.load_module(SOURCE)
    why = None
    if os.environ.get("LEDGER_LOADER") in ("python", "consume"):
        why = f"LEDGER_LOADER={os.environ['LEDGER_LOADER']}"
    elif module is None:
        why = "the module is not built"
    elif sys.implementation.name != "cpython":
        why = f"{sys.implementation.name}'s object layout is not known here"
    elif type(consumer) is not confluent_kafka.Consumer:
        why = f"{type(consumer).__name__} is not confluent-kafka's own consumer"
    elif not _bound("/librdkafka", "bind_kafka"):
        why = "confluent-kafka's librdkafka is not the one shared library of librdkafka in this process"
    elif not module.kafka_name(consumer).startswith(f"{client_id}#consumer-"):
        why = "the consumer's handle is not the one it was made with"
    if why is not None:
        log.info("replay loader: records read with consume() (%s)", why)
        return None
    return module.Reader(consumer, partitions)


def _loaded(fragment: str) -> set[str]:
    """The paths of the shared libraries loaded in this process whose path contains fragment."""
    paths = set()
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                name = line.rstrip("\n").split(" ")[-1]
                if fragment in name:
                    paths.add(name)
    except OSError:
        pass
    return paths


def unavailable(codec: Any) -> str | None:
    """Why the fast path cannot serve in this process (None when it can)."""
    if os.environ.get("LEDGER_LOADER") == "python":
        return "LEDGER_LOADER=python"
    if cdecode.load_module(SOURCE) is None:
        return "the module is not built (python -m schemas.cdecode build)"
    if getattr(sys, "_is_gil_enabled", lambda: True)() is False:
        return "the interpreter runs without its GIL, which the module relies on"
    changed = [n for n, h in SCHEMA_HEADERS.items() if codec.header(n).hex() != h]
    if changed:
        return f"the current {' and '.join(changed)} schema is not the one fastload.pyx reads"
    if HISTORY_BIND != HISTORY_COLUMNS or RESULT_BIND != RESULT_COLUMNS:
        return "the store's columns are not the ones fastload.pyx makes rows of"
    return None


def batch(conn: sqlite3.Connection | None, codec: Any, topics: dict[str, str], remaining: dict, offsets: dict,
          seen: dict, refold: set, result_keys: set, balances: dict) -> Any:
    """The fast path over bulk.load's state (topics: physical name -> logical), or None (then the Python loop
    does everything). conn: the SQLite connection its rows go to; None (a PostgreSQL loader): it keeps them in
    COPY's binary format, which the loader sends after each batch (`Batch.copies`)."""
    why = unavailable(codec)
    module = cdecode.load_module(SOURCE)
    if why is None and conn is not None:
        why = _direct(module, conn)
    if why is not None:
        log.info("replay loader: the Python loop serves every record (%s)", why)
        return None
    return module.Batch(conn, _insert("history", HISTORY_BIND), _insert("results", RESULT_BIND), topics, remaining,
                        offsets, seen, refold, result_keys, balances, codec.header("history"),
                        codec.header("result"), codec.header("balance"), codec.body_decoder("balance"))
