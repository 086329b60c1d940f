"""Settlement terms: how a transaction's captures may settle the holds they name. Decided here, once.

A transaction states its terms in two reserved metadata keys (so they travel with it, are recorded on it and
need no change of the wire format):

* ``ledger.capture``: ``partial`` (the default: a hold may be captured in several pieces, e.g. fills) or
  ``exact`` (a settling entry must move exactly what the hold still reserves, e.g. a withdrawal's completion).
* ``ledger.settlement``: ``external`` says the outside world has already made this settlement (custody paid
  out, the exchange matched the fill). Like a card's late presentment after its authorisation expired, it is
  never refused because its hold ended first:

  - an open hold past its ``expires_at_ms`` (not yet expired by the engine) is captured as usual;
  - a hold that ended RELEASED or EXPIRED is settled *late*: the money its end returned to available is
    taken again (the hold's ``released`` moves to ``captured``; its status keeps saying how it ended). What
    the account's available cannot cover without crossing its floor (P2 holds) is posted to the owner's
    receivable account (:func:`receivable_of`, opened by the same decision, may go negative), a debt the
    owner owes and operations collect. The result is accepted with the notice ``late_settlement``.

  A CAPTURED hold is still ``hold_not_open`` (a second settlement of the same reservation), a capture above
  what the hold reserved (or released) is still ``capture_exceeds_hold``.

Without the key, captures keep the strict rules (``hold_not_open``, ``hold_expired``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from streams.core.model import Hold, HoldStatus
from streams.core.rejections import Rejection

CAPTURE_KEY = "ledger.capture"
SETTLEMENT_KEY = "ledger.settlement"
PARTIAL = "partial"
EXACT = "exact"
EXTERNAL = "external"
CAPTURE_MODES = (PARTIAL, EXACT)
# The notice on an accepted result (the wire's ``reason``) whose transaction settled an ended hold.
LATE_SETTLEMENT = "late_settlement"
# Receivable account ids: ``<routing key>:receivable.<currency>``.
RECEIVABLE_MARK = "receivable."


@dataclass(frozen=True, slots=True)
class Terms:
    exact: bool = False  # every capture must move exactly what its hold still reserves
    external: bool = False  # already settled outside: an ended or overdue hold does not refuse it


STRICT = Terms()


def terms_of(metadata: Iterable[tuple[str, str]]) -> Terms | str:
    """The terms a transaction's metadata states, or why they are malformed (an invalid_command detail)."""
    exact = external = False
    for key, value in metadata:
        if key == CAPTURE_KEY:
            if value not in CAPTURE_MODES:
                return f"{CAPTURE_KEY} must be one of {CAPTURE_MODES}, got {value[:40]!r}"
            exact = value == EXACT
        elif key == SETTLEMENT_KEY:
            if value != EXTERNAL:
                return f"{SETTLEMENT_KEY} must be {EXTERNAL!r}, got {value[:40]!r}"
            external = True
    return Terms(exact, external) if (exact or external) else STRICT


def carried(metadata: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """The terms' own metadata pairs, for the engine's commit of a multi-partition transaction."""
    return tuple((k, v) for k, v in metadata if k in (CAPTURE_KEY, SETTLEMENT_KEY))


def ended(hold: Hold) -> bool:
    """Released or expired: the hold's remainder went back to available (a late settlement takes it again)."""
    return hold.status is HoldStatus.RELEASED or hold.status is HoldStatus.EXPIRED


def judge_capture(hold_id: str, hold: Hold | None, account_id: str, taken: int, terms: Terms, at_ms: int,
                  reserved: int = 0) -> tuple[Rejection, str] | bool:
    """May a transaction with ``terms`` take ``taken`` from hold ``hold_id`` (``hold``: its record, None when
    it does not exist) on ``account_id`` at log time ``at_ms``?

    ``reserved``: what other transactions in flight have locked of it already (the engine's multi-partition
    path). Returns a rejection, else whether the capture is a late settlement (True) or an ordinary one.
    """
    if hold is None or hold.account_id != account_id:
        return (Rejection.UNKNOWN_HOLD, f"hold {hold_id} does not exist on account {account_id}")
    late = False
    if hold.status is HoldStatus.OPEN:
        if not terms.external and hold.expires_at_ms is not None and hold.expires_at_ms <= at_ms:
            return (Rejection.HOLD_EXPIRED, f"hold {hold.id} expired at {hold.expires_at_ms}")
        settleable = hold.remaining
    elif terms.external and ended(hold):
        late, settleable = True, hold.released
    else:
        return (Rejection.HOLD_NOT_OPEN, f"hold {hold.id} is {hold.status.value}")
    free = settleable - reserved
    if taken > free:
        return (Rejection.CAPTURE_EXCEEDS_HOLD, f"capture {taken} from hold {hold.id} with {free} remaining")
    if terms.exact and taken != settleable:
        return (Rejection.CAPTURE_NOT_EXACT,
                f"hold {hold.id} settles exactly: capture {settleable}, not {taken}")
    return late


def receivable_of(routing_key: str, currency: str) -> str:
    """The account that records what its owner owes after a late settlement its available could not cover.

    One per owner (routing key) and currency, so it lives in the partition of the account that overdrew:
    ``user:42:USDT`` -> ``user:42:receivable.USDT``.
    """
    return f"{routing_key}:{RECEIVABLE_MARK}{currency}"
