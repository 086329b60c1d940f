"""A wallet operator's commands through the real broker and one real worker: reversals (client, CLI and rule),
account types and the trial balance (projected from the topics into a read store, read through the API), a
currency registered at runtime (client and CLI), FX rate snapshots (the CLI as rates producer, the fx rule), an import with original timestamps.

One worker serves the whole file's test (a worker start is the expensive part), so each command a wallet
operator gained is proven end to end at a small wall-time cost.
"""
from __future__ import annotations

import json

from fastapi.testclient import TestClient

from connectors import rules
from connectors.client import LedgerClient, Leg
from connectors.currencies import confirm
from projections.api import create_app
from projections.projector import catch_up
from projections.topics import read_topic
from projections.verify import format_report, verify, wait_quiescent
from tests.helpers.cli import cli
from tests.helpers.results import outcome
from tests.helpers.topics import latest_balances


def test_wallet_operations_through_the_broker(settings, start_worker, tmp_path):
    start_worker(extra_env={"LEDGER_TICK_S": "0"})  # no ticks: quiescence is reached once the commands are decided
    wallet = LedgerClient(settings, "wallet")
    intruder = LedgerClient(settings, "intruder")
    try:
        ids = [wallet.open_account("user:ann:USD", "USD"),
               wallet.post("dep-1", [Leg("sys:world:USD", -10_000), Leg("user:ann:USD", 10_000)], kind="deposit"),
               wallet.post("dep-2", [Leg("sys:world:USD", -2_500), Leg("user:ann:USD", 2_500)], kind="deposit"),
               wallet.post("dep-3", [Leg("sys:world:USD", -700), Leg("user:ann:USD", 700)], kind="deposit")]
        assert [outcome(r) for r in wallet.wait(ids).values()] == ["accepted"] * 4

        # Reversal: by the client, once; a second one, an unknown target and another client are refused.
        ids = [wallet.reverse("rev-1", "dep-1", "user:ann:USD"),
               wallet.reverse("rev-1b", "dep-1", "user:ann:USD"),
               wallet.reverse("rev-x", "dep-404", "user:ann:USD")]
        assert [outcome(r) for r in wallet.wait(ids).values()] == [
            "accepted", "already_reversed", "unknown_transaction"]
        assert outcome(intruder.result(intruder.reverse("rev-2", "dep-2", "user:ann:USD"))) == "client_mismatch"
        # The CLI and the rules send the same command.
        done = cli(settings, "reverse", "dep-2", "--account", "user:ann:USD", "--json")
        assert done.returncode == 0, done.stdout + done.stderr
        assert json.loads(done.stdout)["command_id"] == "reversal:dep-2"
        plan = rules.plan(rules.ReversalRequested("r3", "dep-3", "ann", "USD"), rules.Context(client_id="wallet"))
        assert outcome(wallet.wait(wallet.submit(plan))["reversal_requested:r3"]) == "accepted"
        assert latest_balances(settings)["user:ann:USD"]["posted"] == "0"

        # Account types: an opened account keeps the type it was given; system accounts take theirs by name.
        ids = [wallet.open_account("user:ann:bonus.USD", "USD", account_type="expense", allow_negative=True),
               wallet.open_account("user:ann:EUR", "EUR", account_type="cash")]
        ids.append(wallet.post("bonus-1", [Leg("user:ann:bonus.USD", -300, currency="USD"),
                                           Leg("user:ann:USD", 300)], kind="bonus"))
        assert [outcome(r) for r in wallet.wait(ids).values()] == ["accepted", "invalid_command", "accepted"]
        assert latest_balances(settings)["user:ann:bonus.USD"]["account_type"] == "expense"
        assert wait_quiescent(settings)
        catch_up(settings, str(tmp_path / "read.db"))
        with TestClient(create_app(str(tmp_path / "read.db"), drift_every_s=0)) as api:
            report = api.get("/reports/trial-balance").json()
        (usd,) = report["currencies"]
        assert report["balanced"] and (usd["debit"]["minor"], usd["credit"]["minor"]) == ("300", "300")
        assert [(a["account_id"], a["account_type"], a["balance"]["minor"]) for a in usd["accounts"]] == [
            ("user:ann:USD", "liability", "300"), ("user:ann:bonus.USD", "expense", "300")]

        # A currency registered at runtime: refused until every partition has decided its registration.
        assert outcome(wallet.result(wallet.open_account("user:ann:XAU", "XAU"))) == "unknown_currency"
        assert {outcome(r) for r in wallet.wait(wallet.register_currency("XAU", 3)).values()} == {"accepted"}
        done = cli(settings, "currency", "register", "XAU", "3")  # again by the CLI: answered as duplicates
        assert done.returncode == 0 and "known to 8 of 8 partitions" in done.stdout, done.stdout + done.stderr
        ids = [wallet.open_account("user:ann:XAU", "XAU", command_id="open-xau-2"),
               wallet.post("gold-1", [Leg("sys:world:XAU", -1_250), Leg("user:ann:XAU", 1_250)])]
        assert [outcome(r) for r in wallet.wait(ids).values()] == ["accepted", "accepted"]
        assert latest_balances(settings)["user:ann:XAU"]["posted"] == "1250"  # 1.250 XAU
        # Decimal amounts in it at the edge: every partition confirms the declared scale before a line is sent.
        gold = tmp_path / "gold.jsonl"
        gold.write_text(json.dumps({"type": "post", "id": "gold-2", "legs": [
            {"account": "sys:world:XAU", "amount": "-0.125"}, {"account": "user:ann:XAU", "amount": "0.125"}]}))
        (wrong,) = confirm(wallet, {"XAU": 2}, 30)[:1]  # what the CLI prints, then sends nothing
        assert "XAU:2 not confirmed" in wrong and "currency_conflict (XAU is registered with scale 3)" in wrong
        done = cli(settings, "submit", str(gold), "--currency", "XAU:3")
        assert done.returncode == 0, done.stdout + done.stderr
        assert latest_balances(settings)["user:ann:XAU"]["posted"] == "1375"

        # FX rate snapshots: a conversion naming a snapshot the ledger never recorded fails closed; once the
        # rates producer (the CLI here) has recorded it in every partition, the next attempt converts.
        ids = [wallet.open_account("user:ann:EUR", "EUR", command_id="open-eur-2"),
               wallet.post("dep-4", [Leg("sys:world:USD", -1_000), Leg("user:ann:USD", 1_000)], kind="deposit")]
        assert [outcome(r) for r in wallet.wait(ids).values()] == ["accepted", "accepted"]
        fx = rules.FxConverted("fx-1", "ann", "USD", "EUR", "10.00", "0.925", "snap-1")
        ctx = rules.Context(client_id="wallet")
        first = wallet.wait(wallet.submit(rules.plan(fx, ctx)))["fx_converted:fx-1"]
        assert outcome(first) == "unknown_rate"
        done = cli(settings, "rates", "publish", "snap-1", "USD", "EUR", "0.925", "--valid-for", "3600")
        assert done.returncode == 0 and "recorded in 8 of 8 partitions" in done.stdout, done.stdout + done.stderr
        retry = rules.next_attempt(fx, first)
        assert outcome(wallet.wait(wallet.submit(rules.plan(retry, ctx)))["fx_converted:fx-1#2"]) == "accepted"
        balances = latest_balances(settings)
        assert (balances["user:ann:USD"]["posted"], balances["user:ann:EUR"]["posted"]) == ("300", "925")

        # An import keeps the original times: the history of an opening, a deposit and a hold of 2020.
        day, jan_1_2020 = 86_400_000, 1_577_836_800_000
        lines = [{"type": "open", "account": "user:old:USD", "currency": "USD", "at_ms": jan_1_2020},
                 {"type": "post", "id": "old-dep", "kind": "deposit", "at_ms": jan_1_2020 + day,
                  "legs": [{"account": "sys:world:USD", "amount": "-100.00"},
                           {"account": "user:old:USD", "amount": "100.00"}]},
                 {"type": "hold", "id": "old-hold", "account": "user:old:USD", "amount": "30.00",
                  "at_ms": jan_1_2020 + 2 * day}]
        file = tmp_path / "old.jsonl"
        file.write_text("\n".join(json.dumps(x) for x in lines + [{**lines[1], "id": "old-pay", "at_ms": jan_1_2020
                                                                   + 3 * day, "legs": [
            {"account": "user:old:USD", "amount": "-80.00"}, {"account": "sys:world:USD", "amount": "80.00"}]}]))
        refused = cli(settings, "import", str(file))  # the check predicts old-pay's insufficient_funds
        assert refused.returncode == 1 and "line 4: old-pay would be rejected insufficient_funds" in refused.stderr
        file.write_text("\n".join(json.dumps(x) for x in lines))
        done = cli(settings, "import", str(file))
        assert done.returncode == 0 and "imported: 3 accepted" in done.stdout, done.stdout + done.stderr
        history = [r.value for r in read_topic(settings, "history") if r.value["account_id"] == "user:old:USD"]
        assert [(h["kind"], h["at_ms"], h["occurred_at_ms"], h["amount"]) for h in history] == [
            ("account_opened", jan_1_2020, jan_1_2020, "0"),
            ("deposit", jan_1_2020 + day, jan_1_2020 + day, "10000"),
            ("hold_placed", jan_1_2020 + 2 * day, jan_1_2020 + 2 * day, "0")]

        assert wait_quiescent(settings)
        report = verify(settings)
        assert report.ok, format_report(report)
    finally:
        wallet.close()
        intruder.close()
