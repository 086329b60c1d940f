"""What the read side knows about the ledger's health, for the dashboard and Prometheus `/metrics`.

Everything is read from the read store (never the workers): projector lag, results by outcome and reason,
Σ posted per currency (P1), money in clearing and since when (P6), throughput by log time. `Stats` is
computed at most once per `max_age_s` and shared by every dashboard client and every scrape.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from projections.store import Store
from streams.core import DEFAULT_CURRENCIES, format_amount

THROUGHPUT_WINDOW_S = 120
LAG_HISTORY = 300  # samples (one per second)


def money(minor: int, currency: str) -> dict[str, str | None]:
    """An amount as exact minor units and, for a registered currency, the formatted decimal."""
    known = DEFAULT_CURRENCIES.get(currency)
    return {"minor": str(minor), "decimal": format_amount(minor, known) if known else None, "currency": currency}


@dataclass
class StatsCache:
    """Stats of one store, recomputed at most every max_age_s; lag samples kept for the chart."""

    store: Store
    max_age_s: float = 1.0
    _at: float = 0.0
    _value: dict[str, Any] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    lag_history: deque = field(default_factory=lambda: deque(maxlen=LAG_HISTORY))

    def get(self) -> dict[str, Any]:
        with self._lock:
            now = time.monotonic()
            if now - self._at >= self.max_age_s or not self._value:
                self._value = compute(self.store, self.lag_history)
                self._at = now
            return self._value


def compute(store: Store, lag_history: deque) -> dict[str, Any]:
    now_ms = int(time.time() * 1000)
    lag = store.lag()
    lag_total = sum(lag.values())
    # One sample per second at most: the dashboard's lag chart (the projector may run in another process).
    if not lag_history or now_ms - lag_history[-1][0] >= 1000:
        lag_history.append((now_ms, lag_total))

    outcomes = store.outcomes()
    rejections = sorted(({"reason": o["reason"], "count": o["count"]} for o in outcomes
                         if o["outcome"] == "rejected"), key=lambda r: -r["count"])
    recent = store.recent_rejections(12)

    # Commands per second by log time (the command's own timestamp), clients only (not engine steps).
    newest = store.newest_result_ms() or now_ms
    end_s = max(now_ms, newest) // 1000
    start_s = end_s - THROUGHPUT_WINDOW_S + 1
    per_second = store.results_per_second(start_s * 1000)
    throughput = [{"t": s, "accepted": per_second.get((s, "accepted"), 0),
                   "rejected": per_second.get((s, "rejected"), 0)} for s in range(start_s, end_s + 1)]

    sums = store.currency_sums()
    clearing = [{**money(c["posted"], c["currency"]),
                 "age_s": None if c["since_ms"] is None else max(now_ms - c["since_ms"], 0) / 1000}
                for c in store.clearing()]
    return {
        "now_ms": now_ms,
        "version": store.version(),
        "lag": lag,
        "lag_total": lag_total,
        "lag_history": [{"t_ms": t, "lag": n} for t, n in lag_history],
        "outcomes": outcomes,
        "rejections": rejections,
        "recent_rejections": recent,
        "throughput": throughput,
        "sums": [{**money(total, cur), "balanced": total == 0} for cur, total in sorted(sums.items())],
        "clearing": clearing,
        "reconciled": all(total == 0 for total in sums.values()),
        "accounts": store.account_count(),
    }


class ReadSideCollector(Collector):
    """Prometheus metrics from the stats cache (values are floats there; exact amounts are in the API)."""

    def __init__(self, stats: StatsCache):
        self.stats = stats

    def collect(self):
        s = self.stats.get()
        lag = GaugeMetricFamily("ledger_projector_lag_records", "End offset minus next applied offset, per topic.",
                                labels=["topic"])
        for topic, n in sorted(s["lag"].items()):
            lag.add_metric([topic], n)
        yield lag
        yield GaugeMetricFamily("ledger_projector_version", "Batches applied to the read store.", value=s["version"])
        results = CounterMetricFamily("ledger_read_results", "Decided commands in the read store.",
                                      labels=["outcome", "reason"])
        for o in s["outcomes"]:
            results.add_metric([o["outcome"], o["reason"] or ""], o["count"])
        yield results
        sums = GaugeMetricFamily("ledger_currency_sum_minor", "Sum of posted balances per currency (P1: 0).",
                                 labels=["currency"])
        for entry in s["sums"]:
            sums.add_metric([entry["currency"]], float(int(entry["minor"])))
        yield sums
        clearing = GaugeMetricFamily("ledger_clearing_minor", "Money in clearing per currency (P6: 0 when quiet).",
                                     labels=["currency"])
        age = GaugeMetricFamily("ledger_clearing_age_seconds", "Since when clearing holds money, per currency.",
                                labels=["currency"])
        for entry in s["clearing"]:
            clearing.add_metric([entry["currency"]], float(int(entry["minor"])))
            age.add_metric([entry["currency"]], entry["age_s"] or 0.0)
        yield clearing
        yield age
        yield GaugeMetricFamily("ledger_reconciliation_ok", "1 when every currency sums to zero (exact check).",
                                value=1 if s["reconciled"] else 0)
