"""The engine without a broker (its sends are stubbed): how follow-up commands are packed into records, and
what another worker's changelog writes do to a batch committed in parts."""
from __future__ import annotations

import asyncio

import pytest

from streams import engine as engine_module
from streams.config import Settings
from streams.engine import CommandRecord, Engine, PartitionLost
from streams.partition import Output, PartitionProcessor
from streams.store import MemoryStore
from tests.engine.test_partition import local_users, open_account

# Nothing is ever sent: an address nobody listens on, and librdkafka's connection-refused logs kept quiet.
NO_BROKER = Settings(bootstrap="127.0.0.1:1", prefix="unit.", security={"log_level": "0"})


def _runs(tmp_path, outputs: list[Output]) -> list[list[Output]]:
    eng = Engine(NO_BROKER, tmp_path)
    runs: list[list[Output]] = []
    eng._send_commands = lambda run: runs.append(list(run))
    eng._flush = lambda producer, errors: None
    eng._send(outputs)
    return runs


def command(partition: int, at_ms: int, size: int = 100) -> Output:
    return Output("commands", b"k", b"x" * size, partition, at_ms)


def test_follow_ups_share_a_record_per_partition_and_log_time_in_order(tmp_path):
    outputs = [command(1, 10), command(2, 10), command(1, 10), command(1, 11), command(1, 10)]
    runs = _runs(tmp_path, outputs)
    assert [[(o.partition, o.timestamp_ms) for o in run] for run in runs] == [
        [(1, 10), (1, 10)], [(1, 11)], [(1, 10)], [(2, 10)]]
    assert [o for run in runs for o in run if o.partition == 1] == [o for o in outputs if o.partition == 1]


def test_a_record_of_follow_ups_stays_far_below_kafkas_record_limit(tmp_path):
    many = [command(3, 10) for _ in range(engine_module.FOLLOW_UPS_PER_RECORD + 1)]
    assert [len(run) for run in _runs(tmp_path, many)] == [engine_module.FOLLOW_UPS_PER_RECORD, 1]
    large = [command(3, 10, size=100_000) for _ in range(12)]
    runs = _runs(tmp_path, large)
    assert all(sum(len(o.value) for o in run) <= engine_module.FOLLOW_UP_RECORD_BYTES for run in runs)
    assert sum(len(run) for run in runs) == 12 and len(runs) == 3


# --- another worker's changelog writes seen at an intermediate commit (no broker: sends are stubbed) ---------
def _engine_writing(tmp_path, monkeypatch, foreign_at_call: int) -> Engine:
    """An engine whose changelog appends land where expected, except at call foreign_at_call (1-based):
    there another worker's record came first, so ours land one offset later."""
    # An intermediate commit after every second record.
    monkeypatch.setattr(engine_module, "OUTPUTS_PER_COMMIT", 2 * _outputs_per_open())
    eng = Engine(NO_BROKER, tmp_path)
    eng.restore = lambda partition: 0
    eng._send = lambda outputs: None
    calls = {"n": 0, "end": 0}

    def send_changelog(changelogs):
        calls["n"] += 1
        offsets = {}
        for p, records in changelogs.items():
            start = calls["end"] + (1 if calls["n"] == foreign_at_call else 0)
            offsets[p] = list(range(start, start + len(records)))
            calls["end"] = start + len(records)
        return offsets

    eng._send_changelog = send_changelog
    return eng


def _outputs_per_open() -> int:
    proc = PartitionProcessor(0, 8, MemoryStore())
    proc.handle(0, 1_700_000_000_000, b"k", _records(1)[0].value)
    return len(proc.take()[0])


def _records(count: int) -> list[CommandRecord]:
    return [CommandRecord(0, i, 1_700_000_000_000, b"k", open_account(u))
            for i, u in enumerate(local_users(count))]


def test_records_left_in_a_batch_after_another_workers_writes_end_the_worker_unacked(tmp_path, monkeypatch):
    eng = _engine_writing(tmp_path, monkeypatch, foreign_at_call=1)
    with pytest.raises(PartitionLost):  # acking the records after the first commit would lose them
        asyncio.run(eng.process(_records(6)))
    eng.close()


def test_another_workers_writes_at_the_last_commit_drop_the_partition_until_restored(tmp_path, monkeypatch):
    eng = _engine_writing(tmp_path, monkeypatch, foreign_at_call=2)
    asyncio.run(eng.process(_records(4)))  # commits after records 2 and 4; the second finds a foreign write
    assert 0 not in eng._expected, "the partition must restore before its next command"
    assert eng.processors[0].state.changelog_offset() == 2, "the first commit stands; the second was dropped"
    eng.close()
