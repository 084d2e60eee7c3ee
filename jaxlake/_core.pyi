"""Type stubs of jaxlake._core, the compiled module (cc/python/module.cc).

Private: use the package jaxlake. tests/test_api.py checks these stubs
against the module (names and parameters).
"""

from typing import Any, Tuple, overload

def gauge_names() -> list[tuple[str, str]]:
    """(name, doc) of every gauge, in declaration order."""

def counter_names() -> list[tuple[str, str]]:
    """(name, doc) of every counter, in declaration order."""

def call_names() -> list[str]:
    """Names of the driver entry points, in declaration order."""

def alloc_state_names() -> list[str]:
    """Names of the ways an allocation can be served, in policy order."""

def status_names() -> list[str]:
    """Names of the driver statuses."""

def backend_names() -> list[str]:
    """Backends this build knows."""

def backend_defaults(backend: str) -> tuple[int, int]:
    """(granularity, device_memory) a backend uses by default."""

class LakeOptions:
    """The C++ LakeOptions struct."""

    capacity: int
    small_limit: int
    small_slab: int
    alignment: int
    stitch: bool
    stitch_min: int
    stitch_grow: bool
    max_pieces: int
    stitch_cache: int
    grow_min: int
    preallocate: bool
    record_trace: bool
    def __init__(self) -> None: ...

class Lake:
    """A lake over its own driver stack."""

    @overload
    def __init__(self, backend: str, granularity: int, device_memory: int,
                 options: LakeOptions) -> None: ...
    @overload
    def __init__(self, driver_path: str, device: int, options: LakeOptions,
                 capacity_fraction: float) -> None: ...
    def allocate(self, nbytes: int, stream: int) -> tuple[str, int, str]: ...
    def free(self, address: int, stream: int) -> str: ...
    def allocation_size(self, address: int) -> int: ...
    def empty_cache(self) -> Tuple[int, str]: ...
    def check(self) -> str: ...
    # {"gauges": {name: (current, peak)}, "counters": {name: n},
    #  "driver_calls": {name: n}}
    def stats(self) -> dict[str, dict[str, Any]]: ...
    # (time_ns, allocate, address, size, stream, state) per event
    def trace(self) -> list[tuple[int, bool, int, int, int, str]]: ...
    def describe(self) -> str: ...
    def last_error(self) -> str: ...
    @property
    def granularity(self) -> int: ...
    @property
    def capacity(self) -> int: ...
    @property
    def total_memory(self) -> int: ...
    @property
    def backend(self) -> str: ...
    def hold_stream(self, stream: int, until_waited: bool = ...) -> None: ...
    def stream_held(self, stream: int) -> bool: ...
    def release_stream(self, stream: int) -> None: ...
    def physical_bytes(self) -> int: ...
    def inject_fault(self, call: str, nth: int, times: int,
                     status: str) -> None: ...
    def clear_faults(self) -> None: ...
    def injected_faults(self) -> int: ...

# -- trace replay (cc/python/replay.cc) --------------------------------------

class TraceData:
    """A parsed trace (cc/replay/trace.h)."""

    def size(self) -> int: ...
    def error(self) -> tuple[int, str, bool] | None: ...
    def skipped(self) -> list[tuple[int, str]]: ...
    @property
    def skipped_count(self) -> int: ...
    @property
    def ignored(self) -> int: ...
    @property
    def lines(self) -> int: ...
    @property
    def devices(self) -> int: ...
    @property
    def header_line(self) -> int: ...
    def header(self) -> str: ...
    def events(self) -> list[tuple[int, bool, int, int, int, int, str]]: ...
    def device_events(self) -> list[int]: ...
    def columns(self) -> dict[str, bytes]: ...
    def peak_live(self, device: int) -> int: ...
    def to_jsonl(self, header: str) -> bytes: ...
    def to_csv(self) -> bytes: ...

def parse_trace(data: bytes, csv: bool, lenient: bool) -> TraceData:
    """Parses a whole trace file (JSON lines, or RMM CSV when csv)."""

class LatencyModel:
    """The driver latency model (cc/vmm/latency.h): microseconds per call
    by kind, as points (bytes, us)."""

    source: str
    def __init__(self) -> None: ...
    @staticmethod
    def zero() -> LatencyModel: ...
    def set(self, kind: str, sizes: list[int], us: list[float]) -> None: ...
    def points(self, kind: str) -> list[tuple[int, float]]: ...
    def us(self, kind: str, bytes: int) -> float: ...
    def set_term(self, name: str, value: float) -> None: ...
    def call_us(self, kind: str, bytes: int, handles: int = 1) -> float: ...
    @property
    def devices(self) -> int: ...
    @property
    def peer_us(self) -> float: ...
    @property
    def first_set_access_us(self) -> float: ...

class PolicyOptions:
    """The C++ replay::PolicyOptions struct."""

    capacity: int
    granularity: int
    latency: LatencyModel
    lake: LakeOptions
    bfc_initial_region: int
    bfc_max_internal_fragmentation: int
    bfc_growth_increment: int
    torch_max_split_size: int
    gmlake_frag_limit: int
    gmlake_reuse_limit: float
    def __init__(self) -> None: ...

def call_kinds() -> list[str]:
    """The driver call kinds (cc/vmm/driver.h), in its order."""

def policy_names() -> list[str]:
    """The replay policies, in table order."""

def replay(trace: TraceData, policy: str, options: PolicyOptions,
           device: int = 0, timeline_points: int = 1000, timing: bool = True,
           check_every: int = 0, timing_rounds: int = 1) -> dict[str, Any]:
    """Replays one device of a trace through a policy; returns a dict.
    With timing_rounds > 1 the call times of that many replays (each with a
    fresh policy) are pooled."""

def fit(trace: TraceData, policy: str, options: PolicyOptions,
        device: int = 0, max_capacity: int = 1099511627776) -> dict[str, Any]:
    """The fit capacity of one device of a trace for a policy
    (cc/replay/fit.h); returns a dict."""

def lake_view(trace: TraceData, options: PolicyOptions, device: int = 0,
              snapshot_events: list[int] = ...,
              stitch_snapshots: int = 0) -> dict[str, Any]:
    """Replays one device through the jaxlake policy keeping how each event
    was served and snapshots of the lake's layout
    (cc/replay/lake_view.h); returns a dict."""
