"""A linked CommandBatch in the worker: its commands take effect all together or not at all.

The decision is the core's (streams/core/linked.py: execute_linked, judge_placement, others_refused); this
shell supplies what the engine knows, in the order a single command meets it (streams/partition.py):

1. Each item is decoded and admitted as a client command (seal, authentication, limits, readable fields,
   then the client's policy, except for a command decided before: its stored answer stands, as for one
   sent alone). An item that fails is answered as it would be alone (dead letter or rejection); the others
   are refused linked_failed, or, when they touch another partition, linked_spans_partitions (not a decision).
2. The due holds expire (log time), as before any decision. A batch naming another partition as its
   coordinator is the producer's copy of a batch across partitions: its share here is reserved
   (streams/spanning_linked.py, copy) and nothing is answered; an item that failed the checks of step 1 there
   ends the copy, and what those checks answered or remembered there is undone (a dead letter stays): the
   coordinator applies the same checks and answers.
3. A producer's copy of a transaction placed in several partitions is its coordinator's to answer: not
   answered here, and the others are refused linked_spans_partitions.
4. Where each command is decided (PartitionProcessor.route). A batch touching any partition but this one
   is one unit of the two-phase protocol coordinated here if it can be (streams/spanning_linked.py: its
   transactions; a transaction under way here fails it there), else refused linked_spans_partitions, every
   command. In one partition, a retry of a transaction under way is answered when that transaction is
   decided (as alone), and a command of a batch across partitions in flight here is a retry of it, answered
   when that batch is decided; the others are refused linked_failed.
5. Per command, in order, the engine's judgements outside the core: a routing refusal; a capture of a hold
   a transaction in flight has locked part of (in_flight: the lock checks judge one command, and two
   captures of the batch could take the locked part together); contention with transactions in flight
   (spanning.refusal); a command that would have to wait (in_flight: a batch waits as a whole or not at all,
   and the waiting queue holds single commands), counting what the batch's earlier commands credit; the
   system shards it needs (unknown_currency). A command decided before skips these.
6. execute_linked on the commands as routed, each remembered under the fingerprint it was sent with.

The first failure keeps its own answer and every other command is refused linked_failed naming it, each
answered after the ones before it (an id the batch holds twice is decided once). A refused transaction's
copies elsewhere are released at once, as for any refusal. A retry of the batch gets the same answers, as
duplicates. Everything a step staged is undone if the batch fails part way (PartitionProcessor.guarded), and
every readable command is then refused invalid_command.
"""
from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from schemas.codec import DecodeError
from streams import core, placement
from streams.core import linked
from streams.core.rejections import Rejection
from streams.routing import ENGINE_CLIENT
from streams.wire import result_to_wire

if TYPE_CHECKING:
    from streams.partition import PartitionProcessor, Route


class Linking:
    """The linked batches of one partition processor, decided through its public methods."""

    def __init__(self, proc: "PartitionProcessor"):
        self.proc = proc

    def handle(self, offset: int, timestamp_ms: int, key: bytes | None, items: list[bytes],
               coordinator: int | None = None) -> None:
        """coordinator: the partition the producer named to coordinate the batch (a batch across partitions it
        also wrote, as copies, to the others its transactions touch); None: this one."""
        proc = self.proc
        records: list[tuple[int, dict | None]] = []
        for index, item in enumerate(items):
            proc.position = f"{offset}.{index}"
            try:
                records.append((index, proc.codec.decode("command", item)))
            except DecodeError as exc:
                proc.dead_letter(offset, timestamp_ms, key, item, exc.reason,
                                 f"command {index} of the linked batch: {exc.detail}", index)
                records.append((index, None))
        readable = [(index, record) for index, record in records if record is not None]

        def refuse(why: str) -> None:
            for index, record in readable:
                proc.position = f"{offset}.{index}"
                proc.reject(record["command_id"], record["client_id"], timestamp_ms, Rejection.INVALID_COMMAND, why)

        proc.guarded(offset, f"a linked batch of {len(items)} commands",
                     lambda: self._decide(offset, timestamp_ms, items, records, coordinator), refuse)

    def _decide(self, offset: int, timestamp_ms: int, items: list[bytes],
                records: list[tuple[int, dict | None]], coordinator: int | None) -> None:
        proc = self.proc
        if coordinator is not None and not 0 <= coordinator < proc.partitions:
            for index, record in records:
                if record is not None:
                    proc.position = f"{offset}.{index}"
                    proc.reject(record["command_id"], record["client_id"], timestamp_ms, Rejection.INVALID_COMMAND,
                                f"the linked batch names partition {coordinator} to coordinate it, which does not "
                                f"exist")
            return
        # A copy of a batch across partitions the producer also wrote to its coordinator (placement.linked_placements).
        copy = coordinator is not None and coordinator != proc.partition
        outputs, changelog, tally = len(proc.outputs), len(proc.changelog), Counter(proc.tally)
        commands: list[tuple[int, core.Command]] = []
        failure: tuple[core.Command | None, str] | None = None  # the first item that failed: (it, detail)
        denied: tuple[core.Command, str] | None = None  # the first command its client's policy refuses, and why
        for index, record in records:
            if record is None:
                failure = failure or (None, linked.failed(f"command {index} of the batch", "dead_letter"))
                continue
            proc.position, proc.kind = f"{offset}.{index}", record["body"][0].rsplit(".", 1)[-1]
            if record["client_id"] == ENGINE_CLIENT:
                proc.reject(record["command_id"], record["client_id"], timestamp_ms, Rejection.INVALID_COMMAND,
                            "a linked batch carries client commands only")
                failure = failure or (None, linked.failed(record["command_id"], Rejection.INVALID_COMMAND.code))
                continue
            admitted = proc.admit(record, proc.kind, len(items[index]), timestamp_ms)
            if isinstance(admitted, Rejection):
                failure = failure or (None, linked.failed(record["command_id"], admitted.code))
                continue
            # A command decided before keeps its stored answer, as one sent alone is answered from the inbox
            # before its client's policy is read again.
            refusal = None if self._seen(admitted) else proc.not_permitted(admitted)
            if refusal is not None and failure is None:
                denied = (admitted, refusal)  # answered below: decided here only if the batch stays here
                failure = (admitted, linked.failed(admitted.command_id, Rejection.NOT_PERMITTED.code))
            commands.append((index, admitted))
        if failure is not None:
            if copy:
                # A copy reserves nothing and answers nothing: the coordinator reads the same commands, judges them
                # the same and answers them, once (an unreadable one remembered here too was decided twice). What
                # the checks answered or remembered here is undone; a dead letter stays (it answers these bytes).
                proc.state.rollback()
                del proc.outputs[outputs:]
                del proc.changelog[changelog:]
                proc.tally = tally
                return
            if self._spans_partitions(commands):
                # Across partitions, a batch that cannot be linked decides none of its commands (their homes may be
                # elsewhere: remembered here, one sent alone to its home was decided twice), as judge_placement's;
                # the command its client's policy refuses neither (its policy is judged again, at its home, when
                # it is sent otherwise).
                others = [(index, command) for index, command in commands if command is not failure[0]]
                if denied is not None:
                    self._refuse_each(offset, [(index, command) for index, command in commands
                                               if command is denied[0]], Rejection.LINKED_SPANS_PARTITIONS,
                                      f"not permitted: {denied[1]}; a linked batch across partitions that cannot "
                                      f"be linked decides none of its commands")
                self._refuse_each(offset, others, Rejection.LINKED_SPANS_PARTITIONS, failure[1])
                return
            if denied is not None:
                proc.position = f"{offset}.{next(index for index, command in commands if command is denied[0])}"
                # (Under the ids of a transaction in flight here it is id_conflict, not remembered: remembered,
                # that refusal would be the transaction's decision.)
                if not proc.refused_for_ids_in_flight(denied[0]):
                    proc.reject_command(denied[0], Rejection.NOT_PERMITTED, denied[1])
            self._refuse_others(offset, commands, *failure)
            return
        proc.expire_due(offset, timestamp_ms)
        if copy:  # this partition reserves its share now, at the producer's position; the coordinator answers
            proc.position = f"{offset}.{commands[0][0]}"
            proc.linked_spanning.copy(offset, [command for _, command in commands], coordinator)
            return
        self._judge(offset, commands)

    def _spans_partitions(self, commands: list[tuple[int, core.Command]]) -> bool:
        """Whether these commands, as the engine routes them, touch a partition besides this one."""
        routes = [self.proc.route(command) for _, command in commands]
        return linked.judge_placement((self._touched(route) for route in routes), self.proc.partition) is not None

    def _seen(self, command: core.Command) -> bool:
        return self.proc.state.processed((command.client_id, command.command_id)) is not None

    def _judge(self, offset: int, commands: list[tuple[int, core.Command]]) -> None:
        proc = self.proc
        # A producer's copy of a transaction placed in several partitions is its coordinator's to answer
        # (PartitionProcessor.judge): not answered here; the batch cannot hold it.
        copies = [(index, command) for index, command in commands
                  if isinstance(command, core.PostTransaction) and proc.spanning.is_copy(command)]
        if copies:
            others = [(index, command) for index, command in commands if (index, command) not in copies]
            self._refuse_each(offset, others, Rejection.LINKED_SPANS_PARTITIONS,
                              f"linked with {copies[0][1].command_id}, a transaction placed in several partitions")
            return
        # Where the commands live is looked at first: across partitions, a command under way here fails the
        # batch in the two-phase protocol (its home votes in_flight), and each other command's answer is
        # recorded at its own home. Refused here, the others' answers would be remembered in a partition that
        # is not their home, a second decision once one is sent alone to its home.
        routes = [proc.route(command) for _, command in commands]
        misplaced = linked.judge_placement((self._touched(route) for route in routes), proc.partition)
        if misplaced is not None:
            self._across(offset, commands, routes)
            return
        for index, command in commands:
            if proc.spanning.under_way(command):  # a retry: answered when that transaction is decided
                proc.position = f"{offset}.{index}"
                proc.spanning.begin(command, offset)
                self._refuse_others(offset, commands, command, linked.waiting_on(command.command_id))
                return
        for index, command in commands:
            if proc.linked_spanning.in_flight(command):  # a retry: answered when its linked batch is decided
                proc.position = f"{offset}.{index}"
                proc.linked_spanning.retry(command, offset)
                self._refuse_others(offset, commands, command, linked.waiting_on(command.command_id))
                return
        for index, command in commands:
            if not isinstance(command, core.PostTransaction):
                proc.position = f"{offset}.{index}"
                if proc.refused_for_ids_in_flight(command):  # answered id_conflict, not remembered
                    self._refuse_others(offset, commands, command,
                                        linked.failed(command.command_id, Rejection.ID_CONFLICT.code))
                    return
        credited: dict[str, int] = {}  # what the batch's earlier commands credit, per account
        for (index, command), route in zip(commands, routes):
            if self._seen(command):
                continue  # a retry: its stored answer stands (execute_linked gives it)
            proc.position = f"{offset}.{index}"
            refusal = route.refusal or self._locked(command) or proc.spanning.refusal(command)
            if refusal is None and proc.spanning.waits(command, credited, can_wait=False):
                refusal = (Rejection.IN_FLIGHT, "it would wait for a transaction in flight, and a linked batch is "
                                                "decided at once or not at all; send it again once that is decided")
            if refusal is not None:
                proc.reject_command(command, *refusal)
                self._refuse_others(offset, commands, command, linked.failed(command.command_id, refusal[0].code))
                return
            if not proc.open_shards(list(route.shards), command, offset):  # answered unknown_currency
                self._refuse_others(offset, commands, command,
                                    linked.failed(command.command_id, Rejection.UNKNOWN_CURRENCY.code))
                return
            if isinstance(command, core.PostTransaction):
                for leg in command.legs:
                    if leg.amount > 0:
                        credited[leg.account_id] = credited.get(leg.account_id, 0) + leg.amount
        # As routed; a command decided before whose route has no command (a refusal) as sent: the core
        # answers it from the inbox without judging it.
        routed = [command if route.command is None else route.command for (_, command), route in zip(commands, routes)]
        fingerprints = [command.fingerprint() for _, command in commands]
        decided = linked.execute_linked(proc.state, routed, proc.currencies, fingerprints)
        for (index, _), command, fingerprint, (result, changes) in zip(commands, routed, fingerprints, decided):
            self._answer(offset, index, command, result, changes, fingerprint)

    def _across(self, offset: int, commands: list[tuple[int, core.Command]], routes: list["Route"]) -> None:
        """A batch touching partitions besides this one: one unit of the two-phase protocol, coordinated here
        (streams/spanning_linked.py), when every command is a transaction it carries; else every command is
        refused linked_spans_partitions."""
        proc = self.proc
        outside = proc.linked_spanning.outside_scope([command for _, command in commands])
        if outside is not None:
            self._refuse_each(offset, commands, *outside)
            return
        proc.position = f"{offset}.{commands[0][0]}"
        proc.linked_spanning.begin(offset, [command for _, command in commands], [route.refusal for route in routes],
                                   commands[0][1].at_ms)

    def _locked(self, command: core.Command) -> tuple[Rejection, str] | None:
        """A capture of a hold a transaction in flight has locked part of is refused in a linked batch: the
        spanning checks judge one command against the locks, and several captures of the batch together
        could take the locked part."""
        if isinstance(command, core.PostTransaction):
            for leg in command.legs:
                if leg.hold_id is not None and self.proc.spanning.locked(leg.hold_id):
                    return (Rejection.IN_FLIGHT, f"hold {leg.hold_id} is reserved in part by a transaction in "
                                                 f"flight; a linked batch does not capture it meanwhile")
        return None

    def _touched(self, route: "Route") -> set[int]:
        """The partitions a command touches as the engine routes it."""
        if route.elsewhere is not None:
            return {route.elsewhere}
        return set(route.spans) or {self.proc.partition}

    def _refuse_each(self, offset: int, commands: list[tuple[int, core.Command]], reason: Rejection,
                     detail: str) -> None:
        """Every command refused for one reason (the batch as a whole cannot be linked)."""
        answers = linked.refuse_all(self.proc.state, [command for _, command in commands], reason, detail)
        for (index, command), (result, changes) in zip(commands, answers):
            self._answer(offset, index, command, result, changes)

    def _refuse_others(self, offset: int, commands: list[tuple[int, core.Command]], failing: core.Command | None,
                       failure: str) -> None:
        proc = self.proc
        others = [(index, command) for index, command in commands if command is not failing]
        answers = linked.others_refused(proc.state, [command for _, command in others], None, failure)
        for (index, command), (result, changes) in zip(others, answers):
            self._answer(offset, index, command, result, changes)

    def _answer(self, offset: int, index: int, command: core.Command, result: core.Result, changes: core.Changes,
                fingerprint: str | None = None) -> None:
        """Persist and answer one command's decision, as PartitionProcessor.execute does."""
        proc = self.proc
        proc.position, proc.kind = f"{offset}.{index}", type(command).__name__
        if changes.processed is not None and not result.accepted:
            # A command in flight here (of a linked batch across partitions, or a transaction under way) is
            # decided by that, once: sent again in this batch it is a retry, answered with that decision. A
            # refusal recorded for it now would be a second decision of its id, and the answer its own decision
            # then gives (linked_failed for a transaction that posted).
            if proc.linked_spanning.in_flight(command):
                proc.linked_spanning.retry(command, offset)
                return
            if proc.spanning.under_way(command):
                proc.spanning.begin(command, offset)
                return
            if proc.refused_for_ids_in_flight(command):  # another kind of command under those ids
                return
        if changes.processed is None:  # a duplicate or an id conflict: answered, nothing written
            proc.emit_result(result_to_wire(result, command.at_ms, None, []))
            return
        proc.record_decision(command, result, changes, offset, fingerprint or command.fingerprint())
        if not result.accepted and isinstance(command, core.PostTransaction) and placement.is_placed(command.metadata):
            proc.spanning.cancel_copies(command)  # as for any refusal: its copies' reservations end now
