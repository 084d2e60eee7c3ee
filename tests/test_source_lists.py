"""Lists kept in one file, and the code that must agree with them.

- cc/shim/hooked.inc is the one list of the shim's hooked entry points (both
  builds generate the trampolines of the other names from it, lakes.h its
  Hook enum): cc/shim/hooks.cc declares and defines exactly those names, and
  each is a name the shim exports (cc/shim/cuda_symbols.txt).

The sources are read as text; nothing is built.
"""

from __future__ import annotations

import pathlib
import re
from typing import List

ROOT = pathlib.Path(__file__).resolve().parents[1]
SHIM = ROOT / "cc" / "shim"


def hooked_names() -> List[str]:
    """The names of cc/shim/hooked.inc's JAXLAKE_SHIM_HOOK(name) rows."""
    text = (SHIM / "hooked.inc").read_text()
    names = re.findall(r"^\s*JAXLAKE_SHIM_HOOK\(\s*(\w+)\s*\)\s*$", text, re.MULTILINE)
    assert names, "cc/shim/hooked.inc has no JAXLAKE_SHIM_HOOK(name) row"
    return names


def _without_comments(text: str) -> str:
    return re.sub(r"//[^\n]*|/\*.*?\*/", "", text, flags=re.DOTALL)


def test_hooked_names_are_listed_once() -> None:
    names = hooked_names()
    twice = sorted({n for n in names if names.count(n) > 1})
    assert not twice, f"cc/shim/hooked.inc lists {twice} more than once"


def test_hooks_cc_defines_exactly_the_hooked_names() -> None:
    text = _without_comments((SHIM / "hooks.cc").read_text())
    declared = re.findall(r"\bJAXLAKE_SHIM_EXPORT\s+CUresult\s+(\w+)\s*\(", text)
    # The exported definitions are at file scope, after the anonymous
    # namespace of helpers (whose names are not driver names).
    defined = re.findall(r"^CUresult\s+(cu\w+)\s*\([^;{]*\)\s*\{", text, re.MULTILINE)
    listed = set(hooked_names())
    assert set(declared) == listed, (
        f"cc/shim/hooks.cc exports {sorted(set(declared) - listed)} that "
        f"cc/shim/hooked.inc does not list, and does not export "
        f"{sorted(listed - set(declared))} that it lists"
    )
    assert set(defined) == listed, (
        f"cc/shim/hooks.cc defines {sorted(set(defined) - listed)} that "
        f"cc/shim/hooked.inc does not list, and does not define "
        f"{sorted(listed - set(defined))} that it lists"
    )


def test_hooked_names_are_exported_names() -> None:
    lines = (SHIM / "cuda_symbols.txt").read_text().splitlines()
    exported = {line.strip() for line in lines if line.strip() and not line.startswith("#")}
    missing = [n for n in hooked_names() if n not in exported]
    assert not missing, f"hooked names that cc/shim/cuda_symbols.txt does not list: {missing}"
