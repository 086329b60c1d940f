"""Prometheus metrics of a worker (served on LEDGER_METRICS_PORT when it is set)."""
from __future__ import annotations

from collections import Counter

from prometheus_client import Counter as PromCounter
from prometheus_client import Gauge, Histogram, start_http_server

from schemas.codec import DECODE_REASONS

COMMANDS = PromCounter("ledger_commands_total", "Commands answered, by kind and outcome", ["kind", "outcome"])
REJECTIONS = PromCounter("ledger_rejections_total", "Rejected commands, by reason", ["reason"])
# Accepted with a notice operations must follow up: late_settlement (streams/core/settlement.py).
NOTICES = PromCounter("ledger_notices_total", "Accepted commands with a notice, by notice", ["notice"])
DEAD_LETTERS = PromCounter("ledger_dead_letters_total", "Undecodable commands sent to the dead-letter topic", ["reason"])
# Present at 0 from the start, so an alert on increase() sees the first dead letter too (a series that appears
# at 1 has no earlier sample to increase from).
for _reason in DECODE_REASONS:
    DEAD_LETTERS.labels(_reason)
# From the command record's timestamp (its producer's clock, CreateTime) to its batch's commit: what a client
# waits for its result, less the result's trip back.
RESULT_LATENCY = Histogram("ledger_result_latency_seconds", "From a command's produce time to its result's commit",
                           buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
BATCH_SECONDS = Histogram("ledger_batch_seconds", "Time to decide and commit one batch",
                          buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5))
BATCH_SIZE = Histogram("ledger_batch_commands", "Commands decided per batch",
                       buckets=(1, 10, 50, 100, 250, 500, 1000, 2000, 5000, 20000))
LAG = Gauge("ledger_consumer_lag", "Commands not yet processed, per partition", ["partition"])
CLEARING = Gauge("ledger_clearing_minor_units", "Money in this worker's clearing shards (in flight), per currency",
                 ["currency"])


def serve(port: int, host: str = "127.0.0.1") -> None:
    """host: the address to bind (LEDGER_METRICS_HOST; 0.0.0.0 lets a Prometheus on another host scrape)."""
    start_http_server(port, addr=host)


def record_batch(counts: Counter, records: int, seconds: float) -> None:
    """counts: (kind, outcome, reason) -> n, as PartitionProcessor tallies them."""
    for (kind, outcome, reason), n in counts.items():
        if kind == "dead_letter":
            DEAD_LETTERS.labels(reason).inc(n)
            continue
        COMMANDS.labels(kind, outcome).inc(n)
        if reason and outcome == "accepted":
            NOTICES.labels(reason).inc(n)
        elif reason:
            REJECTIONS.labels(reason).inc(n)
    BATCH_SECONDS.observe(seconds)
    BATCH_SIZE.observe(records)


def record_latency(timestamps_ms: list[int], now_ms: int) -> None:
    """One latency observation per command record of a committed batch."""
    observe = RESULT_LATENCY.observe
    for ts in timestamps_ms:
        observe(max(now_ms - ts, 0) / 1000)
