"""A linked batch whose transactions live in several partitions: one unit of the two-phase protocol.

The rules are the core's (streams/core/linked.py: first_refused, exposure, first_failure, unit_answers); this
shell routes the steps, loads and persists. The batch is keyed by its client and name (batch_name: its first
command's id, marked, and a digest of every command's id and of its coordinator), K =
``<client>/<id>~linked~<digest>``, and coordinated in the partition it was sent to (streams/linking.py hands it
over there).

1. begin (coordinator): the judgements of each transaction as a whole that need no partition's state of
   another (its shape, double entry, its rate, names internal to the ledger: spanning.Spanning.whole and
   refusal), then record ``b/K`` (the batch, the participants, their votes) and send ReserveLinked, with every
   transaction of the batch, to each other partition any of them touches. Its own share is reserved in place.
2. ReserveLinked (participant): its shares (per transaction, the legs on its accounts, plus the coordinator's
   system legs on its shards, balanced by its clearing shard) are judged by the core in batch order, each
   against what the earlier ones staged (first_refused), so a transaction may spend what an earlier one
   credited to the same account. A transaction whose home this is (where it would be decided alone: its
   coordinator) fails if it was decided before or is part of another batch in flight. All of it fits: the
   participant holds, per account, the most the running sum of the batch's changes takes from it (an internal
   hold ``~K~<account>``) and counts the most it adds (``n/<account>``, as credits in flight are), in one
   StateChange with its record ``q/K``; the home transactions are marked in flight (``li/<client>/<id>``).
   It votes with VoteLinked: reserved, or the first transaction it refused and why.
3. VoteLinked (coordinator): when every vote is in, the batch is decided (first_failure: the earliest refused
   transaction, the most urgent reason among several refusals of it) and DecideLinked goes to every
   participant; its own share is decided in place.
4. DecideLinked (participant): commit = the internal holds are released and the shares post in batch order
   (each under its transaction's id, as the step ``<T>~decide~<p>`` of that transaction, as a transaction
   across partitions posts its shares); abort = the holds are released. Either way the partition records the
   answer of each transaction whose home it is (unit_answers: all accepted, or the failing one with its
   reason and the others linked_failed naming it), so a retry of one of them, alone or linked, is answered
   from its home's inbox. What was reserved cannot be refused: the hold kept the lowest point of each
   running sum available, a freeze or close waits meanwhile, and credits to a capped account wait.

A producer's copy of the batch (the same record written to another partition it touches, naming the
coordinator: placement.linked_placements) is judged and reserved there as ReserveLinked would be, at the
producer's position (P10), and answers nothing; ReserveLinked then votes with what the copy reserved or refused.
A copy whose ReserveLinked has not come within COPY_WAIT_MS of log time is dropped (copy, expire_copy).

A retry of the whole batch at the coordinator is answered when the batch is decided (in flight) or from
the decision's inbox entry ``K~decided`` (afterwards), as duplicates; a retry of one of its commands at its
home is counted in ``q/K`` and answered when the batch is decided there. Every step's state is written in
its own StateChange with its inbox entry written last, and every write of a step is named after K, so a
step delivered again or redone after a crash changes nothing twice.
"""
from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

from streams import core, names, routing
from streams.core import Leg, Rejection, linked, returns, settlement
from streams.inflight import copy_due_key
from streams.routing import ENGINE_CLIENT
from streams.spanning import COPY_WAIT_MS  # a batch's copy waits for its ReserveLinked as a transaction's does
from streams.wire import (command_from_wire, command_record, command_to_wire, holds_to_wire, rejection_to_wire,
                          result_to_wire)

if TYPE_CHECKING:
    from streams.partition import PartitionProcessor

LINKED_STEP_KINDS = frozenset({"ReserveLinked", "VoteLinked", "DecideLinked"})
_BATCH = "b/"  # the coordinator's record of a batch: b/<K>
_SHARE = "q/"  # a participant's record of its share: q/<K>
_ITEM = "li/"  # a transaction of a batch in flight, at its home: li/<client>/<id> -> K
# Set by a copy's drop that queued commands sent again meanwhile (_drop), until the waiting commands were drained
# (PartitionProcessor.expire_due): a crash between the two drains them when the record is delivered again.
_WAKE = "lw"
_COPY_TAG = "~copy"  # marks the internal holds a copy placed: a ReserveLinked after the copy's wait ended holds anew
# Ends the detail of a vote refusing a transaction whose answer is not the batch's to give (decided before, or in
# flight alone or in another batch): its home answers it by that decision, and a retry of the batch leaves it out.
ANSWERED_ELSEWHERE = "; it keeps the answer of its own decision"


def batch_name(commands: list[core.Command], coordinator: int) -> str:
    """The batch's name among its client's ids: its first command's id, marked, and a digest of every command's
    client and id and of the partition coordinating it, so another batch that begins with the same command is
    another batch (the command in it is then a retry of the one in flight), and the same batch sent again to
    the same partition is the same. The same batch written to two partitions is two batches, each
    coordinated where it was sent: their steps' ids (derived from the name) never meet, and each finds the
    other's commands in flight or decided (before, the two coordinators' steps shared ids, so each took the
    other's for its own delivered again and neither batch was ever decided, its holds kept)."""
    ids = [[c.client_id, c.command_id] for c in commands]
    digest = hashlib.sha256(json.dumps([coordinator, ids]).encode()).hexdigest()[:16]
    return names.step_id(commands[0].command_id, "linked", digest)


def _accepted(command_id: str, at_ms: int, detail: str = "", holds: list[core.Hold] = ()) -> dict[str, Any]:
    return {"command_id": command_id, "client_id": ENGINE_CLIENT, "outcome": "accepted", "reason": None,
            "detail": detail, "duplicate": False, "transaction_id": None, "at_ms": at_ms,
            "holds": holds_to_wire(list(holds))}


def _fingerprint(items: list) -> str:
    """Of a batch: its commands' clients, ids and fingerprints, in order."""
    return hashlib.sha256(json.dumps(items).encode()).hexdigest()


def _decision_detail(failure: linked.Failure, own: list[int]) -> str:
    """The detail of a failed batch's decision step: ``item <index>: <detail>``, or with the items that keep a
    decision of their own, ``item <index>; own <i>,<j>: <detail>`` (read back by _decision)."""
    mark = f"; own {','.join(map(str, own))}" if own else ""
    return f"item {failure[0]}{mark}: {failure[2]}"


def _decision(wire: dict[str, Any]) -> tuple[linked.Failure | None, list[int]]:
    """The failure a batch's decision step names (None: committed) and the items that keep a decision of their
    own (_decision_detail)."""
    if wire["outcome"] == "accepted":
        return None, []
    head, _, detail = wire["detail"].removeprefix("item ").partition(": ")
    index, _, own = head.partition("; own ")
    return (int(index), Rejection.from_code(wire["reason"]), detail), [int(i) for i in own.split(",") if i]


def _own(records: list[tuple[str, Any]], key: str) -> list[int]:
    """The items a participant's share of batch K keeps a decision of their own for (its q/K record's "own")."""
    return next((value.get("own", []) for name, value in records if name == _SHARE + key and value), [])


def _failure(vote: list | None) -> linked.Failure | None:
    return None if vote is None else (vote[0], Rejection.from_code(vote[1]), vote[2])


def _vote(failure: linked.Failure | None) -> list | None:
    """A failure as a vote (index, reason code, detail clipped to 256 characters, keeping ANSWERED_ELSEWHERE)."""
    if failure is None:
        return None
    detail = failure[2]
    if len(detail) > 256:
        tail = ANSWERED_ELSEWHERE if detail.endswith(ANSWERED_ELSEWHERE) else ""
        detail = detail[:256 - len(tail)] + tail
    return [failure[0], failure[1].code, detail]


class LinkedSpanning:
    """The linked batches across partitions of one partition processor."""

    def __init__(self, proc: "PartitionProcessor"):
        self.proc = proc

    @property
    def state(self):
        return self.proc.state

    # --- what may be linked across partitions ------------------------------------------------------------------
    @staticmethod
    def outside_scope(commands: list[core.Command]) -> tuple[Rejection, str] | None:
        """Why these commands cannot be one unit across partitions (None: they can): only transactions are
        carried by the protocol; a capture of a client's hold (its lock and settlement terms) and a return
        (judged against its payment, kept by share) are judged by the single-transaction protocol only; and
        each command id once."""
        seen: set[tuple[str, str]] = set()
        for command in commands:
            name = command.command_id
            if not isinstance(command, core.PostTransaction):
                return (Rejection.LINKED_SPANS_PARTITIONS,
                        f"{name} is a {type(command).__name__}: only transactions are linked across partitions")
            if any(leg.hold_id is not None for leg in command.legs):
                return (Rejection.LINKED_SPANS_PARTITIONS,
                        f"{name} captures a hold: captures are not linked across partitions")
            if returns.returned_payment(command.metadata) is not None:
                return (Rejection.LINKED_SPANS_PARTITIONS, f"{name} is a return: returns are not linked across "
                                                           f"partitions")
            key = (command.client_id, command.command_id)
            if key in seen:
                return (Rejection.LINKED_SPANS_PARTITIONS, f"{name} is in the batch twice")
            seen.add(key)
        return None

    def copied_at(self, key: str) -> int | None:
        """When linked batch key K's share here was reserved, if only by the producer's copy (its ReserveLinked
        not come yet: a credit it counts in flight then waits on another partition's progress,
        Spanning._counts); None otherwise."""
        share = self.state.record(_SHARE + key)
        return share["at_ms"] if share is not None and share.get("copy") is not None else None

    def ids_in_flight(self, key: str) -> bool:
        """A transaction under key T of a linked batch in flight whose home is this partition."""
        return self.state.record(_ITEM + key) is not None

    def in_flight(self, command: core.Command) -> bool:
        """A transaction of a linked batch in flight whose home is this partition (see retry)."""
        return isinstance(command, core.PostTransaction) and \
            self.ids_in_flight(names.transaction_key(command.client_id, command.command_id))

    def retry(self, command: core.Command, offset: int, alone: bool = False) -> None:
        """A command of a linked batch in flight sent again to its home, alone or in another batch: answered
        with its answer in the batch, as a duplicate, when the batch is decided here (as a retry of a
        transaction in flight is); another payload under its id is id_conflict. alone: sent by itself (counted
        apart too, for a copy dropped unconfirmed: _drop)."""
        proc = self.proc
        key = self.state.record(_ITEM + names.transaction_key(command.client_id, command.command_id))
        share = self.state.record(_SHARE + key)
        index = next(i for i in share["homes"] if share["items"][i][:2] == [command.client_id, command.command_id])
        client_id, command_id, wire = share["items"][index]
        sent = self._transaction({"client_id": client_id, "command_id": command_id, "transaction": wire},
                                 share["at_ms"])
        if proc.fingerprint(sent) != proc.fingerprint(command):
            proc.reject(command.command_id, command.client_id, command.at_ms, Rejection.ID_CONFLICT,
                        f"command {command.command_id} of {command.client_id} was already used with another payload")
            return
        # Per command: one record may retry several commands of the batch (another batch holding them).
        retry_id = names.step_id(key, "retry", f"{proc.partition}:{proc.position}:{index}")
        if self.state.change_record(ENGINE_CLIENT, retry_id) is not None:
            return  # this same retry redone after a crash: counted once
        retries = dict(share.get("retries", {}))
        retries[str(index)] = retries.get(str(index), 0) + 1
        counted = {**share, "retries": retries}
        if alone:
            counted["alone"] = {**share.get("alone", {}), str(index): share.get("alone", {}).get(str(index), 0) + 1}
        proc.commit_change(ENGINE_CLIENT, retry_id, "", offset,
                           _accepted(retry_id, command.at_ms, "answered when its linked batch is decided"),
                           records=[(_SHARE + key, counted)])

    # --- step 1 ----------------------------------------------------------------------------------------------
    def begin(self, offset: int, commands: list[core.PostTransaction], refusals: list[tuple[Rejection, str] | None],
              at_ms: int) -> None:
        """refusals: per command, the engine's refusal of it on its route (None: none)."""
        proc = self.proc
        name = batch_name(commands, proc.partition)
        key = names.transaction_key(commands[0].client_id, name)
        items = self._items(commands)
        stored = self.state.record(_BATCH + key)
        decided = self.state.change_record(ENGINE_CLIENT, names.step_id(key, "decided"))
        if stored is not None or decided is not None:
            self._again(key, stored, decided, items, commands, offset, at_ms)
            return
        failures: list[linked.Failure] = []
        credited: dict[str, int] = {}  # what the batch's earlier commands credit, per account (as Linking counts)
        for index, command in enumerate(commands):
            found = [refusals[index]] if refusals[index] is not None else []
            found += core.transaction_shape_failures(command) or proc.spanning.whole(command)
            found += [r for r in [proc.spanning.refusal(command)] if r is not None]
            if not found and proc.spanning.waits(command, credited, can_wait=False):  # a batch cannot wait
                found.append((Rejection.IN_FLIGHT, "it would wait for a transaction in flight, and a linked batch "
                                                   "is decided at once or not at all; send it again once that is "
                                                   "decided"))
            failures += [(index, reason, detail) for reason, detail in found]
            for leg in command.legs:
                if leg.amount > 0:
                    credited[leg.account_id] = credited.get(leg.account_id, 0) + leg.amount
        wires = [command_to_wire(c)["body"][1] for c in commands]
        participants = sorted({p for c in commands for p in self._participants(c)} | {proc.partition})
        body = {"batch_client_id": commands[0].client_id, "batch_command_id": name,
                "coordinator_partition": proc.partition,
                "items": [{"client_id": c.client_id, "command_id": c.command_id, "transaction": w}
                          for c, w in zip(commands, wires)]}
        for p in participants:
            if p != proc.partition:
                self._send(key, "ReserveLinked", p, commands, at_ms, body)
        mine, records, held = self._reserve(key, commands, proc.partition, at_ms, offset)
        vote = linked.first_failure(failures + ([mine] if mine is not None else []))
        record = {"items": items, "txs": wires, "at_ms": at_ms, "participants": participants,
                  "votes": {str(proc.partition): _vote(vote)}, "retries": 0, "own": _own(records, key)}
        begin_id = names.step_id(key, names.BEGIN)
        proc.commit_change(ENGINE_CLIENT, begin_id, "", offset,
                           _accepted(begin_id, at_ms, f"reserving in partitions {participants}",
                                     held.get("holds", ())),
                           records=[*records, (_BATCH + key, record)], **held)

    def _again(self, key: str, stored: dict | None, decided: dict | None, items: list,
               commands: list[core.PostTransaction], offset: int, at_ms: int) -> None:
        """The batch under a name already begun: a retry (answered when decided, or now from the decision), or
        its commands' ids under other payloads (id_conflict, not remembered)."""
        proc = self.proc
        if (stored["items"] if stored is not None else decided["fingerprint"]) != \
                (items if stored is not None else _fingerprint(items)):
            for command in commands:
                proc.reject(command.command_id, command.client_id, at_ms, Rejection.ID_CONFLICT,
                            "a linked batch of these command ids was sent before with other payloads")
            return
        if decided is not None:
            wire = proc.codec.decode("result", decided["result"])
            for answer in self._retried(commands, *_decision(wire), wire["at_ms"]):
                proc.emit_result(answer)
            return
        retry_id = names.step_id(key, "retry", proc.position)
        if self.state.change_record(ENGINE_CLIENT, retry_id) is not None:
            return  # this same retry redone after a crash: counted once
        proc.commit_change(ENGINE_CLIENT, retry_id, "", offset, _accepted(retry_id, at_ms, "answered when decided"),
                           records=[(_BATCH + key, {**stored, "retries": stored["retries"] + 1})])

    def _items(self, commands: list[core.Command]) -> list[list[str]]:
        """Of a batch: each command's client, id and fingerprint, in order (what _fingerprint digests)."""
        return [[c.client_id, c.command_id, self.proc.fingerprint(c)] for c in commands]

    # --- the producer's copies: reserve at the copy's own position (P10) ----------------------------------------
    def copy(self, offset: int, commands: list[core.Command], coordinator: int) -> None:
        """The producer's copy of a batch across partitions, written here besides its coordinator
        (placement.linked_placements): this partition judges and reserves its share now, at the producer's
        position among its commands, as ReserveLinked would, and votes with that when ReserveLinked comes. The
        coordinator answers every command. A copy whose ReserveLinked has not come within COPY_WAIT_MS of log
        time is dropped (expire_copy)."""
        proc, state = self.proc, self.state
        transactions = [c for c in commands if isinstance(c, core.PostTransaction)]
        key = names.transaction_key(commands[0].client_id, batch_name(commands, coordinator))
        copy_id = names.step_id(key, "copy", proc.partition)
        at_ms = commands[0].at_ms
        if state.change_record(ENGINE_CLIENT, copy_id) is not None:
            return  # the copy sent again (a retry): its effect exists, the coordinator answers
        late = state.record(_SHARE + key) is not None or \
            state.change_record(ENGINE_CLIENT, names.step_id(key, "reservelinked", proc.partition)) is not None
        if late or self.outside_scope(commands) is not None or \
                proc.partition not in {p for c in transactions for p in self._participants(c)}:
            # ReserveLinked came first, or a batch the coordinator refuses whole, or none of it lives here.
            proc.commit_change(ENGINE_CLIENT, copy_id, "", offset, _accepted(copy_id, at_ms, "nothing to reserve"))
            return
        vote, records, held = self._reserve(key, transactions, coordinator, at_ms, offset, _COPY_TAG)
        copied = {"copy": _fingerprint(self._items(transactions)), "vote": _vote(vote)}
        records = [(name, {**value, **copied} if name == _SHARE + key else value) for name, value in records]
        records.append((copy_due_key(at_ms + COPY_WAIT_MS, key), 1))
        proc.commit_change(ENGINE_CLIENT, copy_id, "", offset,
                           _accepted(copy_id, at_ms, "reserved" if vote is None else "refused",
                                     held.get("holds", ())), records=records, **held)

    def expire_copy(self, key: str, offset: int, now_ms: int) -> None:
        """A copy's reservation whose ReserveLinked has not come within COPY_WAIT_MS of log time is dropped (the
        coordinator never got the batch: a producer that died between its writes, or one that wrote a copy
        only). Nothing is answered: the batch was never decided. Not a linked copy's key: nothing."""
        share = self.state.record(_SHARE + key)
        if share is not None and share.get("copy") is not None:
            self._drop(key, share, names.step_id(key, "copyexpired", self.proc.partition), offset, now_ms)

    def _drop(self, key: str, share: dict, command_id: str, offset: int, at_ms: int) -> None:
        """A copy's reservation undone: its holds released, its records and marks gone, its wait ended. A
        command of the batch sent again to its home meanwhile (a retry counted in q/K, to be answered by the
        batch's decision, which will not come from this copy) is decided now, before the drop's StateChange (a
        redo finds it decided or waiting): sent again alone, it waits, once per time it was sent, as a command
        behind a transaction in flight does (spanning.wait), and is decided alone when its turn comes
        (spanning.drain, at once: the drop's StateChange marks them to be drained, _WAKE), at the log time of the
        drop; sent again only inside other linked batches, which failed on it for being in flight, that refusal
        is its decision (it never posts alone: it was only ever sent linked to commands that did not post)."""
        proc, position = self.proc, self.proc.position
        queued: list[tuple[str, Any]] = []
        for index, count in sorted(share.get("retries", {}).items(), key=lambda r: int(r[0])):
            client_id, retried_id, wire = share["items"][int(index)]
            command = self._transaction({"client_id": client_id, "command_id": retried_id, "transaction": wire},
                                        at_ms)
            if share.get("alone", {}).get(index):  # the first decides it alone, the others are duplicates
                for n in range(count):
                    proc.position = f"{position}:{key}:{index}:{n}"
                    proc.spanning.wait(command, offset)
                proc.position = position
                queued = [(_WAKE, 1)]
                continue
            stored = self.state.change_record(client_id, retried_id)
            if stored is None:
                proc.reject_command(command, Rejection.IN_FLIGHT,
                                    f"{retried_id} was sent again in a linked batch while a linked batch holding it "
                                    f"was in flight here, and that batch failed on it; the batch in flight was "
                                    f"never confirmed")
            else:  # decided by this very record before a crash cut it
                proc.answer_again(stored)
            answer = proc.codec.decode("result", self.state.change_record(client_id, retried_id)["result"])
            for _ in range(count - 1):
                proc.emit_result({**answer, "duplicate": True})
        for hold_id, account_id, _ in share["holds"]:
            self.proc.execute(core.ReleaseHold(command_id=names.step_id(key, "uncopy", account_id),
                                               client_id=ENGINE_CLIENT, at_ms=at_ms, hold_id=hold_id), offset)
        self.proc.commit_change(ENGINE_CLIENT, command_id, "", offset, _accepted(command_id, at_ms),
                                records=[*self._ended(key, share), *self._wait_ended(key), *queued])

    def wake_due(self) -> bool:
        """Whether a copy's drop queued commands that have not been drained yet (_WAKE)."""
        return bool(self.state.record(_WAKE))

    def woken(self, offset: int, at_ms: int) -> None:
        """The commands a copy's drop queued were drained: the mark ends, in a StateChange after the drain's."""
        command_id = names.step_id(_WAKE, "woken", f"{self.proc.partition}:{self.proc.position}")
        if self.state.change_record(ENGINE_CLIENT, command_id) is None:
            self.proc.commit_change(ENGINE_CLIENT, command_id, "", offset, _accepted(command_id, at_ms),
                                    records=[(_WAKE, None)])

    def _wait_ended(self, key: str) -> list[tuple[str, Any]]:
        due = self.state.copy_dues.get(key)
        return [] if due is None else [(copy_due_key(due, key), None)]

    # --- step 2 ----------------------------------------------------------------------------------------------
    def _reserve(self, key: str, commands: list[core.PostTransaction], coordinator: int, at_ms: int, offset: int,
                 tag: str = "") -> tuple[linked.Failure | None, list[tuple[str, Any]], dict[str, Any]]:
        """This partition's share of the batch judged in order and, if it all fits, reserved. Returns (the
        first failure, the engine records to write, the internal holds' writes for commit_change)."""
        proc, state = self.proc, self.state
        failures: list[linked.Failure] = []
        # The transactions whose answer this partition keeps. One decided before keeps its answer and fails the
        # batch; one in flight here (in another linked batch, or alone across partitions) is a retry of it,
        # answered by that decision, and fails the batch: its answer is not this batch's to record.
        homes: list[int] = []
        own: list[int] = []  # those that keep a decision of their own (the vote says so: see _retried)
        for i, command in enumerate(commands):
            if self._home(command, coordinator) != proc.partition:
                continue
            stored = state.change_record(command.client_id, command.command_id)
            if stored is not None:
                homes.append(i)
                own.append(i)
                wire = proc.codec.decode("result", stored["result"])
                reason = Rejection.from_code(wire["reason"]) if wire["outcome"] == "rejected" else \
                    Rejection.LINKED_SPANS_PARTITIONS
                failures.append((i, reason, f"{command.command_id} was decided before: a linked batch across "
                                            f"partitions takes commands not decided yet{ANSWERED_ELSEWHERE}"))
            elif self.in_flight(command) or proc.spanning.under_way(command):
                if self.in_flight(command):
                    self.retry(command, offset)
                else:
                    proc.spanning.begin(command, offset)
                failures.append((i, Rejection.IN_FLIGHT, f"{command.command_id} is in flight{ANSWERED_ELSEWHERE}"))
                own.append(i)
            else:
                homes.append(i)
        shares: list[tuple[int, core.PostTransaction]] = []
        for i, command in enumerate(commands):
            share = self._share(key, command, coordinator, at_ms)
            if isinstance(share, tuple):
                failures.append((i, *share))
                break
            if share is not None:
                shares.append((i, share))
        marks = [(_ITEM + names.transaction_key(commands[i].client_id, commands[i].command_id), key) for i in homes
                 if state.change_record(commands[i].client_id, commands[i].command_id) is None]
        record = {"coordinator": coordinator, "at_ms": at_ms, "homes": homes, "holds": [], "credits": [],
                  "items": [[c.client_id, c.command_id, command_to_wire(c)["body"][1]] for c in commands],
                  "own": own}
        failure = linked.first_failure(failures)
        if failure is None:
            for system in {leg.account_id for _, s in shares for leg in s.legs if routing.is_system(leg.account_id)}:
                proc.open_shards([routing.unsharded(system)], commands[0], offset)
            refused = linked.first_refused(state, [s for _, s in shares], proc.currencies)
            if refused is not None:
                failure = (shares[refused[0]][0], refused[1], refused[2])
        if failure is not None:
            return failure, [*marks, (_SHARE + key, record)], {}
        return self._hold(key, commands, shares, record, marks, at_ms, offset, tag)

    def _hold(self, key: str, commands: list[core.PostTransaction], shares: list[tuple[int, core.PostTransaction]],
              record: dict, marks: list, at_ms: int, offset: int, tag: str
              ) -> tuple[linked.Failure | None, list[tuple[str, Any]], dict[str, Any]]:
        proc, state = self.proc, self.state
        ordinary = [[(leg.account_id, leg.amount) for leg in share.legs if not routing.is_system(leg.account_id)]
                    for _, share in shares]
        first_touch: dict[str, int] = {}
        for (index, _), legs in zip(shares, ordinary):
            for account_id, _ in legs:
                first_touch.setdefault(account_id, index)
        held: dict[str, Any] = {"accounts": [], "holds": [], "history": ()}
        records: list[tuple[str, Any]] = list(marks)
        placed, credited, failures, marked = [], [], [], []
        for account_id, (take, add) in linked.exposure(ordinary).items():
            if take:
                hold = core.PlaceHold(command_id=names.step_id(key + tag, "hold", account_id), client_id=ENGINE_CLIENT,
                                      at_ms=at_ms, hold_id=names.internal_hold(key, account_id, tag),
                                      account_id=account_id, amount=take)
                # One hold per account, so no hold's decision reads an account another one changed (unstaged).
                result, changes = core.execute(state, hold, proc.currencies)
                if not result.accepted:
                    failures.append((first_touch[account_id], result.reason, result.detail))
                    continue
                held["accounts"] += list(changes.accounts.values())
                held["holds"] += list(changes.holds.values())
                held["history"] += changes.history
                placed.append([hold.hold_id, account_id, take])
            if add:
                reserved = state.record(f"n/{account_id}") or {}
                if reserved:  # on top of the credits other transactions in flight count on (their caps)
                    failure = self._credit_fits(key, commands[first_touch[account_id]], account_id,
                                                add + sum(reserved.values()), at_ms, offset)
                    if failure is not None:
                        failures.append((first_touch[account_id], *failure))
                        continue
                records.append((f"n/{account_id}", {**reserved, key: add}))
                credited.append([account_id, add])
            marked.append(account_id)
        # The system shards its shares post to (where their transactions' system legs live) are marked too, as
        # one transaction's coordinator marks them: a freeze or close of one waits for the decision.
        marked += [leg.account_id for _, share in shares for leg in share.legs
                   if routing.is_system(leg.account_id) and not names.is_clearing(leg.account_id)]
        for account_id in dict.fromkeys(marked):
            records.append((f"k/{account_id}", [*(state.record(f"k/{account_id}") or []), key]))
        if not failures and shares:  # the in-flight records stay within what one redo record may hold
            budget = proc.spanning.over_budget(key, list(first_touch), {}, dict(credited))
            if budget is not None:
                failures.append((shares[0][0], *budget))
        if failures:  # nothing is staged: the holds' changes and these records are dropped
            return linked.first_failure(failures), [*marks, (_SHARE + key, record)], {}
        records.append((_SHARE + key, {**record, "holds": placed, "credits": credited, "reserved": True,
                                       "marked": list(dict.fromkeys(marked))}))
        return None, records, held

    def _credit_fits(self, key: str, command: core.PostTransaction, account_id: str, total: int, at_ms: int,
                     offset: int) -> tuple[Rejection, str] | None:
        """A credit judged as it will post, on top of what transactions in flight count on the account."""
        proc = self.proc
        clearing = names.clearing(self.state.account(account_id).currency)
        proc.open_shards([clearing], command, offset)  # its currency is registered: _share checked it
        probe = core.PostTransaction(command_id=names.step_id(key, "credit", account_id), client_id=ENGINE_CLIENT,
                                     at_ms=at_ms, transaction_id=key, kind="transfer",
                                     legs=(Leg(routing.shard_of(clearing, proc.partition), -total),
                                           Leg(account_id, total)))
        result = core.decide(self.state, probe, proc.currencies)
        return None if result.outcome == "accepted" else (result.reason, result.detail)

    def _share(self, key: str, command: core.PostTransaction, coordinator: int, at_ms: int
               ) -> core.PostTransaction | tuple[Rejection, str] | None:
        """This partition's share of one transaction of the batch: its legs here (system legs on the local
        shards where the transaction's system legs live) and one clearing leg per currency, posted as the
        transaction's decide step here. None: no leg here. A (reason, detail): a currency not registered."""
        proc = self.proc
        legs: list[Leg] = []
        totals: dict[str, int] = {}
        system_home = self._home(command, coordinator)
        for leg, home in zip(command.legs, proc.spanning.plan(command).homes):
            if routing.is_system(leg.account_id):
                if system_home != proc.partition:
                    continue
                currency = routing.system_currency(leg.account_id)
                legs.append(Leg(proc.local(leg.account_id), leg.amount, None, leg.currency))
            else:
                if home != proc.partition:
                    continue
                account = self.state.account(leg.account_id)
                currency = account.currency if account is not None else \
                    (leg.currency or routing.system_currency(leg.account_id))
                legs.append(leg)
            if proc.currencies.get(currency) is None:
                return Rejection.UNKNOWN_CURRENCY, f"currency {currency} is not registered"
            totals[currency] = totals.get(currency, 0) + leg.amount
        if not legs:
            return None
        legs += [Leg(routing.shard_of(names.clearing(c), proc.partition), -n) for c, n in totals.items() if n]
        step = names.step_id(names.transaction_key(command.client_id, command.command_id), names.DECIDE, proc.partition)
        return core.PostTransaction(command_id=step, client_id=ENGINE_CLIENT, at_ms=at_ms,
                                    transaction_id=command.transaction_id, legs=tuple(legs), kind=command.kind,
                                    reference=command.reference, links=command.links,
                                    occurred_at_ms=command.occurred_at_ms,
                                    metadata=settlement.carried(command.metadata))

    def _participants(self, command: core.PostTransaction) -> list[int]:
        where = self.proc.spanning.plan(command)
        return list(where.participants) or [self.proc.partition]

    def _home(self, command: core.PostTransaction, coordinator: int) -> int:
        """Where the transaction would be decided alone (its coordinator, streams/placement.py; the batch's
        coordinator for one on system accounts only): it keeps the transaction's answer."""
        where = self.proc.spanning.plan(command)
        return coordinator if where.coordinator is None else where.coordinator

    # --- the steps as engine commands -------------------------------------------------------------------------
    def _send(self, key: str, kind: str, partition: int, commands: list[core.PostTransaction], at_ms: int,
              body: dict) -> None:
        where = body.get("participant", partition)
        command_id = names.step_id(key, kind.lower(), where)
        account = next((leg.account_id for c in commands for leg, home in zip(c.legs, self.proc.spanning.plan(c).homes)
                        if home == partition and not routing.is_system(leg.account_id)), commands[0].legs[0].account_id)
        self.proc.send_wire(command_record(ENGINE_CLIENT, command_id, kind, body), routing.routing_key_for(account),
                            partition, at_ms)

    def handle(self, kind: str, record: dict[str, Any], offset: int, at_ms: int) -> None:
        proc = self.proc
        command_id = record["command_id"]
        if self.state.change_record(ENGINE_CLIENT, command_id) is not None:  # delivered again: done already
            proc.answer_again(self.state.change_record(ENGINE_CLIENT, command_id))
            if kind == "DecideLinked":
                proc.spanning.drain(offset)
            return
        proc.expire_due(offset, at_ms)
        body = record["body"][1]
        key = names.transaction_key(body["batch_client_id"], body["batch_command_id"])
        if kind == "ReserveLinked":
            commands = [self._transaction(item, at_ms) for item in body["items"]]
            share = self.state.record(_SHARE + key)
            if share is not None and share.get("copy") == _fingerprint(self._items(commands)):
                # Reserved (or refused) already where the producer's copy stood: that is this partition's vote.
                vote, held = _failure(share["vote"]), {}
                records = [(_SHARE + key, {k: v for k, v in share.items() if k not in ("copy", "vote")}),
                           *self._wait_ended(key)]
                own = share.get("own", [])
            else:
                if share is not None and share.get("copy") is not None:  # a copy of other payloads: undone
                    self._drop(key, share, names.step_id(key, "uncopy", proc.partition), offset, at_ms)
                vote, records, held = self._reserve(key, commands, body["coordinator_partition"], at_ms, offset)
                own = _own(records, key)
            proc.commit_change(ENGINE_CLIENT, command_id, "", offset,
                               _accepted(command_id, at_ms, "", held.get("holds", ())), records=records, **held)
            vote = _vote(vote)
            self._send(key, "VoteLinked", body["coordinator_partition"], commands, at_ms, {
                "batch_client_id": body["batch_client_id"], "batch_command_id": body["batch_command_id"],
                "participant": proc.partition, "item": -1 if vote is None else vote[0],
                "reason": None if vote is None else vote[1], "detail": "" if vote is None else vote[2], "own": own})
        elif kind == "VoteLinked":
            vote = None if body["reason"] is None else [body["item"], body["reason"], body["detail"]]
            self._counted(key, command_id, str(body["participant"]), vote, body.get("own") or [], offset, at_ms)
        else:
            failure = None if body["commit"] else (body["item"], Rejection.from_code(body["reason"]), body["detail"])
            self._decide(key, command_id, failure, offset, at_ms)

    def _transaction(self, item: dict, at_ms: int) -> core.PostTransaction:
        return command_from_wire(command_record(item["client_id"], item["command_id"], "PostTransaction",
                                                item["transaction"]), at_ms)

    # --- step 3 ----------------------------------------------------------------------------------------------
    def _counted(self, key: str, command_id: str, participant: str, vote: list | None, own: list[int], offset: int,
                 at_ms: int) -> None:
        proc = self.proc
        stored = self.state.record(_BATCH + key)
        if stored is None:  # decided already (a vote delivered twice)
            proc.commit_change(ENGINE_CLIENT, command_id, "", offset, _accepted(command_id, at_ms, "late"))
            return
        record = {**stored, "votes": {**stored["votes"], participant: vote},
                  "own": sorted({*stored.get("own", []), *own})}
        if len(record["votes"]) < len(record["participants"]):
            proc.commit_change(ENGINE_CLIENT, command_id, "", offset, _accepted(command_id, at_ms),
                               records=[(_BATCH + key, record)])
            return
        failure = linked.first_failure(_failure(v) for v in record["votes"].values() if v is not None)
        commands = [self._transaction({"client_id": c, "command_id": i, "transaction": t}, record["at_ms"])
                    for (c, i, _), t in zip(record["items"], record["txs"])]
        # The batch's name as it was begun (K is "<client>/<name>"), not worked out again.
        body = {"batch_client_id": commands[0].client_id, "batch_command_id": key[len(commands[0].client_id) + 1:],
                "commit": failure is None, "item": -1 if failure is None else failure[0],
                "reason": None if failure is None else failure[1].code, "detail": "" if failure is None else failure[2]}
        for p in record["participants"]:
            if p != proc.partition:
                self._send(key, "DecideLinked", p, commands, at_ms, body)
        decide_id = names.step_id(key, "decidelinked", proc.partition)
        if self.state.change_record(ENGINE_CLIENT, decide_id) is None:
            self._decide(key, decide_id, failure, offset, at_ms)
        for _ in range(record["retries"]):
            for wire in self._retried(commands, failure, record["own"], at_ms):
                proc.emit_result(wire)
        # The decision stays in the inbox (a retry of the batch is answered from it); the record ends. Both in
        # the final vote's StateChanges, after the own share's, its own last: a redo completes what a crash cut.
        decided_id = names.step_id(key, "decided")
        if self.state.change_record(ENGINE_CLIENT, decided_id) is None:
            wire = _accepted(decided_id, at_ms) if failure is None else rejection_to_wire(
                decided_id, ENGINE_CLIENT, at_ms, failure[1], _decision_detail(failure, record["own"]))
            proc.commit_change(ENGINE_CLIENT, decided_id, _fingerprint(record["items"]), offset, wire)
        proc.commit_change(ENGINE_CLIENT, command_id, "", offset, _accepted(command_id, at_ms),
                           records=[(_BATCH + key, None)])

    def _answers(self, commands: list[core.PostTransaction], failure: linked.Failure | None,
                 at_ms: int) -> list[dict[str, Any]]:
        return [result_to_wire(result, at_ms, command.transaction_id if result.accepted else None, [])
                for command, result in zip(commands, linked.unit_answers(commands, failure))]

    def _retried(self, commands: list[core.PostTransaction], failure: linked.Failure | None, own: list[int],
                 at_ms: int) -> list[dict[str, Any]]:
        """The answers to a retry of the whole batch, as duplicates. A transaction with a decision of its own
        (decided before, or in flight alone or in another batch, when the batch reached its home: `own`, as the
        votes named them) is left out: the batch did not decide it, and its home answers it by its own decision
        when it is sent again. (A decision recorded before votes named them marks only the failing one so.)"""
        skip = set(own)
        if failure is not None and failure[2].endswith(ANSWERED_ELSEWHERE):
            skip.add(failure[0])
        answers = self._answers(commands, failure, at_ms)
        return [{**answer, "duplicate": True} for i, answer in enumerate(answers) if i not in skip]

    # --- step 4 ----------------------------------------------------------------------------------------------
    def _decide(self, key: str, command_id: str, failure: linked.Failure | None, offset: int, at_ms: int) -> None:
        proc, state = self.proc, self.state
        share = state.record(_SHARE + key)
        if share is None:  # nothing of the batch here (cannot happen: every participant records its share)
            proc.commit_change(ENGINE_CLIENT, command_id, "", offset, _accepted(command_id, at_ms, "late"))
            return
        commands = [self._transaction({"client_id": c, "command_id": i, "transaction": t}, share["at_ms"])
                    for c, i, t in share["items"]]
        for hold_id, account_id, _ in share["holds"]:
            proc.execute(core.ReleaseHold(command_id=names.step_id(key, "release", account_id),
                                          client_id=ENGINE_CLIENT, at_ms=at_ms, hold_id=hold_id), offset)
        if failure is None and share.get("reserved"):
            for command in commands:
                posting = self._share(key, command, share["coordinator"], share["at_ms"])
                if posting is None:
                    continue
                assert not isinstance(posting, tuple), posting
                clearing = [names.clearing(routing.system_currency(leg.account_id)) for leg in posting.legs
                            if names.is_clearing(leg.account_id)]
                system = [routing.unsharded(leg.account_id) for leg in posting.legs
                          if routing.is_system(leg.account_id) and not names.is_clearing(leg.account_id)]
                proc.open_shards(clearing + system, command, offset)
                # As a transaction across partitions posts its share: the record keeps the client's (so only it
                # may reverse or return it), posted by the engine's decide step.
                fingerprint = proc.fingerprint(posting)
                result, changes = core.execute_share(proc.state, posting, command.client_id, proc.currencies,
                                                     None, fingerprint)
                assert result.outcome == "accepted", f"a reserved share of a linked batch refused: {result}"
                if changes.processed is None:  # posted already (answered from the inbox)
                    proc.emit_result(result_to_wire(result, posting.at_ms, None, []))
                    continue
                proc.record_decision(posting, result, changes, offset, fingerprint)
        answers = self._answers(commands, failure, at_ms)
        retries = share.get("retries", {})
        for i in share["homes"]:
            command = commands[i]
            stored = state.change_record(command.client_id, command.command_id)
            if stored is not None:  # decided before (the batch failed on it) or just now, before a crash
                proc.answer_again(stored)
                answer = proc.codec.decode("result", stored["result"])
            else:
                answer = answers[i]
                proc.commit_change(command.client_id, command.command_id, proc.fingerprint(command), offset, answer)
            for _ in range(retries.get(str(i), 0)):
                proc.emit_result({**answer, "duplicate": True})
        proc.commit_change(ENGINE_CLIENT, command_id, "", offset, _accepted(command_id, at_ms),
                           records=self._ended(key, share))
        proc.spanning.drain(offset)

    def _ended(self, key: str, share: dict) -> list[tuple[str, Any]]:
        """The engine records without this partition's share of batch K: its record, its marks."""
        state = self.state
        records: list[tuple[str, Any]] = [(_SHARE + key, None)]
        for i in share["homes"]:
            item = _ITEM + names.transaction_key(*share["items"][i][:2])
            if state.record(item) == key:
                records.append((item, None))
        # Every account it marked (one whose running sum never left zero has neither a hold nor a credit; a
        # share recorded before "marked" was kept names the accounts of its holds and credits).
        marked = share.get("marked", [a for _, a, _ in share["holds"]] + [a for a, _ in share["credits"]])
        for account_id in dict.fromkeys(marked):
            rest = [k for k in (state.record(f"k/{account_id}") or []) if k != key]
            records.append((f"k/{account_id}", rest or None))
        for account_id, _ in share["credits"]:
            rest = {k: v for k, v in (state.record(f"n/{account_id}") or {}).items() if k != key}
            records.append((f"n/{account_id}", rest or None))
        return records
