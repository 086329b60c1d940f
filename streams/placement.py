"""Where a transaction's legs live and which partition decides it (pure: no I/O).

One home for the rule, used by the worker, the client and every producer that places commands:
- a leg on an ordinary account lives in that account's partition (routing.partition_of_account);
- the coordinator is the partition of the first debit leg on an ordinary account, or, with no such debit
  (a deposit from a system account), of the first leg on an ordinary account;
- a leg on a system account lives in the coordinator's partition (system accounts have a shard in every
  partition, so the coordinator's shard takes it);
- the participants are the partitions where the legs live. One participant: the transaction is decided
  there, in one step. Several: two phases (streams/spanning.py), every participant reserving its own legs
  (debits held, credits checked and kept open) and voting, so all legs post or none do, and the sender's
  answer is the final outcome wherever the accounts live.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from streams.routing import is_system, partition_for_key, partition_of_account, routing_key_for, unsharded

# Metadata of a transaction whose producer placed it in every partition it touches (placements() below), so
# each of them reserves at the producer's own position: per-producer order across partitions (P10).
PLACED = "ledger.placed"
PLACED_VALUE = "every-partition"
PLACED_BEFORE = "every-debit-partition"  # the same mark from producers that placed copies in debit partitions only
_TRANSACTION = "ledger.PostTransaction"  # a command record's body name for a transaction


@dataclass(frozen=True, slots=True)
class Plan:
    coordinator: int | None  # None: no leg on an ordinary account (decided wherever it is sent)
    participants: tuple[int, ...]  # sorted
    homes: tuple[int | None, ...]  # per leg: its partition (system legs: the coordinator's)

    @property
    def spans(self) -> bool:
        return len(self.participants) > 1

    def legs_in(self, partition: int) -> list[int]:
        """Indexes of the legs that live in `partition`."""
        return [i for i, home in enumerate(self.homes) if home == partition]


def plan(legs: Sequence[tuple[str, int]], home: Callable[[str], int | None]) -> Plan:
    """legs: (account id, signed amount) in the transaction's order; home: an ordinary account's partition
    (None for a system account)."""
    ordinary = [(home(account), amount) for account, amount in legs]
    coordinator = next((h for h, amount in ordinary if h is not None and amount < 0),
                       next((h for h, _ in ordinary if h is not None), None))
    homes = tuple(coordinator if h is None else h for h, _ in ordinary)
    return Plan(coordinator, tuple(sorted({h for h in homes if h is not None})), homes)


def account_in(legs: Sequence[tuple[str, int]], partition: int, home: Callable[[str], int | None]) -> str:
    """An ordinary account of the transaction that lives in `partition`, debits first: the routing key of a
    command sent there (every key is in the partition its hash names). A partition none of them lives in
    (only a step that names a wrong coordinator): the first leg's account."""
    there = [(account, amount) for account, amount in legs if home(account) == partition]
    return min(there, key=lambda leg: leg[1] >= 0)[0] if there else legs[0][0]


def wire_legs(body: dict) -> list[tuple[str, int]]:
    """(account id, sign) of a command record's legs as a producer holds them (amounts may be strings)."""
    out = []
    for leg in body.get("legs") or ():
        account = leg.get("account_id")
        if isinstance(account, str):
            out.append((account, -1 if str(leg.get("amount") or "").startswith("-") else 1))
    return out


def placements(record: dict, routing_account: str, partitions: int) -> tuple[dict, list[int]]:
    """Where a producer writes a command record, in order, and the record to write there (the same bytes
    everywhere). A transaction whose legs live in several partitions goes to its coordinator and a copy to
    each other participant, marked PLACED in its metadata, so every partition it touches decides it at the
    producer's own position (docs/engine.md, "Order across partitions"). Any other command: the partition
    of its routing account."""
    default = partition_for_key(routing_key_for(unsharded(routing_account)), partitions)
    name, body = record["body"]
    if name != _TRANSACTION:
        return record, [default]

    def home(account: str) -> int | None:
        return None if is_system(account) else partition_of_account(account, partitions)

    where = plan(wire_legs(body), home)
    if not where.spans:
        return record, [default if where.coordinator is None else where.coordinator]
    metadata = {**(body.get("metadata") or {}), PLACED: PLACED_VALUE}
    others = [p for p in where.participants if p != where.coordinator]
    return {**record, "body": (name, {**body, "metadata": metadata})}, [where.coordinator, *others]


def linked_placements(records: Sequence[dict], routing_account: str, partitions: int) -> tuple[int, list[int]]:
    """Where a producer writes a linked batch: (its coordinator, the partitions to write, the coordinator
    first). The coordinator is the partition of the first command's routing account; a batch whose
    transactions touch other partitions goes to each of them too, as a copy naming that coordinator, so every
    partition it touches reserves its share at the producer's own position (P10, docs/wallet-operations.md).
    A batch holding anything but transactions is the coordinator's to refuse: written there only."""
    coordinator = partition_for_key(routing_key_for(unsharded(routing_account)), partitions)
    if any(record["body"][0] != _TRANSACTION for record in records):
        return coordinator, [coordinator]

    def home(account: str) -> int | None:
        return None if is_system(account) else partition_of_account(account, partitions)

    touched = {p for record in records for p in plan(wire_legs(record["body"][1]), home).participants}
    return coordinator, [coordinator, *sorted(touched - {coordinator})]


def is_placed(metadata: tuple[tuple[str, str], ...]) -> bool:
    """Whether a transaction carries the producer's placement mark (a copy may be one of several)."""
    return dict(metadata).get(PLACED) in (PLACED_VALUE, PLACED_BEFORE)
