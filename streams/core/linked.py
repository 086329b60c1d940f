"""Linked commands: several commands that take effect together or not at all (TigerBeetle's linked events,
ledger-core's Journal.extend). Pure; decided here once, the engine only supplies where each command lives.

``execute_linked(state, commands)`` decides the commands in order, each against the state the ones before it
leave (their changes staged on an overlay, nothing written). If every one is accepted (or a duplicate), each
gets its own result and changes, exactly those it would have had sent one by one in that order. If one is
refused, none takes effect: it keeps its own reason, and every other command is refused ``linked_failed``
with a detail naming it. Every answer is remembered (the inbox entry is the only change), so a retry of the
batch is answered the same; the ids are spent, like any rejection's. A command already decided before (a
duplicate) keeps its stored answer and is not written again.

``judge_placement`` tells whether every command lives in the partition deciding the batch; ``refuse_all``
answers a batch that cannot be linked at all, remembering nothing (it decides none of its commands). A batch of
transactions across partitions is one unit of the two-phase protocol (streams/spanning_linked.py,
docs/wallet-operations.md), decided by the rules below: each partition judges its shares in batch order
(``first_refused``), reserves what their running sums take from and add to each account (``exposure``), and
the coordinator answers with ``first_failure`` of the votes and ``unit_answers``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from streams.core.commands import Command
from streams.core.decide import execute
from streams.core.model import Account, Hold, PostedTransaction, RateSnapshot
from streams.core.money import DEFAULT_CURRENCIES, CurrencyRegistry
from streams.core.rejections import Rejection, transaction_urgency
from streams.core.results import ACCEPTED, REJECTED, Processed, Result
from streams.core.state import Changes, InboxKey, StateReader


class _Staged:
    """state with the changes of the batch's earlier commands on top."""

    def __init__(self, state: StateReader) -> None:
        self._state = state
        self.accounts: dict[str, Account] = {}
        self.holds: dict[str, Hold] = {}
        self.inbox: dict[InboxKey, Processed] = {}
        self.transactions: dict[str, PostedTransaction] = {}
        self.rates: dict[str, RateSnapshot] = {}

    def account(self, account_id: str) -> Account | None:
        found = self.accounts.get(account_id)
        return found if found is not None else self._state.account(account_id)

    def hold(self, hold_id: str) -> Hold | None:
        found = self.holds.get(hold_id)
        return found if found is not None else self._state.hold(hold_id)

    def processed(self, key: InboxKey) -> Processed | None:
        found = self.inbox.get(key)
        return found if found is not None else self._state.processed(key)

    def transaction(self, transaction_id: str) -> PostedTransaction | None:
        found = self.transactions.get(transaction_id)
        return found if found is not None else self._state.transaction(transaction_id)

    def rate(self, snapshot_id: str) -> RateSnapshot | None:
        found = self.rates.get(snapshot_id)
        return found if found is not None else self._state.rate(snapshot_id)

    def stage(self, changes: Changes) -> None:
        self.accounts.update(changes.accounts)
        self.holds.update(changes.holds)
        self.transactions.update(changes.transactions)
        self.rates.update((r.snapshot_id, r) for r in changes.rates)
        if changes.processed is not None:
            key, processed = changes.processed
            self.inbox[key] = processed


def _refused(state: StateReader, command: Command, reason: Rejection, detail: str,
             fingerprint: str | None = None) -> tuple[Result, Changes]:
    """A refusal remembered under the command's key (a duplicate keeps its stored answer instead).
    fingerprint: as for execute (default: the command's own)."""
    key = (command.client_id, command.command_id)
    seen = state.processed(key)
    fingerprint = fingerprint or command.fingerprint()
    if seen is not None:
        if seen.fingerprint == fingerprint:
            return dataclasses.replace(seen.result, duplicate=True), Changes({}, {}, (), None)
        return Result(command.command_id, command.client_id, REJECTED, Rejection.ID_CONFLICT,
                      f"command {command.command_id} of {command.client_id} was already used with another "
                      f"payload", ()), Changes({}, {}, (), None)
    result = Result(command.command_id, command.client_id, REJECTED, reason, detail, ())
    if not command.command_id or not command.client_id:
        return result, Changes({}, {}, (), None)
    return result, Changes({}, {}, (), (key, Processed(fingerprint, result)))


def execute_linked(state: StateReader, commands: Sequence[Command],
                   currencies: CurrencyRegistry = DEFAULT_CURRENCIES,
                   fingerprints: Sequence[str | None] | None = None) -> list[tuple[Result, Changes]]:
    """One (result, changes) per command, in order: all accepted with their changes, or all refused (the
    failing one with its reason, the others linked_failed). Commit the changes in order, as for execute.
    fingerprints: per command, the fingerprint a retry is compared with when the engine rewrote the command
    it was sent (execute's argument); default: each command's own."""
    staged = _Staged(state)
    decided: list[tuple[Result, Changes]] = []
    registry = currencies
    for index, command in enumerate(commands):
        fingerprint = None if fingerprints is None else fingerprints[index]
        result, changes = execute(staged, command, registry, fingerprint)
        if not result.accepted:
            # The others are answered after the failing one's answer, each after the one before it: an id
            # the batch holds twice is decided once (the second copy is its duplicate, or an id conflict).
            failed_state = _Staged(state)
            failed_state.stage(changes)
            others = iter(others_refused(failed_state, commands, command,
                                         failed(command.command_id, result.reason.code), fingerprints))
            return [(result, changes) if other is command else next(others) for other in commands]
        staged.stage(changes)
        for currency in changes.currencies:
            registry = registry.with_currency(currency)
        decided.append((result, changes))
    return decided


def others_refused(state: StateReader, commands: Sequence[Command], failing: Command | None, failure: str,
                   fingerprints: Sequence[str | None] | None = None) -> list[tuple[Result, Changes]]:
    """The answer of every command of a linked batch but `failing` (None: the failing item was no command,
    e.g. undecodable): linked_failed, the detail naming what failed (failure, see failed), each remembered.
    Answered in order, each after the ones before it (an id held twice is decided once)."""
    staged = _Staged(state)
    out = []
    for index, other in enumerate(commands):
        if other is failing:
            continue
        result, changes = _refused(staged, other, Rejection.LINKED_FAILED, failure,
                                   None if fingerprints is None else fingerprints[index])
        staged.stage(changes)
        out.append((result, changes))
    return out


def failed(name: str, reason: str) -> str:
    """The detail of a linked_failed answer: which item of the batch failed, and its reason code."""
    return f"linked with {name}, which was refused {reason}"


def waiting_on(name: str) -> str:
    """The detail of a linked_failed answer when an item is a retry of a transaction in flight: it is
    answered when that transaction is decided, so the batch cannot take effect as one."""
    return f"linked with {name}, a transaction in flight that is answered when it is decided"


def judge_placement(partitions: Iterable[Iterable[int]], here: int) -> tuple[Rejection, str] | None:
    """None when every command of a linked batch lives in `here`, the partition deciding it (partitions: per
    command, the partitions it touches, as the engine routes it), else why the batch is refused."""
    touched = sorted({p for command in partitions for p in command})
    if touched and touched != [here]:
        return (Rejection.LINKED_SPANS_PARTITIONS,
                f"a linked batch is decided in the partition it is sent to ({here}); its commands touch "
                f"partitions {touched}")
    return None


def refuse_all(state: StateReader, commands: Sequence[Command], reason: Rejection,
               detail: str) -> list[tuple[Result, Changes]]:
    """Every command of a batch refused for one reason that concerns the batch, not any command of it (a batch
    that cannot be linked: linked_spans_partitions): answered, never remembered, so the answer is not the
    command's decision (rejections.NOT_A_DECISION). Such a batch may reach a partition that is not the home of
    its commands, and a decision remembered there would be a second one once a command is sent alone to its
    home. A command decided before keeps its stored answer (a duplicate), or is an id_conflict."""
    empty = Changes({}, {}, (), None)
    return [(_refused(state, command, reason, detail)[0], empty) for command in commands]


# --- a linked batch across partitions: one unit of the two-phase protocol -------------------------------------
Failure = tuple[int, Rejection, str]  # (index of the command in the batch, its reason, the detail)


def first_refused(state: StateReader, commands: Sequence[Command],
                  currencies: CurrencyRegistry = DEFAULT_CURRENCIES) -> Failure | None:
    """The commands decided in order, each against what the ones before it staged (execute_linked's rule),
    nothing remembered: the first one refused, or None when every one is accepted. A partition judges its
    shares of a linked batch across partitions so: an item may spend what an earlier item credited to the
    same account (an account lives in one partition, so its whole story in the batch is judged here)."""
    staged = _Staged(state)
    registry = currencies
    for index, command in enumerate(commands):
        result, changes = execute(staged, command, registry)
        if not result.accepted:
            return index, result.reason, result.detail
        staged.stage(changes)
        for currency in changes.currencies:
            registry = registry.with_currency(currency)
    return None


def exposure(legs: Iterable[Iterable[tuple[str, int]]]) -> dict[str, tuple[int, int]]:
    """Per account, (the most the commands, posted in order, take from it at any point, the most they add to it
    at any point), both >= 0, from their running sums (a command's legs post together: its net change counts).
    A partition reserves these while the batch is in flight: the first as a hold (whatever else happens
    meanwhile, the lowest point stays within the account's limits), the second counted against a cap like any
    credit in flight."""
    running: dict[str, int] = {}
    lowest: dict[str, int] = {}
    highest: dict[str, int] = {}
    for command_legs in legs:
        net: dict[str, int] = {}
        for account_id, amount in command_legs:
            net[account_id] = net.get(account_id, 0) + amount
        for account_id, amount in net.items():
            total = running[account_id] = running.get(account_id, 0) + amount
            lowest[account_id] = min(lowest.get(account_id, 0), total)
            highest[account_id] = max(highest.get(account_id, 0), total)
    return {account_id: (-lowest[account_id], highest[account_id]) for account_id in running}


def first_failure(failures: Iterable[Failure]) -> Failure | None:
    """What a linked batch across partitions fails on, from the participants' refusals: the earliest command
    (the one a partition deciding the batch in order meets first), and among several refusals of it the most
    urgent (transaction_urgency, as one partition weighs a transaction's stages), details breaking ties."""
    return min(failures, key=lambda f: (f[0], transaction_urgency(f[1]), f[2]), default=None)


def unit_answers(commands: Sequence[Command], failure: Failure | None) -> list[Result]:
    """The answer of each command of a linked batch decided as one unit: every one accepted, or the failing
    one refused with its reason and every other linked_failed naming it (as execute_linked answers)."""
    if failure is None:
        return [Result(c.command_id, c.client_id, ACCEPTED, None, "", ()) for c in commands]
    index, reason, detail = failure
    because = failed(commands[index].command_id, reason.code)
    return [Result(c.command_id, c.client_id, REJECTED, reason, detail, ()) if i == index else
            Result(c.command_id, c.client_id, REJECTED, Rejection.LINKED_FAILED, because, ())
            for i, c in enumerate(commands)]
