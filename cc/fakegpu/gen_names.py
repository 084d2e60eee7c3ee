#!/usr/bin/env python3
"""Writes cc/fakegpu/names.inc: the entry points the fake GPU answers with
its library's "not supported" error unless it implements them.

The names are those that JAX's CUDA plugin and its extension modules look
up by name in NVIDIA's libraries (XLA's stubs resolve each function with
dlsym on first use), read from the installed plugin's binaries, plus the
driver names of the shim's list (cc/shim/cuda_symbols.txt). Names already
in names.inc are kept, so a table made from several plugin versions is
their union:

    python cc/fakegpu/gen_names.py            # the installed plugin
    python cc/fakegpu/gen_names.py --check    # exit 1 if names.inc lacks any

The functions of RETURNS_STRING return a `const char*` in NVIDIA's headers,
not a status: they are written as JAXLAKE_FAKEGPU_STRING lines, whose weak
stand-in returns a string (stubs.cc), never an int a caller would read as a
pointer; the fake implements each of them (tests/test_fake_gpu_libs.py
checks that it does).
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import sys
from typing import Dict, Iterable, List, Set

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "names.inc")
SHIM_LIST = os.path.join(HERE, "..", "shim", "cuda_symbols.txt")

#: library tag -> pattern of its entry point names. The order matters: the
#: first pattern that matches a name claims it.
LIBRARIES = [
    ("cudart", re.compile(r"^(cuda[A-Z][A-Za-z0-9_]*|__cuda[A-Za-z]+)$")),
    ("cublaslt", re.compile(r"^cublasLt[A-Z][A-Za-z0-9_]*$")),
    ("cublas", re.compile(r"^cublas[A-Z][A-Za-z0-9_]*$")),
    ("cudnn", re.compile(r"^cudnn[A-Z][A-Za-z0-9_]*$")),
    ("nvml", re.compile(r"^nvml[A-Z][A-Za-z0-9_]*$")),
    ("cufft", re.compile(r"^cufft[A-Z][A-Za-z0-9_]*$")),
    ("cupti", re.compile(r"^cupti[A-Z][A-Za-z0-9_]*$")),
    ("cusparse", re.compile(r"^cusparse[A-Z][A-Za-z0-9_]*$")),
    ("cusolver", re.compile(r"^cusolver[A-Z][A-Za-z0-9_]*$")),
    ("nccl", re.compile(r"^nccl[A-Z][A-Za-z0-9_]*$")),
]
#: The looked-up functions whose return type is `const char*` in NVIDIA's
#: headers (cublas_api.h, cublasLt.h, cuda_runtime_api.h, cudnn_graph.h,
#: cusparse.h, nccl.h, nvml.h). Every other listed function returns its
#: library's int-sized status, or void (cuBLAS's legacy calls,
#: cudnnGetLastErrorString); the few that return a size are implemented.
RETURNS_STRING = frozenset({
    "cublasGetStatusName", "cublasGetStatusString",
    "cublasLtGetStatusName", "cublasLtGetStatusString",
    "cudaGetErrorName", "cudaGetErrorString",
    "cudnnGetErrorString",
    "cusparseGetErrorName", "cusparseGetErrorString",
    "ncclGetErrorString", "ncclGetLastError",
    "nvmlErrorString",
})
#: Strings that match a pattern but are not functions (types). Names that
#: end in Mode, Type, Error, Status or Attr are functions too
#: (cuptiSetThreadIdType, cudaGetLastError, nvmlDeviceGetMigMode).
NOT_FUNCTIONS = re.compile(r"(_t|_st|Enum)$|^cudnnBackend$|^cudaError$")


def _strings(path: str, min_len: int = 6) -> Iterable[str]:
    with open(path, "rb") as f:
        data = f.read()
    for m in re.finditer(rb"[A-Za-z_][A-Za-z0-9_]{%d,}" % (min_len - 1), data):
        yield m.group().decode()


def plugin_binaries() -> List[str]:
    import importlib.util
    found: List[str] = []
    for mod in ("jax_plugins.xla_cuda12", "jax_plugins.xla_cuda13",
                "jax_cuda12_plugin", "jax_cuda13_plugin"):
        try:
            spec = importlib.util.find_spec(mod)
        except (ImportError, ValueError):
            spec = None
        if spec is None or not spec.submodule_search_locations:
            continue
        for d in spec.submodule_search_locations:
            found.extend(sorted(glob.glob(os.path.join(d, "*.so"))))
    return found


def string_lines(path: str) -> Set[str]:
    """The names names.inc writes as JAXLAKE_FAKEGPU_STRING."""
    if not os.path.exists(path):
        return set()
    return {m.group(1) for m in re.finditer(
        r"^JAXLAKE_FAKEGPU_STRING\(\w+, (\w+)\)", open(path).read(), re.M)}


def old_sources(path: str) -> List[str]:
    """The sources names.inc's header names (its names are kept, so their
    sources are too)."""
    if not os.path.exists(path):
        return []
    text = open(path).read()
    m = re.search(r"^// from: (.*?)\.\n", text, re.M | re.S)
    if not m:
        return []
    return [s.strip() for s in m.group(1).replace("\n// ", " ").split(",")]


def read_table(path: str) -> Dict[str, Set[str]]:
    table: Dict[str, Set[str]] = {}
    if not os.path.exists(path):
        return table
    for line in open(path):
        m = re.match(r"^JAXLAKE_FAKEGPU_(?:STUB|STRING)\((\w+), (\w+)\)",
                     line)
        if m:
            table.setdefault(m.group(1), set()).add(m.group(2))
    return table


def scan(binaries: List[str]) -> Dict[str, Set[str]]:
    table: Dict[str, Set[str]] = {}
    for path in binaries:
        for s in _strings(path):
            for lib, pattern in LIBRARIES:
                if pattern.match(s):
                    if not NOT_FUNCTIONS.search(s):
                        table.setdefault(lib, set()).add(s)
                    break
    driver = set()
    for line in open(SHIM_LIST):
        line = line.strip()
        if line and not line.startswith("#"):
            driver.add(line.split()[0])
    table["driver"] = driver
    return table


def write(table: Dict[str, Set[str]], sources: List[str]) -> None:
    with open(OUT, "w") as out:
        out.write("// Entry points of the fake GPU's libraries that answer with "
                  "their\n// library's \"not supported\" error unless "
                  "implemented (weak definitions,\n// overridden by the "
                  "implemented ones); STRING marks those that return a\n"
                  "// string (gen_names.RETURNS_STRING). Generated by "
                  "cc/fakegpu/gen_names.py\n"
                  "// from: " + ", ".join(sources) + ".\n")
        seen: Set[str] = set()
        for lib in ["driver"] + [name for name, _ in LIBRARIES]:
            for name in sorted(table.get(lib, set()) - seen):
                macro = "STRING" if name in RETURNS_STRING else "STUB"
                out.write(f"JAXLAKE_FAKEGPU_{macro}({lib}, {name})\n")
            seen |= table.get(lib, set())


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    binaries = plugin_binaries()
    if not binaries:
        print("gen_names: no JAX CUDA plugin is installed", file=sys.stderr)
        return 2
    found = scan(binaries)
    old = read_table(OUT)
    if args.check:
        # A name is one symbol, whichever library's line lists it (the
        # shim's list names a few runtime calls, written as driver lines).
        listed = {n for names in old.values() for n in names}
        missing = sorted({n for names in found.values() for n in names} -
                         listed)
        for n in missing:
            print(f"missing from names.inc: {n}")
        strings = string_lines(OUT)
        wrong = sorted((listed & RETURNS_STRING) ^ strings)
        for n in wrong:
            print(f"names.inc marks {n} wrongly: it "
                  f"{'returns' if n in RETURNS_STRING else 'does not return'}"
                  " a string")
        return 1 if missing or wrong else 0
    for lib, names in old.items():
        found.setdefault(lib, set()).update(names)
    import importlib.metadata as md
    versions = old_sources(OUT)
    for dist in ("jax-cuda12-plugin", "jax-cuda13-plugin"):
        try:
            versions.append(f"{dist} {md.version(dist)}")
        except md.PackageNotFoundError:
            pass
    shim = "cc/shim/cuda_symbols.txt"
    versions = sorted(set(versions) - {shim})
    write(found, versions + [shim])
    print(f"gen_names: {sum(len(v) for v in found.values())} names")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
