"""When `wait_quiescent` calls the ledger quiet (projections.verify.Look, wait_for_quiet), broker-free.

A worker writes commands of its own: a tick (streams/ticks.py) into a partition where a hold is due, every
LEDGER_TICK_S. Quiet used to mean "the same ends, all decided, in two looks settle_s apart", which a ledger
ticking more often than that never was, though it decided every tick at once. Quiet is now every command
decided at one instant: a look whose ends did not move while it was taken and were all decided.

The looks here are taken of a small log kept by hand: per partition, its end and how far a worker decided it.
"""
from __future__ import annotations

import time

from projections.verify import Look, read_still, wait_for_quiet

PARTITIONS = 4


class Log:
    """The commands topic's ends and the workers' decided offsets, moved by hand between and within looks."""

    def __init__(self) -> None:
        self.ends = [5] * PARTITIONS
        self.decided = [5] * PARTITIONS
        self.looks = 0

    def append(self, partition: int) -> None:
        self.ends[partition] += 1

    def decide(self) -> None:
        self.decided = list(self.ends)


def _wait(look) -> Look | None:
    # The deadline only ends a wait that never sees quiet (the rule before: it ran out); nothing is timed.
    return wait_for_quiet(look, time.monotonic() + 3.0, settle_s=0.0)


def test_a_ledger_that_ticks_between_every_two_looks_is_quiet_when_it_has_decided_each_tick():
    log = Log()

    def look() -> Look:
        # A tick arrived since the last look and the worker decided it before this one.
        log.looks += 1
        log.append(log.looks % PARTITIONS)
        log.decide()
        return Look(list(log.ends), list(log.decided), list(log.ends))

    quiet = _wait(look)
    assert quiet is not None, "a ledger that decided every command was never called quiet (ticks kept moving it)"
    assert log.looks == 1 and list(quiet.ends_after) == log.ends


def test_a_look_during_which_a_command_was_appended_is_not_quiet():
    # A follow-up (or a tick) appended after the look read the ends and the decided offsets: that look cannot
    # say the new command is decided, so the wait goes on until a look in which nothing moved.
    log = Log()

    def look() -> Look:
        log.looks += 1
        before = list(log.ends)
        decided = list(log.decided)
        if log.looks <= 2:
            log.append(1)
        after = list(log.ends)
        log.decide()
        return Look(before, decided, after)

    quiet = _wait(look)
    assert quiet is not None and log.looks == 3
    assert not Look([5, 5], [5, 5], [5, 6]).quiet


def test_a_command_not_decided_yet_keeps_the_ledger_from_quiet_until_it_is():
    log = Log()
    log.append(2)
    seen = []

    def look() -> Look:
        log.looks += 1
        if log.looks == 4:
            log.decide()
        return Look(list(log.ends), list(log.decided), list(log.ends))

    quiet = _wait_with_states(look, seen)
    assert quiet is not None and log.looks == 4
    assert seen[:3] == [(20, 21)] * 3 and seen[3] == (21, 21), "on_state: decided and end, summed"


def test_a_look_kafka_could_not_answer_is_taken_again():
    log = Log()

    def look() -> Look | None:
        log.looks += 1
        return None if log.looks < 3 else Look(list(log.ends), list(log.decided), list(log.ends))

    assert _wait(look) is not None and log.looks == 3


def test_never_quiet_is_none_at_the_deadline():
    log = Log()
    log.append(0)

    def look() -> Look:
        return Look(list(log.ends), list(log.decided), list(log.ends))

    assert wait_for_quiet(look, time.monotonic() + 0.2, settle_s=0.05) is None


def _wait_with_states(look, seen: list) -> Look | None:
    return wait_for_quiet(look, time.monotonic() + 3.0, settle_s=0.0, on_state=lambda d, e: seen.append((d, e)))


def test_a_read_during_which_a_tick_was_decided_is_read_again():
    # Quiet at the look, then a tick arrives and is decided while the topics are read (results before it,
    # history after it, say): that read mixes two moments, so read_still takes another look and reads again.
    log = Log()
    reads = []

    def quiet() -> Look:
        return Look(list(log.ends), list(log.decided), list(log.ends))

    def read() -> int:
        reads.append(list(log.ends))
        if len(reads) == 1:
            log.append(3)
            log.decide()
        return len(reads)

    still, result = read_still(quiet, lambda: list(log.ends), read, time.monotonic() + 3.0)
    assert still and result == 2, f"the read that saw a tick decided midway was kept (read {result})"
    assert reads == [[5, 5, 5, 5], [5, 5, 5, 6]]


def test_a_read_that_never_holds_still_is_said_so():
    log = Log()

    def read() -> None:
        log.append(0)
        log.decide()

    still, _ = read_still(lambda: Look(list(log.ends), list(log.decided), list(log.ends)), lambda: list(log.ends),
                          read, time.monotonic() + 0.2)
    assert not still
