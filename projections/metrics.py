"""What the read side knows about the ledger's health, for the dashboard and Prometheus `/metrics`.

Everything is read from the read store (never the workers): projector lag, results by outcome and reason,
Σ posted per currency (P1), money in clearing (P6) with the transfers holding it, throughput by log time, and
the background drift check's findings (projections/drift.py). Only the produce->result latency and the
commands lag per partition come from the workers' own /metrics (projections/worker_metrics.py). `Stats` is
computed at most once per `max_age_s` and shared by every dashboard client and every scrape.

Clearing age is the age of the oldest transfer still in clearing, not how long the clearing account has been
non-zero: under steady cross-partition traffic clearing is never empty, but each transfer leaves it within
moments, so the age stays small and only a stuck transfer makes it grow; the metric names that transfer.
"""
from __future__ import annotations

import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from projections.drift import DriftChecker
from projections.store import Store
from projections.worker_metrics import WorkerMetrics, endpoints
from streams.config import ConfigError
from streams.core import DEFAULT_CURRENCIES, format_amount

THROUGHPUT_WINDOW_S = 120
LAG_HISTORY = 300  # samples (one per second)
TRANSFERS_MAX_AGE_S = 5.0  # how often the transfers in clearing are listed afresh (a pass over clearing's journal)
TRANSFERS_SHOWN = 20


def stuck_after_s(env: dict[str, str] | None = None) -> float:
    """LEDGER_STUCK_AFTER_S: a transfer longer than this in clearing is stuck (default 60)."""
    env = os.environ if env is None else env
    text = env.get("LEDGER_STUCK_AFTER_S") or "60"
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"LEDGER_STUCK_AFTER_S={text!r} is not a number") from None
    if value <= 0:
        raise ConfigError(f"LEDGER_STUCK_AFTER_S={text!r} must be more than 0")
    return value


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
    clearing_history: deque = field(default_factory=lambda: deque(maxlen=LAG_HISTORY))
    drift: DriftChecker | None = None
    workers: WorkerMetrics = field(default_factory=lambda: WorkerMetrics(endpoints()))
    stuck_after_s: float = field(default_factory=stuck_after_s)
    _transfers: list[dict] = field(default_factory=list)
    _transfers_at: float = 0.0

    def get(self) -> dict[str, Any]:
        with self._lock:
            now = time.monotonic()
            if now - self._at >= self.max_age_s or not self._value:
                if now - self._transfers_at >= TRANSFERS_MAX_AGE_S:
                    self._transfers = self.store.transfers_in_clearing()
                    self._transfers_at = now
                self._value = compute(self.store, self.lag_history, self._transfers, self.stuck_after_s,
                                      self.clearing_history)
                self._value["drift"] = self.drift.report() if self.drift is not None else None
                self.workers.refresh(self._value["now_ms"])
                self._value["workers"] = self.workers.view()
                self._at = now
            return self._value



def transfers_older_than(store: Store, older_than_s: float = 0.0) -> list[dict[str, Any]]:
    """Transfers in clearing now, oldest first, in clearing for at least older_than_s."""
    now_ms = int(time.time() * 1000)
    return [transfer_view(t, now_ms) for t in store.transfers_in_clearing()
            if now_ms - t["since_ms"] >= older_than_s * 1000]


def transfer_view(t: dict, now_ms: int) -> dict[str, Any]:
    return {"transaction_id": t["transaction_id"], **money(t["amount"], t["currency"]),
            "since_ms": t["since_ms"], "age_s": max(now_ms - t["since_ms"], 0) / 1000}


def compute(store: Store, lag_history: deque, transfers: list[dict] | None = None, stuck_s: float = 60.0,
            clearing_history: deque | None = None) -> dict[str, Any]:
    now_ms = int(time.time() * 1000)
    transfers = [transfer_view(t, now_ms) for t in (transfers or [])]
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
    oldest: dict[str, dict] = {}
    for t in transfers:  # oldest first
        oldest.setdefault(t["currency"], t)
    clearing = []
    for c in store.clearing():
        first = oldest.get(c["currency"])
        clearing.append({**money(c["posted"], c["currency"]),
                         "age_s": first["age_s"] if first else None,
                         "oldest_transaction_id": first["transaction_id"] if first else None,
                         "transfers": sum(t["currency"] == c["currency"] for t in transfers),
                         "stuck": sum(t["currency"] == c["currency"] and t["age_s"] >= stuck_s
                                      for t in transfers)})
    if clearing_history is not None and (not clearing_history or now_ms - clearing_history[-1]["t_ms"] >= 1000):
        clearing_history.append({"t_ms": now_ms, "minor": {c["currency"]: c["minor"] for c in clearing}})
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
        "clearing_history": list(clearing_history or ()),
        "transfers_in_clearing": transfers[:TRANSFERS_SHOWN],
        "stuck_after_s": stuck_s,
        "lag_by_partition": store.lag_by_partition(),
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
        age = GaugeMetricFamily("ledger_clearing_age_seconds",
                                "Age of the oldest transfer still in clearing, per currency (0: none).",
                                labels=["currency"])
        oldest = GaugeMetricFamily("ledger_clearing_oldest_transfer_seconds",
                                   "The oldest transfer still in clearing, named, per currency.",
                                   labels=["currency", "transaction_id"])
        count = GaugeMetricFamily("ledger_transfers_in_clearing", "Transfers with money in clearing, per currency.",
                                  labels=["currency"])
        stuck = GaugeMetricFamily("ledger_stuck_transfers",
                                  "Transfers in clearing for longer than LEDGER_STUCK_AFTER_S, per currency.",
                                  labels=["currency"])
        for entry in s["clearing"]:
            clearing.add_metric([entry["currency"]], float(int(entry["minor"])))
            age.add_metric([entry["currency"]], entry["age_s"] or 0.0)
            count.add_metric([entry["currency"]], entry["transfers"])
            stuck.add_metric([entry["currency"]], entry["stuck"])
            if entry["oldest_transaction_id"]:
                oldest.add_metric([entry["currency"], entry["oldest_transaction_id"]], entry["age_s"])
        yield clearing
        yield age
        yield oldest
        yield count
        yield stuck
        yield GaugeMetricFamily("ledger_stuck_after_seconds", "The age from which a transfer in clearing is stuck.",
                                value=s["stuck_after_s"])
        drift = s.get("drift")
        if drift is not None:
            yield GaugeMetricFamily("ledger_drift_accounts", "Accounts whose balance differs from the fold of their "
                                    "history, in the drift check's last complete pass.", value=len(drift["drifting"]))
            yield GaugeMetricFamily("ledger_drift_behind_accounts", "Accounts not judged in the last pass (their "
                                    "history not yet projected to the balance's seq).", value=drift["behind"])
            yield CounterMetricFamily("ledger_drift_checks", "Account checks made by the drift check.",
                                      value=drift["checked"])
            yield CounterMetricFamily("ledger_drift_passes", "Complete passes of the drift check.",
                                      value=drift["passes"])
            if drift["last_pass_at"] is not None:
                yield GaugeMetricFamily("ledger_drift_last_pass_timestamp_seconds",
                                        "When the drift check last completed a pass.", value=drift["last_pass_at"])
        yield GaugeMetricFamily("ledger_reconciliation_ok", "1 when every currency sums to zero (exact check).",
                                value=1 if s["reconciled"] else 0)
