"""The short version of `make faults` (benchmarks/faults.py): the hot-account scenario on the shared broker.

Several producers debit one account at its overdraft limit while another credits it and the base traffic runs;
the suite's own machinery (timed traffic, supervised workers, the figures) measures it and every oracle judges
it: no violation of any class, every command answered. The broker-killing scenarios need the suite's own
3-node cluster and run in `make faults` only.
"""
from __future__ import annotations

from benchmarks.fault_suite.cluster import Cluster
from benchmarks.fault_suite.figures import table
from benchmarks.fault_suite.run import run_scenario
from benchmarks.fault_suite.scenarios import HOT_FUNDING, HOT_LIMIT


def test_hot_account_at_its_limit_under_concurrent_debits(kafka_bootstrap, tmp_path):
    host, port = kafka_bootstrap.split(",")[0].rsplit(":", 1)
    assert host == "127.0.0.1"
    shared = Cluster(tmp_path / "unused", int(port), nodes=1)  # never started, stopped or signalled here
    row = run_scenario("hot-account", shared, seed=3, rate=20, workdir=tmp_path, users=20, warmup_s=3, after_s=2,
                       producers=3, debits=40, per_second=10)
    print(table([row]))
    assert row.violation_total == 0, f"{row.violations} unanswered {row.unanswered}: {row.notes}"
    assert row.sent > 4 * 40
    # The debits (about 3 x 40 x 1,100 on average) exceed what the account may spend (HOT_FUNDING + HOT_LIMIT +
    # 40 x 500 of credits): it is driven to its floor, and debits past it are refused.
    assert 3 * 40 * 1_100 > HOT_FUNDING + HOT_LIMIT + 40 * 500
    assert row.rejected["insufficient_funds"] > 0
