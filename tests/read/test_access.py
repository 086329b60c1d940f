"""The read API's token gate (projections/access.py) without a broker: an empty store is enough, since the gate
answers before any route reads (an allowed account then gets the route's own 404)."""
from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from projections.access import ApiTokens, Grant, judge, token_hash
from projections.api import create_app
from streams.config import ConfigError

ALICE = Grant("alice-app", ("user:alice:*",))
OPS = Grant("ops", ("*",), system=True)

CASES = [
    # (grant, a token was presented, path, expected (status, code) or None to pass)
    (None, False, "/accounts/user:alice:USD", (401, "missing_token")),
    (None, True, "/accounts/user:alice:USD", (401, "unknown_token")),
    (ALICE, True, "/accounts/user:alice:USD", None),
    (ALICE, True, "/accounts/user:alice:USD/history", None),
    (ALICE, True, "/accounts/user%3Aalice%3AUSD/holds", None),  # percent-encoded ids are judged decoded
    (ALICE, True, "/accounts/user:bob:USD", (403, "not_permitted")),
    (ALICE, True, "/accounts/sys:world:USD/series", (403, "not_permitted")),
    (ALICE, True, "/transactions/t1", (403, "not_permitted")),  # spans accounts: a ledger-wide view
    (ALICE, True, "/commands/wallet/c1", (403, "not_permitted")),
    (ALICE, True, "/metrics", (403, "not_permitted")),
    (ALICE, True, "/events", (403, "not_permitted")),
    (OPS, True, "/metrics", None),
    (OPS, True, "/accounts/user:bob:USD", None),
    (None, False, "/", None),  # the dashboard page, its assets, liveness and the docs hold no ledger data
    (None, False, "/static/app.js", None),
    (None, False, "/healthz", None),
    (None, False, "/openapi.json", None),
]


@pytest.mark.parametrize("grant, presented, path, expected", CASES)
def test_the_gate_lets_a_token_read_only_its_grant(grant, presented, path, expected):
    denial = judge(grant, presented, path)
    assert (None if denial is None else (denial.status, denial.code)) == expected


@pytest.mark.parametrize("entry, message", [
    ({"sha256": "abc"}, "64 lowercase hex"),
    ({"sha256": token_hash("t"), "accounts": "user:*"}, "accounts must be a list"),
    ({"sha256": token_hash("t"), "system": "yes"}, "system must be true or false"),
    ({"sha256": token_hash("t"), "admin": True}, "unknown fields"),
])
def test_a_tokens_file_that_cannot_be_used_is_refused_naming_the_token(entry, message):
    with pytest.raises(ConfigError, match=f"token 't'.*{message}"):
        ApiTokens.from_mapping({"tokens": {"t": entry}})


def test_the_gate_in_front_of_the_app_with_header_query_and_the_dashboards_cookie(tmp_path):
    tokens = ApiTokens.from_mapping({"tokens": {
        "alice-app": {"sha256": token_hash("alice-token"), "accounts": ["user:alice:*"]},
        "ops": {"sha256": token_hash("ops-token"), "accounts": ["*"], "system": True}}})
    with TestClient(create_app(str(tmp_path / "read.db"), tokens=tokens)) as api:
        missing = api.get("/accounts/user:alice:USD")
        assert (missing.status_code, missing.json()["error"]["code"]) == (401, "missing_token")
        assert missing.headers["www-authenticate"] == 'Bearer realm="ledger"'
        bearer = {"Authorization": "Bearer alice-token"}
        assert api.get("/accounts/user:alice:USD", headers=bearer).json()["error"]["code"] == "unknown_account"
        assert api.get("/accounts/user:bob:USD", headers=bearer).json()["error"]["code"] == "not_permitted"
        assert api.get("/accounts/user:alice:USD?token=alice-token").status_code == 404  # past the gate
        assert "ledger_token" not in api.cookies  # only the dashboard's page sets the cookie
        assert api.get("/?token=ops-token").status_code == 200
        assert api.cookies.get("ledger_token") == "ops-token"
        assert api.get("/api/stats").status_code == 200
    with TestClient(create_app(str(tmp_path / "read.db"), tokens=None)) as open_api:  # no tokens file: open
        assert open_api.get("/api/stats").status_code == 200
