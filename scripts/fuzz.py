"""`make fuzz`: a long seeded fuzz run of the commands topic against the real broker and a real worker.

Hostile records of every class (tests/adversary.py) mixed with valid traffic, under fresh topics; then the
figures: records sent by class, results, dead letters, worker exits (must be 0), forged steps accepted
(must be 0), the valid traffic's outcome and balances against a run without the noise, and verify's
verdict over every oracle. Exit status 0 only when everything holds.

    .venv/bin/python scripts/fuzz.py [--seed N] [--noise N] [--valid-steps N]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from projections.verify import format_report, wait_quiescent  # noqa: E402
from tests import adversary  # noqa: E402
from connectors.local_worker import Worker  # noqa: E402
from connectors.scratch import bootstrap, drop, fresh_settings  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--noise", type=int, default=20_000, help="hostile records")
    parser.add_argument("--valid-steps", type=int, default=1_000, help="valid transfers, trades and hold cycles")
    args = parser.parse_args()
    settings = fresh_settings(bootstrap())
    worker = Worker(settings, Path(tempfile.mkdtemp(prefix="ledger-fuzz-")), "fuzz")
    try:
        worker.start()
        started = time.monotonic()
        sent = adversary.send(settings, args.seed, args.noise, args.valid_steps)
        sent_s = time.monotonic() - started
        quiet = wait_quiescent(settings, timeout_s=1_800)
        verdict = adversary.judge(settings, sent)
        exits = worker.starts - 1 + (0 if worker.alive else 1)
        print(f"seed {args.seed}: {sent.records} records sent in {sent_s:.0f} s "
              f"({len(sent.valid_ids)} valid commands, {sum(sent.by_class.values())} hostile)")
        for cls in adversary.CLASSES:
            print(f"  {cls:<14} {sent.by_class[cls]:>7}")
        print(f"quiescent:            {'yes' if quiet else 'NO'} after {time.monotonic() - started:.0f} s")
        print(f"results:              {verdict.results}")
        print(f"dead letters:         {verdict.dead_letters}")
        print(f"worker exits:         {exits}")
        print(f"exceptions in log:    {'YES' if worker.crashed() else 'none'}")
        print(f"forged steps taken:   {len(verdict.forged_accepted)}")
        print(f"unprocessable:        {len(verdict.unprocessable)}")
        print(f"valid accepted:       {verdict.valid_answered - len(verdict.valid_rejected)} of {len(sent.valid_ids)}")
        print(f"valid balances:       {'same as without the noise' if not verdict.balances_differ else verdict.balances_differ}")
        print(f"verify:               {'OK' if verdict.report.ok else 'VIOLATIONS'}")
        print(format_report(verdict.report)[:5_000])
        for line in (verdict.valid_rejected + verdict.unprocessable + verdict.forged_accepted)[:20]:
            print("  !", line[:300])
        good = quiet and verdict.ok and exits == 0 and not worker.crashed()
        if not good:
            print(f"FAILED (worker log: {worker.log_path})")
        return 0 if good else 1
    finally:
        worker.kill9()
        drop(settings)


if __name__ == "__main__":
    sys.exit(main())
