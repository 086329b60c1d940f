"""Long-open holds, for operations: `ledger holds --open-longer-than 7d` lists them, `--release HOLD` ends one.

An order or a withdrawal hold is meant to end by its close, its failure report or its expiry. One whose
event was lost and which has no expiry (its event stated no time: docs/rules.md, "Expiry policy") would
keep the money reserved forever; this lists such holds so an operator can look, and release the one
that is stranded. Releasing is safe for a settlement that arrives after all: it still posts (late
settlement, streams/core/settlement.py).

The listing folds the results topic: every result names the holds its command changed, after the change,
at its log time. A hold is open while no result shows it ended (the read side's hold fold); it was placed at
the first log time it appears. The engine's own internal holds (``~...``) are left out.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from projections.fold import fold_holds, remaining

_DURATION = re.compile(r"([0-9]+(?:\.[0-9]+)?)([smhd]?)\Z")
_UNIT_MS = {"": 1000, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def duration_ms(text: str) -> int:
    """'90' or '90s', '30m', '12h', '7d' -> milliseconds."""
    match = _DURATION.match(text.strip())
    if match is None:
        raise ValueError(f"a duration is a number with s, m, h or d (seconds by default), got {text!r}")
    number, unit = match.groups()
    whole, _, fraction = number.partition(".")
    scale = 10 ** len(fraction)
    return (int(whole + fraction) * _UNIT_MS[unit]) // scale


@dataclass(frozen=True, slots=True)
class OpenHold:
    hold_id: str
    account_id: str
    amount: int  # minor units placed
    remaining: int  # minor units still reserved
    placed_at_ms: int  # log time of the first result that shows it
    expires_at_ms: int | None

    def age_ms(self, now_ms: int) -> int:
        return now_ms - self.placed_at_ms


def open_holds(results: Iterable[dict], now_ms: int, older_than_ms: int = 0) -> list[OpenHold]:
    """The holds still open in these decoded Result records, placed at least older_than_ms before now_ms,
    oldest first. A hold's state is the read side's fold of the results (projections/fold.py: the most
    settled state wins, whatever order the partitions' results come in)."""
    placed: dict[str, int] = {}

    def noting_when_placed(results: Iterable[dict]) -> Iterator[dict]:  # one pass over the topic
        for result in results:
            for h in result["holds"]:
                placed[h["hold_id"]] = min(result["at_ms"], placed.get(h["hold_id"], result["at_ms"]))
            yield result

    found = []
    for hold_id, h in fold_holds(noting_when_placed(results)).items():
        if hold_id.startswith("~") or h["status"] != "open" or now_ms - placed[hold_id] < older_than_ms:
            continue
        found.append(OpenHold(hold_id, h["account_id"], int(h["amount"]), remaining(h), placed[hold_id],
                              h["expires_at_ms"]))
    return sorted(found, key=lambda o: (o.placed_at_ms, o.hold_id))
