"""The operator's commands over the shared run: `verify --wait` and `rebuild-balances` show their progress on
stderr when asked (and only then: not in a pipe by default), `ledger show in-clearing` and `ledger show drift`
read the read API's transfers in clearing and its background drift check, and LEDGER_LOG_FORMAT is checked."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from connectors.progress import steps, wanted
from tests.harness import ROOT


def ledger(settings, *args: str, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, "KAFKA_BOOTSTRAP": settings.bootstrap, "LEDGER_TOPIC_PREFIX": settings.prefix, **env}
    return subprocess.run([sys.executable, "-m", "connectors.cli", *args], capture_output=True, text=True,
                          env=full, cwd=ROOT, timeout=120)


def test_long_commands_show_progress_on_stderr_only_when_asked(ledger_run):
    settings = ledger_run.settings
    shown = ledger(settings, "verify", "--wait", "30", "--progress")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "commands decided" in shown.stderr and "reading history" in shown.stderr
    assert "reading" not in shown.stdout  # the report alone on stdout

    rebuilt = ledger(settings, "rebuild-balances", "--progress")
    assert rebuilt.returncode == 0, rebuilt.stdout + rebuilt.stderr
    assert "reading history" in rebuilt.stderr and "reading balances" in rebuilt.stderr
    assert "identical" in rebuilt.stdout


def test_progress_is_off_by_default_off_a_terminal(capsys):
    assert wanted(None) is False  # pytest's stderr is no terminal
    assert wanted(True) is True and wanted(False) is False
    with steps(False) as bars:
        assert list(bars.counting("reading history", range(2500))) == list(range(2500))
    assert capsys.readouterr().err == ""


def test_a_bad_log_format_is_one_line(ledger_run):
    done = ledger(ledger_run.settings, "verify", LEDGER_LOG_FORMAT="xml")
    assert done.returncode == 2
    assert done.stderr.strip() == "error: LEDGER_LOG_FORMAT='xml' is not one of text, json"


def test_show_in_clearing_and_drift(ledger_run, served):
    settings = ledger_run.settings
    listed = ledger(settings, "show", "in-clearing", "--api", served, "--json")
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout)["transfers"] == []  # the run is quiescent: every transfer landed
    assert "0 transfer(s) in clearing for 60 s or more" in \
        ledger(settings, "show", "in-clearing", "--older-than", "60", "--api", served).stdout

    deadline = time.monotonic() + 60
    while True:  # the served API checks its fresh store as the projector fills it: wait for a clean pass
        report = json.loads(ledger(settings, "show", "drift", "--api", served, "--json").stdout)
        if report["passes"] >= 1 and report["checked"] > 0 and report["behind"] == 0:
            break
        assert time.monotonic() < deadline, report
        time.sleep(1)
    assert report["drifting"] == []
    text = ledger(settings, "show", "drift", "--api", served)
    assert text.returncode == 0 and "0 drifting account(s)" in text.stdout
