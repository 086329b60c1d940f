"""Who may commit a partition's changelog, and what a worker's store may claim of it (docs/engine.md, "The commit
path"). On the real broker.

A worker's transaction carries its group membership, and the group coordinator refuses it from a worker that is
no longer a member of the group's current generation (streams/membership.py): the fence that keeps a worker that
lost its partitions (paused past its session, then woken) from committing, whichever worker took its partitions
and whenever. And a store that covers more than the committed changelog holds is refused at its restore."""
from __future__ import annotations

import asyncio
import logging
import struct
import time

import pytest
from confluent_kafka import Consumer

from projections.topics import read_topic
from streams import membership
from streams.engine import CommandRecord, DeliveryFailed, Engine
from tests.helpers.records import local_users, open_account

NOW_MS = 1_700_000_000_000


def _member(settings, group: str) -> Consumer:
    consumer = Consumer({**settings.kafka_config(), "group.id": group, "enable.auto.commit": False,
                         "session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
    consumer.subscribe([settings.topic("commands")])
    return consumer


def _generation(metadata: bytes) -> int:
    return struct.unpack("=i", metadata[len(membership.MAGIC):len(membership.MAGIC) + 4])[0]


def _until(condition, members: list[Consumer], what: str, timeout_s: float = 60) -> None:
    """Poll every member (a rebalance needs them all) until the condition holds."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        for member in members:
            member.poll(0.1)


def _result_ids(settings, waiting_for: str, timeout_s: float = 30) -> set[str]:
    """The command ids of the results topic once `waiting_for` is among them: commit_transaction returns before
    the coordinator has written the commit markers, and a read_committed reader sees the records only then."""
    deadline = time.monotonic() + timeout_s
    while True:
        ids = {r.value["command_id"] for r in read_topic(settings, "results") if r.value is not None}
        if waiting_for in ids or time.monotonic() > deadline:
            return ids
        time.sleep(0.1)


def test_the_membership_is_what_librdkafka_makes_of_the_same_member(settings):
    group = f"{settings.prefix}membership"
    consumer = _member(settings, group)
    try:
        _until(lambda: consumer.assignment(), [consumer], "an assignment")
        real = consumer.consumer_group_metadata()
        assert _generation(real) >= 1
        assert membership.group_metadata(group, _generation(real), consumer.memberid()) == real
    finally:
        consumer.close()


def test_refuses_ids_librdkafka_could_not_read():
    with pytest.raises(ValueError):
        membership.group_metadata("workers", 1, "member\x00id")
    with pytest.raises(ValueError):
        membership.group_metadata("wörkers", 1, "member")
    with pytest.raises(ValueError):  # outside any generation: the coordinator would check nothing
        membership.group_metadata("workers", -1, "")


def test_a_worker_whose_generation_has_passed_cannot_commit(settings, tmp_path, caplog):
    """The engine commits under the membership of the first member; a second member joins and the group moves to
    a new generation. The engine's next transaction (under the old membership) is refused by the group
    coordinator: the batch ends unacknowledged, named a fence, and none of its outputs is visible."""
    group = f"{settings.prefix}workers"
    first = _member(settings, group)
    second = None
    engine = Engine(settings, tmp_path / "engine")
    try:
        _until(lambda: len(first.assignment()) == settings.partitions, [first], "the first member's assignment")
        old = first.consumer_group_metadata()
        engine.assign(range(settings.partitions), old)
        before, after = local_users(2)  # both in partition 0
        asyncio.run(engine.process([CommandRecord(0, 0, NOW_MS, b"k", open_account(before))]))
        assert f"open:{before}" in _result_ids(settings, f"open:{before}"), "committed under the current membership"

        second = _member(settings, group)
        _until(lambda: second.assignment() and _generation(first.consumer_group_metadata()) > _generation(old),
               [first, second], "a new generation with both members")
        with caplog.at_level(logging.WARNING), pytest.raises(DeliveryFailed, match=r"partitions \[0\]"):
            asyncio.run(engine.process([CommandRecord(0, 1, NOW_MS, b"k", open_account(after))]))
        assert "partition 0: transaction fenced" in caplog.text, caplog.text
        ids = _result_ids(settings, f"open:{after}", timeout_s=3)
        assert f"open:{before}" in ids and f"open:{after}" not in ids, "the refused transaction never commits"
    finally:
        engine.close()
        first.close()
        if second is not None:
            second.close()


class _CommitAborts:
    """The committing producer, except that its commit aborts while reporting success: what the worker sees when
    a broker dies writing the transaction's commit markers and a later abort by the same transactional id
    discards what it wrote (docs/reliability.md, "Hazards still open")."""

    def __init__(self, producer):
        self._producer = producer

    def __getattr__(self, name):
        return getattr(self._producer, name)

    def __len__(self):
        return len(self._producer)

    def commit_transaction(self, timeout=None):
        self._producer.abort_transaction(timeout)


def test_a_store_ahead_of_the_committed_changelog_is_rebuilt_and_its_commands_decided_again(settings, tmp_path,
                                                                                            caplog):
    """The store covers a batch whose transaction the changelog does not hold: its restore refuses the store and
    rebuilds it from the changelog, so the batch's command is decided again (its result published) instead of
    being skipped as covered."""
    first, second = local_users(2)
    engine = Engine(settings, tmp_path / "engine")
    try:
        asyncio.run(engine.process([CommandRecord(0, 0, NOW_MS, b"k", open_account(first))]))
        engine.producer = _CommitAborts(engine.producer)
        asyncio.run(engine.process([CommandRecord(0, 1, NOW_MS, b"k", open_account(second))]))
        assert engine.covered[0] == 2, "the store believes the second batch committed"
    finally:
        engine.close()
    again = Engine(settings, tmp_path / "engine")
    try:
        with caplog.at_level(logging.WARNING):
            again.restore(0)
        assert "ahead of the committed changelog" in caplog.text, caplog.text
        assert again.covered[0] == 1, "rebuilt from the changelog: the second command is not covered"
        asyncio.run(again.process([CommandRecord(0, 1, NOW_MS, b"k", open_account(second))]))
        assert f"open:{second}" in _result_ids(settings, f"open:{second}")
    finally:
        again.close()
