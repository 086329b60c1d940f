from __future__ import annotations

import pytest

from tests.harness import Worker, bootstrap, drop, fresh_settings


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
