"""benchmarks/validate_models.py's reading of XLA's logs."""

from __future__ import annotations

import importlib.util
import pathlib
from types import ModuleType

import pytest

MIB = 1 << 20


def _validate_models() -> ModuleType:
    path = (pathlib.Path(__file__).resolve().parents[1] / "benchmarks" /
            "validate_models.py")
    spec = importlib.util.spec_from_file_location("validate_models", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# XLA's rematerialisation warnings as hlo_rematerialization.cc writes them:
# in MiB for a small step, in GiB for a large one, the bytes beside each.
SMALL = ("W1205 01:31:26.607595    1955 hlo_rematerialization.cc:3231] "
         "Can't reduce memory use below 110.25MiB (115608745 bytes) by "
         "rematerialization; only reduced to 112.75MiB (118232476 bytes), "
         "down from 117.90MiB (123622812 bytes) originally")
LARGE = ("W1205 04:37:49.497653    4762 hlo_rematerialization.cc:3231] "
         "Can't reduce memory use below 21.66GiB (23255994175 bytes) by "
         "rematerialization; only reduced to 22.17GiB (23807406672 bytes), "
         "down from 22.20GiB (23840973520 bytes) originally")


@pytest.mark.parametrize("line, before, after", [
    (SMALL, 123622812, 118232476),
    (LARGE, 23840973520, 23807406672),
])
def test_remat_reads_the_bytes_of_either_unit(line: str, before: int,
                                              after: int) -> None:
    """The (from, to) of XLA's rematerialisation in MiB, from the bytes:
    a 1b step's warning is in GiB, which a MiB-only pattern missed (the
    adaptation table said "none logged")."""
    got = _validate_models().remat_mib("log start\n" + line + "\nmore\n")
    assert got == (before / MIB, after / MIB)


def test_remat_without_the_bytes_uses_the_unit() -> None:
    line = "only reduced to 22.17GiB, down from 22.20GiB originally"
    got = _validate_models().remat_mib(line)
    assert got == pytest.approx((22.20 * 1024, 22.17 * 1024))


def test_no_remat_logged() -> None:
    assert _validate_models().remat_mib("loss 0.0 -> 0.0\n") is None
