"""The strictest check of a run's output, for fault runs (kill -9 loops, soaks, broker restarts): what the
oracles of projections/verify.py may let pass must not happen either. Raises AssertionError listing the first
problems.
"""
from __future__ import annotations

from collections import defaultdict

from projections.fold import walk
from projections.topics import read_topic


def assert_exactly_once(settings, client_id: str, sent: list[str]) -> None:
    """What the oracles may let pass, as a read_committed reader (read_topic) sees the topics: exactly one
    non-duplicate result per command (not even a byte-identical copy), exactly one history entry per
    account#seq, every account's seqs exactly 1..n, every balance record (not only the latest) equal to the
    fold of history at its seq, and no history for a rejected command."""
    problems: list[str] = []
    commands = [c.value for c in read_topic(settings, "commands")]
    results = [r for r in read_topic(settings, "results")]
    history = [h for h in read_topic(settings, "history")]
    balances = [b.value for b in read_topic(settings, "balances")]
    assert not list(read_topic(settings, "dlq")), "no command of this traffic is a dead letter"
    assert None not in commands, "every command decodes"

    # As a set: a command sent to a partition that owns none of its debits is forwarded, unchanged.
    ours = {c["command_id"] for c in commands if c["client_id"] == client_id}
    assert ours == set(sent), f"the commands topic differs from what the client sent: {sorted(ours ^ set(sent))[:10]}"

    decisions: dict[tuple[str, str], list[bytes]] = defaultdict(list)
    outcome: dict[tuple[str, str], str] = {}
    for r in results:
        if not r.value["duplicate"]:
            key = (r.value["client_id"], r.value["command_id"])
            decisions[key].append(r.raw)
            outcome[key] = r.value["outcome"]
    keys = {(c["client_id"], c["command_id"]) for c in commands}
    for key in sorted(keys):
        if len(decisions.get(key, ())) != 1:
            problems.append(f"{key} has {len(decisions.get(key, ()))} non-duplicate results "
                            f"({len(set(decisions.get(key, ())))} distinct)")
    # (The engine decides some commands of its own inside a partition, with no record on the commands
    # topic: system shard opens, two-phase steps. Those are checked with everything else below.)
    for key in set(decisions) - keys:
        if key[0] == client_id:
            problems.append(f"decision for {key}, which is not on the commands topic")

    contents: dict[str, list[bytes]] = defaultdict(list)
    entries: dict[str, dict] = {}
    for h in history:
        contents[h.value["entry_id"]].append(h.raw)
        entries[h.value["entry_id"]] = h.value
    problems += [f"history entry {e} published {len(c)} times ({len(set(c))} contents)"
                 for e, c in contents.items() if len(c) != 1]
    copies = defaultdict(int)
    for h in history:
        copies[(h.value["account_id"], h.value["seq"])] += 1
    problems += [f"{a}#{seq} published {n} times" for (a, seq), n in copies.items() if n != 1]
    by_account: dict[str, dict[int, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for v in entries.values():
        by_account[v["account_id"]][v["seq"]].append(v)
        if outcome.get((v["client_id"], v["command_id"])) == "rejected":
            problems.append(f"history entry {v['entry_id']} of rejected command {v['command_id']}")
    fold: dict[tuple[str, int], tuple[int, int]] = {}
    for account, seqs in by_account.items():
        if sorted(seqs) != list(range(1, len(seqs) + 1)):
            problems.append(f"{account}: seqs {sorted(seqs)[:10]} are not 1..{len(seqs)}")
        problems += [f"{account}#{seq} has {len(seqs[seq])} entries" for seq in sorted(seqs) if len(seqs[seq]) != 1]
        for v, balance in walk(seqs[seq][0] for seq in sorted(seqs)):  # the read side's one fold
            if balance.posted != int(v["posted_after"]):
                problems.append(f"{account}#{v['seq']}: posted_after {v['posted_after']} != fold {balance.posted}")
            fold[(account, v["seq"])] = (balance.posted, balance.held)
    for b in balances:
        at = fold.get((b["account_id"], b["seq"]))
        if at != (int(b["posted"]), int(b["held"])):
            problems.append(f"balance {b['account_id']}#{b['seq']} {b['posted']}/{b['held']} != history {at}")
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems[:30])
