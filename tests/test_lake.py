"""jaxlake.Lake over the host and sim backends."""

from __future__ import annotations

import ctypes
import dataclasses
import threading
from typing import Callable, Dict, List

import pytest

import jaxlake

MIB = 1 << 20
MakeLake = Callable[..., jaxlake.Lake]  # the make_lake fixture (conftest.py)


def fill(address: int, size: int, byte: int) -> None:
    ctypes.memset(address, byte, size)


def holds(address: int, size: int, byte: int) -> bool:
    return ctypes.string_at(address, size) == bytes([byte]) * size


def fragment(lake: jaxlake.Lake, blocks: int = 8,
             size: int = 8 * MIB) -> List[int]:
    """Fills the lake with `blocks` blocks and frees every other one;
    returns all the addresses (odd indices are the freed ones)."""
    addresses = [lake.allocate(size) for _ in range(blocks)]
    for address in addresses[1::2]:
        lake.free(address)
    return addresses


def test_allocate_and_free(make_lake: MakeLake) -> None:
    lake = make_lake()
    a = lake.allocate(3 * MIB)
    b = lake.allocate(100)
    assert a != b and a % 256 == 0 and b % 256 == 0
    assert lake.allocation_size(a) == 3 * MIB
    assert lake.allocation_size(b) == 100
    stats = lake.stats()
    assert stats.live_allocations == 2 and stats.allocs == 2
    assert stats.bytes_in_use == 3 * MIB + 100
    assert stats.bytes_reserved >= 3 * MIB
    lake.check()
    lake.free(a)
    lake.free(b, stream=0)
    stats = lake.stats()
    assert stats.live_allocations == 0 and stats.frees == 2
    assert stats.bytes_in_use == 0 and stats.bytes_in_use_peak == 3 * MIB + 100
    assert lake.allocation_size(a) == 0


def test_properties_and_repr(make_lake: MakeLake, backend: str) -> None:
    lake = make_lake(granularity="1MiB")
    assert lake.backend == backend
    assert lake.granularity == MIB
    assert lake.capacity == 64 * MIB
    assert lake.device_memory == 256 * MIB
    assert lake.options["granularity"] == MIB
    assert backend in repr(lake)
    with pytest.raises(TypeError):
        lake.options["stitch"] = False  # type: ignore[index]


def test_backend_defaults() -> None:
    assert jaxlake.Lake("host").device_memory == 4 << 30
    assert jaxlake.Lake("sim").device_memory == 80 << 30
    assert jaxlake.Lake("sim").granularity == 2 * MIB
    assert jaxlake.Lake("sim", capacity=0.5).capacity == 40 << 30


def test_stitching_serves_a_request_larger_than_any_free_block(
        make_lake: MakeLake) -> None:
    lake = make_lake()
    fragment(lake)
    before = lake.stats()
    address, state = lake.allocate_with_state(24 * MIB)
    after = lake.stats()
    assert state == "stitch"
    assert after.bytes_reserved == before.bytes_reserved == 64 * MIB
    assert after.alloc_stitch == 1
    assert after.driver_calls["create"] == before.driver_calls["create"]
    assert after.stitched_bytes >= 24 * MIB
    lake.free(address)
    # A freed stitched range is cached and reused for the same request.
    again, state = lake.allocate_with_state(24 * MIB)
    assert state == "stitch_reuse" and again == address


def test_stats_derived_figures(make_lake: MakeLake) -> None:
    lake = make_lake()
    assert lake.stats().utilisation == 1.0
    a = lake.allocate(3 * MIB)  # rounded to two 2 MiB chunks
    stats = lake.stats()
    assert stats.utilisation == pytest.approx(0.75)
    assert stats.fragmentation == pytest.approx(0.25)
    assert stats.waste == MIB
    assert stats.as_dict()["driver_calls"]["create"] >= 1
    assert sum(stats.driver_calls.values()) > 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.allocs = 3  # type: ignore[misc]
    lake.free(a)


def test_stitched_bytes_read_back_through_primary_blocks() -> None:
    lake = jaxlake.Lake("host", capacity=64 * MIB, granularity=2 * MIB)
    addresses = fragment(lake)
    for i, address in enumerate(addresses):
        if i % 2 == 0:
            fill(address, 8 * MIB, 0x10 + i)
    stitched, state = lake.allocate_with_state(24 * MIB)
    assert state == "stitch"
    chunks = 12
    for k in range(chunks):
        fill(stitched + k * 2 * MIB, 2 * MIB, 0xA0 + k)
    # Every stitched chunk shows, at most once, in a freed primary block.
    seen: Dict[int, int] = {}
    for address in addresses[1::2]:
        for j in range(4):
            where = address + j * 2 * MIB
            byte = ctypes.string_at(where, 1)[0]
            if 0xA0 <= byte < 0xA0 + chunks and holds(where, 2 * MIB, byte):
                assert byte not in seen
                seen[byte] = where
    assert sorted(seen) == [0xA0 + k for k in range(chunks)]
    # Writing through a primary address shows through the stitched one.
    ctypes.memset(seen[0xA5] + 100, 0x5A, 10)
    assert ctypes.string_at(stitched + 5 * 2 * MIB + 100, 10) == b"\x5a" * 10
    fill(seen[0xA5], 2 * MIB, 0xA5)
    # Later operations leave the stitched and the live bytes alone.
    small = [lake.allocate(4096) for _ in range(20)]
    for address in small:
        fill(address, 4096, 0xEE)
    for address in small[::2]:
        lake.free(address)
    lake.empty_cache()
    lake.check()
    for k in range(chunks):
        assert holds(stitched + k * 2 * MIB, 2 * MIB, 0xA0 + k)
    for i, address in enumerate(addresses):
        if i % 2 == 0:
            assert holds(address, 8 * MIB, 0x10 + i)
    for address in small[1::2]:
        assert holds(address, 4096, 0xEE)


def test_freed_block_waits_for_its_stream(make_lake: MakeLake) -> None:
    lake = make_lake()
    lake.hold_stream(1)
    a = lake.allocate(8 * MIB, stream=1)
    lake.free(a, stream=1)
    # Work on stream 1 may still use the block: stream 2 must not get it ...
    b = lake.allocate(8 * MIB, stream=2)
    assert not (a <= b < a + 8 * MIB or b <= a < b + 8 * MIB)
    # ... but stream 1 itself may, at once.
    c = lake.allocate(8 * MIB, stream=1)
    assert c == a
    lake.free(c, stream=1)
    lake.release_stream(1)
    # Once stream 1's work is complete the block is everyone's.
    d = lake.allocate(8 * MIB, stream=2)
    assert d == a
    lake.free(b, stream=2)
    lake.free(d, stream=2)


def test_full_lake_waits_for_a_held_stream(make_lake: MakeLake) -> None:
    lake = make_lake(capacity=16 * MIB)
    lake.hold_stream(1)
    a = lake.allocate(16 * MIB, stream=1)
    lake.free(a, stream=1)
    result: Dict[str, int] = {}
    worker = threading.Thread(
        target=lambda: result.update(address=lake.allocate(16 * MIB, 2)),
        daemon=True)
    worker.start()
    worker.join(0.3)
    assert worker.is_alive(), "stream 2 took memory stream 1 may still use"
    lake.release_stream(1)  # the allocation released the GIL meanwhile
    worker.join(30)
    assert not worker.is_alive()
    assert result["address"] == a
    assert lake.stats().event_waits >= 1
    lake.free(a, stream=2)


def test_out_of_memory_carries_the_figures(make_lake: MakeLake) -> None:
    lake = make_lake(capacity=16 * MIB)
    keep = lake.allocate(8 * MIB)
    with pytest.raises(jaxlake.OutOfMemoryError) as info:
        lake.allocate(12 * MIB, stream=3)
    error = info.value
    assert isinstance(error, MemoryError)
    assert error.nbytes == 12 * MIB and error.stream == 3
    message = str(error)
    assert str(12 * MIB) in message and "stream 3" in message
    assert "capacity" in message and "in use" in message
    lake.check()
    assert lake.stats().ooms == 1
    # Still usable: what fits is served.
    other = lake.allocate(8 * MIB)
    lake.free(other)
    lake.free(keep)
    huge = lake.allocate_with_state
    with pytest.raises(jaxlake.OutOfMemoryError):
        huge((1 << 64) - 1)
    lake.check()


def test_empty_cache_releases_free_memory(make_lake: MakeLake,
                                          backend: str) -> None:
    lake = make_lake()
    addresses = [lake.allocate(8 * MIB) for _ in range(4)]
    for address in addresses[:3]:
        lake.free(address)
    assert lake.stats().bytes_reserved == 32 * MIB
    released = lake.empty_cache()
    assert released == 24 * MIB
    stats = lake.stats()
    assert stats.bytes_reserved == 8 * MIB
    assert stats.segments_released == 3
    assert lake.physical_bytes() == 8 * MIB
    lake.free(addresses[3])
    assert lake.empty_cache() == 8 * MIB
    assert lake.physical_bytes() == 0
    assert lake.stats().bytes_reserved == 0


def test_preallocate_takes_the_capacity_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """preallocate (keyword or JAXLAKE_PREALLOCATE): the first allocation
    takes the whole capacity as one segment, with real bytes on the host
    backend; the next ones create nothing."""
    lake = jaxlake.Lake("host", capacity=32 * MIB, preallocate=True)
    assert lake.options["preallocate"] is True
    a = lake.allocate(MIB)
    assert lake.physical_bytes() == 32 * MIB
    b = lake.allocate(24 * MIB)
    ctypes.memset(b, 7, 24 * MIB)
    assert ctypes.string_at(b + 24 * MIB - 1, 1) == b"\x07"
    assert lake.stats().segments == 1
    for address in (a, b):
        lake.free(address)
    lake.check()
    monkeypatch.setenv("JAXLAKE_PREALLOCATE", "1")
    lake = jaxlake.Lake("sim", capacity=64 * MIB)
    assert lake.options["preallocate"] is True
    lake.free(lake.allocate(3 * MIB))
    assert lake.physical_bytes() == 64 * MIB
    monkeypatch.setenv("JAXLAKE_PREALLOCATE", "0")
    lake = jaxlake.Lake("sim", capacity=64 * MIB)
    lake.free(lake.allocate(3 * MIB))
    assert lake.physical_bytes() == 4 * MIB


@pytest.mark.parametrize("call", ["create", "map", "reserve", "set_access"])
def test_injected_driver_fault(make_lake: MakeLake, call: str) -> None:
    lake = make_lake()
    lake.inject_fault(call)
    with pytest.raises(jaxlake.DriverError) as info:
        lake.allocate(8 * MIB)
    assert info.value.status == "driver_error"
    assert "driver_error" in str(info.value)
    lake.check()
    assert lake.stats().driver_errors == 1
    assert lake.stats().live_allocations == 0
    address = lake.allocate(8 * MIB)
    lake.free(address)


def test_injected_fault_while_stitching(make_lake: MakeLake) -> None:
    lake = make_lake()
    fragment(lake)
    reserved = lake.stats().bytes_reserved
    lake.inject_fault("map", nth=2)  # the second piece of the stitch
    with pytest.raises(jaxlake.DriverError):
        lake.allocate(24 * MIB)
    lake.check()
    assert lake.stats().bytes_reserved == reserved
    address, state = lake.allocate_with_state(24 * MIB)
    assert state == "stitch"
    lake.free(address)


def test_injected_out_of_memory_from_the_driver(make_lake: MakeLake) -> None:
    lake = make_lake()
    lake.inject_fault("create", times=100, status="out_of_memory")
    with pytest.raises(jaxlake.OutOfMemoryError):
        lake.allocate(8 * MIB)
    lake.check()
    lake.clear_faults()
    lake.free(lake.allocate(8 * MIB))


def test_inject_fault_rejects_unknown_names(make_lake: MakeLake) -> None:
    lake = make_lake()
    with pytest.raises(ValueError, match="expected one of"):
        lake.inject_fault("mpa")
    with pytest.raises(ValueError, match="expected one of"):
        lake.inject_fault("map", status="ok")
    with pytest.raises(ValueError):
        lake.inject_fault("map", nth=0)


def test_trace_records_events(make_lake: MakeLake) -> None:
    lake = make_lake(record_trace=True)
    a = lake.allocate(5 * MIB, stream=7)
    lake.free(a, stream=7)
    trace = lake.trace()
    assert [(e.allocate, e.address, e.size, e.stream) for e in trace] == [
        (True, a, 5 * MIB, 7), (False, a, 5 * MIB, 7)]
    assert trace[0].state == "grow" and trace[1].state == ""
    assert trace[0].time_ns <= trace[1].time_ns
    assert make_lake().trace() == []


@pytest.mark.parametrize("nbytes, error, words", [
    (0, ValueError, "nbytes must be at least 1, got 0"),
    (-5, ValueError, "nbytes must be at least 1, got -5"),
    (1.5, TypeError, "nbytes must be an int, got 1.5"),
    ("8", TypeError, "nbytes must be an int, got '8'"),
    (True, TypeError, "nbytes must be an int, got True"),
    (None, TypeError, "nbytes must be an int, got None"),
    (1 << 64, ValueError, "below 2**64"),
])
def test_bad_sizes(make_lake: MakeLake, nbytes: object, error: type,
                   words: str) -> None:
    lake = make_lake()
    with pytest.raises(error) as info:
        lake.allocate(nbytes)  # type: ignore[arg-type]
    assert words in str(info.value)
    lake.check()


def test_bad_streams_and_addresses(make_lake: MakeLake) -> None:
    lake = make_lake()
    with pytest.raises(ValueError, match="stream must be at least 0"):
        lake.allocate(10, stream=-1)
    with pytest.raises(TypeError, match="stream must be an int"):
        lake.allocate(10, stream="main")  # type: ignore[arg-type]
    a = lake.allocate(10)
    with pytest.raises(ValueError, match=f"{a + 1:#x} is not a live"):
        lake.free(a + 1)
    lake.free(a)
    with pytest.raises(ValueError, match="already freed"):
        lake.free(a)
    with pytest.raises(ValueError, match="0x3039 is not a live"):
        lake.free(12345)
    with pytest.raises(ValueError):
        lake.free(-1)
    lake.check()
    assert lake.stats().frees == 1


def test_unknown_backend() -> None:
    with pytest.raises(jaxlake.ConfigurationError) as info:
        jaxlake.Lake("hots")
    message = str(info.value)
    assert "'hots'" in message and "did you mean 'host'" in message
    assert "host, sim, cuda" in message


def test_cuda_backend_without_driver_says_why(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JAXLAKE_REAL_LIBCUDA", "/nonexistent/libcuda.so.1")
    with pytest.raises(jaxlake.ConfigurationError,
                       match="backend 'cuda' needs the CUDA driver: "
                             "JAXLAKE_REAL_LIBCUDA"):
        jaxlake.Lake("cuda")
    with pytest.raises(jaxlake.ConfigurationError, match="host and sim"):
        jaxlake.Lake("cuda", granularity="2MiB")


def test_capacity_below_one_chunk(backend: str) -> None:
    with pytest.raises(jaxlake.ConfigurationError) as info:
        jaxlake.Lake(backend, capacity="1MiB", granularity="2MiB")
    message = str(info.value)
    assert "capacity=1048576" in message and "2097152" in message
    with pytest.raises(jaxlake.ConfigurationError, match="0.0001"):
        jaxlake.Lake(backend, capacity=0.0001, device_memory="1GiB")


def test_capacity_above_the_device(backend: str) -> None:
    with pytest.raises(jaxlake.ConfigurationError,
                       match="exceeds the device memory"):
        jaxlake.Lake(backend, capacity="8GiB", device_memory="4GiB")


def test_options_checked_by_the_lake(backend: str) -> None:
    with pytest.raises(jaxlake.ConfigurationError, match="small_limit"):
        jaxlake.Lake(backend, granularity="64KiB", small_limit="1MiB")
    with pytest.raises(jaxlake.ConfigurationError, match="alignment"):
        jaxlake.Lake(backend, granularity="64KiB", small_limit="64KiB",
                     alignment="128KiB")
    lake = jaxlake.Lake(backend, granularity="64KiB", small_limit="32KiB")
    assert lake.granularity == 64 << 10


# -- regressions: streams, faults, error types --------------------------------


def test_injected_invalid_value_is_a_driver_error(make_lake: MakeLake) -> None:
    lake = make_lake()
    lake.inject_fault("create", status="invalid_value")
    with pytest.raises(jaxlake.DriverError) as info:
        lake.allocate(8 * MIB)
    assert info.value.status == "invalid_value"
    lake.check()
    lake.free(lake.allocate(8 * MIB))


@pytest.mark.parametrize("option", ["stitch_cache", "max_pieces",
                                    "stitch_min", "small_limit",
                                    "granularity", "device_memory"])
def test_huge_option_is_a_configuration_error(option: str) -> None:
    with pytest.raises(jaxlake.ConfigurationError, match=option):
        jaxlake.Lake("sim", **{option: 2**70})


@pytest.mark.parametrize("call", ["unmap", "release", "address_free"])
def test_failed_release_is_reported_kept_and_retried(
        make_lake: MakeLake, call: str) -> None:
    lake = make_lake()
    lake.free(lake.allocate(8 * MIB))
    lake.inject_fault(call)
    with pytest.raises(jaxlake.DriverError, match=call) as info:
        lake.empty_cache()
    assert info.value.status == "driver_error"
    stats = lake.stats()
    assert stats.unreleased == 1
    assert stats.bytes_unreleased == (0 if call == "address_free" else 8 * MIB)
    lake.check()
    lake.empty_cache()  # the retry succeeds
    assert lake.stats().unreleased == 0
    assert lake.stats().bytes_unreleased == 0
    assert lake.physical_bytes() == 0


def test_small_frees_on_another_stream_come_back(make_lake: MakeLake) -> None:
    lake = make_lake(capacity=8 * MIB, small_limit=MIB)  # the small pool
    for _ in range(300):
        lake.free(lake.allocate(64 * 1024, stream=1), stream=2)
        lake.empty_cache()
    lake.empty_cache()
    assert lake.stats().alloc_small == 300
    assert lake.stats().bytes_reserved == 0
    assert lake.stats().live_allocations == 0


def test_chunk_counts_beyond_32_bits() -> None:
    lake = jaxlake.Lake("sim", granularity=4096, device_memory=64 << 40,
                        small_limit=4096)
    n = 2**44 + 4096
    a = lake.allocate(n)
    lake.check()
    b = lake.allocate(n)
    assert b >= a + n or b + n <= a
    lake.check()
    with pytest.raises(jaxlake.ConfigurationError, match="small_slab"):
        jaxlake.Lake("sim", granularity=4096, device_memory=64 << 40,
                     small_slab=2**53)
