#!/usr/bin/env python3
"""Regenerates cc/shim/cuda_symbols.txt, the driver entry points the shim exports.

The shim stands in for libcuda.so.1, so it must export every name a program
may look up in the real driver: the current versioned names (cuMemAlloc_v2),
the legacy unversioned ones (cuMemAlloc), the per-thread default stream
variants (_ptsz, _ptds), cuGetProcAddress and cuGetProcAddress_v2, and
cuGetExportTable. Two sources, either or both:

  --headers DIR  a CUDA toolkit include directory. cuda.h and the interop
                 headers beside it (cudaProfiler.h, cudaGL.h, cudaEGL.h,
                 cudaVDPAU.h) are run through the C preprocessor three times:
                 as is, with CUDA_API_PER_THREAD_DEFAULT_STREAM (which names
                 the _ptsz/_ptds variants), and with __CUDA_API_VERSION_INTERNAL
                 (which declares the legacy and older versioned names). Every
                 function returning CUresult is taken, except static inline
                 helpers. The GL/EGL/VDPAU headers they include are replaced
                 by empty stand-ins.
  --nm LIB       a real libcuda.so.1 (repeatable): its exported functions
                 whose names start with "cu" (nm -D --defined-only).
  --plugin LIB   a jax CUDA plugin, xla_cuda_plugin.so (repeatable): the
                 table of driver names it resolves with dlsym, read from
                 its bytes (plugin_names below). Every name a plugin may
                 look up must be exported, or its dlsym returns NULL; this
                 brings the debugger symbols (cudbg*) and names newer than
                 the headers at hand.

Names already in the output file are kept (a name once exported stays
exported, so programs built for older drivers keep working); --replace
starts from nothing instead. A handful of names that released drivers export
but no header declares are always added (KNOWN_UNDECLARED).

For a new CUDA release or jax plugin:

  python3 cc/shim/gen_symbols.py --headers /usr/local/cuda-13.1/include \
      [--nm /usr/lib/x86_64-linux-gnu/libcuda.so.1] \
      [--plugin .../jax_plugins/xla_cuda12/xla_cuda_plugin.so]

tests/test_xla.py reads the name table of the installed plugin (the test
extra pins jax-cuda12-plugin) with plugin_names() and checks that the list
and the built shim cover it.

then rebuild; CMake regenerates the trampolines from the list.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterable, List, Set

DEFAULT_OUT = Path(__file__).resolve().parent / "cuda_symbols.txt"

HEADERS = ["cuda.h", "cudaProfiler.h", "cudaGL.h", "cudaEGL.h", "cudaVDPAU.h"]
# Headers of other libraries that the interop headers include.
STAND_INS = ["GL/gl.h", "EGL/egl.h", "EGL/eglext.h", "vdpau/vdpau.h"]
MODES = [[], ["-DCUDA_API_PER_THREAD_DEFAULT_STREAM"],
         ["-D__CUDA_API_VERSION_INTERNAL"]]

# Exported by released drivers (seen with nm -D), declared in no header.
KNOWN_UNDECLARED = [
    "cuEGLApiInit",
    "cuMemGetAttribute",
    "cuMemGetAttribute_v2",
    "cudaLibraryGetKernel",
    "cudaLibraryLoadData",
    "cudaLibraryUnload",
]

NAME = re.compile(r"^(?:cu(?:da)?[A-Z][A-Za-z0-9_]*|cudbg[A-Za-z0-9_]+)$")
# A driver name as a NUL-terminated string of a plugin's read-only data
# (the table it passes to dlsym): cuXxx..., with optional _v2/_ptsz-style
# suffixes, or a debugger symbol cudbgXxx. Preceded by a NUL too, so that
# the tails of longer strings do not count.
PLUGIN_NAME = re.compile(
    rb"(?<=\x00)(cu(?:[A-Z][A-Za-z0-9]*)+(?:_[A-Za-z0-9]+)*|"
    rb"cudbg[A-Za-z0-9_]+)\x00")
DECLARED = re.compile(r"\bCUresult\s+(?:CUDAAPI\s+)?(cu[A-Z]\w*)\s*\(")
STATIC = re.compile(
    r"\bstatic\s+(?:(?:inline|__inline__|__inline)\s+)*CUresult\s+"
    r"(?:CUDAAPI\s+)?(cu[A-Z]\w*)\s*\(")


def from_headers(include: Path, cc: str) -> Set[str]:
    present = [h for h in HEADERS if (include / h).is_file()]
    if "cuda.h" not in present:
        sys.exit(f"gen_symbols: no cuda.h in {include}")
    names: Set[str] = set()
    with tempfile.TemporaryDirectory() as tmp:
        stubs = Path(tmp) / "stubs"
        for rel in STAND_INS:
            (stubs / rel).parent.mkdir(parents=True, exist_ok=True)
            (stubs / rel).write_text("")
        unit = Path(tmp) / "all.c"
        unit.write_text("".join(f'#include "{h}"\n' for h in present))
        for mode in MODES:
            cmd = [cc, "-E", "-P", "-x", "c", f"-I{include}", f"-I{stubs}",
                   *mode, str(unit)]
            run = subprocess.run(cmd, capture_output=True, text=True)
            if run.returncode != 0:
                sys.exit(f"gen_symbols: {' '.join(cmd)} failed:\n{run.stderr}")
            statics = set(STATIC.findall(run.stdout))
            names |= set(DECLARED.findall(run.stdout)) - statics
    return names


def from_nm(lib: Path) -> Set[str]:
    cmd = ["nm", "-D", "--defined-only", str(lib)]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"gen_symbols: {' '.join(cmd)} failed:\n{run.stderr}")
    names = set()
    for line in run.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1] in ("T", "t", "W", "i"):
            name = parts[2].split("@")[0]
            if NAME.match(name):
                names.add(name)
    return names


def plugin_names(lib: Path) -> Set[str]:
    """The driver names in a jax CUDA plugin's name table."""
    data = Path(lib).read_bytes()
    return {m.group(1).decode() for m in PLUGIN_NAME.finditer(data)}


def read_list(path: Path) -> Set[str]:
    if not path.is_file():
        return set()
    out = set()
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            out.add(line)
    return out


def write_list(path: Path, names: Iterable[str], sources: List[str]) -> int:
    ordered = sorted(set(names))
    bad = [n for n in ordered if not NAME.match(n)]
    if bad:
        sys.exit(f"gen_symbols: not driver entry point names: {bad}")
    head = [
        "# CUDA driver entry points exported by the jaxlake shim, one a line.",
        "# Generated by cc/shim/gen_symbols.py (keeps names already listed);",
        "# sources of the last run: " + ", ".join(sources) + ".",
        f"# {len(ordered)} names. Regenerate for a new CUDA release, do not",
        "# edit by hand except to add a name a real driver exports.",
    ]
    path.write_text("\n".join(head + ordered) + "\n")
    return len(ordered)


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--headers", type=Path, action="append", default=[],
                        help="a CUDA include directory holding cuda.h")
    parser.add_argument("--nm", type=Path, action="append", default=[],
                        help="a real libcuda.so.1 to read exports from")
    parser.add_argument("--plugin", type=Path, action="append", default=[],
                        help="a jax CUDA plugin (xla_cuda_plugin.so) whose "
                             "driver name table to cover")
    parser.add_argument("--cc", default=os.environ.get("CC", "cc"),
                        help="C compiler used as preprocessor (default: $CC or cc)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--replace", action="store_true",
                        help="do not keep the names already in --out")
    args = parser.parse_args(argv)
    if not args.headers and not args.nm and not args.plugin:
        parser.error("give --headers DIR, --nm LIB and/or --plugin LIB")

    old = set() if args.replace else read_list(args.out)
    names = set(old) | set(KNOWN_UNDECLARED)
    sources = []
    for include in args.headers:
        found = from_headers(include, args.cc)
        version = re.search(r"#define\s+CUDA_VERSION\s+(\d+)",
                            (include / "cuda.h").read_text())
        sources.append(f"cuda.h {version.group(1) if version else '?'} "
                       f"({len(found)})")
        names |= found
    for lib in args.nm:
        found = from_nm(lib)
        sources.append(f"nm {lib.name} ({len(found)})")
        names |= found
    for lib in args.plugin:
        found = plugin_names(lib)
        sources.append(f"plugin {lib.parent.name}/{lib.name} ({len(found)})")
        names |= found
    count = write_list(args.out, names, sources)
    added = len(names - old)
    print(f"{args.out}: {count} names ({added} new)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
