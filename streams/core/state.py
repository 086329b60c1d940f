"""The port between the pure core and storage: what a decision reads and what it writes.

The engine implements StateReader over RocksDB and writes a Changes in one atomic batch. Changes holds
complete new records (never deltas), so writing it twice is harmless (redo-safe) and replay is byte-identical.
MemoryState is the in-memory adapter for tests, benchmarks and the reference of the contract suite.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from streams.core.model import Account, HistoryEntry, Hold, PostedTransaction, RateSnapshot
from streams.core.money import Currency
from streams.core.results import Processed, Result

__all__ = ["StateReader", "Changes", "MemoryState", "Processed", "Result", "InboxKey", "WithAccounts"]

# (client_id, command_id): the idempotency key of a command.
InboxKey = tuple[str, str]


class StateReader(Protocol):
    """Read access to the records one partition owns. Returns None for records that do not exist."""

    def account(self, account_id: str) -> Account | None: ...

    def hold(self, hold_id: str) -> Hold | None: ...

    def processed(self, key: InboxKey) -> Processed | None: ...

    def transaction(self, transaction_id: str) -> PostedTransaction | None: ...

    def rate(self, snapshot_id: str) -> RateSnapshot | None: ...


class WithAccounts:
    """A StateReader: state, with some accounts as given instead of as stored (an account a decision opens
    before it posts to it; an account seen as it would be with credits in flight posted: streams/spanning.py)."""

    __slots__ = ("_state", "_accounts")

    def __init__(self, state: StateReader, accounts: dict[str, Account]) -> None:
        self._state, self._accounts = state, accounts

    def account(self, account_id: str) -> Account | None:
        found = self._accounts.get(account_id)
        return found if found is not None else self._state.account(account_id)

    def hold(self, hold_id: str) -> Hold | None:
        return self._state.hold(hold_id)

    def processed(self, key: InboxKey) -> Processed | None:
        return self._state.processed(key)

    def transaction(self, transaction_id: str) -> PostedTransaction | None:
        return self._state.transaction(transaction_id)

    def rate(self, snapshot_id: str) -> RateSnapshot | None:
        return self._state.rate(snapshot_id)


@dataclass(frozen=True, slots=True)
class Changes:
    """Everything one decision writes, complete, to be persisted atomically.

    Commit path (engine and MemoryState): 1. put every account, 2. put every hold, 3. append history in order,
    4. put the inbox entry. All four in one write batch, so a crash leaves all of them or none.
    """

    accounts: dict[str, Account]  # full new record of every account the decision changed
    holds: dict[str, Hold]  # full new record of every hold the decision created or changed
    history: tuple[HistoryEntry, ...]  # one entry per change to an account, in the order they happened
    processed: tuple[InboxKey, Processed] | None  # the inbox entry; None for a duplicate or an id_conflict
    # full new record of every transaction the decision posted or marked reversed (written with step 2)
    transactions: dict[str, PostedTransaction] = field(default_factory=dict)
    # currencies the decision registered (the engine adds them to its partition's registry)
    currencies: tuple[Currency, ...] = ()
    # FX rate snapshots the decision recorded
    rates: tuple[RateSnapshot, ...] = ()

    @property
    def is_empty(self) -> bool:
        """True when nothing is to be written (a duplicate delivery or an id conflict)."""
        return not (self.accounts or self.holds or self.history or self.processed or self.transactions
                    or self.currencies or self.rates)


def no_changes() -> Changes:
    """The Changes of a duplicate or a conflict: nothing at all."""
    return Changes({}, {}, (), None)


class MemoryState:
    """An in-memory StateReader that also keeps the full history, for tests and benchmarks."""

    __slots__ = ("accounts", "holds", "inbox", "history", "transactions", "rates")

    def __init__(self) -> None:
        self.accounts: dict[str, Account] = {}  # account id -> current record
        self.holds: dict[str, Hold] = {}  # hold id -> current record
        self.inbox: dict[InboxKey, Processed] = {}  # decided command keys
        self.history: list[HistoryEntry] = []  # every history entry, in commit order
        self.transactions: dict[str, PostedTransaction] = {}  # posted transactions, for reversals
        self.rates: dict[str, RateSnapshot] = {}  # recorded FX rate snapshots

    def account(self, account_id: str) -> Account | None:
        return self.accounts.get(account_id)

    def hold(self, hold_id: str) -> Hold | None:
        return self.holds.get(hold_id)

    def processed(self, key: InboxKey) -> Processed | None:
        return self.inbox.get(key)

    def transaction(self, transaction_id: str) -> PostedTransaction | None:
        return self.transactions.get(transaction_id)

    def rate(self, snapshot_id: str) -> RateSnapshot | None:
        return self.rates.get(snapshot_id)

    def commit(self, changes: Changes) -> None:
        """Write changes (the four commit steps in order). Asserts that per-account seq stays gapless (P3)."""
        expected_seq: dict[str, int] = {}
        for entry in changes.history:
            previous = expected_seq.get(entry.account_id)
            if previous is None:
                known = self.accounts.get(entry.account_id)
                previous = known.seq if known is not None else 0
            assert entry.seq == previous + 1, f"seq gap on {entry.account_id}: {previous} -> {entry.seq}"
            expected_seq[entry.account_id] = entry.seq
        for account_id, account in changes.accounts.items():
            assert expected_seq.get(account_id) == account.seq, f"account {account_id} seq without history"
        # 1. accounts, 2. holds, 3. history, 4. inbox
        self.accounts.update(changes.accounts)
        self.holds.update(changes.holds)
        self.transactions.update(changes.transactions)
        self.rates.update((r.snapshot_id, r) for r in changes.rates)
        self.history.extend(changes.history)
        if changes.processed is not None:
            key, processed = changes.processed
            self.inbox[key] = processed

    def history_of(self, account_id: str) -> list[HistoryEntry]:
        """The journal of one account, in seq order."""
        return [entry for entry in self.history if entry.account_id == account_id]
