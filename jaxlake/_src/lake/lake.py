"""jaxlake.Lake: the Python face of the stitching allocator."""

from __future__ import annotations

import difflib
import operator
import types
from typing import List, Mapping, NamedTuple, Tuple, Union

from jaxlake._src import errors
from jaxlake._src.options import (
    OPTIONS, OptionValue, format_size, resolve_options)
from jaxlake._src.lake.stats import Stats

try:
    from jaxlake import _core
except ImportError as e:  # pragma: no cover - depends on the installation
    raise ImportError(
        "jaxlake's compiled module jaxlake._core is missing: import jaxlake "
        "from an installed copy (pip install .), not from the source tree"
    ) from e

#: What the capacity argument accepts (see the option table).
CapacityLike = Union[int, float, str, None]

_U64 = 1 << 64


class TraceEvent(NamedTuple):
    """One allocate or free recorded by a lake with record_trace=True."""

    time_ns: int      # steady clock, from the lake's creation
    allocate: bool    # True: allocate, False: free
    address: int
    size: int         # requested bytes
    stream: int
    state: str        # how an allocation was served; "" for a free


def _integer(name: str, value: object, minimum: int) -> int:
    """`value` as an int in [minimum, 2**64), else TypeError/ValueError."""
    if isinstance(value, bool) or isinstance(value, float):
        raise TypeError(f"{name} must be an int, got {value!r}")
    try:
        number = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{name} must be an int, got {value!r} "
                        f"({type(value).__name__})") from None
    if number < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {number}")
    if number >= _U64:
        raise ValueError(f"{name} must be below 2**64, got {number}")
    return number


def _capacity_bytes(value: OptionValue, granularity: int,
                    device_memory: int) -> int:
    """Capacity in bytes for the C++ lake (0: the whole device)."""
    if value is None:
        return 0
    if isinstance(value, float):
        nbytes = int(value * device_memory)
        what = (f"capacity={value} of device_memory {device_memory} "
                f"({nbytes} bytes)")
    else:
        nbytes = int(value)
        what = f"capacity={nbytes}"
    if nbytes < granularity:
        raise errors.ConfigurationError(
            f"option {what} is below one chunk: expected at least the "
            f"granularity, {granularity} bytes ({format_size(granularity)}), "
            "or None for the whole device")
    if nbytes > device_memory:
        raise errors.ConfigurationError(
            f"option {what} exceeds the device memory: expected at most "
            f"{device_memory} bytes ({format_size(device_memory)}); raise "
            "device_memory (host/sim backends) or lower capacity")
    return nbytes


def _core_options(settings: Mapping[str, OptionValue]) -> "_core.LakeOptions":
    """The C++ LakeOptions of resolved settings (capacity left at 0).

    The C++ fields are 64-bit: a larger (or negative) int is refused here,
    by name, rather than by the binding."""
    core_options = _core.LakeOptions()
    for option in OPTIONS:
        if not option.lake or option.name == "capacity":
            continue
        value = settings[option.name]
        if isinstance(value, int) and not isinstance(value, bool) and \
                not 0 <= value < _U64:
            raise errors.ConfigurationError(
                f"option {option.name}={value} is out of range: expected an "
                "int from 0 to 2**64 - 1")
        setattr(core_options, option.name, value)
    return core_options


class Lake:
    """A stitching allocator over one backend.

    backend: "host" (real memory, memfd mappings), "sim" (address-only
    bookkeeping, for large simulated devices) or "cuda" (device `device`
    of the real CUDA driver, found as jaxlake.configure() finds it; its
    addresses are device memory, usable from CUDA kernels, not from
    Python). To serve JAX's own buffers use jaxlake.configure() instead.
    capacity and every other keyword argument are options of the option
    table (`jaxlake options` lists them); JAXLAKE_<NAME> environment
    variables set those not given. All methods may be called from several
    threads; allocate, free and empty_cache release the GIL.
    """

    def __init__(self, backend: str = "host", capacity: CapacityLike = None,
                 device: int = 0, **options: object) -> None:
        if backend == "cuda":
            self._init_cuda(capacity, device, options)
            return
        known = list(_core.backend_names())
        if not isinstance(backend, str) or backend not in known:
            close = difflib.get_close_matches(str(backend), known + ["cuda"],
                                              n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise errors.ConfigurationError(
                f"unknown backend {backend!r}{hint}: expected one of "
                + ", ".join(known + ["cuda"]))
        settings = resolve_options({"capacity": capacity, **options})
        default_granularity, default_memory = _core.backend_defaults(backend)
        granularity = int(settings["granularity"] or default_granularity)
        device_memory = int(settings["device_memory"] or default_memory)
        for name, value in (("granularity", granularity),
                            ("device_memory", device_memory)):
            if not 0 < value < _U64:
                raise errors.ConfigurationError(
                    f"option {name}={value} is out of range: expected an int "
                    "from 1 to 2**64 - 1")
        core_options = _core_options(settings)
        core_options.capacity = _capacity_bytes(
            settings["capacity"], granularity, device_memory)
        try:
            self._core = _core.Lake(backend, granularity, device_memory,
                                    core_options)
        except ValueError as e:
            raise errors.ConfigurationError(str(e)) from None
        settings["granularity"] = granularity
        settings["device_memory"] = device_memory
        self._settings: Mapping[str, OptionValue] = \
            types.MappingProxyType(settings)

    def _init_cuda(self, capacity: CapacityLike, device: int,
                   options: Mapping[str, object]) -> None:
        from jaxlake._src.xla import integration as xla  # the driver search lives there
        for name in ("granularity", "device_memory"):
            if options.get(name) is not None:
                raise errors.ConfigurationError(
                    f"option {name!r} belongs to the host and sim backends; "
                    "the cuda backend takes both from the device")
        if isinstance(device, bool) or not isinstance(device, int) \
                or device < 0:
            raise errors.ConfigurationError(
                f"device {device!r} is invalid: expected a device ordinal, "
                "an int >= 0")
        settings = dict(resolve_options({"capacity": capacity, **options}))
        path, why = xla.find_real_driver()
        if path is None:
            raise errors.ConfigurationError(
                f"backend 'cuda' needs the CUDA driver: {why}")
        core_options = _core_options(settings)
        cap = settings["capacity"]
        fraction = float(cap) if isinstance(cap, float) else 0.0
        core_options.capacity = 0 if cap is None or fraction else int(cap)
        try:
            self._core = _core.Lake(path, device, core_options, fraction)
        except ValueError as e:
            raise errors.ConfigurationError(
                f"backend 'cuda', device {device}: {e}") from None
        settings["granularity"] = self._core.granularity
        settings["device_memory"] = self._core.total_memory
        settings["capacity"] = self._core.capacity
        self._settings = types.MappingProxyType(settings)

    # -- allocation ---------------------------------------------------------

    def allocate(self, nbytes: int, stream: int = 0) -> int:
        """The address of `nbytes` new bytes, usable at once on `stream`.

        Raises OutOfMemoryError (a MemoryError) when the request cannot be
        served even after reclaiming, DriverError when a driver call failed;
        the lake stays consistent and usable after either.
        """
        return self.allocate_with_state(nbytes, stream)[0]

    def allocate_with_state(self, nbytes: int,
                            stream: int = 0) -> Tuple[int, str]:
        """(address, state): allocate(), and how the request was served
        ("small", "fit", "split", "stitch_reuse", "stitch", "stitch_grow"
        or "grow": see jaxlake._core.alloc_state_names())."""
        n = _integer("nbytes", nbytes, 1)
        s = _integer("stream", stream, 0)
        status, address, state = self._core.allocate(n, s)
        if status != "ok":
            raise errors.status_error(
                status, self._core.last_error() or
                f"allocate({n}) on stream {s} failed: {status}", n, s)
        return address, state

    def free(self, address: int, stream: int = 0) -> None:
        """Frees a live allocation. Work queued on `stream` may still use
        the memory: only `stream` reuses it at once, others once the
        stream's work is complete."""
        a = _integer("address", address, 0)
        s = _integer("stream", stream, 0)
        status = self._core.free(a, s)
        if status == "invalid_value":
            raise ValueError(
                f"free: address {a:#x} is not a live allocation of this lake "
                "(never allocated by it, or already freed)")
        if status != "ok":
            raise errors.status_error(
                status,
                f"free: address {a:#x} is not a live allocation of this lake "
                "(never allocated by it, or already freed)"
                if status == "invalid_value" else
                f"free({a:#x}) on stream {s} failed: {status}", 0, s)

    def allocation_size(self, address: int) -> int:
        """Requested bytes of a live allocation; 0 if `address` is not one."""
        return self._core.allocation_size(_integer("address", address, 0))

    def empty_cache(self) -> int:
        """Drops cached stitched ranges and gives every free segment whose
        last use is complete back to the driver. Returns the bytes released.

        Raises DriverError when the driver refused a release (unmap, release
        or address_free): the lake keeps what it could not release, counts it
        in stats() (unreleased, bytes_unreleased) and retries it on the next
        empty_cache(), under memory pressure and when it is destroyed.
        """
        released, status = self._core.empty_cache()
        if status != "ok":
            raise errors.status_error(
                status, self._core.last_error() or
                f"empty_cache failed: {status}")
        return int(released)

    # -- inspection ---------------------------------------------------------

    def check(self) -> None:
        """Validates every invariant; raises InvariantError if one broke."""
        problem = self._core.check()
        if problem:
            raise errors.InvariantError(problem)

    def stats(self) -> Stats:
        """A snapshot of the statistics."""
        return Stats.from_core(self._core.stats())

    def trace(self) -> List[TraceEvent]:
        """The recorded events (empty unless record_trace=True)."""
        return [TraceEvent(*event) for event in self._core.trace()]

    def describe(self) -> str:
        """A readable summary of the lake's figures."""
        return self._core.describe()

    @property
    def backend(self) -> str:
        return self._core.backend

    @property
    def granularity(self) -> int:
        """Chunk size in bytes."""
        return self._core.granularity

    @property
    def capacity(self) -> int:
        """Physical bytes the lake may hold."""
        return self._core.capacity

    @property
    def device_memory(self) -> int:
        """Physical bytes of the (host, simulated or real) device."""
        return self._core.total_memory

    @property
    def options(self) -> Mapping[str, OptionValue]:
        """Every option's value as resolved at creation (read-only)."""
        return self._settings

    def __repr__(self) -> str:
        return (f"jaxlake.Lake(backend={self.backend!r}, "
                f"capacity={self.capacity}, granularity={self.granularity})")

    # -- test hooks (host and sim backends) -------------------------------

    def hold_stream(self, stream: int, until_waited: bool = False) -> None:
        """Keeps work recorded on `stream` in flight until release_stream
        (events recorded on it stay incomplete). With until_waited=True the
        hold also ends when the lake waits for that work (the device
        finishes what is waited for), so one thread cannot block forever.
        A lake destroyed while frees on a held stream are pending waits for
        that work (it unmaps nothing the work may use): release the stream
        first, or hold it with until_waited=True."""
        self._core.hold_stream(_integer("stream", stream, 0),
                               bool(until_waited))

    def stream_held(self, stream: int) -> bool:
        """True while `stream` is held (see hold_stream)."""
        return bool(self._core.stream_held(_integer("stream", stream, 0)))

    def release_stream(self, stream: int) -> None:
        """Completes everything recorded on `stream` so far."""
        self._core.release_stream(_integer("stream", stream, 0))

    def physical_bytes(self) -> int:
        """Bytes of physical memory alive in the driver."""
        return self._core.physical_bytes()

    def inject_fault(self, call: str, nth: int = 1, times: int = 1,
                     status: str = "driver_error") -> None:
        """Makes the `nth` next driver call named `call` (and the `times`-1
        after it) fail with `status` (a name of _core.status_names())."""
        self._core.inject_fault(call, _integer("nth", nth, 1),
                                _integer("times", times, 1), status)

    def clear_faults(self) -> None:
        """Disarms every injected fault."""
        self._core.clear_faults()
