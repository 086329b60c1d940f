"""The topics of a run of real partition processors, as `read_topic` would return them, without a broker:
eight PartitionProcessors on in-memory stores, follow-up commands delivered in order, every record they publish
(and every command sent to them) kept at its partition and offset. What the oracles of projections/verify.py
are run over in the broker-free tests (tests/read/test_oracles.py, test_settlement_oracles.py)."""
from __future__ import annotations

from collections import defaultdict, deque

from projections.topics import records_of
from projections.verify import Streams
from streams import routing
from streams.partition import PartitionProcessor
from streams.store import MemoryStore
from tests.helpers.records import N

TOPICS = ("commands", "results", "history", "balances", "dlq")
START_MS = 1_700_000_000_000


class Recorder:
    """Eight partition processors; follow-up commands delivered in order; every topic recorded per partition."""

    def __init__(self) -> None:
        self.sealed: dict[tuple[int, int], list] = {}  # (partition, offset) -> headers of a follow-up
        self.procs = {p: PartitionProcessor(p, N, MemoryStore()) for p in range(N)}
        self.logs: dict[str, dict[int, list[tuple[int, bytes | None, bytes | None]]]] = {
            name: defaultdict(list) for name in TOPICS}
        self.pending: dict[int, deque[int]] = defaultdict(deque)  # partition -> offsets of commands to process
        self.clock = START_MS

    def send(self, value: bytes, account: str, key: bytes = b"k") -> None:
        self.clock += 10
        self._append_command(routing.partition_of_account(account, N), self.clock, key, value)

    def _append_command(self, partition: int, at_ms: int, key: bytes | None, value: bytes) -> None:
        log = self.logs["commands"][partition]
        self.pending[partition].append(len(log))
        log.append((at_ms, key, value))

    def run(self) -> None:
        while any(self.pending.values()):
            for partition, offsets in self.pending.items():
                if not offsets:
                    continue
                offset = offsets.popleft()
                at_ms, key, value = self.logs["commands"][partition][offset]
                proc = self.procs[partition]
                proc.handle(offset, at_ms, key, value, self.sealed.get((partition, offset)))
                outputs, _ = proc.take()
                proc.state.commit(offset + 1)
                for o in outputs:
                    if o.topic == "commands":
                        # A worker's follow-up carries the engine's seal (streams/seal.py).
                        self.sealed[(o.partition, len(self.logs["commands"][o.partition]))] = \
                            proc.sealed_headers(o.partition, o.value)
                        self._append_command(o.partition, o.timestamp_ms, o.key, o.value)
                    else:
                        self.logs[o.topic][o.partition].append((o.timestamp_ms, o.key, o.value))
                break  # one record, then start again from partition 0: follow-ups interleave

    def streams(self) -> Streams:
        topics = {name: [record for partition, log in sorted(self.logs[name].items())
                         for offset, (at_ms, key, value) in enumerate(log)
                         for record in records_of(name, partition, offset, at_ms, key, value)]
                  for name in TOPICS}
        return Streams(commands=topics["commands"], results=topics["results"], history=topics["history"],
                       balances=topics["balances"], dead_letters=topics["dlq"])
