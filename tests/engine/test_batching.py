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

from aiokafka import AIOKafkaConsumer, TopicPartition
from faust.types import TP

from streams.batching import LedgerStream, observe_lag, window


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
        self.crashed = exc  # Faust's marks the stream crashed: it stops
        self.should_stop = True

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
        await stream._processors[0](1)
        pending.cancel()
        return stream

    stream = run(scenario())
    assert isinstance(stream.crashed, RuntimeError) and "no current event" in str(stream.crashed)
    assert stream.acked == []


def test_a_wait_that_cannot_be_chosen_takes_what_is_there_and_goes_on():
    def broken() -> float:
        raise KeyError("lag")

    async def scenario():
        stream = Stream()
        batches = LedgerStream.take_batches(stream, 10, broken)
        feeding = asyncio.ensure_future(stream.feed([1]))
        first = await batches.__anext__()
        await feeding
        feeding = asyncio.ensure_future(stream.feed([2]))
        second = await batches.__anext__()
        return [e.value for e in first], [e.value for e in second], list(stream.acked), stream.enable_acks

    assert run(scenario()) == ([1], [2], [1], False)


@pytest.mark.parametrize("lag, expected", [(0, 0.002), (99, 0.002), (100, 0.02), (5000, 0.02)])
def test_the_worker_waits_for_more_only_while_behind(lag, expected):
    assert window(lag, behind=100, busy_s=0.02, idle_s=0.002) == expected


def test_the_real_faust_stream_batches_and_acks_after_each_body(tmp_path, monkeypatch):
    """LedgerStream as the app makes it, over an in-memory channel (no broker): records sent one every 4 ms,
    bodies of 20 ms, at most 3 a batch: every record in exactly one batch, in order, and its ack after the end
    of that batch's body."""
    import faust

    log: list[tuple[str, object]] = []
    ack = LedgerStream.ack

    async def logged_ack(self, event):
        log.append(("ack", event.value))
        return await ack(self, event)

    monkeypatch.setattr(LedgerStream, "ack", logged_ack)
    app = faust.App("batching-test", broker="kafka://localhost:1", Stream=LedgerStream, web_enabled=False,
                    datadir=str(tmp_path))

    async def scenario():
        app.flow_control.resume()
        channel = app.channel()
        stream = channel.stream()
        assert isinstance(stream, LedgerStream)

        async def feed():
            for i in range(10):
                await channel.send(value=i)
                await asyncio.sleep(0.004)

        feeding = asyncio.ensure_future(feed())
        taken = []
        async for batch in stream.take_batches(3, lambda: 0.0):
            values = [e.value for e in batch]
            log.append(("body", values))
            await asyncio.sleep(0.02)
            log.append(("end", values))
            taken += values
            if len(taken) >= 10:
                break
        await feeding
        await stream.stop()
        return taken

    taken = run(scenario())
    assert taken == list(range(10))
    bodies = [values for kind, values in log if kind == "body"]
    assert all(1 <= len(values) <= 3 for values in bodies) and len(bodies) >= 4
    for values in bodies:
        end = log.index(("end", values))
        acks = [i for i, entry in enumerate(log) if entry[0] == "ack" and entry[1] in values]
        assert all(i > end for i in acks), f"a record of {values} was acked before its batch's body ended: {log}"


class FaustConsumer:
    """What the worker calls on Faust's aiokafka driver for the lag (`assignment`, `highwater`), passed through
    to a real aiokafka consumer as the driver does (not started: assignment and high watermarks are local)."""

    def __init__(self, consumer):
        self.consumer = consumer

    def assignment(self):
        return {TP(tp.topic, tp.partition) for tp in self.consumer.assignment()}

    def highwater(self, tp):
        return self.consumer.highwater(tp)


@dataclass(frozen=True)
class Message:
    tp: TP
    offset: int


@dataclass(frozen=True)
class Delivered:
    message: Message


def test_the_lag_skips_and_forgets_a_partition_revoked_while_its_batch_was_decided():
    """aiokafka's highwater() asserts that its partition is assigned: called for a partition revoked while its
    batch was decided, that assertion ended the worker after the batch had committed."""
    async def scenario():
        consumer = AIOKafkaConsumer(bootstrap_servers="127.0.0.1:1")
        try:
            consumer.assign([TopicPartition("commands", 0), TopicPartition("commands", 1)])
            for partition, high in ((0, 50), (1, 9)):  # as a fetch response sets them
                consumer._subscription.subscription.assignment.state_value(
                    TopicPartition("commands", partition)).highwater = high
            lag: dict = {}
            faust_side = FaustConsumer(consumer)
            batch = [Delivered(Message(TP("commands", p), o)) for p, o in ((0, 10), (1, 3), (0, 19))]
            first = (observe_lag(faust_side, batch, lag), dict(lag))
            consumer.assign([TopicPartition("commands", 1)])  # partition 0 revoked during the next batch
            second = (observe_lag(faust_side, batch, lag), dict(lag))
            return first, second
        finally:
            await consumer.stop()

    first, second = asyncio.run(scenario())
    assert first == ([], {TP("commands", 0): 30, TP("commands", 1): 5})
    assert second == ([TP("commands", 0)], {TP("commands", 1): 5})


class ReassignedMeanwhile(FaustConsumer):
    """Faust runs aiokafka's consumer in a thread of its own: the assignment may change between the look at it
    and the read of a high watermark. Here it changes right after the look."""

    def __init__(self, consumer, then):
        super().__init__(consumer)
        self.then = then

    def assignment(self):
        owned = super().assignment()
        if self.then is not None:
            self.consumer.assign(self.then)
            self.then = None
        return owned


def test_the_lag_survives_a_partition_revoked_between_the_look_and_the_read():
    async def scenario():
        consumer = AIOKafkaConsumer(bootstrap_servers="127.0.0.1:1")
        try:
            consumer.assign([TopicPartition("commands", 0), TopicPartition("commands", 1)])
            lag = {TP("commands", 0): 7}
            faust_side = ReassignedMeanwhile(consumer, then=[TopicPartition("commands", 1)])
            batch = [Delivered(Message(TP("commands", p), 3)) for p in (0, 1)]
            return observe_lag(faust_side, batch, lag), lag
        finally:
            await consumer.stop()

    assert asyncio.run(scenario()) == ([TP("commands", 0)], {})
