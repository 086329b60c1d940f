"""In-process benchmark of the worker's batch path, without Kafka (`make bench-core`). Prints figures only.

The real Engine and PartitionProcessors, with a real RocksDB per partition (rocksdict, in a temporary
directory), are fed pre-encoded CommandBatch records the way the asyncio client sends them (the workload of
`make bench-client`: two-leg transfers among 1,000 users over 8 partitions, placed as the client places them:
a transfer whose payee lives in another partition goes to its coordinator and a copy to the payee's
partition). Instead of Kafka, each partition's transactional producer is a null producer that keeps the
records in memory and numbers them like a log; the follow-up commands a batch writes (the two-phase
protocol's Reserve, Vote and Decide, sealed) are fed back as records of the next batch, as the commands
topic would deliver them, until none are left. So a transfer across partitions runs every step the real
worker runs (streams/spanning.py): at the coordinator the begin (with the payer's internal hold), the
decision (the client's result), the vote that completes it and its own share's decide step (which posts the
share); at the payee's partition the copy's reservation, the Reserve and its decide step. Each step is a
decided command (a StateChange, a result); older commits, measured with this script by benchmarks/ab.sh, had
an internal hold and a commit step of their own besides, and their steps are counted under those names. What librdkafka itself costs per record (its produce call, compression, the
network) is not counted: that is the Kafka part, measured by `make bench` and `make bench-client`.

Printed: µs of worker CPU per client transfer and per decided command, the decided commands per transfer by
step, records written per transfer, and the time split by phase:

    decode   Codec.decode (command batches, commands, inbox entries read back)
    read     reads of the partition's RocksDB (PartitionState._get)
    decide   everything else on the deciding side: the core's rules, routing, wire conversions, bookkeeping
    encode   Codec.encode (results, history, balances, redo records, follow-up commands)
    stage    PartitionState.stage (staging one decided command's writes)
    seal     the engine's seal on follow-up records (HMAC) and its check on sealed records
    emit     Engine._send and the changelog produce loop, without the encodings and seals above
    store    PartitionState.commit: the batch's one RocksDB WriteBatch

Phase times come from a second run with timers around those functions (exclusive times: a nested timed
call counts in its own phase only); the total is from the first run, without timers.

--chase: each transfer goes to an empty wallet (one of --users, in whatever partition its owner hashes to) and
is chased at once, in the same engine batch, by a payment out of the money it brings to a funded user: the
payment reaches the wallet's partition while the transfer's credit is in flight and waits for its decision
(docs/engine.md, "Order across partitions", steps 4 and 7). It prints how the payments were answered and how
long the waiting queue got: the cost of that wait under load.

Run: .venv/bin/python benchmarks/engine_core_bench.py [--transfers 20000] [--per-record 500] [--profile] [--chase]
"""
from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import hashlib
import io
import logging
import os
import pstats
import random
import shutil
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import fastavro  # noqa: E402

os.environ.setdefault("LEDGER_ENGINE_KEY", "engine-core-bench key")  # no development-key warning

from schemas.codec import Codec, codec  # noqa: E402
from streams import partition as partition_module  # noqa: E402
from streams import placement, routing  # noqa: E402
from streams import store as store_module  # noqa: E402
from streams.config import Settings  # noqa: E402
from streams.engine import CommandRecord, Engine  # noqa: E402
from streams.seal import Seal  # noqa: E402

PARTITIONS = 8
CURRENCY = "USD"


class _Delivered:
    """What a delivery callback reads from a message: its partition and offset."""
    __slots__ = ("_partition", "_offset")

    def __init__(self, partition: int, offset: int):
        self._partition, self._offset = partition, offset

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset


class NullLog:
    """The topics as logs in memory: offsets per (topic, partition), and the follow-up commands written."""

    def __init__(self, commands_topic: str):
        self.commands_topic = commands_topic
        self.ends: Counter = Counter()
        self.follow_ups: list[CommandRecord] = []
        self.records: Counter = Counter()  # records written per topic
        self.steps: Counter = Counter()  # results written per step of the protocol (step_of)
        self.client_results: list[bytes] | None = None  # the clients' results, when asked to keep them

    def append(self, topic: str, partition: int) -> int:
        offset = self.ends[(topic, partition)]
        self.ends[(topic, partition)] = offset + 1
        self.records[topic] += 1
        return offset


def step_of(result_key: bytes) -> str:
    """Which step a result answers, by its key (client_id/command_id): a client's own command, or an engine
    step (names.step_id: <transaction key>~<step>~<where>; an internal hold's id holds "~hold~")."""
    client_id, _, command_id = result_key.decode().partition("/")
    if client_id != routing.ENGINE_CLIENT:
        return "client's command"
    if "~hold~" in command_id:
        return "internal hold"
    parts = command_id.split("~")
    return parts[1] if len(parts) > 1 else command_id.split(":")[0]


class NullProducer:
    """A transactional producer that writes into a NullLog (what the engine calls, and nothing else)."""

    def __init__(self, log: NullLog):
        self.log = log
        self._callbacks: list = []

    def begin_transaction(self) -> None:
        pass

    def produce(self, topic, value=None, key=None, partition=-1, on_delivery=None, timestamp=0, headers=None):
        offset = self.log.append(topic, partition)
        if topic.endswith(".results"):
            step = step_of(key)
            self.log.steps[step] += 1
            if self.log.client_results is not None and step == "client's command":
                self.log.client_results.append(value)
        if topic == self.log.commands_topic:
            self.log.follow_ups.append(CommandRecord(partition, offset, timestamp, key, value, headers))
        if on_delivery is not None:
            self._callbacks.append((on_delivery, _Delivered(partition, offset)))

    def poll(self, timeout=0) -> int:
        """Serves the delivery reports, as librdkafka's poll does (a snapshot's manifest waits for one)."""
        callbacks, self._callbacks = self._callbacks, []
        for callback, msg in callbacks:
            callback(None, msg)
        return len(callbacks)

    def __len__(self) -> int:  # nothing waits for an acknowledgement here
        return 0

    def flush(self, timeout=None) -> int:
        self.poll()
        return 0

    def commit_transaction(self, timeout=None) -> None:
        pass

    def abort_transaction(self, timeout=None) -> None:
        pass


class Phases:
    """Exclusive wall time per phase, from timers wrapped around functions (installed on demand)."""

    def __init__(self) -> None:
        self.seconds: Counter = Counter()
        self._stack: list[list[float]] = []  # per open timed call: [start, time spent in nested timed calls]
        self._undo: list = []

    def wrap(self, owner, name: str, phase: str) -> None:
        original = getattr(owner, name)
        stack, seconds, clock = self._stack, self.seconds, time.process_time

        def timed(*args, **kwargs):
            frame = [clock(), 0.0]
            stack.append(frame)
            try:
                return original(*args, **kwargs)
            finally:
                stack.pop()
                spent = clock() - frame[0]
                seconds[phase] += spent - frame[1]
                if stack:
                    stack[-1][1] += spent

        setattr(owner, name, timed)
        self._undo.append((owner, name, original))

    def install(self) -> None:
        self.wrap(Codec, "decode", "decode")
        self.wrap(Codec, "encode", "encode")
        self.wrap(partition_module.PartitionState, "_get", "read")
        self.wrap(partition_module.PartitionState, "stage", "stage")
        self.wrap(partition_module.PartitionState, "commit", "store")
        self.wrap(Seal, "headers", "seal")
        self.wrap(Seal, "verify", "seal")
        self.wrap(Engine, "_send", "emit")
        self.wrap(Engine, "_commit_transaction", "emit")

    def uninstall(self) -> None:
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)
        self._undo = []


class Bench:
    """One engine over 8 RocksDB partitions in a temporary directory, and a client's encoded commands."""

    def __init__(self, users: int, per_record: int, chase: bool = False):
        self.chase = chase
        self.settings = Settings(bootstrap="127.0.0.1:1", prefix="corebench.", partitions=PARTITIONS)
        self.dir = Path(tempfile.mkdtemp(prefix="engine-core-bench-"))
        self.engine = Engine(self.settings, self.dir)
        self.log = NullLog(self.settings.topic("commands"))
        # Steps 0 and 1 done: every partition is owned, restored and empty.
        self.engine.producer, self.engine.owned = NullProducer(self.log), frozenset(range(PARTITIONS))
        for p in range(PARTITIONS):
            self.engine._expected[p] = 0
            self.engine.covered[p] = 0
        self.codec = codec()
        self.users = users
        self.per_record = per_record
        self.now_ms = 1_700_000_000_000
        self.pending: dict[int, list[bytes]] = defaultdict(list)

    def send(self, record: dict, routing_account: str) -> None:
        """What the client does: placement, encoding, one CommandBatch item per partition."""
        record, partitions = placement.placements(record, routing_account, PARTITIONS)
        encoded = self.codec.encode("command", record)
        for p in partitions:
            self.pending[p].append(encoded)

    def records(self) -> list[CommandRecord]:
        """The pending commands as CommandBatch records (at most per_record each), numbered by the log."""
        self.now_ms += 5
        out = []
        topic = self.settings.topic("commands")
        for p in sorted(self.pending):
            items = self.pending[p]
            for i in range(0, len(items), self.per_record):
                chunk = items[i:i + self.per_record]
                value = chunk[0] if len(chunk) == 1 else self.codec.encode("command_batch", {"commands": chunk})
                out.append(CommandRecord(p, self.log.append(topic, p), self.now_ms, b"bench", value))
        self.pending.clear()
        return out

    def run(self, records: list[CommandRecord]) -> None:
        """One engine batch: the records plus the follow-ups written by the previous batch, in log order."""
        follow_ups, self.log.follow_ups = self.log.follow_ups, []
        batch = sorted(follow_ups + records, key=lambda r: (r.partition, r.offset))
        asyncio.run(self.engine.process(batch))

    def drain(self) -> None:
        while self.log.follow_ups:
            self.run([])

    def setup(self) -> None:
        for i in range(self.users):
            account = f"user:c{i}:{CURRENCY}"
            self.send(_command(f"open:{account}", "ledger.OpenAccount", {
                "account_id": account, "currency": CURRENCY, "allow_negative": False, "overdraft_limit": "0",
                "max_balance": None, "routing_key": None}), account)
        self.run(self.records())
        for i in range(self.users):
            account = f"user:c{i}:{CURRENCY}"
            self.send(_transfer(f"fund-{i}", f"sys:world:{CURRENCY}", account, 10**9), account)
        if self.chase:
            for i in range(self.users):
                wallet = f"user:w{i}:{CURRENCY}"
                self.send(_command(f"open:{wallet}", "ledger.OpenAccount", {
                    "account_id": wallet, "currency": CURRENCY, "allow_negative": False, "overdraft_limit": "0",
                    "max_balance": None, "routing_key": None}), wallet)
        self.run(self.records())
        self.drain()

    random_ids = False  # command ids as clients often make them (UUIDs), not numbered: set by prefill

    def command_id(self, kind: str, n: int) -> str:
        return f"{kind}-{uuid.UUID(bytes=hashlib.md5(str(n).encode()).digest())}" if self.random_ids else f"{kind}-{n}"

    def prefill(self, commands: int, value_bytes: int = 550) -> None:
        """What a long-running worker's partitions hold: `commands` earlier commands' inbox entries in each (the
        inbox keeps every command id, P4), under random command ids of this client and others, written in
        batches as the engine writes them. Once they outgrow the memtables they are in SST files, where a new
        command's look-ups (its inbox entry, its transaction's records: misses) read what RocksDB must read.
        The transfers that follow take UUIDs for ids too: numbered ids would all fall after the UUIDs, into one
        block that stays cached, and hide the cost of a miss."""
        self.random_ids = True
        rnd = random.Random(11)
        clients = ["bench"] + [f"app-{i:02d}" for i in range(15)]
        for p in range(PARTITIONS):
            store = self.engine.processor(p).state.store
            for first in range(0, commands, 5_000):
                # About a redo record's size (550 bytes on average here) and, like one, partly compressible.
                store.write({partition_module._inbox_key(rnd.choice(clients), f"t-{uuid.UUID(int=rnd.getrandbits(128))}")
                             : rnd.randbytes(200) + bytes(value_bytes - 200)
                             for _ in range(first, min(first + 5_000, commands))}, set())

    def transfers(self, start: int, count: int, in_flight: int) -> None:
        """count transfers, in_flight of them per engine batch (as a client with that many in flight)."""
        for first in range(start, start + count, in_flight):
            for n in range(first, min(first + in_flight, start + count)):
                debtor = f"user:c{n % self.users}:{CURRENCY}"
                if self.chase:  # to an empty wallet, and at once a payment out of it
                    wallet = f"user:w{(n * 7 + 1) % self.users}:{CURRENCY}"
                    self.send(_transfer(self.command_id("t", n), debtor, wallet, 1), debtor)
                    self.send(_transfer(self.command_id("p", n), wallet, f"user:c{(n * 3 + 2) % self.users}:{CURRENCY}", 1), wallet)
                    continue
                self.send(_transfer(self.command_id("t", n), debtor, f"user:c{(n * 7 + 1) % self.users}:{CURRENCY}", 1), debtor)
            self.run(self.records())
            if self.chase:
                self.longest_queue = max(self.longest_queue, self.waiting())
        self.drain()

    longest_queue = 0

    def waiting(self) -> int:
        """Commands waiting for transactions in flight, over every partition."""
        return sum(len(proc.state.waiting) for proc in self.engine.processors.values())

    def close(self) -> None:
        self.engine.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def use_fastavro(c: Codec) -> None:
    """Encode and decode the current schemas with fastavro's schemaless_writer/reader instead of the
    generated codec (schemas/fastcodec.py): the A/B of the generated codec. Same bytes, same records."""
    for name, schema in c.current.items():
        def encode(record, parsed=schema.parsed, header=schema.header):
            out = io.BytesIO()
            out.write(header)
            fastavro.schemaless_writer(out, parsed, record)
            return out.getvalue()

        def decode_at(data, offset, parsed=schema.parsed):
            buf = io.BytesIO(data)
            buf.seek(offset)
            return fastavro.schemaless_reader(buf, parsed, None, return_record_name=True), buf.tell()

        c._encoders[name] = encode
        c._decoders[name] = decode_at


def _body_fields(name: str) -> dict:
    """{field: default} of a command body record in the current command schema (fields a schema version
    added since this script was written take their defaults)."""
    for branch in codec().current["command"].parsed["fields"][-1]["type"]:
        if isinstance(branch, dict) and branch.get("name") == name:
            return {f["name"]: f.get("default") for f in branch["fields"]}
    raise KeyError(name)


def _command(command_id: str, name: str, body: dict) -> dict:
    return {"command_id": command_id, "client_id": "bench",
            "body": (name, {**_body_fields(name), **body})}


def _transfer(transaction_id: str, debtor: str, creditor: str, amount: int) -> dict:
    return _command(transaction_id, "ledger.PostTransaction", {
        "transaction_id": transaction_id,
        "legs": [{"account_id": debtor, "amount": str(-amount), "hold_id": None, "currency": None},
                 {"account_id": creditor, "amount": str(amount), "hold_id": None, "currency": None}],
        "kind": "transfer", "reference": None, "links": [], "metadata": {}, "occurred_at_ms": None,
        "rate_snapshot_id": None})


def calibration_us() -> float:
    """CPU µs of a fixed pure-Python loop (core_bench.py prints the same): about 8 µs on a quiet 2023 laptop
    core. On a loaded machine every figure swells with it, so the µs per command are also given in its units."""
    began = time.process_time()
    for _ in range(2000):
        sum(range(1000))
    return (time.process_time() - began) / 2000 * 1e6


def measure(bench: Bench, start: int, count: int, in_flight: int
            ) -> tuple[float, int, dict[str, int], dict[str, int]]:
    """(seconds, decided commands, records written per topic, decided commands per step) for count transfers."""
    results_before = bench.log.records["corebench.results"]
    written_before = Counter(bench.log.records)
    steps_before = Counter(bench.log.steps)
    gc.collect()
    began = time.process_time()
    bench.transfers(start, count, in_flight)
    elapsed = time.process_time() - began
    written = Counter(bench.log.records)
    written.subtract(written_before)
    steps = Counter(bench.log.steps)
    steps.subtract(steps_before)
    return elapsed, bench.log.records["corebench.results"] - results_before, dict(written), +steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--transfers", type=int, default=20_000, help="client transfers per measured run")
    parser.add_argument("--in-flight", type=int, default=5_000, help="transfers per engine batch")
    parser.add_argument("--per-record", type=int, default=500, help="commands per CommandBatch record")
    parser.add_argument("--users", type=int, default=1_000)
    parser.add_argument("--profile", action="store_true", help="cProfile one run and print the top functions")
    parser.add_argument("--no-phases", action="store_true", help="skip the second run with phase timers")
    parser.add_argument("--chase", action="store_true",
                        help="each transfer to an empty wallet, chased at once by a payment out of it (see above)")
    parser.add_argument("--history", type=int, default=0, metavar="N",
                        help="first fill each partition with N earlier commands' inbox entries (a long-running "
                             "worker's; LEDGER_ROCKSDB_BLOOM_BITS=0 measures it without Bloom filters)")
    parser.add_argument("--codec", choices=("generated", "fastavro"), default="generated",
                        help="the generated Avro codec (schemas/fastcodec.py) or fastavro's schemaless writer/reader")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    if args.codec == "fastavro":
        use_fastavro(codec())
    bench = Bench(args.users, args.per_record, args.chase)
    try:
        if args.history:
            began = time.monotonic()
            bench.prefill(args.history)
            print(f"{args.history:,} earlier inbox entries in each partition, written in {time.monotonic() - began:.1f} s")
        bench.setup()
        if args.profile:
            profiler = cProfile.Profile()
            profiler.runcall(bench.transfers, 0, args.transfers, args.in_flight)
            stats = pstats.Stats(profiler)
            stats.sort_stats("tottime").print_stats(30)
            if os.environ.get("BENCH_PROFILE_CUMULATIVE"):
                stats.sort_stats("cumulative").print_stats(60)
            return
        # A warm-up run (caches, RocksDB memtables), then the timed run and the run with phase timers.
        bench.transfers(0, min(args.transfers, 5_000), args.in_flight)
        calibration = calibration_us()
        if args.chase:
            bench.log.client_results, bench.longest_queue = [], 0
        elapsed, decided, written, steps = measure(bench, 10**6, args.transfers, args.in_flight)
        answers = bench.log.client_results
        bench.log.client_results = None
        calibration = (calibration + calibration_us()) / 2
        phases = Phases()
        if not args.no_phases:
            phases.install()
            try:
                timed_elapsed, _, _, _ = measure(bench, 2 * 10**6, args.transfers, args.in_flight)
            finally:
                phases.uninstall()
    finally:
        bench.close()
    per = elapsed / decided * 1e6
    print(f"python {sys.version.split()[0]}, one process, RocksDB in a temporary directory, no Kafka; load average "
          f"{os.getloadavg()[0]:.2f}; Bloom filters: {store_module.BLOOM_BITS_PER_KEY:g} bits a key; "
          f"{args.history:,} earlier commands per partition")
    print(f"codec: {args.codec}; {args.transfers:,} client transfers among {args.users:,} users, "
          f"{PARTITIONS} partitions, "
          f"{args.in_flight:,} per engine batch, {args.per_record} per CommandBatch record")
    per_transfer = elapsed / args.transfers * 1e6
    print(f"decided commands: {decided:,} ({decided / args.transfers:.2f} per transfer), by step per transfer: "
          + ", ".join(f"{step} {n / args.transfers:.2f}" for step, n in steps.most_common()))
    print(f"worker CPU per client transfer: {per_transfer:7.1f} µs  ({args.transfers / elapsed:,.0f} transfers/s)")
    print(f"worker CPU per decided command: {per:6.1f} µs  ({decided / elapsed:,.0f} decided commands/s)")
    print(f"calibration sum(range(1000)): {calibration:.1f} µs CPU (about 8 on a quiet laptop core); per transfer "
          f"{per_transfer / calibration:.1f} calibrations, per decided command {per / calibration:.1f}")
    print("records written per transfer: " + ", ".join(
        f"{topic.split('.', 1)[1]} {n / args.transfers:.2f}" for topic, n in sorted(written.items())))
    if answers is not None:
        decoded = [codec().decode("result", value) for value in answers]
        payments = Counter((r["outcome"], r["reason"]) for r in decoded if r["command_id"].startswith("p-"))
        transfers = Counter((r["outcome"], r["reason"]) for r in decoded if r["command_id"].startswith("t-"))
        print("chased payments answered: " + ", ".join(f"{o}{'' if why is None else ' ' + why} {n:,}"
                                                     for (o, why), n in payments.most_common())
              + "; their transfers: " + ", ".join(f"{o}{'' if why is None else ' ' + why} {n:,}"
                                                   for (o, why), n in transfers.most_common())
              + f"; longest waiting queue after a batch (all partitions): {bench.longest_queue:,}")
    if args.no_phases:
        return
    total = timed_elapsed / args.transfers * 1e6
    accounted = sum(phases.seconds.values()) / args.transfers * 1e6
    print(f"by phase (a second run with timers: {total:.1f} µs per transfer; timers add their own cost):")
    rows = dict(phases.seconds)
    order = ["decode", "read", "decide", "encode", "stage", "seal", "emit", "store"]
    rows["decide"] = 0.0
    for phase in order:
        us = (total - accounted) if phase == "decide" else rows.get(phase, 0.0) / args.transfers * 1e6
        print(f"  {phase:7s} {us:7.1f} µs per transfer  {us / total:5.1%}")


if __name__ == "__main__":
    main()
