"""One scenario from start to verdict: fresh topics on the suite's cluster (replicated as `ledger topics create`
replicates them), two supervised workers, the base traffic, the fault, then the figures and every oracle."""
from __future__ import annotations

import random
import re
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

from connectors.client import LedgerClient
from connectors.scratch import drop, fresh_settings
from projections.exactly_once import assert_exactly_once
from projections.rebuild import rebuild_balances
from projections.topics import read_topic
from projections.verify import at_a_quiet_point, verify
from streams import ticks

from benchmarks.fault_suite.cluster import Cluster
from benchmarks.fault_suite.figures import Row, measure
from benchmarks.fault_suite.load import Answers, Traffic, Workers
from benchmarks.fault_suite.scenarios import SCENARIOS, Context

WARMUP_S = 20.0  # load before the fault (the "before" figures use its last 15 s)
AFTER_S = 20.0  # load after the fault is undone
ANSWER_TIMEOUT_S = 300.0  # after the load stops, how long answers may keep arriving (ended early when all are in)


def run_scenario(name: str, cluster: Cluster, seed: int, rate: float, workdir: Path, users: int = 60,
                 kills: int = 50, log=print, warmup_s: float = WARMUP_S, after_s: float = AFTER_S,
                 **options) -> Row:
    """options: keyword arguments of the scenario's function (a shorter hot-account run, say)."""
    rng = random.Random(f"{seed}/{name}")
    # A client waits up to connect_timeout_s for the new topics' offsets: on a loaded machine the brokers other
    # than the one that answered creation can take longer than the default 10 s to learn of them.
    settings = replace(fresh_settings(cluster.bootstrap), connect_timeout_s=60.0)
    workers = Workers(settings, workdir / name)
    answers = Answers(settings)
    ctx = Context(cluster, settings, workers, rng, rate, users, workdir / name, kills=kills)
    client = None
    try:
        client = LedgerClient(settings, "faults")
        for w in [workers.add("w1", wait_ready=False), workers.add("w2", wait_ready=False)]:
            w.wait_ready(120)
        answers.start()
        traffic = Traffic(client, seed=rng.randrange(1 << 30), rate=rate, users=users, run_id=name)
        traffic.open_accounts()
        _wait_answered(answers, traffic.sent_at, 120)
        traffic.start()
        load_start = time.monotonic()
        time.sleep(warmup_s)
        log(f"[{name}] injecting")
        faults, fault_start, fault_end = SCENARIOS[name](ctx, **options)
        log(f"[{name}] {faults}; fault lasted {fault_end - fault_start:.0f}s")
        time.sleep(after_s)
        traffic.stop()
        sent_at = {**traffic.sent_at, **ctx.sent_at}
        missing = _wait_answered(answers, sent_at, ANSWER_TIMEOUT_S)
        log(f"[{name}] load stopped: {len(sent_at)} sent, {missing} unanswered; checking the oracles")
        with answers.lock:
            seen = dict(answers.seen)
        row = measure(Row(name, faults), sent_at, seen, load_start, fault_start, fault_end)
        try:
            _oracles(row, settings, sent_at)
        except Exception as exc:  # noqa: BLE001 - the figures stand; the row says the oracles could not run
            row.violations["oracles_not_run"] += 1
            row.notes.append(f"the oracles could not run: {type(exc).__name__}: {exc}"[:400])
        row.worker_restarts = len(workers.restarts)
        if workers.restarts:
            row.notes.append("worker exits restarted by supervision: "
                             + ", ".join(f"{w} ({code})" for w, code in workers.restarts[:8]))
        crashed = workers.crashed()
        if crashed:
            row.notes.append(f"tracebacks in the logs of {', '.join(crashed)} ({workdir / name})")
        row.notes += ctx.notes
        return row
    finally:
        answers.stop()
        workers.stop_all()
        for c in [client, *ctx.clients] if client else ctx.clients:
            try:
                c.close()
            except Exception:  # noqa: BLE001 - a closing client must not hide the scenario's outcome
                pass
        drop(settings)


def _wait_answered(answers: Answers, sent_at: dict, timeout_s: float) -> int:
    """Wait until every command sent has its answer; gives up after timeout_s. Returns how many lack one."""
    deadline = time.monotonic() + timeout_s
    while True:
        missing = len(sent_at) - answers.answered(sent_at)
        if not missing or time.monotonic() > deadline:
            return missing
        time.sleep(0.5)


def _oracles(row: Row, settings, sent_at: dict) -> None:
    """Every oracle of DESIGN.md §2 over the topics (projections.verify), exactly once per client as a
    read_committed reader sees it (projections.exactly_once), and the balances rebuilt from history
    hash-equal to the live ones (projections.rebuild, a fresh reader from offset 0)."""
    # These ask again through leadership moving after a fault (streams/kafka_errors.py), within their waits.
    # All read the topics as they stood at one quiet point: the workers tick (streams/ticks.py), and a tick
    # decided while they read would show one topic with its effects and another without.
    reads = []
    quiet, (violations, notes) = at_a_quiet_point(settings, lambda: reads.append(1) or _judged(settings, sent_at),
                                                  300)
    if not quiet:
        row.violations["not_quiescent"] += 1
    row.violations.update(violations)
    row.notes += notes
    tick = (ticks.KEY, ticks.value())
    ticked = sum(1 for r in read_topic(settings, "commands", decode=False) if (r.key, r.raw) == tick)
    row.notes.append(f"{ticked} ticks in the commands topic; the oracles read {len(reads)} time(s) "
                     f"to find the topics still")


def _judged(settings, sent_at: dict) -> tuple[Counter, list[str]]:
    """The oracles' violations by class, and notes on the first ones."""
    violations: Counter = Counter()
    report = verify(settings)
    for key, count in report.counts.items():
        if key.startswith("violations."):
            violations[key.split(".", 1)[1]] += count
    notes = report.violations[:5]
    by_client: dict[str, list[str]] = {}
    for client_id, command_id in sent_at:
        by_client.setdefault(client_id, []).append(command_id)
    for client_id, ids in by_client.items():
        try:
            assert_exactly_once(settings, client_id, ids)
        except AssertionError as exc:
            found = re.match(r"(\d+) problems", str(exc))
            violations["exactly_once"] += int(found.group(1)) if found else 1
            notes.append(f"exactly once ({client_id}): {str(exc)[:400]}")
    rebuilt = rebuild_balances(settings)
    if not rebuilt.ok:
        violations["rebuild_hash"] += 1
        notes.append(f"rebuilt balances differ from the live ones at {rebuilt.first_difference}")
    return violations, notes
