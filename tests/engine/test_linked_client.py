"""Linked commands through the broker (client.linked(), streams/linking.py): a batch that posts whole, one
that is refused whole with the failing command named, a retry answered the same, a batch reaching another
partition with more than transactions refused, transactions across partitions posted whole or refused whole,
and the oracles after."""
from __future__ import annotations

from connectors.client import LedgerClient, Leg
from projections.verify import format_report, verify, wait_quiescent
from streams import routing
from tests.helpers.results import outcome
from tests.helpers.topics import latest_balances


def test_linked_commands_post_all_or_nothing(settings, start_worker):
    start_worker(extra_env={"LEDGER_TICK_S": "0"})
    client = LedgerClient(settings, "wallet")
    other = next(f"user:o{i}:USD" for i in range(100)
                 if routing.partition_of_account(f"user:o{i}:USD", settings.partitions)
                 != routing.partition_of_account("user:li:USD", settings.partitions))
    try:
        with client.linked():  # one owner's accounts and system accounts: one partition
            ids = [client.open_account("user:li:USD", "USD"), client.open_account("user:li:savings.USD", "USD"),
                   client.post("dep", [Leg("sys:world:USD", -1_000), Leg("user:li:USD", 1_000)], kind="deposit"),
                   client.post("fee", [Leg("user:li:USD", -10), Leg("sys:fees:USD", 10)], kind="fee"),
                   client.post("save", [Leg("user:li:USD", -900), Leg("user:li:savings.USD", 900)])]
        first = client.wait(ids)
        assert [outcome(first[i]) for i in ids] == ["accepted"] * 5

        def too_much():
            return [client.post("save-2", [Leg("user:li:USD", -50), Leg("user:li:savings.USD", 50)]),
                    client.post("save-3", [Leg("user:li:USD", -50), Leg("user:li:savings.USD", 50)])]
        with client.linked():
            refused = too_much()
        answers = client.wait(refused)
        assert [outcome(answers[i]) for i in refused] == ["linked_failed", "insufficient_funds"]
        assert "save-3, which was refused insufficient_funds" in answers["save-2"]["detail"]
        with client.linked():  # the same batch again: the same answers
            assert too_much() == refused
        again = client.wait(refused)
        assert [(outcome(again[i]), again[i]["duplicate"]) for i in refused] == [
            ("linked_failed", True), ("insufficient_funds", True)]

        with client.linked():
            spanning = [client.open_account(other, "USD"),
                        client.post("near", [Leg("user:li:savings.USD", -1), Leg("user:li:USD", 1)])]
        far = client.wait(spanning)
        assert [outcome(far[i]) for i in spanning] == ["linked_spans_partitions"] * 2

        # Transactions across partitions: one unit of the two-phase protocol. The second spends, in the other
        # partition, what the first credited there; then a batch whose second transaction cannot be funded.
        # The batch could not be linked, so it decided none of its commands: the same open sent alone to its
        # home is decided there, once (the verifier below checks one decision per command id).
        opened = client.open_account(other, "USD")
        assert opened == spanning[0]
        assert outcome(client.wait([opened])[opened]) == "accepted"
        with client.linked():
            across = [client.post("far-1", [Leg("user:li:USD", -40), Leg(other, 40)]),
                      client.post("far-2", [Leg(other, -30), Leg("user:li:savings.USD", 30)])]
        with client.linked():
            unfunded = [client.post("far-3", [Leg("user:li:USD", -10), Leg(other, 10)]),
                        client.post("far-4", [Leg(other, -1_000), Leg("user:li:USD", 1_000)])]
        decided = client.wait(across + unfunded)
        assert [outcome(decided[i]) for i in across + unfunded] == [
            "accepted", "accepted", "linked_failed", "insufficient_funds"]
        assert "far-4, which was refused insufficient_funds" in decided["far-3"]["detail"]

        assert wait_quiescent(settings)
        balances = latest_balances(settings)
        assert (balances["user:li:USD"]["posted"], balances["user:li:savings.USD"]["posted"],
                balances[other]["posted"]) == ("50", "930", "10")
        assert wait_quiescent(settings)
        report = verify(settings)
        assert report.ok, format_report(report)
    finally:
        client.close()


def test_a_freeze_sent_right_after_a_linked_batch_across_partitions_never_overtakes_it(settings, start_worker):
    """P10 through the broker: each batch credits an account in another partition and spends part of it there,
    and the producer freezes that account right after, without waiting. The client writes the batch to its
    coordinator and a copy to the other partition, so the copy is ahead of the freeze there: every batch posts,
    then every freeze applies. (Written to the coordinator only, the freeze is read first and the batch fails.)"""
    start_worker(extra_env={"LEDGER_TICK_S": "0"})
    client = LedgerClient(settings, "wallet")
    home = routing.partition_of_account("user:lp:USD", settings.partitions)
    others = [f"user:lp{i}:USD" for i in range(200)
              if routing.partition_of_account(f"user:lp{i}:USD", settings.partitions) != home][:6]
    try:
        opened = [client.open_account(a, "USD") for a in ["user:lp:USD", *others]]
        opened.append(client.post("lp-dep", [Leg("sys:world:USD", -600), Leg("user:lp:USD", 600)], kind="deposit"))
        assert {outcome(r) for r in client.wait(opened).values()} == {"accepted"}
        sent, freezes = [], []
        for i, other in enumerate(others):
            with client.linked():
                sent += [client.post(f"lp-{i}-in", [Leg("user:lp:USD", -100), Leg(other, 100)]),
                         client.post(f"lp-{i}-back", [Leg(other, -40), Leg("user:lp:USD", 40)])]
            freezes.append(client.account_command("FreezeAccount", other, command_id=f"lp-{i}-freeze"))
        answers = client.wait(sent + freezes)
        assert {i: outcome(answers[i]) for i in sent + freezes} == {i: "accepted" for i in sent + freezes}
        assert wait_quiescent(settings)
        balances = latest_balances(settings)
        assert [balances[a]["posted"] for a in ["user:lp:USD", *others]] == [str(600 - 60 * len(others))] + \
            ["60"] * len(others)
        report = verify(settings)
        assert report.ok, format_report(report)
    finally:
        client.close()
