"""The generated decoders of schemas.fastcodec, compiled to C with Cython when a build is available.

A bulk reader spends most of its time decoding (docs/read-side.md: a history record cost 7–10 µs in the
generated Python, against 1.2–1.8 µs to read it from Kafka). This module writes, for one schema, a Cython
module whose decoder reads the bytes as C (varints, lengths and counts as machine integers, strings straight
from the buffer) and builds exactly the values the Python decoder builds, raising exactly its exceptions
(type and message) on corrupt or truncated input. The Python decoder stays the source of truth: the C one is
used only when a module built from this schema's current source is found, so a schema or generator change
falls back to Python until `python -m schemas.cdecode build` runs again (`make install` runs it), and a
machine without a C compiler runs the Python decoder. `LEDGER_CODEC=python` forces the Python decoder.

Built modules live in schemas/_native/ (not in git), named by a hash of their source.
"""
from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import logging
import os
import sys
from pathlib import Path
from typing import Any, Callable

log = logging.getLogger("ledger.codec")

NATIVE_DIR = Path(__file__).resolve().parent / "_native"

# Shared by every module: the Python helpers of fastcodec (_read_varint, _read_len, _read_count, the one-byte
# fast paths) as C, with their messages, so a corrupt record is refused with the same words either way.
_PRELUDE = r'''# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
from libc.stdint cimport uint64_t, int64_t, INT64_MIN
from cpython.unicode cimport PyUnicode_DecodeUTF8
from cpython.bytes cimport PyBytes_FromStringAndSize

cdef extern from "Python.h":
    int Py_EnterRecursiveCall(const char* where) noexcept
    void Py_LeaveRecursiveCall() noexcept


cdef inline int _enter() except -1:
    # One level of the interpreter's recursion count per record, as the Python decoder spends one frame per
    # record: a hostile record nested without end (a recursive schema) is a RecursionError, not a C stack
    # overflow, and at the same depth as in Python.
    if Py_EnterRecursiveCall(""):
        return -1
    return 0


cdef int64_t _rv(const unsigned char* b, Py_ssize_t ln, Py_ssize_t* pp) except? -1:
    cdef Py_ssize_t p = pp[0]
    cdef unsigned char c
    cdef uint64_t n
    cdef int shift = 7
    cdef bint beyond = False
    if p >= ln:
        raise IndexError("index out of range")
    c = b[p]
    n = c & 0x7F
    p += 1
    while c & 0x80:
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")
        if p >= ln:
            raise IndexError("index out of range")
        c = b[p]
        p += 1
        if shift == 63 and (c & 0x7F) > 1:
            beyond = True
        n |= (<uint64_t>(c & 0x7F)) << shift
        shift += 7
    if beyond:
        raise ValueError("varint beyond 64 bits")
    pp[0] = p
    return <int64_t>((n >> 1) ^ (<uint64_t>0 - (n & 1)))


cdef object _rs(const unsigned char* b, Py_ssize_t ln, Py_ssize_t* pp, bint text):
    cdef Py_ssize_t p = pp[0]
    cdef int64_t n
    cdef unsigned char c
    if p >= ln:
        raise IndexError("index out of range")
    c = b[p]
    if c < 0x80 and not c & 1:
        n = c >> 1
        p += 1
        if n > ln - p:
            raise ValueError("truncated data")
    else:
        n = _rv(b, ln, &p)
        if n < 0:
            raise ValueError(f"negative length {n}")
        if n > ln - p:
            raise ValueError(f"length {n} exceeds the {ln - p} remaining bytes")
    pp[0] = p + n
    if text:
        return PyUnicode_DecodeUTF8(<const char*>b + p, n, NULL)
    return PyBytes_FromStringAndSize(<const char*>b + p, n)


cdef int64_t _rcount(const unsigned char* b, Py_ssize_t ln, Py_ssize_t* pp) except -1:
    cdef int64_t n = _rv(b, ln, pp)
    if n < 0:
        _rv(b, ln, pp)  # the block's size in bytes, not needed
        if n == INT64_MIN:
            raise ValueError(f"block count {-(<object>n)} exceeds the {ln - pp[0]} remaining bytes")
        n = -n
    if n > ln - pp[0]:
        raise ValueError(f"block count {n} exceeds the {ln - pp[0]} remaining bytes")
    return n


cdef int64_t _rfirst(const unsigned char* b, Py_ssize_t ln, Py_ssize_t* pp) except -1:
    # The first count of an array or map: one byte 0 (the usual empty one) without the varint.
    if pp[0] >= ln:
        raise IndexError("index out of range")
    if b[pp[0]] == 0:
        pp[0] += 1
        return 0
    return _rcount(b, ln, pp)


cdef bint _rbool(const unsigned char* b, Py_ssize_t ln, Py_ssize_t* pp) except? -1:
    if pp[0] >= ln:
        raise IndexError("index out of range")
    pp[0] += 1
    return b[pp[0] - 1] != 0


def decode_at(d, Py_ssize_t p):
    cdef const unsigned char* b
    cdef Py_ssize_t ln
    if d.__class__ is not bytes:
        d = bytes(d)
    b = <const unsigned char*><const char*>d
    ln = len(d)
    if p < 0:
        raise IndexError("index out of range")
    v = {top}(b, ln, &p)
    return v, p
'''


class _CGen:
    """Cython source of one schema's decoder, value for value what fastcodec._Gen's decoder builds."""

    def __init__(self, gen: Any):
        self.gen = gen  # a fastcodec._Gen: named types, resolve(), _type_of
        self.funcs: list[str] = []
        self.consts: list[str] = []
        self.names: dict[str, str] = {}
        self.locals: list[str] = []  # C locals of the function being written (Cython wants them at its top)
        self.n = 0

    def tmp(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    def func(self, schema: Any, top: bool = False) -> str:
        """A cdef function (b, ln, pp) -> value for a record (one per named record) or any other type.

        A record's function, and the top one, count one level of recursion (the Python decoder has a frame for
        each): a recursive schema fed a hostile nesting raises RecursionError where the Python decoder does,
        where C would otherwise recurse until the stack overflows."""
        from schemas.fastcodec import _type_of

        schema = self.gen.resolve(schema)
        is_record = _type_of(schema) == "record"
        if is_record and schema["name"] in self.names:
            return self.names[schema["name"]]
        fname = self.tmp("_d")
        if is_record:
            self.names[schema["name"]] = fname
        counted = is_record or top
        ind = "        " if counted else "    "
        outer, self.locals = self.locals, ["i"]
        lines = []
        if is_record:
            items = []
            for field in schema["fields"]:
                v = self.tmp("f")
                lines += self.read(field["type"], v, ind)
                items.append(f"{field['name']!r}: {v}")
            lines.append(f"{ind}v = {{{', '.join(items)}}}")
        else:
            lines += self.read(schema, "v", ind)
        lines += [f"{ind}pp[0] = p", f"{ind}return v"]
        if counted:
            lines = ["    _enter()", "    try:"] + lines + ["    finally:", "        Py_LeaveRecursiveCall()"]
        head = [f"cdef object {fname}(const unsigned char* b, Py_ssize_t ln, Py_ssize_t* pp):",
                "    cdef Py_ssize_t p = pp[0]", f"    cdef int64_t {', '.join(self.locals)}"]
        self.locals = outer
        self.funcs.append("\n".join(head + lines))
        return fname

    def read(self, schema: Any, target: str, ind: str) -> list[str]:
        from schemas.fastcodec import _PRIMITIVES, _type_of

        schema = self.gen.resolve(schema)
        t = _type_of(schema)
        if t in ("long", "int"):
            return [f"{ind}{target} = _rv(b, ln, &p)"]
        if t in ("string", "bytes"):
            return [f"{ind}{target} = _rs(b, ln, &p, {t == 'string'})"]
        if t == "boolean":
            return [f"{ind}{target} = _rbool(b, ln, &p)"]
        if t == "null":
            return [f"{ind}{target} = None"]
        if t == "enum":
            syms = self.tmp("_SYM")
            # A C-level global: indexed without a bounds check (the index is checked first), so it must stay this
            # tuple (a Python-visible module attribute could be rebound).
            self.consts.append(f"cdef tuple {syms} = {tuple(schema['symbols'])!r}")
            return [f"{ind}i = _rv(b, ln, &p)",
                    f"{ind}if not 0 <= i < {len(schema['symbols'])}: raise ValueError(f'invalid enum index {{i}}')",
                    f"{ind}{target} = {syms}[i]"]
        if t in ("record", "array", "map"):
            if t == "record":
                return [f"{ind}{target} = {self.func(schema)}(b, ln, &p)"]
            return self.read_block(schema, t, target, ind)
        if t == "union":
            lines = [f"{ind}i = _rv(b, ln, &p)"]
            kw = "if"
            for idx, branch in enumerate(schema):
                lines.append(f"{ind}{kw} i == {idx}:")
                rb = self.gen.resolve(branch)
                if (isinstance(branch, str) and branch not in _PRIMITIVES) or _type_of(branch) == "record":
                    r = self.tmp("r")
                    lines += self.read(rb, r, ind + "    ")
                    lines.append(f"{ind}    {target} = ({rb['name']!r}, {r})")
                else:
                    lines += self.read(branch, target, ind + "    ")
                kw = "elif"
            lines.append(f"{ind}else: raise ValueError(f'invalid union index {{i}}')")
            return lines
        raise ValueError(f"unsupported Avro type {t!r}")

    def read_block(self, schema: dict, t: str, target: str, ind: str) -> list[str]:
        # Items are read by a function of their own: its locals (i, n) do not clash with this loop's.
        item = self.func(schema["items"] if t == "array" else schema["values"])
        n, k = self.tmp("n"), self.tmp("k")
        self.locals.append(n)
        lines = [f"{ind}{target} = {'[]' if t == 'array' else '{}'}",
                 f"{ind}{n} = _rfirst(b, ln, &p)", f"{ind}while {n}:", f"{ind}    for _ in range({n}):"]
        if t == "array":
            lines.append(f"{ind}        {target}.append({item}(b, ln, &p))")
        else:
            lines += [f"{ind}        {k} = _rs(b, ln, &p, True)", f"{ind}        {target}[{k}] = {item}(b, ln, &p)"]
        lines.append(f"{ind}    {n} = _rcount(b, ln, &p)")
        return lines


def source(gen: Any, parsed: Any) -> str:
    """The Cython module decoding `parsed` (with the named types `gen` resolved), given a fastcodec._Gen."""
    c = _CGen(gen)
    top = c.func(parsed, top=True)
    body = "\n\n\n".join(c.funcs)
    return _PRELUDE.replace("{top}", top) + "\n\n" + "\n".join(c.consts) + "\n\n\n" + body + "\n"


def module_name(src: str) -> str:
    return "ledger_decode_" + hashlib.sha256(src.encode()).hexdigest()[:20]


def load(src: str, directory: Path = NATIVE_DIR) -> Callable[[bytes, int], tuple[Any, int]] | None:
    """The compiled decode_at of this source when a module built from it is in `directory`, else None."""
    if os.environ.get("LEDGER_CODEC") == "python":
        return None
    module = load_module(src, directory)
    return None if module is None else module.decode_at


def load_module(src: str, directory: Path = NATIVE_DIR) -> Any:
    """The module built from this Cython source when it is in `directory` (build() puts it there), else None."""
    name = module_name(src)
    if name in sys.modules:
        return sys.modules[name]
    path = _built(name, directory)
    if path is None:
        return None
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        return None
    try:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except ImportError as exc:  # a damaged file: the Python code serves
        log.warning("compiled module %s not loaded (%s); using the Python code", path.name, exc)
        return None
    sys.modules[name] = module
    return module


def _built(name: str, directory: Path) -> Path | None:
    """The module file built for this interpreter (its own extension suffix, e.g. .cpython-311-x86_64-linux-gnu.so)."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = directory / f"{name}{suffix}"
        if path.is_file():
            return path
    return None


def build(sources: list[str], directory: Path = NATIVE_DIR) -> list[Path]:
    """Compile each source into `directory` (skipping those already built); the built files."""
    from Cython.Build import cythonize
    from setuptools import Extension
    from setuptools.dist import Distribution

    directory.mkdir(parents=True, exist_ok=True)
    wanted = {module_name(s): s for s in sources}
    missing = [n for n in wanted if _built(n, directory) is None]
    if missing:
        work = directory / "build"
        work.mkdir(exist_ok=True)
        extensions = []
        for name in missing:
            pyx = work / f"{name}.pyx"
            pyx.write_text(wanted[name])
            extensions.append(Extension(name, [str(pyx)], extra_compile_args=["-O2", "-Wno-unused-function"]))
        dist = Distribution({"ext_modules": cythonize(extensions, quiet=True, nthreads=0,
                                                      build_dir=str(work))})
        cmd = dist.get_command_obj("build_ext")
        cmd.build_lib = str(directory)
        cmd.build_temp = str(work)
        cmd.parallel = os.cpu_count() or 1
        cmd.ensure_finalized()
        cmd.run()
    built = [_built(n, directory) for n in wanted]
    if None in built:
        raise RuntimeError(f"the build left no module for {[n for n, b in zip(wanted, built) if b is None]}")
    return [b for b in built if b is not None]


# Cython written by hand, built with the decoders and loaded by its owner with load_module (read here as text,
# so that this module imports nothing of theirs): the replay loader's common case (projections/fastload.py).
HAND_WRITTEN = (Path(__file__).resolve().parent.parent / "projections" / "fastload.pyx",)


def ledger_sources() -> list[str]:
    """The Cython sources of every schema the ledger's codec compiles (current versions), and the hand-written
    modules."""
    from schemas.codec import Codec

    return [c.native_source for c in Codec(native=False)._compiled.values()] + [p.read_text() for p in HAND_WRITTEN]


def main(argv: list[str]) -> int:
    if argv[1:] != ["build"]:
        print("usage: python -m schemas.cdecode build", file=sys.stderr)
        return 2
    try:
        built = build(ledger_sources())
    except Exception as exc:  # no compiler, no Cython: the Python decoders serve, slower
        print(f"schemas.cdecode: compiled decoders not built ({type(exc).__name__}: {exc}); "
              f"the generated Python decoders will be used", file=sys.stderr)
        return 0
    print(f"schemas.cdecode: {len(built)} compiled modules (decoders, the replay loader's) in {NATIVE_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
