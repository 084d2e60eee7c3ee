"""The C++ tests: CMake configures and builds them (Debug, so the lake's
expensive invariant checks run) and every test registered with ctest runs
as one pytest case.

The cases are read from ctest itself (configuring happens when this file is
collected), so CMakeLists.txt stays the one list of C++ tests. Skipped, with
the reason, only when cmake or a C++ compiler is missing.
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
import shutil
import subprocess
import sys
from typing import List, NamedTuple, Optional

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


class Setup(NamedTuple):
    build: pathlib.Path
    cmake: str
    ctest: str
    names: List[str]      # registered ctest tests
    skip: str             # why the C++ tests cannot run here ("" if they can)
    error: str            # why configuring failed ("" if it did not)


def _tool(name: str) -> Optional[str]:
    """A program from this interpreter's environment (the PyPI cmake and
    ninja of the test extra), else from PATH."""
    local = pathlib.Path(sys.executable).parent / name
    return str(local) if local.exists() else shutil.which(name)


def _run(args: List[str], cwd: pathlib.Path,
         timeout: int) -> "subprocess.CompletedProcess[str]":
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def _failure(what: str, args: List[str],
             result: "subprocess.CompletedProcess[str]") -> str:
    output = (result.stdout + result.stderr)[-8000:]
    return (f"{what} failed (exit {result.returncode}):\n"
            f"{' '.join(args)}\n{output}")


@functools.lru_cache(maxsize=None)
def _setup() -> Setup:
    """Configures the build folder once and lists the ctest tests."""
    cmake, ctest, ninja = _tool("cmake"), _tool("ctest"), _tool("ninja")
    build = REPO / "build" / ("cc-tests-ninja" if ninja else "cc-tests")
    if cmake is None or ctest is None:
        return Setup(build, "", "", [], "cmake is missing: "
                     "pip install '.[test]' brings it", "")
    compiler = os.environ.get("CXX") or next(
        (c for c in ("c++", "g++", "clang++") if shutil.which(c)), None)
    if compiler is None or shutil.which(compiler) is None:
        return Setup(build, cmake, ctest, [], "no C++ compiler found (set "
                     "CXX or install g++ or clang++)", "")
    generator = ["-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={ninja}"] if ninja \
        else []
    args = [cmake, "-S", str(REPO), "-B", str(build), *generator,
            "-DCMAKE_BUILD_TYPE=Debug", "-DJAXLAKE_BUILD_TESTS=ON",
            "-DJAXLAKE_BUILD_PYTHON=OFF", "-DJAXLAKE_WERROR=ON"]
    result = _run(args, REPO, 600)
    if result.returncode != 0:
        return Setup(build, cmake, ctest, [], "",
                     _failure("CMake configure", args, result))
    listing = _run([ctest, "--show-only=json-v1"], build, 120)
    names = [t["name"] for t in json.loads(listing.stdout)["tests"]]
    return Setup(build, cmake, ctest, names, "", "")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "ctest_name" in metafunc.fixturenames:
        setup = _setup()
        # With nothing to list, one case reports why (skip or failure).
        metafunc.parametrize("ctest_name", setup.names or ["(no tests)"])


@pytest.fixture(scope="session")
def built() -> Setup:
    setup = _setup()
    if setup.skip:
        pytest.skip(setup.skip)
    if setup.error:
        pytest.fail(setup.error, pytrace=False)
    args = [setup.cmake, "--build", str(setup.build), "--parallel",
            str(os.cpu_count() or 2)]
    result = _run(args, REPO, 1800)
    if result.returncode != 0:
        pytest.fail(_failure("CMake build", args, result), pytrace=False)
    return setup


def test_cc(built: Setup, ctest_name: str) -> None:
    assert built.names, "ctest lists no test: check JAXLAKE_BUILD_TESTS"
    args = [built.ctest, "-R", f"^{ctest_name}$", "--output-on-failure",
            "--timeout", "900"]
    result = _run(args, built.build, 1000)
    if result.returncode != 0:
        pytest.fail(_failure(ctest_name, args, result), pytrace=False)
