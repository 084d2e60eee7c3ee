"""The lake's lock discipline (cc/lake/thread_annotations.h).

Each of the lake's sources (JAXLAKE_LAKE_SOURCES in cc/SOURCES.cmake) is
compiled with `clang++ -fsyntax-only -Wthread-safety -Werror`: a field
guarded by the lake's mutex read or written without it, or a method that
needs the lock called without it, fails the test. A probe that touches a
guarded field without the lock must fail the same check, so that a check
which no longer sees the annotations (a macro that expands to nothing under
Clang, say) fails too. Those two are skipped, saying so, when clang++ is
not installed (.ci/run installs it).

Clang checks that the lock is held, not where it is released for a while:
the methods of Lake::Impl marked JAXLAKE_MAY_UNLOCK(mu) must be exactly
those that release it (through Unlock, or a condition variable's wait), by
themselves or through a method that does. That is read from the sources.
"""

from __future__ import annotations

import concurrent.futures
import pathlib
import re
import shutil
import subprocess
from typing import Dict, List, Set, Tuple

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
CLANG = shutil.which("clang++")
FLAGS = ["-std=c++17", "-fsyntax-only", "-Wthread-safety", "-Werror",
         f"-I{ROOT}"]

needs_clang = pytest.mark.skipif(
    CLANG is None, reason="clang++ is not installed: the thread-safety "
    "analysis needs Clang (apt-get install clang)")


def lake_sources() -> List[pathlib.Path]:
    """The .cc files of JAXLAKE_LAKE_SOURCES, in the order listed."""
    text = (ROOT / "cc" / "SOURCES.cmake").read_text()
    m = re.search(r"set\(JAXLAKE_LAKE_SOURCES\s+([^)]*)\)", text)
    assert m, "cc/SOURCES.cmake has no set(JAXLAKE_LAKE_SOURCES ...)"
    return [ROOT / w for w in m.group(1).split()]


def clang(args: List[str]) -> Tuple[int, str]:
    assert CLANG is not None
    r = subprocess.run([CLANG, *FLAGS, *args], capture_output=True, text=True,
                       timeout=120)
    return r.returncode, r.stderr


@needs_clang
def test_lake_sources_pass_the_thread_safety_analysis() -> None:
    sources = lake_sources()
    assert sources
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda p: clang([str(p)]), sources))
    failures = [f"{p.relative_to(ROOT)}:\n{err}"
                for p, (rc, err) in zip(sources, results) if rc != 0]
    assert not failures, "\n".join(failures)


# Lake::allocation_size without its lock (only compiled, never linked).
PROBE = """
#include "cc/lake/lake_impl.h"
namespace jaxlake {
std::size_t Lake::allocation_size(std::uintptr_t address) const {
  const LiveTable::Entry* it = impl_->live.find(address);
  return it == nullptr ? 0 : it->second.size;
}
}  // namespace jaxlake
"""


@needs_clang
def test_a_guarded_field_read_without_the_lock_fails_the_check(
        tmp_path: pathlib.Path) -> None:
    probe = tmp_path / "probe.cc"
    probe.write_text(PROBE)
    rc, err = clang([str(probe)])
    assert rc != 0, "reading Lake::Impl::live without its lock compiled"
    assert "reading variable 'live' requires holding mutex" in err, err


LAKE = ROOT / "cc" / "lake"
# A declaration in lake_impl.h with its annotation (and an inline body).
DECLARATION = re.compile(
    r"(\w+)\(((?:[^()]|\([^()]*\))*)\)\s*(?:const\s*)?"
    r"JAXLAKE_(REQUIRES|MAY_UNLOCK|RELEASE|ACQUIRE)\(mu\)"
    r"(\s*(?:JAXLAKE_NO_THREAD_SAFETY_ANALYSIS\s*)?\{)?")


def brace_block(text: str, start: int) -> str:
    """The text of the {...} block that opens at text[start]."""
    depth = 0
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start:i + 1]
    raise AssertionError(f"unbalanced braces after offset {start}")


def impl_methods() -> Tuple[Dict[str, str], Dict[str, str]]:
    """Impl's annotations by method name, and the methods' bodies."""
    header = (LAKE / "lake_impl.h").read_text()
    marks: Dict[str, str] = {}
    bodies: Dict[str, str] = {}
    for m in DECLARATION.finditer(header):
        marks[m.group(1)] = m.group(3)
        if m.group(4):
            bodies[m.group(1)] = brace_block(header, m.end() - 1)
    for path in sorted(LAKE.glob("*.cc")):
        text = path.read_text()
        for m in re.finditer(r"^\S[^\n]*?Lake::Impl::(\w+)\(", text, re.M):
            bodies[m.group(1)] = brace_block(text, text.index("{", m.end()))
    return marks, bodies


def test_may_unlock_marks_exactly_the_methods_that_release_the_lock() -> None:
    marks, bodies = impl_methods()
    assert "Unlock" in marks and marks["Unlock"] == "RELEASE", marks
    unlocking: Set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, body in bodies.items():
            if name in unlocking or name in ("Unlock", "Relock"):
                continue
            called = set(re.findall(r"(?<![\w.>:])(\w+)\(", body))
            if "Unlock" in called or called & unlocking or ".wait(lk" in body:
                unlocking.add(name)
                changed = True
    marked = {name for name, kind in marks.items() if kind == "MAY_UNLOCK"}
    assert marked, "no method of lake_impl.h is JAXLAKE_MAY_UNLOCK(mu)"
    assert unlocking - marked == set(), \
        "release the lock but are not JAXLAKE_MAY_UNLOCK(mu)"
    assert marked - unlocking == set(), \
        "JAXLAKE_MAY_UNLOCK(mu) but never release the lock"
