"""The engine without a broker (its sends are stubbed): how follow-up commands are packed into records, and
which redelivered records a partition skips (those its committed transactions already cover)."""
from __future__ import annotations

import asyncio


from streams import engine as engine_module
from streams.config import Settings
from streams.engine import CommandRecord, Engine
from streams.partition import Output, PartitionProcessor
from streams.store import MemoryStore
from tests.helpers.records import local_users, open_account

# Nothing is ever sent: an address nobody listens on, and librdkafka's connection-refused logs kept quiet.
NO_BROKER = Settings(bootstrap="127.0.0.1:1", prefix="unit.", security={"log_level": "0"})


def _runs(tmp_path, outputs: list[Output]) -> list[list[Output]]:
    eng = Engine(NO_BROKER, tmp_path)
    runs: list[list[Output]] = []
    eng._send_commands = lambda run, producer: runs.append(list(run))
    eng._send(outputs, None)
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


# --- records a committed transaction covers (no broker: the commit is stubbed) --------------------------------
def _outputs_per_open() -> int:
    """Outputs one opened account adds to a commit: those staged as it is decided, and its balance record, which
    the batch adds once per account changed (PartitionProcessor.take)."""
    return sum(_outputs_of_one_open())


def _outputs_of_one_open() -> tuple[int, int]:
    """(outputs staged when the command is decided, outputs take() adds for the batch)."""
    proc = PartitionProcessor(0, 8, MemoryStore())
    proc.handle(0, 1_700_000_000_000, b"k", _records(1)[0].value)
    staged = len(proc.outputs)
    return staged, len(proc.take()[0]) - staged


def _records(count: int) -> list[CommandRecord]:
    return [CommandRecord(0, i, 1_700_000_000_000, b"k", open_account(u))
            for i, u in enumerate(local_users(count))]


def _engine_covering(tmp_path, monkeypatch, covered: int) -> tuple[Engine, list]:
    """An engine whose restore finds the partition's commands covered below `covered`; commits are recorded."""
    # A commit as soon as two records' outputs are staged (checked between records, before take() adds balances).
    monkeypatch.setattr(engine_module, "OUTPUTS_PER_COMMIT", 2 * _outputs_of_one_open()[0])
    eng = Engine(NO_BROKER, tmp_path)
    commits: list[tuple[dict, int]] = []

    def restore(partition):
        eng.covered[partition] = covered
        return 0

    def commit(owned, upto):
        outputs, _ = eng.processors[0].take()
        eng.processors[0].state.commit(0)  # step 5: the staged state written, so the next batch starts clean
        commits.append((dict(upto), len(outputs)))
        eng.covered.update(upto)

    eng.restore, eng.commit = restore, commit
    return eng, commits


def test_redelivered_records_a_committed_transaction_covers_are_skipped_without_a_result(tmp_path, monkeypatch):
    eng, commits = _engine_covering(tmp_path, monkeypatch, covered=3)
    asyncio.run(eng.process(_records(6)))
    per_open = _outputs_per_open()
    assert commits == [({0: 5}, 2 * per_open), ({0: 6}, per_open)], "records 0-2 were committed before"
    assert eng.skipped_records == 3
    asyncio.run(eng.process(_records(6)))  # all of them again (a redelivery after a crash before the ack)
    assert len(commits) == 2 and eng.skipped_records == 9
    eng.close()
