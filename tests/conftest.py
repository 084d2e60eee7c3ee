"""Shared fixtures. The tests import the installed jaxlake (see README)."""

from __future__ import annotations

import os
from typing import Callable, Iterator

import pytest

import jaxlake

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
