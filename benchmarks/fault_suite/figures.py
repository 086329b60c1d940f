"""The figures of one fault run, from each command's send time and its answer's arrival time.

Definitions (docs/reliability.md repeats them under the table):
- before: commands sent in the BEFORE_S seconds before the fault; during: those sent from the fault's start to
  its end (the broker restarted, resumed, ...), at least DURING_MIN_S. Throughput counts answers arriving
  in the same window per second; p99 is the 99th percentile of answer time minus send time, in ms.
- recovery to first decision: from the fault's start to the first answer of a command sent after it.
- recovery to zero lag: from the fault's start to the last moment some command sent more than LAG_GRACE_S
  earlier was still unanswered (0: never behind).
- longest window without progress: the longest gap between two consecutive first answers, from the first
  command sent under load to the last answer.
"""
from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass, field

BEFORE_S = 15.0
DURING_MIN_S = 10.0
LAG_GRACE_S = 1.0
STEP_S = 0.1


@dataclass
class Row:
    scenario: str
    faults: str
    sent: int = 0
    accepted: int = 0
    rejected: Counter = field(default_factory=Counter)
    unanswered: int = 0
    violations: Counter = field(default_factory=Counter)
    first_decision_s: float | None = None
    zero_lag_s: float | None = None
    longest_stall_s: float = 0.0
    rate_before: float = 0.0
    p99_before_ms: float | None = None
    rate_during: float = 0.0
    p99_during_ms: float | None = None
    worker_restarts: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def violation_total(self) -> int:
        return sum(self.violations.values()) + self.unanswered


def p99(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def measure(row: Row, sent_at: dict, seen: dict, load_start: float, fault_start: float, fault_end: float) -> Row:
    """Fill row's counts and timings. sent_at: key -> send time; seen: key -> (arrival, outcome, reason)."""
    row.sent = len(sent_at)
    for key in sent_at:
        answer = seen.get(key)
        if answer is None:
            row.unanswered += 1
        elif answer[1] == "accepted":
            row.accepted += 1
        else:
            row.rejected[answer[2] or "?"] += 1
    arrivals = sorted(seen[k][0] for k in sent_at if k in seen)
    fault_end = max(fault_end, fault_start + DURING_MIN_S)

    def window(start: float, end: float) -> tuple[float, float | None]:
        answered = sum(start <= a < end for a in arrivals)
        latencies = [(seen[k][0] - t) * 1000 for k, t in sent_at.items() if start <= t < end and k in seen]
        return answered / max(end - start, 1e-9), p99(latencies)

    row.rate_before, row.p99_before_ms = window(max(load_start, fault_start - BEFORE_S), fault_start)
    row.rate_during, row.p99_during_ms = window(fault_start, fault_end)
    after = [seen[k][0] for k, t in sent_at.items() if t >= fault_start and k in seen]
    row.first_decision_s = min(after) - fault_start if after else None

    # Zero lag: scan the run in steps; at t, is any command sent before t - grace unanswered at t?
    by_send = sorted((t, seen[k][0] if k in seen else float("inf")) for k, t in sent_at.items() if t >= load_start)
    sends = [t for t, _ in by_send]
    prefix_max, running = [], float("-inf")
    for _, arrival in by_send:
        running = max(running, arrival)
        prefix_max.append(running)
    last_behind = None
    end = max(arrivals) if arrivals else fault_start
    t = fault_start
    while t <= end + STEP_S:
        i = bisect.bisect_right(sends, t - LAG_GRACE_S)
        if i and prefix_max[i - 1] > t:
            last_behind = t
        t += STEP_S
    row.zero_lag_s = 0.0 if last_behind is None else last_behind - fault_start
    under_load = [a for a in arrivals if a >= load_start]
    gaps = [b - a for a, b in zip(under_load, under_load[1:])]
    row.longest_stall_s = max(gaps, default=0.0)
    return row


COLUMNS = ["scenario", "faults injected", "sent", "acked", "rejected by reason", "violations",
           "first decision s", "zero lag s", "longest stall s", "cmd/s before", "p99 ms before",
           "cmd/s during", "p99 ms during", "worker restarts"]


def cells(row: Row) -> list[str]:
    def num(v, fmt="{:.1f}"):
        return "-" if v is None else fmt.format(v)

    rejected = " ".join(f"{r}:{n}" for r, n in sorted(row.rejected.items(), key=lambda x: -x[1])) or "0"
    violations = "0" if not row.violation_total else " ".join(
        [f"{k}:{v}" for k, v in sorted(row.violations.items()) if v] +
        ([f"unanswered:{row.unanswered}"] if row.unanswered else []))
    return [row.scenario, row.faults, str(row.sent), str(row.accepted), rejected, violations,
            num(row.first_decision_s), num(row.zero_lag_s), num(row.longest_stall_s), num(row.rate_before, "{:.0f}"),
            num(row.p99_before_ms, "{:.0f}"), num(row.rate_during, "{:.0f}"), num(row.p99_during_ms, "{:.0f}"),
            str(row.worker_restarts)]


def table(rows: list[Row], markdown: bool = False) -> str:
    body = [cells(r) for r in rows]
    if markdown:
        lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
        lines += ["| " + " | ".join(c) + " |" for c in body]
        return "\n".join(lines)
    widths = [max(len(h), *(len(c[i]) for c in body)) if body else len(h) for i, h in enumerate(COLUMNS)]
    fmt = "  ".join(f"{{:{w}}}" for w in widths)
    return "\n".join([fmt.format(*COLUMNS)] + [fmt.format(*c) for c in body])
