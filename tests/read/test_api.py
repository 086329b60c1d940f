"""The read API over a caught-up store (SQLite and PostgreSQL): views, pagination, as-of, holds, transactions,
errors, RYW."""
from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient

from connectors.client import Leg
from projections.api import create_app
from projections.routes import MAX_PAGE
from tests.read.conftest import BASE_MS, DEPOSITS, PAGER

USDT = 10**6


@pytest.fixture(scope="module")
def api(ledger_run, read_db):
    with TestClient(create_app(read_db, ledger_run.settings, min_seq_timeout_s=0.5)) as client:
        yield client


def test_balance_views_with_exact_and_formatted_amounts(api):
    buyer = api.get("/accounts/user:buyer:USDT").json()
    assert buyer["posted"] == {"minor": str(28_020 * USDT), "decimal": "28020.000000", "currency": "USDT"}
    assert buyer["held"]["minor"] == "0" and buyer["available"]["decimal"] == "28020.000000"
    fees = api.get("/accounts/sys:fees:BTC").json()  # a system account: the sum of its shards
    assert fees["posted"] == {"minor": "20000", "decimal": "0.00020000", "currency": "BTC"}
    assert sum(int(s["posted"]["minor"]) for s in fees["shard_views"]) == 20000
    shard = fees["shard_views"][0]["account_id"]
    assert api.get(f"/accounts/{shard}").json()["account_id"] == shard


@pytest.mark.parametrize("account", ["user:buyer:USDT", "sys:fees:BTC", "sys:fees:BTC@0", "user:nobody:USD",
                                     "user%3Abuyer%3AUSDT"])
def test_the_short_path_of_an_account_lookup_answers_as_the_route(api, account):
    """GET /accounts/{id} without a query string skips FastAPI's routing (routes.AccountLookups); with one
    (min_seq=0, reached at once) it goes through the route: the same status, headers and bytes. An unknown
    account (min_seq would wait for it) is compared with a routed answer that looks it up the same way."""
    unknown = "nobody" in account
    short = api.get(f"/accounts/{account}")
    routed = api.get(f"/accounts/{account}/holds" if unknown else f"/accounts/{account}?min_seq=0")
    assert (short.status_code, short.content) == (routed.status_code, routed.content)
    assert short.headers["content-type"] == routed.headers["content-type"] == "application/json"
    assert short.status_code == (404 if unknown else 200)


def test_history_pages_by_cursor_and_caps_the_page_size(api):
    seen, cursor = [], None
    while True:
        page = api.get(f"/accounts/{PAGER}/history", params={"limit": 7, **({"cursor": cursor} if cursor else {})})
        assert page.status_code == 200
        body = page.json()
        seen += [e["seq"] for e in body["entries"]]
        cursor = body["next_cursor"]
        if cursor is None:
            break
    # opened + 30 deposits + hold placed (the rejected overdraft changed nothing)
    assert seen == list(range(1, DEPOSITS + 3))
    big = api.get(f"/accounts/{PAGER}/history", params={"limit": 10**9}).json()
    assert big["limit"] == MAX_PAGE and len(big["entries"]) == DEPOSITS + 2
    assert big["entries"][1]["amount"] == {"minor": "100", "decimal": "1.00", "currency": "USD"}
    assert api.get("/accounts/sys:world:USD/history").json()["error"]["code"] == "sharded_account"


def test_balance_as_of_seq_and_business_time(api):
    by_seq = api.get(f"/accounts/{PAGER}/balance", params={"as_of_seq": 11}).json()
    assert by_seq["posted"]["minor"] == "1000"  # seq 1 opened, seqs 2..11 ten deposits
    by_time = api.get(f"/accounts/{PAGER}/balance", params={"as_of_ms": BASE_MS + 9 * 1000}).json()
    assert by_time["posted"]["minor"] == "1000"
    assert api.get(f"/accounts/{PAGER}/balance", params={"as_of_seq": 0}).json()["posted"]["minor"] == "0"
    now = api.get(f"/accounts/{PAGER}/balance", params={"as_of_ms": int(time.time() * 1000)}).json()
    assert (now["posted"]["minor"], now["held"]["minor"], now["available"]["minor"]) == ("3000", "500", "2500")
    assert api.get(f"/accounts/{PAGER}/balance", params={"as_of_seq": 999}).json()["error"]["code"] == "unknown_seq"
    both = api.get(f"/accounts/{PAGER}/balance", params={"as_of_seq": 1, "as_of_ms": 1})
    assert both.status_code == 422 and both.json()["error"]["code"] == "invalid_parameter"


def test_holds_transactions_and_commands(api):
    holds = api.get(f"/accounts/{PAGER}/holds").json()["holds"]
    assert [(h["hold_id"], h["remaining"]["minor"]) for h in holds] == [("pager-hold", "500")]
    assert api.get("/accounts/user:buyer:USDT/holds").json()["holds"] == []  # released
    ended = api.get("/accounts/user:buyer:USDT/holds", params={"status": "all"}).json()["holds"]
    assert ended[0]["status"] == "released" and ended[0]["released"]["decimal"] == "18020.000000"
    fill = api.get("/transactions/fill-1").json()
    assert fill["status"] == "posted"
    by_account = {}
    for leg in fill["legs"]:
        by_account[leg["account_id"].split("@")[0]] = by_account.get(leg["account_id"].split("@")[0], 0) + int(
            leg["amount"]["minor"])
    assert by_account["user:buyer:USDT"] == -11_980 * USDT and by_account["user:buyer:BTC"] == 19_980_000
    rejected = api.get("/transactions/pager-over").json()
    assert rejected["status"] == "rejected" and rejected["results"][0]["reason"] == "insufficient_funds"
    result = api.get("/commands/read-tests/pager-over").json()
    assert (result["outcome"], result["reason"]) == ("rejected", "insufficient_funds")
    assert api.get("/commands/read-tests/hold:pager-hold").json()["holds"][0]["status"] == "open"


@pytest.mark.parametrize("url, status, code", [
    ("/accounts/user:nobody:USD", 404, "unknown_account"),
    ("/accounts/user:nobody:USD/history", 404, "unknown_account"),
    ("/transactions/no-such-tx", 404, "unknown_transaction"),
    ("/commands/read-tests/no-such-command", 404, "unknown_command"),
    (f"/accounts/{PAGER}/history?limit=0", 422, "invalid_parameter"),
    (f"/accounts/{PAGER}/history?limit=ten", 422, "invalid_parameter"),
    (f"/accounts/{PAGER}/history?cursor=-1", 422, "invalid_parameter"),
    (f"/accounts/{PAGER}/balance", 422, "invalid_parameter"),
    (f"/accounts/{PAGER}/balance?as_of_ms=yesterday", 422, "invalid_parameter"),
    (f"/accounts/{PAGER}/holds?status=maybe", 422, "invalid_parameter"),
    (f"/accounts/{PAGER}?min_seq=x", 422, "invalid_parameter"),
    ("/no/such/route", 404, "not_found"),
    # Integers beyond SQL's signed 64 bits are refused, not handed to the database driver (a 500 before).
    (f"/accounts/{PAGER}/history?cursor=99999999999999999999", 422, "invalid_parameter"),
    (f"/accounts/{PAGER}/history?limit=99999999999999999999", 422, "invalid_parameter"),
    (f"/accounts/{PAGER}/balance?as_of_ms=99999999999999999999999", 422, "invalid_parameter"),
    (f"/accounts/{PAGER}/balance?as_of_seq=99999999999999999999", 422, "invalid_parameter"),
    (f"/accounts/{PAGER}?min_seq=99999999999999999999", 422, "invalid_parameter"),
    ("/events?since=99999999999999999999", 422, "invalid_parameter"),
])
def test_errors_are_json_with_stable_codes(api, url, status, code):
    response = api.get(url)
    assert response.status_code == status
    body = response.json()
    assert body["error"]["code"] == code and body["error"]["message"]


def test_read_your_writes_gives_up_with_503_and_retry_after(api):
    response = api.get(f"/accounts/{PAGER}", params={"min_seq": 10**6})
    assert response.status_code == 503 and response.json()["error"]["code"] == "not_caught_up"
    assert response.headers["retry-after"] == "1"
    # The answer says how far the store got and how long it waited (the app's bound, 0.5 s here).
    message = response.json()["error"]["message"]
    assert f"not {10**6}" in message and "after 0.5 s" in message, message


def test_read_your_writes_waits_for_the_projector(ledger_run, backend, new_store):
    # A fresh store with the projector running in the API process: a write is visible once projected.
    app = create_app(new_store("live"), ledger_run.settings, projector=True)
    command_id = f"ryw-{backend}"  # one new write per backend (the same id again would be a duplicate)
    with TestClient(app) as api:
        before = api.get(f"/accounts/{PAGER}", params={"min_seq": DEPOSITS + 2}).json()["seq"]
        ledger_run.client.post(command_id, [Leg("sys:world:USD", -1), Leg(PAGER, 1)], kind="deposit")
        ledger_run.client.flush()
        after = api.get(f"/accounts/{PAGER}", params={"min_seq": before + 1})
        assert after.status_code == 200 and after.json()["seq"] == before + 1
        assert api.get(f"/accounts/{PAGER}/history", params={"cursor": before}).json()["entries"][0]["command_id"] \
            == command_id
        # The live feed: the SSE stream sends the changed views and stats, bounded by max_s for the test.
        with api.stream("GET", "/events", params={"since": 0, "max_s": 1}) as stream:
            text = "".join(stream.iter_text())
        assert "event: balances" in text and PAGER in text and "event: stats" in text
        metrics = api.get("/metrics").text
        assert 'ledger_projector_lag_records{topic="history"}' in metrics
        assert "ledger_reconciliation_ok 1.0" in metrics
        assert 'ledger_read_results_total{outcome="rejected",reason="insufficient_funds"}' in metrics


def test_openapi_lists_the_endpoints(api):
    paths = api.get("/openapi.json").json()["paths"]
    assert {"/accounts/{account_id}", "/accounts/{account_id}/history", "/accounts/{account_id}/balance",
            "/accounts/{account_id}/holds", "/transactions/{transaction_id}",
            "/commands/{client_id}/{command_id}"} <= set(paths)


def test_the_openapi_document_lists_the_real_error_answers(api):
    doc = api.get("/openapi.json").json()
    account = doc["paths"]["/accounts/{account_id}"]["get"]["responses"]
    assert {"200", "404", "422", "503"} <= set(account) and "504" not in account
    assert account["404"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorBody")
    assert "400" in doc["paths"]["/accounts/{account_id}/history"]["get"]["responses"]
    cursor = next(p for p in doc["paths"]["/accounts/{account_id}/history"]["get"]["parameters"]
                  if p["name"] == "cursor")
    assert cursor["schema"]["anyOf"][0]["maximum"] == 2**63 - 1
