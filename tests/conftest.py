"""Shared fixtures. The tests import the installed jaxlake (see README)."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import pathlib
import shutil
import subprocess
import sys
from typing import Callable, Iterator, List, NamedTuple, Optional

import pytest

import jaxlake

# The tests' shared helpers (fakegpu_util.py) sit beside this file; pytest's
# importlib mode puts no test folder on sys.path.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

MIB = 1 << 20

#: Backends with simulated streams that run on any machine.
BACKENDS = ["host", "sim"]


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No JAXLAKE_* variable of the caller's environment leaks into a test."""
    for name in list(os.environ):
        if name.startswith("JAXLAKE_"):
            monkeypatch.delenv(name)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make_lake(backend: str) -> Iterator[Callable[..., jaxlake.Lake]]:
    """Lakes on the parametrised backend (2 MiB chunks, 64 MiB unless told);
    each one must still pass check() when the test ends."""
    lakes = []

    def make(**options: object) -> jaxlake.Lake:
        options.setdefault("capacity", 64 * MIB)
        options.setdefault("device_memory", 256 * MIB)
        lake = jaxlake.Lake(backend, **options)
        lakes.append(lake)
        return lake

    yield make
    for lake in lakes:
        lake.check()


# -- the C++ build (CMake), shared by test_cc.py and the shim's Python tests --
# The C++ tests: CMake configures and builds them (Debug, so the lake's
# expensive invariant checks run) and every test registered with ctest runs
# as one pytest case of test_cc.py. Skipped, with the reason, only when
# cmake or a C++ compiler is missing.

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


@contextlib.contextmanager
def _build_lock(build: pathlib.Path) -> Iterator[None]:
    """Holds a lock on the build folder: under pytest-xdist every worker
    collects (configures) and may build the same folder, one at a time."""
    build.parent.mkdir(parents=True, exist_ok=True)
    with open(build.parent / (build.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


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
    with _build_lock(build):
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
    with _build_lock(setup.build):
        result = _run(args, REPO, 1800)
    if result.returncode != 0:
        pytest.fail(_failure("CMake build", args, result), pytrace=False)
    return setup


@pytest.fixture(scope="session")
def fake_driver(built: Setup) -> str:
    """Path of the fake CUDA driver (tests/shim/fake_cuda.cc) that the C++
    test build makes; the shim tests point JAXLAKE_REAL_LIBCUDA at it."""
    path = built.build / "jaxlake_fakecuda" / "libfakecuda.so"
    assert path.is_file(), f"the C++ build made no {path}"
    return str(path)


@pytest.fixture
def run_ctest(built: Setup) -> Callable[[str], None]:
    """Runs one ctest test of the build; fails with its output."""
    def run(name: str) -> None:
        assert built.names, "ctest lists no test: check JAXLAKE_BUILD_TESTS"
        args = [built.ctest, "-R", f"^{name}$", "--output-on-failure",
                "--timeout", "900"]
        result = _run(args, built.build, 1000)
        if result.returncode != 0:
            pytest.fail(_failure(name, args, result), pytrace=False)
    return run
