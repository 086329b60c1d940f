"""Crash on purpose at each named point of the commit path (streams/crashpoints.py), then recover.

A kill -9 loop lands in a given window of the commit path only by chance; here the worker exits hard
(os._exit, like kill -9) exactly at one point, with a backlog of opens, deposits, transfers (some across
partitions), holds, captures, releases and two-partition debits in flight. Restarted without the hook, it
must finish the work with every oracle of DESIGN.md §2 holding, plus the stricter checks of
assert_exactly_once below.
"""
from __future__ import annotations

from collections import defaultdict

import pytest

from connectors.client import LedgerClient
from connectors.loadgen import LoadGenerator, Mix
from projections.topics import read_topic
from projections.verify import format_report, verify, wait_quiescent
from streams import crashpoints

# (point, nth): late enough that the batch holds client commands and engine follow-ups (cross-partition
# credits, two-phase votes); step 5's points are reached once per partition written.
CASES = [("after_outputs", 2), ("after_changelog", 2), ("before_write", 3), ("after_write", 3),
         ("during_restore", 3)]
USERS = 40
BACKLOG = 400
AFTER = 150


def assert_exactly_once(settings, client_id: str, sent: list[str]) -> None:
    """What the oracles may let pass: one decision per command, one content per history entry, every
    account's seqs exactly 1..n with one entry each, every balance record (not only the latest) equal to
    the fold of history at its seq, and no history for a rejected command."""
    problems: list[str] = []
    commands = [c.value for c in read_topic(settings, "commands")]
    results = [r for r in read_topic(settings, "results")]
    history = [h for h in read_topic(settings, "history")]
    balances = [b.value for b in read_topic(settings, "balances")]
    assert not list(read_topic(settings, "dlq")), "no command of this traffic is a dead letter"
    assert None not in commands, "every command decodes"

    ours = [c["command_id"] for c in commands if c["client_id"] == client_id]
    assert sorted(ours) == sorted(sent), "the commands topic holds exactly what the client sent"

    decisions: dict[tuple[str, str], set[bytes]] = defaultdict(set)
    outcome: dict[tuple[str, str], str] = {}
    for r in results:
        if not r.value["duplicate"]:
            key = (r.value["client_id"], r.value["command_id"])
            decisions[key].add(r.raw)
            outcome[key] = r.value["outcome"]
    keys = {(c["client_id"], c["command_id"]) for c in commands}
    for key in sorted(keys):
        if len(decisions.get(key, ())) != 1:
            problems.append(f"{key} has {len(decisions.get(key, ()))} distinct non-duplicate decisions")
    # (The engine decides some commands of its own inside a partition, with no record on the commands
    # topic: system shard opens, two-phase steps. Those are checked with everything else below.)
    for key in set(decisions) - keys:
        if key[0] == client_id:
            problems.append(f"decision for {key}, which is not on the commands topic")

    contents: dict[str, set[bytes]] = defaultdict(set)
    entries: dict[str, dict] = {}
    for h in history:
        contents[h.value["entry_id"]].add(h.raw)
        entries[h.value["entry_id"]] = h.value
    problems += [f"history entry {e} has {len(c)} contents" for e, c in contents.items() if len(c) != 1]
    by_account: dict[str, dict[int, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for v in entries.values():
        by_account[v["account_id"]][v["seq"]].append(v)
        if outcome.get((v["client_id"], v["command_id"])) == "rejected":
            problems.append(f"history entry {v['entry_id']} of rejected command {v['command_id']}")
    fold: dict[tuple[str, int], tuple[int, int]] = {}
    for account, seqs in by_account.items():
        if sorted(seqs) != list(range(1, len(seqs) + 1)):
            problems.append(f"{account}: seqs {sorted(seqs)[:10]} are not 1..{len(seqs)}")
        posted = 0
        for seq in sorted(seqs):
            if len(seqs[seq]) != 1:
                problems.append(f"{account}#{seq} has {len(seqs[seq])} entries")
            v = seqs[seq][0]
            posted += int(v["amount"])
            if posted != int(v["posted_after"]):
                problems.append(f"{account}#{seq}: posted_after {v['posted_after']} != fold {posted}")
            fold[(account, seq)] = (posted, int(v["held_after"]))
    for b in balances:
        at = fold.get((b["account_id"], b["seq"]))
        if at != (int(b["posted"]), int(b["held"])):
            problems.append(f"balance {b['account_id']}#{b['seq']} {b['posted']}/{b['held']} != history {at}")
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems[:30])


@pytest.mark.parametrize("point,nth", CASES, ids=[p for p, _ in CASES])
def test_worker_killed_at_a_crash_point_recovers_exactly_once(settings, start_worker, point, nth):
    assert point in crashpoints.POINTS
    restore = point == "during_restore"
    hook = {} if restore else {"LEDGER_CRASH_AT": f"{point}:{nth}"}
    worker = start_worker("w1", extra_env=hook)  # ready before any command: the hook fires on this traffic
    client = LedgerClient(settings, "crash")
    gen = LoadGenerator(client, seed=17, mix=Mix(users=USERS, multi_debit=0.1, hold_cycle=0.2), run_id="c")
    sent = gen.open_accounts()
    sent += list(gen.commands(BACKLOG))
    client.flush()
    if restore:
        # Decide the backlog, then lose the local state: the next start restores every partition it gets
        # from the changelog, and the hook fires with records read but not yet applied. The commands sent
        # meanwhile make it restore (a partition is restored with its first batch).
        client.wait(sent, 120)
        worker.kill9()
        worker.wipe_state()
        sent += list(gen.commands(AFTER))
        client.flush()
        worker.extra_env["LEDGER_CRASH_AT"] = f"{point}:{nth}"
        worker.start(wait_ready=False)

    code = worker.wait_exit(120)
    log = worker.log_since_start()
    assert code == crashpoints.EXIT_CODE, f"exit code {code}:\n{worker.tail()}"
    assert f"crash point {point} reached (nth {nth})" in log, worker.tail()
    if point == "during_restore":
        line = next(line for line in log.splitlines() if line.startswith(f"crash point {point}"))
        assert " 0 changelog records" not in line, line

    del worker.extra_env["LEDGER_CRASH_AT"]
    worker.start()
    more = list(gen.commands(AFTER))
    sent += more
    client.wait(sent, 180)
    assert wait_quiescent(settings, 180), "the worker did not catch up with the commands topic"
    report = verify(settings)
    assert report.ok, format_report(report)
    assert report.counts["commands.from_clients"] == len(sent)
    assert report.counts["commands"] > report.counts["commands.from_clients"], "no engine follow-ups ran"
    assert_exactly_once(settings, "crash", sent)
    assert worker.alive and "Traceback" not in worker.log_since_start(), worker.tail()
    client.close()
