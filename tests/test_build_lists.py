"""The Bazel build and the CMake build compile the same C++ files.

CMake (the build pip uses) takes the library sources from cc/SOURCES.cmake and
its C++ tests from `jaxlake_test_sources` in CMakeLists.txt and from add_test()
calls in the .cmake files it includes. The Bazel BUILD
files list the same files again, since Bazel cannot read CMake. These tests
read both sides, without running either tool, and fail when they differ:

- the `set(JAXLAKE_<NAME>_SOURCES ...)` lists of a package cc/<name> (and
  of its libraries, JAXLAKE_<NAME>_<LIBRARY>_SOURCES) list together, file
  for file, the .cc files that the targets of the Bazel package cc/<name>
  compile (generated files aside);
- every .cc file under cc/ (but cc/python/, which only the Python module
  uses) is in one of those lists, and Bazel compiles no other file of cc/;
- both builds hand the trampoline generator the one list of the shim's
  hooked entry points, cc/shim/hooked.inc, and neither keeps a copy;
- each CMake C++ test whose source exists (jaxlake_test_sources, or an
  add_test() of an add_executable()) is a Bazel cc_test (or, for a
  benchmark, a cc_binary) of the same name and source in the package of its
  folder, and each Bazel cc_test is a CMake test; a folder with no BUILD
  file at all is reported as a skip;
- every header under cc/ belongs to a Bazel target of its folder;
- the BUILD files take one set of compile flags (JAXLAKE_COPTS, from
  //:copts.bzl), and every target that compiles the project's .cc files
  starts its copts with it.

A BUILD file is Starlark, which for these files is Python: it is executed with
stand-ins for load(), select(), glob() and the rules, which record what they
are given.
"""

from __future__ import annotations

import builtins
import fnmatch
import os
import pathlib
import re
from typing import Any, Dict, List, NamedTuple, Sequence, Tuple

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SOURCES_CMAKE = ROOT / "cc" / "SOURCES.cmake"
CMAKELISTS = ROOT / "CMakeLists.txt"
BUILD_NAMES = ("BUILD.bazel", "BUILD")
# Folders under cc/ that only the CMake build (the Python module) compiles.
CMAKE_ONLY_DIRS = ("cc/python",)
CC_RULES = ("cc_library", "cc_binary", "cc_test")


# --------------------------------------------------------------------------
# CMake side


def _cmake_words(text: str) -> List[str]:
    """Splits CMake arguments, dropping # comments and quotes."""
    text = re.sub(r"#[^\n]*", "", text)
    return [w.strip('"') for w in text.split()]


def cmake_source_lists() -> Dict[str, List[str]]:
    """cc/SOURCES.cmake as {"VMM": ["cc/vmm/driver.cc", ...], ...}."""
    text = re.sub(r"#[^\n]*", "", SOURCES_CMAKE.read_text())
    lists = {}
    for name, body in re.findall(r"set\s*\(\s*JAXLAKE_(\w+)_SOURCES\b([^)]*)\)", text):
        lists[name] = _cmake_words(body)
    return lists


def cmake_tests() -> List[Tuple[str, str]]:
    """CMakeLists.txt's jaxlake_test_sources as [(name, source), ...].

    Each entry is a name followed by its .cc source (and maybe arguments),
    so a name is any word right before a word that ends in .cc."""
    text = re.sub(r"#[^\n]*", "", CMAKELISTS.read_text())
    m = re.search(r"set\s*\(\s*jaxlake_test_sources\b([^)]*)\)", text)
    assert m, (
        "CMakeLists.txt has no set(jaxlake_test_sources name source ...); "
        "update tests/test_build_lists.py if the C++ tests moved"
    )
    words = _cmake_words(m.group(1))
    tests = [(a, b) for a, b in zip(words, words[1:]) if b.endswith(".cc") and not a.endswith(".cc")]
    assert tests, f"jaxlake_test_sources names no .cc file: {words}"
    return tests


def cmake_all_tests() -> List[Tuple[str, str]]:
    """Every CMake C++ test as (name, source): jaxlake_test_sources, and each
    add_test(NAME name COMMAND exe ...) of an add_executable(exe sources),
    once for each of its .cc sources."""
    tests = cmake_tests()
    texts = [re.sub(r"#[^\n]*", "", p.read_text()) for p in _cmake_files()]
    exes: Dict[str, List[str]] = {}
    for text in texts:
        for exe, args in re.findall(r"add_executable\s*\(\s*(\w+)\s+([^)]*)\)", text):
            sources = re.findall(r"[\w/.-]+\.cc\b", args)
            if sources:
                exes[exe] = sources
    for text in texts:
        for name, exe in re.findall(r"add_test\s*\(\s*NAME\s+(\w+)\s+COMMAND\s+(\w+)", text):
            for source in exes.get(exe, []):
                if (name, source) not in tests:
                    tests.append((name, source))
    return tests


def _cmake_files() -> List[pathlib.Path]:
    """CMakeLists.txt and the .cmake files it may include from cc/."""
    return [CMAKELISTS, *sorted((ROOT / "cc").rglob("*.cmake"))]


# --------------------------------------------------------------------------
# Bazel side


class Select:
    """A select() or a concatenation of lists and select()s."""

    def __init__(self, parts: List[Any]):
        self.parts = parts

    def __add__(self, other: Any) -> "Select":
        return Select(self.parts + _parts(other))

    def __radd__(self, other: Any) -> "Select":
        return Select(_parts(other) + self.parts)

    def canonical(self) -> Any:
        return tuple(
            ("select", tuple(sorted((k, tuple(v)) for k, v in p.items())))
            if isinstance(p, dict)
            else ("list", tuple(p))
            for p in self.parts
        )

    def every_value(self) -> List[Any]:
        """All values any configuration can give, in order."""
        out: List[Any] = []
        for p in self.parts:
            if isinstance(p, dict):
                for v in p.values():
                    out.extend(v)
            else:
                out.extend(p)
        return out


def _parts(value: Any) -> List[Any]:
    return value.parts if isinstance(value, Select) else [list(value)]


def canonical(value: Any) -> Any:
    return value.canonical() if isinstance(value, Select) else Select([list(value)]).canonical()


def every_value(value: Any) -> List[Any]:
    return value.every_value() if isinstance(value, Select) else list(value or [])


class Rule(NamedTuple):
    kind: str
    package: str  # folder relative to ROOT, "" for the top
    attrs: Dict[str, Any]

    @property
    def label(self) -> str:
        return f"//{self.package}:{self.attrs.get('name')}"

    def files(self, attr: str) -> List[str]:
        """The attribute's file labels as paths relative to ROOT."""
        return [label_to_path(self.package, v) for v in every_value(self.attrs.get(attr))]


def label_to_path(package: str, label: str) -> str:
    if label.startswith("//"):
        pkg, _, name = label[2:].partition(":")
        return f"{pkg}/{name}" if pkg else name
    name = label[1:] if label.startswith(":") else label
    return f"{package}/{name}" if package else name


class _Namespace(dict):
    """Names a BUILD file reads: builtins, else a recorder for a rule."""

    def __init__(self, package: str, rules: List[Rule]):
        super().__init__()
        self._package = package
        self._rules = rules
        self["load"] = self._load
        self["package"] = lambda **kwargs: None
        self["licenses"] = lambda *args, **kwargs: None
        self["select"] = lambda branches, **kwargs: Select([dict(branches)])
        self["glob"] = self._glob

    def __missing__(self, key: str) -> Any:
        if hasattr(builtins, key):
            return getattr(builtins, key)
        if key.startswith("_"):
            raise KeyError(key)

        def rule(*args: Any, **attrs: Any) -> None:  # exports_files() takes a list
            self._rules.append(Rule(key, self._package, attrs))

        return rule

    def _load(self, label: str, *names: str, **aliases: str) -> None:
        """Runs a .bzl file of the project and binds the names it exports;
        loads from other repositories (rules_cc, ...) bind nothing."""
        if not label.startswith("//"):
            return
        path = ROOT / label_to_path(self._package, label)
        module = _Namespace(self._package, self._rules)
        exec(compile(path.read_text(), str(path), "exec"), module)
        for name in names:
            self[name] = module[name]
        for alias, name in aliases.items():
            self[alias] = module[name]

    def _glob(self, include: List[str], exclude: Sequence[str] = (), **kwargs: Any) -> List[str]:
        base = ROOT / self._package
        found = []
        for path in sorted(base.rglob("*")):
            rel = path.relative_to(base).as_posix()
            if path.is_file() and any(fnmatch.fnmatch(rel, p) for p in include):
                if not any(fnmatch.fnmatch(rel, p) for p in exclude):
                    found.append(rel)
        return found


def _ignored_dirs() -> List[str]:
    path = ROOT / ".bazelignore"
    if not path.exists():
        return []
    lines = (line.strip() for line in path.read_text().splitlines())
    return [line.rstrip("/") for line in lines if line and not line.startswith("#")]


def build_files() -> List[pathlib.Path]:
    ignored = set(_ignored_dirs())
    found = []
    for dirpath, dirnames, filenames in os.walk(ROOT):
        rel = pathlib.Path(dirpath).relative_to(ROOT).as_posix()
        rel = "" if rel == "." else rel
        dirnames[:] = sorted(
            d
            for d in dirnames
            if not d.startswith(".")
            and not (rel == "" and d.startswith("bazel-"))
            and (f"{rel}/{d}" if rel else d) not in ignored
        )
        for name in BUILD_NAMES:
            if name in filenames:
                found.append(pathlib.Path(dirpath) / name)
                break
    return found


class BazelWorkspace(NamedTuple):
    rules: List[Rule]
    values: Dict[str, Dict[str, Any]]  # package -> the names its BUILD file set

    def find(self, label: str) -> Rule:
        for r in self.rules:
            if r.label == label:
                return r
        raise KeyError(label)

    def generated(self) -> set:
        """Paths of the files that genrules write."""
        return {f for r in self.rules if r.kind == "genrule" for f in r.files("outs")}

    def compiled(self, package: str) -> Dict[str, List[str]]:
        """The project .cc files the package's targets compile -> their labels."""
        out: Dict[str, List[str]] = {}
        generated = self.generated()
        for r in self.rules:
            if r.kind in CC_RULES and r.package == package:
                for f in r.files("srcs"):
                    if f.endswith(".cc") and f not in generated:
                        out.setdefault(f, []).append(r.label)
        return out


def read_bazel() -> BazelWorkspace:
    rules: List[Rule] = []
    values = {}
    for path in build_files():
        package = path.parent.relative_to(ROOT).as_posix()
        package = "" if package == "." else package
        namespace = _Namespace(package, rules)
        # The namespace serves as globals too, so that comprehensions see it.
        exec(compile(path.read_text(), str(path), "exec"), namespace)
        values[package] = {k: v for k, v in namespace.items() if k != "__builtins__"}
    return BazelWorkspace(rules, values)


BAZEL = read_bazel()
CMAKE_LISTS = cmake_source_lists()


def _project_cc_rules() -> List[Rule]:
    return [r for r in BAZEL.rules if r.kind in CC_RULES and not r.package.startswith("third_party/")]


def _cc_files_under_cc(suffix: str) -> List[str]:
    out = []
    for path in sorted((ROOT / "cc").rglob("*" + suffix)):
        rel = path.relative_to(ROOT).as_posix()
        if not any(rel.startswith(d + "/") for d in CMAKE_ONLY_DIRS):
            out.append(rel)
    return out


# --------------------------------------------------------------------------
# The checks


def test_both_sides_were_read() -> None:
    assert CMAKE_LISTS, f"no set(JAXLAKE_<NAME>_SOURCES ...) in {SOURCES_CMAKE}"
    assert _project_cc_rules(), "no cc_library/cc_test/cc_binary in the BUILD files"


def list_package(name: str) -> str:
    """The package of JAXLAKE_<name>_SOURCES: cc/<name>, or for a library of
    a package, JAXLAKE_<PACKAGE>_<LIBRARY>_SOURCES, the longest cc/<package>
    folder that the name starts with."""
    words = name.lower().split("_")
    for n in range(len(words), 0, -1):
        package = "cc/" + "_".join(words[:n])
        if (ROOT / package).is_dir():
            return package
    return f"cc/{name.lower()}"


PACKAGE_LISTS: Dict[str, List[str]] = {}
for _name in CMAKE_LISTS:
    PACKAGE_LISTS.setdefault(list_package(_name), []).append(_name)


@pytest.mark.parametrize("package", sorted(PACKAGE_LISTS))
def test_cmake_source_lists_are_what_the_bazel_package_compiles(package: str) -> None:
    names = PACKAGE_LISTS[package]
    lists = " and ".join(f"JAXLAKE_{n}_SOURCES" for n in names)
    cmake = [f for n in names for f in CMAKE_LISTS[n]]
    assert len(set(cmake)) == len(cmake), f"{lists} list a file twice"
    compiled = BAZEL.compiled(package)
    assert compiled, (
        f"cc/SOURCES.cmake sets {lists} but no Bazel target of "
        f"{package}/BUILD compiles them; add cc_library(name = "
        f"{package.split('/')[-1]!r}, srcs = <the same files>) there (docs/bazel.md)"
    )
    missing = sorted(set(cmake) - set(compiled))
    extra = sorted(f"{f} ({', '.join(compiled[f])})" for f in set(compiled) - set(cmake))
    assert not missing and not extra, (
        f"{lists} (cc/SOURCES.cmake) and the Bazel package //{package} "
        f"differ: only in CMake {missing}, only in Bazel {extra}; list each file in both"
    )


def test_a_library_list_is_named_after_its_package() -> None:
    assert list_package("FAKEGPU_INTERPOSE") == "cc/fakegpu"
    assert list_package("VMM") == "cc/vmm"


def test_every_cc_file_is_in_a_cmake_list() -> None:
    listed = {f for files in CMAKE_LISTS.values() for f in files}
    unlisted = [f for f in _cc_files_under_cc(".cc") if f not in listed]
    assert not unlisted, (
        f"{unlisted} are in no JAXLAKE_<NAME>_SOURCES list of cc/SOURCES.cmake; "
        "add them there and to the srcs of the matching Bazel cc_library"
    )


def test_bazel_compiles_no_other_file_of_cc() -> None:
    listed = {f for files in CMAKE_LISTS.values() for f in files}
    generated = BAZEL.generated()
    stray = sorted(
        (r.label, f)
        for r in _project_cc_rules()
        for f in r.files("srcs")
        if f.startswith("cc/") and f.endswith(".cc") and f not in listed and f not in generated
    )
    assert not stray, f"Bazel compiles files that no CMake list names: {stray}"


def test_cmake_tests_are_bazel_targets() -> None:
    problems = []
    no_build = []
    for name, source in cmake_all_tests():
        if not (ROOT / source).exists():
            continue  # CMake builds it only once the file exists; so does this check
        package = os.path.dirname(source)
        if not any((ROOT / package / b).exists() for b in BUILD_NAMES):
            no_build.append(f"{name} ({source})")
            continue
        label = f"//{package}:{name}"
        try:
            rule = BAZEL.find(label)
        except KeyError:
            problems.append(f"{label} is missing (CMake test {name}, {source})")
            continue
        if rule.kind not in ("cc_test", "cc_binary"):
            problems.append(f"{label} is a {rule.kind}, not a cc_test or cc_binary")
        if source not in rule.files("srcs"):
            problems.append(f"{label} does not compile {source}")
    assert not problems, "; ".join(problems)
    if no_build:
        pytest.skip(f"CMake tests in a folder with no Bazel BUILD file yet: {', '.join(no_build)}")


def test_bazel_tests_are_cmake_tests() -> None:
    cmake = set(cmake_all_tests())
    stray = []
    for rule in _project_cc_rules():
        if rule.kind != "cc_test":
            continue
        for source in (f for f in rule.files("srcs") if f.endswith(".cc")):
            if (rule.attrs["name"], source) not in cmake:
                stray.append(f"{rule.label} ({source})")
    assert not stray, (
        f"Bazel tests that CMake does not have: {stray}; add each to "
        "jaxlake_test_sources (CMakeLists.txt) as `name source`, or as add_test(NAME name ...)"
    )


def test_every_header_under_cc_belongs_to_a_bazel_target() -> None:
    declared = {f for r in _project_cc_rules() for attr in ("hdrs", "srcs") for f in r.files(attr)}
    undeclared = [h for h in _cc_files_under_cc(".h") if h not in declared]
    assert not undeclared, f"headers in no Bazel target's hdrs or srcs: {undeclared}"


def test_one_set_of_compile_flags() -> None:
    copts = {p: v["JAXLAKE_COPTS"] for p, v in BAZEL.values.items() if "JAXLAKE_COPTS" in v}
    assert copts, "no BUILD file defines JAXLAKE_COPTS"
    first_package, first = next(iter(copts.items()))
    for package, value in copts.items():
        assert canonical(value) == canonical(first), (
            f"JAXLAKE_COPTS of //{package} differs from that of //{first_package}; "
            "the copies must agree"
        )
    want = canonical(first)
    for rule in _project_cc_rules():
        if any(f.endswith(".cc") for f in rule.files("srcs")):
            got = canonical(rule.attrs.get("copts", []))
            assert got[: len(want)] == want, (
                f"{rule.label} compiles .cc files without copts = JAXLAKE_COPTS (+ more)"
            )


def _cmake_set(name: str) -> List[str]:
    """The words of set(<name> ...) in CMakeLists.txt or a .cmake file of cc/."""
    for path in _cmake_files():
        text = re.sub(r"#[^\n]*", "", path.read_text())
        m = re.search(r"set\s*\(\s*" + name + r"\b([^)]*)\)", text)
        if m:
            return _cmake_words(m.group(1))
    raise KeyError(name)


def test_shim_hooked_entry_points_come_from_one_file() -> None:
    hooked = "cc/shim/hooked.inc"
    genrule = BAZEL.find("//cc/shim:cuda_forward")
    assert hooked in genrule.files("srcs") and "-DHOOKED=$(location hooked.inc)" in genrule.attrs["cmd"], (
        f"the Bazel genrule //cc/shim:cuda_forward must pass {hooked} to the generator as -DHOOKED"
    )
    assert _cmake_set("jaxlake_shim_hooked") == ["${PROJECT_SOURCE_DIR}/" + hooked], (
        f"cc/shim/shim.cmake must set jaxlake_shim_hooked to {hooked}, the one list"
    )
    shim = BAZEL.values.get("cc/shim", {})
    copies = [k for k, v in shim.items() if isinstance(v, (list, tuple)) and "cuMemAllocFromPoolAsync" in v]
    assert not copies, f"cc/shim/BUILD keeps its own list of hooked names: {copies}; read {hooked}"
