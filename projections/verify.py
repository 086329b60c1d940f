"""The oracles of DESIGN.md §2, checked over the topics at a quiescent point (`ledger verify`).

Every check reads only what the ledger published (commands, results, history, balances, dead letters),
never the workers' state, so it can judge any run: a test, a fault-injection soak or production.
Re-emitted records (a command redone after a crash) are recognised by their ids and must be byte-identical.
"""
from __future__ import annotations

from collections import Counter, defaultdict
import time
from dataclasses import dataclass, field

from confluent_kafka import Consumer, TopicPartition

from projections.topics import TopicRecord, latest_per_account, read_topic
from streams import routing
from streams.config import Settings

ENGINE_CLIENT = "ledger"


@dataclass
class Report:
    counts: Counter = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    sums: dict[str, int] = field(default_factory=dict)  # currency -> sum of posted over all accounts

    @property
    def ok(self) -> bool:
        return not self.violations

    def fail(self, oracle: str, message: str) -> None:
        self.counts[f"violations.{oracle}"] += 1
        if len(self.violations) < 200:
            self.violations.append(f"{oracle}: {message}")


def _body(record: TopicRecord) -> tuple[str, dict]:
    name, body = record.value["body"]
    return name.rsplit(".", 1)[-1], body


def wait_quiescent(settings: Settings, timeout_s: float = 120.0, settle_s: float = 1.5) -> bool:
    """Wait until the workers have committed every command, follow-ups included, and nothing moves.

    Quiescent = the worker group's committed offset equals the end of every commands partition, twice in
    a row settle_s apart (a follow-up command produced meanwhile moves an end and restarts the wait).
    """
    group = f"{settings.prefix}workers"
    consumer = Consumer({**settings.kafka_config(), "group.id": group, "enable.auto.commit": False})
    topic = settings.topic("commands")
    partitions = [TopicPartition(topic, p) for p in range(settings.partitions)]
    deadline = time.monotonic() + timeout_s
    previous = None
    try:
        while time.monotonic() < deadline:
            ends = [consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in partitions]
            committed = [max(tp.offset, 0) for tp in consumer.committed(partitions, timeout=10)]
            state = (ends, committed)
            if ends == committed and state == previous:
                return True
            previous = state if ends == committed else None
            time.sleep(settle_s)
        return False
    finally:
        consumer.close()


def verify(settings: Settings) -> Report:
    report = Report()
    commands = list(read_topic(settings, "commands"))
    results = list(read_topic(settings, "results"))
    history = list(read_topic(settings, "history"))
    balances = list(read_topic(settings, "balances"))
    dead = list(read_topic(settings, "dlq"))
    c = report.counts
    c.update(commands=len(commands), results=len(results), history=len(history), balances=len(balances),
             dead_letters=len(dead))

    # P8: every command answered: a result for its id, or a dead letter for its place in the log
    # (keyed partition/offset, plus /index for an item of a CommandBatch).
    dead_at = {d.key for d in dead}
    answered = {(r.value["client_id"], r.value["command_id"]) for r in results}
    sent: dict[tuple[str, str], list[TopicRecord]] = defaultdict(list)
    for cmd in commands:
        if cmd.value is None:
            c["commands.undecodable"] += 1
            where = f"{cmd.partition}/{cmd.offset}" + ("" if cmd.index is None else f"/{cmd.index}")
            if where.encode() not in dead_at:
                report.fail("P8", f"undecodable command at {where} has no dead letter")
            continue
        key = (cmd.value["client_id"], cmd.value["command_id"])
        sent[key].append(cmd)
        if key[0] != ENGINE_CLIENT:
            c["commands.from_clients"] += 1
        if key not in answered:
            report.fail("P8", f"command {key} has no result")

    # P4: one decision per command id; re-emissions identical.
    decisions: dict[tuple[str, str], set[bytes]] = defaultdict(set)
    outcome: dict[tuple[str, str], str] = {}
    for r in results:
        v = r.value
        if not v["duplicate"] and v["reason"] != "id_conflict":
            decisions[(v["client_id"], v["command_id"])].add(r.raw)
            outcome[(v["client_id"], v["command_id"])] = v["outcome"]
    for key, values in decisions.items():
        if len(values) > 1:
            report.fail("P4", f"command {key} got {len(values)} different decisions")
    accepted = {k for k, vals in decisions.items() if len(vals) == 1 and outcome[k] == "accepted"}

    # History deduplicated by entry id; a re-emission must be byte-identical.
    entries: dict[str, TopicRecord] = {}
    for h in history:
        entry_id = h.value["entry_id"]
        seen = entries.get(entry_id)
        if seen is None:
            entries[entry_id] = h
        elif seen.raw != h.raw:
            report.fail("P4", f"history entry {entry_id} published with two different contents")
    c["history.distinct"] = len(entries)

    # P4: an accepted command changed the books exactly once (one entry per leg, one per other change).
    per_command = Counter((e.value["client_id"], e.value["command_id"]) for e in entries.values())
    spanning = {k[1].rsplit("~", 1)[0] for k in answered if k[0] == ENGINE_CLIENT and k[1].endswith("~begin")}
    for key, cmds in sent.items():
        if key not in accepted or key[0] == ENGINE_CLIENT:
            continue
        kind, body = _body(cmds[0])
        expected = len(body["legs"]) if kind == "PostTransaction" else 1
        if f"{key[0]}/{key[1]}" in spanning:
            # Debits posted in their partitions (under ~commit~ ids); here: credits and one funding leg per currency.
            credits = [leg for leg in body["legs"] if not leg["amount"].startswith("-")]
            expected = len(credits) + len({leg["currency"] or leg["account_id"].rsplit(":", 1)[-1] for leg in credits})
        if per_command[key] != expected:
            report.fail("P4", f"command {key} has {per_command[key]} history entries, expected {expected}")

    # P3: per-account seq gapless and increasing; balances equal the fold of history.
    by_account: dict[str, list[dict]] = defaultdict(list)
    for e in entries.values():
        by_account[e.value["account_id"]].append(e.value)
    policies = _policies(sent)
    folded: dict[str, tuple[int, int, int, str]] = {}  # account -> (posted, held, seq, currency)
    for account, items in by_account.items():
        items.sort(key=lambda v: v["seq"])
        seqs = [v["seq"] for v in items]
        if seqs != list(range(1, len(seqs) + 1)):
            report.fail("P3", f"{account} seqs are not 1..n: {_gaps(seqs)}")
        posted = 0
        for v in items:
            posted += int(v["amount"])
            if posted != int(v["posted_after"]):
                report.fail("P3", f"{account}#{v['seq']} posted_after {v['posted_after']} != fold {posted}")
            floor = policies.get(account)
            if floor is not None and posted - int(v["held_after"]) < floor:
                report.fail("P2", f"{account}#{v['seq']} available {posted - int(v['held_after'])} below {floor}")
        folded[account] = (posted, int(items[-1]["held_after"]), seqs[-1], items[-1]["currency"])

    latest = {account: r.value for account, r in latest_per_account(balances).items()}
    c["accounts"] = len(latest)
    for account, v in latest.items():
        fold = folded.get(account)
        if fold is None or (int(v["posted"]), int(v["held"]), v["seq"]) != fold[:3]:
            report.fail("fold", f"balance of {account} {v['posted']}/{v['held']}#{v['seq']} != history {fold}")

    # P1: every transaction balanced per currency; every currency sums to zero.
    tx_sums: dict[tuple[str, str, str], int] = defaultdict(int)
    for e in entries.values():
        v = e.value
        if v["transaction_id"] is not None:
            tx_sums[(v["client_id"], v["transaction_id"], v["currency"])] += int(v["amount"])
    c["transactions"] = len({(client, t) for client, t, _ in tx_sums})
    for (_, tx, currency), total in tx_sums.items():
        if total:
            report.fail("P1", f"transaction {tx} sums to {total} in {currency}")
    sums: dict[str, int] = defaultdict(int)
    clearing: dict[str, int] = defaultdict(int)
    for account, (posted, _, _, currency) in folded.items():
        sums[currency] += posted
        if routing.unsharded(account).startswith("sys:clearing:"):
            clearing[currency] += posted
    report.sums = dict(sums)
    for currency, total in sums.items():
        if total:
            report.fail("P1", f"{currency} sums to {total} over all accounts")
    # P6: nothing stays in clearing once quiescent.
    for currency, total in clearing.items():
        if total:
            report.fail("P6", f"{total} {currency} still in clearing")

    # P5: each hold ends once with captured + released == amount; held equals the open remainders.
    holds: dict[str, dict] = {}
    for r in results:
        if r.value["duplicate"]:
            continue
        for h in r.value["holds"]:
            prev = holds.get(h["hold_id"])
            if prev is None or int(h["captured"]) + int(h["released"]) >= int(prev["captured"]) + int(prev["released"]):
                holds[h["hold_id"]] = h
    c["holds"] = len(holds)
    open_remaining: dict[str, int] = defaultdict(int)
    for hold_id, h in holds.items():
        amount, done = int(h["amount"]), int(h["captured"]) + int(h["released"])
        if h["status"] == "open":
            open_remaining[h["account_id"]] += amount - done
            if done >= amount:
                report.fail("P5", f"hold {hold_id} is open with nothing remaining")
        elif done != amount:
            report.fail("P5", f"hold {hold_id} ended {h['status']} with captured+released {done} != {amount}")
    for account, (_, held, _, _) in folded.items():
        if held != open_remaining.get(account, 0):
            report.fail("P5", f"{account} holds {held} but its open holds total {open_remaining.get(account, 0)}")
    return report


def _policies(sent: dict[tuple[str, str], list[TopicRecord]]) -> dict[str, int]:
    """Floor of available per account opened with allow_negative false (system shards have none)."""
    floors = {}
    for cmds in sent.values():
        kind, body = _body(cmds[0])
        if kind == "OpenAccount" and not body["allow_negative"]:
            floors.setdefault(body["account_id"], -int(body["overdraft_limit"]))
    return floors


def _gaps(seqs: list[int]) -> str:
    return str(seqs[:10]) + ("..." if len(seqs) > 10 else "")


def format_report(report: Report) -> str:
    lines = [f"{'OK' if report.ok else 'VIOLATIONS'}"]
    lines += [f"  {k:28} {v}" for k, v in sorted(report.counts.items())]
    lines += [f"  sum {cur:24} {total}" for cur, total in sorted(report.sums.items())]
    lines += [f"  ! {v}" for v in report.violations]
    return "\n".join(lines)
