"""The shipped Prometheus setup (ops/prometheus) against a real Prometheus: the rules pass `promtool check
rules` and their unit tests, and a Prometheus server using the shipped config scrapes a real worker and the
real read API, evaluates the shipped rules, and fires the dead-letter alert when garbage reaches the commands
topic; the metrics the rules and the Grafana dashboard (ops/grafana/ledger.json) use all exist there. The worker runs with LEDGER_LOG_FORMAT=json: every log line it writes is one JSON object."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request

import pytest

from connectors.client import LedgerClient, Leg
from projections.api import create_app
from tests.harness import ROOT
from tests.helpers.served import free_port, serving

OPS = ROOT / "ops" / "prometheus"
PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
# CI installs Debian's prometheus (.ci/run), so there these tests must run; elsewhere they may be skipped.
needs_prometheus = pytest.mark.skipif((PROMETHEUS is None or PROMTOOL is None) and not os.environ.get("CI"),
                                      reason="needs Debian's prometheus (apt-get install prometheus)")


@needs_prometheus
def test_the_rules_are_valid_and_their_unit_tests_pass():
    for args in (["check", "rules", "alerts.yml"], ["test", "rules", "alerts.test.yml"],
                 ["check", "config", "prometheus.yml"]):
        done = subprocess.run([PROMTOOL, *args], cwd=OPS, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr


def prometheus_api(port: int, path: str, **params: str) -> dict:
    url = f"http://127.0.0.1:{port}/api/v1/{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
    body = json.loads(urllib.request.urlopen(url, timeout=10).read())
    assert body["status"] == "success", body
    return body["data"]


def wait_for(what: str, check, timeout_s: float = 60.0):
    """check() until it returns something truthy; the last value when it never does (bounded wait, no timing
    claim: a slow machine only waits longer)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            assert value, f"gave up waiting for {what}"
            return value
        time.sleep(0.5)


@pytest.fixture
def api_port(settings, tmp_path):
    port = free_port()
    with serving(create_app(tmp_path / "read.db", settings, projector=True), port, timeout_s=30):
        yield port


@needs_prometheus
def test_prometheus_scrapes_a_worker_and_the_api_and_fires_an_alert(settings, start_worker, api_port, tmp_path):
    worker_port, prom_port = free_port(), free_port()
    worker = start_worker(extra_env={"LEDGER_METRICS_PORT": str(worker_port), "LEDGER_LOG_FORMAT": "json"})

    # The shipped config, pointed at this test's processes and evaluated every second.
    config = (OPS / "prometheus.yml").read_text()
    for old, new in (("127.0.0.1:9108", f"127.0.0.1:{worker_port}"), ("127.0.0.1:8080", f"127.0.0.1:{api_port}"),
                     ("scrape_interval: 15s", "scrape_interval: 1s"),
                     ("evaluation_interval: 15s", "evaluation_interval: 1s"),
                     ("- alerts.yml", f"- {OPS / 'alerts.yml'}")):
        assert old in config, old
        config = config.replace(old, new)
    (tmp_path / "prometheus.yml").write_text(config)
    log = open(tmp_path / "prometheus.log", "w")
    prom = subprocess.Popen([PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{prom_port}"],
                            stdout=log, stderr=subprocess.STDOUT)
    client = LedgerClient(settings, "prom")
    try:
        def targets_up():
            try:
                active = prometheus_api(prom_port, "targets")["activeTargets"]
            except OSError:
                return None
            return {t["labels"]["job"] for t in active if t["health"] == "up"} == {"ledger-worker", "ledger-api"}

        wait_for("both targets up", targets_up)

        ids = [client.open_account("user:prom:USD", "USD"),
               client.post("prom-dep", [Leg("sys:world:USD", -500), Leg("user:prom:USD", 500)], kind="deposit"),
               client.post("prom-over", [Leg("user:prom:USD", -900), Leg("sys:world:USD", 900)])]
        client.send_raw(b"not a command", "user:prom:USD")
        client.wait(ids)

        def dead_letter_alert():
            alerts = prometheus_api(prom_port, "alerts")["alerts"]
            return [a for a in alerts if a["labels"]["alertname"] == "LedgerDeadLetters" and a["state"] == "firing"]

        firing = wait_for("the dead-letter alert", dead_letter_alert)
        assert firing[0]["labels"]["reason"] == "not_avro" and firing[0]["labels"]["job"] == "ledger-worker"

        # The API's series arrive too, and the books balance there.
        wait_for("the API's reconciliation", lambda: prometheus_api(
            prom_port, "query", query='ledger_reconciliation_ok{job="ledger-api"} == 1')["result"])
        wait_for("the worker's latency", lambda: prometheus_api(
            prom_port, "query", query='sum(ledger_result_latency_seconds_count{job="ledger-worker"}) >= 2')["result"])
        # Every metric the rules and the Grafana dashboard use is one these processes expose, and every dashboard
        # query is valid PromQL. The clearing series exist per currency once a transfer crossed partitions in it
        # (the oldest transfer only while one is in flight): this run has none.
        grafana = json.loads((ROOT / "ops" / "grafana" / "ledger.json").read_text())
        queries = [t["expr"] for p in grafana["panels"] for t in p["targets"]]
        used = set(re.findall(r"ledger_[a-z_]+", (OPS / "alerts.yml").read_text() + " ".join(queries)))
        for series in ("ledger_rejections_total", 'ledger_currency_sum_minor{currency="USD"}'):
            wait_for(series, lambda: prometheus_api(prom_port, "query", query=series)["result"])
        exposed = set(prometheus_api(prom_port, "label/__name__/values"))
        assert used - exposed <= {"ledger_clearing_minor", "ledger_stuck_transfers",
                                  "ledger_clearing_oldest_transfer_seconds"}, used - exposed
        for query in queries:
            prometheus_api(prom_port, "query", query=query)  # an invalid one answers status error

        # No other rule fires on a healthy ledger (a pending one may still: a slow first batch, say).
        others = [a["labels"]["alertname"] for a in prometheus_api(prom_port, "alerts")["alerts"]
                  if a["labels"]["alertname"] != "LedgerDeadLetters" and a["state"] == "firing"]
        assert others == []
    finally:
        client.close()
        prom.terminate()
        prom.wait(20)
        log.close()

    lines = [line for line in worker.log_since_start().splitlines() if line.startswith("{")]
    docs = [json.loads(line) for line in lines]
    assert any(d["logger"].startswith("faust") or d["logger"].startswith("mode") for d in docs), lines[:5]
    assert all({"ts", "level", "logger", "message"} <= set(d) for d in docs)
    assert not [line for line in worker.log_since_start().splitlines() if line.startswith("[20")]  # no text logs
