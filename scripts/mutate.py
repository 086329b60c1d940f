"""`make mutate`: run mutmut over the pure core and the partition shell, then print the score per area and every
surviving mutant with its diff (docs/testing.md).

    .venv/bin/python scripts/mutate.py            fresh run (removes mutants/ first), report
    .venv/bin/python scripts/mutate.py --report   report only, from the last run's mutants/
    .venv/bin/python scripts/mutate.py --sample 150 [--seed 1]
                                                  fresh run of a seeded random sample of 150 mutants per area:
                                                  the score with its 95% interval, in a fraction of the time
    .venv/bin/python scripts/mutate.py --area core --sample 150 --seed 3
                                                  the same over one area only (core or shell): every drawn
                                                  mutant is of that area, so the time goes where the question is

The files mutated and the tests run are configured in pyproject.toml ([tool.mutmut]). Exit status 1 when an area
is below its target (core 90% killed, shell 80%), so the run can gate a change if someone wants it to.
"""
from __future__ import annotations

import argparse
import math
import os
import random
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


def wilson(killed: int, checked: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% confidence interval of a proportion (Wilson score interval): what the score of every mutant of
    the area would be, from a random sample of them."""
    if not checked:
        return 0.0, 1.0
    p, n = killed / checked, checked
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


AREAS = ("core", "shell")
SAMPLE_FILE = ROOT / "mutants" / "sample.txt"  # the sampled mutants' names, one per line (--sample)


def report(elapsed_s: float | None, areas: tuple[str, ...] = AREAS) -> int:
    found = results()
    if not found:
        print("no mutants found: run `make mutate` first")
        return 1
    population = Counter(area(name) for name in found)
    sampled = set(SAMPLE_FILE.read_text().split()) if SAMPLE_FILE.exists() else None
    if sampled is not None:
        found = {name: status for name, status in found.items() if name in sampled}
        print(f"a random sample of {len(found)} of {sum(population.values())} mutants "
              f"({', '.join(f'{k} {population[k]}' for k in AREAS)}); {SAMPLE_FILE.name} names them")
    found = {name: status for name, status in found.items() if area(name) in areas}
    counts: dict[str, Counter] = defaultdict(Counter)
    for name, status in found.items():
        counts[area(name)][status] += 1
    print()
    print(f"{'area':6} {'mutants':>8} {'killed':>7} {'timeout':>8} {'survived':>9} {'no tests':>9} "
          f"{'unchecked':>10} {'score':>7}  target")
    failed = False
    for name in areas:
        c = counts[name]
        checked = sum(c.values()) - c["not checked"]
        killed = sum(v for k, v in c.items() if k in DETECTED)
        score = killed / checked if checked else 0.0
        failed |= score < TARGETS[name] or c["not checked"] > 0
        low, high = wilson(killed, checked)
        interval = f"  (95%: {low:.1%}-{high:.1%} of all {population[name]})" if sampled is not None else ""
        print(f"{name:6} {sum(c.values()):8} {killed - c['timeout']:7} {c['timeout']:8} {c['survived']:9} "
              f"{c['no tests']:9} {c['not checked']:10} {score:7.1%}  "
              f"{TARGETS[name]:.0%}{'' if score >= TARGETS[name] else '  BELOW'}{interval}")
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


# A pattern of a few mutants (the first of each function in streams/names.py) for the generating run.
FIRST_PASS = "streams.names.*__mutmut_1"


def sample(names: list[str], per_area: int, seed: int, areas: tuple[str, ...] = AREAS) -> list[str]:
    """A seeded random sample of per_area mutants of each area (all of an area that has fewer). The core is
    drawn first, so a seed gives the same core sample with or without the shell."""
    rng = random.Random(seed)
    chosen: list[str] = []
    for name in areas:
        pool = [n for n in names if area(n) == name]
        chosen += rng.sample(pool, min(per_area, len(pool)))
    return sorted(chosen)


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
    parser.add_argument("--sample", type=int, default=0, help="mutants per area, drawn at random (0: all)")
    parser.add_argument("--seed", type=int, default=1, help="the sample's seed")
    parser.add_argument("--area", choices=AREAS, help="mutate and report one area only (default: both)")
    args = parser.parse_args()
    areas = (args.area,) if args.area else AREAS
    if args.report:
        return report(None, areas)
    shutil.rmtree(ROOT / "mutants", ignore_errors=True)
    env = {**os.environ, "HYPOTHESIS_PROFILE": "mutation"}
    started = time.monotonic()
    children = ["--max-children", str(args.max_children)]
    if args.sample:
        # mutmut checks only named mutants when given names, but names exist only once it has generated them:
        # a first run generates every mutant and records which tests reach which function (the costly
        # part, once), checking a handful; the sample is then drawn from the whole population and checked.
        first = subprocess.run(MUTMUT + ["run", *children, FIRST_PASS], cwd=ROOT, env=env)
        if first.returncode != 0:
            print(f"mutmut run failed (exit {first.returncode})")
            return first.returncode
        names = sample(sorted(results()), args.sample, args.seed, areas)
        SAMPLE_FILE.write_text("\n".join(names) + "\n")
        run = subprocess.run(MUTMUT + ["run", *children, *names], cwd=ROOT, env=env)
    else:
        # mutmut matches names with fnmatch; no module of the shell starts with "c"
        only = [] if areas == AREAS else ["streams.core.*"] if areas == ("core",) else ["streams.[!c]*"]
        run = subprocess.run(MUTMUT + ["run", *children, *only], cwd=ROOT, env=env)
    elapsed = time.monotonic() - started
    if run.returncode != 0:
        print(f"mutmut run failed (exit {run.returncode})")
        return run.returncode
    return report(elapsed, areas)


if __name__ == "__main__":
    sys.exit(main())
