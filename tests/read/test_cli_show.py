"""`ledger show balance|history|holds` read through the real read API (served by uvicorn)."""
from __future__ import annotations

import json
import subprocess
import sys
import time

from tests.harness import ROOT
from tests.read.conftest import PAGER


def ledger(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "connectors.cli", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)


def test_show_balance_history_and_holds(served):
    deadline = time.monotonic() + 30
    while True:  # the served API projects a fresh store: wait until it has the pager's 30 deposits
        done = ledger("show", "balance", PAGER, "--api", served, "--json")
        if done.returncode == 0 and int(json.loads(done.stdout)["posted"]["minor"]) >= 3000:
            break
        assert time.monotonic() < deadline, done.stdout + done.stderr
        time.sleep(0.3)
    view = json.loads(done.stdout)  # other tests may add to the pager's account: compare with the API's view
    text = ledger("show", "balance", PAGER, "--api", served).stdout
    assert f"{view['posted']['decimal']} USD" in text and f"{view['available']['decimal']} USD" in text
    assert int(view["posted"]["minor"]) - int(view["available"]["minor"]) == 500  # the open hold
    page = json.loads(ledger("show", "history", PAGER, "--api", served, "--limit", "5", "--json").stdout)
    assert [e["seq"] for e in page["entries"]] == [1, 2, 3, 4, 5] and page["next_cursor"] == "5"
    assert "more: --cursor 5" in ledger("show", "history", PAGER, "--api", served, "--limit", "5").stdout
    holds = ledger("show", "holds", PAGER, "--api", served).stdout
    assert "pager-hold" in holds and "5.00 USD" in holds
    missing = ledger("show", "balance", "user:nobody:USD", "--api", served)
    assert missing.returncode == 1 and "unknown_account" in missing.stderr
    down = ledger("show", "balance", PAGER, "--api", "http://127.0.0.1:9")
    assert down.returncode == 2 and "is `ledger api` running?" in down.stderr
