"""`jaxlake fit`: traces per value, replays under the GPU's capacity, the
report (table, JSON, plot)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, TextIO

from jaxlake._src.bench import replay as _replay
from jaxlake._src.fit import engine as _engine
from jaxlake._src.fit.search import (FRAGMENTATION, SHORTAGE, FitError,
                                     PolicyFit,
                                     Probe, Vary, classify, gain,
                                     search_policy, substitute)
from jaxlake._src.options import format_size
from jaxlake._src.trace import tracefile

JSON_FORMAT = "jaxlake-fit"
#: XLA's default share of device memory (XLA_PYTHON_CLIENT_MEM_FRACTION).
XLA_FRACTION = 0.75


def _granules(nbytes: int) -> int:
    """Down to whole 2 MiB granules (a capacity holds whole granules)."""
    return max(_replay.GRANULARITY,
               nbytes // _replay.GRANULARITY * _replay.GRANULARITY)


def budgets(memory: int, policies: Sequence[str],
            fraction: Optional[float] = None,
            lake_capacity: Optional[Any] = None) -> Dict[str, int]:
    """Each policy's share of the device memory in bytes, before the memory
    outside the pool comes off: the device memory times `fraction` (XLA's
    0.75 when None); jaxlake's is the lake's own `capacity` option when
    given (bytes, or a fraction of the device memory)."""
    share = XLA_FRACTION if fraction is None else fraction
    base = int(memory * share)
    out: Dict[str, int] = {}
    for name in policies:
        nbytes = base
        if name == "jaxlake" and lake_capacity is not None:
            nbytes = int(memory * lake_capacity) if isinstance(
                lake_capacity, float) else int(lake_capacity)
        out[name] = nbytes
    return out


def capacities(memory: int, policies: Sequence[str],
               fraction: Optional[float] = None,
               lake_capacity: Optional[Any] = None,
               outside: int = 0) -> Dict[str, int]:
    """Each policy's capacity in bytes: its budget (budgets()) less the
    memory XLA takes outside its pool, down to whole granules."""
    return {name: _granules(nbytes - outside) for name, nbytes in
            budgets(memory, policies, fraction, lake_capacity).items()}


@dataclasses.dataclass
class TraceInfo:
    value: int
    path: str
    seconds: float            # recording time (0: reused from --traces)
    events: int
    peak_live: int            # the largest device's
    outside_pool: Optional[int]


class Fitter:
    """Makes each value's trace once and replays it for any policy."""

    def __init__(self, make_trace: Callable[[int], str],
                 budget: Dict[str, int], reserve: int = 0) -> None:
        self.make_trace = make_trace
        # Each policy's bytes before what lies outside the pool comes off:
        # `reserve`, and the memory outside XLA's pool that the value's own
        # trace reports.
        self.budget = budget
        self.reserve = reserve
        self.traces: Dict[int, tracefile.Trace] = {}
        self.info: Dict[int, TraceInfo] = {}
        self.probes: Dict[str, Dict[int, Probe]] = {}
        self.replays = 0
        # Values whose recording ran out of the fake device's memory.
        self.too_large: Dict[int, _engine.OutOfFakeMemory] = {}

    def trace(self, value: int) -> tracefile.Trace:
        if value in self.too_large:
            raise self.too_large[value]
        if value not in self.traces:
            start = time.monotonic()
            try:
                path = self.make_trace(value)
            except _engine.OutOfFakeMemory as e:
                self.too_large[value] = e
                raise
            seconds = time.monotonic() - start
            trace = tracefile.read_trace(path)
            devices = [d for d, n in enumerate(trace.core.device_events())
                       if n] or [0]
            live = max(int(trace.core.peak_live(d)) for d in devices)
            self.traces[value] = trace
            self.info[value] = TraceInfo(
                value, path, seconds, len(trace), live,
                _engine.outside_pool(trace.meta))
        return self.traces[value]

    def capacity(self, policy: str, value: int) -> int:
        """The policy's capacity for this value's trace."""
        try:
            self.trace(value)
        except _engine.OutOfFakeMemory:
            pass
        info = self.info.get(value)
        outside = (info.outside_pool or 0) if info else 0
        return _granules(self.budget[policy] - self.reserve - outside)

    def probe(self, policy: str, value: int) -> Probe:
        done = self.probes.setdefault(policy, {})
        if value in done:
            return done[value]
        cap = self.capacity(policy, value)
        if value in self.too_large:
            # More than the fake device held, which is several times any
            # capacity on the GPU: a shortage for every policy.
            e = self.too_large[value]
            done[value] = Probe(value=value, fits=False, capacity=cap,
                                peak_live=0, peak_reserved=0,
                                reason=SHORTAGE, request_size=e.request,
                                beyond=e.device_memory)
            return done[value]
        trace = self.trace(value)
        live = self.info[value].peak_live
        self.replays += 1
        result = _replay.replay(trace, policy, cap, timeline_points=0,
                                timing=False)
        reserved = result.capped_peak_reserved \
            if result.capped_peak_reserved is not None \
            else result.peak_reserved
        p = Probe(value=value, fits=result.oom is None, capacity=cap,
                  peak_live=live, peak_reserved=int(reserved))
        if result.oom is not None:
            p.reason = classify(live, cap)
            if p.reason == FRAGMENTATION:
                oom = result.oom
                p.request_size = oom.size
                p.request_kind = _kind_at(trace, oom.event)
                p.live_at_failure = oom.live
                p.reserved_at_failure = oom.reserved
        done[value] = p
        return p


def _kind_at(trace: tracefile.Trace, event: int) -> Optional[str]:
    try:
        return trace.events()[event].kind
    except IndexError:
        return None


@dataclasses.dataclass
class FitReport:
    gpu: _engine.Gpu
    vary: Vary
    values: List[int]
    engine: str
    command: List[str]
    fraction: float
    capacity: Dict[str, int]
    outside_pool: Optional[int]
    fits: List[PolicyFit]
    traces: List[TraceInfo]
    replays: int
    seconds: float

    def policy(self, name: str) -> Optional[PolicyFit]:
        return next((f for f in self.fits if f.policy == name), None)

    def gains(self) -> Dict[str, Optional[float]]:
        lake = self.policy("jaxlake")
        if lake is None:
            return {}
        return {f.policy: gain(lake.largest, f.largest) for f in self.fits
                if f.policy != "jaxlake"}

    def to_json(self) -> Dict[str, Any]:
        policies: Dict[str, Any] = {}
        for f in self.fits:
            a = f.at_largest
            nf = f.next_failure
            next_failure: Optional[Dict[str, Any]] = None
            if nf is not None:
                next_failure = {"value": nf.value, "reason": nf.reason,
                                "peak_live": nf.peak_live}
                if nf.reason == FRAGMENTATION:
                    next_failure["request"] = {
                        "size": nf.request_size, "kind": nf.request_kind,
                        "live": nf.live_at_failure,
                        "reserved": nf.reserved_at_failure}
            policies[f.policy] = {
                "largest": f.largest, "capacity": f.capacity,
                "peak_live": a.peak_live if a else None,
                "peak_reserved": a.peak_reserved if a else None,
                "utilisation": a.utilisation if a else None,
                "headroom": a.headroom if a else None,
                "next_value": f.next_value, "next_failure": next_failure,
                "probes": [self._probe(f.policy, v).to_json()
                           for v in sorted(f.probed)]}
        return {
            "format": JSON_FORMAT, "version": 1,
            "gpu": {"name": self.gpu.name, "memory": self.gpu.memory},
            "vary": {"name": self.vary.name, "lo": self.vary.lo,
                     "hi": self.vary.hi, "values": self.values},
            "engine": self.engine, "command": self.command,
            "fraction": self.fraction, "outside_pool": self.outside_pool,
            "policies": policies,
            "gain_percent": self.gains(),
            "traces": [dataclasses.asdict(t) for t in self.traces],
            "replays": self.replays, "seconds": self.seconds}

    _probes: Dict[str, Dict[int, Probe]] = dataclasses.field(
        default_factory=dict)

    def _probe(self, policy: str, value: int) -> Probe:
        return self._probes[policy][value]


def _prober(fitter: Fitter, policy: str) -> Callable[[int], Probe]:
    return lambda value: fitter.probe(policy, value)


def fit(argv: Sequence[str], vary: Vary, values: Sequence[int],
        gpu: _engine.Gpu, policies: Sequence[str], engine: str = "fake-gpu",
        fraction: Optional[float] = None, lake_capacity: Any = None,
        reserve: int = 0, traces_dir: Optional[str] = None,
        progress: Optional[TextIO] = None,
        make_trace: Optional[Callable[[int], str]] = None) -> FitReport:
    """Searches each policy's largest value. `make_trace(value)` -> path
    replaces the engine (tests); `traces_dir` keeps the traces and reuses
    those of the same command. `reserve`: bytes outside the pool to
    subtract from every capacity, besides what the traces report."""
    start = time.monotonic()
    substitute(argv, vary, values[0])  # FitError when {NAME} is missing
    names = _replay.check_policies(policies)
    folder = traces_dir or tempfile.mkdtemp(prefix="jaxlake-fit-")
    if traces_dir:
        os.makedirs(traces_dir, exist_ok=True)

    def engine_trace(value: int) -> str:
        command = substitute(argv, vary, value)
        # The fake GPU's model is part of its trace; the recorder's traces
        # are the same for every GPU (its compile is an H100's).
        model = gpu.fake_model if engine == "fake-gpu" else ""
        key = hashlib.sha1(json.dumps([engine, model, command])
                           .encode()).hexdigest()[:12]
        path = os.path.join(folder, f"{vary.name}-{value}-{key}.jsonl")
        label = f"{vary.name}={value}"
        if traces_dir and os.path.isfile(path) and os.path.getsize(path):
            if progress is not None:
                progress.write(f"  {label}: trace reused ({path})\n")
            return path
        _engine.record(engine, command, path, gpu, label, progress)
        return path

    # Each value's replays have the capacity less the memory outside XLA's
    # pool that its own trace reports; the report's capacities are the
    # first value's.
    fitter = Fitter(make_trace or engine_trace,
                    budgets(gpu.memory, names, fraction, lake_capacity),
                    reserve)
    cap = {name: fitter.capacity(name, values[0]) for name in names}
    fits = [search_policy(values, _prober(fitter, name), name, cap[name])
            for name in names]
    infos = [fitter.info[v] for v in sorted(fitter.info)]
    outs = [i.outside_pool for i in infos if i.outside_pool is not None]
    report = FitReport(
        gpu=gpu, vary=vary, values=list(values), engine=engine,
        command=list(argv),
        fraction=XLA_FRACTION if fraction is None else fraction,
        capacity=cap, outside_pool=(max(outs) if outs else None),
        fits=fits, traces=infos, replays=fitter.replays,
        seconds=time.monotonic() - start)
    report._probes = fitter.probes
    return report


# -- the report for people -------------------------------------------------

LIMITS = (
    "limits: the fake GPU runs no kernel, so workspaces cuBLAS, cuDNN or "
    "NCCL size at run time are not in the trace; memory outside XLA's pool "
    "is what the shim passed on to the driver, not what the driver takes "
    "for itself (contexts, modules); the recorder sees only what its "
    "recorded functions allocate (docs/design.md, `jaxlake fit`)")


def outside_line(report: FitReport) -> str:
    """What the traces say of the memory XLA took outside its pool."""
    if report.outside_pool is None:
        return ("memory outside XLA's pool: not reported by the traces (the "
                "recorder's do not say); not subtracted")
    figures = sorted({t.outside_pool for t in report.traces
                      if t.outside_pool is not None})
    each = (size_range(figures[0], figures[-1]) if len(figures) > 1
            else format_size(figures[0]))
    return (f"memory outside XLA's pool: {each} (the peak of the device "
            "memory the program took through the shim outside the lake: "
            "cuMemAlloc, cuMemCreate, other pools); subtracted from every "
            "capacity, each value its own trace's")


def size_range(lo: int, hi: int) -> str:
    return f"{format_size(lo)} to {format_size(hi)}"


def format_report(report: FitReport) -> str:
    from jaxlake._src.table import format_table
    size = format_size
    v = report.vary.name
    lines = [
        f"jaxlake fit: largest {v} on {report.gpu.name} "
        f"({size(report.gpu.memory)}; capacity {report.fraction:g} of it"
        + (", less the memory XLA takes outside its pool"
           if report.outside_pool is not None else "")
        + "), engine " + report.engine,
        outside_line(report),
        "capacity: " + ", ".join(f"{n} {size(c)}"
                                 for n, c in report.capacity.items()), ""]
    header = ("policy", f"largest {v}", "peak live", "peak reserved", "U",
              "headroom", f"next {v}: why it fails")
    rows: List[List[str]] = []
    for f in report.fits:
        a = f.at_largest
        why = "(the range's end fits)" if f.next_failure is None else (
            f"{f.next_value}: {f.next_failure.describe_failure()}")
        rows.append([f.policy, "none" if f.largest is None else
                     str(f.largest),
                     size(a.peak_live) if a else "-",
                     size(a.peak_reserved) if a else "-",
                     f"{a.utilisation:.3f}" if a else "-",
                     size(a.headroom) if a else "-", why])
    lines.append(format_table(rows, header))
    gains = report.gains()
    if gains:
        parts = []
        for name, g in gains.items():
            parts.append(f"{name} " + ("n/a (fits nothing)" if g is None
                                       else f"{g:+.0f}%"))
        lines.append("")
        lines.append(f"jaxlake's largest {v} against each peer's: "
                     + ", ".join(parts))
    rec = sum(t.seconds for t in report.traces)
    lines.append(f"{len(report.traces)} traces ({rec:.1f}s making them), "
                 f"{report.replays} replays, {report.seconds:.1f}s in all")
    lines.append(LIMITS)
    return "\n".join(lines)


def plot(report: FitReport, path: str) -> None:
    """The varied value against each policy's peak reserved bytes, with
    each policy's capacity line and its out-of-memory values crossed."""
    from jaxlake._src.bench.plot import (COLOURS, _matplotlib, _save,
                                         image_format)
    from jaxlake._src.options import byte_unit
    fmt = image_format(path)
    Figure, Canvas = _matplotlib()
    fig = Figure(figsize=(8, 4.8), layout="constrained")
    Canvas(fig)
    ax = fig.add_subplot(1, 1, 1)
    peak = [p.peak_reserved for d in report._probes.values()
            for p in d.values()] + list(report.capacity.values())
    unit, scale = byte_unit(max(peak, default=1))
    for name, probes in report._probes.items():
        colour = COLOURS.get(name, "#444444")
        vals = sorted(probes)
        ax.plot(vals, [probes[x].peak_reserved / scale for x in vals],
                marker="o", color=colour, label=name,
                linewidth=2.4 if name == "jaxlake" else 1.2,
                linestyle="-" if name == "jaxlake" else "--")
        oom = [x for x in vals if not probes[x].fits]
        ax.scatter(oom, [probes[x].peak_reserved / scale for x in oom],
                   marker="x", s=70, color=colour, zorder=6)
    for cap in sorted(set(report.capacity.values())):
        ax.axhline(cap / scale, color="#000000", linewidth=0.8,
                   linestyle=":")
    live = sorted(report.traces, key=lambda t: t.value)
    ax.plot([t.value for t in live], [t.peak_live / scale for t in live],
            color="#777777", linewidth=0.8, label="peak live")
    ax.set_xscale("log", base=2)
    ax.set_xlabel(report.vary.name)
    ax.set_ylabel(f"peak reserved ({unit})")
    ax.set_title(f"jaxlake fit on {report.gpu.name}: capacity dotted, "
                 "out of memory crossed")
    ax.legend(loc="upper left", fontsize="small")
    _save(fig, path, fmt)
