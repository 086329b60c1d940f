"""The promises of DESIGN.md §2 as checks over a Bus: after any step (committed state and the outputs so far)
and once quiet. Each check reads what a reader of the topics or of the partitions' stores could read; none
trusts the processors' own assertions.

After every step:
  P1  every currency sums to zero over all accounts (system shards and clearing included);
  P2  no account that may not go negative is below its floor counting held, in its state or in any history
      entry (history carries posted and held after each change);
  P3  per account, history seqs are gapless from 1, an entry emitted twice is byte-identical (a redo), and
      the state's seq was emitted;
  P4  a (client, command) id is decided at most once (one changelog record ledger-wide), its decision is one
      result, and once decided every later non-duplicate answer for it is that decision;
  P5  an ended hold has captured + released == amount; an account's held equals the remaining of its open
      holds; a hold's locked part (multi-partition reservations) is open and never more than what remains.
Once quiet:
  P6  clearing is empty, no engine record (``e/``) is left, no internal hold is open;
  P8  every command sent has an answer;
  P7  each partition rebuilt from its changelog alone equals its live store, byte for byte; every account's
      seq is the last one in history.
"""
from __future__ import annotations

import json
from collections import defaultdict

from schemas.codec import codec
from streams.core import HoldStatus, Rejection
from streams.routing import ENGINE_CLIENT
from streams.spanning import INTERNAL_HOLD_MARK
from streams.store import MemoryStore
from streams.partition import CHANGELOG_OFFSET_KEY, PartitionProcessor
from streams.wire import account_from_record, hold_from_record

_ENVELOPE_REFUSED = b"#" + Rejection.LINKED_SPANS_PARTITIONS.code.encode()
from tests.helpers.bus import Bus

C = codec()


class Oracles:
    def __init__(self, bus: Bus):
        self.bus = bus
        self.sent: dict[bytes, bytes] = {}  # client_id/command_id -> the command's bytes (last sent)
        self._history_seen = 0
        self._entries: dict[str, bytes] = {}  # entry id (account#seq) -> bytes
        self._seqs: dict[str, set[int]] = defaultdict(set)
        self._results_seen = 0
        self._decision: dict[bytes, bytes] = {}  # key -> the result decided for it
        self._changelog_seen = {p: 0 for p in range(bus.n)}
        self._decided_in: dict[bytes, int] = {}  # key -> partition whose changelog holds its decision
        self._policies: dict[str, int | None] = {}  # account id -> its floor (None: may go negative)
        self._unchecked: list[dict] = []  # history entries whose account has no committed state yet

    def sent_command(self, value: bytes) -> None:
        record = C.decode("command", value)
        self.sent[f"{record['client_id']}/{record['command_id']}".encode()] = value

    # --- after every step -----------------------------------------------------------------------------------
    def check_step(self) -> None:
        accounts, holds = self._state()
        self._p1(accounts)
        self._p2(accounts)
        self._p3(accounts)
        self._p4()
        self._p5(accounts, holds)

    def _state(self):
        accounts, holds = {}, {}
        for p in range(self.bus.n):
            for _, value in self.bus.stored(p, b"a/"):
                a = account_from_record(json.loads(value))
                assert a.id not in accounts, f"account {a.id} stored in two partitions"
                accounts[a.id] = (p, a)
                self._policies[a.id] = a.floor
            for _, value in self.bus.stored(p, b"h/"):
                h = hold_from_record(json.loads(value))
                holds[h.id] = (p, h)
        return accounts, holds

    def _p1(self, accounts) -> None:
        totals: dict[str, int] = defaultdict(int)
        for _, a in accounts.values():
            totals[a.currency] += a.posted
        assert not any(totals.values()), f"P1: the books do not balance: {dict(totals)}"

    def _p2(self, accounts) -> None:
        for _, a in accounts.values():
            assert a.floor is None or a.available >= a.floor, \
                f"P2: {a.id} below its floor: posted {a.posted} held {a.held}"

    def _p3(self, accounts) -> None:
        bus = self.bus
        for (_, value), entry in zip(bus.history_bytes[self._history_seen:], bus.history[self._history_seen:]):
            entry_id = entry["entry_id"]  # account#seq
            known = self._entries.setdefault(entry_id, value)
            assert known == value, f"P3/P7: history entry {entry_id!r} emitted twice with different content"
            self._seqs[entry["account_id"]].add(entry["seq"])
            self._unchecked.append(entry)
        still = []
        for entry in self._unchecked:  # P2 over history, once the account's policy is known (its state)
            if entry["account_id"] not in self._policies:
                still.append(entry)
                continue
            floor = self._policies[entry["account_id"]]
            available = int(entry["posted_after"]) - int(entry["held_after"])
            assert floor is None or available >= floor, f"P2: history of {entry['account_id']} crosses its floor: {entry}"
        self._unchecked = still
        self._history_seen = len(bus.history)
        for account_id, seqs in self._seqs.items():
            assert seqs == set(range(1, max(seqs) + 1)), \
                f"P3: {account_id} history seqs have gaps: {sorted(set(range(1, max(seqs) + 1)) - seqs)}"
        for account_id, (_, a) in accounts.items():
            assert a.seq in self._seqs.get(account_id, ()), f"P3: {account_id} at seq {a.seq} never emitted"

    def _p4(self) -> None:
        bus = self.bus
        for p in range(bus.n):
            for encoded in bus.changelogs[p][self._changelog_seen[p]:]:
                change = C.decode("state", encoded)
                key = f"{change['client_id']}/{change['command_id']}".encode()
                assert key not in self._decided_in, (
                    f"P4: {key!r} decided twice (changelogs of partitions {self._decided_in[key]} and {p})")
                self._decided_in[key] = p
            self._changelog_seen[p] = len(bus.changelogs[p])
        for emitted in bus.emitted[self._results_seen:]:
            key = emitted.key
            if emitted.result["duplicate"]:
                continue
            decision = self._decision.get(key)
            if decision is not None:
                assert emitted.value == decision, (
                    f"P4: {key!r} answered {C.decode('result', emitted.value)} after its decision "
                    f"{C.decode('result', decision)}")
            elif emitted.remembered:
                self._decision[key] = emitted.value
        self._results_seen = len(bus.emitted)

    def _p5(self, accounts, holds) -> None:
        held: dict[str, int] = defaultdict(int)
        for hold_id, (p, h) in holds.items():
            if h.status is HoldStatus.OPEN:
                assert h.remaining > 0, f"P5: hold {hold_id} open with nothing remaining"
                held[h.account_id] += h.remaining
            else:
                assert h.captured + h.released == h.amount, \
                    f"P5: hold {hold_id} {h.status.value}: captured {h.captured} + released {h.released} != {h.amount}"
            assert accounts[h.account_id][0] == p, f"P5: hold {hold_id} not in its account's partition"
        for account_id, (_, a) in accounts.items():
            assert a.held == held.get(account_id, 0), \
                f"P5: {account_id} holds {a.held} but its open holds have {held.get(account_id, 0)} remaining"
        for p in range(self.bus.n):
            for key, value in self.bus.stored(p, b"e/l/"):
                hold_id = key[len(b"e/l/"):].decode()
                locked = sum(json.loads(value).values())
                hold = holds.get(hold_id, (None, None))[1]
                assert hold is not None and hold.status is HoldStatus.OPEN, \
                    f"P5: hold {hold_id} locked by a transaction in flight but {hold and hold.status.value}"
                assert locked <= hold.remaining, \
                    f"P5: {locked} of hold {hold_id} locked by transactions in flight, {hold.remaining} remains"

    # --- once quiet -----------------------------------------------------------------------------------------
    def check_quiet(self) -> None:
        bus = self.bus
        assert bus.quiet
        self.check_step()
        accounts, holds = self._state()
        clearing: dict[str, int] = defaultdict(int)
        for account_id, (_, a) in accounts.items():
            if account_id.startswith("sys:clearing:"):
                clearing[a.currency] += a.posted
                assert a.held == 0, f"P6: {account_id} holds {a.held}"
            assert a.seq == max(self._seqs[account_id]), f"P7: {account_id} at seq {a.seq}, history further"
        assert not any(clearing.values()), f"P6: money left in clearing: {dict(clearing)}"
        for p in range(bus.n):
            assert not bus.stored(p, b"e/"), f"P6: engine records left in partition {p}: {bus.stored(p, b'e/')}"
        for hold_id, (_, h) in holds.items():
            assert not (hold_id.startswith(INTERNAL_HOLD_MARK) and h.status is HoldStatus.OPEN), \
                f"P6: internal hold {hold_id} still open"
        answered = {e.key for e in bus.emitted}
        # answered, not decided: a batch that could not be linked (its own result key, partition.result_key)
        answered |= {k.removesuffix(_ENVELOPE_REFUSED) for k in answered if k.endswith(_ENVELOPE_REFUSED)}
        missing = [k for k in self.sent if k not in answered]
        assert not missing, f"P8: commands without an answer: {missing}"
        for p in range(bus.n):  # P7: the changelog alone rebuilds the partition
            rebuilt = MemoryStore()
            PartitionProcessor(p, bus.n, rebuilt).restore(bus.changelogs[p], len(bus.changelogs[p]))
            live = {CHANGELOG_OFFSET_KEY: b"0", **bus.stores[p].data}  # absent until the first commit
            assert rebuilt.data == live, f"P7: partition {p} rebuilt from its changelog differs"

    def answers(self, client_id: str, command_id: str) -> list[dict]:
        key = f"{client_id}/{command_id}".encode()
        return [e.result for e in self.bus.emitted if e.key == key]


__all__ = ["Oracles", "ENGINE_CLIENT"]
