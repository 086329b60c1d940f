"""The edge without a broker: hostile records never stop a partition, move money or produce an output the
topics would refuse (DESIGN.md P11). Sizes (streams/limits.py), forged engine steps (streams/seal.py), and
a command that fails part way (undone and rejected alone)."""
from __future__ import annotations

import pytest

from schemas.codec import codec
from streams import limits, routing
from streams.partition import PartitionProcessor
from streams.routing import ENGINE_CLIENT
from streams.seal import DEVELOPMENT, Seal
from streams.store import MemoryStore
from tests.helpers.bus import Bus
from tests.helpers.forged import decide, reserve
from tests.helpers.records import N, T0, batch, command, local_users, open_account, place_hold, transfer, tx
from tests.helpers.results import answer, results

C = codec()


def assert_all_fit(outputs, changelog) -> None:
    for o in outputs:
        assert len(o.key) + len(o.value) <= limits.OUTPUT_RECORD_BYTES, (o.topic, len(o.key), len(o.value))
    for record in changelog:
        assert len(record) <= limits.OUTPUT_RECORD_BYTES, len(record)


def funded(proc: PartitionProcessor, accounts: list[str], amount: int = 10_000) -> None:
    for i, account in enumerate(accounts):
        proc.handle(i * 2, T0, b"k", open_account(account))
        proc.handle(i * 2 + 1, T0, b"k", transfer(f"dep-{account}", ("sys:world:USD", -amount), (account, amount)))
    outputs, _ = proc.take()
    assert all(r["outcome"] == "accepted" for r in results(outputs)), results(outputs)
    proc.state.commit(0)


# --- sizes -------------------------------------------------------------------------------------------------

def test_an_oversized_account_id_is_rejected_with_the_limit_and_the_partition_goes_on():
    proc = PartitionProcessor(0, N, MemoryStore())
    huge = "user:" + "x" * 300_000 + ":USD"
    proc.handle(0, T0, b"k", open_account(huge))
    ann = local_users(1)[0]
    proc.handle(1, T0, b"k", open_account(ann))
    outputs, changelog = proc.take()
    rejected = answer(outputs, f"open:{huge}")  # ids that fit an answer are echoed whole
    assert (rejected["outcome"], rejected["reason"]) == ("rejected", "invalid_command")
    assert f"the limit is {limits.MAX_COMMAND_BYTES}" in rejected["detail"]
    assert answer(outputs, f"open:{ann}")["outcome"] == "accepted"
    assert len(changelog) == 1, "the oversized command is not remembered and stages nothing"
    assert_all_fit(outputs, changelog)


@pytest.mark.parametrize("field,make", [
    ("account_id", lambda: open_account("user:" + "é" * 200 + ":USD")),
    ("client_id", lambda: command("c1", "FreezeAccount", {"account_id": "user:a:USD"}, client="c" * 257)),
    ("command_id", lambda: command("c" * 1025, "FreezeAccount", {"account_id": "user:a:USD"})),
    ("legs", lambda: tx("t", [("user:a:USD", -1, None, None)] + [("user:b:USD", 0, None, None)] * 128)),
    ("metadata", lambda: command("m", "PostTransaction", {
        "transaction_id": "m", "kind": "transfer", "reference": None, "links": [], "occurred_at_ms": None,
        "rate_snapshot_id": None, "metadata": {"k": "v" * 1025},
        "legs": [{"account_id": "user:a:USD", "amount": "-1", "hold_id": None, "currency": None},
                 {"account_id": "user:b:USD", "amount": "1", "hold_id": None, "currency": None}]})),
    ("amount", lambda: command("h", "PlaceHold", {"hold_id": "h", "account_id": "user:a:USD", "amount": "1" * 5000,
                                                  "expires_at_ms": None})),
])
def test_every_field_has_a_limit(field, make):
    proc = PartitionProcessor(0, N, MemoryStore())
    proc.handle(0, T0, b"k", make())
    outputs, changelog = proc.take()
    [result] = results(outputs)
    assert (result["outcome"], result["reason"]) == ("rejected", "invalid_command"), result
    assert result["detail"].startswith("too_large: ") and field in result["detail"], result["detail"]
    assert changelog == []


def test_ids_too_long_to_echo_are_answered_under_a_short_form_no_valid_command_can_have():
    proc = PartitionProcessor(0, N, MemoryStore())
    client, command_id = "c" * 300_000, "x" * 300_000
    proc.handle(0, T0, b"k", command(command_id, "FreezeAccount", {"account_id": "user:a:USD"}, client=client))
    outputs, _ = proc.take()
    [result] = results(outputs)
    assert (result["client_id"], result["command_id"]) == limits.echo_ids(client, command_id)
    assert len(result["command_id"].encode()) > limits.MAX_COMMAND_ID_BYTES
    assert len(result["client_id"].encode()) > limits.MAX_CLIENT_ID_BYTES
    assert sum(len(o.key) + len(o.value) for o in outputs) < 4_000  # not 600 kB


def test_a_huge_undecodable_record_is_dead_lettered_within_the_record_limit():
    proc = PartitionProcessor(0, N, MemoryStore())
    garbage = b"\xc3\x01" + b"\x00" * 2_000_000
    proc.handle(7, T0, b"k" * 5_000, garbage)
    outputs, _ = proc.take()
    [dead] = [C.decode("dead_letter", o.value) for o in outputs if o.topic == "dlq"]
    assert dead["value"] == garbage[:limits.DEAD_LETTER_VALUE_BYTES] and "2000002 bytes" in dead["detail"]
    assert len(dead["key"]) == limits.DEAD_LETTER_KEY_BYTES
    assert_all_fit(outputs, [])


def _worst_id(prefix: str, size: int, partition: int | None = None) -> str:
    """An id of `size` UTF-8 bytes that json.dumps writes six bytes per byte of (control characters)."""
    for salt in range(10_000):
        head = f"{prefix}{salt}:"
        ident = head + "\x01" * (size - len(head) - 4) + ":USD"
        if partition is None or routing.partition_of_account(ident, N) == partition:
            return ident
    raise AssertionError("no id found")


def test_the_largest_commands_the_limits_allow_produce_outputs_the_topics_accept():
    """The worst case of docs/engine.md: a multi-partition transaction at every limit, with ids json.dumps
    writes six bytes per byte of, through reservation, votes and commit; and many of them in flight."""
    bus = Bus()
    debtors = {p: _worst_id(f"user:d{p}", limits.MAX_ACCOUNT_ID_BYTES, p) for p in range(N)}
    creditor = _worst_id("user:c", limits.MAX_ACCOUNT_ID_BYTES, 1)
    for account in [*debtors.values(), creditor]:
        bus.send(open_account(account), account)
    bus.run()
    for p, account in debtors.items():
        bus.send(transfer(f"dep{p}", ("sys:world:USD", -10**9), (account, 10**9)), account)
    bus.run()
    sent = []
    client = "\x01" * limits.MAX_CLIENT_ID_BYTES
    for n in range(40):  # many in flight on the same accounts: their in-flight records grow until refused
        command_id = f"{n}:" + "\x01" * (limits.MAX_COMMAND_ID_BYTES - 4)
        legs = [(debtors[p], -1, None, None) for p in range(N)] * 10 + [(creditor, 8 * 10, None, None)]

        def encoded(entries: int) -> bytes:
            return command(command_id, "PostTransaction", {
                "transaction_id": "\x01" * limits.MAX_ID_BYTES, "kind": "\x01" * limits.MAX_CODE_BYTES,
                "reference": "\x02" * limits.MAX_ID_BYTES, "links": [], "occurred_at_ms": None,
                "rate_snapshot_id": None,
                "metadata": {f"{i}".ljust(64, "\x01"): "\x01" * 600 for i in range(entries)},
                "legs": [{"account_id": a, "amount": str(x), "hold_id": h, "currency": c} for a, x, h, c in legs]},
                client=client)

        entries = 0
        while len(encoded(entries + 1)) <= limits.MAX_COMMAND_BYTES:
            entries += 1
        record = encoded(entries)
        assert limits.MAX_COMMAND_BYTES - 700 < len(record) <= limits.MAX_COMMAND_BYTES, len(record)
        bus.send(record, debtors[0])
        sent.append(command_id)
    while bus.pending(0):  # every transaction begins before any reservation is decided: all in flight
        bus.step(0)
    bus.run()
    sizes = [len(c) for p in range(N) for c in bus.changelogs[p]]
    sizes += [len(r.key) + len(r.value) for p in range(N) for r in bus.logs[p]]
    sizes += [len(e.key) + len(e.value) for e in bus.emitted] + [len(k) + len(v) for k, v in bus.history_bytes]
    answers = [bus.result(c) for c in sent]
    outcomes = [(a["outcome"], a["reason"]) for a in answers]
    assert ("accepted", None) in outcomes
    assert ("rejected", "in_flight") in outcomes, "the in-flight budget was never reached"
    assert max(sizes) <= limits.OUTPUT_RECORD_BYTES
    assert max(sizes) > 200_000, "the worst case did not come close to the limit: the test lost its point"
    assert not bus.dead_letters


# --- forged engine steps -------------------------------------------------------------------------------------

def test_forged_reserve_and_decide_move_no_money_and_the_victim_can_still_pay():
    proc = PartitionProcessor(0, N, MemoryStore())
    ann, bob = local_users(2)
    funded(proc, [ann, bob])
    proc.handle(10, T0, b"k", reserve("mallory/steal-1~reserve~0", ann, "user:mallory:USD", "9000", 3))
    proc.handle(11, T0, b"k", decide("mallory/steal-1~decide~0", True))
    proc.handle(12, T0, b"k", batch(reserve("r2", ann, "user:mallory:USD", "9000", 3), decide("d2", True)))
    # The engine's own client id on an ordinary command: a credit out of clearing.
    proc.handle(13, T0, b"k", tx("credit", [("sys:clearing:USD", -500, None, None), (bob, 500, None, None)],
                                 kind="transfer", client=ENGINE_CLIENT))
    proc.handle(14, T0, b"k", transfer("pay", (ann, -9_000), (bob, 9_000)))
    outputs, changelog = proc.take()
    for command_id in ("mallory/steal-1~reserve~0", "mallory/steal-1~decide~0", "r2", "d2", "credit"):
        result = answer(outputs, command_id)
        assert (result["outcome"], result["reason"]) == ("rejected", "invalid_command")
        assert result["detail"].startswith("engine_step_unsealed: ")
    assert answer(outputs, "pay")["outcome"] == "accepted"
    assert proc.state.account(ann).posted == 1_000 and proc.state.account(ann).held == 0
    assert proc.state.account(bob).posted == 19_000
    assert not [o for o in outputs if o.topic == "commands"], "a forged step sent a follow-up"
    assert len(changelog) == 1, "only ann's payment changed anything"


def test_a_seal_counts_only_with_the_workers_key_for_its_own_partition():
    ann = local_users(1)[0]
    value = reserve("r", ann, "user:mallory:USD", "9000", 3)
    attacker = Seal(b"a guess")
    for headers in ([], [("ledger-seal", b"\x00" * 32)], attacker.headers("commands", 0, value),
                    DEVELOPMENT.headers("commands", 1, value),  # copied from another partition
                    DEVELOPMENT.headers("other.commands", 0, value),  # from another ledger's topic
                    DEVELOPMENT.headers("commands", 0, value) * 2):  # two seals: which one counts?
        proc = PartitionProcessor(0, N, MemoryStore())
        funded(proc, [ann])
        proc.handle(10, T0, b"k", value, headers)
        outputs, changelog = proc.take()
        assert answer(outputs, "r")["detail"].startswith("engine_step_unsealed"), headers
        assert changelog == []
    proc = PartitionProcessor(0, N, MemoryStore())  # the genuine seal: the step is taken
    funded(proc, [ann])
    proc.handle(10, T0, b"k", value, DEVELOPMENT.headers("commands", 0, value))
    outputs, _ = proc.take()
    assert answer(outputs, "r")["outcome"] == "accepted"
    assert proc.state.account(ann).held == 9_000


def test_a_key_from_the_environment_replaces_the_development_key(monkeypatch):
    monkeypatch.setenv("LEDGER_ENGINE_KEY", "s3cret")
    seal = Seal.from_env()
    value = b"v"
    assert seal.verify("t", 0, value, seal.headers("t", 0, value))
    assert not DEVELOPMENT.verify("t", 0, value, seal.headers("t", 0, value))
    monkeypatch.setenv("LEDGER_ENGINE_KEYS_OLD", "older")
    assert Seal.from_env().verify("t", 0, value, Seal(b"older").headers("t", 0, value)), "rotation"


# --- a command that fails part way -----------------------------------------------------------------------------

def test_a_sealed_step_that_fails_part_way_is_undone_and_rejected_alone():
    """A Reserve whose amount is not a number (as in the crash loop of a forged one) reaches the engine's
    code only when sealed; even then it is a rejection, and the expiry it staged first is undone."""
    proc = PartitionProcessor(0, N, MemoryStore())
    ann = local_users(1)[0]
    funded(proc, [ann])
    proc.handle(5, T0, b"k", place_hold("h1", ann, 100, T0 + 10))
    proc.take()
    proc.state.commit(0)
    bad = reserve("bad", ann, "user:mallory:USD", "abc", 3)
    proc.handle(6, T0 + 20, b"k", bad, DEVELOPMENT.headers("commands", 0, bad))
    outputs, changelog = proc.take()
    result = answer(outputs, "bad")
    assert (result["outcome"], result["reason"]) == ("rejected", "invalid_command")
    assert result["detail"].startswith("unprocessable: WireError")
    assert [r["command_id"] for r in results(outputs)] == ["bad"], "the expiry staged first was undone"
    assert changelog == [] and not proc.state.has_staged
    assert proc.state.hold("h1").status.value == "open"
    proc.handle(7, T0 + 20, b"k", transfer("after", (ann, -1), ("sys:world:USD", 1)))
    outputs, _ = proc.take()
    assert answer(outputs, "expire:h1")["outcome"] == "accepted", "the expiry happens with the next command"
    assert answer(outputs, "after")["outcome"] == "accepted"


def test_hostile_records_get_the_same_answers_every_time():
    ann = local_users(1)[0]
    hostile = [reserve("r", ann, "x", "abc", 3), open_account("user:" + "y" * 50_000 + ":USD"),
               b"\xc3\x01" + b"\xff" * 100, decide("d", True), batch(b"junk", reserve("r3", ann, "x", "1", 3))]

    def run():
        proc = PartitionProcessor(0, N, MemoryStore())
        funded(proc, [ann])
        for offset, value in enumerate(hostile):
            proc.handle(100 + offset, T0, b"k", value, DEVELOPMENT.headers("commands", 0, value) if offset == 0 else None)
        return proc.take()

    assert run() == run()


def test_clients_cannot_name_clearing_or_internal_holds():
    proc = PartitionProcessor(0, N, MemoryStore())
    ann = local_users(1)[0]
    funded(proc, [ann])
    proc.handle(10, T0, b"k", transfer("c1", ("sys:clearing:USD", -5), (ann, 5)))
    proc.handle(11, T0, b"k", command("c2", "FreezeAccount", {"account_id": "sys:clearing:USD"}))
    proc.handle(12, T0, b"k", place_hold("~x~" + ann, ann, 5, None))
    outputs, changelog = proc.take()
    for command_id in ("c1", "c2", "hold:~x~" + ann):
        assert answer(outputs, command_id)["reason"] == "invalid_command", command_id
    # Each refusal is a decision, remembered (a retry gets it again), and nothing else is written.
    from schemas.codec import codec
    changes = [codec().decode("state", c) for c in changelog]
    assert [c["command_id"] for c in changes] == ["c1", "c2", "hold:~x~" + ann]
    assert not any(c["accounts"] or c["holds"] or c["records"] for c in changes)
    assert proc.state.account(ann).posted == 10_000
