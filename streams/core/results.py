"""The answer to a command: accepted with its events, or rejected with one reason. A value, not an exception."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from streams.core.events import Event
from streams.core.rejections import Rejection

ACCEPTED: Literal["accepted"] = "accepted"
REJECTED: Literal["rejected"] = "rejected"


@dataclass(frozen=True, slots=True)
class Result:
    """Exactly one per command (P8); a retry gets the stored one back with duplicate=True (P4)."""

    command_id: str  # the command answered
    client_id: str  # its client (ids are scoped by client)
    outcome: Literal["accepted", "rejected"]  # what was decided
    reason: Rejection | None  # why it was rejected; None when accepted
    detail: str  # human-readable explanation for logs and operators; "" when accepted
    events: tuple[Event, ...]  # what happened (empty when rejected)
    duplicate: bool = False  # True when this is the stored answer to an earlier delivery
    # Accepted, with something operations must know (the wire's reason): "late_settlement" (settlement.py).
    notice: str | None = None

    @property
    def accepted(self) -> bool:
        """True when the command took effect."""
        return self.outcome == ACCEPTED


@dataclass(frozen=True, slots=True)
class Processed:
    """An inbox entry: how a command id was decided, to answer retries and detect conflicts."""

    fingerprint: str  # sha256 of the command's payload (see Command.fingerprint)
    result: Result  # the original result (duplicate=False)
