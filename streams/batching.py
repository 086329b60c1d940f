"""How a worker takes batches of command records from its Faust stream: waiting for more only while behind.

Faust's `Stream.take_events(max_, within)` restarts a `within` timer at every turn and yields what arrived when
it fires: at the worker's 20 ms, a command that finds the worker idle waits 0-20 ms before it is decided. That
wait is paid at every hop of a transaction across partitions (the sender's command, its Reserve, the vote, the
decision: each a record the next partition's worker takes), so it was most of a transfer's latency at low rates
(docs/engine.md, "Latency"). A shorter window alone halves that, but then a loaded worker decides fewer commands
per Kafka transaction and its throughput fell by a third (measured: 2 ms against 20 ms).

`LedgerStream.take_batches` buffers the same way (a processor on the stream fills the buffer; the events are
acked after the batch's body has run, as `take_events` does) with two differences: the window starts with the
first record of the batch, not at a fixed tick, and its length is asked of `window()` before each batch, so the
worker can wait longer while it is behind (batches then fill, as before) and hardly at all when it has caught
up. Faust's own buffering is used as it is written, from a subclass of its stream (the app makes its streams
of it); what this adds is the choice of wait.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, AsyncIterator, Callable

import faust
from mode.utils.aiter import aiter
from mode.utils.futures import notify

log = logging.getLogger("ledger.worker")

IDLE_RECHECK_S = 1.0  # how often an idle take looks whether the stream is stopping


def window(lag: int, behind: int, busy_s: float, idle_s: float) -> float:
    """The wait for more records once a batch has its first: busy_s while the worker is `behind` records or
    more behind the ends of its partitions (its batches fill, each Kafka transaction carries many commands),
    else idle_s (a command is decided almost as soon as it arrives)."""
    return busy_s if lag >= behind else idle_s


def observe_lag(consumer: Any, events: list, lag: dict) -> list:
    """Record in `lag`, per partition of these events that the consumer still owns, how many records lie between
    the last of them and the partition's high watermark. A partition revoked while its batch was decided is
    dropped: aiokafka's `highwater()` asserts that its partition is assigned, and that AssertionError, raised
    after the batch committed, ended the worker. Faust runs aiokafka's consumer in a thread of its own, which
    may install a new assignment between the look at it and the read, so the assertion itself also counts as
    revoked. Returns the partitions dropped from `lag`."""
    last = {}
    for e in events:
        last[e.message.tp] = e.message.offset
    owned = consumer.assignment()
    revoked = dict.fromkeys(tp for tp in lag if tp not in owned)
    for tp, offset in last.items():
        if tp not in owned:
            continue
        try:
            high = consumer.highwater(tp)
        except AssertionError:  # revoked since the look at the assignment
            revoked[tp] = None
            continue
        if high is not None:
            lag[tp] = max(0, high - offset - 1)
    for tp in revoked:
        lag.pop(tp, None)
    return list(revoked)


class LedgerStream(faust.Stream):
    """Faust's stream with one more way to take batches (the app's `Stream`, streams/app.py)."""

    async def take_batches(self, max_: int, window: Callable[[], float]) -> AsyncIterator[list]:
        """Yield lists of up to max_ events: once the first of a batch is buffered, wait up to window() seconds
        (asked then) for more, or until max_ are buffered. The events of a batch are acked when its body ends,
        never before (as with Stream.take_events, also when the body raises: the worker exits before that,
        streams/app.py)."""
        events: list = []
        full, consumed, arrived = asyncio.Event(), asyncio.Event(), asyncio.Event()
        consuming: asyncio.Future | None = None  # set while the caller works on a batch: nothing joins it then
        acks = self.enable_acks

        async def buffer(value: Any) -> Any:
            nonlocal consuming
            try:
                if consuming is not None:
                    try:
                        await consuming
                    finally:
                        consuming = None
                event = self.current_event
                if event is None:
                    raise RuntimeError("take_batches found no current event")
                events.append(event)
                arrived.set()
                if len(events) >= max_:
                    full.set()
                    consumed.clear()
                    await self.wait(consumed)  # strict: never more than max_ in a batch
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # as Faust's take_events does: the stream crashes, loudly
                log.exception("error adding to the batch buffer: %r", exc)
                await self.crash(exc)
            return value

        self.enable_acks = False  # acked here, after the batch's body
        self.add_processor(buffer)
        self._enable_passive(aiter(self.channel))  # the stream feeds `buffer` in the background
        try:
            while not self.should_stop:
                if not events:
                    await self.wait_for_stopped(arrived, timeout=IDLE_RECHECK_S)
                    if not events:
                        continue
                try:
                    wait_s = window()
                except Exception:  # noqa: BLE001 - never let it end the take: its finally would ack undone work
                    log.exception("could not choose the wait for more records; taking what is here")
                    wait_s = 0.0
                await self.wait_for_stopped(full, timeout=wait_s)
                consuming = asyncio.get_running_loop().create_future()
                batch = list(events)
                try:
                    yield batch
                finally:
                    events.clear()
                    arrived.clear()
                    for event in batch:
                        await self.ack(event)
                    notify(consuming)  # the record waiting in buffer() joins the next batch
                    full.clear()
                    consumed.set()
        finally:
            self.enable_acks = acks
            self._processors.remove(buffer)
