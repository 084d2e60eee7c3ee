"""Clang's thread-safety analysis over the lake (cc/lake/thread_annotations.h).

Each of the lake's sources (JAXLAKE_LAKE_SOURCES in cc/SOURCES.cmake) is
compiled with `clang++ -fsyntax-only -Wthread-safety -Werror`: a field
guarded by the lake's mutex read or written without it, or a method that
needs the lock called without it, fails the test. A probe that touches a
guarded field without the lock must fail the same check, so that a check
which no longer sees the annotations (a macro that expands to nothing under
Clang, say) fails too. Skipped, saying so, when clang++ is not installed
(.ci/run installs it).
"""

from __future__ import annotations

import concurrent.futures
import pathlib
import re
import shutil
import subprocess
from typing import List, Tuple

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
CLANG = shutil.which("clang++")
FLAGS = ["-std=c++17", "-fsyntax-only", "-Wthread-safety", "-Werror",
         f"-I{ROOT}"]

pytestmark = pytest.mark.skipif(
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


def test_a_guarded_field_read_without_the_lock_fails_the_check(
        tmp_path: pathlib.Path) -> None:
    probe = tmp_path / "probe.cc"
    probe.write_text(PROBE)
    rc, err = clang([str(probe)])
    assert rc != 0, "reading Lake::Impl::live without its lock compiled"
    assert "reading variable 'live' requires holding mutex" in err, err
