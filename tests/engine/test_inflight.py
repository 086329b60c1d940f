"""The two-phase records (streams/inflight.py), broker-free: what is written reads back as itself, the
coordinator's record goes begun -> voting (decided: deleted), and records written before the status was stored
read as the code that wrote them meant."""
from __future__ import annotations

import json

from streams.inflight import InFlight, Reservation, Status

TX = {"transaction_id": "t1", "kind": "trade", "legs": []}


def _stored(value: dict) -> dict:
    """As an engine record goes through the store (streams/partition.py writes compact JSON)."""
    return json.loads(json.dumps(value, separators=(",", ":")))


def test_the_coordinators_record_is_begun_then_voting_until_every_vote_is_in():
    record = InFlight.begun(TX, 5, [3, 1], "fp")
    assert record.status is Status.BEGUN and not record.complete
    record = record.with_vote(3, None, "")
    assert record.status is Status.VOTING and not record.complete
    record = record.with_vote(1, "insufficient_funds", "account a: 0 available")
    assert record.complete and record.reserved == [3]
    assert InFlight.from_json(_stored(record.to_json())) == record


def test_a_retry_is_counted_and_a_vote_again_replaces_the_first_in_its_place():
    record = InFlight.begun(TX, 5, [1, 2], "fp").with_vote(2, "in_flight", "x").with_vote(1, None, "")
    record = record.with_vote(2, None, "").with_retry()
    assert record.votes == (("2", (None, "")), ("1", (None, ""))) and record.retries == 1


def test_the_json_is_the_same_bytes_for_the_same_record():
    a = InFlight.begun(TX, 5, [1, 2], "fp").with_vote(2, None, "")
    b = InFlight.from_json(_stored(a.to_json()))
    assert json.dumps(a.to_json()) == json.dumps(b.to_json())
    assert list(a.to_json()) == ["tx", "at_ms", "participants", "votes", "retries", "fingerprint", "status"]


def test_a_record_from_before_the_status_reads_as_begun_or_voting_by_its_votes():
    old = {"tx": TX, "at_ms": 5, "participants": [1, 2], "votes": {}, "retries": 0}
    assert InFlight.from_json(old).status is Status.BEGUN and InFlight.from_json(old).fingerprint is None
    old["votes"] = {"1": [None, ""]}
    assert InFlight.from_json(old).status is Status.VOTING


def test_a_reservation_reads_back_as_written_and_old_ones_without_credits_or_copy():
    reservation = Reservation(holds=(("~k~a", "a", 7),), locks=(("h1", "b", 3),), credits=(("c", 10),), at_ms=9,
                              tx=TX, tag="~copy", copy="fp")
    assert Reservation.from_json(_stored(reservation.to_json())) == reservation
    assert reservation.accounts == ["a", "b", "c"] and reservation.confirmed().copy is None
    old = Reservation.from_json({"holds": [["~k~a", "a", 7]], "locks": [], "at_ms": 9, "tx": TX})
    assert (old.credits, old.tag, old.copy) == ((), "", None)
