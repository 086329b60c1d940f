"""The shape of the code, read from its source (broker-free): the imports of streams/ and projections/ and who
touches whose private members.

- No import cycle inside streams/ (nor across streams/ and projections/): every module can be read (and
  loaded) after the ones it imports. Imports inside functions count (a lazy import hides a cycle, it does not
  remove it); imports only for type checkers (`if TYPE_CHECKING:`) do not, they never run. The worker
  (streams/) imports nothing of the read side (projections/).
- No module of streams/ touches another module's private members (`other._name`, `from m import _name`):
  a module's underscore names are its own business, so it can change them without reading the others.
- The clearing account's name (`sys:clearing:`) is spelled in one module of the product.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("streams", "projections")
PRODUCT = ("streams", "projections", "connectors")


@dataclass(frozen=True)
class Module:
    name: str  # dotted, e.g. streams.core.decide (a package: streams.core)
    path: Path
    tree: ast.Module

    @property
    def package(self) -> str:
        return self.name if self.path.name == "__init__.py" else self.name.rpartition(".")[0]


def modules(*tops: str) -> dict[str, Module]:
    found = {}
    for top in tops:
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = Module(name, path, ast.parse(path.read_text(), str(path)))
    return found


def _type_checking_only(tree: ast.Module) -> set[int]:
    """ids of the import nodes under `if TYPE_CHECKING:`."""
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return skipped


def imported(module: Module, known: dict[str, Module]) -> set[str]:
    """The modules of `known` that `module` imports (at any depth of its code, type-checking blocks aside)."""
    out = set()
    skipped = _type_checking_only(module.tree)
    for node in ast.walk(module.tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package, up level - 1
                anchor = module.package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                if f"{base}.{alias.name}" in known:  # a submodule
                    out.add(f"{base}.{alias.name}")
                elif base in known:  # a name of the module (or package)
                    out.add(base)
    out.discard(module.name)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan), each as a path."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_path_within(graph, set(c)) for c in components]


def _path_within(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A cycle through the component's first module, for the message: a -> b -> ... -> a."""
    start = min(component)
    paths = {start: [start]}
    todo = [start]
    while todo:
        v = todo.pop(0)
        for w in sorted(graph[v] & component):
            if w == start:
                return paths[v] + [start]
            if w not in paths:
                paths[w] = paths[v] + [w]
                todo.append(w)
    return sorted(component)


def private_touches(module: Module) -> list[str]:
    """Where `module` reaches into another module's private names: `from m import _x`, `m._x` on an imported
    module, or `obj._x` on an object when the module itself defines no `_x` (so it is another module's)."""
    own = set()
    for node in ast.walk(module.tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            own.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            own.add(node.attr)  # self._x = ... makes _x this module's
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            own.add(node.target.id)
        elif isinstance(node, ast.arg):
            own.add(node.arg)
    # Names bound to libraries (os._exit, KafkaError._PARTITION_EOF are their public API, underscore or not).
    outside = {"self", "cls"}
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            outside |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name.split(".")[0] not in PRODUCT}
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] not in PRODUCT:
            outside |= {a.asname or a.name for a in node.names}
    found = []
    where = f"{module.path.relative_to(ROOT)}"
    for node in ast.walk(module.tree):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] in PRODUCT):
            found += [f"{where}:{node.lineno} imports {node.module}.{a.name}" for a in node.names
                      if _private(a.name)]
        elif isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in own:
            if not (isinstance(node.value, ast.Name) and node.value.id in outside):
                found.append(f"{where}:{node.lineno} {ast.unparse(node)}")
    return sorted(found, key=lambda f: (f.split(" ")[0].split(":")[0], int(f.split(" ")[0].split(":")[1])))


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


@pytest.mark.parametrize("tops", [("streams",), PACKAGES], ids="+".join)
def test_no_import_cycle(tops):
    known = modules(*tops)
    graph = {name: imported(m, known) for name, m in known.items()}
    assert sum(map(len, graph.values())) > 50, "the parser sees the imports"  # one that sees none would pass
    found = cycles(graph)
    assert not found, f"import cycles in {tops}:\n" + "\n".join(" -> ".join(c) for c in found)


def test_the_worker_does_not_import_the_read_side():
    known = modules(*PACKAGES)
    found = {name: sorted(i for i in imported(m, known) if i.startswith("projections"))
             for name, m in known.items() if name.startswith("streams")}
    assert not {name: i for name, i in found.items() if i}


def test_the_cycle_finder_finds_a_cycle_and_its_path():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert cycles(graph) == [["a", "b", "c", "a"]]


def test_the_import_parser_reads_relative_lazy_and_type_checking_imports():
    source = """
from typing import TYPE_CHECKING
from . import sibling
from .other import name
import streams.deep.mod
if TYPE_CHECKING:
    from streams.hidden import Thing
def later():
    from streams.lazy import thing
"""
    known = {n: None for n in ("streams.pkg.sibling", "streams.pkg.other", "streams.deep.mod", "streams.hidden",
                               "streams.lazy", "streams.pkg")}
    module = Module("streams.pkg.mod", ROOT / "streams/pkg/mod.py", ast.parse(source))
    assert imported(module, known) == {"streams.pkg.sibling", "streams.pkg.other", "streams.deep.mod",
                                       "streams.lazy"}


def test_the_private_member_check_tells_own_from_others():
    source = """
import os
from confluent_kafka import KafkaError
from streams.partition import _helper
class A:
    def __init__(self):
        self._mine = 1
    def f(self, proc, other: "A"):
        os._exit(KafkaError._PARTITION_EOF)
        return self._mine + other._mine + proc._theirs + len(proc.__dict__)
"""
    found = private_touches(Module("streams.x", ROOT / "streams/x.py", ast.parse(source)))
    assert [f.split(" ", 1)[1] for f in found] == ["imports streams.partition._helper", "proc._theirs"]


# Library internals a module reads on purpose, each with its reason where it is read. streams/app.py: the group
# membership a worker's transactions carry (streams/membership.py) exists only in aiokafka's group coordinator,
# which Faust keeps behind its consumer thread (Faust reads the generation the same way, faust/transport/drivers/
# aiokafka.py, ConsumerRebalanceListener.on_partitions_assigned).
LIBRARY_INTERNALS = {"streams/app.py": {"_thread", "_ensure_consumer", "_coordinator", "_group_instance_id"}}


def test_no_module_of_streams_touches_another_modules_private_members():
    found = [f for m in modules("streams").values() for f in private_touches(m)
             if f.rsplit(".", 1)[-1] not in LIBRARY_INTERNALS.get(f.split(":", 1)[0], ())]
    assert not found, f"{len(found)} touches of another module's private members:\n" + "\n".join(found)


def test_the_clearing_account_name_is_spelled_in_one_module():
    spelled = sorted(str(m.path.relative_to(ROOT)) for m in modules(*PRODUCT).values()
                     if any(isinstance(n, ast.Constant) and isinstance(n.value, str) and "sys:clearing" in n.value
                            for n in ast.walk(m.tree)))
    assert len(spelled) <= 1, f"sys:clearing spelled in {spelled}"


def test_the_clearing_spelling_check_sees_f_strings():
    tree = ast.parse('x = f"sys:clearing:{c}"')
    assert any(isinstance(n, ast.Constant) and "sys:clearing" in str(n.value) for n in ast.walk(tree))


def _imports_of(paths: list[Path]) -> list[tuple[str, str]]:
    """(file, imported module) for every import in these files, relative ones resolved."""
    found = []
    for path in paths:
        parts = path.relative_to(ROOT).with_suffix("").parts
        package = ".".join(parts[:-1])
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found += [(str(path.relative_to(ROOT)), a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    base = ".".join(anchor[:len(anchor) - (node.level - 1)] + ([base] if base else []))
                found += [(str(path.relative_to(ROOT)), f"{base}.{a.name}") for a in node.names]
    return found


def test_benchmarks_import_nothing_from_tests():
    """What a benchmark shares with the tests (a worker launcher, throwaway topics, the exactly-once check)
    is the product's; a benchmark that imported a test module would break when a test is renamed."""
    found = [(f, m) for f, m in _imports_of(sorted((ROOT / "benchmarks").rglob("*.py")))
             if m == "tests" or m.startswith("tests.")]
    assert not found


def test_no_test_module_imports_another_test_module():
    """Shared test code lives in tests/helpers/ (or a conftest's fixtures), not in a test module that another
    one imports: renaming or deleting a test then never breaks an unrelated one."""
    found = sorted({f"{f} imports {m}" for f, m in _imports_of(sorted((ROOT / "tests").rglob("test_*.py")))
                    if re.search(r"(^|\.)test_\w+(\.|$)", m.removeprefix("tests.").rsplit(".", 1)[0] + ".")})
    assert not found, "\n".join(found)
