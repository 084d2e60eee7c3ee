"""The C++ tests: every test registered with ctest is one pytest case.

The cases are read from ctest itself (conftest.py configures the build when
this file is collected), so CMakeLists.txt stays the one list of C++ tests.
"""

from __future__ import annotations

from typing import Callable


def test_cc(run_ctest: Callable[[str], None], ctest_name: str) -> None:
    run_ctest(ctest_name)
