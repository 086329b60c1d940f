"""Micro-benchmark of the pure core on one CPU core, with MemoryState. Prints figures; not a test.

Run: .venv/bin/python benchmarks/core_bench.py [--n 200000] [--profile]

Each decision is measured end to end as the engine would run it: build the command (as a decoder would),
execute (inbox check, fingerprint, rules, apply, balance assertion) and commit the Changes to MemoryState.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from streams.core import (  # noqa: E402
    SYSTEM_POLICY,
    Leg,
    MemoryState,
    OpenAccount,
    PlaceHold,
    PostTransaction,
    ReleaseHold,
    execute,
)

USERS = 1000


def _setup() -> MemoryState:
    state = MemoryState()
    opens = [OpenAccount(command_id="open:world", client_id="bench", at_ms=0, account_id="world",
                         currency="USDT", policy=SYSTEM_POLICY)]
    opens += [OpenAccount(command_id=f"open:{i}", client_id="bench", at_ms=0, account_id=f"user:{i}:USDT",
                          currency="USDT") for i in range(USERS)]
    for command in opens:
        result, changes = execute(state, command)
        assert result.accepted
        state.commit(changes)
    for i in range(USERS):
        command = PostTransaction(command_id=f"fund:{i}", client_id="bench", at_ms=1, transaction_id=f"fund:{i}",
                                  legs=(Leg("world", -10**15), Leg(f"user:{i}:USDT", 10**15)), kind="deposit")
        result, changes = execute(state, command)
        assert result.accepted
        state.commit(changes)
    # MemoryState keeps every history entry and inbox result alive, which the engine (RocksDB) does not;
    # freeze what exists so CPython's cyclic GC does not rescan it, and start each run from a clean heap.
    gc.collect()
    gc.freeze()
    return state


def bench_transfers(n: int) -> float:
    """Two-leg transfers between users; returns decisions per second."""
    state = _setup()
    start = time.perf_counter()
    for i in range(n):
        a = i % USERS
        b = (i * 7 + 1) % USERS
        command = PostTransaction(command_id=f"t{i}", client_id="bench", at_ms=10 + i, transaction_id=f"t{i}",
                                  legs=(Leg(f"user:{a}:USDT", -100), Leg(f"user:{b}:USDT", 100)))
        result, changes = execute(state, command)
        state.commit(changes)
    elapsed = time.perf_counter() - start
    assert result.accepted
    return n / elapsed


def bench_holds(cycles: int) -> float:
    """place -> partial capture -> release cycles (3 decisions each); returns decisions per second."""
    state = _setup()
    start = time.perf_counter()
    for i in range(cycles):
        user = f"user:{i % USERS}:USDT"
        hold_id = f"h{i}"
        commands = (
            PlaceHold(command_id=f"p{i}", client_id="bench", at_ms=10 + i, hold_id=hold_id, account_id=user,
                      amount=1000, expires_at_ms=None),
            PostTransaction(command_id=f"c{i}", client_id="bench", at_ms=10 + i, transaction_id=f"c{i}",
                            legs=(Leg(user, -400, hold_id), Leg("world", 400)), kind="trade"),
            ReleaseHold(command_id=f"r{i}", client_id="bench", at_ms=10 + i, hold_id=hold_id),
        )
        for command in commands:
            result, changes = execute(state, command)
            state.commit(changes)
        assert result.accepted
    elapsed = time.perf_counter() - start
    return 3 * cycles / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=200_000, help="transfers to run")
    parser.add_argument("--profile", action="store_true", help="cProfile the transfer loop")
    args = parser.parse_args()
    if args.profile:
        profiler = cProfile.Profile()
        profiler.runcall(bench_transfers, args.n // 4)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(20)
        return
    print(f"python {sys.version.split()[0]}, one core, MemoryState")
    # Calibration: this machine's speed on a fixed pure-Python loop (about 8 us on a 2023 laptop core).
    start = time.perf_counter()
    for _ in range(2000):
        sum(range(1000))
    print(f"calibration sum(range(1000)): {(time.perf_counter() - start) / 2000 * 1e6:.1f} us")
    transfers = max(bench_transfers(args.n) for _ in range(3))
    print(f"two-leg transfers:           {transfers:>10,.0f} decisions/s (best of 3, n={args.n:,})")
    holds = max(bench_holds(args.n // 3) for _ in range(3))
    print(f"hold place/capture/release:  {holds:>10,.0f} decisions/s (best of 3, {args.n // 3:,} cycles)")


if __name__ == "__main__":
    main()
