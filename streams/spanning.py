"""Transactions whose legs live in several partitions: reserve everywhere, then commit or release.

Where each leg lives, which partition coordinates and which take part is streams/placement.py's rule (the
coordinator is one of the participants, and takes the legs on system accounts). Every step is a command on the commands
topic with a deterministic id derived from the transaction's key T = ``client_id/command_id``, and every
step's state is an engine record written in the same StateChange as its effects, so a crash or redelivery
anywhere repeats a step harmlessly (the inbox answers it) and in-flight state is durable and visible.

1. begin (coordinator): record ``c/T`` (transaction, participants, votes) and send Reserve to each.
2. Reserve (participant): for each account with plain debits, an internal hold ``~T~<account>`` of their
   sum (a core PlaceHold: every funds, status and overdraft rule applies); for each debit that captures a
   client hold, a lock on that amount of the hold (open, not expired, enough unlocked remainder); each
   credit is judged by the core as it will post (from the clearing shard, on top of the credits other
   transactions in flight reserved on the account: ``n/<account>``). All or nothing, in one StateChange: the
   internal holds are placed in the step's own StateChange, only once every leg is judged to fit. Record
   ``r/T``; Vote back with the most urgent failure.
3. Vote (coordinator): when every vote is in, the transaction is decided: accepted when every participant
   reserved, else rejected with the failure of the highest precedence. That result is the sender's answer
   and it is final: the same answer, for the same reason, as if every account lived in one partition.
   Then Decide(commit) or Decide(abort) to every participant that reserved.
4. Decide (participant): commit = the Decide step ``T~decide~<p>`` posts, under the transaction's own id,
   this partition's legs (captured internal holds and locked amounts, credits, and at the coordinator the
   legs on system accounts) against the local clearing shard, judged at the reservation's time (what was
   reserved cannot be refused); abort = release the internal holds. Locks are dropped either way.

Until step 4 the money stays where it was, reserved: no leg of the transaction posts anywhere unless every
partition has reserved its legs (P6), and clearing sums to zero once every step has run.
While a hold is locked it cannot be released or expired, and captures may only take its unlocked rest; a
release, expiry, freeze or close of what a reservation holds waits for the decision, and so does a debit the
credits in flight to its account could fund (see ``waits``; the queue is streams/waiting.py).
"""
from __future__ import annotations

import hashlib
from collections import defaultdict
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import json

from streams import core, limits, names, placement, routing
from streams.inflight import (InFlight, Reservation, coordinator_key, copy_due_key, reservation_key, returning_key,
                              vote_owed_key)
from streams.waiting import COPIED_CREDIT_WAIT_MS, COPIED_WAIT_OVER, waiting_key
from streams.names import INTERNAL_HOLD_MARK
from streams.core import HoldStatus, Leg, Rejection, fx, returns, settlement
from streams.core.state import WithAccounts
from streams.routing import ENGINE_CLIENT
from streams.wire import (command_from_wire, command_record, command_to_wire, holds_to_wire, rejection_to_wire,
                          result_to_wire)

if TYPE_CHECKING:
    from streams.partition import PartitionProcessor

SPANNING_KINDS = frozenset({"Reserve", "Vote", "Decide"})
VOTE_DETAIL_CHARS = 256  # a vote's detail is kept in the coordinator's record, one per participant
# How long (log time of the participant) a copy's reservation waits for the coordinator's Reserve before it is
# dropped: the coordinator never got the command (its producer died between the sends, or wrote a copy only).
COPY_WAIT_MS = 300_000
# Each copy's reservation not yet confirmed has its own record, inflight.copy_due_key. Earlier versions kept them
# all in this one engine record, [[due_ms, transaction key]]: read and emptied, never written any more.
COPY_TIMEOUTS = "o"
WAITING = "w"  # engine record of earlier versions: every waiting command in one list (streams/waiting.py)
WAITING_LIMIT = 1_000  # beyond it a command that would wait is refused in_flight
_MEMO_SIZE = 16  # values kept by the identity memos below (Spanning.plan, Spanning._transaction)


def _most_urgent(failures: list[tuple[Rejection, str]]) -> tuple[Rejection, str]:
    """The failure one partition would have answered with (core.transaction_urgency), details breaking ties."""
    return min(failures, key=lambda f: (core.transaction_urgency(f[0]), f[1]))


def _fingerprint(kind: str, body: dict) -> str:
    return hashlib.sha256(repr((kind, sorted(body.items()))).encode()).hexdigest()


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return value


LATE_DETAIL = "a hold it captures had ended: settled late"


def _in_flight_on(returned: returns.Returned | None) -> tuple[str, ...]:
    """The payments a reserved share of a return holds in flight (returning_key): in the payee's partition,
    which judges what remains unreturned first. The payer's share (its payee is the clearing shard) holds
    none: it never refuses what the payee's partition let through, so returns that partitions see in
    different orders (sent by two producers) do not each refuse the other."""
    if returned is None or names.is_clearing(returned.payee):
        return ()
    return returned.counted


def _accepted(command_id: str, at_ms: int, detail: str = "", holds: list[core.Hold] = ()) -> dict[str, Any]:
    """An engine step's result. holds: the internal holds it placed (a reservation), as every result names the
    holds its decision created, so readers of results (the read store, P5's oracle) know them."""
    return {"command_id": command_id, "client_id": ENGINE_CLIENT, "outcome": "accepted", "reason": None,
            "detail": detail, "duplicate": False, "transaction_id": None, "at_ms": at_ms,
            "holds": holds_to_wire(holds)}


class Spanning:
    def __init__(self, proc: "PartitionProcessor"):
        self.proc = proc
        # (the earlier versions' list of copies' timeouts as decoded, its earliest due): the state decodes an
        # engine record once until it is written, so the same object means the same timeouts.
        self._earliest: tuple[Any, int] = (None, 0)
        # The plans and decoded transactions of the last few values asked about, by identity (the values are
        # kept here, so an id is not reused meanwhile): one step asks for the same ones several times.
        self._plans: dict[int, tuple[core.PostTransaction, placement.Plan]] = {}
        self._transactions: dict[int, tuple[dict, str, str, int, core.PostTransaction]] = {}
        # The waiting commands as decoded, with the keys they are looked up by, by where they wait
        # (_waiting_command); and whether each is still held back, with the state versions that judgement read
        # (_still_blocked).
        self._decoded: dict[Any, tuple[dict[str, Any], core.Command, list[str] | None]] = {}
        self._judged: dict[Any, tuple[dict[str, Any], tuple[int, int], tuple[tuple[bytes, int], ...], bool]] = {}

    @property
    def state(self):
        return self.proc.state

    # --- guards on clients' commands -------------------------------------------------------------------------
    def locked_amount(self, hold_id: str) -> int:
        locks = self.state.record(f"l/{hold_id}") or {}
        return sum(locks.values())

    def locked(self, hold_id: str) -> bool:
        return bool(self.state.record(f"l/{hold_id}"))

    def plan(self, tx: core.PostTransaction) -> placement.Plan:
        """Where the transaction's legs live and who coordinates (streams/placement.py)."""
        known = self._plans.get(id(tx))
        if known is not None and known[0] is tx:
            return known[1]
        if len(self._plans) >= _MEMO_SIZE:
            self._plans.clear()
        where = placement.plan([(leg.account_id, leg.amount) for leg in tx.legs], self.proc.home)
        self._plans[id(tx)] = (tx, where)
        return where

    def _key_in(self, tx: core.PostTransaction, partition: int) -> str:
        """The routing key of a step sent to `partition`: one of the transaction's accounts there."""
        return routing.routing_key_for(
            placement.account_in([(leg.account_id, leg.amount) for leg in tx.legs], partition, self.proc.home))

    def under_way(self, command: core.Command) -> bool:
        """A client's transaction this partition coordinates and has begun, not yet decided: a retry of it
        is answered when it is decided, before any judgement of holds or locks (which its own reservation
        holds, so they would refuse it)."""
        return isinstance(command, core.PostTransaction) and command.client_id != ENGINE_CLIENT and \
            self.ids_in_flight(names.transaction_key(command.client_id, command.command_id))

    def ids_in_flight(self, key: str) -> bool:
        """A transaction under key T that this partition coordinates and has begun, not yet decided."""
        return self.state.record(coordinator_key(key)) is not None

    def refusal(self, command: core.Command) -> tuple[Rejection, str] | None:
        """Why a client's command may not run while transactions are in flight (None: it may)."""
        if command.client_id == ENGINE_CLIENT:
            return None
        # Clearing is the ledger's own money in flight between partitions: a client that could post to it,
        # freeze or close it would move money that is not its own or stop cross-partition transfers.
        named = [leg.account_id for leg in command.legs] if isinstance(command, core.PostTransaction) else \
            [getattr(command, "account_id", None) or ""]
        for account_id in named:
            if names.is_clearing(account_id):
                return Rejection.INVALID_COMMAND, f"{account_id[:300]} is internal to the ledger"
        if isinstance(command, core.PlaceHold) and command.hold_id.startswith(INTERNAL_HOLD_MARK):
            return Rejection.INVALID_COMMAND, f"hold ids starting with {INTERNAL_HOLD_MARK} are internal to the ledger"
        if isinstance(command, core.PostTransaction):
            spanning = self.plan(command).spans
            drawn: dict[str, int] = defaultdict(int)
            for leg in command.legs:
                if leg.hold_id is not None:
                    if leg.hold_id.startswith(INTERNAL_HOLD_MARK):
                        return Rejection.INVALID_COMMAND, f"hold {leg.hold_id} is internal to the ledger"
                    drawn[leg.hold_id] -= leg.amount
            if spanning:  # each partition's reservation judges its own holds and locks, at its own position
                return None
            for hold_id, amount in drawn.items():
                locked = self.locked_amount(hold_id)
                hold = self.state.hold(hold_id)
                if locked and hold is not None:  # a late settlement in flight locks released money
                    free = (hold.released if settlement.ended(hold) else hold.remaining) - locked
                    if amount > free:
                        return (Rejection.CAPTURE_EXCEEDS_HOLD, f"hold {hold_id}: {free} unreserved, {amount} asked")
        elif isinstance(command, (core.ReleaseHold, core.ExpireHold)):
            if command.hold_id.startswith(INTERNAL_HOLD_MARK):
                return Rejection.INVALID_COMMAND, f"hold {command.hold_id} is internal to the ledger"
            if self.locked(command.hold_id):
                return Rejection.IN_FLIGHT, f"hold {command.hold_id} is reserved by a transaction in flight"
        elif isinstance(command, (core.FreezeAccount, core.CloseAccount)):
            if self.state.record(f"k/{command.account_id}"):
                return Rejection.IN_FLIGHT, f"account {command.account_id} has reservations in flight"
        return None

    # --- step 1: the coordinator begins --------------------------------------------------------------------
    def begin(self, tx: core.PostTransaction, offset: int) -> None:
        proc = self.proc
        key = names.transaction_key(tx.client_id, tx.command_id)
        pending = self._in_flight(key)
        if pending is not None:  # a retry while in flight: answered when decided
            if pending.fingerprint not in (None, proc.fingerprint(tx)):
                proc.reject(tx.command_id, tx.client_id, tx.at_ms, Rejection.ID_CONFLICT,
                             f"command {tx.command_id} of {tx.client_id} was already used with another payload")
                return
            retry_id = names.step_id(key, "retry", proc.position)
            seen = self.state.change_record(ENGINE_CLIENT, retry_id)
            if seen is not None:  # this same retry redone after a crash: counted once, answered as before
                proc.answer_again(seen)
                return
            proc.commit_change(ENGINE_CLIENT, retry_id, "", offset,
                               _accepted(retry_id, tx.at_ms, "answered when decided"),
                               records=[(coordinator_key(key), pending.with_retry().to_json())])
            return
        shape = core.transaction_shape_failures(tx)  # as the core's first stage: before any state is read
        returning = returns.judge_spanning(tx.metadata, tx.legs)
        if not shape and returning is not None:
            proc.reject_command(tx, *returning)
            return
        refusals = shape or self.whole(tx)
        invalid = shape or [f for f in refusals if f[0] is Rejection.INVALID_COMMAND]
        if invalid:
            proc.reject_command(tx, *min(invalid))
            return
        participants = list(self.plan(tx).participants)
        record = InFlight.begun(command_to_wire(tx)["body"][1], tx.at_ms, participants, proc.fingerprint(tx))
        own: list[tuple[str, Any]] = []
        held: dict[str, Any] = {}
        for p in participants:
            body = {"transaction_client_id": tx.client_id, "transaction_command_id": tx.command_id,
                    "coordinator_partition": proc.partition, "transaction": record.tx}
            if p != proc.partition:
                self._send(key, "Reserve", p, self._key_in(tx, p), tx.at_ms, body)
                continue
            # Its own legs are reserved here and now, at the command's position (P10), and its vote counted
            # in place (no Vote to itself), in the begin record's StateChange with its internal holds: a crash
            # leaves all of it or nothing. A refusal of the whole (its rate,
            # double entry) is part of this vote, weighed with the others' as one partition weighs its stages.
            failure, own, held = self._reserve_share(key, tx, offset, tx.at_ms, copy=False, refusals=refusals)
            record = record.with_vote(p, *self._vote_of(tx, failure))
        proc.commit_change(ENGINE_CLIENT, names.step_id(key, names.BEGIN), "", offset,
                           _accepted(names.step_id(key, names.BEGIN), tx.at_ms,
                                     f"reserving in partitions {participants}", held.get("holds", ())),
                           records=[*own, (coordinator_key(key), record.to_json())], **held)

    def cancel_copies(self, tx: core.PostTransaction) -> None:
        """The coordinator refused a transaction its producer placed in several partitions: the copies'
        reservations are released at once (an abort), not after COPY_WAIT_MS."""
        proc = self.proc
        where = self.plan(tx)
        if proc.partition != where.coordinator:
            return
        key = names.transaction_key(tx.client_id, tx.command_id)
        for p in where.participants:
            if p == proc.partition:
                continue
            self._send(key, "Decide", p, self._key_in(tx, p), tx.at_ms, {
                "transaction_client_id": tx.client_id, "transaction_command_id": tx.command_id, "commit": False})

    def whole(self, tx: core.PostTransaction) -> list[tuple[Rejection, str]]:
        """What the coordinator judges of the whole transaction before anything is reserved: double entry
        (P1), the rate snapshot it names and the conversion's amounts (streams/core/fx.py), and whether each
        partition's share fits one posting. A leg's currency is its account's where that account lives
        here, else the one the leg states (its `currency`, or its account id's last segment); each
        participant checks the stated currency of its legs against the account (currency_mismatch), so money
        leaves and enters clearing in the currency it was counted in here. invalid_command: refused at once."""
        proc, sums, failures = self.proc, {}, []
        counted: list[tuple[str, str, int]] = []  # (account, currency, amount)
        for leg in tx.legs:
            home = proc.home(leg.account_id)
            account = self.state.account(leg.account_id) if home == proc.partition else None
            currency = account.currency if account is not None else self._currency(leg)
            if currency is None:
                if home == proc.partition:
                    return [(Rejection.UNKNOWN_ACCOUNT, f"account {leg.account_id} does not exist")]
                return [(Rejection.INVALID_COMMAND, f"leg on {leg.account_id} (another partition) needs its currency")]
            sums[currency] = sums.get(currency, 0) + leg.amount
            counted.append((leg.account_id, currency, leg.amount))
        where = self.plan(tx)
        for p in where.participants:  # each posts its legs and one clearing leg per currency (step 4)
            legs = where.legs_in(p)
            if len(legs) + len(sums) > core.MAX_LEGS:
                return [(Rejection.INVALID_COMMAND, f"{len(legs)} legs in partition {p} and {len(sums)} currencies: "
                                                    f"more than {core.MAX_LEGS} legs to post there")]
        off = {c: total for c, total in sums.items() if total}
        if off:
            failures.append((Rejection.UNBALANCED, "legs do not sum to zero in " + ", ".join(
                f"{c} ({total:+d})" for c, total in sorted(off.items()))))
        if tx.rate_snapshot_id is not None:
            snapshot = self.state.rate(tx.rate_snapshot_id)
            stale = fx.judge_snapshot(snapshot, tx.rate_snapshot_id, tx.at_ms, sums)
            if stale is not None:
                failures.append(stale)
            elif not off:
                scales = {code: proc.currencies.get(code).scale for code in (snapshot.base, snapshot.quote)}
                converted = fx.judge_conversion(snapshot, scales, counted)
                if converted is not None:
                    failures.append(converted)
        return failures

    def _currency(self, leg: Leg) -> str | None:
        currency = leg.currency or routing.system_currency(leg.account_id)
        return currency if self.proc.currencies.get(currency) is not None else None

    def _send(self, key: str, kind: str, partition: int, routing_key: str, at_ms: int, body: dict) -> None:
        command_id = names.step_id(key, kind.lower(), partition if kind != "Vote" else body["participant"])
        self.proc.send_wire(command_record(ENGINE_CLIENT, command_id, kind, body), routing_key, partition, at_ms)

    # --- steps 2-4: engine commands ------------------------------------------------------------------------
    def handle(self, kind: str, record: dict[str, Any], offset: int, at_ms: int) -> None:
        proc = self.proc
        command_id = record["command_id"]
        fingerprint = _fingerprint(kind, record["body"][1])
        stored = self.state.change_record(ENGINE_CLIENT, command_id)
        if stored is not None:  # redelivered: its effects and outputs exist already
            proc.answer_again(stored)
            if kind == "Decide":  # a crash may have cut the waiting commands it woke: they go on
                self.drain(offset)
            if kind == "Reserve":  # one that waits for the copy: a crash may have cut the drain after it
                body = record["body"][1]
                key = names.transaction_key(body["transaction_client_id"], body["transaction_command_id"])
                if self.state.record(vote_owed_key(key)) is not None:
                    self.drain(offset)
            if kind == "Vote":  # the final vote: a crash may have cut the coordinator's own commit after the
                body = record["body"][1]  # decision, or the waiting commands that commit woke: they go on
                key = names.transaction_key(body["transaction_client_id"], body["transaction_command_id"])
                self._decide_own(key, offset, at_ms)
                own = self.state.change_record(ENGINE_CLIENT, names.step_id(key, names.DECIDE, proc.partition))
                if own is not None and own["source_offset"] == offset:  # this record committed it: it drains
                    self.drain(offset)
            return
        proc.expire_due(offset, at_ms)
        body = record["body"][1]
        key = names.transaction_key(body["transaction_client_id"], body["transaction_command_id"])
        step = {"Reserve": self._reserve, "Vote": self._vote, "Decide": self._decide}[kind]
        step(key, command_id, fingerprint, body, offset, at_ms)

    def refuse_reserve(self, record: dict[str, Any], offset: int, at_ms: int, why: str) -> bool:
        """A Reserve that failed part way here (its effects undone): remembered as rejected invalid_command and
        answered with a vote saying so, in one StateChange, so the coordinator decides the transaction (an
        abort) instead of holding its reservations for a vote that never comes. False when not even the
        transaction it carries can be read (then it is only rejected)."""
        proc = self.proc
        body = record["body"][1]
        if self.state.change_record(ENGINE_CLIENT, record["command_id"]) is not None:
            return False  # decided before (redelivered after a crash cut what followed): its decision stands
        try:
            tx = self._transaction(body, at_ms)
            routing_key = self._key_in(tx, body["coordinator_partition"])
        except Exception:  # noqa: BLE001 - the failure being refused may be this very one
            return False
        key = names.transaction_key(body["transaction_client_id"], body["transaction_command_id"])
        command_id, detail = record["command_id"], limits.clip(why, VOTE_DETAIL_CHARS)
        proc.commit_change(ENGINE_CLIENT, command_id, _fingerprint("Reserve", body), offset,
                           rejection_to_wire(command_id, ENGINE_CLIENT, at_ms, Rejection.INVALID_COMMAND, detail))
        self._send(key, "Vote", body["coordinator_partition"], routing_key, at_ms, {
            "transaction_client_id": body["transaction_client_id"],
            "transaction_command_id": body["transaction_command_id"],
            "participant": proc.partition, "reason": Rejection.INVALID_COMMAND.code, "detail": detail})
        return True

    def _reserve(self, key: str, command_id: str, fingerprint: str, body: dict, offset: int, at_ms: int,
                 refusals: list[tuple[Rejection, str]] = ()) -> None:
        proc, state = self.proc, self.state
        tx = self._transaction(body, at_ms)
        copy_id = names.step_id(key, "copy", proc.partition)
        reservation = self._reservation(key)
        failure: tuple[Rejection, str] | None = None
        records: list[tuple[str, Any]] = []
        held: dict[str, Any] = {}
        if reservation is not None and reservation.copy == proc.fingerprint(tx):
            # Reserved already at the position of the producer's own copy: that is this partition's vote.
            records = [(reservation_key(key), reservation.confirmed().to_json()), *self._without_timeout(key)]
        elif reservation is None and self._copy_waiting(tx):
            # The producer's copy waits here for its turn (credits in flight it needs, a command ahead of it):
            # reserved now, the transaction would be judged before the commands the producer sent here
            # before it (P10). The copy votes when it is decided (copy, below), within COPIED_CREDIT_WAIT_MS
            # of its own log time whatever it waits for (drain), so no cycle of waits across partitions
            # holds a begun transaction for longer.
            # The Reserve's own body is kept: the copy that comes to vote may carry another payload under the
            # same ids (a broken or hostile producer), and the vote is owed for what the coordinator judged.
            proc.commit_change(ENGINE_CLIENT, command_id, fingerprint, offset,
                               _accepted(command_id, at_ms, "votes when the producer's copy waiting here is decided"),
                               records=[(vote_owed_key(key), {"at_ms": at_ms, "body": _jsonable(body)})])
            self.drain(offset)  # its wait may be over already (it is then decided, and votes, now)
            return
        else:
            if reservation is not None and reservation.copy:  # a copy of another payload: undone
                self._unreserve(key, reservation, names.step_id(key, "uncopy", proc.partition), offset, at_ms)
            stored = state.change_record(ENGINE_CLIENT, copy_id)
            copied = stored is not None and stored["fingerprint"] == proc.fingerprint(tx) and \
                self.proc.codec.decode("result", stored["result"])
            if copied and copied["outcome"] == "rejected":  # the copy could not reserve: that is the vote
                failure = Rejection.from_code(copied["reason"]), copied["detail"]
            else:
                failure, records, held = self._reserve_share(key, tx, offset, at_ms, copy=False, refusals=refusals)
        reason, detail = self._vote_of(tx, failure)
        wire = _accepted(command_id, at_ms, "", held.get("holds", ())) if failure is None else \
            rejection_to_wire(command_id, ENGINE_CLIENT, at_ms, failure[0], failure[1])
        proc.commit_change(ENGINE_CLIENT, command_id, fingerprint, offset, wire, records=records, **held)
        coordinator = body["coordinator_partition"]
        self._send(key, "Vote", coordinator, self._key_in(tx, coordinator), at_ms, {
            "transaction_client_id": body["transaction_client_id"],
            "transaction_command_id": body["transaction_command_id"],
            "participant": proc.partition, "reason": reason, "detail": detail})

    def _vote_of(self, tx: core.PostTransaction, failure: tuple[Rejection, str] | None) -> tuple[str | None, str]:
        """A participant's vote: (None, late_settlement or "") when it reserved, else (reason code, detail)."""
        if failure is None:
            return None, self._late_note(tx)
        return failure[0].code, limits.clip(failure[1], VOTE_DETAIL_CHARS)

    def _late_note(self, tx: core.PostTransaction) -> str:
        """A reserved vote's detail: late_settlement when this partition's captures settle an ended hold, so the
        coordinator's result carries the notice (the core decides it again at this partition's commit)."""
        proc = self.proc
        for leg in tx.legs:
            if leg.hold_id is not None and proc.home(leg.account_id) == proc.partition:
                hold = self.state.hold(leg.hold_id)
                if hold is not None and settlement.ended(hold):
                    return settlement.LATE_SETTLEMENT
        return ""

    def _reserve_share(self, key: str, tx: core.PostTransaction, offset: int, at_ms: int, copy: bool,
                       refusals: list[tuple[Rejection, str]] = ()
                       ) -> tuple[tuple[Rejection, str] | None, list[tuple[str, Any]], dict[str, Any]]:
        """Reserve this partition's legs of tx (all or nothing). Returns (the most urgent failure, engine
        records to write, the internal holds' writes as commit_change's accounts, holds and history); on
        success the last record is the reservation ``r/<key>``. Both go into the StateChange of the step that
        reserves: the internal holds are decided by the core but are not steps of their own (no inbox entry,
        no result), so a reservation is one StateChange. refusals: failures of the whole transaction the
        coordinator found, weighed with this partition's own."""
        proc, state = self.proc, self.state
        where = self.plan(tx)
        mine = [tx.legs[i] for i in where.legs_in(proc.partition) if not routing.is_system(tx.legs[i].account_id)]
        terms = settlement.terms_of(tx.metadata)
        if type(terms) is str:
            return (Rejection.INVALID_COMMAND, terms), [], {}
        failures: list[tuple[Rejection, str]] = []
        locks: dict[str, list] = {}  # hold id -> [account, amount]
        taken: dict[str, int] = defaultdict(int)  # hold id -> what this transaction captures of it here
        for leg in mine:
            if leg.hold_id is not None:
                taken[leg.hold_id] -= leg.amount
        plain: dict[str, int] = {}
        credits: dict[str, int] = {}
        for leg in mine:
            account = state.account(leg.account_id)
            if account is None:
                failures.append((Rejection.UNKNOWN_ACCOUNT, f"account {leg.account_id} does not exist"))
            elif (self._currency(leg) or account.currency) != account.currency:
                # The coordinator counted this leg in its stated currency (see whole).
                failures.append((Rejection.CURRENCY_MISMATCH, f"{leg.account_id} is in {account.currency}"))
            elif leg.amount > 0:
                credits[leg.account_id] = credits.get(leg.account_id, 0) + leg.amount
            elif leg.hold_id is None:
                plain[leg.account_id] = plain.get(leg.account_id, 0) - leg.amount
            else:
                failure = self._lockable(leg, locks, at_ms, terms, taken)
                if failure is not None:
                    failures.append(failure)
        for account_id in [a for a in plain if a in credits]:
            # One partition judges an account's legs together, by the change they make to it: its share here
            # does too, so an account debited and credited by the transaction reserves only what it loses.
            net = plain.pop(account_id) - credits.pop(account_id)
            if net > 0:
                plain[account_id] = net
            elif net < 0:
                credits[account_id] = -net
        returned = None
        if not failures and returns.returned_payment(tx.metadata) is not None:
            judged = self._returned_share(key, tx, mine, plain, offset, at_ms)
            if type(judged[0]) is Rejection:
                return _most_urgent([judged, *refusals]), [], {}
            returned = judged
        tag = "~copy" if copy else ""
        holds = {account_id: core.PlaceHold(command_id=names.step_id(key + tag, "hold", account_id),
                                            client_id=ENGINE_CLIENT,
                                            at_ms=at_ms, hold_id=names.internal_hold(key, account_id, tag),
                                            account_id=account_id, amount=amount)
                 for account_id, amount in plain.items()}
        if not failures:  # every leg judged, so the most urgent reason is the answer, as in one partition
            for hold in holds.values():
                judged = core.decide(state, hold, proc.currencies)
                if judged.outcome != "accepted":
                    failures.append((judged.reason, judged.detail))
            failures += self._credit_failures(key, tx, credits, offset, at_ms)
            if where.coordinator == proc.partition:
                failures += self._system_failures(key, tx, offset, at_ms)
        failures += refusals
        if not failures:
            budget = self.over_budget(key, list(plain) + [a for a, _ in locks.values()] + list(credits), locks,
                                       credits, {paid: returned.amount for paid in _in_flight_on(returned)})
            failures = [] if budget is None else [budget]
        if failures:
            return _most_urgent(failures), [], {}
        placed: list[list] = []  # [internal hold id, account, amount]
        held: dict[str, Any] = {"accounts": {}, "holds": {}, "history": ()}
        for account_id, hold in holds.items():
            # One hold per account, so no hold's decision reads an account another one changed (unstaged).
            result, changes = core.execute(state, hold, proc.currencies)
            if result.outcome != "accepted":  # judged above: nothing is staged yet, so nothing to undo
                return (result.reason, result.detail), [], {}
            held["accounts"].update(changes.accounts)
            held["holds"].update(changes.holds)
            held["history"] += changes.history
            placed.append([hold.hold_id, account_id, hold.amount])
        records: list[tuple[str, Any]] = []
        for hold_id, (account_id, amount) in locks.items():
            current = state.record(f"l/{hold_id}") or {}
            records.append((f"l/{hold_id}", {**current, key: amount}))
        for account_id, amount in credits.items():
            current = state.record(f"n/{account_id}") or {}
            records.append((f"n/{account_id}", {**current, key: amount}))
        for transaction_id in _in_flight_on(returned):
            records.append((returning_key(transaction_id),
                            {**(state.record(returning_key(transaction_id)) or {}), key: returned.amount}))
        system = [proc.local(leg.account_id) for leg in tx.legs if routing.is_system(leg.account_id)] \
            if where.coordinator == proc.partition else []
        for account_id in dict.fromkeys([a for _, a, _ in placed] + [a for a, _ in locks.values()] + list(credits)
                                        + system):
            current = state.record(f"k/{account_id}") or []
            records.append((f"k/{account_id}", [*current, key]))
        reservation = Reservation(holds=tuple((h, a, n) for h, a, n in placed),
                                  locks=tuple((h, a, n) for h, (a, n) in locks.items()),
                                  credits=tuple(credits.items()), at_ms=at_ms, tx=command_to_wire(tx)["body"][1],
                                  tag=tag, copy=proc.fingerprint(tx) if copy else None, returned=returned)
        records.append((reservation_key(key), reservation.to_json()))
        return None, records, {"accounts": list(held["accounts"].values()), "holds": list(held["holds"].values()),
                               "history": held["history"]}

    def _system_failures(self, key: str, tx: core.PostTransaction, offset: int,
                         at_ms: int) -> list[tuple[Rejection, str]]:
        """The legs on system accounts, which post at the coordinator, judged by the core as they will post:
        on the local shards, against the clearing shard (a frozen or closed shard refuses, as in one
        partition); a freeze or close of those shards then waits for the decision (their k/ marks)."""
        proc = self.proc
        system = [leg for leg in tx.legs if routing.is_system(leg.account_id)]
        if not system:
            return []
        totals: dict[str, int] = defaultdict(int)
        for leg in system:
            totals[routing.system_currency(leg.account_id)] += leg.amount
        proc.open_shards([leg.account_id for leg in system] + [names.clearing(c) for c in totals], tx, offset)
        legs = [Leg(proc.local(leg.account_id), leg.amount) for leg in system]
        legs += [Leg(routing.shard_of(names.clearing(c), proc.partition), -n) for c, n in totals.items() if n]
        if len(legs) < 2:
            return []  # (one system leg cannot net to zero: its clearing leg is there)
        probe = core.PostTransaction(command_id=names.step_id(key, "system"), client_id=ENGINE_CLIENT, at_ms=at_ms,
                                     transaction_id=tx.transaction_id, kind=tx.kind, legs=tuple(legs))
        result = core.decide(self.state, probe, proc.currencies)
        return [] if result.outcome == "accepted" else [(result.reason, result.detail)]

    def _returned_share(self, key: str, tx: core.PostTransaction, mine: list[Leg], plain: dict[str, int],
                        offset: int, at_ms: int) -> tuple[Rejection, str] | returns.Returned:
        """A return's share in this partition, judged by the core (returns.judge_named) as it will post: this
        partition's leg against the local clearing shard, the mirror of the payment's share here (the payee's
        partition holds ``clearing -> payee``, the payer's ``payer -> clearing``), counting what returns in
        flight hold of the payment. Where the payee is debited, what its available cannot cover (the money is
        spent) is reserved on its receivable instead (returns.covered; opened here on first use), so the
        return is never refused insufficient_funds: `plain` (account -> debit to hold) changes so."""
        proc, state = self.proc, self.state
        totals: dict[str, int] = defaultdict(int)
        for leg in mine:
            totals[state.account(leg.account_id).currency] += leg.amount
        legs = (*mine, *(Leg(routing.shard_of(names.clearing(c), proc.partition), -n) for c, n in totals.items() if n))
        judged = returns.judge_named(tx.transaction_id, tx.metadata, tx.client_id, tuple(legs), tx.links,
                                     state.transaction,
                                     lambda paid: sum((state.record(returning_key(paid)) or {}).values()))
        if type(judged[0]) is Rejection:
            return judged
        payee = state.account(judged.payee) if judged.payee in plain else None
        spent = 0 if payee is None else judged.amount - returns.covered(payee, judged.amount)
        if spent:
            receivable = settlement.receivable_of(payee.routing_key, payee.currency)
            if state.account(receivable) is None:
                proc.execute(core.OpenAccount(command_id=names.step_id(key, "open", receivable),
                                              client_id=ENGINE_CLIENT, at_ms=at_ms, account_id=receivable,
                                              currency=payee.currency, policy=core.SYSTEM_POLICY,
                                              routing_key=payee.routing_key), offset)
            plain[payee.id] -= spent
            if not plain[payee.id]:
                del plain[payee.id]
            plain[receivable] = plain.get(receivable, 0) + spent
        return judged

    def _credit_failures(self, key: str, tx: core.PostTransaction, credits: dict[str, int], offset: int,
                         at_ms: int) -> list[tuple[Rejection, str]]:
        """Each credit judged by the core as it will post at commit: from this partition's clearing shard, on
        top of what transactions in flight have reserved on the account already (so their commits together
        still fit its limits; a client's own credit to a capped account waits meanwhile, see waits)."""
        proc, failures = self.proc, []
        for account_id, amount in credits.items():
            account = self.state.account(account_id)
            clearing = names.clearing(account.currency)
            if proc.currencies.get(account.currency) is None:  # unregistered since the account was opened
                failures.append((Rejection.UNKNOWN_CURRENCY, f"currency {account.currency} is not registered"))
                continue
            proc.open_shards([clearing], tx, offset)
            total = amount + sum((self.state.record(f"n/{account_id}") or {}).values())
            probe = core.PostTransaction(command_id=names.step_id(key, "credit", account_id), client_id=ENGINE_CLIENT,
                                         at_ms=at_ms, transaction_id=tx.transaction_id, kind=tx.kind,
                                         legs=(Leg(routing.shard_of(clearing, proc.partition), -total),
                                               Leg(account_id, total)))
            result = core.decide(self.state, probe, proc.currencies)
            if result.outcome != "accepted":
                failures.append((result.reason, result.detail))
        return failures

    # --- the producer's copies: reserve at the copy's own position (P10) ---------------------------------------
    def is_copy(self, tx: core.PostTransaction) -> bool:
        """A transaction the producer placed in every partition it touches, arriving at a participant that is
        not its coordinator."""
        if tx.client_id == ENGINE_CLIENT or not placement.is_placed(tx.metadata):
            return False
        where = self.plan(tx)
        return where.spans and self.proc.partition in where.participants and where.coordinator != self.proc.partition

    def copy(self, tx: core.PostTransaction, offset: int) -> None:
        """The producer's copy of a multi-partition transaction: this partition reserves its legs now, at
        the position the producer gave it among its other commands, and votes with that reservation when
        the coordinator's Reserve arrives. The client's answer comes from the coordinator alone."""
        proc, state = self.proc, self.state
        key = names.transaction_key(tx.client_id, tx.command_id)
        copy_id = names.step_id(key, "copy", proc.partition)
        if state.change_record(ENGINE_CLIENT, copy_id) is not None:
            return  # the copy sent again (a retry): its effect exists, the coordinator answers
        owed = state.record(vote_owed_key(key))
        decided = state.change_record(ENGINE_CLIENT, names.step_id(key, names.DECIDE, proc.partition)) is not None
        if owed is not None and not decided:
            self._copy_and_vote(tx, key, copy_id, owed, offset)
            return
        late = decided or state.record(reservation_key(key)) is not None or \
            state.change_record(ENGINE_CLIENT, names.step_id(key, "reserve", proc.partition)) is not None
        if late or self.refusal(tx) is not None:
            # Reserved or decided already (the coordinator's step came first), or a command the coordinator
            # refuses: nothing to reserve here. A vote still owed once the decision came is owed no more: the
            # decision was an abort (no commit without this partition's vote), and a reservation made now
            # would be one nothing ends.
            proc.commit_change(ENGINE_CLIENT, copy_id, proc.fingerprint(tx), offset,
                               _accepted(copy_id, tx.at_ms, "nothing to reserve"),
                               records=[] if owed is None else [(vote_owed_key(key), None)])
            return
        failure, records, held = self._reserve_share(key, tx, offset, tx.at_ms, copy=True)
        if failure is None:
            records.append((copy_due_key(tx.at_ms + COPY_WAIT_MS, key), 1))
            wire = _accepted(copy_id, tx.at_ms, "reserved", held["holds"])
        else:
            wire = rejection_to_wire(copy_id, ENGINE_CLIENT, tx.at_ms, failure[0],
                                     limits.clip(failure[1], VOTE_DETAIL_CHARS))
        proc.commit_change(ENGINE_CLIENT, copy_id, proc.fingerprint(tx), offset, wire, records=records, **held)

    def _copy_waiting(self, tx: core.PostTransaction, any_payload: bool = False) -> bool:
        """Whether the producer's copy of tx waits in this partition's queue, not yet decided. any_payload: a
        copy of another payload under its ids counts too (the queue is then read whatever keys tx names)."""
        state = self.state
        if not any_payload and not state.waiting.holds_any(self._keys(tx)) and not state.record(WAITING):
            return False  # (a waiting command holds its keys: the queue is read only when one might be it)
        if state.change_record(ENGINE_CLIENT, names.step_id(names.transaction_key(tx.client_id, tx.command_id),
                                                            "copy", self.proc.partition)) is not None:
            return False
        for where, entry in self._queue():
            if entry["command"]["client_id"] == tx.client_id and entry["command"]["command_id"] == tx.command_id:
                # Only the producer's copy of a transaction: another command under the same ids (a payment of
                # this partition's own, say) never votes, and a vote owed to it would be owed for ever.
                command, _ = self._waiting_command(where, entry)
                if isinstance(command, core.PostTransaction) and self.is_copy(command):
                    return True
        return False

    def _copy_and_vote(self, tx: core.PostTransaction, key: str, copy_id: str, owed: dict[str, Any],
                       offset: int) -> None:
        """The producer's copy of tx, decided at its turn after the coordinator's Reserve came (_reserve): it
        reserves and votes, as the Reserve would have with the copy's reservation, in one StateChange. A copy
        of another payload than the Reserve's (same ids) reserves the Reserve's transaction instead, as a
        Reserve does when it finds such a copy reserved: the vote is for what the coordinator judged, and is
        sent to that coordinator."""
        proc = self.proc
        reserve = owed.get("body")  # None: written before the Reserve's body was kept (the copy's own then)
        voted = tx if reserve is None else self._transaction(reserve, owed["at_ms"])
        same = voted is tx or proc.fingerprint(voted) == proc.fingerprint(tx)
        refusal = self.refusal(voted)
        if refusal is not None:
            failure, records, held = refusal, [], {}
        elif same:
            failure, records, held = self._reserve_share(key, tx, offset, tx.at_ms, copy=True)
        else:
            failure, records, held = self._reserve_share(key, voted, offset, owed["at_ms"], copy=False)
        owed_records = [(vote_owed_key(key), None)]
        at_ms = owed["at_ms"]
        if failure is None:
            # the Reserve came: the reservation is this partition's vote (no wait for a Reserve to confirm it)
            records[-1] = (reservation_key(key), Reservation.from_json(records[-1][1]).confirmed().to_json())
            wire = _accepted(copy_id, tx.at_ms, "reserved", held["holds"])
        else:
            wire = rejection_to_wire(copy_id, ENGINE_CLIENT, tx.at_ms, failure[0],
                                     limits.clip(failure[1], VOTE_DETAIL_CHARS))
        proc.commit_change(ENGINE_CLIENT, copy_id, proc.fingerprint(tx), offset, wire,
                           records=[*records, *owed_records], **held)
        reason, detail = self._vote_of(voted, failure)
        coordinator = self.plan(tx).coordinator if reserve is None else reserve["coordinator_partition"]
        self._send(key, "Vote", coordinator, self._key_in(voted, coordinator), at_ms, {
            "transaction_client_id": tx.client_id, "transaction_command_id": tx.command_id,
            "participant": proc.partition, "reason": reason, "detail": detail})

    def _without_timeout(self, key: str) -> list[tuple[str, Any]]:
        """The engine records that end the wait of a copy's reservation for transaction key T (none if none)."""
        records: list[tuple[str, Any]] = []
        due = self.state.copy_dues.get(key)
        if due is not None:
            records.append((copy_due_key(due, key), None))
        timeouts = self.state.record(COPY_TIMEOUTS)
        if timeouts:  # written by an earlier version
            rest = [t for t in timeouts if t[1] != key]
            if len(rest) != len(timeouts):
                records.append((COPY_TIMEOUTS, rest or None))
        return records

    def _unreserve(self, key: str, reservation: Reservation, command_id: str, offset: int, at_ms: int) -> None:
        """Drop a reservation the coordinator never confirmed (a copy of another payload, or one whose
        Reserve did not come within COPY_WAIT_MS of log time)."""
        for hold_id, account_id, _ in reservation.holds:
            self._release(key, hold_id, account_id, offset, at_ms, "~uncopy")
        self.proc.commit_change(ENGINE_CLIENT, command_id, "", offset, _accepted(command_id, at_ms),
                                records=[*self._dropped(key, reservation), *self._without_timeout(key)])
        self._reindex(reservation)

    def expire_copies(self, offset: int, now_ms: int) -> list[str]:
        """Reservations of copies whose Reserve has not come within COPY_WAIT_MS of log time are dropped (the
        coordinator never got the command: a producer that died between its sends, or one that wrote a copy
        only). Returns the keys that fell due (a linked batch's copy among them is LinkedSpanning's to drop)."""
        due = self.state.copy_dues.take_due(now_ms)  # checked on every command: the earliest only
        timeouts = self.state.record(COPY_TIMEOUTS)
        if timeouts:  # written by an earlier version, until it empties
            if self._earliest[0] is not timeouts:
                self._earliest = (timeouts, min(t for t, _ in timeouts))
            if self._earliest[1] <= now_ms:
                due = sorted(due + [(t, k) for t, k in timeouts if t <= now_ms])
        for _, key in due:
            reservation = self._reservation(key)
            if reservation is not None and reservation.copy:
                self._unreserve(key, reservation, names.step_id(key, "copyexpired", self.proc.partition), offset,
                                now_ms)
        return [key for _, key in due]

    # --- commands that wait for transactions in flight -----------------------------------------------------
    def _keys(self, command: core.Command, system: bool = False) -> list[str]:
        """What a waiting command holds back (a later command naming one of them keeps its place behind it):
        its holds and accounts. A transaction's legs on system accounts are left out: those accounts are
        everyone's (allow negative, no cap), so a deposit waiting behind one user's freeze would otherwise hold
        back every deposit of the partition. system=True: the keys a command is looked up by, its system legs
        included, so it still keeps its place behind a waiting command on a system account itself (a freeze of
        a shard)."""
        keys: list[str] = []
        if isinstance(command, core.PostTransaction):
            for leg in command.legs:
                if system or not routing.is_system(leg.account_id):
                    keys.append(f"a:{leg.account_id}")
                if leg.hold_id is not None:
                    keys.append(f"h:{leg.hold_id}")
        else:
            account_id = getattr(command, "account_id", None)
            hold_id = getattr(command, "hold_id", None)
            if hold_id is not None:
                keys.append(f"h:{hold_id}")
                hold = self.state.hold(hold_id)
                if account_id is None and hold is not None:
                    account_id = hold.account_id
            if account_id is not None:
                keys.append(f"a:{account_id}")
        return keys

    def waits(self, command: core.Command, earlier: dict[str, int] | None = None, can_wait: bool = True) -> bool:
        """Whether a client's command must wait for a transaction in flight before it is decided: it ends a
        hold a reservation has locked (release, expire), freezes or closes an account with reservations, is a
        debit the credits in flight to its account could fund, or names a hold or account a waiting command
        names (so it keeps its place behind it). earlier: what the commands decided together with it (a linked
        batch) credit before it, per account. can_wait=False: it cannot (a linked batch, refused in_flight
        instead, to be sent again), so credits copies reserved count only within COPIED_CREDIT_WAIT_MS of
        their reservation: a copy whose coordinator never comes does not make every retry fail for minutes."""
        if command.client_id == ENGINE_CLIENT:
            return False
        waiting, legacy = self.state.waiting, self.state.record(WAITING)
        if waiting.held or legacy:
            keys = self._keys(command, system=True)
            if waiting.holds_any(keys):
                return True
            if legacy and {k for entry in legacy for k in entry["keys"]}.intersection(keys):
                return True
        return self._blocked(command, earlier or {},
                             None if can_wait else self.proc.now_ms - COPIED_CREDIT_WAIT_MS)

    def wait(self, command: core.Command, offset: int) -> None:
        """Queue the command; it is decided, at its own log time, once what it waits for is decided."""
        proc, state = self.proc, self.state
        # The partition too: a command placed in several partitions (P10) may wait in each at the same offset.
        wait_id = names.step_id(names.transaction_key(command.client_id, command.command_id), "wait",
                               f"{proc.partition}:{proc.position}")
        if state.change_record(ENGINE_CLIENT, wait_id) is not None:
            return  # this very record redone after a crash: it waits already
        if isinstance(command, core.PostTransaction) and self.is_copy(command) and \
                self._copy_waiting(command, any_payload=True):
            # The producer's copy sent again while the first waits here: that one is decided at its turn (and
            # votes, if the Reserve came). Refused here as the copy's step, it would take that step's place.
            return
        waiting = len(state.waiting) + len(state.record(WAITING) or ())
        if waiting >= WAITING_LIMIT:
            detail = f"{waiting} commands already wait for transactions in flight here"
            if isinstance(command, core.PostTransaction) and self.is_copy(command):
                # A producer's copy: the coordinator alone answers the client (refused here under the client's id,
                # it was a second decision of the command, P4). The refusal is this partition's copy step, which
                # the coordinator's Reserve takes as its vote, as for a copy that cannot reserve.
                copy_id = names.step_id(names.transaction_key(command.client_id, command.command_id), "copy",
                                        proc.partition)
                if state.change_record(ENGINE_CLIENT, copy_id) is None:
                    proc.commit_change(ENGINE_CLIENT, copy_id, proc.fingerprint(command), offset,
                                       rejection_to_wire(copy_id, ENGINE_CLIENT, command.at_ms, Rejection.IN_FLIGHT,
                                                         detail))
                return
            proc.reject_command(command, Rejection.IN_FLIGHT, detail)
            return
        entry = {"keys": self._keys(command), "command": _jsonable(command_to_wire(command)), "at_ms": command.at_ms}
        proc.commit_change(ENGINE_CLIENT, wait_id, "", offset,
                           _accepted(wait_id, command.at_ms, "waits for a transaction in flight"),
                           records=[(waiting_key(state.waiting.next_seq()), entry)])

    def end_copied_waits(self, seqs: list[int], offset: int) -> None:
        """The waiting debits numbered seqs have waited COPIED_CREDIT_WAIT_MS of log time for credits only copies
        reserved: each entry is rewritten with that wait over (streams/waiting.py, COPIED_WAIT_OVER), in a
        StateChange of its own, so their next judgement counts begun credits only."""
        proc, state = self.proc, self.state
        for seq in seqs:
            entry = state.waiting.entries.get(seq)
            if entry is None or entry.get(COPIED_WAIT_OVER):
                continue
            record = entry["command"]
            over_id = names.step_id(names.transaction_key(record["client_id"], record["command_id"]), "waitover",
                                    f"{proc.partition}:{seq}")
            if state.change_record(ENGINE_CLIENT, over_id) is not None:
                continue
            proc.commit_change(ENGINE_CLIENT, over_id, "", offset,
                               _accepted(over_id, entry["at_ms"] + COPIED_CREDIT_WAIT_MS,
                                         "waited for credits only copies reserved as long as it may"),
                               records=[(waiting_key(seq), {**entry, COPIED_WAIT_OVER: True})])

    def _queue(self) -> list[tuple[Any, dict[str, Any]]]:
        """(where, entry) of every waiting command in arrival order: those of the one record an earlier version
        kept (where: WAITING), then the wq/ records (where: seq)."""
        return [(WAITING, entry) for entry in self.state.record(WAITING) or ()] + \
            list(self.state.waiting.entries.items())

    def _waiting_command(self, where: Any, entry: dict[str, Any]) -> tuple[core.Command, list[str]]:
        """The entry's command and the keys it is looked up by (_keys, system legs included), decoded once
        while the entry is the one waiting there (a transaction's keys are its legs'; other commands' may
        depend on the state, a hold's account, and are looked up each time)."""
        memo = self._decoded.get(where)
        if memo is not None and memo[0] is entry:
            command, keys = memo[1], memo[2]
            return command, (self._keys(command, system=True) if keys is None else keys)
        record = entry["command"]
        command = command_from_wire({**record, "body": tuple(record["body"])}, entry["at_ms"])
        keys = self._keys(command, system=True)
        if where != WAITING:
            if len(self._decoded) > 2 * len(self.state.waiting) + 64:  # entries dropped by a rollback
                self._decoded.clear()
                self._judged.clear()
            self._decoded[where] = (entry, command, keys if isinstance(command, core.PostTransaction) else None)
        return command, keys

    def _still_blocked(self, where: Any, entry: dict[str, Any], command: core.Command) -> bool:
        """_blocked for a waiting command, judged again only when a key that judgement read was written since
        (PartitionState.versions) or its entry was rewritten (its wait for copied credits over): a drain follows
        every two-phase decision, and a queue of debits waiting for credits would otherwise have the core judge
        each of them at every one. A command decided already (a crash cut between its decision and its leaving
        the queue) is not held back: it is answered again. A command in the one queue record of an earlier
        version (WAITING), which had no wait for credits, counts no copied credit (it is never marked over)."""
        state = self.state
        stamp = (state.generation, state.currencies_epoch)
        memo = self._judged.get(where)
        if memo is not None and memo[0] is entry and memo[1] == stamp:
            versions = state.versions
            if all(versions.get(key, 0) == version for key, version in memo[2]):
                return memo[3]
        state.watch()
        try:
            # Decided already (a crash cut between its decision and its leaving the queue): its turn has come,
            # it is answered again.
            over = where == WAITING or entry.get(COPIED_WAIT_OVER)
            blocked = state.change_record(command.client_id, command.command_id) is None and \
                self._blocked(command, {}, float("inf") if over else None)
        finally:
            read = state.watched()
        if where != WAITING:
            versions = state.versions
            self._judged[where] = (entry, stamp, tuple((key, versions.get(key, 0)) for key in read), blocked)
        return blocked

    def _unqueued(self, where: Any, entry: dict[str, Any]) -> list[tuple[str, Any]]:
        """The engine records that take the entry off the queue."""
        self._decoded.pop(where, None)
        self._judged.pop(where, None)
        if where != WAITING:
            return [(waiting_key(where), None)]
        queue = list(self.state.record(WAITING) or ())
        if entry in queue:
            queue.remove(entry)
        return [(WAITING, queue or None)]

    def drain(self, offset: int) -> None:
        """Decide, in order, the waiting commands nothing holds back any more (after a decision or a dropped
        reservation freed locks)."""
        proc, state = self.proc, self.state
        position = proc.position
        index = 0
        while True:
            ahead: set[str] = set()
            chosen = None
            for where, entry in self._queue():
                command, keys = self._waiting_command(where, entry)
                if self._vote_due(entry, command) or (not ahead.intersection(keys)
                                                      and not self._still_blocked(where, entry, command)):
                    chosen = where, entry, command
                    break
                ahead.update(entry["keys"])
            if chosen is None:
                break
            where, entry, command = chosen
            index += 1
            proc.position = f"{position}.w{index}"
            # Judged first, then taken off the queue: a crash between the two leaves it queued, and the redo
            # finds it decided (answered again, flagged duplicate) before taking it off.
            proc.judge(command, offset, woken=True)
            woke_id = names.step_id(names.transaction_key(command.client_id, command.command_id), "woke",
                                   f"{proc.partition}:{proc.position}")
            if state.change_record(ENGINE_CLIENT, woke_id) is None:
                proc.commit_change(ENGINE_CLIENT, woke_id, "", offset, _accepted(woke_id, command.at_ms),
                                   records=self._unqueued(where, entry))
        proc.position = position

    def _vote_due(self, entry: dict[str, Any], command: core.Command) -> bool:
        """A producer's copy whose coordinator's Reserve came while it waited (its vote owed), and whose wait for
        copied credits is over (COPIED_CREDIT_WAIT_MS of log time): it is decided now, whatever it waits for.
        Its vote holds a transaction the coordinator has begun, and a begun transaction must not wait without
        a bound: two such copies in two partitions, each waiting for the other's transaction, would wait for
        ever. Judged then on what its accounts hold, as a Reserve is."""
        return bool(entry.get(COPIED_WAIT_OVER)) and isinstance(command, core.PostTransaction) and \
            self.state.record(vote_owed_key(names.transaction_key(command.client_id, command.command_id))) is not None

    def _blocked(self, command: core.Command, earlier: dict[str, int], copied_since: float | None = None) -> bool:
        """What a reservation holds: a locked hold (release, expiry), an account with reservations (freeze,
        close), the headroom under a balance limit that reserved credits count on (another credit), and the
        credits themselves (a debit they could fund: _awaits_credit)."""
        if isinstance(command, (core.ReleaseHold, core.ExpireHold)):
            return not command.hold_id.startswith(INTERNAL_HOLD_MARK) and self.locked(command.hold_id)
        if isinstance(command, (core.FreezeAccount, core.CloseAccount)):
            return bool(self.state.record(f"k/{self.proc.local(command.account_id)}"))
        credited: list[tuple[str, int]] = []
        if isinstance(command, core.PostTransaction):
            credited = [(leg.account_id, leg.amount) for leg in command.legs if leg.amount > 0]
        elif isinstance(command, core.ReverseTransaction):  # it credits what the original debited
            original = self.state.transaction(command.reverses)
            credited = [] if original is None else [(leg.account_id, -leg.amount) for leg in original.legs
                                                    if leg.amount < 0]
        for account_id, amount in credited:
            reserved = self.state.record(f"n/{account_id}")
            if reserved:
                account = self.state.account(account_id)
                # The reserved credits were judged on what the account holds now: a credit that could take it
                # past its cap, or past what an amount may be, would make their commits fail. It waits.
                if account is not None and (account.policy.max_balance is not None or
                                            account.posted + sum(reserved.values()) + earlier.get(account_id, 0)
                                            + amount > core.MAX_ABS_AMOUNT):
                    return True
        return self._awaits_credit(command, earlier, copied_since)

    def _awaits_credit(self, command: core.Command, earlier: dict[str, int], copied_since: float | None) -> bool:
        """A debit (a payment decided here, its share here of one across partitions, or a hold) the core refuses
        for funds now, and would not refuse for funds were the credits in flight to its account (n/<account>)
        posted: it waits for their decision and is decided then, at its own log time. So a payment sent after a
        transfer to the account it spends from (across partitions, reserved here at the producer's position by
        its copy, or by its Reserve) is decided after that transfer, as in one partition, not refused for the
        money the transfer is bringing (P10). Whichever way the transfer ends, the debit is then judged on what
        the account holds. A debit those credits could not fund is refused at once. Credits only a producer's
        copy reserved count while the debit's wait for them is not over (streams/waiting.py: why) and, with
        copied_since, only those reserved after that log time. earlier: what the commands decided with it (a
        linked batch) credit before it, per account, counted as posted. The core judges; this only asks whether
        its refusal is for funds."""
        if isinstance(command, core.PostTransaction):
            debited = [leg.account_id for leg in command.legs if leg.amount < 0 and leg.hold_id is None]
        elif isinstance(command, core.PlaceHold):
            debited = [command.account_id]
        else:
            return False
        coming: dict[str, int] = {}
        for account_id in debited:
            reserved = self.state.record(f"n/{account_id}")
            if reserved:
                total = sum(amount for key, amount in reserved.items()
                            if copied_since is None or self._counts(key, copied_since))
                if total:
                    coming[account_id] = total
        if not coming:
            return False
        now = self._credited(earlier)
        funded = self._credited({a: earlier.get(a, 0) + coming.get(a, 0) for a in {*earlier, *coming}})

        def for_funds(reader: WithAccounts, probe: core.Command) -> bool:
            return core.decide(reader, probe, self.proc.currencies).reason is Rejection.INSUFFICIENT_FUNDS

        route = self.proc.route(command)
        if route.command is not None:  # decided here, in one step
            return for_funds(now, route.command) and not for_funds(funded, route.command)
        if not isinstance(command, core.PostTransaction) or not (route.spans or self.is_copy(command)):
            return False  # decided elsewhere, or refused on its route
        # In two phases (coordinated here, or the producer's copy of one coordinated elsewhere): its share here
        # reserves what it takes from each account here as an internal hold (_reserve_share); the core judges
        # that hold, as it will then.
        taken: dict[str, int] = {}
        for leg in command.legs:
            if leg.hold_id is None and self.proc.home(leg.account_id) == self.proc.partition:
                taken[leg.account_id] = taken.get(leg.account_id, 0) - leg.amount
        for account_id, amount in taken.items():
            if amount > 0 and account_id in coming and self.state.account(account_id) is not None:
                probe = core.PlaceHold(command_id=names.step_id(account_id, "funds"), client_id=ENGINE_CLIENT,
                                       at_ms=command.at_ms, hold_id=names.step_id(account_id, "funds"),
                                       account_id=account_id, amount=amount)
                if for_funds(now, probe) and not for_funds(funded, probe):
                    return True
        return False

    def _credited(self, extra: dict[str, int]) -> WithAccounts:
        """The state as a debit would meet it were these credits posted (each account's posted raised)."""
        accounts = {}
        for account_id, amount in extra.items():
            account = self.state.account(account_id) if amount else None
            if account is not None:
                accounts[account_id] = replace(account, posted=account.posted + amount)
        return WithAccounts(self.state, accounts)

    def _counts(self, key: str, since: float) -> bool:
        """Whether the credit in flight of transaction (or linked batch) key T counts for a debit that counts
        only what copies reserved after log time `since`: it does if the coordinator has begun T (its Reserve
        reserved it, or this partition coordinates it), or if a producer's copy reserved it after `since`."""
        data = self.state.record(reservation_key(key))
        if data is not None:
            reservation = Reservation.from_json(data)
            return reservation.copy is None or reservation.at_ms > since
        copied_at = self.proc.linked_spanning.copied_at(key)
        return copied_at is None or copied_at > since

    def over_budget(self, key: str, accounts: list[str], locks: dict[str, list],
                     credits: dict[str, int],
                     returning: dict[str, int] | None = None) -> tuple[Rejection, str] | None:
        """The in-flight records a reservation rewrites (one list per account, one map per locked hold,
        credited account or payment a return holds in flight: returning) grow
        with the transactions in flight on them; past limits.IN_FLIGHT_RECORD_BYTES in total the reservation
        fails `in_flight` (retry once some are decided), so no redo record outgrows what Kafka accepts."""
        state, total = self.state, 0
        for account_id in dict.fromkeys(accounts):
            total += len(json.dumps([*(state.record(f"k/{account_id}") or []), key]))
        for hold_id, (_, amount) in locks.items():
            total += len(json.dumps({**(state.record(f"l/{hold_id}") or {}), key: amount}))
        for account_id, amount in credits.items():
            total += len(json.dumps({**(state.record(f"n/{account_id}") or {}), key: amount}))
        for paid, amount in (returning or {}).items():
            total += len(json.dumps({**(state.record(returning_key(paid)) or {}), key: amount}))
        if total > limits.IN_FLIGHT_RECORD_BYTES:
            return (Rejection.IN_FLIGHT, f"too many transactions in flight on these accounts ({total} bytes of "
                                         f"in-flight records, the limit is {limits.IN_FLIGHT_RECORD_BYTES})")
        return None

    def _lockable(self, leg: Leg, locks: dict[str, list], at_ms: int, terms: settlement.Terms,
                  taken: dict[str, int]) -> tuple[Rejection, str] | None:
        """Lock this capture's amount of its hold, judged by the core's settlement rules (a late settlement
        locks released money of an ended hold; its commit then settles it late, settlement.py)."""
        hold = self.state.hold(leg.hold_id)
        account = self.state.account(leg.account_id)
        first = leg.hold_id not in locks
        entry = locks.setdefault(leg.hold_id, [leg.account_id, 0])
        entry[1] -= leg.amount
        if not first:  # the hold was judged with the whole of what this transaction takes from it
            return None
        judged = settlement.judge_capture(leg.hold_id, hold, leg.account_id, taken[leg.hold_id], terms, at_ms,
                                          reserved=self.locked_amount(leg.hold_id))
        if type(judged) is tuple:
            return judged
        if judged:  # a late settlement: its overdraw may need the owner's receivable, which must not be closed
            receivable = self.state.account(settlement.receivable_of(account.routing_key, account.currency))
            if receivable is not None and receivable.status is core.AccountStatus.CLOSED:
                return Rejection.ACCOUNT_CLOSED, f"receivable {receivable.id} is closed"
        if account.status is core.AccountStatus.CLOSED or (account.status is core.AccountStatus.FROZEN
                                                           and not judged):
            frozen = account.status is core.AccountStatus.FROZEN
            reason = Rejection.ACCOUNT_FROZEN if frozen else Rejection.ACCOUNT_CLOSED
            return reason, f"account {account.id} is {account.status.value}"
        return None

    def _vote(self, key: str, command_id: str, fingerprint: str, body: dict, offset: int, at_ms: int) -> None:
        proc = self.proc
        pending = self._in_flight(key)
        if pending is None:  # decided already (a vote delivered twice)
            proc.commit_change(ENGINE_CLIENT, command_id, fingerprint, offset, _accepted(command_id, at_ms, "late"))
            return
        pending = pending.with_vote(body["participant"], body["reason"], body["detail"])
        if not pending.complete:
            proc.commit_change(ENGINE_CLIENT, command_id, fingerprint, offset, _accepted(command_id, at_ms),
                               records=[(coordinator_key(key), pending.to_json())])
            return
        client_id, tx_command_id = key.split("/", 1)
        tx = self._transaction({"transaction_client_id": client_id, "transaction_command_id": tx_command_id,
                                "transaction": pending.tx}, at_ms)
        failures = [(Rejection.from_code(r), d) for _, (r, d) in pending.votes if r is not None]
        commit = False
        # The decision is written before this vote's own record (which ends the in-flight record): a crash
        # between them leaves the transaction in flight with its decision made, and the redone vote finds it.
        decided = self.state.change_record(tx.client_id, tx.command_id)
        if decided is not None:  # redone after such a crash: the decision and its outputs exist
            result_wire = proc.codec.decode("result", decided["result"])
            # Committed only if that entry is this transaction's own acceptance: an entry of another command
            # under its ids (which the shell refuses to store while it is in flight) must never commit shares
            # a participant refused (P1); it can only abort.
            own = pending.fingerprint is None or decided["fingerprint"] == pending.fingerprint
            commit = result_wire["outcome"] == "accepted" and own and not failures
        elif failures:
            reason, detail = _most_urgent(failures)
            wire = rejection_to_wire(tx.command_id, tx.client_id, at_ms, reason, detail)
            proc.commit_change(tx.client_id, tx.command_id, proc.fingerprint(tx), offset, wire)
            result_wire = wire
        else:
            # Every participant reserved its legs: the commits cannot be refused, so this is the outcome.
            late = any(d == settlement.LATE_SETTLEMENT for _, (r, d) in pending.votes if r is None)
            commit = True
            result_wire = {"command_id": tx.command_id, "client_id": tx.client_id, "outcome": "accepted",
                           "reason": settlement.LATE_SETTLEMENT if late else None,
                           "detail": LATE_DETAIL if late else "", "duplicate": False,
                           "transaction_id": tx.transaction_id, "at_ms": at_ms, "holds": []}
            proc.commit_change(tx.client_id, tx.command_id, proc.fingerprint(tx), offset, result_wire)
        proc.commit_change(ENGINE_CLIENT, command_id, fingerprint, offset, _accepted(command_id, at_ms),
                           records=[(coordinator_key(key), None)])  # decided: the record ends
        for _ in range(pending.retries):
            proc.emit_result({**result_wire, "duplicate": True})
        for p in pending.reserved:
            if p != proc.partition:
                self._send(key, "Decide", p, self._key_in(tx, p), at_ms, {
                    "transaction_client_id": client_id, "transaction_command_id": tx_command_id, "commit": commit})
        self._decide_own(key, offset, at_ms, commit)

    def _decide_own(self, key: str, offset: int, at_ms: int, commit: bool | None = None) -> None:
        """The coordinator's own share, committed or released in place once the transaction is decided (no
        Decide to itself), after the vote that ends the in-flight record: a client's retry woken by it is
        then answered from the inbox. Called again by a redelivered final vote, it completes what a crash cut.
        commit: the decision, when the caller has just made or read it (else it is read from the inbox)."""
        decide_id = names.step_id(key, names.DECIDE, self.proc.partition)
        if self.state.change_record(ENGINE_CLIENT, decide_id) is not None or self._reservation(key) is None \
                or self._in_flight(key) is not None:
            return  # done, nothing reserved here, or not decided yet
        client_id, tx_command_id = key.split("/", 1)
        if commit is None:
            decided = self.state.change_record(client_id, tx_command_id)
            if decided is None:
                return
            commit = self.proc.codec.decode("result", decided["result"])["outcome"] == "accepted"
        body = {"transaction_client_id": client_id, "transaction_command_id": tx_command_id, "commit": commit}
        self._decide(key, decide_id, _fingerprint("Decide", body), body, offset, at_ms)

    def _decide(self, key: str, command_id: str, fingerprint: str, body: dict, offset: int, at_ms: int) -> None:
        proc, state = self.proc, self.state
        reservation = self._reservation(key)
        if reservation is None:  # nothing reserved here, or committed just before a crash cut this step's record
            committed = state.change_record(ENGINE_CLIENT, names.step_id(key, names.COMMIT, proc.partition))
            # A vote owed (the copy still waits) is owed no more: a decision without this partition's vote is
            # an abort, and the copy, decided later, finds it and reserves nothing (copy).
            owed = [(vote_owed_key(key), None)] if state.record(vote_owed_key(key)) is not None else []
            proc.commit_change(ENGINE_CLIENT, command_id, fingerprint, offset,
                               _accepted(command_id, at_ms, "" if committed else "late"), records=owed)
            self.drain(offset)
            return
        records = [*self._dropped(key, reservation), *self._without_timeout(key)]
        if body["commit"]:
            # The share posts as this step itself (one StateChange, one inbox entry, one result): the
            # reservation ends in the posting's own StateChange, so no state has a hold captured and still
            # locked for the same transaction (P5), whatever a crash cuts.
            self._commit(key, reservation, command_id, fingerprint, offset, records)
        else:
            for hold_id, account_id, _ in reservation.holds:
                self._release(key, hold_id, account_id, offset, at_ms)
            proc.commit_change(ENGINE_CLIENT, command_id, fingerprint, offset, _accepted(command_id, at_ms),
                               records=records)
        self._reindex(reservation)
        self.drain(offset)

    def _dropped(self, key: str, reservation: Reservation) -> list[tuple[str, Any]]:
        """The engine records without this reservation: its own record, its locks, its accounts' lists."""
        state = self.state
        records: list[tuple[str, Any]] = [(reservation_key(key), None)]
        for hold_id, _, _ in reservation.locks:
            rest = {k: v for k, v in (state.record(f"l/{hold_id}") or {}).items() if k != key}
            records.append((f"l/{hold_id}", rest or None))
        for account_id, _ in reservation.credits:
            rest = {k: v for k, v in (state.record(f"n/{account_id}") or {}).items() if k != key}
            records.append((f"n/{account_id}", rest or None))
        for transaction_id in _in_flight_on(reservation.returned):
            rest = {k: v for k, v in (state.record(returning_key(transaction_id)) or {}).items() if k != key}
            records.append((returning_key(transaction_id), rest or None))
        for account_id in reservation.accounts + self._system_shards(key, reservation):
            rest = [k for k in (state.record(f"k/{account_id}") or []) if k != key]
            records.append((f"k/{account_id}", rest or None))
        return records

    def _system_shards(self, key: str, reservation: Reservation) -> list[str]:
        """The local shards of the system accounts the transaction names, when this partition coordinates it
        (its reservation marked them: a freeze or close of them waits)."""
        if not any(routing.is_system(leg["account_id"]) for leg in reservation.tx["legs"]):
            return []  # (most transfers: no need to decode the transaction)
        client_id, command_id = key.split("/", 1)
        tx = self._transaction({"transaction_client_id": client_id, "transaction_command_id": command_id,
                                "transaction": reservation.tx}, reservation.at_ms)
        if self.plan(tx).coordinator != self.proc.partition:
            return []
        return list(dict.fromkeys(self.proc.local(leg.account_id) for leg in tx.legs
                                  if routing.is_system(leg.account_id)))

    def _reindex(self, reservation: Reservation) -> None:
        state = self.state
        for hold_id, _, _ in reservation.locks:  # expiry skipped while locked: index it again
            hold = state.hold(hold_id)
            if hold is not None and hold.status is HoldStatus.OPEN and hold.expires_at_ms is not None:
                state.expiries.put(hold_id, hold.expires_at_ms)

    def _commit(self, key: str, reservation: Reservation, decide_id: str, fingerprint: str, offset: int,
                records: list[tuple[str, Any]]) -> None:
        """This partition's legs post, under the transaction's own id, against the local clearing shard, as the
        decide step decide_id (the engine's command id of the share: streams/names.py, ``committed``)."""
        proc = self.proc
        client_id, tx_command_id = key.split("/", 1)
        original = self._transaction({"transaction_client_id": client_id, "transaction_command_id": tx_command_id,
                                      "transaction": reservation.tx}, reservation.at_ms)
        legs = [Leg(a, -n, h) for h, a, n in reservation.holds] + [Leg(a, -n, h) for h, a, n in reservation.locks]
        legs += [Leg(a, n) for a, n in reservation.credits]
        system = [leg for leg in original.legs if routing.is_system(leg.account_id)] \
            if self.plan(original).coordinator == proc.partition else []
        totals: dict[str, int] = defaultdict(int)
        for leg in legs:
            totals[proc.state.account(leg.account_id).currency] += leg.amount
        for leg in system:
            totals[routing.system_currency(leg.account_id)] += leg.amount
        legs += [Leg(proc.local(leg.account_id), leg.amount) for leg in system]
        clearing = [Leg(routing.shard_of(names.clearing(c), proc.partition), -n) for c, n in totals.items() if n]
        if not legs and not system:  # its legs here net to nothing (_reserve_share): nothing moves here
            proc.commit_change(ENGINE_CLIENT, decide_id, fingerprint, offset, _accepted(decide_id, reservation.at_ms),
                               records=records)
            return
        proc.open_shards([names.clearing(c) for c in totals] + [leg.account_id for leg in system], original,
                          offset)
        # Judged at the reservation's time: what was reserved then is posted now, whatever the clock says. The
        # share is the client's transaction (its record keeps the client, and what it returns, counted on the
        # payment's share here as the reservation judged it), posted by the engine's decide step.
        metadata = settlement.carried(original.metadata)
        if reservation.returned is not None:
            metadata += returns.carried(original.metadata)
        command = core.PostTransaction(command_id=decide_id, client_id=ENGINE_CLIENT, at_ms=reservation.at_ms,
                                       transaction_id=original.transaction_id, legs=tuple(legs + clearing),
                                       kind=original.kind, reference=original.reference, links=original.links,
                                       occurred_at_ms=original.occurred_at_ms, metadata=metadata)
        share_fingerprint = proc.fingerprint(command)
        result, changes = core.execute_share(proc.state, command, client_id, proc.currencies, reservation.returned,
                                             share_fingerprint)
        assert result.outcome == "accepted", f"reserved legs refused at commit: {result}"
        if changes.processed is None:  # posted already (answered from the inbox)
            proc.emit_result(result_to_wire(result, command.at_ms, None, []))
            return
        proc.record_decision(command, result, changes, offset, share_fingerprint, records)

    def _in_flight(self, key: str) -> InFlight | None:
        """The coordinator's record of transaction key T, None when there is none (not begun, or decided)."""
        data = self.state.record(coordinator_key(key))
        return None if data is None else InFlight.from_json(data)

    def _reservation(self, key: str) -> Reservation | None:
        """This partition's reservation for transaction key T, None when there is none."""
        data = self.state.record(reservation_key(key))
        return None if data is None else Reservation.from_json(data)

    def _release(self, key: str, hold_id: str, account_id: str, offset: int, at_ms: int, tag: str = "") -> None:
        self.proc.execute(core.ReleaseHold(command_id=names.step_id(key + tag, "release", account_id),
                                           client_id=ENGINE_CLIENT, at_ms=at_ms, hold_id=hold_id), offset)

    def _transaction(self, body: dict, at_ms: int) -> core.PostTransaction:
        """The transaction a step's body carries (its wire body, as decoded from a command or engine record:
        never changed in place, so the same object is the same transaction)."""
        wire, client_id, command_id = body["transaction"], body["transaction_client_id"], body["transaction_command_id"]
        known = self._transactions.get(id(wire))
        if known is not None and known[0] is wire and known[1:4] == (client_id, command_id, at_ms):
            return known[4]
        if len(self._transactions) >= _MEMO_SIZE:
            self._transactions.clear()
        tx = command_from_wire(command_record(client_id, command_id, "PostTransaction", wire), at_ms)
        self._transactions[id(wire)] = (wire, client_id, command_id, at_ms, tx)
        return tx
