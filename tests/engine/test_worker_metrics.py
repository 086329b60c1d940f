"""A worker's Prometheus /metrics counts what it answered, why it rejected, and its lag."""
from __future__ import annotations

import socket
import time
import urllib.request

from connectors.client import LedgerClient, Leg


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    samples = {}
    for line in text.splitlines():
        if line.startswith("ledger_") and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def test_worker_metrics(settings, start_worker):
    port = free_port()
    start_worker(extra_env={"LEDGER_METRICS_PORT": str(port)})
    client = LedgerClient(settings, "metrics")
    ids = [client.open_account("user:mo:USD", "USD"),
           client.post("mo-dep", [Leg("sys:world:USD", -10), Leg("user:mo:USD", 10)], kind="deposit"),
           client.post("mo-over", [Leg("user:mo:USD", -50), Leg("sys:world:USD", 50)])]
    client.send_raw(b"poison", "user:mo:USD")
    client.wait(ids)
    deadline = time.monotonic() + 10
    while True:
        samples = scrape(port)
        if samples.get('ledger_dead_letters_total{reason="not_avro"}') == 1.0 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert samples['ledger_commands_total{kind="OpenAccount",outcome="accepted"}'] == 1.0
    assert samples['ledger_rejections_total{reason="insufficient_funds"}'] == 1.0
    assert samples['ledger_dead_letters_total{reason="not_avro"}'] == 1.0
    assert any(name.startswith("ledger_consumer_lag{") for name in samples)
    client.close()
