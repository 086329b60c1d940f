"""The live feed's hub without a broker (both databases): one follower of the store per process, whatever the
number of SSE clients; read-your-writes wakes when a batch lands."""
from __future__ import annotations

import asyncio

from projections.hub import Hub, Readers, caught_up
from projections.metrics import StatsCache
from projections.store import Record, Store


def balance(account_id: str, seq: int, posted: int) -> dict:
    return {"account_id": account_id, "currency": "USD", "status": "open", "posted": str(posted), "held": "0",
            "available": str(posted), "seq": seq, "last_transaction_id": f"t{seq}", "updated_at_ms": 1000 + seq}


def test_one_read_per_batch_for_500_subscribers_and_min_seq_wakes(new_store):
    target = new_store("live")
    writer = Store(target, "live.")
    writer.apply([Record("balances", 0, 0, balance("user:a:USD", 1, 5))], {("balances", 0): 1})

    async def scenario() -> None:
        readers = Readers(target, 4)
        hub = Hub(readers, StatsCache(Store(target, readonly=True)), poll_s=0.02)
        await hub.start()
        try:
            queues = [hub.subscribe() for _ in range(500)]
            waiting = asyncio.create_task(caught_up(hub, "user:b:USD", 1, timeout_s=30))
            await asyncio.sleep(0.1)
            assert not waiting.done()
            await asyncio.to_thread(writer.apply, [Record("balances", 0, 1, balance("user:b:USD", 1, 7))],
                                    {("balances", 0): 2})
            row = await waiting
            assert row["seq"] == 1 and row["posted"] == "7"
            events = [await asyncio.wait_for(q.get(), 30) for q in queues]
            while not events[0].startswith("event: balances"):  # stats events may come first
                events = [await asyncio.wait_for(q.get(), 30) for q in queues]
            assert len(set(events)) == 1 and '"user:b:USD"' in events[0] and '"user:a:USD"' not in events[0]
            # The changed views were read once for 500 clients; the version is asked once per poll.
            assert readers.calls["views_between"] == 1
            assert readers.calls["version"] <= hub.polls + 1
        finally:
            await hub.stop()
            readers.close()

    try:
        asyncio.run(scenario())
    finally:
        writer.close()


def test_readers_closed_while_a_read_runs_close_its_connection_only_after_it(new_store):
    """Shutting down (hub stopped, readers closed) while a read still runs in a thread: the read finishes on
    its open connection, which is closed when it returns (closing it under the read crashed the process)."""
    import threading
    target = new_store("closing")
    Store(target, "closing.").close()
    readers = Readers(target, 2)
    reading, release, out = threading.Event(), threading.Event(), {}

    def slow_version(store: Store) -> int:
        reading.set()
        release.wait(10)
        out["store"] = store
        return store.version()

    thread = threading.Thread(target=lambda: out.setdefault("version", readers.call(slow_version)))
    thread.start()
    assert reading.wait(10)
    readers.close()
    release.set()
    thread.join(10)
    assert out.get("version") == 0, "the read running at close did not finish on its connection"
    try:
        out["store"].version()
    except Exception:
        pass
    else:
        raise AssertionError("the borrowed connection was left open after its read returned")
