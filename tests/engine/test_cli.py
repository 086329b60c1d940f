"""`ledger submit` on JSON Lines files with bad lines: clear per-line errors, the good lines still sent."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.harness import ROOT
from tests.helpers.topics import latest_balances


def submit(settings, text: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "KAFKA_BOOTSTRAP": settings.bootstrap, "LEDGER_TOPIC_PREFIX": settings.prefix}
    return subprocess.run([sys.executable, "-m", "connectors.cli", "submit", "-", "--client-id", "cli-test", *args],
                          input=text, capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)


def test_the_example_file_is_accepted(settings, start_worker):
    start_worker()
    done = submit(settings, (ROOT / "examples/commands.jsonl").read_text())
    assert done.returncode == 0, done.stdout + done.stderr
    assert "7 sent, 0 bad lines; accepted 7" in done.stdout
    balances = latest_balances(settings)
    assert balances["user:ann:USD"]["posted"] == str(10_000 - 1_234 - 2_000)
    assert balances["user:ann:USD"]["held"] == "0"


def test_bad_lines_are_reported_and_good_lines_still_sent(settings, start_worker):
    start_worker()
    lines = [
        '{"type": "open", "account": "user:kim:USD", "currency": "USD"}',
        'not json',
        '{"type": "post", "id": "p1", "legs": [{"account": "sys:world:USD", "amount": "-1.001"}, '
        '{"account": "user:kim:USD", "amount": "1.001"}]}',
        '{"type": "teleport"}',
        '{"type": "post", "id": "p2", "legs": [{"account": "sys:world:USD", "amount": 5}, '
        '{"account": "user:kim:USD", "amount": "5"}]}',
        '',
        '{"type": "post", "id": "dep", "kind": "deposit", "legs": [{"account": "sys:world:USD", "amount": "-7.50"}, '
        '{"account": "user:kim:USD", "amount": "7.50"}]}',
        '{"type": "post", "id": "over", "legs": [{"account": "user:kim:USD", "amount": "-100"}, '
        '{"account": "sys:world:USD", "amount": "100"}]}',
    ]
    done = submit(settings, "\n".join(lines), "--json")
    assert done.returncode == 1
    errors = done.stderr.splitlines()
    assert any(e.startswith("line 2: not JSON") for e in errors)
    assert any(e.startswith("line 3:") and "precision_exceeded" in e for e in errors)
    assert any(e.startswith("line 4: unknown type 'teleport'") for e in errors)
    assert any(e.startswith("line 5:") and "decimal string" in e for e in errors)
    results = {r["line"]: r for r in map(json.loads, done.stdout.splitlines())}
    assert results[1]["outcome"] == results[7]["outcome"] == "accepted"
    assert results[8]["reason"] == "insufficient_funds"
    assert latest_balances(settings)["user:kim:USD"]["posted"] == "750"


def test_a_linked_file_posts_whole_or_not_at_all(settings, start_worker):
    start_worker()
    lines = ['{"type": "open", "account": "user:lu:USD", "currency": "USD"}',
             '{"type": "post", "id": "lu-dep", "kind": "deposit", "legs": [{"account": "sys:world:USD", '
             '"amount": "-5"}, {"account": "user:lu:USD", "amount": "5"}]}',
             '{"type": "post", "id": "lu-out", "legs": [{"account": "user:lu:USD", "amount": "-6"}, '
             '{"account": "sys:world:USD", "amount": "6"}]}']
    refused = submit(settings, "\n".join(lines), "--json", "--linked")
    assert refused.returncode == 1
    answers = {r["line"]: r["reason"] for r in map(json.loads, refused.stdout.splitlines())}
    assert answers == {1: "linked_failed", 2: "linked_failed", 3: "insufficient_funds"}
    bad = submit(settings, "\n".join(lines[:2] + ["not json"]), "--linked")
    assert bad.returncode == 1 and "nothing sent" in bad.stderr
    assert "user:lu:USD" not in latest_balances(settings)
    # Refused ids stay spent (a retry is answered the same): the corrected file uses new ones.
    lines[2] = lines[2].replace('"-6"', '"-4"').replace('"6"', '"4"')
    done = submit(settings, "\n".join(lines).replace("lu", "lv"), "--linked")
    assert done.returncode == 0, done.stdout + done.stderr
    assert latest_balances(settings)["user:lv:USD"]["posted"] == "100"


def ledger(settings, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "KAFKA_BOOTSTRAP": settings.bootstrap, "LEDGER_TOPIC_PREFIX": settings.prefix}
    return subprocess.run([sys.executable, "-m", "connectors.cli", *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=120)


def test_single_commands_from_flags(settings, start_worker):
    start_worker()
    assert ledger(settings, "open", "user:lou:USD", "USD").returncode == 0
    done = ledger(settings, "post", "dep-lou", "--kind", "deposit", "--leg", "sys:world:USD=-20.00",
                  "--leg", "user:lou:USD=20.00")
    assert done.returncode == 0 and "dep-lou: accepted" in done.stdout
    assert ledger(settings, "hold", "lou-order", "user:lou:USD", "5.00").returncode == 0
    done = ledger(settings, "post", "lou-fill", "--leg", "user:lou:USD=-3.00@lou-order",
                  "--leg", "sys:merchant:USD=3.00", "--json")
    assert json.loads(done.stdout)["outcome"] == "accepted"
    assert ledger(settings, "release", "lou-order", "user:lou:USD").returncode == 0
    over = ledger(settings, "post", "lou-over", "--leg", "user:lou:USD=-100", "--leg", "sys:world:USD=100")
    assert over.returncode == 1 and "insufficient_funds" in over.stdout
    bad = ledger(settings, "post", "lou-bad", "--leg", "user:lou:USD=-1.001", "--leg", "sys:world:USD=1.001")
    assert bad.returncode == 2 and "precision_exceeded" in bad.stderr
    balance = latest_balances(settings)["user:lou:USD"]
    assert (balance["posted"], balance["held"]) == ("1700", "0")


def test_submit_sends_repeated_control_lines_and_reports_resubmissions_as_duplicates(settings, start_worker):
    start_worker()
    lines = [
        '{"type": "open", "account": "user:bob:USD", "currency": "USD"}',
        '{"type": "post", "id": "dep-bob", "kind": "deposit", "legs": [{"account": "sys:world:USD", "amount": "-5"}, '
        '{"account": "user:bob:USD", "amount": "5"}]}',
        '{"type": "freeze", "account": "user:bob:USD"}',
        '{"type": "unfreeze", "account": "user:bob:USD"}',
        '{"type": "freeze", "account": "user:bob:USD"}',
        '{"type": "post", "id": "bob-pays", "legs": [{"account": "user:bob:USD", "amount": "-1"}, '
        '{"account": "sys:world:USD", "amount": "1"}]}',
    ]
    first = submit(settings, "\n".join(lines), "--json")
    results = {r["line"]: r for r in map(json.loads, first.stdout.splitlines())}
    assert [results[n]["outcome"] for n in range(1, 6)] == ["accepted"] * 5, first.stdout
    assert not any(results[n]["duplicate"] for n in range(1, 6)), "the second freeze is a command of its own"
    assert results[6]["reason"] == "account_frozen", "the third line froze bob again"
    again = submit(settings, "\n".join(lines))
    assert "6 sent, 0 bad lines; accepted 5, account_frozen 1 (6 of them duplicates of an earlier submission)" \
        in again.stdout, again.stdout
    assert "line 3: freeze:user:bob:USD@3~" in again.stdout and "duplicate: already accepted" in again.stdout


def test_submit_checks_every_line_before_sending_anything_and_always_summarises(settings, start_worker):
    start_worker()
    lines = [
        '{"type": "open", "account": "user:cy:USD", "currency": "USD"}',
        '{"type": "post", "id": "p", "legs": [{"account": "user:cy:USD", "amount": "-1", "hold": 5}, '
        '{"account": "sys:world:USD", "amount": "1"}]}',
        '{"type": "post", "id": "q", "kind": 7, "legs": [{"account": "user:cy:USD", "amount": "-1"}, '
        '{"account": "sys:world:USD", "amount": "1"}]}',
        '{"type": "post", "id": "r", "metadata": {"a": 1}, "legs": [{"account": "user:cy:USD", "amount": "-1"}, '
        '{"account": "sys:world:USD", "amount": "1"}]}',
    ]
    done = submit(settings, "\n".join(lines))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert any(e.startswith("line 2: 'hold' must be a non-empty string") for e in done.stderr.splitlines())
    assert any(e.startswith("line 3: 'kind' must be") for e in done.stderr.splitlines())
    assert any(e.startswith("line 4: 'metadata' must be") for e in done.stderr.splitlines())
    assert "1 sent, 3 bad lines; accepted 1" in done.stdout
