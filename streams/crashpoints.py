"""Test-only crash and pause points on the commit path (docs/engine.md, "Crash points").

A fault-injection test names a point of streams/engine.py's commit path and the worker stops there on
purpose, instead of hoping a kill -9 lands in that window:

  LEDGER_CRASH_AT=<point>[:<nth>]   the nth time (default 1) the point is reached, the process exits at
                                    once with EXIT_CODE through os._exit: no flush, no finally, no atexit,
                                    librdkafka's queues and Python's buffers are lost, as with kill -9.
  LEDGER_PAUSE_AT=<point>[:<nth>]   the nth time the point is reached, the process stops itself with
                                    SIGSTOP (every thread: no heartbeats), holding the batch it is
                                    committing; SIGCONT resumes it right there (the zombie test).

Before stopping, one line naming the point goes straight to file descriptor 2 (unbuffered), so the test can
tell where the worker stopped: "crash point <point> reached (nth <n>): <detail>".

The environment is read once, at import. Unset, reach() is a function that does nothing.
"""
from __future__ import annotations

import os
import signal
from collections import Counter
from typing import Any, Callable

EXIT_CODE = 86  # distinct from the commit path's own exit (70) and from a signal

POINTS = {
    "after_outputs": "step 3 done (outputs produced, unflushed, inside the batch's open transaction), changelog "
                     "not yet produced",
    "during_transaction_commit": "step 4: outputs, redo records and marks flushed and the commands offsets sent in "
                                 "the batch's open transaction, the commit not asked for",
    "after_changelog": "step 4 done (the transaction committed), step 5 not started",
    "before_write": "step 5, one partition: its transaction committed, its WriteBatch not yet written",
    "after_write": "step 5, one partition: its WriteBatch written, the batch's other partitions maybe not",
    "during_restore": "step 1, one partition: changelog records read (at least one), nothing applied",
}


def _parse(variable: str) -> tuple[str, int] | None:
    raw = os.environ.get(variable, "").strip()
    if not raw:
        return None
    point, _, nth = raw.partition(":")
    if point not in POINTS:
        raise ValueError(f"{variable}={raw}: unknown point {point!r}; known: {', '.join(POINTS)}")
    count = int(nth) if nth else 1
    if count < 1:
        raise ValueError(f"{variable}={raw}: nth must be at least 1")
    return point, count


_CRASH = _parse("LEDGER_CRASH_AT")
_PAUSE = _parse("LEDGER_PAUSE_AT")
_reached: Counter = Counter()


def _say(text: str) -> None:
    os.write(2, f"{text}\n".encode())


def _describe(detail: Any) -> str:
    """The call sites pass what they have at hand, formatted only when a point fires: the batch's
    {partition: (outputs, changelog records)} or {partition: offset} dict, one partition number, or a string."""
    if isinstance(detail, dict):
        text = "partitions " + ",".join(str(p) for p in sorted(detail))
        if all(isinstance(v, tuple) and len(v) == 2 for v in detail.values()):
            text += "; changelog records " + ",".join(f"{p}={len(detail[p][1])}" for p in sorted(detail))
        return text
    if isinstance(detail, int):
        return f"partition {detail}"
    return str(detail)


def _reach(point: str, detail: Any = None) -> None:
    _reached[point] += 1
    n = _reached[point]
    if _CRASH == (point, n):
        _say(f"crash point {point} reached (nth {n}): {_describe(detail)}; exiting with {EXIT_CODE}")
        os._exit(EXIT_CODE)
    if _PAUSE == (point, n):
        _say(f"pause point {point} reached (nth {n}): {_describe(detail)}; stopping (SIGSTOP)")
        os.kill(os.getpid(), signal.SIGSTOP)
        _say(f"pause point {point}: resumed")


def _off(point: str, detail: Any = None) -> None:
    pass


reach: Callable[[str, Any], None] = _reach if (_CRASH or _PAUSE) else _off
