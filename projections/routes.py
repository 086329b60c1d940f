"""The read API's routes: each asks the store (projections/store.py holds every query) and shapes its rows
(projections/answers.py); nothing else.

A route is a small async handler that checks its parameters and hands a named body function to
`ReadSide.answer`, which runs it in a reading thread (projections/hub.py) and encodes the answer there. What
the handlers share (the readers, the hub, the stats) is the app's `ReadSide`, built by create_app
(projections/api.py).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable

from fastapi import APIRouter, Query, Request
from fastapi.responses import FileResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from projections import answers, fold
from projections.answers import ApiError, account_or_404, errors, single_sequence
from projections.drift import DriftChecker
from projections.hub import Hub, Readers, caught_up, event_stream
from projections.metrics import StatsCache, money, transfers_older_than
from projections.reports import BadAsOf, parse_as_of, trial_balance_json
from projections.store import Store
from streams import names, routing

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

router = APIRouter()


def json_response(body: Any) -> Response:
    """An answer encoded once, in the reading thread (FastAPI's generic encoder walks the dict again)."""
    return Response(json.dumps(body, separators=(",", ":")).encode(), media_type="application/json")


@dataclass(frozen=True)
class ReadSide:
    """What every route reads through (one per app, on `app.state.read_side`)."""

    readers: Readers
    hub: Hub
    stats: StatsCache
    registry: CollectorRegistry
    drift: DriftChecker | None
    prefix: str | None  # the ledger's topic prefix, shown by the dashboard
    min_seq_timeout_s: float  # how long read-your-writes waits for min_seq
    inline_lookups: bool = False  # SQLite: lookups by key are answered on the event loop (`lookup`)

    async def answer(self, body: Callable[..., Any], account_id: str | None = None,
                     min_seq: int | None = None) -> Response:
        """body(store[, row]) in a reading thread, encoded there. With an account: its view first (404 when
        unknown), after waiting for min_seq if given (503 when it does not come)."""
        if account_id is None:
            return await self.readers.run(lambda store: json_response(body(store)))
        if min_seq is None:
            return await self.readers.run(lambda store: json_response(body(store, account_or_404(store, account_id))))
        row = await caught_up(self.hub, account_id, min_seq, self.min_seq_timeout_s)
        return await self.readers.run(lambda store: json_response(body(store, row)))

    async def lookup(self, body: Callable[..., Any], account_id: str) -> Response:
        """An account's answer made of lookups by key (its view, its type): as `answer`, but in SQLite on the
        event loop itself. There such a read takes tens of microseconds and never waits for the writer (WAL),
        while handing it to a thread and back cost the server three times the CPU of the whole request (the
        read-side benchmark, GIL hand-offs included). PostgreSQL's round trip stays in a reading thread."""
        if not self.inline_lookups:
            return await self.answer(body, account_id)
        return self.readers.call(lambda store: json_response(body(store, account_or_404(store, account_id))))


def read_side(request: Request) -> ReadSide:
    return request.app.state.read_side


# --- accounts ---------------------------------------------------------------------------------------------------
def account(store: Store, row, account_id: str) -> dict[str, Any]:
    view = {**answers.view(row), "account_type": store.account_type(account_id)}
    if "shards" in view:
        view["shard_views"] = [answers.view({**dict(s), "shards": 1}) for s in store.shards(account_id)]
    return view


@router.get("/accounts/{account_id}", summary="Balance view (system accounts summed over their shards)",
            responses=errors(404, 422, 503))
async def get_account(request: Request, account_id: str, min_seq: int | None = Query(None, **SEQ)):
    body = partial(account, account_id=account_id)
    if min_seq is None:
        return await read_side(request).lookup(body, account_id)
    return await read_side(request).answer(body, account_id, min_seq)


class AccountLookups:
    """ASGI middleware answering the hottest read, `GET /accounts/{id}` without a query string, as get_account
    does (same body function, same bytes), without FastAPI's route matching and parameter solving, which cost
    more CPU than the lookup itself. Anything else goes on to the app. Added inside the token gate, so access
    is judged first; an ApiError is answered by `error`, the app's own error answer, and any other exception
    reaches the app's handler of unexpected errors, as from a route."""

    PREFIX = "/accounts/"

    def __init__(self, app, read_side: ReadSide, error: Callable[..., Response]):
        self.app, self.read_side, self.error = app, read_side, error

    async def __call__(self, scope, receive, send):
        path = scope["path"] if scope["type"] == "http" else ""
        account_id = path[len(self.PREFIX):]
        if (path.startswith(self.PREFIX) and account_id and "/" not in account_id and scope["method"] == "GET"
                and not scope["query_string"] and not scope.get("root_path")):
            try:
                response = await self.read_side.lookup(partial(account, account_id=account_id), account_id)
            except ApiError as exc:
                response = self.error(exc.status, exc.code, exc.message, exc.headers)
            return await response(scope, receive, send)
        return await self.app(scope, receive, send)


def history_page(store: Store, row, account_id: str, cursor: int, page: int) -> dict[str, Any]:
    single_sequence(store, row)
    rows = store.history_page(account_id, cursor, page + 1)
    more = len(rows) > page
    rows = rows[:page]
    return {"account_id": account_id, "limit": page, "entries": [answers.entry(r) for r in rows],
            "next_cursor": str(rows[-1]["seq"]) if more else None}


@router.get("/accounts/{account_id}/history", summary="Account journal, oldest first, cursor = last seq seen",
            responses=errors(400, 404, 422, 503))
async def get_history(request: Request, account_id: str, cursor: int | None = Query(None, **SEQ),
                      limit: int = Query(100, ge=1, le=SQL_MAX), min_seq: int | None = Query(None, **SEQ)):
    body = partial(history_page, account_id=account_id, cursor=cursor or 0, page=min(limit, MAX_PAGE))
    return await read_side(request).answer(body, account_id, min_seq)


def balance_as_of(store: Store, row, account_id: str, as_of_ms: int | None, as_of_seq: int | None) -> dict[str, Any]:
    if as_of_seq is None:
        posted, held = store.balance_as_of_ms(account_id, as_of_ms)
        return answers.balance(account_id, row["currency"], posted, held, as_of_ms=as_of_ms)
    single_sequence(store, row)
    if as_of_seq > row["seq"]:
        raise ApiError(404, "unknown_seq", f"{account_id} is at seq {row['seq']}, not {as_of_seq}, "
                                           "in the read store (min_seq waits for it)")
    entry = store.entry_at_seq(account_id, as_of_seq)
    posted, held = (0, 0) if entry is None else (int(entry["posted_after"]), int(entry["held_after"]))
    return answers.balance(account_id, row["currency"], posted, held, as_of_seq=as_of_seq)


@router.get("/accounts/{account_id}/balance", summary="Balance as of a business time or as of a seq",
            responses=errors(400, 404, 422, 503))
async def get_balance_as_of(request: Request, account_id: str,
                            as_of_ms: int | None = Query(None, ge=-SQL_MAX, le=SQL_MAX),
                            as_of_seq: int | None = Query(None, **SEQ), min_seq: int | None = Query(None, **SEQ)):
    if (as_of_ms is None) == (as_of_seq is None):
        raise ApiError(422, "invalid_parameter", "give exactly one of as_of_ms and as_of_seq")
    body = partial(balance_as_of, account_id=account_id, as_of_ms=as_of_ms, as_of_seq=as_of_seq)
    return await read_side(request).answer(body, account_id, min_seq)


def holds(store: Store, row, account_id: str, open_only: bool) -> dict[str, Any]:
    return {"account_id": account_id,
            "holds": [answers.hold(h, row["currency"]) for h in store.holds_of(account_id, open_only)]}


@router.get("/accounts/{account_id}/holds", summary="Holds on the account (open ones by default)",
            responses=errors(404, 422, 503))
async def get_holds(request: Request, account_id: str, status: str = Query("open", pattern="^(open|all)$"),
                    min_seq: int | None = Query(None, **SEQ)):
    body = partial(holds, account_id=account_id, open_only=status == "open")
    return await read_side(request).answer(body, account_id, min_seq)


def series(store: Store, row, account_id: str, limit: int) -> dict[str, Any]:
    single_sequence(store, row)
    rows = store.journal_tail(account_id, limit)
    cur = row["currency"]
    return {"account_id": account_id, "currency": cur,
            "points": [{"seq": r["seq"], "at_ms": r["at_ms"], "posted": money(int(r["posted_after"]), cur),
                        "held": money(int(r["held_after"]), cur)} for r in rows]}


# --- transactions and commands ----------------------------------------------------------------------------------
def transaction(store: Store, transaction_id: str, client_id: str | None) -> dict[str, Any]:
    entries, results = store.transaction(transaction_id, client_id)
    if not entries and not results:
        raise ApiError(404, "unknown_transaction", f"no transaction {transaction_id!r} in the read store")
    owners = sorted({names.owner(r["client_id"], r["command_id"], routing.ENGINE_CLIENT) for r in [*entries, *results]}
                    - {routing.ENGINE_CLIENT})
    if len(owners) > 1:  # each client names its own transactions: say whose
        raise ApiError(409, "ambiguous_transaction", f"clients {', '.join(owners)} each have a transaction "
                                                     f"{transaction_id!r}: ask with client_id")
    clearing = fold.in_clearing(entries)
    first = next((e for e in entries if e["amount"] != "0"), None)
    why = {} if first is None else {"kind": first["kind"], "reference": first["reference"],
                                    "occurred_at_ms": first["occurred_at_ms"], **answers.why(first)}
    return {"transaction_id": transaction_id, "status": fold.transaction_status(entries, results), **why,
            "linked_by": store.linked_to(transaction_id),
            "legs": [answers.entry(e) for e in entries if e["amount"] != "0"],
            "in_clearing": [money(v, c) for c, v in sorted(clearing.items()) if v],
            "results": [answers.result(r) for r in results if r["client_id"] != routing.ENGINE_CLIENT]}


@router.get("/transactions/{transaction_id}", summary="A transaction's legs and status (posted, in_flight, rejected, "
                                                   "pending), scoped by client", responses=errors(404, 409, 422))
async def get_transaction(request: Request, transaction_id: str, client_id: str | None = None):
    body = partial(transaction, transaction_id=transaction_id, client_id=client_id)
    return await read_side(request).answer(body)


@router.get("/reports/trial-balance", summary="Every account's balance as of a business time, by currency and "
                                              "account type, debits against credits", responses=errors(422))
async def get_trial_balance(request: Request, as_of: str | None = Query(None, max_length=64)):
    try:
        as_of_ms = None if as_of is None else parse_as_of(as_of)
    except BadAsOf as exc:
        raise ApiError(422, "invalid_parameter", str(exc)) from None
    return await read_side(request).answer(lambda store: trial_balance_json(store.trial_balance(as_of_ms), as_of_ms))


def linked_history(store: Store, link: str | None, flow: str | None) -> dict[str, Any]:
    if (link is None) == (flow is None):
        raise ApiError(422, "invalid_parameter", "give exactly one of link= and flow=")
    ids = store.linked_to(link) if link is not None else store.flow(flow)
    return {"link": link, "flow": flow, "transactions": ids,
            "entries": [answers.entry(e) for e in store.entries_of(ids) if e["amount"] != "0"]}


@router.get("/history", summary="History entries of the transactions that link to a transaction (link=) or "
                                "of its whole flow (flow=): it and everything linked to it, either way",
            responses=errors(422))
async def get_linked_history(request: Request, link: str | None = Query(None, min_length=1),
                             flow: str | None = Query(None, min_length=1)):
    return await read_side(request).answer(partial(linked_history, link=link, flow=flow))


def command(store: Store, client_id: str, command_id: str) -> dict[str, Any]:
    row = store.result(client_id, command_id)
    if row is None:
        raise ApiError(404, "unknown_command", f"no result for {client_id}/{command_id} in the read store")
    return answers.result(row)


@router.get("/commands/{client_id}/{command_id:path}", summary="The decision for a command (not duplicates)",
            responses=errors(404))
async def get_command(request: Request, client_id: str, command_id: str):
    return await read_side(request).answer(partial(command, client_id=client_id, command_id=command_id))


@router.get("/accounts/{account_id}/series", summary="Posted and held after each change, for a chart",
            responses=errors(400, 404, 422))
async def get_series(request: Request, account_id: str, limit: int = Query(500, ge=1, le=SQL_MAX)):
    """The account's last `limit` changes (at most MAX_PAGE): log time, seq, posted and held after each."""
    return await read_side(request).answer(partial(series, account_id=account_id, limit=min(limit, MAX_PAGE)),
                                           account_id)


# --- operations: transfers in clearing, drift -------------------------------------------------------------------
@router.get("/transfers/in-clearing", summary="Cross-partition transfers with money still in clearing",
            responses=errors(422))
async def get_in_clearing(request: Request, older_than_s: float = Query(0.0, ge=0, le=10**9)):
    """Oldest first; `older_than_s` keeps those in clearing at least that long (stuck ones: see
    LEDGER_STUCK_AFTER_S and the ledger_stuck_transfers metric)."""
    side = read_side(request)
    return await side.answer(lambda store: {"older_than_s": older_than_s, "stuck_after_s": side.stats.stuck_after_s,
                                            "transfers": transfers_older_than(store, older_than_s)})


@router.get("/drift", summary="The background drift check: accounts whose balance differs from their history")
async def get_drift(request: Request):
    drift = read_side(request).drift
    return json_response(drift.report() if drift is not None else {"enabled": False})


# --- dashboard, live events, metrics ----------------------------------------------------------------------------
@router.get("/healthz", include_in_schema=False)
async def healthz():
    """No database: the serving path alone (the benchmark's ceiling for the account lookup)."""
    return Response(b'{"ok":true}', media_type="application/json")


@router.get("/api/snapshot", include_in_schema=False)
async def snapshot(request: Request, limit: int = Query(300, ge=1, le=SQL_MAX)):
    side = read_side(request)
    return await side.answer(lambda store: {
        "prefix": side.prefix, "accounts": [answers.view(r) for r in store.recent_views(min(limit, MAX_PAGE))],
        "stats": side.stats.get()})


@router.get("/api/stats", include_in_schema=False)
async def get_stats(request: Request):
    side = read_side(request)
    return await side.answer(lambda store: side.stats.get())


@router.get("/events", summary="Server-sent events: `balances` (changed account views) and `stats` (1/s)",
            responses=errors(422))
async def events(request: Request, since: int | None = Query(None, **SEQ),
                 max_s: float = Query(SSE_STREAM_S, gt=0, le=3600)):
    # A reconnecting EventSource sends the id of the last event it got: resume there, nothing missed.
    last_id = request.headers.get("last-event-id", "")
    if last_id.isdigit():
        since = int(last_id)
    return StreamingResponse(event_stream(read_side(request).hub, since, max_s), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


@router.get("/metrics", include_in_schema=False)
async def metrics(request: Request):
    side = read_side(request)
    return await side.readers.run(lambda store: Response(generate_latest(side.registry),
                                                         media_type=CONTENT_TYPE_LATEST))


@router.get("/", include_in_schema=False)
async def dashboard():
    return FileResponse(DASHBOARD / "index.html")
