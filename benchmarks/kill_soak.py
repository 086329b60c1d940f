"""Kill -9 soak (`make soak`): a worker under load is killed and restarted many times; then the oracles.

Every fourth restart also deletes the worker's RocksDB, so the partition state must come back from the
changelog alone. Prints the kill count, commands sent, and the verify report; exits non-zero on a violation.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from connectors.client import LedgerClient  # noqa: E402
from connectors.loadgen import LoadGenerator, Mix  # noqa: E402
from projections.verify import format_report, verify, wait_quiescent  # noqa: E402
from tests.engine.test_faults import pump  # noqa: E402
from tests.harness import Worker, bootstrap, drop, fresh_settings  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kills", type=int, default=30)
    parser.add_argument("--rate", type=float, default=500)
    parser.add_argument("--batch-ms", type=float, default=0.0,
                        help="send each window of this many ms as CommandBatch records (0: one record per command)")
    args = parser.parse_args()
    settings = fresh_settings(bootstrap())
    worker = Worker(settings, Path(tempfile.mkdtemp(prefix="soak-")), "soak").start()
    try:
        client = LedgerClient(settings, "soak")
        gen = LoadGenerator(client, seed=23, mix=Mix(users=300), run_id="soak")
        client.wait(gen.open_accounts(), 120)
        sent: list[str] = []
        thread = pump(client, gen, count=int(args.kills * 1.5 * args.rate), per_second=args.rate, sent=sent,
                      batch_window_s=args.batch_ms / 1000)
        for i in range(args.kills):
            time.sleep(0.5 + (i % 4) * 0.4)
            worker.kill9()
            if i % 4 == 3:
                for p in worker.data_dir.glob("p*"):
                    shutil.rmtree(p, ignore_errors=True)
            worker.start()
            print(f"kill {i + 1}/{args.kills}: {len(sent)} commands sent so far", flush=True)
        thread.join()
        client.wait(sent, 600)
        wait_quiescent(settings, 300)
        report = verify(settings)
        print(f"{args.kills} kill -9 survived; {len(sent)} commands")
        print(format_report(report))
        client.close()
        return 0 if report.ok else 1
    finally:
        worker.stop()
        drop(settings)


if __name__ == "__main__":
    sys.exit(main())
