"""The partition state machine without a broker: determinism, restore, expiry, and the store contract."""
from __future__ import annotations

import pytest

from schemas.codec import codec
from streams import routing
from streams.partition import PartitionProcessor
from streams.store import MemoryStore, RocksStore
from tests.helpers.records import N, batch, command, local_users, open_account, place_hold, transfer, tx  # noqa: F401

C = codec()


def script() -> list[bytes]:
    a, b, c = local_users(3)
    remote = next(f"user:{i}:USD" for i in range(100) if routing.partition_of_account(f"user:{i}:USD", N) != 0)
    return [
        open_account(a), open_account(b), open_account(c),
        transfer("dep", ("sys:world:USD", -1_000), (a, 1_000)),
        transfer("t1", (a, -100), (b, 100)),
        transfer("t1", (a, -100), (b, 100)),  # duplicate
        transfer("t1", (a, -999), (b, 999)),  # conflict
        place_hold("h1", a, 300, 1_700_000_000_100),
        transfer("cap", (a, -50), (c, 50), hold="h1"),
        transfer("far", (a, -10), (remote, 10)),
        b"\x00poison",
        transfer("over", (b, -10_000), (c, 10_000)),
        transfer("later", (b, -1), (c, 1)),  # its time passes h1's expiry: h1 expires first
    ]


def run(proc: PartitionProcessor, records: list[bytes], start_ms: int = 1_700_000_000_000):
    for offset, value in enumerate(records):
        proc.handle(offset, start_ms + offset * 10, b"k", value)
    return proc.take()


def test_the_same_log_gives_byte_identical_outputs_and_changelog():
    first = run(PartitionProcessor(0, N, MemoryStore()), script())
    second = run(PartitionProcessor(0, N, MemoryStore()), script())
    assert first == second
    outputs, changelog = first
    results = [C.decode("result", o.value) for o in outputs if o.topic == "results"]
    by_id = {}
    for r in results:
        by_id.setdefault(r["command_id"], []).append(r)
    assert [(r["outcome"], r["duplicate"], r["reason"]) for r in by_id["t1"]] == [
        ("accepted", False, None), ("accepted", True, None), ("rejected", False, "id_conflict")]
    assert by_id["over"][0]["reason"] == "insufficient_funds"
    assert by_id["expire:h1"][0]["outcome"] == "accepted"  # expired by log time, before "later"
    assert [o.topic for o in outputs].count("dlq") == 1
    assert any(o.topic == "commands" for o in outputs), "the remote credit left as a follow-up command"


def test_restore_from_the_changelog_rebuilds_the_same_state():
    live_store = MemoryStore()
    live = PartitionProcessor(0, N, live_store)
    _, changelog = run(live, script())
    live.state.commit(len(changelog))
    fresh_store = MemoryStore()
    restored = PartitionProcessor(0, N, fresh_store)
    assert restored.restore(changelog, len(changelog)) == len(changelog)
    assert fresh_store.data == live_store.data
    # A record delivered again (a paused worker writing late) is skipped, not applied twice.
    assert restored.restore(changelog, 2 * len(changelog)) == 0
    a = local_users(1)[0]
    assert restored.state.account(a).posted == 1_000 - 100 - 50 - 10


def test_a_command_redone_after_restore_is_answered_from_the_inbox():
    live = PartitionProcessor(0, N, MemoryStore())
    outputs, changelog = run(live, script()[:5])
    restored = PartitionProcessor(0, N, MemoryStore())
    restored.restore(changelog, len(changelog))
    redo, redo_changelog = run(restored, script()[4:5])
    assert redo_changelog == []
    (result,) = [C.decode("result", o.value) for o in redo if o.topic == "results"]
    original = next(C.decode("result", o.value) for o in outputs
                    if o.topic == "results" and C.decode("result", o.value)["command_id"] == "t1")
    assert result == {**original, "duplicate": True}


def test_a_batch_is_decided_exactly_as_its_commands_sent_one_by_one():
    """A CommandBatch record yields the same results, history and balances as its commands in records of
    their own with the same time; a poison item is dead-lettered alone with its own bytes."""
    at = 1_700_000_000_000
    one_by_one = PartitionProcessor(0, N, MemoryStore())
    for offset, value in enumerate(script()):
        one_by_one.handle(offset, at, b"k", value)
    singles, single_changelog = one_by_one.take()
    batched = PartitionProcessor(0, N, MemoryStore())
    batched.handle(0, at, b"k", batch(*script()))
    outputs, changelog = batched.take()
    assert [o for o in outputs if o.topic != "dlq"] == [o for o in singles if o.topic != "dlq"]
    def redo(records):  # the changelog minus where each command sat in the log
        return [{k: v for k, v in C.decode("state", r).items() if k != "source_offset"} for r in records]
    assert redo(changelog) == redo(single_changelog) and len(changelog) > 5
    (dead,) = [o for o in outputs if o.topic == "dlq"]
    letter = C.decode("dead_letter", dead.value)
    index = script().index(b"\x00poison")
    assert dead.key == f"0/0/{index}".encode()
    assert letter["value"] == b"\x00poison" and letter["reason"] == "not_avro"
    assert letter["detail"].startswith(f"command {index} of the batch")


def test_an_undecodable_batch_is_one_dead_letter_and_changes_nothing():
    proc = PartitionProcessor(0, N, MemoryStore())
    broken = batch(*script())[:-7]
    proc.handle(5, 1_700_000_000_000, b"k", broken)
    outputs, changelog = proc.take()
    assert changelog == [] and [o.topic for o in outputs] == ["dlq"]
    letter = C.decode("dead_letter", outputs[0].value)
    assert (letter["reason"], letter["offset"], letter["value"]) == ("corrupt", 5, broken)
    assert outputs[0].key == b"0/5"


def test_an_empty_batch_is_a_dead_letter():
    proc = PartitionProcessor(0, N, MemoryStore())
    proc.handle(3, 1_700_000_000_000, b"k", batch())
    outputs, changelog = proc.take()
    assert changelog == [] and [(o.topic, C.decode("dead_letter", o.value)["reason"]) for o in outputs] == [
        ("dlq", "empty")]


def test_retries_of_an_in_flight_transaction_in_one_batch_get_distinct_ids():
    a = local_users(1, partition=0)[0]
    b = local_users(1, partition=1)[0]
    proc = PartitionProcessor(0, N, MemoryStore())
    tx = transfer("multi", (a, -5), (b, -5), ("sys:world:USD", 10))
    proc.handle(0, 1_700_000_000_000, b"k", batch(tx, tx, tx))
    outputs, changelog = proc.take()
    ids = [C.decode("state", c)["command_id"] for c in changelog]
    assert len(ids) == len(set(ids)) == 3, ids
    assert [i.rsplit("~", 1)[-1] for i in ids[1:]] == ["0.1", "0.2"]


def test_two_clients_may_use_the_same_command_id():
    """The inbox key is (client_id, command_id) (P4): the same id from two clients is two commands, each
    decided and answered under its own key, whether the payloads are equal or not; a retry of each is a duplicate."""
    a, b, c = local_users(3)
    same = lambda client: tx("pay", [(a, -100, None, None), (b, 100, None, None)], "transfer", client)
    other = tx("pay", [(a, -30, None, None), (c, 30, None, None)], "transfer", "carol")
    proc = PartitionProcessor(0, N, MemoryStore())
    records = [open_account(a), open_account(b), open_account(c),
               transfer("dep", ("sys:world:USD", -1_000), (a, 1_000)),
               same("alice"), same("bob"), other, same("alice"), other]
    outputs, changelog = run(proc, records)
    results = [(o.key, C.decode("result", o.value)) for o in outputs if o.topic == "results"]
    pay = [(key, r["client_id"], r["outcome"], r["duplicate"]) for key, r in results if r["command_id"] == "pay"]
    assert pay == [
        (b"alice/pay", "alice", "accepted", False),
        (b"bob/pay", "bob", "accepted", False),
        (b"carol/pay", "carol", "accepted", False),
        (b"alice/pay", "alice", "accepted", True),
        (b"carol/pay", "carol", "accepted", True),
    ]
    assert [proc.state.account(x).posted for x in (a, b, c)] == [1_000 - 100 - 100 - 30, 200, 30]
    decided = [(r["client_id"], r["command_id"]) for r in (C.decode("state", x) for x in changelog)]
    assert [k for k in decided if k[1] == "pay"] == [("alice", "pay"), ("bob", "pay"), ("carol", "pay")]


@pytest.fixture(params=["memory", "rocksdb"])
def store(request, tmp_path):
    s = MemoryStore() if request.param == "memory" else RocksStore(tmp_path / "db")
    yield s
    s.close()


def test_store_contract(store):
    assert store.get(b"a") is None
    store.write({b"a/1": b"x", b"a/2": b"y", b"b/1": b"z"}, set())
    assert store.get(b"a/1") == b"x"
    assert list(store.scan(b"a/")) == [(b"a/1", b"x"), (b"a/2", b"y")]
    store.write({b"a/3": b"w"}, {b"a/1", b"missing"})
    assert list(store.scan(b"a/")) == [(b"a/2", b"y"), (b"a/3", b"w")]
    assert list(store.scan(b"c/")) == []


def test_rocksdb_state_survives_reopening(tmp_path):
    store = RocksStore(tmp_path / "p0")
    proc = PartitionProcessor(0, N, store)
    _, changelog = run(proc, script())
    proc.state.commit(len(changelog))
    before = dict(store.scan(b""))
    store.close()
    reopened = RocksStore(tmp_path / "p0")
    assert dict(reopened.scan(b"")) == before
    assert PartitionProcessor(0, N, reopened).state.changelog_offset() == len(changelog)
    reopened.close()
