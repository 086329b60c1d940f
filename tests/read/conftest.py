"""One realistic ledger run shared by the read-side tests (a worker start and the example cost seconds).

The stream: DESIGN.md §8's worked example (cross-partition trade, holds, fees), plus an account with
enough history to page through (back-dated deposits for as-of queries), an open hold and a rejection.
Tests that add traffic use their own accounts, so the balances asserted here never move.

Every store test runs against both read-store backends: the `backend` fixture is `sqlite` or `postgres`
(the server of LEDGER_TEST_PG_URL, which `make test` starts; the tests work in a database of their own,
dropped at the end). Without that URL the PostgreSQL cases are skipped, except under CI, where they fail.
"""
from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from typing import Callable, Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest

from connectors.client import LedgerClient, Leg
from connectors.demo import EXPECTED, final_balances, run_example
from projections.db import with_schema
from projections.projector import catch_up
from projections.verify import wait_quiescent
from streams.config import Settings
from projections.api import create_app
from tests.harness import Worker, drop, fresh_settings
from tests.helpers.served import free_port, serving

PAGER = "user:pager:USD"
DEPOSITS = 30  # 30 deposits of 1.00 USD, business time 1_000_000 + i * 1000 ms
BASE_MS = 1_000_000
PG_URL = os.environ.get("LEDGER_TEST_PG_URL")
BACKENDS = ("sqlite", "postgres")


def require_postgres() -> None:
    """Skip a PostgreSQL case without a test server; CI starts one (scripts/with-postgres.sh), so there it fails."""
    if PG_URL:
        return
    if os.environ.get("CI"):
        pytest.fail("LEDGER_TEST_PG_URL is not set: CI must test the PostgreSQL read store")
    pytest.skip("needs LEDGER_TEST_PG_URL: scripts/postgres.sh start; "
                "export LEDGER_TEST_PG_URL=$(scripts/postgres.sh url)")


@dataclass
class LedgerRun:
    settings: Settings
    worker: Worker
    client: LedgerClient
    stores: dict[str, str]  # backend -> a read store caught up with everything below
    worker_metrics: str = ""  # the worker's Prometheus /metrics URL (the dashboard's latency and lag)


@pytest.fixture(scope="package")
def pg_database() -> Iterator[str | None]:
    """The URL of a database of the tests' own on the LEDGER_TEST_PG_URL server (dropped afterwards), or None."""
    if not PG_URL:
        yield None
        return
    import psycopg

    name = f"ledger_test_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    try:
        yield urlunsplit(urlsplit(PG_URL)._replace(path=f"/{name}"))
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE {name} WITH (FORCE)")  # FORCE: API threads may still be connected


@pytest.fixture(scope="package", params=BACKENDS)
def backend(request) -> str:
    if request.param == "postgres":
        require_postgres()
    return request.param


@pytest.fixture
def new_store(backend, pg_database, tmp_path) -> Callable[[str], str]:
    """new_store(name) -> the target of a store that does not exist yet, in the backend under test."""
    def make(name: str) -> str:
        if backend == "sqlite":
            return str(tmp_path / f"{name}.db")
        return with_schema(pg_database, f"{name}_{uuid.uuid4().hex[:8]}")

    return make


@pytest.fixture(scope="package")
def read_db(ledger_run, backend) -> str:
    """The shared run's read store in the backend under test."""
    return ledger_run.stores[backend]


@pytest.fixture(scope="package")
def ledger_run(kafka_bootstrap, tmp_path_factory, pg_database) -> LedgerRun:
    settings = fresh_settings(kafka_bootstrap)
    metrics_port = free_port()
    worker = Worker(settings, tmp_path_factory.mktemp("worker"), "w1",
                    extra_env={"LEDGER_METRICS_PORT": str(metrics_port)}).start()
    client = LedgerClient(settings, "read-tests")
    try:
        assert all(r["outcome"] == "accepted" for r in run_example(client))
        ids = [client.open_account(PAGER, "USD")]
        client.result(ids[0])
        ids += [client.post(f"pager-dep-{i}", [Leg("sys:world:USD", -100), Leg(PAGER, 100)], kind="deposit",
                            occurred_at_ms=BASE_MS + i * 1000) for i in range(DEPOSITS)]
        ids.append(client.place_hold("pager-hold", PAGER, 500))
        ids.append(client.post("pager-over", [Leg(PAGER, -10**9), Leg("sys:world:USD", 10**9)]))
        results = client.wait(ids, 60)
        assert results["pager-over"]["reason"] == "insufficient_funds"
        assert final_balances(settings, list(EXPECTED)) == EXPECTED
        assert wait_quiescent(settings)
        # Caught up here, before any test adds traffic, so both stores hold exactly the stream above.
        stores = {"sqlite": str(tmp_path_factory.mktemp("read") / "read.db")}
        if pg_database:
            stores["postgres"] = with_schema(pg_database, "read")
        for target in stores.values():
            catch_up(settings, target)
        yield LedgerRun(settings, worker, client, stores, f"http://127.0.0.1:{metrics_port}/metrics")
    finally:
        client.close()
        worker.kill9()
        drop(settings)


@pytest.fixture
def served(ledger_run, new_store):
    """The API with its projector on a fresh store (each backend), served by uvicorn on a free loopback port:
    its base URL."""
    with serving(create_app(new_store("dash"), ledger_run.settings, projector=True,
                            worker_metrics=[ledger_run.worker_metrics])) as url:
        yield url
