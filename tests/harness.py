"""Test harness: the broker tests' topics, workers and checks. The launcher and the throwaway topics are the
product's own (connectors/local_worker.py, connectors/scratch.py; the benchmarks use them too), as is the
strict exactly-once check (projections/exactly_once.py); what only the tests need stays here."""
from __future__ import annotations

import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from connectors.local_worker import RESTORED, Worker
from connectors.scratch import bootstrap, drop, fresh_settings
from projections.ends import End, Ends, Unreadable, stuck
from projections.exactly_once import assert_exactly_once
from projections.topics import TopicRecord
from projections.verify import Streams, check, format_report, read_streams, wait_quiescent
from streams import config
from streams.config import Settings

__all__ = ["RESTORED", "ROOT", "Worker", "assert_books_ok", "assert_exactly_once", "bootstrap", "broker_api_versions",
           "changelog_ends", "drop", "fresh_settings", "load_settings", "topic_ends"]

ROOT = Path(__file__).resolve().parent.parent


def changelog_ends(settings: Settings) -> dict[int, int]:
    """The end offset of every partition of the changelog topic."""
    consumer = Consumer({**settings.kafka_config(), "group.id": f"ends-{uuid.uuid4()}"})
    try:
        topic = settings.topic("changelog")
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in range(settings.partitions)}
    finally:
        consumer.close()


def broker_api_versions(server: str) -> tuple[str, int]:
    """(cluster id, broker count) as the broker reports them."""
    md = AdminClient({"bootstrap.servers": server}).list_topics(timeout=10)
    return md.cluster_id, len(md.brokers)


def assert_books_ok(settings: Settings):
    """Once the workers caught up with the commands topic, every oracle of projections/verify.py holds; the
    report (for its counts). On a violation the message also gives, per partition of each topic the oracles
    read, how far the reader got and where the topic ends now (topic_ends)."""
    assert wait_quiescent(settings), "the workers did not catch up with the commands topic"
    streams = read_streams(settings)
    report = check(streams)  # verify(settings), keeping what was read for the failure message
    if not report.ok:
        raise AssertionError(format_report(report) + "\n" + topic_ends(settings, streams))
    return report


# The topics the oracles read (projections/verify.py, read_streams), and the changelog the quiet point is judged by.
_READ_FIELD = {"commands": "commands", "results": "results", "history": "history", "balances": "balances",
               "dlq": "dead_letters"}  # topic -> the Streams field the oracles read it into (the changelog: none)


def topic_ends(settings: Settings, streams: Streams | None = None, timeout_s: float = 30.0,
               settle_s: float = 5.0) -> str:
    """Where each topic the oracles read ends, per partition (projections/ends.py): the first offset, the last
    stable offset (LSO: the end a read_committed reader sees, held back by the earliest transaction still open
    there), the high watermark (HWM: the end a read_uncommitted reader sees) and, given what the oracles read,
    the offset after the last record they got. For a failure message: a passing run never calls it.

    LSO < HWM: a transaction is open in that partition; those whose LSO did not move settle_s later are named
    (projections.ends.stuck). A reader that got more than one offset less than the LSO (a commit marker takes the
    last one) stopped short of the end it was given, or the LSO moved since, or only aborted records and
    markers follow."""
    read: dict[str, dict[int, int]] = {}
    for name, field in _READ_FIELD.items():
        if streams is not None:
            reached: dict[int, int] = {}
            record: TopicRecord
            for record in getattr(streams, field):
                reached[record.partition] = max(reached.get(record.partition, 0), record.offset + 1)
            read[name] = reached
    deadline = time.monotonic() + timeout_s
    lines = ["where each topic ends now, per partition (LSO: the end a read_committed reader sees; HWM: the high "
             "watermark; read: the offset after the last record the oracles got, - for none; ! LSO below HWM, "
             "< read more than one offset below the LSO):"]
    with Ends(settings) as ends:
        found = ends.all(deadline=deadline)
        for e in found:
            if isinstance(e, Unreadable):
                lines.append(f"  ? {e.topic}[{e.partition}]: {e.error}")
                continue
            got = read.get(e.topic, {}).get(e.partition)
            seen = "" if e.topic not in read else f"  read {'-' if got is None else got}"
            mark = "!" if e.open else "<" if got is not None and got < e.lso - 1 else " "
            lines.append(f"  {mark} {e.topic}[{e.partition}]  first {e.first}  LSO {e.lso}  HWM {e.hwm}{seen}")
        held = stuck(ends, [e for e in found if isinstance(e, End) and e.open], settle_s, deadline)
    if held:
        lines.append(f"  the LSO did not move in {settle_s:g} s: "
                     + ", ".join(f"{e.topic}[{e.partition}] at {e.lso} (HWM {e.hwm})" for e in held)
                     + ": a transaction stays open there, and read_committed readers see nothing committed after "
                       "its first record")
    return "\n".join(lines)


def load_settings() -> Settings:
    return config.load()
