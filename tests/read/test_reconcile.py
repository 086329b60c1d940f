"""Reconciliation of an account against an outside statement, with exact numbers: the pure matching, and
`ledger reconcile` through the real read API (served by uvicorn over a store the partition processors filled).
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from projections import reconcile as rec
from projections.api import create_app
from streams.core import DEFAULT_CURRENCIES, AccountType
from tests.harness import ROOT
from tests.helpers.read_store import filled_store
from tests.helpers.served import serving
from tests.rules.scenario import Scenario

USDT = DEFAULT_CURRENCIES.get("USDT")


def test_statements_in_csv_and_json_are_read_exactly():
    csv_text = "reference,amount,date\nd1,40000,2023-11-14\nw1,-1000.5,2023-11-15\n"
    assert rec.parse_statement(csv_text, USDT) == [rec.StatementLine(2, "d1", 40_000_000000),
                                                   rec.StatementLine(3, "w1", -1_000_500000)]
    as_json = '[{"id": "d1", "amount": "40000"}, {"reference": "w1", "amount": "-1000.5"}]'
    assert [(x.reference, x.amount) for x in rec.parse_statement(as_json, USDT)] == [
        ("d1", 40_000_000000), ("w1", -1_000_500000)]
    lines = '{"id": "d1", "amount": "1"}\n\n{"id": "d2", "amount": "2"}\n'
    assert [x.line for x in rec.parse_statement(lines, USDT)] == [1, 3]
    for bad, message in (("reference,amount\nd1,1.0000001\n", "line 2: amount '1.0000001': precision_exceeded"),
                         ('[{"id": "d1", "amount": 1.5}]', "amount must be a decimal string"),
                         ("reference,amount\n,5\n", "line 2: no reference")):
        with pytest.raises(rec.StatementError, match=message):
            rec.parse_statement(bad, USDT)


def test_matching_by_reference_in_the_accounts_normal_direction():
    # custody is an asset: the ledger posts a deposit of 40,000 as -40,000 and the custodian reports +40,000
    entries = [{"transaction_id": tx, "reference": ref, "amount": {"minor": str(amount)}, "occurred_at_ms": at}
               for tx, ref, amount, at in (("deposit_confirmed:d1", "d1", -40_000, 10), ("dep:x", None, -5, 20),
                                           ("w:1", "w1", 600, 30), ("w:1", "w1", 400, 30), (None, None, 0, 40),
                                           ("dep:old", "old", -1, 1))]
    items = rec.ledger_items(entries, AccountType.ASSET)
    statement = [rec.StatementLine(2, "d1", 40_000), rec.StatementLine(3, "w1", -999),
                 rec.StatementLine(4, "x9", 7)]
    r = rec.reconcile("sys:custody:USDT", "USDT", statement, items, since_ms=5)
    assert [(d.kind, d.reference, d.statement, d.ledger) for d in r.items] == [
        ("matched", "d1", 40_000, 40_000), ("amount_mismatch", "w1", -999, -1_000),
        ("missing_from_ledger", "x9", 7, None), ("missing_from_statement", "dep:x", None, 5)]
    assert r.counts == {"matched": 1, "amount_mismatch": 1, "missing_from_ledger": 1, "missing_from_statement": 1}
    assert not r.reconciled
    text = rec.metrics_text(r, 1_700_000_000_000)
    assert 'ledger_reconciliation_references{account="sys:custody:USDT",kind="amount_mismatch"} 1' in text


@pytest.fixture
def served(tmp_path):
    s = (Scenario().users("alice", "bob")
         .deposit("d1", "alice", "USDT", "40000")
         .deposit("d2", "bob", "USDT", "100")
         .deposit("d3", "alice", "USDT", "5")
         .withdrawal_requested("w1", "alice", "USDT", "1000")
         .withdrawal_completed("w1", "alice", "USDT", "1000"))
    path = str(tmp_path / "read.db")
    filled_store(path, s).close()
    with serving(create_app(path, drift_every_s=0)) as url:
        yield url


def ledger(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "connectors.cli", *args], input=stdin, capture_output=True,
                          text=True, cwd=ROOT, timeout=60)


def test_ledger_reconcile_against_a_custody_statement(served, tmp_path):
    statement = tmp_path / "custody.csv"
    statement.write_text("reference,amount\nd1,40000\nd2,100.5\nw1,-1000\nx9,7\n")
    metrics = tmp_path / "reconcile.prom"
    done = ledger("reconcile", str(statement), "--account", "sys:custody:USDT", "--api", served, "--json",
                  "--metrics-file", str(metrics))
    assert done.returncode == 1, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert [(i["kind"], i["reference"], i["statement"] and i["statement"]["decimal"],
             i["ledger"] and i["ledger"]["decimal"]) for i in report["items"]] == [
        ("matched", "d1", "40000.000000", "40000.000000"),
        ("matched", "w1", "-1000.000000", "-1000.000000"),        # the money left the custody wallet
        ("amount_mismatch", "d2", "100.500000", "100.000000"),
        ("missing_from_ledger", "x9", "7.000000", None),
        ("missing_from_statement", "d3", None, "5.000000")]
    assert 'kind="missing_from_statement"} 1' in metrics.read_text()
    text = ledger("reconcile", "-", "--account", "sys:custody:USDT", "--api", served,
                  stdin='[{"id": "d1", "amount": "40000"}, {"id": "d2", "amount": "100"}, {"id": "d3", "amount": "5"},'
                        ' {"id": "w1", "amount": "-1000"}]')
    assert text.returncode == 0, text.stdout + text.stderr
    assert "4 matched, 0 amount mismatch, 0 missing from ledger, 0 missing from statement" in text.stdout
    bad = ledger("reconcile", "-", "--account", "sys:custody:USDT", "--api", served, stdin="reference,amount\nd1,x\n")
    assert bad.returncode == 2 and "invalid_amount" in bad.stderr
