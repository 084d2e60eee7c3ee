"""Lists kept in one file, and the code that must agree with them.

- cc/shim/hooked.inc is the one list of the shim's hooked entry points (both
  builds generate the trampolines of the other names from it, lakes.h its
  Hook enum): cc/shim/hooks.h declares and hooks.cc defines exactly those
  names, and
  each is a name the shim exports (cc/shim/cuda_symbols.txt).
- cc/lake/options.inc is the one list of the lake's options (LakeOptions,
  the shim's variables and the binding's fields come from it): the Python
  option table (jaxlake/_src/options.py, OPTIONS), which parses and
  documents them, names the same options in the same order, with the same
  defaults and kinds of value.
- The environment variables the shim and the fake GPU read (their
  quoted JAXLAKE_* names in cc/shim and cc/fakegpu) are all known to
  jaxlake/_src/options.py (an option's variable or OTHER_VARIABLES), so a
  user setting one gets no "not a jaxlake option" warning.

The sources are read as text; nothing is built.
"""

from __future__ import annotations

import pathlib
import re
from typing import Any, List, Tuple

from jaxlake._src.options import OPTIONS, OTHER_VARIABLES

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
    header = _without_comments((SHIM / "hooks.h").read_text())
    declared = re.findall(r"\bJAXLAKE_SHIM_EXPORT\s+CUresult\s+(\w+)\s*\(",
                          header)
    # The exported definitions are at file scope, after the anonymous
    # namespace of helpers (whose names are not driver names).
    defined = re.findall(r"^CUresult\s+(cu\w+)\s*\([^;{]*\)\s*\{", text, re.MULTILINE)
    listed = set(hooked_names())
    assert set(declared) == listed, (
        f"cc/shim/hooks.h exports {sorted(set(declared) - listed)} that "
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


def lake_option_rows() -> List[Tuple[str, str, str]]:
    """cc/lake/options.inc's JAXLAKE_LAKE_OPTION rows as (type, field, default)."""
    text = _without_comments((ROOT / "cc" / "lake" / "options.inc").read_text())
    rows = re.findall(r"^\s*JAXLAKE_LAKE_OPTION\(\s*([\w:]+)\s*,\s*(\w+)\s*,\s*([^,]+?)\s*,", text, re.MULTILINE)
    assert rows, "cc/lake/options.inc has no JAXLAKE_LAKE_OPTION(type, field, default, help) row"
    return rows


def _cpp_default(cpp_type: str, text: str) -> Any:
    if cpp_type == "bool":
        assert text in ("true", "false"), f"bool default {text!r} in cc/lake/options.inc"
        return text == "true"
    assert cpp_type == "std::size_t", f"cc/lake/options.inc: type {cpp_type} (the shim reads std::size_t and bool)"
    return int(text)


# Python kinds of value that a C++ type of options.inc holds.
_KINDS = {"bool": {"bool"}, "std::size_t": {"size", "positive_size", "count", "capacity"}}


def test_python_option_table_matches_options_inc() -> None:
    rows = lake_option_rows()
    python = [o for o in OPTIONS if o.lake]
    assert [field for _, field, _ in rows] == [o.name for o in python], (
        "the lake options of jaxlake/_src/options.py (OPTIONS rows with lake=True) and the rows of "
        "cc/lake/options.inc differ; add or remove the option in both, in the same order"
    )
    for (cpp_type, field, default), option in zip(rows, python):
        cpp = _cpp_default(cpp_type, default)
        # Python's capacity None (the whole device) is the C++ 0.
        want = 0 if option.name == "capacity" and option.default is None else option.default
        assert cpp == want and type(cpp) is type(want), (
            f"option {field}: cc/lake/options.inc's default {default} differs from "
            f"jaxlake/_src/options.py's {option.default!r}"
        )
        assert option.kind in _KINDS[cpp_type], (
            f"option {field}: a {cpp_type} in cc/lake/options.inc but of kind {option.kind!r} in Python"
        )


def test_variables_the_c_code_reads_are_known_to_the_option_checker() -> None:
    read = set()
    for folder in ("shim", "fakegpu"):
        for path in (ROOT / "cc" / folder).glob("*.[ch]*"):
            text = _without_comments(path.read_text())
            read.update(re.findall(r'"(JAXLAKE_[A-Z0-9_]+)"', text))
    assert "JAXLAKE_FAKEGPU_MEMORY" in read, "the scan found no variable"
    known = set(OTHER_VARIABLES) | {o.env for o in OPTIONS}
    missing = sorted(v for v in read - known
                     # prefixes the shim builds names from, not variables
                     if not v.endswith("_"))
    assert not missing, (
        f"read by cc/shim or cc/fakegpu but unknown to options.py "
        f"(OTHER_VARIABLES), so jaxlake warns about them: {missing}")
