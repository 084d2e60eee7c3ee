"""Replaying a trace through the allocation policies.

The loop runs in the compiled core (cc/replay): Python picks the policy,
the capacity and the device, and turns the core's figures into a
ReplayResult. See docs/benchmarks.md for what each policy models and what
each figure means.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import re
from typing import (TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple,
                    Union)

from jaxlake._src.errors import InvariantError, JaxlakeError
from jaxlake._src.options import MIB, format_size, parse_size
from jaxlake._src.trace.tracefile import Trace

if TYPE_CHECKING:
    from jaxlake import _core as _core_types

#: Driver-call kinds that manage memory (event calls are reported apart).
MEMORY_CALLS = ("reserve", "address_free", "create", "release", "map",
                "unmap", "set_access")
GRANULARITY = 2 * MIB
#: The device of an uncapped replay: an H100's 80 GiB, or twice a device's
#: peak live bytes when that is more (see device_bytes()).
DEVICE = 80 << 30
GIB = 1 << 30


def empty_trace_problem(trace: Trace) -> Optional[str]:
    """Why `trace` cannot be replayed when it has no allocation event (a
    replay of it would report U 0.000 as if measured), else None."""
    if len(trace) > 0:
        return None
    if trace.source == "shim":
        hint = ("the lake served no allocation while the trace was written. "
                "Likely causes: the lake was inactive (JAXLAKE_SHIM_HOOKS=0, "
                "a bad option, no driver: `jaxlake run` and `jaxlake doctor` "
                "say why), JAX ran on another platform than the GPU "
                "(JAX_PLATFORMS), XLA's allocator was not cuda_async "
                "(XLA_PYTHON_CLIENT_ALLOCATOR, or an XLA flag that makes XLA "
                "use its own VMM allocator), or the trace stopped before the "
                "program's first allocation")
    else:
        hint = ("nothing was recorded: the program made no allocation "
                "while the trace was written (a recorder whose functions "
                "were never called, or a trace stopped at once)")
    return (f"{trace.path}: the trace has no allocation events, so there is "
            f"nothing to replay: {hint}")


def device_bytes(peak_live: int, capacity: Optional[int] = None) -> int:
    """The simulated device for an uncapped replay of a device whose peak
    live bytes are `peak_live`: 80 GiB (an H100), or twice the peak live
    bytes in whole GiB when that is more, and never less than `capacity`.

    The size matters to the policies that size their growth by the memory
    left (BFC cuts its doubling regions to it, expandable segments reserve
    9/8 of it), so it is a real device size, not an unbounded one.
    """
    need = -(-2 * peak_live // GIB) * GIB
    return max(DEVICE, need, capacity or 0)


def _core() -> Any:
    from jaxlake import _core
    return _core


def policy_names() -> Tuple[str, ...]:
    """The policies, in table order: jaxlake, bfc, torch, torch-expandable,
    gmlake, xla-vmm, bfc-growth."""
    return tuple(_core().policy_names())


class PolicyError(JaxlakeError, ValueError):
    """An unknown policy name."""


def check_policies(names: Sequence[str]) -> List[str]:
    """`names` checked against the policy table (order kept, duplicates
    dropped); raises PolicyError naming a bad one and the valid ones."""
    known = policy_names()
    out: List[str] = []
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise PolicyError(f"unknown policy {name!r}{hint}: expected one "
                              "of " + ", ".join(known))
        if name not in out:
            out.append(name)
    return out


# -- driver latency ----------------------------------------------------------

LATENCY_FORMAT = "jaxlake-driver-latency"


class LatencyError(JaxlakeError, ValueError):
    """A driver latency file that does not follow the format."""


class DriverModelError(LatencyError):
    """A --driver-model item that is not well formed (bad usage, where a
    LatencyError of a file it names is bad input)."""


@dataclasses.dataclass(frozen=True)
class Latency:
    """Driver latency points per call kind, overriding the sim driver's
    defaults kind by kind (docs/benchmarks.md, "Driver time"). `calls` maps
    a kind of cc/vmm/driver.h to its points (bytes, microseconds), sorted
    by bytes; kinds left out keep their defaults."""

    source: str
    calls: Dict[str, Tuple[Tuple[int, float], ...]]
    #: The model's scalar terms (cc/vmm/latency.h): "devices", "peer_us",
    #: "first_set_access_us"; those left out keep their defaults.
    terms: Dict[str, float] = dataclasses.field(default_factory=dict)
    #: Kinds whose default points are scaled so that their 2 MiB figure
    #: becomes the given microseconds (--driver-model KIND=TIME).
    scaled: Dict[str, float] = dataclasses.field(default_factory=dict)

    @classmethod
    def load(cls, path: str) -> "Latency":
        """Reads a JSON file of the "jaxlake-driver-latency" format."""
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except OSError as e:
            raise LatencyError(f"{path}: cannot read: {e.strerror}") from None
        except json.JSONDecodeError as e:
            raise LatencyError(f"{path}: not JSON: {e}") from None
        return cls.parse(data, where=path)

    @classmethod
    def parse(cls, data: Any, where: str = "latency") -> "Latency":
        """Checks a decoded latency object; LatencyError names what is
        wrong."""
        if not isinstance(data, dict):
            raise LatencyError(f"{where}: expected a JSON object")
        if data.get("format") != LATENCY_FORMAT:
            raise LatencyError(f"{where}: \"format\" must be "
                               f"{LATENCY_FORMAT!r}, got "
                               f"{data.get('format')!r}")
        if data.get("version") != 1:
            raise LatencyError(f"{where}: unsupported \"version\" "
                               f"{data.get('version')!r}; expected 1")
        calls = data.get("calls")
        if not isinstance(calls, dict):
            raise LatencyError(f"{where}: \"calls\" must be an object of "
                               "call kind -> points")
        kinds = set(driver_call_kinds())
        out: Dict[str, Tuple[Tuple[int, float], ...]] = {}
        for kind, points in calls.items():
            if kind not in kinds:
                raise LatencyError(
                    f"{where}: unknown call kind {kind!r}; expected one of "
                    + ", ".join(driver_call_kinds()))
            if not isinstance(points, list) or not points:
                raise LatencyError(f"{where}: calls.{kind} must be a "
                                   "non-empty list of {\"bytes\", \"us\"}")
            parsed: List[Tuple[int, float]] = []
            for i, p in enumerate(points):
                if not isinstance(p, dict):
                    raise LatencyError(f"{where}: calls.{kind}[{i}] must "
                                       "be an object")
                nbytes, us = p.get("bytes"), p.get("us")
                if isinstance(nbytes, bool) or not isinstance(nbytes, int) \
                        or nbytes <= 0:
                    raise LatencyError(f"{where}: calls.{kind}[{i}].bytes "
                                       f"must be an integer > 0, got "
                                       f"{nbytes!r}")
                if isinstance(us, bool) or not isinstance(us, (int, float)) \
                        or not math.isfinite(us) or us < 0:
                    raise LatencyError(f"{where}: calls.{kind}[{i}].us must "
                                       f"be a number >= 0, got {us!r}")
                if parsed and nbytes <= parsed[-1][0]:
                    raise LatencyError(f"{where}: calls.{kind} must be "
                                       "sorted by bytes without repeats "
                                       f"(point {i}: {nbytes})")
                parsed.append((nbytes, float(us)))
            out[kind] = tuple(parsed)
        terms_in = data.get("terms", {})
        if not isinstance(terms_in, dict):
            raise LatencyError(f"{where}: \"terms\" must be an object of "
                               "term -> number")
        terms: Dict[str, float] = {}
        for name, value in terms_in.items():
            problem = _term_problem(name, value)
            if problem:
                raise LatencyError(f"{where}: terms.{problem}")
            terms[name] = float(value)
        return cls(source=str(data.get("source", where)), calls=out,
                   terms=terms)

    def model(self) -> Any:
        """The core's LatencyModel: the defaults, overridden by these
        points, then scaled kinds, then terms."""
        m = _core().LatencyModel()
        for kind, points in self.calls.items():
            m.set(kind, [b for b, _ in points], [u for _, u in points])
        for kind, us in self.scaled.items():
            points = m.points(kind)
            at = m.us(kind, _GRANULE) if points else 0.0
            if at > 0:
                m.set(kind, [b for b, _ in points],
                      [u * us / at for _, u in points])
            else:
                m.set(kind, [_GRANULE], [us])
        for name, value in self.terms.items():
            m.set_term(name, value)
        m.source = self.source
        return m

    @classmethod
    def from_spec(cls, spec: str) -> "Latency":
        """The model a --driver-model SPEC describes: comma-separated
        items, applied in order over the defaults. An item is a latency
        JSON file (the GPU check's output: its points and terms), KIND=TIME
        (a call kind of cc/vmm/driver.h; its points scaled so that one call
        on 2 MiB takes TIME, e.g. create=8us), devices=N (devices an access
        grant covers), peer=TIME (each device after the first) or
        first_set_access=TIME (the first grant's extra time). TIME is a
        number with us or ms. LatencyError names a bad item."""
        kinds = driver_call_kinds()
        calls: Dict[str, Tuple[Tuple[int, float], ...]] = {}
        terms: Dict[str, float] = {}
        scaled: Dict[str, float] = {}
        sources: List[str] = []
        items = [i.strip() for i in spec.split(",")]
        if not any(items):
            raise DriverModelError("--driver-model: empty; give a latency "
                                   "JSON file or items such as create=8us")
        if not all(items):
            raise DriverModelError(f"--driver-model {spec!r}: an empty item "
                                   "(two commas, or one at an end)")
        for item in items:
            if "=" not in item:
                loaded = cls.load(item)
                for kind in loaded.calls:
                    scaled.pop(kind, None)
                calls.update(loaded.calls)
                terms.update(loaded.terms)
                sources.append(loaded.source)
                continue
            name, _, value = (x.strip() for x in item.partition("="))
            if name in kinds:
                us = _parse_time(item, value)
                if name in calls:  # a file's points: scaled here
                    probe = _core().LatencyModel()
                    probe.set(name, [b for b, _ in calls[name]],
                              [u for _, u in calls[name]])
                    at = probe.us(name, _GRANULE)
                    calls[name] = tuple((b, u * us / at) for b, u in
                                        calls[name]) if at > 0 else \
                        ((_GRANULE, us),)
                else:
                    scaled[name] = us
            elif name in _TERM_ITEMS:
                term = _TERM_ITEMS[name]
                number = (_parse_count(item, value) if term == "devices"
                          else _parse_time(item, value))
                problem = _term_problem(term, number)
                if problem:
                    raise DriverModelError(f"--driver-model {item}: {problem}")
                terms[term] = number
            else:
                raise DriverModelError(
                    f"--driver-model {item}: unknown name {name!r}; expected "
                    "a call kind (" + ", ".join(kinds) + ") or one of "
                    + ", ".join(_TERM_ITEMS) + ", or a latency JSON file "
                    "(no '=')")
            sources.append(item)
        return cls(source="defaults + " + ", ".join(sources)
                   if not calls else ", ".join(sources),
                   calls=calls, terms=terms, scaled=scaled)


_GRANULE = 2 << 20
#: --driver-model names of the model's scalar terms.
_TERM_ITEMS = {"devices": "devices", "peer": "peer_us",
               "first_set_access": "first_set_access_us"}
_TIME_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)(?:e([+-]?\d+))?\s*"
                      r"(us|ms|s)\s*$", re.IGNORECASE)


def _parse_time(item: str, value: str) -> float:
    """Microseconds of "8us", "0.5ms", "1s"."""
    m = _TIME_RE.match(value)
    if not m:
        raise DriverModelError(
            f"--driver-model {item}: {value!r} is not a time; give a "
            "number >= 0 with us, ms or s (e.g. 8us)")
    number = float(m.group(1)) * 10 ** int(m.group(2) or 0)
    us = float(number * {"us": 1.0, "ms": 1e3, "s": 1e6}[m.group(3).lower()])
    if not math.isfinite(us):
        raise DriverModelError(
            f"--driver-model {item}: {value!r} is not finite")
    return us


def _parse_count(item: str, value: str) -> float:
    if not value.isdigit():
        raise DriverModelError(
            f"--driver-model {item}: {value!r} is not a whole number of "
            "devices (1 or more)")
    return float(int(value))


def _term_problem(name: str, value: Any) -> str:
    """'' when `value` suits the term `name`, else what is wrong."""
    if name not in _TERM_ITEMS.values():
        return (f"{name}: unknown term; expected one of "
                + ", ".join(_TERM_ITEMS.values()))
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value < 0:
        return f"{name} must be a number >= 0, got {value!r}"
    if name == "devices" and (value < 1 or value != int(value)
                              or value > 65536):
        return f"devices must be a whole number from 1 to 65536, got {value:g}"
    return ""


def driver_call_kinds() -> Tuple[str, ...]:
    """The driver call kinds (cc/vmm/driver.h), in its order."""
    return tuple(_core().call_kinds())


# -- capacity ----------------------------------------------------------------

_FACTOR_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*x\s*$", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class Capacity:
    """A device size for a replay: a number of bytes, or a multiple of each
    device's peak live bytes ("1.1x"). Either is rounded up to whole 2 MiB
    granules."""

    nbytes: Optional[int] = None
    factor: Optional[float] = None

    @classmethod
    def parse(cls, text: Union[str, int, None]) -> Optional["Capacity"]:
        """"none" (or None/""): no cap; "1.1x": a multiple of the peak live
        bytes; "16GiB", "16G", "512MiB", "1e9", "4096": bytes (the forms of
        jaxlake.parse_size). 0 and negative sizes are errors: a device of 0
        bytes fits nothing, and "none" says "no cap" plainly."""
        if text is None:
            return None
        if isinstance(text, int) and not isinstance(text, bool):
            if text <= 0:
                raise ValueError(f"capacity must be positive, got {text}")
            return cls(nbytes=text)
        value = str(text).strip()
        if value.lower() in ("", "none", "off"):
            return None
        m = _FACTOR_RE.match(value)
        if m:
            factor = float(m.group(1))
            if factor <= 0:
                raise ValueError(f"capacity factor must be positive: {text!r}")
            return cls(factor=factor)
        expected = ("expected a size such as '16GiB' or '16G', a multiple "
                    "of the peak live bytes such as '1.1x', or 'none' for "
                    "no cap")
        try:
            nbytes = parse_size(value)
        except ValueError as e:
            why = "" if "expected" in str(e) else f" ({e})"
            raise ValueError(
                f"not a capacity: {text!r}{why}; {expected}") from None
        if nbytes <= 0:
            raise ValueError(f"not a capacity: {text!r} (a device of 0 bytes "
                             f"fits nothing); {expected}")
        return cls(nbytes=nbytes)

    def bytes_for(self, peak_live: int) -> int:
        # (less a hair, so that 1.1 x 100 MiB is 110 MiB, not one more)
        raw = self.nbytes if self.nbytes is not None else \
            math.ceil((self.factor or 1.0) * peak_live - 1e-6)
        granules = max(1, -(-int(raw) // GRANULARITY))
        return granules * GRANULARITY

    def __str__(self) -> str:
        if self.nbytes is not None:
            return format_size(self.nbytes)
        return f"{self.factor:g}x peak live"


# -- results -----------------------------------------------------------------


@dataclasses.dataclass
class OutOfMemory:
    """Where a capped replay ran out of memory."""

    device: int
    event: int      # index in the trace's events
    line: int       # line in the trace file
    size: int       # the request that failed
    stream: int
    live: int       # requested bytes live then
    reserved: int   # physical bytes the policy held then

    def describe(self) -> str:
        return (f"out of memory at event {self.event} (line {self.line}, "
                f"device {self.device}): {format_size(self.size)} requested "
                f"with {format_size(self.live)} live and "
                f"{format_size(self.reserved)} reserved")


@dataclasses.dataclass
class ReplayResult:
    """One policy's figures on one trace (summed over its devices)."""

    trace: str
    policy: str
    devices: int
    events: int
    allocs: int
    frees: int
    peak_live: int          # requested bytes
    peak_reserved: int      # physical bytes
    waste: int              # peak_reserved - peak_live
    utilisation: float      # peak_live / peak_reserved
    calls: Dict[str, int]
    counters: Dict[str, int]
    median_ns: float        # median CPU time of an allocate or free
    alloc_p50_ns: float
    alloc_p99_ns: float
    free_p50_ns: float
    free_p99_ns: float
    mean_ns: float
    wall_s: float
    events_per_s: float
    timeline_event: List[int]
    timeline_live: List[int]
    timeline_reserved: List[int]
    device_memory: int = 0           # the uncapped device (bytes, max)
    capacity: Optional[int] = None   # bytes per device, when capped
    oom: Optional[OutOfMemory] = None
    capped_peak_reserved: Optional[int] = None
    # The same, device by device (its largest is what one device of the
    # capacity must hold).
    capped_peak_reserved_by_device: Optional[Dict[int, int]] = None
    #: The run under the capacity (replay(capped_figures=True)), else None.
    capped: Optional["ReplayResult"] = None
    # Driver calls by kind from each device's middle event on (the steady
    # state after warm-up), and the modelled driver time of the calls by
    # kind (microseconds), over the whole replay and its second half.
    calls_second_half: Dict[str, int] = dataclasses.field(
        default_factory=dict)
    driver_us: Dict[str, float] = dataclasses.field(default_factory=dict)
    driver_us_second_half: Dict[str, float] = dataclasses.field(
        default_factory=dict)
    latency_source: str = ""
    # Replays whose call times were pooled for the time figures.
    timing_rounds: int = 1
    # The least physical memory any policy needs: each device's peak live
    # bytes rounded up to the driver's granularity (bytes, summed).
    min_reserved: int = 0
    # Fit capacity (replay(fit=True), cc/replay/fit.h): the smallest
    # capacity in whole granules under which every device replays with no
    # out-of-memory (bytes per device, the largest device's), U_fit = peak
    # live / fit capacity (summed over devices), and the driver calls and
    # modelled driver time (us) of the replays at that capacity. None when
    # not asked, or when no capacity up to the device fits.
    fit_capacity: Optional[int] = None
    u_fit: Optional[float] = None
    fit_calls: Dict[str, int] = dataclasses.field(default_factory=dict)
    fit_calls_second_half: Dict[str, int] = dataclasses.field(
        default_factory=dict)
    fit_driver_us: Dict[str, float] = dataclasses.field(default_factory=dict)
    # A capacity below a failing one succeeded (the search checked the
    # granules just below its boundary).
    fit_nonmonotone: bool = False

    @property
    def fit_memory_calls(self) -> int:
        """Memory calls of the replay at the fit capacity."""
        return sum(self.fit_calls.get(k, 0) for k in MEMORY_CALLS)

    @property
    def fit_steady_calls(self) -> int:
        """Memory calls in the second half at the fit capacity."""
        return sum(self.fit_calls_second_half.get(k, 0) for k in MEMORY_CALLS)

    @property
    def fit_driver_ms(self) -> float:
        """Modelled driver time at the fit capacity (milliseconds)."""
        return sum(self.fit_driver_us.values()) / 1000.0

    @property
    def best_utilisation(self) -> float:
        """The highest U the granularity allows on this trace."""
        return self.peak_live / self.min_reserved if self.min_reserved \
            else 1.0

    @property
    def memory_calls(self) -> int:
        """Driver calls that manage memory (all kinds but events)."""
        return sum(self.calls.get(k, 0) for k in MEMORY_CALLS)

    @property
    def steady_calls(self) -> int:
        """Memory calls in the second half of the replay."""
        return sum(self.calls_second_half.get(k, 0) for k in MEMORY_CALLS)

    @property
    def driver_ms(self) -> float:
        """Modelled driver time of every call (milliseconds)."""
        return sum(self.driver_us.values()) / 1000.0

    @property
    def steady_driver_ms(self) -> float:
        """Modelled driver time of the second half's calls (ms)."""
        return sum(self.driver_us_second_half.values()) / 1000.0

    def to_json(self, timeline: bool = True) -> Dict[str, Any]:
        out = dataclasses.asdict(self)
        out["memory_calls"] = self.memory_calls
        out["steady_calls"] = self.steady_calls
        out["driver_ms"] = self.driver_ms
        out["steady_driver_ms"] = self.steady_driver_ms
        out["fit_memory_calls"] = self.fit_memory_calls
        out["fit_steady_calls"] = self.fit_steady_calls
        out["fit_driver_ms"] = self.fit_driver_ms
        if not timeline:
            for key in ("timeline_event", "timeline_live",
                        "timeline_reserved"):
                out.pop(key)
        if self.capped is not None:
            out["capped"] = self.capped.to_json(timeline)
        else:
            out.pop("capped")
        return out


# Timed calls wanted per policy and device: a trace with fewer is replayed
# again (each time with a fresh policy, up to MAX_TIMING_ROUNDS replays) and
# the times of all the replays are pooled. Timed once, the few hundred calls
# of a short trace give a median that moves by a tenth from run to run.
TIMED_CALLS = 20_000
MAX_TIMING_ROUNDS = 20


def timing_rounds(device_events: int) -> int:
    """Replays to time for a device with this many events."""
    if device_events <= 0:
        return 1
    return max(1, min(MAX_TIMING_ROUNDS, -(-TIMED_CALLS // device_events)))


def _options(capacity: int, overrides: Optional[Dict[str, Any]],
             latency: Optional[Latency] = None) -> Any:
    core = _core()
    o = core.PolicyOptions()
    o.capacity = capacity
    if latency is not None:
        o.latency = latency.model()
    for key, value in (overrides or {}).items():
        if key.startswith("lake_"):
            setattr(o.lake, key[len("lake_"):], value)
        else:
            if not hasattr(o, key):
                raise ValueError(f"unknown policy option {key!r}")
            setattr(o, key, value)
    return o


def out_of_memory(figures: "_core_types.ReplayResult") -> Optional[OutOfMemory]:
    """Where a replay (merged: its earliest) ran out of memory, or None."""
    if figures.oom is None:
        return None
    event, line, size, stream, live, reserved = figures.oom
    return OutOfMemory(device=figures.device, event=event, line=line,
                       size=size, stream=stream, live=live,
                       reserved=reserved)


def _result(trace: Trace, policy: str, figures: "_core_types.ReplayResult",
            devices: int, latency: Optional[Latency]) -> ReplayResult:
    """The result of a replay merged over `devices` devices (the core's
    replay_trace merges them: sums, the busiest device's call times, the
    timelines on a shared event axis, the earliest out-of-memory)."""
    alloc, free = figures.alloc_times, figures.free_times
    ops = alloc.count + free.count
    return ReplayResult(
        trace=trace.name, policy=policy, devices=devices,
        events=figures.events, allocs=figures.allocs, frees=figures.frees,
        peak_live=figures.peak_live, peak_reserved=figures.peak_reserved,
        waste=figures.waste, utilisation=figures.utilisation,
        calls=figures.calls, counters=figures.counters,
        median_ns=figures.median_ns,
        alloc_p50_ns=alloc.p50_ns, alloc_p99_ns=alloc.p99_ns,
        free_p50_ns=free.p50_ns, free_p99_ns=free.p99_ns,
        mean_ns=(alloc.total_ns + free.total_ns) / ops if ops else 0.0,
        wall_s=figures.wall_s, events_per_s=figures.events_per_s,
        timeline_event=figures.timeline_event,
        timeline_live=figures.timeline_live,
        timeline_reserved=figures.timeline_reserved,
        calls_second_half=figures.calls_second_half,
        driver_us=figures.driver_us,
        driver_us_second_half=figures.driver_us_second_half,
        latency_source=latency.source if latency else "defaults",
        timing_rounds=figures.timing_rounds,
        # the device itself too small
        oom=out_of_memory(figures))


def replay(trace: Trace, policy: str,
           capacity: Union[Capacity, int, str, None] = None,
           timeline_points: int = 1000, timing: bool = True,
           check_every: int = 0,
           options: Optional[Dict[str, Any]] = None,
           latency: Optional[Latency] = None,
           rounds: Optional[int] = None, fit: bool = False,
           capped_figures: bool = False) -> ReplayResult:
    """Replays every device of `trace` through `policy`.

    Without a capacity each device is simulated as device_bytes() says
    (80 GiB unless the trace needs more); a policy grows as it likes there
    and its peak figures are its natural ones. With a capacity (per device),
    the result also says whether, and where, the policy ran out of memory.
    A policy whose uncapped peak fits the capacity behaves exactly as
    uncapped (every model only reacts to the capacity when a request would
    exceed it), so only policies that exceeded it are replayed again under
    the cap; their capped peak is in `capped_peak_reserved`. With
    `capped_figures`, those are replayed under the cap with the timeline
    and the timing too, and `capped` holds every figure of the capped run
    (the uncapped run's where a device fit), for a table or plot of one run.

    `options` sets fields of the core's PolicyOptions (e.g.
    gmlake_frag_limit, torch_max_split_size; lake_<name> for the lake's).
    `latency` replaces the default driver latency model (Latency.load()).
    `rounds`: replays whose call times are pooled for the time figures
    (None: timing_rounds() of each device's events; the other figures are
    the first replay's).
    `fit`: also search each device's fit capacity (up to its uncapped
    device size) and fill the fit_* fields and u_fit.
    """
    check_policies([policy])
    cap = capacity if isinstance(capacity, Capacity) or capacity is None \
        else Capacity.parse(capacity)
    counts = list(trace.core.device_events())
    devices = [d for d, n in enumerate(counts) if n] or [0]
    live = {d: int(trace.core.peak_live(d)) for d in devices}
    caps = {d: cap.bytes_for(live[d]) for d in devices} if cap else {}
    sizes = {d: device_bytes(live[d], caps.get(d)) for d in devices}
    if rounds is not None and rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    device_options = [_options(sizes[d], options, latency) for d in devices]
    capped_options = [_options(caps[d], options, latency)
                      for d in devices] if cap else None
    try:
        run: "_core_types.TraceReplay" = _core().replay_trace(
            trace.core, policy, devices, device_options, capped_options,
            timeline_points, timing, check_every,
            [rounds or timing_rounds(counts[d]) for d in devices], fit,
            capped_figures)
    except ValueError as e:
        raise PolicyError(str(e)) from None
    if run.check_error:
        raise InvariantError(f"{policy} on {trace.name}, device "
                             f"{run.check_device}: {run.check_error}")
    if run.capped_check_error:
        raise InvariantError(f"{policy} on {trace.name} under a cap: "
                             f"{run.capped_check_error}")
    result = _result(trace, policy, run.uncapped, run.devices, latency)
    result.device_memory = max(sizes.values())
    gran = {d: int(o.granularity) for d, o in zip(devices, device_options)}
    result.min_reserved = sum(-(-live[d] // gran[d]) * gran[d]
                              for d in devices)
    if run.fit_devices:
        result.fit_capacity = run.fit_capacity
        result.fit_nonmonotone = run.fit_nonmonotone
        result.fit_calls = run.fit_calls
        result.fit_calls_second_half = run.fit_calls_second_half
        result.fit_driver_us = run.fit_driver_us
    if run.fit_asked and run.fit_found:
        result.u_fit = run.u_fit
    if cap is None or run.capped is None:
        return result
    result.capacity = max(caps.values())
    result.capped_peak_reserved = run.capped.peak_reserved
    result.capped_peak_reserved_by_device = {
        int(d): int(r) for d, r in
        zip(devices, run.capped_peak_reserved_by_device)}
    first = out_of_memory(run.capped)
    if first is not None:
        result.oom = first
    if capped_figures:
        capped = _result(trace, policy, run.capped, run.devices, latency)
        capped.device_memory = result.capacity
        capped.min_reserved = result.min_reserved
        capped.capacity = result.capacity
        capped.capped_peak_reserved = capped.peak_reserved
        for name in ("fit_capacity", "u_fit", "fit_calls",
                     "fit_calls_second_half", "fit_driver_us",
                     "fit_nonmonotone"):
            setattr(capped, name, getattr(result, name))
        result.capped = capped
    return result
