"""Random allocate/free sequences on the host backend (real bytes).

After every step: check() passes and every live allocation still holds the
bytes written into it (a per-allocation byte plus a tag every 4 KiB naming
the allocation and the offset, so chunks mapped out of order are caught).
"""

from __future__ import annotations

import ctypes
import struct
from typing import Dict, Tuple

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine, initialize, invariant, precondition, rule)

import jaxlake

KIB = 1 << 10
CHUNK = 64 * KIB
CAPACITY = 64 * CHUNK   # 4 MiB: small enough to run out of memory often
TAG_EVERY = 4 * KIB

sizes = st.one_of(
    st.integers(1, 32 * KIB),              # small-request pool
    st.integers(32 * KIB + 1, 4 * CHUNK),  # a few chunks
    st.integers(4 * CHUNK, 24 * CHUNK),    # large, stitching territory
)


def pattern(serial: int, size: int) -> bytes:
    data = bytearray([serial % 251 + 1]) * size
    for offset in range(0, size - 7, TAG_EVERY):
        data[offset:offset + 8] = struct.pack("<II", serial, offset)
    return bytes(data)


class LakeMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.lake: jaxlake.Lake
        self.live: Dict[int, Tuple[bytes, int]] = {}  # address -> data
        self.serial = 0

    @initialize(stitch_cache=st.sampled_from([0, 1, 64]),
                max_pieces=st.sampled_from([0, 2]),
                stitch_grow=st.booleans(),
                alignment=st.sampled_from([256, 4 * KIB]))
    def make_lake(self, stitch_cache: int, max_pieces: int,
                  stitch_grow: bool, alignment: int) -> None:
        self.lake = jaxlake.Lake(
            "host", capacity=CAPACITY, granularity=CHUNK,
            device_memory=4 * CAPACITY, small_limit=32 * KIB,
            stitch_cache=stitch_cache, max_pieces=max_pieces,
            stitch_grow=stitch_grow, alignment=alignment)

    @rule(size=sizes, stream=st.integers(0, 2))
    def allocate(self, size: int, stream: int) -> None:
        try:
            address = self.lake.allocate(size, stream)
        except jaxlake.OutOfMemoryError:
            in_use = sum(len(d) for d, _ in self.live.values())
            assert in_use + size > CAPACITY // 4, "refused with room left"
            return
        assert address % self.lake.options["alignment"] == 0  # type: ignore
        for other, (data, _) in self.live.items():
            assert address + size <= other or other + len(data) <= address
        self.serial += 1
        data = pattern(self.serial, size)
        ctypes.memmove(address, data, size)
        self.live[address] = (data, stream)

    @precondition(lambda self: self.live)
    @rule(pick=st.integers(0, 10**6), stream=st.integers(0, 2),
          same_stream=st.booleans())
    def free(self, pick: int, stream: int, same_stream: bool) -> None:
        # By allocation order, not by address: host addresses differ from
        # run to run, and a failing example must replay the same frees.
        address = list(self.live)[pick % len(self.live)]
        _, allocated_on = self.live.pop(address)
        self.lake.free(address, allocated_on if same_stream else stream)

    @rule()
    def empty_cache(self) -> None:
        self.lake.empty_cache()

    @invariant()
    def consistent(self) -> None:
        self.lake.check()
        stats = self.lake.stats()
        assert stats.live_allocations == len(self.live)
        assert stats.bytes_in_use == sum(len(d) for d, _ in self.live.values())
        assert stats.bytes_reserved <= CAPACITY
        for address, (data, _) in self.live.items():
            assert ctypes.string_at(address, len(data)) == data

    def teardown(self) -> None:
        if hasattr(self, "lake"):
            for address in list(self.live):
                self.lake.free(address)
            self.lake.check()
            assert self.lake.stats().bytes_in_use == 0


LakeMachine.TestCase.settings = settings(
    max_examples=300, stateful_step_count=80, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
test_random_sequences = LakeMachine.TestCase
