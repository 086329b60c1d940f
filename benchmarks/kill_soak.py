"""Kill -9 soak (`make soak`): a worker under load is killed and restarted many times; then the oracles and the
exactly-once check of a read_committed reader.

Of every five stops: two are kill -9 at a random moment, one is the worker exiting hard at its transaction
commit (crash point during_transaction_commit: everything of a partition's transaction flushed, the commit
not asked for), one is a kill -9 that also deletes the worker's RocksDB (the partition state comes back from
the changelog alone), and one deletes it and exits hard in the middle of that restore (during_restore).
Prints each stop, then the verify report and the exactly-once check; exits non-zero on a violation.
"""
from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from connectors.client import LedgerClient  # noqa: E402
from connectors.loadgen import LoadGenerator, Mix  # noqa: E402
from projections.verify import format_report, verify, wait_quiescent  # noqa: E402
from streams import crashpoints  # noqa: E402
from connectors.loadgen import pump  # noqa: E402
from connectors.local_worker import Worker  # noqa: E402
from connectors.scratch import bootstrap, drop, fresh_settings  # noqa: E402
from projections.exactly_once import assert_exactly_once  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kills", type=int, default=30)
    parser.add_argument("--rate", type=float, default=500)
    parser.add_argument("--batch-ms", type=float, default=0.0,
                        help="send each window of this many ms as CommandBatch records (0: one record per command)")
    args = parser.parse_args()
    rng = random.Random(29)
    settings = fresh_settings(bootstrap())
    worker = Worker(settings, Path(tempfile.mkdtemp(prefix="soak-")), "soak").start()
    stops = {"kill -9": 0, "during_transaction_commit": 0, "kill -9 + wipe": 0, "during_restore": 0}
    try:
        client = LedgerClient(settings, "soak")
        gen = LoadGenerator(client, seed=23, mix=Mix(users=300), run_id="soak")
        opened = gen.open_accounts()
        client.wait(opened, 120)
        sent: list[str] = []
        thread = pump(client, gen, count=int(args.kills * 1.5 * args.rate), per_second=args.rate, sent=sent,
                      batch_window_s=args.batch_ms / 1000)
        for i in range(args.kills):
            point = worker.extra_env.pop("LEDGER_CRASH_AT", None)
            if point:  # the worker exits by itself at the point
                code = worker.wait_exit(300)
                if code != crashpoints.EXIT_CODE:
                    print(f"worker exited with {code}, not at {point}:\n{worker.tail()}")
                    return 1
                how = point.split(":")[0]
            else:
                time.sleep(0.5 + (i % 4) * 0.4)
                worker.kill9()
                how = "kill -9"
            mode = i % 5
            if mode in (3, 4):
                worker.wipe_state()
                how += " + wipe" if how == "kill -9" else ""
            if mode == 1:
                worker.extra_env["LEDGER_CRASH_AT"] = f"during_transaction_commit:{rng.randint(5, 40)}"
            elif mode == 4:
                worker.extra_env["LEDGER_CRASH_AT"] = "during_restore:1"
            stops[how] = stops.get(how, 0) + 1
            worker.start(wait_ready="LEDGER_CRASH_AT" not in worker.extra_env)
            print(f"stop {i + 1}/{args.kills} ({how}): {len(sent)} commands sent so far", flush=True)
        if worker.extra_env.pop("LEDGER_CRASH_AT", None):
            worker.wait_exit(300)
            worker.start()
        thread.join()
        client.wait(sent, 600)
        wait_quiescent(settings, 300)
        report = verify(settings)
        print(f"{args.kills} stops survived ({', '.join(f'{k}: {v}' for k, v in stops.items())}); "
              f"{len(sent)} commands")
        print(format_report(report))
        try:
            assert_exactly_once(settings, "soak", opened + sent)
            print("exactly once (read_committed): one result per command, one history entry per account#seq")
        except AssertionError as exc:
            print(f"NOT exactly once: {exc}")
            return 1
        client.close()
        return 0 if report.ok else 1
    finally:
        worker.stop()
        drop(settings)


if __name__ == "__main__":
    sys.exit(main())
