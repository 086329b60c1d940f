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

Where things are: the routes (projections/routes.py) ask the store (projections/store.py, every query) and
shape its rows (projections/answers.py); reads run in threads and a hub follows the store for the live feed
and read-your-writes (projections/hub.py). This module builds the app: its state, its error answers, its
lifespan (the hub, and the projector and the drift check when asked), and serves it.
"""
from __future__ import annotations

import inspect
import logging
import os
import threading
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles
from prometheus_client import CollectorRegistry
from starlette.exceptions import HTTPException as StarletteHTTPException

from projections.access import ApiTokens, TokenGate
from projections.answers import ApiError
from projections.db import display, is_postgres
from projections.drift import CHECK_EVERY_S as DRIFT_EVERY_S, CPU_SHARE as DRIFT_SHARE, DriftChecker, run as run_drift
from projections.hub import POLL_S, READ_THREADS, Hub, Readers
from projections.metrics import ReadSideCollector, StatsCache
from projections.routes import DASHBOARD, AccountLookups, ReadSide, router
from projections.store import Store
from projections.worker_metrics import WorkerMetrics, endpoints
from streams.config import Settings

log = logging.getLogger("ledger.api")
# FastAPI's native OpenTelemetry (newer versions) asks for its providers in the environment on every request,
# a sizeable share of a lookup's CPU; the read API exports no traces, so it is switched off where it exists.
NO_TELEMETRY = ({"telemetry": {"tracing": False, "metrics": False, "logs": False}}
                if "telemetry" in inspect.signature(FastAPI).parameters else {})


def _error(status: int, code: str, message: str, headers: dict[str, str] | None = None, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message, **extra}}, status_code=status, headers=headers)


# --- the app ----------------------------------------------------------------------------------------------------
def _lifespan(target: str | Path, settings: Settings | None, projector: bool, readers: Readers, hub: Hub,
              drift: DriftChecker | None = None, drift_every_s: float = 0.0,
              drift_share: float = DRIFT_SHARE):
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
            checker = threading.Thread(target=run_drift, name="drift-check", daemon=True,
                                       args=(drift, str(target), stop, drift_every_s, drift_share))
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
               worker_metrics: list[str] | None = None, drift_share: float = DRIFT_SHARE) -> FastAPI:
    """The API over the store `target` (a SQLite path or a postgresql:// URL). projector=True also runs the
    projector in a thread (needs settings). drift_every_s > 0 runs the background drift check
    (projections/drift.py) with that pause between passes, at drift_share of a core. tokens: who may read what (projections/access.py); None: those of
    LEDGER_API_TOKENS, or open when it is not set. worker_metrics: the workers' /metrics URLs for the dashboard's
    latency and lag per partition (None: LEDGER_WORKER_METRICS). The routes (projections/routes.py) ask the
    store and format its rows; nothing else."""
    # The writer creates the schema; a reader needs it to exist before its first query.
    Store(target, settings.prefix if settings else None).close()
    readers = Readers(target, read_threads)
    drift = DriftChecker() if drift_every_s > 0 else None
    stats = StatsCache(Store(target, readonly=True), drift=drift,
                       workers=WorkerMetrics(endpoints() if worker_metrics is None else worker_metrics))
    hub = Hub(readers, stats, poll_s)
    registry = CollectorRegistry()
    registry.register(ReadSideCollector(stats))

    app = FastAPI(title="Ledger read API", version="1", **NO_TELEMETRY,
                  lifespan=_lifespan(target, settings, projector, readers, hub, drift, drift_every_s,
                                     drift_share),
                  description="Balances, history, holds, transactions and command results from the read store. "
                              "Read-only. " + (__doc__ or "").split("stable codes:")[-1])
    app.state.readers = readers
    app.state.stats = stats
    app.state.hub = hub
    app.state.read_side = ReadSide(readers, hub, stats, registry, drift, settings.prefix if settings else None,
                                   min_seq_timeout_s, inline_lookups=not is_postgres(target))
    _answer_errors_as_json(app)
    # The account lookup's short path, inside the token gate (a middleware added later runs first).
    app.add_middleware(AccountLookups, read_side=app.state.read_side, error=_error)
    tokens = tokens if tokens is not None else ApiTokens.from_env()
    if tokens is not None:  # every request passes the token gate first (projections/access.py)
        app.add_middleware(TokenGate, tokens=tokens)
    app.include_router(router)
    app.mount("/static", StaticFiles(directory=DASHBOARD), name="static")
    return app


def app_from_env() -> FastAPI:
    """The app of one served process when `ledger api` runs several (uvicorn's factory, settings from the
    environment; the projector runs in the supervising process)."""
    from streams import config, logs

    logs.setup()  # a served process is spawned afresh: it logs as its supervisor does
    settings = config.load()
    if os.environ.get("LEDGER_API_PREFIX"):
        settings = settings.with_prefix(os.environ["LEDGER_API_PREFIX"])
    # Each served process checks for drift on its own (its /drift and metrics report its own walk), so together
    # they keep to the one share of a core a single process takes.
    processes = max(1, int(os.environ.get("LEDGER_API_PROCESSES", "1")))
    return create_app(os.environ["LEDGER_API_TARGET"], settings, projector=False,
                      read_threads=int(os.environ.get("LEDGER_API_READ_THREADS", READ_THREADS)),
                      drift_share=DRIFT_SHARE / processes)


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
    os.environ["LEDGER_API_PROCESSES"] = str(workers)
    try:
        uvicorn.run("projections.api:app_from_env", factory=True, host=host, port=port, workers=workers,
                    log_level="warning", log_config=logs.uvicorn_log_config())
    finally:
        stop.set()
        if thread is not None:
            thread.join(10)
