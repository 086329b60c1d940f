"""Crash on purpose at each named point of the commit path (streams/crashpoints.py), then recover.

A kill -9 loop lands in a given window of the commit path only by chance; here the worker exits hard
(os._exit, like kill -9) exactly at one point, with a backlog of opens, deposits, transfers (some across
partitions), holds, captures, releases and two-partition debits in flight. Restarted without the hook, it
must finish the work with every oracle of DESIGN.md §2 holding, plus the stricter checks of
projections.exactly_once.assert_exactly_once.
"""
from __future__ import annotations

import pytest

from connectors.client import LedgerClient
from connectors.loadgen import LoadGenerator, Mix
from projections.verify import format_report, verify, wait_quiescent
from streams import crashpoints
from tests.harness import assert_exactly_once

# (point, nth): late enough that the batch holds client commands and engine follow-ups (cross-partition
# credits, two-phase votes); step 5's points are reached once per partition of a commit, the others once per commit.
CASES = [("after_outputs", 2), ("during_transaction_commit", 3), ("after_changelog", 2), ("before_write", 3),
         ("after_write", 3), ("during_restore", 3)]
USERS = 40
# `make test` runs two points with a smaller backlog: during_restore (the restore path, where a lagging high
# watermark once let committed commands be decided twice) and during_transaction_commit (the batch's whole
# transaction flushed and left open: the restarted worker's assignment aborts it). In `make test` the kill -9
# loop's kills land in the other four windows by chance, and the zombie test pauses at after_outputs. `make
# test-long` (marker `long`) runs every point with the larger backlog. Either size reaches every point with client commands and
# engine follow-ups in the batch (the nth occurrences above come early). docs/testing.md, "What make test runs".
SHORT = ("during_restore", "during_transaction_commit")
SIZES = {"short": (200, 80), "long": (400, 150)}  # (backlog, commands after the restart)
RUNS = ([pytest.param(point, nth, "short", id=point) for point, nth in CASES if point in SHORT]
        + [pytest.param(point, nth, "long", id=f"{point}-long", marks=pytest.mark.long) for point, nth in CASES])


@pytest.mark.parametrize("point,nth,size", RUNS)
def test_worker_killed_at_a_crash_point_recovers_exactly_once(settings, start_worker, point, nth, size):
    backlog, after = SIZES[size]
    assert point in crashpoints.POINTS
    restore = point == "during_restore"
    hook = {} if restore else {"LEDGER_CRASH_AT": f"{point}:{nth}"}
    worker = start_worker("w1", extra_env=hook)  # ready before any command: the hook fires on this traffic
    client = LedgerClient(settings, "crash")
    gen = LoadGenerator(client, seed=17, mix=Mix(users=USERS, multi_debit=0.1, hold_cycle=0.2), run_id="c")
    sent = gen.open_accounts()
    sent += list(gen.commands(backlog))
    client.flush()
    if restore:
        # Decide the backlog, then lose the local state: the next start restores every partition it gets
        # from the changelog, and the hook fires with records read but not yet applied. The commands sent
        # meanwhile make it restore (a partition is restored with its first batch).
        client.wait(sent, 120)
        worker.kill9()
        worker.wipe_state()
        sent += list(gen.commands(after))
        client.flush()
        worker.extra_env["LEDGER_CRASH_AT"] = f"{point}:{nth}"
        worker.start(wait_ready=False)

    code = worker.wait_exit(120)
    log = worker.log_since_start()
    assert code == crashpoints.EXIT_CODE, f"exit code {code}:\n{worker.tail()}"
    assert f"crash point {point} reached (nth {nth})" in log, worker.tail()
    if point == "during_restore":
        line = next(line for line in log.splitlines() if line.startswith(f"crash point {point}"))
        assert " 0 changelog records" not in line, line

    del worker.extra_env["LEDGER_CRASH_AT"]
    worker.start()
    more = list(gen.commands(after))
    sent += more
    client.flush()
    # Quiescent, not "every result arrived": a lost follow-up would only show as a long wait, while the
    # oracles below name what is missing.
    assert wait_quiescent(settings, 180), "the worker did not catch up with the commands topic"
    report = verify(settings)
    assert report.ok, format_report(report)
    assert report.counts["commands"] > report.counts["commands.from_clients"], "no engine follow-ups ran"
    assert_exactly_once(settings, "crash", sent)
    assert worker.alive and "Traceback" not in worker.log_since_start(), worker.tail()
    client.close()
