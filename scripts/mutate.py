"""`make mutate`: run mutmut over the pure core and the partition shell, then print the score per area and every
surviving mutant with its diff (docs/testing.md).

    .venv/bin/python scripts/mutate.py            fresh run (removes mutants/ first), report
    .venv/bin/python scripts/mutate.py --report   report only, from the last run's mutants/

The files mutated and the tests run are configured in pyproject.toml ([tool.mutmut]). Exit status 1 when an area
is below its target (core 90% killed, shell 80%), so the run can gate a change if someone wants it to.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# mutmut through this script (see mutmut_cli) so that the pytest 9 shim is in place in its process.
MUTMUT = [sys.executable, str(Path(__file__).resolve()), "--mutmut"]
TARGETS = {"core": 0.90, "shell": 0.80}
# Counted as killed: the tests failed, or the mutant made them hang or crash (a timeout or a signal is a detection).
DETECTED = {"killed", "timeout", "segfault", "caught by type check"}


def area(mutant: str) -> str:
    return "core" if mutant.startswith("streams.core.") else "shell"


def results() -> dict[str, str]:
    out = subprocess.run(MUTMUT + ["results", "--all", "true"], cwd=ROOT, check=True, capture_output=True, text=True)
    found = {}
    for line in out.stdout.splitlines():
        name, sep, status = line.strip().rpartition(": ")
        if sep and name.startswith("streams."):
            found[name] = status
    return found


def diff(mutant: str) -> list[str]:
    """The changed lines of a mutant (what `mutmut show` prints, without the context)."""
    os.chdir(ROOT)
    from mutmut.__main__ import get_diff_for_mutant

    try:
        text = get_diff_for_mutant(mutant)
    except Exception as exc:  # noqa: BLE001 - a report line, not a reason to stop the report
        return [f"(no diff: {exc})"]
    return [line for line in text.splitlines() if line[:1] in "+-" and not line.startswith(("+++", "---"))]


def report(elapsed_s: float | None) -> int:
    found = results()
    if not found:
        print("no mutants found: run `make mutate` first")
        return 1
    counts: dict[str, Counter] = defaultdict(Counter)
    for name, status in found.items():
        counts[area(name)][status] += 1
    print()
    print(f"{'area':6} {'mutants':>8} {'killed':>7} {'timeout':>8} {'survived':>9} {'no tests':>9} "
          f"{'unchecked':>10} {'score':>7}  target")
    failed = False
    for name in ("core", "shell"):
        c = counts[name]
        checked = sum(c.values()) - c["not checked"]
        killed = sum(v for k, v in c.items() if k in DETECTED)
        score = killed / checked if checked else 0.0
        failed |= score < TARGETS[name] or c["not checked"] > 0
        print(f"{name:6} {sum(c.values()):8} {killed - c['timeout']:7} {c['timeout']:8} {c['survived']:9} "
              f"{c['no tests']:9} {c['not checked']:10} {score:7.1%}  "
              f"{TARGETS[name]:.0%}{'' if score >= TARGETS[name] else '  BELOW'}")
    print("score = (killed + timeout + segfault) / checked mutants; a mutant no test reaches counts against it")
    if any(c["not checked"] for c in counts.values()):
        print("THE RUN IS INCOMPLETE: the scores are over the mutants checked so far")
    others = {k: v for c in counts.values() for k, v in c.items()
              if k not in DETECTED | {"survived", "no tests", "timeout", "not checked"}}
    if others:
        print("not killed and not survived:", dict(others))
    if elapsed_s is not None:
        print(f"run time {elapsed_s / 60:.1f} min")
    undetected = sorted(name for name, status in found.items() if status not in DETECTED | {"not checked"})
    print(f"\nsurviving mutants ({len(undetected)}; `.venv/bin/mutmut show NAME` for context):")
    for name in undetected:
        status = found[name]
        print(f"  {name}" + ("" if status == "survived" else f"  [{status}]"))
        for line in diff(name):
            print("      " + re.sub(r"\s+", " ", line)[:150])
    return 1 if failed else 0


def mutmut_cli(args: list[str]) -> int:
    """Run mutmut's command line in this process. mutmut 3.7 (the newest that accepts the click faust-streaming
    needs) reads `item._nodeid`, which pytest 9 no longer has: give it back as an alias of `nodeid`."""
    from _pytest.nodes import Node

    if not hasattr(Node, "_nodeid"):
        Node._nodeid = property(lambda self: self.nodeid)  # type: ignore[attr-defined]
    from mutmut.__main__ import cli

    return cli.main(args=args, prog_name="mutmut", standalone_mode=False) or 0


def main() -> int:
    if sys.argv[1:2] == ["--mutmut"]:
        return mutmut_cli(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", action="store_true", help="only report the last run")
    parser.add_argument("--max-children", type=int, default=os.cpu_count() or 2)
    args = parser.parse_args()
    if args.report:
        return report(None)
    shutil.rmtree(ROOT / "mutants", ignore_errors=True)
    env = {**os.environ, "HYPOTHESIS_PROFILE": "mutation"}
    started = time.monotonic()
    run = subprocess.run(MUTMUT + ["run", "--max-children", str(args.max_children)], cwd=ROOT, env=env)
    elapsed = time.monotonic() - started
    if run.returncode != 0:
        print(f"mutmut run failed (exit {run.returncode})")
        return run.returncode
    return report(elapsed)


if __name__ == "__main__":
    sys.exit(main())
