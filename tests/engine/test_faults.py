"""Fault injection against the real broker: duplicates, poison, kill -9, two workers, a paused zombie.

After each, the oracles of DESIGN.md §2 (projections.verify) must hold over everything published.
"""
from __future__ import annotations

import re
import time

import pytest
from confluent_kafka import Producer

from connectors.client import LedgerClient, Leg
from connectors.loadgen import LoadGenerator, Mix, pump
from projections.topics import read_topic
from schemas.codec import codec
from streams import routing
from tests.harness import assert_books_ok, assert_exactly_once, changelog_ends


# The kill -9 loops: `make test` runs one short loop, `make test-long` (marker `long`) the two long ones, like
# `make soak`'s 30 kills. docs/testing.md, "What make test runs".


def test_duplicates_and_conflicts_across_a_restart(settings, start_worker):
    worker = start_worker()
    client = LedgerClient(settings, "dup")
    client.wait([client.open_account("user:eve:USD", "USD")])
    deposit = [Leg("sys:world:USD", -1_000), Leg("user:eve:USD", 1_000)]
    for _ in range(3):
        client.post("dep-1", deposit, kind="deposit")
    latest = client.result("dep-1")  # the answer to the third send: the decision again, flagged
    assert latest["outcome"] == "accepted" and latest["duplicate"]
    worker.stop()
    worker.start()
    client.post("dep-1", deposit, kind="deposit")  # a retry after the restart
    client.post("dep-1", [Leg("sys:world:USD", -9_999), Leg("user:eve:USD", 9_999)], kind="deposit")  # conflict
    client.flush()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        answers = [r.value for r in read_topic(settings, "results") if r.value["command_id"] == "dep-1"]
        if len(answers) >= 5:
            break
        time.sleep(0.2)
    # The id_conflict answer has a key of its own (partition.result_key), so it may sit in another partition of
    # the results topic, read before or after the others: only the answers under the command's key are ordered.
    ordered = [a for a in answers if a["reason"] != "id_conflict"]
    assert [(a["outcome"], a["duplicate"], a["reason"]) for a in ordered] == [
        ("accepted", False, None), ("accepted", True, None), ("accepted", True, None), ("accepted", True, None)]
    assert [(a["outcome"], a["duplicate"]) for a in answers if a["reason"] == "id_conflict"] == [("rejected", False)]
    # A duplicate answer is the original one, flagged.
    assert {**ordered[1], "duplicate": False} == ordered[0]
    report = assert_books_ok(settings)
    eve = [r.value for r in read_topic(settings, "history") if r.value["account_id"] == "user:eve:USD"]
    assert [h["amount"] for h in eve] == ["0", "1000"], "the deposit took effect more than once"
    assert report.counts["dead_letters"] == 0
    client.close()


def test_poison_and_invalid_commands_do_not_stop_the_partition(settings, start_worker):
    worker = start_worker()
    client = LedgerClient(settings, "poison")
    c = codec()
    client.wait([client.open_account("user:fred:USD", "USD")])
    key = "user:fred:USD"
    wrong_schema = c.encode("balance", {"account_id": "x", "currency": "USD", "status": "open", "posted": "1",
                                        "held": "0", "available": "1", "seq": 1, "last_transaction_id": None,
                                        "updated_at_ms": 0})
    good = c.encode("command", {"command_id": "ok-1", "client_id": "poison", "body": ("ledger.PostTransaction", {
        "transaction_id": "ok-1", "legs": [{"account_id": "sys:world:USD", "amount": "-5", "hold_id": None,
                                            "currency": None},
                                           {"account_id": key, "amount": "5", "hold_id": None, "currency": None}],
        "kind": "deposit", "reference": None, "links": [], "metadata": {}, "occurred_at_ms": None,
        "rate_snapshot_id": None})})
    poison = [b"not avro at all", b"\xc3\x01" + b"\xff" * 8 + b"junk", good[:-4], good + b"\x00\x01", wrong_schema]
    for value in poison:
        client.send_raw(value, key)
    # Decodable but invalid: amounts that are not integers of minor units.
    for command_id, amount in [("bad-1", "-x"), ("bad-2", "1.5"), ("bad-3", "")]:
        client.send_raw(c.encode("command", {"command_id": command_id, "client_id": "poison", "body": (
            "ledger.PlaceHold", {"hold_id": command_id, "account_id": key, "amount": amount,
                                 "expires_at_ms": None})}), key)
    client.send_raw(good, key)
    # An empty value (a tombstone) must be a dead letter too.
    tombstone = Producer(settings.kafka_config())
    tombstone.produce(settings.topic("commands"), None, key.encode(), partition=routing.partition_for_key("user:fred", 8))
    tombstone.flush(10)
    results = client.wait(["ok-1", "bad-1", "bad-2", "bad-3"])
    assert results["ok-1"]["outcome"] == "accepted"
    assert [results[f"bad-{i}"]["reason"] for i in (1, 2, 3)] == ["invalid_amount"] * 3
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        dead = [r.value for r in read_topic(settings, "dlq")]
        if len(dead) >= 6:
            break
        time.sleep(0.2)
    reasons = sorted(d["reason"] for d in dead)
    assert reasons == sorted(["not_avro", "unknown_schema", "corrupt", "corrupt", "wrong_schema", "empty"])
    assert {bytes(d["value"]) for d in dead if d["value"]} >= set(poison), "dead letters keep the original bytes"
    assert_books_ok(settings)
    assert worker.alive and not worker.crashed(), worker.tail()
    client.close()


def _kill_loop(settings, start_worker, tmp_path, kills: int, fresh_every: int, batch_window_s: float = 0.0,
               **worker_options):
    worker = start_worker(**worker_options)
    client = LedgerClient(settings, "soak")
    gen = LoadGenerator(client, seed=11, mix=Mix(users=60), run_id="k")
    opened = gen.open_accounts()
    client.wait(opened, 60)
    sent: list[str] = []
    thread = pump(client, gen, count=kills * 300, per_second=400, sent=sent, batch_window_s=batch_window_s)
    for i in range(kills):
        time.sleep(0.6 + (i % 3) * 0.35)
        worker.kill9()
        if fresh_every and i % fresh_every == fresh_every - 1:
            import shutil
            shutil.rmtree(worker.data_dir / "p0", ignore_errors=True)  # lose local state: restore from changelog
            for p in worker.data_dir.glob("p*"):
                shutil.rmtree(p, ignore_errors=True)
        worker.start()
    thread.join(120)
    client.wait(sent, 180)
    report = assert_books_ok(settings)
    # Every command sent is on the log (a multi-partition one once per partition it debits: placed copies).
    assert report.counts["commands.distinct_from_clients"] == len(set(sent) | set(opened))
    assert_exactly_once(settings, "soak", opened + sent)  # as a read_committed reader sees it
    client.close()
    return report


def test_kill_minus_nine_twice_mid_stream_of_command_batches_committed_in_parts(settings, start_worker, tmp_path):
    """The short loop of `make test`, one kill -9 of each kind: with the local state kept, then with it wiped
    (restore from the changelog). Commands arrive in CommandBatch records and the worker commits every 40
    outputs, so the kills can land between the partial commits of one batch of records."""
    report = _kill_loop(settings, start_worker, tmp_path, kills=2, fresh_every=2, batch_window_s=0.05,
                        extra_env={"LEDGER_OUTPUTS_PER_COMMIT": "40"})
    assert report.counts["transactions"] > 100


@pytest.mark.long
def test_kill_minus_nine_repeatedly_mid_stream(settings, start_worker, tmp_path):
    report = _kill_loop(settings, start_worker, tmp_path, kills=10, fresh_every=4)
    assert report.counts["transactions"] > 100


@pytest.mark.long
def test_kill_minus_nine_mid_stream_of_command_batches_committed_in_parts(settings, start_worker, tmp_path):
    """Commands arrive in CommandBatch records and the worker commits every 40 outputs, so kills land
    between the partial commits of one batch of records (and inside a record's commands)."""
    report = _kill_loop(settings, start_worker, tmp_path, kills=6, fresh_every=3, batch_window_s=0.05,
                        extra_env={"LEDGER_OUTPUTS_PER_COMMIT": "40"})
    assert report.counts["transactions"] > 100


def test_two_workers_share_partitions_with_cross_partition_transfers(settings, start_worker):
    w1 = start_worker("w1")
    w2 = start_worker("w2")
    client = LedgerClient(settings, "pair")
    gen = LoadGenerator(client, seed=5, mix=Mix(users=80), run_id="p")
    opened = gen.open_accounts()
    client.wait(opened, 60)
    ids = list(gen.commands(1500))
    results = client.wait(ids, 120)
    multi = [r["outcome"] for i, r in results.items() if "-multi-" in i]
    assert "accepted" in multi and "rejected" in multi, "debits in two partitions: some must commit, some fail"
    for w in (w1, w2):
        assert w.alive and not w.crashed(), w.tail()

    # Shared: w2 decided commands in some partitions, not all; every partition's changelog has records, so
    # w1 wrote the others.
    mark = w1.log_size()
    w2.stop()  # leaves the group: w1 takes over w2's partitions
    ends = changelog_ends(settings)
    assert all(ends.values()), f"every partition decided something: {ends}"
    decided_by_w2 = {p for p, offset in w2.stored_changelog_offsets().items() if offset > 0}
    assert decided_by_w2 and decided_by_w2 != set(ends), f"w2 decided in {sorted(decided_by_w2)} of {ends}"

    # Moved: commands to w2's partitions now go to w1, which first restores them from the changelog w2 wrote.
    more = list(gen.commands(300))
    client.wait(more, 120)
    took_over = {p for p, read in w1.restores(since=mark) if read > 0}
    assert decided_by_w2 & took_over, f"w1 restored {w1.restores(since=mark)} after w2 left; w2 had {decided_by_w2}"
    report = assert_books_ok(settings)
    assert report.counts["commands"] > report.counts["commands.from_clients"], "no cross-partition credits ran"
    assert_exactly_once(settings, "pair", opened + ids + more)
    assert w1.alive and not w1.crashed(), w1.tail()
    client.close()


def test_a_paused_worker_that_wakes_up_after_losing_its_partitions_does_no_harm(settings, start_worker):
    """The zombie stops itself (SIGSTOP) holding a batch whose outputs are sent into open transactions and
    whose changelog is not written yet. Its session expires, the survivor takes its partitions: initialising
    their transactional ids fences the zombie and aborts its transactions; it redoes the batch and writes their
    changelog. Woken up, the zombie's sends and commit fail fenced by the broker: it must exit without acking,
    no output of its held batch may become visible to a read_committed reader, and nothing is counted twice."""
    zombie = start_worker("zombie", session_timeout_s=6.0, extra_env={"LEDGER_PAUSE_AT": "after_outputs:30"})
    survivor = start_worker("survivor", session_timeout_s=6.0)
    client = LedgerClient(settings, "zombie")
    gen = LoadGenerator(client, seed=3, mix=Mix(users=60), run_id="z")
    opened = gen.open_accounts()
    client.wait(opened, 60)
    sent: list[str] = []
    thread = pump(client, gen, count=4500, per_second=300, sent=sent)

    line = next(l for l in zombie.wait_log("pause point after_outputs reached", 90).splitlines()
                if l.startswith("pause point after_outputs reached"))
    # "...: partitions 4,6; changelog records 4=3,6=0; stopping": a record that is answered without a
    # changelog record (a forward to another partition, say) leaves nothing for step 5 to check.
    counts = dict(item.split("=") for item in line.split("changelog records ", 1)[1].split(";", 1)[0].split(","))
    held = [int(p) for p, n in counts.items() if int(n) > 0]
    assert held, f"the held batch has no changelog records to write: {line}"
    deadline = time.monotonic() + 10
    while not zombie.stopped():
        assert time.monotonic() < deadline, "the zombie logged its pause point but is not stopped"
        time.sleep(0.05)
    survivor_mark = survivor.log_size()
    before = changelog_ends(settings)  # the zombie's changelog records of the held batch are not among them

    # The survivor gets the held partitions: its restore fences the zombie (init_transactions) and writes to
    # their changelog (the aborted record that finds the log's end), then it redoes the held batch.
    deadline = time.monotonic() + 120
    while True:
        restored = {p for p, _ in survivor.restores(since=survivor_mark)}
        ends = changelog_ends(settings)
        if set(held) <= restored and all(ends[p] > before[p] for p in held):
            break
        assert time.monotonic() < deadline, \
            f"the survivor restored {sorted(restored)}, not all of {held}: changelog ends {before} -> {ends}"
        time.sleep(0.5)

    zombie.resume()  # it wakes up in step 3 of a batch whose partitions are the survivor's now
    zombie.wait_log("pause point after_outputs: resumed", 30)
    # The fence is the broker's: the zombie's transaction for a held partition cannot commit, and the zombie
    # ends without acknowledging the batch (exit 70, streams/app.py), never writing its RocksDB for it.
    code = zombie.wait_exit(120)
    log = zombie.log_since_start()
    assert code == 70, f"the zombie exited with {code}:\n{zombie.tail()}"
    fenced = {int(p) for p in re.findall(r"partition (\d+): transaction fenced", log)}
    assert fenced & set(held), f"no fence for any of {held} in the zombie's log:\n{zombie.tail()}"
    assert "pause point" in log and "restored" not in log.split("pause point after_outputs: resumed", 1)[1]
    thread.join(120)
    client.wait(sent, 180)
    report = assert_books_ok(settings)
    assert report.counts["transactions"] > 100
    assert_exactly_once(settings, "zombie", opened + sent)
    assert survivor.alive and not survivor.crashed(), survivor.tail()
    # (The zombie itself may end: a commit path that fails after the pause exits unacked, by design.)
    client.close()
