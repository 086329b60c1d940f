"""asyncio client: the same commands as LedgerClient, each awaited until its result arrives.

    async with AsyncLedgerClient(settings, "wallet-api") as ledger:
        result = await ledger.post("dep-1", [Leg("sys:world:USD", -100), Leg("user:1:USD", 100)])

Producing is librdkafka's (thread-safe, non-blocking); one background thread reads the results topic and
resolves the futures of the commands this client sent. A timeout raises ResultTimeout carrying the command
id, so the caller can retry with the same id safely (the ledger's inbox answers a retry with the original).
Bounded in flight: at most `max_in_flight` commands await their results at once.

Commands issued in the same turn of the event loop (say, by `asyncio.gather` or by many request handlers at
once) are sent together at the end of that turn, as one CommandBatch record per partition: concurrency
becomes batching with no added wait, the way TigerBeetle's clients batch concurrent requests. A lone command
still travels as a plain record. `batching=False` sends every command as its own record.
"""
from __future__ import annotations

import asyncio
import threading
from typing import Any

from connectors.client import LedgerClient, ResultTimeout
from streams.config import Settings


class AsyncLedgerClient:
    def __init__(self, settings: Settings, client_id: str = "client", max_in_flight: int = 10_000,
                 batching: bool = True, key: str | bytes | None = None):
        self._sync = LedgerClient(settings, client_id, key)  # key: signs its commands (LedgerClient.key)
        self._batching = batching
        self._send_scheduled = False
        self._waiting: dict[str, list[asyncio.Future]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._slots = asyncio.Semaphore(max_in_flight)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reader: threading.Thread | None = None

    async def __aenter__(self) -> "AsyncLedgerClient":
        self._loop = asyncio.get_running_loop()
        if self._batching:
            self._sync.start_batching()
        self._reader = threading.Thread(target=self._read_results, daemon=True)
        self._reader.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def _read_results(self) -> None:
        """The reader thread: resolves the futures of the sends each result answers (skipping, counting
        and logging what it cannot read, so one foreign record never stops it)."""
        answers = self._sync._answers
        while not self._stop.is_set():
            for result in self._sync.read_results(timeout_s=0.05):
                with self._lock:
                    answered = answers.received(result)
                    futures = self._waiting.pop(answered, []) if answered is not None else []
                    answer = answers.answer(answered) if answered is not None else None
                for fut in futures:
                    self._loop.call_soon_threadsafe(_resolve, fut, answer)

    async def _call(self, send, timeout_s: float) -> dict[str, Any]:
        async with self._slots:
            fut = self._loop.create_future()
            # Send and register under the lock: the reader cannot see the result before the future waits.
            with self._lock:
                command_id = send()
                self._waiting.setdefault(command_id, []).append(fut)
            if self._batching and not self._send_scheduled:
                self._send_scheduled = True
                self._loop.call_soon(self._send_pending)  # after every coroutine ready in this turn
            self._sync.poll()
            try:
                return await asyncio.wait_for(fut, timeout_s)
            except asyncio.TimeoutError:
                with self._lock:
                    waiting = self._waiting.get(command_id, [])
                    if fut in waiting:
                        waiting.remove(fut)
                raise ResultTimeout([command_id]) from None

    def _send_pending(self) -> None:
        self._send_scheduled = False
        with self._lock:
            self._sync.send_pending()

    async def open_account(self, account_id: str, currency: str, timeout_s: float = 30.0, **kw) -> dict:
        return await self._call(lambda: self._sync.open_account(account_id, currency, **kw), timeout_s)

    async def post(self, transaction_id: str, legs, timeout_s: float = 30.0, **kw) -> dict:
        return await self._call(lambda: self._sync.post(transaction_id, legs, **kw), timeout_s)

    async def place_hold(self, hold_id: str, account_id: str, amount_minor: int, timeout_s: float = 30.0,
                         **kw) -> dict:
        return await self._call(lambda: self._sync.place_hold(hold_id, account_id, amount_minor, **kw), timeout_s)

    async def release_hold(self, hold_id: str, account_id: str, timeout_s: float = 30.0, **kw) -> dict:
        return await self._call(lambda: self._sync.release_hold(hold_id, account_id, **kw), timeout_s)

    async def close(self) -> None:
        self._stop.set()
        if self._reader is not None:
            await asyncio.to_thread(self._reader.join, 5)
        self._sync.close()  # sends whatever still waits


def _resolve(fut: asyncio.Future, result: dict) -> None:
    if not fut.done():
        fut.set_result(result)
