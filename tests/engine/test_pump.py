"""The background pump of the fault tests counts what it sent itself, whatever the shared list held before.

A broker-restart run heals an open transaction with a second pump into the same list of sent ids; the second
pump's join() once compared the whole list with its own count and failed a rehearsal of .ci/run."""
from __future__ import annotations

import pytest

from connectors.loadgen import Pump


class Generator:
    """Yields `made` ids per paced() call, then raises if `fail` is set: what a LoadGenerator's paced() does."""

    def __init__(self, made: int, fail: bool = False):
        self.made, self.fail, self.calls = made, fail, 0

    def paced(self, count, per_second, batch_window_s=0.0):
        self.calls += 1
        for i in range(min(count, self.made)):
            yield f"c{self.calls}-{i}"
        if self.fail:
            raise RuntimeError("producer gone")


class Client:
    flushed = 0

    def flush(self):
        self.flushed += 1


def run(pump: Pump) -> Pump:
    pump.start()
    pump.join(10)
    return pump


def test_a_second_pump_into_the_same_list_counts_its_own():
    sent: list[str] = ["earlier"] * 1500
    client = Client()
    run(Pump(client, Generator(300), 300, 1e9, sent))
    assert len(sent) == 1800 and sent[-1] == "c1-299" and client.flushed == 1


def test_a_pump_that_sent_fewer_than_asked_fails_its_join():
    sent: list[str] = ["earlier"] * 500
    pump = Pump(Client(), Generator(200), 300, 1e9, sent)
    pump.start()
    with pytest.raises(AssertionError, match="only 200 of 300"):
        pump.join(10)


def test_what_stopped_a_pump_is_raised_by_its_join():
    pump = Pump(Client(), Generator(5, fail=True), 300, 1e9, [])
    pump.start()
    with pytest.raises(RuntimeError, match="producer gone"):
        pump.join(10)
    assert pump.done == 5
