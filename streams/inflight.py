"""The two-phase protocol's durable records (streams/spanning.py), typed: the coordinator's ``c/<T>`` and a
participant's reservation ``r/<T>``, where T is the transaction's key ``client_id/command_id``.

Both are engine records: JSON written in the StateChange of the step that changes them, so they are read back
after a crash or a rebuild exactly as written. Their JSON keeps its field order (a dict's insertion order, which
the state records' encoder keeps, streams/partition.py): the same log gives byte-identical changelogs (P7).
Records written before a field existed read as the code that wrote them meant (see each from_json).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from streams.core.returns import Returned


def coordinator_key(key: str) -> str:
    """The engine record key of the coordinator's record of transaction key T."""
    return f"c/{key}"


def reservation_key(key: str) -> str:
    """The engine record key of a participant's reservation for transaction key T."""
    return f"r/{key}"


def vote_owed_key(key: str) -> str:
    """The engine record key of a Reserve that came while the producer's copy of transaction key T waited in
    this partition's queue: the copy votes when its turn comes ({"at_ms": the Reserve's log time})."""
    return f"rv/{key}"


def returning_key(transaction_id: str) -> str:
    """The engine record key of the returns in flight of a payment posted here (or of a step of one):
    {T: amount} for each return's reservation that counts on it, dropped at its decision (a commit counts
    the return on the payment's own record), so two returns in flight cannot both pass its unreturned check."""
    return f"u/{transaction_id}"


# Engine records indexing the producers' copies whose reservation waits for the coordinator's Reserve, by
# when that wait ends: ``o/<due_ms, 20 digits>/<T>``, one per copy, written with the copy's reservation and
# deleted with its confirmation or drop. The partition state keeps them in a heap by due time
# (streams/partition.py), so the check made before every command looks at the earliest one only. (Earlier
# versions kept one list of every copy in flight under ``o``, rewritten whole by each copy and each
# confirmation: its size, and the cost of each command, grew with the copies in flight. It is still read until
# it empties: streams/spanning.py.)
COPY_DUE = "o/"


def copy_due_key(due_ms: int, key: str) -> str:
    """The engine record key indexing the copy's reservation of transaction key T, due at due_ms."""
    return f"{COPY_DUE}{due_ms:020d}/{key}"


def parse_copy_due(record_key: str) -> tuple[int, str]:
    """(due_ms, T) of a copy_due_key."""
    _, due, key = record_key.split("/", 2)
    return int(due), key


class Status(str, Enum):
    """Where the coordinator's record is in its life. There is no stored "decided": the vote that completes
    the record decides the transaction and deletes the record in the same StateChange, so a record that
    exists is undecided, and none (after a begin) is decided."""

    BEGUN = "begun"    # written by begin: Reserve sent to every participant, no vote in yet
    VOTING = "voting"  # at least one vote is in, not all


Vote = tuple[str | None, str]  # (rejection code, or None when the participant reserved; detail)


@dataclass(frozen=True)
class InFlight:
    """The coordinator's record of a transaction it has begun and not yet decided."""

    tx: dict[str, Any]  # the transaction's PostTransaction body, as on the wire
    at_ms: int
    participants: tuple[int, ...]
    votes: tuple[tuple[str, Vote], ...]  # (participant, its vote) in arrival order
    retries: int  # retries of the client's command while in flight: each gets the decision, flagged duplicate
    fingerprint: str | None  # of the client's command (None in records from before it was kept)
    status: Status = Status.BEGUN

    @classmethod
    def begun(cls, tx: dict[str, Any], at_ms: int, participants: list[int], fingerprint: str) -> "InFlight":
        return cls(tx, at_ms, tuple(participants), (), 0, fingerprint, Status.BEGUN)

    def with_vote(self, participant: int, reason: str | None, detail: str) -> "InFlight":
        votes = dict(self.votes)
        votes[str(participant)] = (reason, detail)
        return replace(self, votes=tuple(votes.items()), status=Status.VOTING)

    def with_retry(self) -> "InFlight":
        return replace(self, retries=self.retries + 1)

    @property
    def complete(self) -> bool:
        """Every participant has voted: the next step decides the transaction."""
        return len(self.votes) >= len(self.participants)

    @property
    def reserved(self) -> list[int]:
        """The participants that reserved their legs (each gets the Decide), in order."""
        return sorted(int(p) for p, (reason, _) in self.votes if reason is None)

    def to_json(self) -> dict[str, Any]:
        return {"tx": self.tx, "at_ms": self.at_ms, "participants": list(self.participants),
                "votes": {p: [reason, detail] for p, (reason, detail) in self.votes}, "retries": self.retries,
                "fingerprint": self.fingerprint, "status": self.status.value}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "InFlight":
        votes = tuple((p, (reason, detail)) for p, (reason, detail) in data["votes"].items())
        # Before the status was stored, a record with votes in was being voted on, one without had just begun.
        status = Status(data["status"]) if "status" in data else Status.VOTING if votes else Status.BEGUN
        return cls(data["tx"], data["at_ms"], tuple(data["participants"]), votes, data["retries"],
                   data.get("fingerprint"), status)


@dataclass(frozen=True)
class Reservation:
    """What a participant reserved of a transaction's legs, until the coordinator's Decide (or a copy's wait
    ends). Amounts are minor units, positive."""

    holds: tuple[tuple[str, str, int], ...]  # (internal hold id, account, amount) placed on plain debits
    locks: tuple[tuple[str, str, int], ...]  # (client hold id, account, amount) locked of holds it captures
    credits: tuple[tuple[str, int], ...]  # (account, amount) judged to fit, counted in n/<account> meanwhile
    at_ms: int  # the reservation's log time: the commit is judged then
    tx: dict[str, Any]  # the transaction's PostTransaction body, as on the wire
    tag: str  # "~copy" when reserved at the producer's copy (its internal holds' ids carry it), else ""
    copy: str | None  # the copy's fingerprint until the coordinator's Reserve confirms it, else None
    # For a share of a return: what it returns of the payment's share here (payer, payee, amount, the
    # transactions counting it), as judged at the reservation; its commit counts it. None otherwise.
    returned: Returned | None = None

    def confirmed(self) -> "Reservation":
        """The copy's reservation, taken as this partition's vote."""
        return replace(self, copy=None)

    @property
    def accounts(self) -> list[str]:
        """The accounts it reserves on (holds, locks, credits), each once, in that order."""
        return list(dict.fromkeys([a for _, a, _ in self.holds] + [a for _, a, _ in self.locks]
                                  + [a for a, _ in self.credits]))

    def to_json(self) -> dict[str, Any]:
        return {"holds": [list(h) for h in self.holds], "locks": [list(lock) for lock in self.locks],
                "credits": [list(c) for c in self.credits], "at_ms": self.at_ms, "tx": self.tx, "tag": self.tag,
                "copy": self.copy, **({} if self.returned is None else {"returned": [
                    self.returned.payer, self.returned.payee, self.returned.amount, list(self.returned.counted)]})}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Reservation":
        # Records from before credits were reserved have none; before copies, no tag and no copy.
        return cls(tuple((h, a, n) for h, a, n in data["holds"]), tuple((h, a, n) for h, a, n in data["locks"]),
                   tuple((a, n) for a, n in data.get("credits", [])), data["at_ms"], data["tx"],
                   data.get("tag", ""), data.get("copy"), _returned(data.get("returned")))


def _returned(data: list | None) -> Returned | None:
    """A reservation's returned, None in records of other transactions and from before returns crossed
    partitions."""
    if data is None:
        return None
    payer, payee, amount, counted = data
    return Returned(payer, payee, amount, tuple(counted))
