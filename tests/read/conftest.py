"""One realistic ledger run shared by the read-side tests (a worker start and the example cost seconds).

The stream: DESIGN.md §8's worked example (cross-partition trade, holds, fees), plus an account with
enough history to page through (back-dated deposits for as-of queries), an open hold and a rejection.
Tests that add traffic use their own accounts, so the balances asserted here never move.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from connectors.client import LedgerClient, Leg
from connectors.demo import EXPECTED, final_balances, run_example
from projections.projector import catch_up
from projections.verify import wait_quiescent
from streams.config import Settings
from tests.harness import Worker, drop, fresh_settings

PAGER = "user:pager:USD"
DEPOSITS = 30  # 30 deposits of 1.00 USD, business time 1_000_000 + i * 1000 ms
BASE_MS = 1_000_000


@dataclass
class LedgerRun:
    settings: Settings
    worker: Worker
    client: LedgerClient
    db: Path  # a read store caught up with everything below


@pytest.fixture(scope="package")
def ledger_run(kafka_bootstrap, tmp_path_factory) -> LedgerRun:
    settings = fresh_settings(kafka_bootstrap)
    worker = Worker(settings, tmp_path_factory.mktemp("worker"), "w1").start()
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
        db = tmp_path_factory.mktemp("read") / "read.db"
        catch_up(settings, db)
        yield LedgerRun(settings, worker, client, db)
    finally:
        client.close()
        worker.kill9()
        drop(settings)
