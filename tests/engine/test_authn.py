"""Client authentication and policy in the engine, without a broker: signatures (streams/authn.py) and the
partition's hook (streams/partition.py) over the in-memory bus of tests/helpers/bus.py."""
from __future__ import annotations

from pathlib import Path

import pytest

from schemas.codec import codec
from streams import placement, routing
from streams.authn import CLIENT_HEADER, SIGNATURE_HEADER, Clients, Signer
from streams.config import ConfigError
from streams.seal import DEVELOPMENT
from tests.helpers.authn import CLIENTS, TOPIC, WALLET, funded, results, send, wallet_tx
from tests.helpers.bus import Bus, Record, assert_books_balance
from tests.helpers.records import N, batch, command, local_users, open_account

C = codec()
VALUE = b"any record bytes"


def signed(signer: Signer, partition: int = 0, value: bytes = VALUE) -> list[tuple[str, bytes]]:
    return signer.headers(TOPIC, partition, value)


SIGNATURES = [
    # (headers, partition the record is in, its value, the client taken or the start of the refusal)
    (signed(WALLET), 0, VALUE, "wallet"),
    (signed(Signer("wallet", b"wallet-old")), 0, VALUE, "wallet"),  # a key being rotated out still counts
    (None, 0, VALUE, "unsigned"),
    ([(CLIENT_HEADER, b"wallet")], 0, VALUE, "unsigned"),
    (signed(WALLET) + signed(WALLET)[1:], 0, VALUE, "unsigned"),  # two signatures: which one would count?
    (signed(Signer("mallory", b"m")), 0, VALUE, "unknown_client"),
    (signed(Signer("wallet", b"guessed")), 0, VALUE, "bad_signature"),
    (signed(WALLET, partition=1), 0, VALUE, "bad_signature"),  # copied into another partition
    (signed(WALLET), 0, VALUE + b"!", "bad_signature"),  # the bytes changed
    ([(CLIENT_HEADER, b"reader"), signed(WALLET)[1]], 0, VALUE, "bad_signature"),  # another client's signature
    # The engine's seal is no client signature (another domain of the same construction).
    ([(CLIENT_HEADER, b"wallet"), (SIGNATURE_HEADER, DEVELOPMENT.headers(TOPIC, 0, VALUE)[0][1])], 0, VALUE,
     "bad_signature"),
]


@pytest.mark.parametrize("headers, partition, value, expected", SIGNATURES)
def test_a_record_is_authenticated_only_by_its_clients_signature_of_these_bytes_here(headers, partition, value,
                                                                                        expected):
    signer, why = Clients.from_mapping(CLIENTS).authenticate(TOPIC, partition, value, headers)
    if expected in ("wallet",):
        assert (signer, why) == (expected, "")
    else:
        assert signer is None and why.startswith(expected), why


@pytest.mark.parametrize("entry, message", [
    ({}, "needs exactly one of key, key_file"),
    ({"key": "k", "key_file": "f"}, "needs exactly one of key, key_file"),
    ({"key": "k", "withdraw": ["*"]}, "unknown fields ['withdraw']"),
    ({"key": "k", "debit": "user:*"}, "debit must be a list of account patterns"),
    ({"key": ""}, "key and old_keys must be non-empty strings"),
    ({"key_file": "missing.key"}, "cannot read the key file"),
])
def test_a_clients_file_that_cannot_be_used_is_refused_naming_the_client(entry, message, tmp_path):
    with pytest.raises(ConfigError, match="client 'w'.*" + message.replace("[", r"\[").replace("]", r"\]")):
        Clients.from_mapping({"clients": {"w": entry}}, tmp_path)


def test_a_clients_file_in_toml_with_a_key_file_beside_it(tmp_path: Path):
    (tmp_path / "w.key").write_text("from-file\n")
    path = tmp_path / "clients.toml"
    path.write_text('[clients.w]\nkey_file = "w.key"\ndebit = ["user:*"]\n')
    clients = Clients.from_file(path)
    assert clients.authenticate(TOPIC, 3, VALUE, Signer("w", b"from-file").headers(TOPIC, 3, VALUE)) == ("w", "")
    assert clients.policy("w").debit == ("user:*",) and clients.policy("w").credit == ()
    assert Clients.from_env({}) is None  # no file: the ledger runs open


# --- the engine's hook ----------------------------------------------------------------------------------


def secured_bus() -> Bus:
    bus = Bus()
    clients = Clients.from_mapping(CLIENTS)
    for proc in bus.procs.values():
        proc.clients = clients
    return bus


A, B = local_users(2)


def test_commands_that_are_not_the_signers_own_are_rejected_not_authenticated_and_change_nothing():
    bus = secured_bus()
    funded(bus)
    send(bus, wallet_tx("unsigned", (A, -10), (B, 10)), A, signer=None)
    send(bus, wallet_tx("forged", (A, -10), (B, 10)), A, signer=Signer("wallet", b"guessed"))
    send(bus, wallet_tx("as-wallet", (A, -10), (B, 10)), A, signer=Signer("reader", b"reader-secret"))
    bus.run()
    assert results(bus, "unsigned") == [("rejected", "not_authenticated", False)]
    assert results(bus, "forged") == [("rejected", "not_authenticated", False)]
    assert results(bus, "as-wallet") == [("rejected", "not_authenticated", False)]
    detail = next(r["detail"] for r in bus.results if r["command_id"] == "as-wallet")
    assert detail.startswith("client_mismatch: a record signed by 'reader' carries a command of 'wallet'")
    assert bus.account(A) == (1_000, 0) and bus.account(B) == (0, 0)
    # Under their own key (a table of the latest result per key keeps the client's decision) and never
    # remembered: the impostor did not spend the id, the client's own send of it is decided.
    keys = [e.key for e in bus.emitted if e.result["command_id"] == "unsigned"]
    assert keys == [b"wallet/unsigned#not_authenticated"]
    send(bus, wallet_tx("unsigned", (A, -10), (B, 10)), A)
    bus.run()
    assert results(bus, "unsigned")[-1] == ("accepted", None, False)
    assert bus.account(A) == (990, 0) and bus.account(B) == (10, 0)


def test_one_signature_covers_a_batch_and_each_command_must_be_the_signers():
    bus = secured_bus()
    funded(bus)
    send(bus, batch(wallet_tx("b1", (A, -1), (B, 1)), wallet_tx("b2", (A, -2), (B, 2), client="reader"),
                    wallet_tx("b3", (A, -3), (B, 3))), A)
    bus.run()
    assert [results(bus, c)[0][:2] for c in ("b1", "b2", "b3")] == [
        ("accepted", None), ("rejected", "not_authenticated"), ("accepted", None)]
    assert bus.account(B) == (4, 0)


def test_a_command_outside_the_policy_is_rejected_not_permitted_naming_the_rule_and_remembered():
    bus = secured_bus()
    funded(bus)
    send(bus, open_account("vip:1:USD", client="wallet"), "vip:1:USD")
    send(bus, wallet_tx("steal", ("sys:fees:USD", -5), (A, 5)), A)
    send(bus, command("no", "FreezeAccount", {"account_id": A}, "wallet"), A)
    send(bus, command("r", "OpenAccount", {"account_id": "user:9:USD", "currency": "USD", "allow_negative": False,
                                          "overdraft_limit": "0", "max_balance": None, "routing_key": None},
                      "reader"), "user:9:USD", signer=Signer("reader", b"reader-secret"))
    bus.run()
    assert results(bus, "open:vip:1:USD") == [("rejected", "not_permitted", False)]
    assert results(bus, "steal") == [("rejected", "not_permitted", False)]
    assert results(bus, "no") == [("rejected", "not_permitted", False)]
    assert results(bus, "r") == [("rejected", "not_permitted", False)]
    detail = next(r["detail"] for r in bus.results if r["command_id"] == "steal")
    assert detail == "policy 'wallet' rule debit allows user:*, sys:world:*; this command would debit sys:fees:USD"
    send(bus, wallet_tx("steal", ("sys:fees:USD", -5), (A, 5)), A)  # a retry gets the decision again
    bus.run()
    assert results(bus, "steal")[-1] == ("rejected", "not_permitted", True)
    assert bus.account(A) == (1_000, 0) and bus.account("sys:fees:USD") == (0, 0)


def test_the_engines_follow_ups_are_not_judged_again_and_a_refused_transaction_reserves_nothing():
    """Credits to another partition and a forwarded command are sealed by the engine: judged once, where the
    client's record arrived. A transaction debiting two partitions is refused by its coordinator; its copy
    in the other partition reserves nothing, and the books balance."""
    bus = secured_bus()
    far = next(f"user:{i}:USD" for i in range(100, 10_000) if routing.partition_of_account(f"user:{i}:USD", N) != 0)
    for account in (A, far):
        send(bus, open_account(account, client="wallet"), account)
    send(bus, wallet_tx("dep", ("sys:world:USD", -100), (A, 100)), A)
    send(bus, wallet_tx("dep2", ("sys:world:USD", -100), (far, 100)), far)
    send(bus, wallet_tx("cross", (A, -30), (far, 30)), A)  # the credit travels as an engine follow-up
    partition = routing.partition_of_account(A, N)
    wrong = (partition + 1) % N
    value = wallet_tx("misrouted", (A, -5), (far, 5))
    bus.logs[wrong].append(Record(bus.clock + 1, b"k", value, tuple(WALLET.headers(TOPIC, wrong, value))))
    bus.run()
    assert results(bus, "cross")[0][:2] == ("accepted", None)
    assert results(bus, "misrouted")[0][:2] == ("accepted", None)
    assert bus.account(A) == (65, 0) and bus.account(far) == (135, 0)
    placed = C.decode("command", wallet_tx("both", (A, -1), (far, -1), ("sys:fees:USD", -1), ("sys:world:USD", 3)))
    record, partitions = placement.placements(placed, A, N)
    assert len(partitions) == 2
    encoded = C.encode("command", record)
    for p in partitions:
        bus.clock += 1
        bus.logs[p].append(Record(bus.clock, b"k", encoded, tuple(WALLET.headers(TOPIC, p, encoded))))
    bus.run()
    assert results(bus, "both") == [("rejected", "not_permitted", False)]
    assert bus.account(A) == (65, 0) and bus.account(far) == (135, 0)
    assert_books_balance(bus, ("USD",))


def test_a_linked_batch_across_partitions_with_a_command_outside_the_policy_decides_none_of_them():
    """The batch [pay, steal] is sent to A's partition; steal (the fees' money to far, whose home is far's
    partition) is outside the wallet's policy. Across partitions the batch decides none of its commands: both
    are answered linked_spans_partitions, remembered nowhere, the policy's reason in steal's detail. Sent alone to
    its home, steal is decided there, once (remembered not_permitted at A's partition, it was decided twice)."""
    from tests.helpers.records import linked

    bus = secured_bus()
    funded(bus)
    far = next(f"user:{i}:USD" for i in range(100, 10_000) if routing.partition_of_account(f"user:{i}:USD", N)
               != routing.partition_of_account(A, N))
    send(bus, open_account(far, client="wallet"), far)
    bus.run()
    steal = wallet_tx("steal", ("sys:fees:USD", -5), (far, 5))
    send(bus, linked(wallet_tx("pay", (A, -10), (far, 10)), steal), A)
    bus.run()
    assert results(bus, "pay") == [("rejected", "linked_spans_partitions", False)]
    assert results(bus, "steal") == [("rejected", "linked_spans_partitions", False)]
    assert "not permitted: policy 'wallet' rule debit" in bus.result("steal")["detail"]
    send(bus, steal, far)
    bus.run()
    decisions = [r for r in bus.results if r["command_id"] == "steal" and r["reason"] == "not_permitted"]
    assert [(r["duplicate"]) for r in decisions] == [False]
    assert bus.account(A) == (1_000, 0) and bus.account(far) == (0, 0)


def test_a_linked_batch_in_one_partition_with_a_command_outside_the_policy_remembers_its_refusal():
    from tests.helpers.records import linked

    bus = secured_bus()
    funded(bus)
    send(bus, linked(wallet_tx("pay", (A, -10), (B, 10)), wallet_tx("steal", ("sys:fees:USD", -5), (A, 5))), A)
    bus.run()
    assert results(bus, "steal") == [("rejected", "not_permitted", False)]
    assert results(bus, "pay") == [("rejected", "linked_failed", False)]
    send(bus, wallet_tx("steal", ("sys:fees:USD", -5), (A, 5)), A)
    bus.run()
    assert results(bus, "steal")[-1] == ("rejected", "not_permitted", True)
