"""Random allocate/free sequences on the host backend (real bytes).

After every step: check() passes and every live allocation still holds the
bytes written into it (a per-allocation byte plus a tag every 4 KiB naming
the allocation and the offset, so chunks mapped out of order are caught).

Streams are held and released at random, and frees are made on other
streams than the allocation's. Memory freed on a held stream is still in
use by that stream's work: until the stream's work completes, its bytes
must stay as they were, whatever other streams allocate and write (the lake
may hand it only to the same stream). Holds end when the lake waits for
them (hold_stream(until_waited=True)), so a single thread never blocks.
A second test runs threads that allocate, write, check and free across
streams while a controller thread holds and releases streams.
"""

from __future__ import annotations

import ctypes
import random
import struct
import threading
from typing import Dict, List, Tuple

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
        # Freed on a held stream: address -> (data, stream). Their bytes
        # must not change until the stream's work completes.
        self.in_flight: Dict[int, Tuple[bytes, int]] = {}
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

    def forget_completed(self) -> None:
        """Drops in-flight frees of streams whose work completed (released,
        or waited for by the lake)."""
        for address, (_, stream) in list(self.in_flight.items()):
            if not self.lake.stream_held(stream):
                del self.in_flight[address]

    @rule(size=sizes, stream=st.integers(0, 2))
    def allocate(self, size: int, stream: int) -> None:
        try:
            address = self.lake.allocate(size, stream)
        except jaxlake.OutOfMemoryError:
            in_use = sum(len(d) for d, _ in self.live.values())
            in_flight = sum(len(d) for d, _ in self.in_flight.values())
            assert in_use + in_flight + size > CAPACITY // 4, \
                "refused with room left"
            return
        finally:
            self.forget_completed()
        assert address % self.lake.options["alignment"] == 0  # type: ignore
        for other, (data, _) in self.live.items():
            assert address + size <= other or other + len(data) <= address
        self.serial += 1
        data = pattern(self.serial, size)
        ctypes.memmove(address, data, size)
        self.live[address] = (data, stream)
        # The stream may reuse its own in-flight memory; no other may.
        for other, (old, freed_on) in list(self.in_flight.items()):
            if freed_on == stream:
                del self.in_flight[other]
            else:
                assert ctypes.string_at(other, len(old)) == old, (
                    f"memory freed on held stream {freed_on} was handed to "
                    f"stream {stream}")

    @rule(stream=st.integers(0, 2))
    def hold(self, stream: int) -> None:
        self.lake.hold_stream(stream, until_waited=True)

    @rule(stream=st.integers(0, 2))
    def release(self, stream: int) -> None:
        self.lake.release_stream(stream)
        self.forget_completed()

    @precondition(lambda self: self.live)
    @rule(pick=st.integers(0, 10**6), stream=st.integers(0, 2),
          same_stream=st.booleans())
    def free(self, pick: int, stream: int, same_stream: bool) -> None:
        # By allocation order, not by address: host addresses differ from
        # run to run, and a failing example must replay the same frees.
        address = list(self.live)[pick % len(self.live)]
        data, allocated_on = self.live.pop(address)
        freed_on = allocated_on if same_stream else stream
        self.lake.free(address, freed_on)
        if self.lake.stream_held(freed_on):
            self.in_flight[address] = (data, freed_on)

    @rule()
    def empty_cache(self) -> None:
        self.lake.empty_cache()
        self.forget_completed()

    @invariant()
    def consistent(self) -> None:
        self.lake.check()
        stats = self.lake.stats()
        assert stats.live_allocations == len(self.live)
        assert stats.bytes_in_use == sum(len(d) for d, _ in self.live.values())
        assert stats.bytes_reserved <= CAPACITY
        for address, (data, _) in self.live.items():
            assert ctypes.string_at(address, len(data)) == data
        for address, (data, stream) in self.in_flight.items():
            assert ctypes.string_at(address, len(data)) == data, (
                f"memory freed on held stream {stream} changed")

    def teardown(self) -> None:
        if hasattr(self, "lake"):
            for address in list(self.live):
                self.lake.free(address)
            for stream in range(3):
                self.lake.release_stream(stream)
            self.lake.empty_cache()
            self.lake.check()
            stats = self.lake.stats()
            assert stats.bytes_in_use == 0
            assert stats.bytes_reserved == 0, "free memory left reserved"
            assert self.lake.physical_bytes() == 0


LakeMachine.TestCase.settings = settings(
    max_examples=300, stateful_step_count=80, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
test_random_sequences = LakeMachine.TestCase


def test_threads_with_held_streams() -> None:
    """Threads allocate, write, check and free across threads and streams
    while a controller thread holds and releases the streams."""
    lake = jaxlake.Lake(
        "host", capacity=CAPACITY, granularity=CHUNK,
        device_memory=4 * CAPACITY, small_limit=32 * KIB, stitch_cache=4)
    shared: List[Tuple[int, bytes]] = []  # allocations any thread may free
    lock = threading.Lock()
    stop = threading.Event()
    errors: List[str] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for step in range(400):
                stream = rng.randrange(4)
                if rng.random() < 0.55 or not shared:
                    size = rng.choice([rng.randrange(1, 32 * KIB),
                                       rng.randrange(32 * KIB, 12 * CHUNK)])
                    try:
                        address = lake.allocate(size, stream)
                    except jaxlake.OutOfMemoryError:
                        continue
                    data = pattern(seed * 100000 + step, size)
                    ctypes.memmove(address, data, size)
                    with lock:
                        shared.append((address, data))
                else:
                    with lock:
                        if not shared:
                            continue
                        address, data = shared.pop(
                            rng.randrange(len(shared)))
                    if ctypes.string_at(address, len(data)) != data:
                        errors.append(f"allocation {address:#x} changed")
                    lake.free(address, stream)
                if step % 50 == 0:
                    lake.check()
        except Exception as e:  # reported by the main thread
            errors.append(repr(e))

    def controller() -> None:
        rng = random.Random(7)
        while not stop.is_set():
            stream = rng.randrange(4)
            if rng.random() < 0.5:
                lake.hold_stream(stream)
            else:
                lake.release_stream(stream)
            stop.wait(0.001)
        for stream in range(4):
            lake.release_stream(stream)

    control = threading.Thread(target=controller)
    control.start()
    workers = [threading.Thread(target=worker, args=(seed,))
               for seed in range(4)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    stop.set()
    control.join()
    assert not errors, errors[:5]
    for address, data in shared:
        assert ctypes.string_at(address, len(data)) == data
        lake.free(address)
    lake.empty_cache()
    lake.check()
    assert lake.stats().bytes_reserved == 0
    assert lake.physical_bytes() == 0
