"""The core is pure: it imports only the standard library, and no I/O, clock or randomness (P7).

Walks every module of streams/core with ast (no import needed, so a forbidden import cannot hide behind a
failing import) and fails on any forbidden import or call.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[2] / "streams" / "core"

# I/O and framework libraries the core must never import (DESIGN.md §4), plus nondeterminism sources.
FORBIDDEN_MODULES = {
    "faust", "rocksdict", "confluent_kafka", "fastavro", "aiokafka", "kafka", "mode", "typer",
    "os", "io", "sys", "time", "random", "secrets", "uuid", "socket", "ssl", "select", "selectors",
    "asyncio", "threading", "multiprocessing", "subprocess", "signal", "shutil", "pathlib", "tempfile",
    "glob", "urllib", "http", "requests", "sqlite3", "pickle", "shelve", "logging", "decimal", "fractions",
    "math", "datetime", "zoneinfo", "calendar",
}
# Attribute calls that read a clock, the environment or the outside world even through an allowed module.
FORBIDDEN_CALLS = {"now", "utcnow", "today", "time", "time_ns", "monotonic", "perf_counter", "random",
                   "urandom", "getenv", "open", "input", "print"}
FORBIDDEN_BUILTINS = {"open", "input", "print", "eval", "exec", "__import__", "hash", "id"}


def _modules() -> list[Path]:
    files = sorted(CORE.rglob("*.py"))
    assert files, f"no modules under {CORE}"
    return files


def _problems(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    problems = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module:
                names = [node.module]
        for name in names:
            top = name.split(".")[0]
            if top in FORBIDDEN_MODULES:
                problems.append(f"{path.name}:{node.lineno} imports {name}")
            elif top != "streams" and top != "__future__" and top not in sys.stdlib_module_names:
                problems.append(f"{path.name}:{node.lineno} imports non-stdlib {name}")
            elif top == "streams" and not name.startswith("streams.core"):
                problems.append(f"{path.name}:{node.lineno} imports {name} outside the core")
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in FORBIDDEN_CALLS:
                problems.append(f"{path.name}:{node.lineno} calls .{func.attr}()")
            if isinstance(func, ast.Name) and func.id in FORBIDDEN_BUILTINS:
                problems.append(f"{path.name}:{node.lineno} calls {func.id}()")
    return problems


@pytest.mark.parametrize("path", _modules(), ids=lambda p: p.name)
def test_core_module_is_pure(path: Path) -> None:
    assert _problems(path) == []


def test_the_check_catches_forbidden_imports(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import faust\nfrom confluent_kafka import Producer\nimport time\n"
                   "import datetime\nx = datetime.datetime.now()\nimport rocksdict, fastavro, aiokafka\n")
    problems = _problems(bad)
    for word in ("faust", "confluent_kafka", "time", "datetime", ".now()", "rocksdict", "fastavro", "aiokafka"):
        assert any(word in p for p in problems), word


def test_importing_the_core_loads_no_io_library() -> None:
    import subprocess

    code = ("import sys, streams.core; bad = {'faust','rocksdict','confluent_kafka','fastavro','aiokafka'}"
            " & {m.split('.')[0] for m in sys.modules}; print(sorted(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=CORE.parents[1])
    assert out.stdout.strip() == "[]"
