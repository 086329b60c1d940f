"""The ACL model itself (connectors/acl.py), without a broker: the properties docs/security.md promises hold
for any set of principals, whatever topics the ledger gains later."""
from __future__ import annotations

from connectors.acl import GROUP, PREFIXED, READ, TOPIC, TXN, WRITE, Roles, model
from streams.config import TOPIC_NAMES, Settings

SETTINGS = Settings(prefix="p.", partitions=4)
ROLES = Roles.parse(["w1", "w2"], ["app-a", "gw:wallet,shop"], ["reader"], ["auditor"])


def _matches(grant, name: str) -> bool:
    return name.startswith(grant.name) if grant.pattern == PREFIXED else name == grant.name


def _who(operation, resource, name: str) -> set[str]:
    return {g.principal for g in model(SETTINGS, ROLES)
            if g.operation == operation and g.resource == resource and _matches(g, name)}


def test_only_workers_write_outputs_and_the_changelog():
    workers = {"User:w1", "User:w2"}
    for name in TOPIC_NAMES:
        if name != "commands":
            assert _who(WRITE, TOPIC, SETTINGS.topic(name)) == workers, name
    for client in ("app-a", "wallet", "shop", "someone-else"):
        assert _who(WRITE, TOPIC, SETTINGS.client_results_topic(client)) == workers


def test_producers_write_commands_and_read_only_their_own_results():
    assert _who(WRITE, TOPIC, SETTINGS.topic("commands")) == {"User:w1", "User:w2", "User:app-a", "User:gw"}
    assert _who(READ, TOPIC, SETTINGS.client_results_topic("app-a")) == {"User:app-a", "User:auditor"}
    assert _who(READ, TOPIC, SETTINGS.client_results_topic("wallet")) == {"User:gw", "User:auditor"}
    assert _who(READ, TOPIC, SETTINGS.topic("results")) == {"User:auditor"}
    assert _who(READ, TOPIC, SETTINGS.topic("commands")) == {"User:w1", "User:w2", "User:auditor"}


def test_readers_read_balances_and_history_only():
    readable = {n for n in TOPIC_NAMES if "User:reader" in _who(READ, TOPIC, SETTINGS.topic(n))}
    assert readable == {"balances", "history"}


def test_only_workers_join_their_group_and_use_their_transactional_ids():
    assert _who(READ, GROUP, "p.workers") == {"User:w1", "User:w2"}
    assert _who(WRITE, TXN, "p.ledger-p0") == {"User:w1", "User:w2"}


def test_no_grant_appears_twice():
    grants = model(SETTINGS, ROLES)
    assert len(grants) == len(set(grants))
