"""How a worker takes batches from its Faust stream (streams/batching.py, LedgerStream.take_batches): never
more than asked, acked only after the batch's body, records arriving meanwhile kept for the next batch, the
wait asked before each batch.

The stream here stands in for Faust's: it has the members take_batches uses (the method is called on it
unbound), and delivers each record as Faust's passive drainer does (the record as the stream's current event,
through every processor in turn). The worker's broker tests run the real one (kill -9 mid-batch among them: an
ack before the body would lose commands there).
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from streams.batching import LedgerStream, window


@dataclass(frozen=True)
class Event:
    value: int


class Channel:
    def __aiter__(self):
        return self


class Stream:
    def __init__(self):
        self.enable_acks, self._processors, self.current_event = True, [], None
        self.acked: list[int] = []
        self.should_stop = False
        self.channel = Channel()

    def add_processor(self, processor) -> None:
        self._processors.append(processor)

    def _enable_passive(self, channel) -> None:
        pass

    async def wait(self, event: asyncio.Event) -> None:
        await event.wait()

    async def wait_for_stopped(self, event: asyncio.Event, timeout: float | None = None) -> bool:
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except asyncio.TimeoutError:
            pass
        return self.should_stop

    async def ack(self, event: Event) -> None:
        self.acked.append(event.value)

    async def crash(self, exc: BaseException) -> None:
        raise exc

    async def deliver(self, value: int) -> None:
        self.current_event = Event(value)
        for processor in list(self._processors):
            await processor(value)

    async def feed(self, values) -> None:
        """One record after another, each through the processors before the next (as Faust's drainer)."""
        for value in values:
            await self.deliver(value)


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 30))


def test_batches_hold_at_most_max_and_are_acked_only_after_their_body():
    async def scenario():
        stream, asked, seen = Stream(), [], []

        def wait() -> float:
            asked.append(len(seen))
            return 60.0  # only a full batch ends the wait here

        batches = LedgerStream.take_batches(stream, 3, wait)
        feeding = asyncio.ensure_future(stream.feed(range(7)))
        first = await batches.__anext__()
        seen.append([e.value for e in first])
        assert stream.acked == []  # the body runs before any ack
        second = await batches.__anext__()
        seen.append([e.value for e in second])
        assert stream.acked == [0, 1, 2]
        await asyncio.sleep(0)
        assert stream.enable_acks is False
        stream.should_stop = True
        await batches.aclose()
        feeding.cancel()
        return seen, asked, stream

    seen, asked, stream = run(scenario())
    assert seen == [[0, 1, 2], [3, 4, 5]]
    assert asked == [0, 1]  # asked once per batch, before it
    assert stream.acked == [0, 1, 2, 3, 4, 5]  # the second batch's body ended with aclose
    assert stream.enable_acks is True and stream._processors == []  # the stream as it was


def test_a_record_arriving_during_the_body_joins_the_next_batch():
    async def scenario():
        stream = Stream()
        batches = LedgerStream.take_batches(stream, 10, lambda: 0.0)
        first_delivery = asyncio.ensure_future(stream.deliver(1))
        first = await batches.__anext__()
        await first_delivery
        late = asyncio.ensure_future(stream.deliver(2))  # while the body of the first batch runs
        await asyncio.sleep(0.01)
        assert not late.done()  # held until the body ends: it cannot join a batch being worked on
        second = await batches.__anext__()
        await late
        return [e.value for e in first], [e.value for e in second], list(stream.acked)

    first, second, acked = run(scenario())
    assert (first, second, acked) == ([1], [2], [1])


def test_a_lone_record_is_not_held_for_a_batch_when_the_wait_is_zero():
    async def scenario():
        stream = Stream()
        batches = LedgerStream.take_batches(stream, 1000, lambda: 0.0)
        asyncio.ensure_future(stream.deliver(7))
        return [e.value for e in await batches.__anext__()]

    assert run(scenario()) == [7]


def test_a_failure_adding_a_record_crashes_the_stream():
    async def scenario():
        stream = Stream()
        batches = LedgerStream.take_batches(stream, 10, lambda: 0.0)
        pending = asyncio.ensure_future(batches.__anext__())
        await asyncio.sleep(0)
        stream.current_event = None
        with pytest.raises(RuntimeError, match="no current event"):
            await stream._processors[0](1)
        pending.cancel()

    run(scenario())


@pytest.mark.parametrize("lag, expected", [(0, 0.002), (99, 0.002), (100, 0.02), (5000, 0.02)])
def test_the_worker_waits_for_more_only_while_behind(lag, expected):
    assert window(lag, behind=100, busy_s=0.02, idle_s=0.002) == expected
