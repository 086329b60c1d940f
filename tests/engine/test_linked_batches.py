"""Linked CommandBatches in the partition processor (streams/linking.py), broker-free: all or nothing in one
partition, the same answers on a retry, a refusal with the reason of what failed, and a batch that touches
another partition with more than transactions refused whole."""
from __future__ import annotations

import io
import json
import struct

import fastavro
from fastavro.schema import fingerprint, to_parsing_canonical_form

from schemas.codec import SCHEMA_DIR, codec
from streams.partition import PartitionProcessor
from streams.routing import ENGINE_CLIENT
from streams.store import MemoryStore
from tests.helpers.records import N, T0, batch, command, linked, local_users, open_account, place_hold, transfer

C = codec()
A, B, D, NEW = local_users(4)
FAR = local_users(1, partition=1)[0]


def ledger() -> tuple[PartitionProcessor, list]:
    """A partition with A holding 1,000 and B, D empty; returns it and the results so far."""
    proc = PartitionProcessor(0, N, MemoryStore())
    feed(proc, [open_account(A), open_account(B), open_account(D),
                transfer("dep", ("sys:world:USD", -1_000), (A, 1_000))])
    return proc, []


OFFSET = [0]


def feed(proc: PartitionProcessor, values: list[bytes]) -> tuple[list[dict], list[bytes], list]:
    """Hand records to the processor and commit; returns the results, the changelog and every output."""
    for value in values:
        OFFSET[0] += 1
        proc.handle(OFFSET[0], T0 + OFFSET[0], b"k", value)
    outputs, changelog = proc.take()
    proc.state.commit(OFFSET[0])
    return [C.decode("result", o.value) for o in outputs if o.topic == "results"], changelog, outputs


def answers(results: list[dict]) -> dict[str, tuple]:
    return {r["command_id"]: (r["outcome"], r["reason"], r["duplicate"]) for r in results}


def balances(proc: PartitionProcessor) -> dict[str, tuple[int, int]]:
    return {a: (proc.state.account(a).posted, proc.state.account(a).held) for a in (A, B, D)}


def test_all_accepted_a_later_command_spends_what_an_earlier_one_credited():
    proc, _ = ledger()
    results, _, outputs = feed(proc, [linked(transfer("l1", (A, -600), (B, 600)),
                                             transfer("l2", (B, -500), (D, 500)),
                                             place_hold("h", D, 300, None))])
    assert answers(results) == {"l1": ("accepted", None, False), "l2": ("accepted", None, False),
                                "hold:h": ("accepted", None, False)}
    assert balances(proc) == {A: (400, 0), B: (100, 0), D: (500, 300)}
    assert sum(o.topic == "history" for o in outputs) == 5  # two legs each, and the hold


def test_one_refused_nothing_takes_effect_and_the_others_name_it():
    proc, _ = ledger()
    before = balances(proc)
    results, changelog, outputs = feed(proc, [linked(transfer("l1", (A, -600), (B, 600)),
                                                     transfer("l2", (B, -700), (D, 700)),
                                                     open_account(NEW))])
    assert answers(results) == {"l1": ("rejected", "linked_failed", False),
                                "l2": ("rejected", "insufficient_funds", False),
                                f"open:{NEW}": ("rejected", "linked_failed", False)}
    assert all("l2, which was refused insufficient_funds" in r["detail"]
               for r in results if r["reason"] == "linked_failed")
    assert balances(proc) == before and proc.state.account(NEW) is None
    assert not any(o.topic in ("history", "balances") for o in outputs)
    assert len(changelog) == 3  # every answer remembered, nothing else

    # The same batch again: the same answers, as duplicates, and nothing written.
    again, changelog, _ = feed(proc, [linked(transfer("l1", (A, -600), (B, 600)),
                                             transfer("l2", (B, -700), (D, 700)),
                                             open_account(NEW))])
    assert answers(again) == {k: (o, r, True) for k, (o, r, _) in answers(results).items()}
    assert changelog == []


def test_a_retry_of_an_accepted_batch_is_answered_as_duplicates_with_system_legs_as_sent():
    proc, _ = ledger()
    batch_value = linked(transfer("fee", (A, -10), ("sys:fees:USD", 10)),
                         transfer("pay", (A, -90), (B, 90)))
    first, _, _ = feed(proc, [batch_value])
    again, changelog, _ = feed(proc, [batch_value])
    assert answers(first) == {"fee": ("accepted", None, False), "pay": ("accepted", None, False),
                              "open:sys:fees:USD@0": ("accepted", None, False)}  # the shard opens itself
    assert answers(again) == {"fee": ("accepted", None, True), "pay": ("accepted", None, True)}
    assert changelog == [] and balances(proc)[A] == (900, 0)


def test_an_undecodable_item_is_dead_lettered_and_the_others_refused():
    proc, _ = ledger()
    results, _, outputs = feed(proc, [linked(transfer("l1", (A, -1), (B, 1)), b"\x00poison")])
    (dead,) = [C.decode("dead_letter", o.value) for o in outputs if o.topic == "dlq"]
    assert dead["value"] == b"\x00poison" and dead["detail"].startswith("command 1 of the linked batch")
    assert answers(results) == {"l1": ("rejected", "linked_failed", False)}
    assert "command 1 of the batch" in results[0]["detail"] and balances(proc)[A] == (1_000, 0)


def test_an_engine_step_in_a_linked_batch_is_refused():
    proc, _ = ledger()
    step = command("x", "OpenAccount", {"account_id": "user:e:USD", "currency": "USD", "allow_negative": False,
                                        "overdraft_limit": "0", "max_balance": None, "routing_key": None},
                   client=ENGINE_CLIENT)
    results, _, _ = feed(proc, [linked(transfer("l1", (A, -1), (B, 1)), step)])
    assert [(r["command_id"], r["reason"]) for r in results] == [("x", "invalid_command"), ("l1", "linked_failed")]
    assert balances(proc)[A] == (1_000, 0)


def test_a_batch_that_touches_another_partition_with_more_than_transactions_is_refused_whole():
    """Across partitions only transactions are linked (streams/spanning_linked.py): an account opened there
    refuses the batch, every command, and nothing is forwarded."""
    proc, _ = ledger()
    results, changelog, outputs = feed(proc, [linked(transfer("l1", (A, -1), (B, 1)), open_account(FAR))])
    assert {r["command_id"]: r["reason"] for r in results} == {"l1": "linked_spans_partitions",
                                                                f"open:{FAR}": "linked_spans_partitions"}
    assert "only transactions are linked across partitions" in results[0]["detail"]
    assert balances(proc)[A] == (1_000, 0) and not any(o.topic == "commands" for o in outputs)


def test_transactions_touching_another_partition_begin_the_two_phase_protocol():
    """Here the batch's share is reserved (A's 2 held) and the other partition is asked to reserve its own;
    nobody is answered until every partition has voted (tests/engine/test_linked_spanning.py goes on)."""
    proc, _ = ledger()
    results, _, outputs = feed(proc, [linked(transfer("l1", (A, -1), (B, 1)), transfer("l2", (A, -1), (FAR, 1)))])
    assert not [r for r in results if r["client_id"] == "t"]
    assert balances(proc)[A] == (1_000, 2)
    (reserve,) = [C.decode("command", o.value) for o in outputs if o.topic == "commands"]
    assert (reserve["body"][0], [o.partition for o in outputs if o.topic == "commands"]) == ("ledger.ReserveLinked", [1])


def test_the_changelog_of_a_linked_batch_restores_the_same_state():
    proc, _ = ledger()
    _, changelog, _ = feed(proc, [linked(transfer("l1", (A, -600), (B, 600)), transfer("l2", (B, -5), (D, 5)))])
    restored = PartitionProcessor(0, N, MemoryStore())
    live = PartitionProcessor(0, N, MemoryStore())
    _, first, _ = feed(live, [open_account(A), open_account(B), open_account(D),
                              transfer("dep", ("sys:world:USD", -1_000), (A, 1_000))])
    restored.restore(first + changelog, len(first + changelog))
    assert {a: (restored.state.account(a).posted, restored.state.account(a).held) for a in (A, B, D)} == \
        balances(proc)


def test_a_command_batch_of_the_first_version_is_still_decided_one_by_one():
    """Records written before batches could be linked (schemas/versions/command_batch.v1.avsc)."""
    old = json.loads((SCHEMA_DIR / "versions" / "command_batch.v1.avsc").read_text())
    parsed = fastavro.parse_schema(old)
    body = io.BytesIO()
    fastavro.schemaless_writer(body, parsed, {"commands": [transfer("o1", (A, -1), (B, 1)),
                                                           transfer("o2", (B, -2), (D, 2))]})
    value = _single_object(parsed) + body.getvalue()
    assert C.is_a("command_batch", value) and not C.is_a("command", value)
    proc, _ = ledger()
    results, _, _ = feed(proc, [value])
    assert answers(results) == {"o1": ("accepted", None, False), "o2": ("rejected", "insufficient_funds", False)}


def _single_object(parsed) -> bytes:
    """The single-object encoding's header of a schema: C3 01 and its CRC-64-AVRO fingerprint, little-endian."""
    return b"\xc3\x01" + struct.pack("<Q", int(fingerprint(to_parsing_canonical_form(parsed), "CRC-64-AVRO"), 16))


def test_a_plain_batch_still_decides_item_by_item():
    proc, _ = ledger()
    results, _, _ = feed(proc, [batch(transfer("p1", (A, -600), (B, 600)), transfer("p2", (B, -700), (D, 700)))])
    assert answers(results) == {"p1": ("accepted", None, False), "p2": ("rejected", "insufficient_funds", False)}


def test_a_command_that_would_wait_for_a_transaction_in_flight_refuses_the_batch():
    """A's payment to another partition is in flight (its debit reserved here); a linked batch closing A
    cannot wait as a whole, so it is refused in_flight, and nothing of it takes effect."""
    proc, _ = ledger()
    feed(proc, [transfer("far", (A, -100), (FAR, 100))])
    close = command(f"close:{A}", "CloseAccount", {"account_id": A})
    results, _, _ = feed(proc, [linked(transfer("l1", (A, -5), (B, 5)), close)])
    assert answers(results) == {"l1": ("rejected", "linked_failed", False),
                                f"close:{A}": ("rejected", "in_flight", False)}
    assert proc.state.account(A).posted == 1_000 and proc.state.account(B).posted == 0


def test_a_command_refused_before_keeps_its_answer_in_a_linked_batch():
    """A command the engine refused on its route (a system account opened by a client), sent again inside a
    linked batch: its stored answer stands (a duplicate), and the batch fails on it."""
    proc, _ = ledger()
    system_open = open_account("sys:custody:USD")
    first, _, _ = feed(proc, [system_open])
    assert answers(first) == {"open:sys:custody:USD": ("rejected", "invalid_command", False)}
    results, _, _ = feed(proc, [linked(transfer("l1", (A, -1), (B, 1)), system_open)])
    assert answers(results) == {"open:sys:custody:USD": ("rejected", "invalid_command", True),
                                "l1": ("rejected", "linked_failed", False)}
    assert balances(proc)[A] == (1_000, 0)


def test_a_linked_batch_that_fails_part_way_is_undone_and_every_command_refused(monkeypatch):
    """The guard every record has (PartitionProcessor.guarded): a failure inside the linked decision (here one
    made on purpose in the core's call) undoes all the batch staged, shard openings included, and refuses
    each readable command invalid_command, remembered nowhere (a retry is decided afresh)."""
    from streams import linking

    proc, _ = ledger()

    def broken(*args, **kwargs):
        raise RuntimeError("made to fail")

    monkeypatch.setattr(linking.linked, "execute_linked", broken)
    results, changelog, outputs = feed(proc, [linked(transfer("g1", (A, -10), ("sys:fees:USD", 10)),
                                                     transfer("g2", (A, -1), (B, 1)))])
    assert [(r["command_id"], r["reason"]) for r in results] == [("g1", "invalid_command"),
                                                                 ("g2", "invalid_command")]
    assert all("unprocessable: RuntimeError: made to fail" in r["detail"] for r in results)
    assert changelog == [] and not any(o.topic == "history" for o in outputs)
    assert proc.state.account("sys:fees:USD@0") is None and balances(proc)[A] == (1_000, 0)
    monkeypatch.undo()
    again, _, _ = feed(proc, [linked(transfer("g1", (A, -10), ("sys:fees:USD", 10)), transfer("g2", (A, -1), (B, 1)))])
    assert [(r["command_id"], r["outcome"], r["duplicate"]) for r in again if not r["command_id"].startswith("open:")] \
        == [("g1", "accepted", False), ("g2", "accepted", False)]
