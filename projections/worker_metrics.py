"""What the dashboard shows of the workers themselves: produce->result latency and lag per partition.

The read store cannot know them (results carry the command's own time, not when they were decided), so the
read API reads the workers' Prometheus endpoints (LEDGER_WORKER_METRICS: a comma-separated list of
`host:port` or URLs, e.g. `127.0.0.1:9108`) the way Prometheus would, at most once a second, and keeps a
short history: latency percentiles over the last WINDOW_S from the histogram's bucket deltas (what
`histogram_quantile(q, rate(...[WINDOW_S]))` computes in Prometheus) and the commands lag of each partition.
Without the variable the dashboard says so and shows nothing for them.
"""
from __future__ import annotations

import os
import time
import urllib.request
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

LATENCY = "ledger_result_latency_seconds"
LAG = "ledger_consumer_lag"
WINDOW_S = 10.0
HISTORY = 300  # samples (one per second)
QUANTILES = (0.5, 0.95, 0.99)


def endpoints(env: dict[str, str] | None = None) -> list[str]:
    env = os.environ if env is None else env
    out = []
    for item in (env.get("LEDGER_WORKER_METRICS") or "").split(","):
        item = item.strip()
        if item:
            out.append(item if "://" in item else f"http://{item}/metrics")
    return out


def quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """Prometheus' histogram_quantile over cumulative (upper bound, count) buckets, +Inf last."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if bound == float("inf"):
                return lower  # beyond the last finite bucket: its bound is all one can say
            return lower + (bound - lower) * ((rank - below) / (count - below) if count > below else 1.0)
        lower, below = bound, count
    return lower


@dataclass
class WorkerMetrics:
    urls: list[str]
    timeout_s: float = 1.0
    _snapshots: deque = field(default_factory=lambda: deque(maxlen=64))  # (monotonic s, {le: cumulative})
    latency_history: deque = field(default_factory=lambda: deque(maxlen=HISTORY))
    lag: dict[int, int] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    _at: float = 0.0

    def _scrape(self) -> tuple[dict[float, float], dict[int, int]]:
        buckets: dict[float, float] = {}
        lag: dict[int, int] = {}
        for url in self.urls:
            try:
                text = urllib.request.urlopen(url, timeout=self.timeout_s).read().decode()
            except OSError as exc:
                self.errors[url] = str(exc)
                continue
            self.errors.pop(url, None)
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    if sample.name == LATENCY + "_bucket":
                        le = float(sample.labels["le"])
                        buckets[le] = buckets.get(le, 0.0) + sample.value
                    elif sample.name == LAG and "partition" in sample.labels:
                        lag[int(sample.labels["partition"])] = int(sample.value)
        return buckets, lag

    def refresh(self, now_ms: int) -> None:
        """Scrape (at most once a second) and add a latency sample over the last WINDOW_S."""
        now = time.monotonic()
        if not self.urls or now - self._at < 1.0:
            return
        self._at = now
        buckets, self.lag = self._scrape()
        self._snapshots.append((now, buckets))
        # The oldest snapshot within the window; at the first scrape, none: the workers' whole lifetime so far.
        old = next((b for t, b in self._snapshots if now - t <= WINDOW_S + 0.5), buckets)
        if len(self._snapshots) == 1:
            old = {}
        delta = sorted((le, count - old.get(le, 0.0)) for le, count in buckets.items())
        values = {f"p{round(q * 100)}": quantile(q, delta) for q in QUANTILES}
        if any(v is not None for v in values.values()):
            self.latency_history.append({"t_ms": now_ms, **values})

    def view(self) -> dict[str, Any]:
        return {"configured": bool(self.urls), "errors": dict(self.errors),
                "latency": list(self.latency_history),
                "lag": [{"partition": p, "lag": n} for p, n in sorted(self.lag.items())]}
