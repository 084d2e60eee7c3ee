#!/usr/bin/env python3
"""Builds the stress harness (Release, with CMake) and runs it.

    python3 tests/stress/run.py [stress arguments...]

The arguments go to the harness (tests/stress/stress.cc), for example
`--ops 1000000`, `--threads 8 --seconds 60`, `--backend host --faults on`;
docs/stress.md lists them and the figures of the long runs. CMake and Ninja
are taken from this interpreter's environment (the test extra of
pyproject.toml installs both), else from PATH. The build lives in
build/stress-release, as for .ci/stress.sh. The exit status is the
harness's: 0 only when every count of failures is 0.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
from typing import List, Optional

REPO = pathlib.Path(__file__).resolve().parents[2]
BUILD = REPO / "build" / "stress-release"


def _tool(name: str) -> Optional[str]:
    local = pathlib.Path(sys.executable).parent / name
    return str(local) if local.exists() else shutil.which(name)


def build() -> pathlib.Path:
    """Configures and builds the harness; returns the binary's path."""
    cmake = _tool("cmake")
    if cmake is None:
        sys.exit("run.py: cmake is missing (pip install '.[test]' brings it)")
    ninja = _tool("ninja")
    generator = ["-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={ninja}"] if ninja \
        else []
    if not (BUILD / "CMakeCache.txt").exists():
        subprocess.run([cmake, "-S", str(REPO), "-B", str(BUILD), *generator,
                        "-DCMAKE_BUILD_TYPE=Release",
                        "-DJAXLAKE_BUILD_TESTS=ON",
                        "-DJAXLAKE_BUILD_PYTHON=OFF"], check=True,
                       stdout=subprocess.DEVNULL)
    subprocess.run([cmake, "--build", str(BUILD), "--target", "stress",
                    "--parallel", str(os.cpu_count() or 2)], check=True,
                   stdout=subprocess.DEVNULL)
    return BUILD / "stress"


def main(argv: List[str]) -> int:
    binary = build()
    return subprocess.run([str(binary), *argv]).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
