"""The read API and the live dashboard (`ledger api`), over the read store only: it never writes to Kafka.

Every answer comes from the read store (SQLite or PostgreSQL) the projector fills (in this process when
started with `projector=True`, else by a `ledger projector` elsewhere). Amounts are exact decimal strings of
minor units plus the formatted decimal of the currency's scale. Errors are JSON `{"error": {"code",
"message"}}` with stable codes:

  401 missing_token, unknown_token (LEDGER_API_TOKENS is set: projections/access.py)
  403 not_permitted (an account outside the token's grant, or a ledger-wide view without system = true)
  404 unknown_account, unknown_transaction, unknown_command, unknown_seq, not_found (no such route)
  400 sharded_account (a per-account sequence asked of a summed system account: ask a shard)
  422 invalid_parameter (malformed, out of range (integers are signed 64-bit) or contradictory parameters)
  500 internal_error (a bug: the server log has the traceback)
  503 not_caught_up (read-your-writes: the projection did not reach min_seq in time; Retry-After says when
      to ask again)

Serving: the event loop never waits on the database. Every route's reads run in a thread of a sized pool
(`read_threads`, each thread borrowing one of as many read-only connections), and the answer is encoded once,
there. One hub per process follows the store's version (one small query every `poll_s`, or at once when the
projector runs in the process and says a batch landed) and fans the changed views out to every SSE client;
read-your-writes waits on the same hub. So 500 dashboards cost the database what one costs.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Callable, TypeVar

import anyio

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, Field
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from projections import fold
from projections.access import ApiTokens, TokenGate
from projections.db import display
from projections.drift import CHECK_EVERY_S as DRIFT_EVERY_S, DriftChecker, run as run_drift
from projections.metrics import ReadSideCollector, StatsCache, money, transfers_older_than
from connectors.rules import RULE_KEY, RULE_VERSION_KEY
from projections.reports import BadAsOf, parse_as_of, trial_balance_json
from projections.store import Store
from projections.worker_metrics import WorkerMetrics, endpoints
from streams import routing
from streams.config import Settings

# Query integers are compared with SQL integers (SQLite INTEGER, PostgreSQL BIGINT): anything beyond a signed
# 64-bit value is refused as invalid_parameter instead of overflowing in the database driver.
SQL_MAX = 2**63 - 1
SEQ = {"ge": 0, "le": SQL_MAX}
MAX_PAGE = 1000  # larger page sizes are capped, not refused (the response says which limit applied)
# An event stream ends after this long and the browser reconnects (resuming by Last-Event-ID): proxies and
# idle-connection reapers never see an endless response, and a headless browser's virtual clock (which
# stands still while a request is pending) moves on.
SSE_STREAM_S = 30.0
READ_THREADS = 8  # threads (and read-only connections) per process answering from the store
POLL_S = 0.05  # how often the hub asks the store's version (projector in another process)
RETRY_AFTER_S = 1  # what a 503 not_caught_up tells the client to wait
SUBSCRIBER_QUEUE = 256  # events a slow SSE client may fall behind before it is dropped (it reconnects)
T = TypeVar("T")
DASHBOARD = Path(__file__).resolve().parent / "dashboard"
log = logging.getLogger("ledger.api")


class ErrorDetail(BaseModel):
    code: str = Field(description="Stable machine-readable code, e.g. unknown_account")
    message: str = Field(description="What went wrong, for a person")


class ErrorBody(BaseModel):
    error: ErrorDetail


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for the error answers a route really gives (all with the ErrorBody shape)."""
    text = {400: "sharded_account", 404: "unknown_account, unknown_transaction, unknown_command or unknown_seq",
            422: "invalid_parameter", 503: "not_caught_up (read-your-writes gave up; Retry-After in seconds)"}
    return {status: {"model": ErrorBody, "description": text[status]} for status in statuses}


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers


def _error(status: int, code: str, message: str, headers: dict[str, str] | None = None, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message, **extra}}, status_code=status, headers=headers)


def _json(body: Any) -> Response:
    """An answer encoded once, in the reading thread (FastAPI's generic encoder walks the dict again)."""
    return Response(json.dumps(body, separators=(",", ":")).encode(), media_type="application/json")


def _view(row) -> dict[str, Any]:
    cur = row["currency"]
    out = {"account_id": row["account_id"], "currency": cur, "status": row["status"],
           "posted": money(int(row["posted"]), cur), "held": money(int(row["held"]), cur),
           "available": money(int(row["available"]), cur), "seq": row["seq"],
           "last_transaction_id": row["last_transaction_id"], "updated_at_ms": row["updated_at_ms"]}
    if row["shards"] > 1 or routing.is_system(row["account_id"]):
        out["shards"] = row["shards"]
    return out


def _entry(row) -> dict[str, Any]:
    cur = row["currency"]
    return {"entry_id": row["entry_id"], "account_id": row["account_id"], "seq": row["seq"], "currency": cur,
            "amount": money(int(row["amount"]), cur), "posted_after": money(int(row["posted_after"]), cur),
            "held_after": money(int(row["held_after"]), cur), "transaction_id": row["transaction_id"],
            "kind": row["kind"], "reference": row["reference"], "hold_id": row["hold_id"],
            "occurred_at_ms": row["occurred_at_ms"], "at_ms": row["at_ms"], "client_id": row["client_id"],
            "command_id": row["command_id"], **_why(row)}


def _why(row) -> dict[str, Any]:
    """Why the money moved: the transaction's links, metadata, the rule and version that posted it (from its
    metadata) and its FX rate snapshot. A store not yet migrated by its projector has none of them."""
    if "links" not in row.keys():
        return {"links": [], "metadata": {}, "rule": None, "rule_version": None, "rate_snapshot_id": None}
    metadata = json.loads(row["metadata"])
    return {"links": json.loads(row["links"]), "metadata": metadata, "rule": metadata.get(RULE_KEY),
            "rule_version": metadata.get(RULE_VERSION_KEY), "rate_snapshot_id": row["rate_snapshot_id"]}


def _result(row) -> dict[str, Any]:
    return {"client_id": row["client_id"], "command_id": row["command_id"], "outcome": row["outcome"],
            "reason": row["reason"], "detail": row["detail"], "transaction_id": row["transaction_id"],
            "at_ms": row["at_ms"], "holds": json.loads(row["holds"])}


def _hold(h, currency: str) -> dict[str, Any]:
    return {"hold_id": h["hold_id"], "status": h["status"], "amount": money(int(h["amount"]), currency),
            "captured": money(int(h["captured"]), currency), "released": money(int(h["released"]), currency),
            "remaining": money(fold.remaining(h), currency), "expires_at_ms": h["expires_at_ms"],
            "updated_at_ms": h["updated_at_ms"]}


def _balance(account_id: str, currency: str, posted: int, held: int, **as_of: int) -> dict[str, Any]:
    return {"account_id": account_id, "currency": currency, **as_of, "posted": money(posted, currency),
            "held": money(held, currency), "available": money(posted - held, currency)}


# --- what every account route checks first --------------------------------------------------------------------
def account_or_404(store: Store, account_id: str):
    row = store.view(account_id)
    if row is None:
        raise ApiError(404, "unknown_account", f"no account {account_id!r} in the read store")
    return row


class Readers:
    """The store as the API reads it: up to `size` read-only connections, each used by one thread at a time,
    in a thread pool of the same size (anyio's limiter), so a slow query never stalls the event loop and the
    database never sees more connections than threads."""

    def __init__(self, target: str | Path, size: int = READ_THREADS):
        self.target, self.size = str(target), size
        self._free: list[Store] = []
        self._all: list[Store] = []
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
            with self._lock:
                self._all.append(store)
        try:
            return fn(store, *args)
        finally:
            with self._lock:
                self._free.append(store)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(store, *args) in the pool's threads."""
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self.size)
        return await anyio.to_thread.run_sync(self.call, fn, *args, limiter=self._limiter)

    def close(self) -> None:
        with self._lock:
            for store in self._all:
                store.close()
            self._all, self._free = [], []


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
                    self.stats_event = f"event: stats\ndata: {json.dumps(await self.readers.run(self._stats))}\n\n"
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

    def _stats(self, store: Store) -> dict[str, Any]:
        return self.stats.get()

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
    return f"event: balances\nid: {version}\ndata: {json.dumps([_view(r) for r in rows])}\n\n"


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


def single_sequence(store: Store, row) -> None:
    """A per-account sequence (history, as of a seq) exists per shard, not for a summed system account."""
    account_id = row["account_id"]
    if row["shards"] > 1 or (routing.is_system(account_id) and routing.SHARD_MARK not in account_id):
        shards = [s["account_id"] for s in store.shards(account_id)]
        raise ApiError(400, "sharded_account", f"{account_id} is the sum of shards with their own seqs; "
                                               f"ask one of {shards}")


# --- the app ----------------------------------------------------------------------------------------------------
def _lifespan(target: str | Path, settings: Settings | None, projector: bool, readers: Readers, hub: Hub,
              drift: DriftChecker | None = None, drift_every_s: float = 0.0):
    """The hub for the app's lifetime; with projector=True, the projector in a thread, nudging the hub after
    every batch (read-your-writes and the live feed see a batch as soon as it commits); with a drift
    checker, its thread (projections/drift.py)."""
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        stop = threading.Event()
        thread = None
        await hub.start()
        checker = None
        if drift is not None:
            checker = threading.Thread(target=run_drift, args=(drift, str(target), stop, drift_every_s),
                                       name="drift-check", daemon=True)
            checker.start()
        if projector:
            from projections.projector import run

            assert settings is not None, "the projector needs the Kafka settings"
            thread = threading.Thread(target=run, args=(settings, target, stop, lambda _: hub.nudge()),
                                      name="projector", daemon=True)
            thread.start()
        try:
            yield
        finally:
            stop.set()
            await hub.stop()
            for t in (thread, checker):
                if t is not None:
                    t.join(10)
            readers.close()

    return lifespan


def _answer_errors_as_json(app: FastAPI) -> None:
    """Every error, ours or the framework's, as {"error": {"code", "message"}} with a stable code."""
    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError):
        return _error(exc.status, exc.code, exc.message, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        problems = [{"parameter": ".".join(str(p) for p in e["loc"][1:]), "problem": e["msg"]} for e in exc.errors()]
        text = "; ".join(f"{p['parameter']}: {p['problem']}" for p in problems)
        return _error(422, "invalid_parameter", text, details=problems)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception):
        log.exception("%s %s failed", request.method, request.url.path)
        return _error(500, "internal_error", f"{type(exc).__name__} while answering; the server log has details")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return _error(exc.status_code, code, str(exc.detail))


def create_app(target: str | Path, settings: Settings | None = None, *, projector: bool = False,
               min_seq_timeout_s: float = 5.0, read_threads: int = READ_THREADS, poll_s: float = POLL_S,
               drift_every_s: float = DRIFT_EVERY_S, tokens: ApiTokens | None = None,
               worker_metrics: list[str] | None = None) -> FastAPI:
    """The API over the store `target` (a SQLite path or a postgresql:// URL). projector=True also runs the
    projector in a thread (needs settings). drift_every_s > 0 runs the background drift check
    (projections/drift.py) at that pace. tokens: who may read what (projections/access.py); None: those of
    LEDGER_API_TOKENS, or open when it is not set. worker_metrics: the workers' /metrics URLs for the dashboard's
    latency and lag per partition (None: LEDGER_WORKER_METRICS). The routes ask the store and format its rows;
    nothing else."""
    # The writer creates the schema; a reader needs it to exist before its first query.
    Store(target, settings.prefix if settings else None).close()
    readers = Readers(target, read_threads)
    drift = DriftChecker() if drift_every_s > 0 else None
    stats = StatsCache(Store(target, readonly=True), drift=drift,
                       workers=WorkerMetrics(endpoints() if worker_metrics is None else worker_metrics))
    hub = Hub(readers, stats, poll_s)
    registry = CollectorRegistry()
    registry.register(ReadSideCollector(stats))

    app = FastAPI(title="Ledger read API", version="1",
                  lifespan=_lifespan(target, settings, projector, readers, hub, drift, drift_every_s),
                  description="Balances, history, holds, transactions and command results from the read store. "
                              "Read-only. " + (__doc__ or "").split("stable codes:")[-1])
    app.state.readers = readers
    app.state.stats = stats
    app.state.hub = hub
    _answer_errors_as_json(app)
    tokens = tokens if tokens is not None else ApiTokens.from_env()
    if tokens is not None:  # every request passes the token gate first (projections/access.py)
        app.add_middleware(TokenGate, tokens=tokens)

    async def answer(body: Callable[..., Any], account_id: str | None = None, min_seq: int | None = None) -> Response:
        """body(store[, row]) in a reading thread, encoded there. With an account: its view first (404 when
        unknown), after waiting for min_seq if given (503 when it does not come)."""
        if account_id is None:
            return await readers.run(lambda store: _json(body(store)))
        if min_seq is None:
            return await readers.run(lambda store: _json(body(store, account_or_404(store, account_id))))
        row = await caught_up(hub, account_id, min_seq, min_seq_timeout_s)
        return await readers.run(lambda store: _json(body(store, row)))

    # --- accounts --------------------------------------------------------------------------------------------
    @app.get("/accounts/{account_id}", summary="Balance view (system accounts summed over their shards)",
             responses=_errors(404, 422, 503))
    async def get_account(account_id: str, min_seq: int | None = Query(None, **SEQ)):
        def body(store: Store, row) -> dict[str, Any]:
            view = {**_view(row), "account_type": store.account_type(account_id)}
            if "shards" in view:
                view["shard_views"] = [_view({**dict(s), "shards": 1}) for s in store.shards(account_id)]
            return view

        return await answer(body, account_id, min_seq)

    @app.get("/accounts/{account_id}/history", summary="Account journal, oldest first, cursor = last seq seen",
             responses=_errors(400, 404, 422, 503))
    async def get_history(account_id: str, cursor: int | None = Query(None, **SEQ),
                          limit: int = Query(100, ge=1, le=SQL_MAX), min_seq: int | None = Query(None, **SEQ)):
        page = min(limit, MAX_PAGE)

        def body(store: Store, row) -> dict[str, Any]:
            single_sequence(store, row)
            rows = store.history_page(account_id, cursor or 0, page + 1)
            more = len(rows) > page
            rows = rows[:page]
            return {"account_id": account_id, "limit": page, "entries": [_entry(r) for r in rows],
                    "next_cursor": str(rows[-1]["seq"]) if more else None}

        return await answer(body, account_id, min_seq)

    @app.get("/accounts/{account_id}/balance", summary="Balance as of a business time or as of a seq",
             responses=_errors(400, 404, 422, 503))
    async def get_balance_as_of(account_id: str, as_of_ms: int | None = Query(None, ge=-SQL_MAX, le=SQL_MAX),
                                as_of_seq: int | None = Query(None, **SEQ), min_seq: int | None = Query(None, **SEQ)):
        if (as_of_ms is None) == (as_of_seq is None):
            raise ApiError(422, "invalid_parameter", "give exactly one of as_of_ms and as_of_seq")

        def body(store: Store, row) -> dict[str, Any]:
            if as_of_seq is None:
                posted, held = store.balance_as_of_ms(account_id, as_of_ms)
                return _balance(account_id, row["currency"], posted, held, as_of_ms=as_of_ms)
            single_sequence(store, row)
            if as_of_seq > row["seq"]:
                raise ApiError(404, "unknown_seq", f"{account_id} is at seq {row['seq']}, not {as_of_seq}, "
                                                   "in the read store (min_seq waits for it)")
            entry = store.entry_at_seq(account_id, as_of_seq)
            posted, held = (0, 0) if entry is None else (int(entry["posted_after"]), int(entry["held_after"]))
            return _balance(account_id, row["currency"], posted, held, as_of_seq=as_of_seq)

        return await answer(body, account_id, min_seq)

    @app.get("/accounts/{account_id}/holds", summary="Holds on the account (open ones by default)",
             responses=_errors(404, 422, 503))
    async def get_holds(account_id: str, status: str = Query("open", pattern="^(open|all)$"),
                        min_seq: int | None = Query(None, **SEQ)):
        def body(store: Store, row) -> dict[str, Any]:
            return {"account_id": account_id,
                    "holds": [_hold(h, row["currency"]) for h in store.holds_of(account_id, status == "open")]}

        return await answer(body, account_id, min_seq)

    # --- transactions and commands ---------------------------------------------------------------------------
    @app.get("/transactions/{transaction_id}", summary="A transaction's legs and status", responses=_errors(404, 422))
    async def get_transaction(transaction_id: str, client_id: str | None = None):
        def body(store: Store) -> dict[str, Any]:
            entries, results = store.transaction(transaction_id, client_id)
            if not entries and not results:
                raise ApiError(404, "unknown_transaction", f"no transaction {transaction_id!r} in the read store")
            clearing = fold.in_clearing(entries)
            first = next((e for e in entries if e["amount"] != "0"), None)
            why = {} if first is None else {"kind": first["kind"], "reference": first["reference"],
                                            "occurred_at_ms": first["occurred_at_ms"], **_why(first)}
            return {"transaction_id": transaction_id, "status": fold.transaction_status(entries, results), **why,
                    "linked_by": store.linked_to(transaction_id),
                    "legs": [_entry(e) for e in entries if e["amount"] != "0"],
                    "in_clearing": [money(v, c) for c, v in sorted(clearing.items()) if v],
                    "results": [_result(r) for r in results if r["client_id"] != routing.ENGINE_CLIENT]}

        return await answer(body)

    @app.get("/reports/trial-balance", summary="Every account's balance as of a business time, by currency and "
                                               "account type, debits against credits", responses=_errors(422))
    async def get_trial_balance(as_of: str | None = Query(None, max_length=64)):
        try:
            as_of_ms = None if as_of is None else parse_as_of(as_of)
        except BadAsOf as exc:
            raise ApiError(422, "invalid_parameter", str(exc)) from None
        return await answer(lambda store: trial_balance_json(store.trial_balance(as_of_ms), as_of_ms))

    @app.get("/history", summary="History entries of the transactions that link to a transaction (link=) or "
                                 "of its whole flow (flow=): it and everything linked to it, either way",
             responses=_errors(422))
    async def get_linked_history(link: str | None = Query(None, min_length=1),
                                 flow: str | None = Query(None, min_length=1)):
        def body(store: Store) -> dict[str, Any]:
            if (link is None) == (flow is None):
                raise ApiError(422, "invalid_parameter", "give exactly one of link= and flow=")
            ids = store.linked_to(link) if link is not None else store.flow(flow)
            return {"link": link, "flow": flow, "transactions": ids,
                    "entries": [_entry(e) for e in store.entries_of(ids) if e["amount"] != "0"]}

        return await answer(body)

    @app.get("/commands/{client_id}/{command_id:path}", summary="The decision for a command (not duplicates)",
             responses=_errors(404))
    async def get_command(client_id: str, command_id: str):
        def body(store: Store) -> dict[str, Any]:
            row = store.result(client_id, command_id)
            if row is None:
                raise ApiError(404, "unknown_command", f"no result for {client_id}/{command_id} in the read store")
            return _result(row)

        return await answer(body)

    @app.get("/accounts/{account_id}/series", summary="Posted and held after each change, for a chart",
             responses=_errors(400, 404, 422))
    async def get_series(account_id: str, limit: int = Query(500, ge=1, le=SQL_MAX)):
        """The account's last `limit` changes (at most MAX_PAGE): log time, seq, posted and held after each."""
        def body(store: Store, row) -> dict[str, Any]:
            single_sequence(store, row)
            rows = store.journal_tail(account_id, min(limit, MAX_PAGE))
            cur = row["currency"]
            return {"account_id": account_id, "currency": cur,
                    "points": [{"seq": r["seq"], "at_ms": r["at_ms"], "posted": money(int(r["posted_after"]), cur),
                                "held": money(int(r["held_after"]), cur)} for r in rows]}

        return await answer(body, account_id)

    # --- operations: transfers in clearing, drift ------------------------------------------------------------
    @app.get("/transfers/in-clearing", summary="Cross-partition transfers with money still in clearing",
             responses=_errors(422))
    async def get_in_clearing(older_than_s: float = Query(0.0, ge=0, le=10**9)):
        """Oldest first; `older_than_s` keeps those in clearing at least that long (stuck ones: see
        LEDGER_STUCK_AFTER_S and the ledger_stuck_transfers metric)."""
        def body(store: Store) -> dict[str, Any]:
            return {"older_than_s": older_than_s, "stuck_after_s": stats.stuck_after_s,
                    "transfers": transfers_older_than(store, older_than_s)}

        return await answer(body)

    @app.get("/drift", summary="The background drift check: accounts whose balance differs from their history")
    async def get_drift():
        return _json(drift.report() if drift is not None else {"enabled": False})

    # --- dashboard, live events, metrics ---------------------------------------------------------------------
    @app.get("/healthz", include_in_schema=False)
    async def healthz():
        """No database: the serving path alone (the benchmark's ceiling for the account lookup)."""
        return Response(b'{"ok":true}', media_type="application/json")

    @app.get("/api/snapshot", include_in_schema=False)
    async def snapshot(limit: int = Query(300, ge=1, le=SQL_MAX)):
        return await answer(lambda store: {"prefix": settings.prefix if settings else None,
                                           "accounts": [_view(r) for r in store.recent_views(min(limit, MAX_PAGE))],
                                           "stats": stats.get()})

    @app.get("/api/stats", include_in_schema=False)
    async def get_stats():
        return await answer(lambda store: stats.get())

    @app.get("/events", summary="Server-sent events: `balances` (changed account views) and `stats` (1/s)",
             responses=_errors(422))
    async def events(request: Request, since: int | None = Query(None, **SEQ),
                     max_s: float = Query(SSE_STREAM_S, gt=0, le=3600)):
        # A reconnecting EventSource sends the id of the last event it got: resume there, nothing missed.
        last_id = request.headers.get("last-event-id", "")
        if last_id.isdigit():
            since = int(last_id)
        return StreamingResponse(_event_stream(hub, since, max_s), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @app.get("/metrics", include_in_schema=False)
    async def metrics():
        return await readers.run(lambda store: Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST))

    @app.get("/", include_in_schema=False)
    async def dashboard():
        return FileResponse(DASHBOARD / "index.html")

    app.mount("/static", StaticFiles(directory=DASHBOARD), name="static")
    return app


async def _event_stream(hub: Hub, since: int | None, max_s: float):
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
        yield hub.stats_event or f"event: stats\ndata: {json.dumps(await hub.readers.run(hub._stats))}\n\n"
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


def app_from_env() -> FastAPI:
    """The app of one served process when `ledger api` runs several (uvicorn's factory, settings from the
    environment; the projector runs in the supervising process)."""
    from streams import config, logs

    logs.setup()  # a served process is spawned afresh: it logs as its supervisor does
    settings = config.load()
    if os.environ.get("LEDGER_API_PREFIX"):
        settings = settings.with_prefix(os.environ["LEDGER_API_PREFIX"])
    return create_app(os.environ["LEDGER_API_TARGET"], settings, projector=False,
                      read_threads=int(os.environ.get("LEDGER_API_READ_THREADS", READ_THREADS)))


def serve(settings: Settings, target: str | Path, host: str = "127.0.0.1", port: int = 8080,
          projector: bool = True, workers: int | None = None) -> None:
    """`ledger api`: the API and dashboard (and by default the projector in a thread). Served by one process
    per core (workers, default the CPU count); with several, the projector runs in the supervising process
    and each served process follows the store through its hub."""
    import uvicorn

    from streams import logs

    workers = workers or os.cpu_count() or 1
    print(f"ledger api: dashboard at http://{host}:{port}/  (OpenAPI at /docs, store {display(target)}, "
          f"{workers} process(es))", flush=True)
    if workers == 1:
        uvicorn.run(create_app(target, settings, projector=projector), host=host, port=port, log_level="warning",
                    log_config=logs.uvicorn_log_config())
        return
    Store(target, settings.prefix).close()
    stop = threading.Event()
    thread = None
    if projector:
        from projections.projector import run

        thread = threading.Thread(target=run, args=(settings, target, stop), name="projector", daemon=True)
        thread.start()
    os.environ["LEDGER_API_TARGET"], os.environ["LEDGER_API_PREFIX"] = str(target), settings.prefix
    try:
        uvicorn.run("projections.api:app_from_env", factory=True, host=host, port=port, workers=workers,
                    log_level="warning", log_config=logs.uvicorn_log_config())
    finally:
        stop.set()
        if thread is not None:
            thread.join(10)
