"""The fault suite (`make faults`): seeded scenarios on a 3-node cluster the suite starts (RF 3, min ISR 2),
each under the load generator's business-event mix, each followed by every oracle. Prints one table, one row
per scenario; exits 1 when any scenario shows a violation. docs/reliability.md records a run and its
conditions.

  python benchmarks/faults.py [--seed 1] [--rate 40] [--only leader-kill,broker-pause] [--kills 50]
                              [--markdown FILE] [--keep-cluster]

The cluster lives in $FAULTS_STATE (default .state/faults) on ports from $FAULTS_PORT (default 29092), never the
shared broker; --keep-cluster leaves it running for the next run (and `LEDGER_STATE=... KAFKA_PORT=...
scripts/kafka.sh stop` ends it).
"""
from __future__ import annotations

import argparse
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.fault_suite.cluster import ROOT, Cluster  # noqa: E402
from benchmarks.fault_suite.figures import Row, table  # noqa: E402
from benchmarks.fault_suite.run import run_scenario  # noqa: E402
from benchmarks.fault_suite.scenarios import SCENARIOS  # noqa: E402

# In the order they run; the ones the issue ranks first come first.
ORDER = ["leader-kill", "broker-pause", "rolling-restart", "hot-account", "rebalances", "clock-skew",
         "worker-kills", "worker-disk-full", "broker-disk-full"]


def conditions(seed: int, rate: float, cluster: Cluster) -> str:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                           text=True)
    import confluent_kafka
    import aiokafka
    kafka = next((p.name[len("kafka-clients-"):-4] for p in (ROOT / "broker/lib").glob("kafka-clients-*.jar")), "?")
    return (f"seed {seed}, {rate:g} commands/s base load, commit {commit.stdout.strip()}"
            f"{' (tree has uncommitted changes)' if dirty.stdout.strip() else ''}; Kafka {kafka}, "
            f"{cluster.nodes} KRaft nodes (combined broker+controller, RF 3, min ISR 2), 8 partitions, 2 workers "
            f"(session 10 s); Python {platform.python_version()}, confluent-kafka {getattr(confluent_kafka, '__version__', '?')} "
            f"(librdkafka {confluent_kafka.libversion()[0]}), aiokafka {aiokafka.__version__}; "
            f"{os.cpu_count()} cores, load average at start {os.getloadavg()[0]:.1f}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rate", type=float, default=40.0, help="base load, commands/s")
    parser.add_argument("--only", default="", help="comma-separated scenarios: " + ", ".join(ORDER))
    parser.add_argument("--kills", type=int, default=50, help="worker stops in worker-kills")
    parser.add_argument("--markdown", default="", help="also write the table as Markdown to this file")
    parser.add_argument("--keep-cluster", action="store_true")
    args = parser.parse_args()
    # Stopped from outside: unwind, so every scenario's finally stops its workers and drops its topics.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    names = [n for n in (args.only.split(",") if args.only else ORDER) if n]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenarios {unknown}; known: {ORDER}")
    cluster = Cluster(Path(os.environ.get("FAULTS_STATE", ROOT / ".state/faults")).resolve(),
                      int(os.environ.get("FAULTS_PORT", "29092")))
    cluster.start()
    header = conditions(args.seed, args.rate, cluster)
    print(header, flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="faults-"))
    rows = []
    try:
        for name in names:
            started = time.monotonic()
            try:
                rows.append(run_scenario(name, cluster, args.seed, args.rate, workdir, kills=args.kills,
                                         log=lambda m: print(m, flush=True)))
            except Exception as exc:  # noqa: BLE001 - a scenario that cannot finish is a row that says so
                traceback.print_exc()
                row = Row(name, "did not finish")
                row.violations["suite_error"] += 1
                row.notes.append(f"{type(exc).__name__}: {exc}"[:400])
                rows.append(row)
                cluster.start()  # a node the scenario left stopped
            print(f"[{name}] done in {time.monotonic() - started:.0f}s", flush=True)
            print(table(rows), flush=True)
            for note in rows[-1].notes:
                print(f"  {name}: {note}", flush=True)
    finally:
        if not args.keep_cluster:
            cluster.stop()
    print()
    print(header)
    print(table(rows))
    for row in rows:
        for note in row.notes:
            print(f"  {row.scenario}: {note}")
    if args.markdown:
        notes = "\n".join(f"- {r.scenario}: {n}" for r in rows for n in r.notes)
        Path(args.markdown).write_text(f"Conditions: {header}\n\n{table(rows, markdown=True)}\n\n{notes}\n")
    return 1 if any(r.violation_total for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
