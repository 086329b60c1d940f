"""Serving reads without stalling: a pool of read-only connections in threads (Readers) and one follower of
the store per process (Hub) that fans changed views out to every live-feed client and wakes read-your-writes.

The event loop never waits on the database. Every route's reads run in a thread of a sized pool
(`read_threads`, each thread borrowing one of as many read-only connections), and the answer is encoded once,
there. One hub per process follows the store's version (one small query every `poll_s`, or at once when the
projector runs in the process and says a batch landed) and fans the changed views out to every SSE client;
read-your-writes waits on the same hub. So 500 dashboards cost the database what one costs.
"""
from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from pathlib import Path
from typing import Any, Callable, TypeVar

import anyio

from projections import answers
from projections.answers import ApiError
from projections.metrics import StatsCache
from projections.store import Store

READ_THREADS = 8  # threads (and read-only connections) per process answering from the store
POLL_S = 0.05  # how often the hub asks the store's version (projector in another process)
RETRY_AFTER_S = 1  # what a 503 not_caught_up tells the client to wait
SUBSCRIBER_QUEUE = 256  # events a slow SSE client may fall behind before it is dropped (it reconnects)
T = TypeVar("T")
log = logging.getLogger("ledger.api")


class Readers:
    """The store as the API reads it: up to `size` read-only connections, each used by one thread at a time,
    in a thread pool of the same size (anyio's limiter), so a slow query never stalls the event loop and the
    database never sees more connections than threads."""

    def __init__(self, target: str | Path, size: int = READ_THREADS):
        self.target, self.size = str(target), size
        self._free: list[Store] = []
        self._closed = False
        self._lock = threading.Lock()
        self._limiter: anyio.CapacityLimiter | None = None
        self.calls: dict[str, int] = {}  # reads made, by function name (what the database was asked)

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(store, *args) on a borrowed connection (in the calling thread)."""
        name = getattr(fn, "__name__", "?")
        self.calls[name] = self.calls.get(name, 0) + 1
        with self._lock:
            store = self._free.pop() if self._free else None
        if store is None:
            store = Store(self.target, readonly=True)
        try:
            return fn(store, *args)
        finally:
            with self._lock:
                closed = self._closed
                if not closed:
                    self._free.append(store)
            if closed:  # closed while this thread read: its connection is closed here, after the read
                store.close()

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(store, *args) in the pool's threads."""
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self.size)
        return await anyio.to_thread.run_sync(self.call, fn, *args, limiter=self._limiter)

    def close(self) -> None:
        """Close the idle connections now, and each borrowed one when its read returns: a read still running
        in a thread (a cancelled await does not stop it) keeps its connection, since closing a SQLite
        connection while another thread steps a statement on it crashes the process."""
        with self._lock:
            self._closed = True
            free, self._free = self._free, []
        for store in free:
            store.close()


class Hub:
    """One follower of the store per process: it asks the store's version every `poll_s` (or when nudged by
    an in-process projector), reads the views a new batch changed once, encodes them once, and hands the same
    event to every SSE subscriber; stats go out once a second the same way. Read-your-writes waits on
    `changed` instead of polling the store itself."""

    def __init__(self, readers: Readers, stats: StatsCache, poll_s: float = POLL_S):
        self.readers, self.stats, self.poll_s = readers, stats, poll_s
        self.version = 0
        self.stats_event = ""
        self.polls = 0  # store version queries made (one per poll, whatever the number of clients)
        self._subscribers: set[asyncio.Queue] = set()
        self._changed: asyncio.Event | None = None
        self._nudged: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._changed, self._nudged = asyncio.Event(), asyncio.Event()
        self.version = await self.readers.run(Store.version)
        self._task = asyncio.create_task(self._follow(), name="read-hub")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        for queue in list(self._subscribers):
            queue.put_nowait(None)

    def nudge(self) -> None:
        """From any thread (the projector after a batch): look at the store now."""
        if self._loop is not None and self._nudged is not None:
            self._loop.call_soon_threadsafe(self._nudged.set)

    def subscribe(self) -> asyncio.Queue:
        queue: asyncio.Queue = asyncio.Queue(SUBSCRIBER_QUEUE)
        self._subscribers.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue) -> None:
        self._subscribers.discard(queue)

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    def _publish(self, event: str) -> None:
        for queue in list(self._subscribers):
            try:
                queue.put_nowait(event)
            except asyncio.QueueFull:  # too slow: drop it; the browser reconnects with Last-Event-ID
                self._subscribers.discard(queue)
                queue.get_nowait()
                queue.put_nowait(None)

    async def _follow(self) -> None:
        last_stats = 0.0
        while True:
            try:
                self.polls += 1
                version = await self.readers.run(Store.version)
                if version != self.version:
                    rows = await self.readers.run(Store.views_between, self.version, version)
                    self.version = version
                    if rows:
                        self._publish(balances_event(rows, version))
                    changed, self._changed = self._changed, asyncio.Event()
                    changed.set()
                if time.monotonic() - last_stats >= 1.0 and self._subscribers:
                    last_stats = time.monotonic()
                    self.stats_event = await self.readers.run(self.stats_event_now)
                    self._publish(self.stats_event)
                try:
                    await asyncio.wait_for(self._nudged.wait(), self.poll_s)
                except asyncio.TimeoutError:
                    pass
                self._nudged.clear()
            except asyncio.CancelledError:
                raise
            except Exception:  # the database went away for a moment: keep following
                log.exception("read hub: following the store failed; retrying")
                await asyncio.sleep(1.0)

    def stats_event_now(self, store: Store) -> str:
        """The stats event as of now (the stats cache reads the store at most once a second)."""
        return f"event: stats\ndata: {json.dumps(self.stats.get())}\n\n"

    async def wait_for(self, check: Callable[[Store], tuple[bool, T]], timeout_s: float) -> tuple[bool, T]:
        """check(store) -> (done, value), asked again after each batch the store gets, until done or timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            changed = self._changed
            done, value = await self.readers.run(check)
            left = deadline - time.monotonic()
            if done or left <= 0 or changed is None:
                return done, value
            try:
                await asyncio.wait_for(changed.wait(), left)
            except asyncio.TimeoutError:
                pass


def balances_event(rows, version: int) -> str:
    return f"event: balances\nid: {version}\ndata: {json.dumps([answers.view(r) for r in rows])}\n\n"


async def caught_up(hub: Hub, account_id: str, min_seq: int, timeout_s: float):
    """Read-your-writes: the account's view once the projection has it at min_seq or later, waking on the
    projector's progress, up to timeout_s; then 503 not_caught_up with Retry-After."""
    def check(store: Store):
        row = store.view(account_id)
        return row is not None and row["seq"] >= min_seq, row

    done, row = await hub.wait_for(check, timeout_s)
    if not done:
        have = None if row is None else row["seq"]
        raise ApiError(503, "not_caught_up", f"{account_id} is at seq {have} in the read store, not {min_seq}, "
                                             f"after {timeout_s:g} s", headers={"Retry-After": str(RETRY_AFTER_S)})
    return row


async def event_stream(hub: Hub, since: int | None, max_s: float):
    """One SSE client: what changed since `since` (read once, at connect), then the hub's events as they come
    (the same encoded event for every client), for max_s. The client itself never queries the store."""
    queue = hub.subscribe()  # before reading the version: every later batch comes through the queue
    try:
        version = hub.version
        yield "retry: 2000\n\n"
        if since is not None and since < version:
            rows = await hub.readers.run(Store.views_between, since, version)
            if rows:
                yield balances_event(rows, version)
        yield hub.stats_event or await hub.readers.run(hub.stats_event_now)
        deadline = time.monotonic() + max_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                event = await asyncio.wait_for(queue.get(), left)
            except asyncio.TimeoutError:
                return
            if event is None:
                return  # dropped (too slow) or the app stops: the browser reconnects
            yield event
    finally:
        hub.unsubscribe(queue)
