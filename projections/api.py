"""The read API and the live dashboard (`ledger api`), over the read store only: it never writes to Kafka.

Every answer comes from the read store (SQLite or PostgreSQL) the projector fills (in this process when
started with `projector=True`, else by a `ledger projector` elsewhere). Amounts are exact decimal strings of
minor units plus the formatted decimal of the currency's scale. Errors are JSON `{"error": {"code",
"message"}}` with stable codes:

  404 unknown_account, unknown_transaction, unknown_command, unknown_seq, not_found (no such route)
  400 sharded_account (a per-account sequence asked of a summed system account: ask a shard)
  422 invalid_parameter (malformed, out of range (integers are signed 64-bit) or contradictory parameters)
  500 internal_error (a bug: the server log has the traceback)
  504 not_caught_up (read-your-writes: the projection did not reach min_seq in time)
"""
from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, Field
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from projections import fold
from projections.db import display
from projections.metrics import ReadSideCollector, StatsCache, money
from projections.store import Store
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
            422: "invalid_parameter", 504: "not_caught_up"}
    return {status: {"model": ErrorBody, "description": text[status]} for status in statuses}


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def _error(status: int, code: str, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message, **extra}}, status_code=status)


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
            "command_id": row["command_id"]}


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


async def caught_up(store: Store, account_id: str, min_seq: int | None, timeout_s: float):
    """The account's view; with min_seq (read-your-writes), once the projection has it at min_seq or later,
    waiting up to timeout_s (504 not_caught_up after that)."""
    if min_seq is None:
        return account_or_404(store, account_id)
    deadline = time.monotonic() + timeout_s
    while True:
        row = store.view(account_id)
        if row is not None and row["seq"] >= min_seq:
            return row
        if time.monotonic() >= deadline:
            have = None if row is None else row["seq"]
            raise ApiError(504, "not_caught_up", f"{account_id} is at seq {have} in the read store, not "
                                                 f"{min_seq}, after {timeout_s:g} s")
        await asyncio.sleep(0.02)


def single_sequence(store: Store, row) -> None:
    """A per-account sequence (history, as of a seq) exists per shard, not for a summed system account."""
    account_id = row["account_id"]
    if row["shards"] > 1 or (routing.is_system(account_id) and routing.SHARD_MARK not in account_id):
        shards = [s["account_id"] for s in store.shards(account_id)]
        raise ApiError(400, "sharded_account", f"{account_id} is the sum of shards with their own seqs; "
                                               f"ask one of {shards}")


# --- the app ----------------------------------------------------------------------------------------------------
def _lifespan(target: str | Path, settings: Settings | None, projector: bool):
    """Runs the projector in a thread for the app's lifetime (projector=True)."""
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        stop = threading.Event()
        thread = None
        if projector:
            from projections.projector import run

            assert settings is not None, "the projector needs the Kafka settings"
            thread = threading.Thread(target=run, args=(settings, target, stop), name="projector", daemon=True)
            thread.start()
        try:
            yield
        finally:
            stop.set()
            if thread is not None:
                thread.join(10)

    return lifespan


def _answer_errors_as_json(app: FastAPI) -> None:
    """Every error, ours or the framework's, as {"error": {"code", "message"}} with a stable code."""
    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError):
        return _error(exc.status, exc.code, exc.message)

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
               min_seq_timeout_s: float = 5.0) -> FastAPI:
    """The API over the store `target` (a SQLite path or a postgresql:// URL). projector=True also runs the
    projector in a thread (needs settings). The routes ask the store and format its rows; nothing else."""
    # The writer creates the schema; a reader needs it to exist before its first query.
    Store(target, settings.prefix if settings else None).close()
    store = Store(target, readonly=True)
    stats = StatsCache(store)
    registry = CollectorRegistry()
    registry.register(ReadSideCollector(stats))

    app = FastAPI(title="Ledger read API", version="1", lifespan=_lifespan(target, settings, projector),
                  description="Balances, history, holds, transactions and command results from the read store. "
                              "Read-only. " + (__doc__ or "").split("stable codes:")[-1])
    app.state.store = store
    app.state.stats = stats
    _answer_errors_as_json(app)

    async def account(account_id: str, min_seq: int | None):
        return await caught_up(store, account_id, min_seq, min_seq_timeout_s)

    # --- accounts --------------------------------------------------------------------------------------------
    @app.get("/accounts/{account_id}", summary="Balance view (system accounts summed over their shards)",
             responses=_errors(404, 422, 504))
    async def get_account(account_id: str, min_seq: int | None = Query(None, **SEQ)):
        view = _view(await account(account_id, min_seq))
        if "shards" in view:
            view["shard_views"] = [_view({**dict(s), "shards": 1}) for s in store.shards(account_id)]
        return view

    @app.get("/accounts/{account_id}/history", summary="Account journal, oldest first, cursor = last seq seen",
             responses=_errors(400, 404, 422, 504))
    async def get_history(account_id: str, cursor: int | None = Query(None, **SEQ),
                          limit: int = Query(100, ge=1, le=SQL_MAX), min_seq: int | None = Query(None, **SEQ)):
        single_sequence(store, await account(account_id, min_seq))
        limit = min(limit, MAX_PAGE)
        rows = store.history_page(account_id, cursor or 0, limit + 1)
        more = len(rows) > limit
        rows = rows[:limit]
        return {"account_id": account_id, "limit": limit, "entries": [_entry(r) for r in rows],
                "next_cursor": str(rows[-1]["seq"]) if more else None}

    @app.get("/accounts/{account_id}/balance", summary="Balance as of a business time or as of a seq",
             responses=_errors(400, 404, 422, 504))
    async def get_balance_as_of(account_id: str, as_of_ms: int | None = Query(None, ge=-SQL_MAX, le=SQL_MAX),
                                as_of_seq: int | None = Query(None, **SEQ), min_seq: int | None = Query(None, **SEQ)):
        if (as_of_ms is None) == (as_of_seq is None):
            raise ApiError(422, "invalid_parameter", "give exactly one of as_of_ms and as_of_seq")
        row = await account(account_id, min_seq)
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

    @app.get("/accounts/{account_id}/holds", summary="Holds on the account (open ones by default)",
             responses=_errors(404, 422, 504))
    async def get_holds(account_id: str, status: str = Query("open", pattern="^(open|all)$"),
                        min_seq: int | None = Query(None, **SEQ)):
        row = await account(account_id, min_seq)
        return {"account_id": account_id,
                "holds": [_hold(h, row["currency"]) for h in store.holds_of(account_id, status == "open")]}

    # --- transactions and commands ---------------------------------------------------------------------------
    @app.get("/transactions/{transaction_id}", summary="A transaction's legs and status", responses=_errors(404, 422))
    async def get_transaction(transaction_id: str, client_id: str | None = None):
        entries, results = store.transaction(transaction_id, client_id)
        if not entries and not results:
            raise ApiError(404, "unknown_transaction", f"no transaction {transaction_id!r} in the read store")
        clearing = fold.in_clearing(entries)
        return {"transaction_id": transaction_id, "status": fold.transaction_status(entries, results),
                "legs": [_entry(e) for e in entries if e["amount"] != "0"],
                "in_clearing": [money(v, c) for c, v in sorted(clearing.items()) if v],
                "results": [_result(r) for r in results if r["client_id"] != routing.ENGINE_CLIENT]}

    @app.get("/commands/{client_id}/{command_id:path}", summary="The decision for a command (not duplicates)",
             responses=_errors(404))
    async def get_command(client_id: str, command_id: str):
        row = store.result(client_id, command_id)
        if row is None:
            raise ApiError(404, "unknown_command", f"no result for {client_id}/{command_id} in the read store")
        return _result(row)

    # --- dashboard, live events, metrics ---------------------------------------------------------------------
    @app.get("/api/snapshot", include_in_schema=False)
    async def snapshot(limit: int = Query(300, ge=1, le=SQL_MAX)):
        return {"prefix": settings.prefix if settings else None,
                "accounts": [_view(r) for r in store.recent_views(min(limit, MAX_PAGE))], "stats": stats.get()}

    @app.get("/api/stats", include_in_schema=False)
    async def get_stats():
        return stats.get()

    @app.get("/events", summary="Server-sent events: `balances` (changed account views) and `stats` (1/s)",
             responses=_errors(422))
    async def events(request: Request, since: int | None = Query(None, **SEQ),
                     max_s: float = Query(SSE_STREAM_S, gt=0, le=3600)):
        # A reconnecting EventSource sends the id of the last event it got: resume there, nothing missed.
        last_id = request.headers.get("last-event-id", "")
        if last_id.isdigit():
            since = int(last_id)
        return StreamingResponse(_event_stream(request, store, stats, since, max_s), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @app.get("/metrics", include_in_schema=False)
    async def metrics():
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/", include_in_schema=False)
    async def dashboard():
        return FileResponse(DASHBOARD / "index.html")

    app.mount("/static", StaticFiles(directory=DASHBOARD), name="static")
    return app


async def _event_stream(request: Request, store: Store, stats: StatsCache, since: int | None, max_s: float):
    """The SSE feed: changed account views (by store version) as they come, stats once a second, for max_s."""
    version = store.version() if since is None else since
    started = time.monotonic()
    last_stats = 0.0
    yield "retry: 2000\n\n"
    while time.monotonic() - started < max_s:
        if await request.is_disconnected():
            return
        rows = store.views_since(version)
        if rows:
            version = max(r["version"] for r in rows)
            yield f"event: balances\nid: {version}\ndata: {json.dumps([_view(r) for r in rows])}\n\n"
        if time.monotonic() - last_stats >= 1.0:
            last_stats = time.monotonic()
            yield f"event: stats\ndata: {json.dumps(stats.get())}\n\n"
        await asyncio.sleep(0.25)


def serve(settings: Settings, target: str | Path, host: str = "127.0.0.1", port: int = 8080,
          projector: bool = True) -> None:
    """`ledger api`: the API and dashboard (and by default the projector in a thread)."""
    import uvicorn

    app = create_app(target, settings, projector=projector)
    print(f"ledger api: dashboard at http://{host}:{port}/  (OpenAPI at /docs, store {display(target)})", flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")
