"""Authentication and authorization through the real broker: a worker with a clients file (streams/authn.py)
and the read API with tokens (projections/access.py). One worker for the module, to keep wall time small."""
from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient

from connectors import rules
from connectors.client import ClientValidationError, LedgerClient, Leg
from connectors.demo import final_balances
from projections.access import ApiTokens, token_hash
from projections.api import create_app
from projections.projector import catch_up
from projections.verify import format_report, verify, wait_quiescent
from schemas.codec import codec
from tests.harness import Worker, drop, fresh_settings

CLIENTS = """
[clients.wallet]
key = "wallet-secret"
debit = ["user:*", "sys:world:*"]
credit = ["*"]
open = ["user:*"]
hold = ["user:*"]

[clients.reader]
key = "reader-secret"
"""
ALICE, BOB, CAROL = "user:alice:USD", "user:bob:USD", "vip:carol:USD"
BEFORE = {ALICE: (900, 0), BOB: (100, 0), CAROL: (0, 0), "sys:fees:USD": (0, 0), "user:mallory:USD": (0, 0)}


def balances(settings) -> dict[str, tuple[int, int]]:
    return final_balances(settings, list(BEFORE), timeout_s=0)


@pytest.fixture(scope="module")
def secured(kafka_bootstrap, tmp_path_factory):
    settings = fresh_settings(kafka_bootstrap, partitions=2)  # fewer to start and to scan for quiescence
    home = tmp_path_factory.mktemp("secured")
    (home / "clients.toml").write_text(CLIENTS)
    worker = Worker(settings, home / "w1", "w1", extra_env={"LEDGER_CLIENTS": str(home / "clients.toml")}).start()
    wallet = LedgerClient(settings, "wallet", key="wallet-secret")
    try:
        ids = [wallet.open_account(a, "USD") for a in (ALICE, BOB)]
        ids.append(wallet.post("dep", [Leg("sys:world:USD", -1_000), Leg(ALICE, 1_000)], kind="deposit"))
        ids.append(wallet.post("pay", [Leg(ALICE, -100), Leg(BOB, 100)]))
        assert {c: r["outcome"] for c, r in wallet.wait(ids).items()} == dict.fromkeys(ids, "accepted")
        deadline = time.monotonic() + 30
        while balances(settings) != BEFORE:  # bob's credit may land in another partition a moment later
            assert time.monotonic() < deadline, balances(settings)
            time.sleep(0.2)
        yield settings, worker, wallet, home
    finally:
        wallet.close()
        worker.kill9()
        drop(settings)


def test_only_signed_commands_within_the_policy_move_money(secured):
    settings, worker, wallet, _ = secured
    """The fixture's signed commands inside the policy were accepted; each forbidden one changes nothing."""
    assert "client authentication on: 2 clients" in worker.log_since_start()
    theft = [Leg(ALICE, -500), Leg("user:mallory:USD", 500)]
    unsigned = LedgerClient(settings, "wallet")  # no key: records go unsigned
    guessed = LedgerClient(settings, "wallet", key="guessed")
    reader = LedgerClient(settings, "reader", key="reader-secret")
    try:
        unsigned.post("unsigned", theft)
        guessed.post("guessed", theft)
        # Signed by reader, naming wallet as its client: the forged client_id.
        forged = codec().encode("command", {"command_id": "forged", "client_id": "wallet", "body": (
            "ledger.PostTransaction", {"transaction_id": "forged", "kind": "transfer", "reference": None,
                                       "links": [], "metadata": {}, "occurred_at_ms": None, "rate_snapshot_id": None,
                                       "legs": [{"account_id": leg.account_id, "amount": str(leg.amount_minor),
                                                 "hold_id": None, "currency": None} for leg in theft]})})
        reader.send_raw(forged, ALICE)
        reader.flush()
        unsigned.flush()
        guessed.flush()
        wallet.open_account(CAROL, "USD", command_id="open-vip")  # outside open = ["user:*"]
        wallet.post("fees", [Leg("sys:fees:USD", -5), Leg(ALICE, 5)])  # outside debit
        # A signing client never takes a not_authenticated answer as its own (someone else wrote it): the
        # impostor's "race" is refused first, the wallet's own "race" is then decided and is its answer.
        unsigned.post("race", theft)
        unsigned.flush()
        wallet.open_account("user:erin:USD", "USD", command_id="race")
        answers = wallet.wait(["open-vip", "fees", "race"])
        # The refusals of what others wrote as "wallet" are seen by a reader that does not sign.
        answers.update(unsigned.wait(["unsigned", "guessed", "forged"]))
    finally:
        for client in (unsigned, guessed, reader):
            client.close()
    reasons = {c: (r["outcome"], r["reason"], r["detail"].split(":")[0]) for c, r in answers.items()}
    assert reasons == {
        "unsigned": ("rejected", "not_authenticated", "unsigned"),
        "guessed": ("rejected", "not_authenticated", "bad_signature"),
        "forged": ("rejected", "not_authenticated", "client_mismatch"),
        "open-vip": ("rejected", "not_permitted", "policy 'wallet' rule open allows user"),
        "fees": ("rejected", "not_permitted", "policy 'wallet' rule debit allows user"),
        "race": ("accepted", None, ""),
    }
    assert balances(settings) == BEFORE
    # A business-event rule's commands run under the client that submits them: a signing client refuses a
    # plan built for another client id, and its own plan is judged by its own policy (a confirmed deposit
    # moves custody money, which the wallet's policy does not name).
    deposit = rules.DepositConfirmed("r1", "alice", "USD", 7)
    with pytest.raises(ClientValidationError, match="Context"):
        wallet.submit(rules.plan(deposit))  # built for client id "rules"
    [command_id] = wallet.submit(rules.plan(deposit, rules.Context(client_id="wallet")))
    answer = wallet.result(command_id)
    assert (answer["reason"], answer["detail"].rsplit(" ", 1)[-1]) == ("not_permitted", "sys:custody:USD")
    assert wait_quiescent(settings, 60)
    report = verify(settings)
    assert report.ok, format_report(report)


def test_the_read_api_answers_a_token_only_for_the_accounts_it_may_read(secured):
    settings, _, wallet, home = secured
    # Refusals of records someone else wrote as the wallet, before and after its own decision under the same
    # id: the read store keeps the decision (they are answers, never decisions).
    impostor = LedgerClient(settings, "wallet")
    try:
        impostor.post("race2", [Leg(ALICE, -500), Leg("user:mallory:USD", 500)])
        impostor.flush()
        assert wallet.result(wallet.post("race2", [Leg(ALICE, -1), Leg(BOB, 1)]))["outcome"] == "accepted"
        impostor.post("race2", [Leg(ALICE, -500), Leg("user:mallory:USD", 500)])
        impostor.flush()
    finally:
        impostor.close()
    # Decided after the impostor's second record (same partition, sent later): the store will have seen it.
    assert wallet.result(wallet.account_command("FreezeAccount", ALICE, command_id="fence"))["reason"] == \
        "not_permitted"
    target = str(home / "read.db")
    catch_up(settings, target)
    tokens = ApiTokens.from_mapping({"tokens": {
        "alice-app": {"sha256": token_hash("alice-token"), "accounts": ["user:alice:*"]},
        "ops": {"sha256": token_hash("ops-token"), "accounts": ["*"], "system": True}}})
    with TestClient(create_app(target, settings, tokens=tokens)) as api:
        def get(path: str, token: str | None = None, **kw):
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            answer = api.get(path, headers=headers, **kw)
            return answer.status_code, answer.json().get("error", {}).get("code") if answer.status_code >= 400 else None

        assert get(f"/accounts/{ALICE}") == (401, "missing_token")
        assert api.get(f"/accounts/{ALICE}").headers["www-authenticate"].startswith("Bearer")
        assert get(f"/accounts/{ALICE}", "wrong-token") == (401, "unknown_token")
        assert get(f"/accounts/{BOB}", "alice-token") == (403, "not_permitted")
        assert get(f"/accounts/{BOB}/history", "alice-token") == (403, "not_permitted")
        assert get("/metrics", "alice-token") == (403, "not_permitted")  # ledger-wide views need system
        assert get(f"/accounts/{ALICE}", "alice-token") == (200, None)
        assert api.get(f"/accounts/{ALICE}", headers={"Authorization": "Bearer alice-token"}).json()[
            "posted"]["minor"] == str(balances(settings)[ALICE][0])
        assert get(f"/accounts/{ALICE}/history", "alice-token") == (200, None)
        assert get(f"/accounts/{BOB}", "ops-token") == (200, None)
        race = api.get("/commands/wallet/race2", headers={"Authorization": "Bearer ops-token"}).json()
        assert (race["outcome"], race["reason"]) == ("accepted", None)
        assert api.get("/metrics", headers={"Authorization": "Bearer ops-token"}).status_code == 200
        assert get("/healthz") == (200, None)  # no ledger data: open
        # The dashboard's login link sets the cookie its page's later requests (and its EventSource) carry.
        assert api.get("/?token=ops-token").status_code == 200
        assert api.cookies.get("ledger_token") == "ops-token"
        assert api.get("/api/stats").status_code == 200
