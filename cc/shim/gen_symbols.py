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
  --wheel WHL    a jax-cuda12-pjrt or jax-cuda13-pjrt wheel (repeatable):
                 its plugin's name table is written to
                 plugin_symbols/<distribution>-<version>.txt beside this
                 script (no wheel is kept in the repository).

Every table in plugin_symbols/ is always added to the list, so the list is
the union of the supported plugins' name tables (and the headers' names):
`gen_symbols.py --tables` regenerates it from the tables alone.

Names already in the output file are kept (a name once exported stays
exported, so programs built for older drivers keep working); --replace
starts from nothing instead. A handful of names that released drivers export
but no header declares are always added (KNOWN_UNDECLARED).

For a new CUDA release:

  python3 cc/shim/gen_symbols.py --headers /usr/local/cuda-13.1/include \
      [--nm /usr/lib/x86_64-linux-gnu/libcuda.so.1]

For a new jax release (both CUDA major versions; the wheels are the
PJRT plugins, which hold xla_cuda_plugin.so):

  pip download --no-deps -d /tmp/w jax-cuda12-pjrt==V jax-cuda13-pjrt==V
  python3 cc/shim/gen_symbols.py --wheel /tmp/w/jax_cuda12_pjrt-V-*.whl \
      --wheel /tmp/w/jax_cuda13_pjrt-V-*.whl

tests/test_xla_symbols.py checks that the list and the built shim cover every
table in plugin_symbols/, and the name table of the installed plugin
(read with plugin_names()).

then rebuild; CMake regenerates the trampolines from the list.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import zipfile
from pathlib import Path
from typing import Iterable, List, Set, Tuple, Union

DEFAULT_OUT = Path(__file__).resolve().parent / "cuda_symbols.txt"
#: One name table per supported plugin (distribution-version.txt).
TABLES = Path(__file__).resolve().parent / "plugin_symbols"

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
# the tails of longer strings do not count. At least three characters
# follow "cu" (cuInit is the shortest driver name): a shorter string such
# as "cuF" or "cuO" is a fragment of code or data, not a name. The leading
# NUL is matched and the trailing one looked ahead at (not the other way
# round): a pattern that starts with a literal lets `re` scan for it, 13
# times faster over a 480 MB plugin, and back-to-back names still match.
PLUGIN_NAME = re.compile(
    rb"\x00(cu[A-Z][A-Za-z0-9]{2,}(?:_[A-Za-z0-9]+)*|"
    rb"cudbg[A-Za-z0-9_]+)(?=\x00)")
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


def plugin_names(lib: Union[Path, str, bytes]) -> Set[str]:
    """The driver names in a jax CUDA plugin's name table (a path, or the
    library's bytes)."""
    data = lib if isinstance(lib, bytes) else Path(lib).read_bytes()
    return {m.group(1).decode() for m in PLUGIN_NAME.finditer(data)}


def wheel_names(wheel: Path) -> Tuple[str, Set[str]]:
    """(distribution-version, name table) of a jax CUDA PJRT wheel, read
    from its xla_cuda_plugin.so and dist-info without unpacking it."""
    with zipfile.ZipFile(wheel) as z:
        libs = [n for n in z.namelist()
                if n.endswith("/xla_cuda_plugin.so")]
        metas = [n for n in z.namelist()
                 if n.endswith(".dist-info/METADATA")]
        if len(libs) != 1 or len(metas) != 1:
            sys.exit(f"gen_symbols: {wheel} is not a jax CUDA PJRT wheel "
                     "(one xla_cuda_plugin.so and one METADATA expected)")
        meta = z.read(metas[0]).decode("utf-8", "replace")
        names = plugin_names(z.read(libs[0]))
    fields = dict(re.findall(r"^(Name|Version): (\S+)$", meta, re.M))
    if "Name" not in fields or "Version" not in fields:
        sys.exit(f"gen_symbols: {wheel} has no Name/Version in METADATA")
    return f"{fields['Name'].lower()}-{fields['Version']}", names


def write_table(folder: Path, key: str, names: Set[str], source: str) -> Path:
    """Writes one plugin's name table as folder/<key>.txt."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{key}.txt"
    ordered = sorted(names)
    head = [f"# Driver names in the name table of {key}'s xla_cuda_plugin.so,",
            f"# read by cc/shim/gen_symbols.py from {source}.",
            f"# {len(ordered)} names. Regenerate, do not edit."]
    path.write_text("\n".join(head + ordered) + "\n")
    return path


def tables(folder: Path = TABLES) -> List[Path]:
    """The plugin name tables kept in the repository."""
    return sorted(folder.glob("*.txt")) if folder.is_dir() else []


def read_list(path: Path) -> Set[str]:
    if not path.is_file():
        return set()
    out = set()
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            out.add(line)
    return out


def read_sources(path: Path) -> List[str]:
    """The sources an earlier run named in the list's header."""
    if not path.is_file():
        return []
    text = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        text.append(line.lstrip("#").strip())
    joined = " ".join(text)
    m = re.search(r"sources(?: so far| of the last run)?: (.*?)\.\s+\d+ names",
                  joined)
    return [s.strip() for s in m.group(1).split(";")] if m else []


def write_list(path: Path, names: Iterable[str], sources: List[str]) -> int:
    ordered = sorted(set(names))
    bad = [n for n in ordered if not NAME.match(n)]
    if bad:
        sys.exit(f"gen_symbols: not driver entry point names: {bad}")
    head = [
        "# CUDA driver entry points exported by the jaxlake shim, one a line.",
        "# Generated by cc/shim/gen_symbols.py (keeps names already listed);",
        *("# " + line for line in textwrap.wrap(
            "sources so far: " + "; ".join(sources) + ".", 74)),
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
    parser.add_argument("--wheel", type=Path, action="append", default=[],
                        help="a jax-cuda12-pjrt/jax-cuda13-pjrt wheel whose "
                             "plugin's name table to keep in plugin_symbols/")
    parser.add_argument("--tables", action="store_true",
                        help="only add the tables in plugin_symbols/")
    parser.add_argument("--tables-dir", type=Path, default=TABLES,
                        help=argparse.SUPPRESS)
    parser.add_argument("--cc", default=os.environ.get("CC", "cc"),
                        help="C compiler used as preprocessor (default: $CC or cc)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--replace", action="store_true",
                        help="do not keep the names already in --out")
    args = parser.parse_args(argv)
    if not (args.headers or args.nm or args.plugin or args.wheel
            or args.tables):
        parser.error("give --headers DIR, --nm LIB, --plugin LIB, "
                     "--wheel WHL and/or --tables")
    for wheel in args.wheel:
        key, found = wheel_names(wheel)
        path = write_table(args.tables_dir, key, found, wheel.name)
        print(f"{path}: {len(found)} names")

    old = set() if args.replace else read_list(args.out)
    names = set(old) | set(KNOWN_UNDECLARED)
    sources: List[str] = []
    earlier = [] if args.replace else read_sources(args.out)
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
    kept = tables(args.tables_dir)
    for table in kept:
        names |= read_list(table)
    if kept:
        sources.append("plugin tables (plugin_symbols/) "
                       + ", ".join(t.stem for t in kept))
    # A source named again replaces its earlier mention.
    sources += [s for s in earlier if not s.startswith("plugin tables")
                and s not in sources]
    count = write_list(args.out, names, sources)
    added = len(names - old)
    print(f"{args.out}: {count} names ({added} new)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
