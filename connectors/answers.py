"""Which published result answers which send, for one client (both LedgerClient and AsyncLedgerClient).

The results topic carries, per command id, the decision (once), duplicate answers to retries (the decision
again, flagged), and `id_conflict` answers to sends that reused the id with another payload. A client must
report the answer to the send it made, not the first answer it happens to see:

- the k-th send of the payload first sent under that id is answered by the k-th answer that is not an
  `id_conflict`: the decision for the first (or, if the decision was published before this client
  listened, a duplicate answer repeating it), duplicate answers for the retries;
- the n-th send under that id with another payload is answered by the n-th `id_conflict` answer;
- if the first payload this client sent is itself refused `id_conflict` (an earlier process used the id
  for something else), no decision comes for it: an `id_conflict` beyond those expected answers it.

Payloads are compared by the encoded command record, which is deterministic for a given command.
"""
from __future__ import annotations

from dataclasses import dataclass, field

ID_CONFLICT = "id_conflict"


@dataclass
class _Sends:
    first: int | None  # hash of the first payload sent under this id (None: raw bytes, payload unknown)
    same: int = 0  # sends of that payload
    conflicting: int = 0  # sends of any other payload
    latest_conflicts: bool = False
    answers: list[dict] = field(default_factory=list)  # the decision and duplicate answers, as they came
    conflicts: list[dict] = field(default_factory=list)  # id_conflict answers, as they came


class Answers:
    def __init__(self) -> None:
        self._by_id: dict[str, _Sends] = {}

    def sent(self, command_id: str, encoded: bytes) -> None:
        digest = hash(encoded)
        sends = self._by_id.setdefault(command_id, _Sends(None))
        if sends.first is None:
            sends.first = digest
        sends.latest_conflicts = digest != sends.first
        if sends.latest_conflicts:
            sends.conflicting += 1
        else:
            sends.same += 1

    def received(self, result: dict) -> str | None:
        """Record a result of this client; returns its command id when the latest send is now answered."""
        # A result for an id this object never sent through send() (raw bytes, or another process under
        # the same client id) is kept too: its first answer answers a wait for it.
        sends = self._by_id.setdefault(result["command_id"], _Sends(None))
        (sends.conflicts if result["reason"] == ID_CONFLICT else sends.answers).append(result)
        return result["command_id"] if self.answer(result["command_id"]) is not None else None

    def answer(self, command_id: str) -> dict | None:
        """The answer to the latest send of this id, or None while it has not arrived."""
        sends = self._by_id.get(command_id)
        if sends is None:
            return None
        if sends.latest_conflicts:
            n = sends.conflicting
            return sends.conflicts[n - 1] if len(sends.conflicts) >= n else None
        k = max(sends.same, 1)
        if len(sends.answers) >= k:
            return sends.answers[k - 1]
        if not sends.answers and len(sends.conflicts) > sends.conflicting:
            return sends.conflicts[-1]
        return None
