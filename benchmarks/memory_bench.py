"""Worker memory against commands decided (`make bench-memory`). Prints figures only.

The worker's real batch path in process (benchmarks/engine_core_bench.py: Engine, PartitionProcessors, a
RocksDB per partition, no Kafka) decides two-leg transfers among --users users over 8 partitions, most across
partitions (so each runs the two-phase protocol: about 6.2 decided commands, results, per transfer), 2,000 per
engine batch, with snapshots at the engine's interval and glibc's malloc tuned as in a worker
(streams/malloc_arenas.py), and prints every `--every` decided commands the
process's resident set size and where it is: glibc's heap in use and free (mallinfo2, every arena), Python's
allocated blocks, the entries of the partition states' decoded-record caches and hold-expiry heaps, RocksDB's
block cache (the memtables are charged to it), its memtables, and its table readers outside the cache. What
Kafka's client library queues is not in it (make soak-memory measures a real worker's RSS); what grows with
history in the worker's own state (caches of decoded records, the inbox, RocksDB) is.

Experiments: --trim calls glibc's malloc_trim(0) after every row and prints its answer (1: it returned memory to
the system) and the RSS after it; --types prints the Python object types whose counts grew most from the first
row after the start to the last (gc.get_objects).

With --worker, a real worker process on the broker instead (`make soak-memory`): the load generator's mix in
CommandBatch records at --rate commands/s, and the worker's RSS (librdkafka's queues and Faust included) every
--every commands it has answered, sent in windows of 5,000 each answered before the next.

Run: .venv/bin/python benchmarks/memory_bench.py [--decided 1000000] [--every 100000] [--users 20000]
                                                 [--trim] [--types]
     .venv/bin/python benchmarks/memory_bench.py --worker [--decided 1000000] [--rate 1500]
"""
from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import gc
import logging
import os
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.engine_core_bench import Bench  # noqa: E402
from streams.malloc_arenas import cap_malloc_arenas, fix_mmap_threshold  # noqa: E402


def rss_mib(pid: int | str = "self") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--decided", type=int, default=1_000_000)
    parser.add_argument("--every", type=int, default=100_000)
    parser.add_argument("--users", type=int, default=20_000)
    parser.add_argument("--worker", action="store_true", help="a real worker on the broker (KAFKA_BOOTSTRAP)")
    parser.add_argument("--rate", type=float, default=1500)
    parser.add_argument("--trim", action="store_true",
                        help="an experiment: glibc's malloc_trim(0) after every row, its answer and RSS after it")
    parser.add_argument("--types", action="store_true",
                        help="Python objects by type: the counts that grew most from the first row to the last")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.worker:
        return worker_rss(args.decided, args.every, args.rate, args.users)
    in_process(args.decided, args.every, args.users, args.trim, args.types)


def in_process(decided: int, every: int, users: int, trim: bool, types: bool) -> None:
    """RSS and where it is (glibc's heap, Python's blocks, the decoded-record caches, RocksDB's own figures)
    every `every` decided commands (results written: a transfer across partitions decides several steps)."""
    cap_malloc_arenas()  # as a worker does (streams/app.py)
    fix_mmap_threshold()
    bench = Bench(users=users, per_record=500)
    bench.setup()
    results = bench.settings.topic("results")
    print(f"worker RSS in process, {users:,} users, two-leg transfers, 8 partitions, load average "
          f"{os.getloadavg()[0]:.2f}; decided = results written (each step of a transfer across partitions)")
    print("heap: glibc's bytes in use / free in its arenas (mallinfo2); blocks: sys.getallocatedblocks; decoded: "
          "entries of the partition states' decoded-record caches; expiries: entries of their hold-expiry indexes' heaps (streams/due.py); cache / memtables / readers: RocksDB's block "
          "cache (the memtables charged to it included), the memtables and the table readers outside the cache (rocksdb.estimate-table-readers-mem)")
    header = (f"{'transfers':>10} {'decided':>10} {'RSS MiB':>8} {'heap use':>8} {'free':>6} {'blocks':>9} "
              f"{'decoded':>8} {'expiries':>8} {'cache':>6} {'memtab':>6} {'readers':>7} {'s':>7}")
    print(header + ("  trim RSS after" if trim else ""), flush=True)
    began, transfers, step, mark = time.perf_counter(), 0, 2000, every
    first_types = None
    while True:
        done = bench.log.records[results]
        if done >= mark or transfers == 0:
            print(row(bench, transfers, done, time.perf_counter() - began) + (trimmed() if trim else ""), flush=True)
            if types and first_types is None and transfers:
                first_types = type_counts()
            mark = (done // every + 1) * every
        if done >= decided:
            break
        bench.transfers(transfers, step, in_flight=2000)
        transfers += step
    if first_types is not None:
        grown = type_counts()
        grown.subtract(first_types)
        print("Python objects grown from the first row to the last, by type: " + ", ".join(
            f"{name} {n:+,}" for name, n in grown.most_common(12)))
    bench.close()


def row(bench: Bench, transfers: int, decided: int, seconds: float) -> str:
    from streams.store import _shared_budget

    heap = mallinfo()
    procs = bench.engine.processors.values()
    decoded = sum(len(p.state._accounts) + len(p.state._holds) + len(p.state._transactions) + len(p.state._records)
                  for p in procs)
    expiries = sum(p.state.expiries.queued for p in procs)
    cache, memtables = _shared_budget()
    readers = sum(p.state.store._db.property_int_value("rocksdb.estimate-table-readers-mem") or 0 for p in procs)
    mib = 1 << 20
    return (f"{transfers:>10,} {decided:>10,} {rss_mib():>8.0f} {heap[0] / mib:>8.0f} {heap[1] / mib:>6.0f} "
            f"{sys.getallocatedblocks():>9,} {decoded:>8,} {expiries:>8,} {cache.get_usage() / mib:>6.0f} "
            f"{memtables.get_usage() / mib:>6.0f} {readers / mib:>7.1f} {seconds:>7.1f}")


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def _libc():
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")


def mallinfo() -> tuple[int, int]:
    """(bytes in use, bytes free) in glibc's arenas, all of them, and its mmapped blocks counted as in use."""
    call = _libc().mallinfo2
    call.restype = _MallInfo2
    info = call()
    return info.uordblks + info.hblkhd, info.fordblks


def trimmed() -> str:
    answer = _libc().malloc_trim(0)  # 1: memory was returned to the system
    return f"  {answer} {rss_mib():>8.0f}"


def type_counts() -> Counter:
    gc.collect()
    return Counter(type(o).__name__ for o in gc.get_objects())


WINDOW = 5_000  # client commands sent before waiting for their answers (worker_rss)


def worker_rss(decided: int, every: int, rate: float, users: int) -> None:
    import tempfile

    from connectors.client import LedgerClient
    from connectors.loadgen import LoadGenerator, Mix
    from connectors.local_worker import Worker
    from connectors.scratch import bootstrap, drop, fresh_settings

    settings = fresh_settings(bootstrap())
    worker = Worker(settings, Path(tempfile.mkdtemp(prefix="memory-soak-")), "mem").start()
    try:
        client = LedgerClient(settings, "mem")
        gen = LoadGenerator(client, seed=3, mix=Mix(users=min(users, 2000)), run_id="mem")
        client.wait(gen.open_accounts(), 120)
        print(f"a worker's RSS under the load generator's mix at {rate:.0f} commands/s in CommandBatch records")
        print(f"{'answered':>10} {'RSS MiB':>8} {'s':>7}")
        began = time.perf_counter()
        print(f"{0:>10,} {rss_mib(worker.proc.pid):>8.0f} {0.0:>7.1f}", flush=True)
        for done in range(every, decided + 1, every):
            # In windows of WINDOW commands, each answered before the next is sent: at a rate the worker cannot
            # keep up with, a backlog of a whole row put every transfer across partitions behind it (its later
            # steps are commands appended after the backlog), and an earlier run timed out waiting.
            for first in range(0, every, WINDOW):
                sent = list(gen.paced(min(WINDOW, every - first), rate, batch_window_s=0.02))
                # In slices: each pass of a wait looks up every id it was given, and a 100,000-id pass every
                # 20 ms took about half a core from the worker being measured.
                for at in range(0, len(sent), 2000):
                    client.wait(sent[at:at + 2000], 600)
            print(f"{done:>10,} {rss_mib(worker.proc.pid):>8.0f} {time.perf_counter() - began:>7.1f}", flush=True)
        client.close()
    finally:
        worker.stop()
        drop(settings)


if __name__ == "__main__":
    main()
