from __future__ import annotations

import os

import pytest
from hypothesis import settings as hypothesis_settings

from tests.harness import Worker, bootstrap, drop, fresh_settings

# `make mutate` runs the broker-free tests once per mutant with HYPOTHESIS_PROFILE=mutation: fewer examples
# (see tests/core/budget.py), always the same ones (derandomize) and no example database, so a mutant's verdict
# does not depend on what an earlier run found. Without the variable nothing changes.
hypothesis_settings.register_profile("mutation", derandomize=True, database=None, deadline=None, max_examples=25)
if os.environ.get("HYPOTHESIS_PROFILE") == "mutation":
    hypothesis_settings.load_profile("mutation")


@pytest.fixture(scope="session")
def kafka_bootstrap() -> str:
    return bootstrap()


@pytest.fixture
def settings(kafka_bootstrap):
    s = fresh_settings(kafka_bootstrap)
    yield s
    drop(s)


@pytest.fixture
def start_worker(settings, tmp_path):
    """start_worker(name) -> a running Worker; every worker is stopped at the end of the test."""
    workers: list[Worker] = []

    def start(name: str = "w1", **kwargs) -> Worker:
        w = Worker(settings, tmp_path / name, name, **kwargs)
        workers.append(w)
        return w.start()

    yield start
    for w in workers:
        w.resume() if w.alive else None
        w.kill9()
